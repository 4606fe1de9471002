"""Max-margin classifiers in path space (DESIGN.md §2): the public names of :mod:`lightning_nsv.solver`, kept here
for existing imports. The solver's facade, algorithm, factor, stores and options live in that package."""
from lightning_nsv.solver import (
    KernelColumns,
    MaxMarginResult,
    NotSeparableError,
    max_margin,
    pair_max_margin,
    sample_indices,
    solver_progress,
)

__all__ = ["KernelColumns", "MaxMarginResult", "NotSeparableError", "max_margin", "pair_max_margin",
           "solver_progress"]
