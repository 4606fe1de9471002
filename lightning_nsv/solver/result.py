"""What the max-margin solvers return (DESIGN.md §2): :class:`MaxMarginResult` and :class:`NotSeparableError`."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

__all__ = ["MaxMarginResult", "NotSeparableError", "make_result"]


class NotSeparableError(ValueError):
    """The embedded training data cannot be separated by a hyperplane through the origin."""


@dataclass(frozen=True)
class MaxMarginResult:
    """Solution of the max-margin problem; ``_``-suffixed fields follow scikit-learn's convention.

    Attributes:
        alpha_: dual coefficients for the raw kernel, shape ``(m,)``, zero off the support.
        support_: indices of the support vectors (``alpha_ > 0``), sorted.
        intercept_: the bias ``b`` (0 without intercept).
        norm_v_sq: ``||v||² = αᵀQα`` of the max-margin direction ``v = Σ α_i y_i phi(x_i)``.
        margin: geometric margin ``1 / ||v||``.
        kkt_residual: largest violation of the optimality conditions, in units of functional margin:
            ``max(max_i (1 − y_i f(x_i))_+, max_{i ∈ support} |y_i f(x_i) − 1|)`` (free support vectors only
            with intercept), plus ``|Σ α_i y_i|`` relative to ``Σ α_i`` with intercept.
        n_margin_violations: training samples with ``y_i f(x_i) < 1 − 1e-6`` (``1 − 1e-4`` for libsvm, whose
            stopping tolerance is ``1e-5``).
        kernel_scale: ``c``, the mean diagonal the kernel was divided by.
        C_effective: penalty on the raw kernel (``inf`` for the exact hard-margin solver).
        n_at_bound: support vectors with ``α = C`` (soft-margin ones; should be 0).
        functional_margins: ``y_i f(x_i)`` on the training set (raw scale, 1 on the margin).
        iterations: solver iterations.
        method: ``"active-set"`` or ``"libsvm"``.
    """

    alpha_: np.ndarray
    support_: np.ndarray
    intercept_: float
    norm_v_sq: float
    margin: float
    kkt_residual: float
    n_margin_violations: int
    kernel_scale: float
    C_effective: float
    n_at_bound: int
    functional_margins: np.ndarray = field(repr=False)
    iterations: int
    method: str

    @property
    def n_support_(self) -> int:
        return int(self.support_.shape[0])

    def to_metrics(self) -> dict[str, float]:
        return {
            "n_support": float(self.n_support_),
            "support_fraction": self.n_support_ / self.alpha_.shape[0],
            "svm_margin": self.margin,
            "kkt_residual": self.kkt_residual,
            "svm_margin_violations": float(self.n_margin_violations),
            "svm_alpha_at_bound": float(self.n_at_bound),
        }


def make_result(alpha_n, y, margins_n, scale, intercept, kkt, n_bound, C_eff, iterations, method, slack=1e-6):
    support = np.flatnonzero(alpha_n > 0)
    norm_v_sq_n = float(alpha_n[support] @ (margins_n[support] - intercept * y[support]))
    return MaxMarginResult(
        alpha_=alpha_n / scale,
        support_=support,
        intercept_=float(intercept),
        norm_v_sq=norm_v_sq_n / scale,
        margin=1.0 / math.sqrt(norm_v_sq_n / scale) if norm_v_sq_n > 0 else float("inf"),
        kkt_residual=float(kkt),
        n_margin_violations=int(np.sum(margins_n < 1 - slack)),
        kernel_scale=scale,
        C_effective=C_eff,
        n_at_bound=n_bound,
        functional_margins=margins_n,
        iterations=iterations,
        method=method,
    )
