"""Errors shared by the analyses."""


class NonFiniteError(ValueError):
    """Values of an analysis (weights, inputs, outputs, Ψ) hold NaN or inf."""
