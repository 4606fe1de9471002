"""Max-margin classifiers in path space (DESIGN.md §2).

Without intercept (the paper's Assumption 2, hyperplane through the origin) the dual is

    min_α ½ αᵀQα − 1ᵀα   s.t. α >= 0,     Q_ij = y_i y_j K_ij,

solved exactly by an active-set method that keeps a Cholesky factor of ``Q`` on the free set and asks for
kernel columns only of samples that enter it. With ``intercept=True`` the paper's own protocol runs:
scikit-learn ``SVC(kernel="precomputed")`` with a large ``C``.

Both normalise the kernel by its mean diagonal ``c`` first; α and ``C`` are reported for the raw kernel
(``C_raw = C / c``, ``α_raw = α / c``), and the solution is checked for margin violations.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import scipy.linalg
import torch

__all__ = ["MaxMarginResult", "NotSeparableError", "max_margin"]

KernelColumns = Callable[[np.ndarray], np.ndarray]
LIBSVM_TOL = 1e-5


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


def _validate(kernel_diag: np.ndarray, y: np.ndarray) -> np.ndarray:
    y = np.asarray(y)
    if y.ndim != 1 or y.shape[0] != kernel_diag.shape[0]:
        raise ValueError(f"y must have shape ({kernel_diag.shape[0]},), got {y.shape}")
    values = set(np.unique(y).tolist())
    if not values <= {-1, 1}:
        raise ValueError(f"labels must be -1 or +1, got values {sorted(values)}")
    if not np.all(np.isfinite(kernel_diag)) or np.any(kernel_diag <= 0):
        raise ValueError("kernel diagonal must be finite and positive (a zero sample has no margin)")
    return y.astype(np.float64)


def max_margin(
    kernel: np.ndarray | torch.Tensor | KernelColumns,
    y: np.ndarray | torch.Tensor,
    *,
    kernel_diag: np.ndarray | None = None,
    intercept: bool = False,
    C: float = 1e7,
    tol: float = 1e-10,
    max_iter: int | None = None,
    initial: np.ndarray | None = None,
) -> MaxMarginResult:
    """Max-margin classifier on a precomputed kernel.

    Cost without intercept: one kernel column per sample that ever enters the free set, ``O(m·s)`` memory
    for those columns and ``O(s²)`` per step for the Cholesky factor, ``s`` the number of support vectors.
    With intercept, scikit-learn needs the dense ``m×m`` kernel.

    Args:
        kernel: dense ``(m, m)`` kernel, or a function returning the columns ``K[:, idx]`` for an index array
            (then ``kernel_diag`` is required).
        y: labels in ``{-1, +1}``.
        kernel_diag: ``diag(K)`` when ``kernel`` is a function.
        intercept: ``False`` for the hyperplane through the origin (exact); ``True`` for ``SVC`` with intercept.
        C: penalty of the intercept protocol on the normalised kernel (large: hard margin).
        tol: optimality tolerance on ``1 − y_i f(x_i)`` for the active-set solver.
        max_iter: bound on active-set iterations (default ``10·m``).
        initial: indices to try first as support vectors (e.g. smallest network margins).

    Raises:
        ValueError: on shapes or labels that do not fit.
        NotSeparableError: when no hyperplane through the origin separates the data.
    """
    y = y.detach().cpu().numpy() if isinstance(y, torch.Tensor) else np.asarray(y)
    if callable(kernel):
        if kernel_diag is None:
            raise ValueError("kernel_diag is required when kernel is a function of column indices")
        columns, diag = kernel, np.asarray(kernel_diag, dtype=np.float64)
    else:
        dense = kernel.detach().cpu().numpy() if isinstance(kernel, torch.Tensor) else np.asarray(kernel)
        if dense.ndim != 2 or dense.shape[0] != dense.shape[1]:
            raise ValueError(f"Precomputed kernel must be a square matrix. Input is a {dense.shape} matrix.")
        dense = dense.astype(np.float64, copy=False)
        columns, diag = (lambda idx: dense[idx].T), np.diag(dense).copy()  # K symmetric: rows are contiguous
    y = _validate(diag, y)
    scale = float(diag.mean())
    if intercept:
        full = dense / scale if not callable(kernel) else columns(np.arange(y.shape[0])) / scale
        return _svc_with_intercept(full, y, scale, C)
    return _active_set(lambda idx: columns(idx) / scale, y, scale, tol, max_iter, initial)


def _result(alpha_n, y, margins_n, scale, intercept, kkt, n_bound, C_eff, iterations, method, slack=1e-6):
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


def _svc_with_intercept(kernel_n: np.ndarray, y: np.ndarray, scale: float, C: float) -> MaxMarginResult:
    from sklearn.svm import SVC

    svc = SVC(kernel="precomputed", C=C, tol=LIBSVM_TOL, shrinking=False, max_iter=-1)
    svc.fit(kernel_n, y)
    alpha_n = np.zeros(y.shape[0])
    alpha_n[svc.support_] = np.abs(svc.dual_coef_[0])
    b = float(svc.intercept_[0])
    margins = y * (kernel_n[:, svc.support_] @ svc.dual_coef_[0] + b)
    at_bound = alpha_n >= C * (1 - 1e-8)
    free = (alpha_n > 0) & ~at_bound
    kkt = max(
        float(np.max(np.clip(1 - margins, 0, None))),
        float(np.max(np.abs(margins[free] - 1), initial=0.0)),
        abs(float(alpha_n @ y)) / max(float(alpha_n.sum()), 1e-300),
    )
    if at_bound.any():
        warnings.warn(
            f"{int(at_bound.sum())} support vectors reached C={C} on the normalised kernel: the solution is "
            "soft-margin. Increase C.",
            stacklevel=3,
        )
    return _result(alpha_n, y, margins, scale, b, kkt, int(at_bound.sum()), C / scale, 0, "libsvm",
                   slack=10 * LIBSVM_TOL)


class _FreeSet:
    """Free set F of the active-set method with the Cholesky factor of ``Q_FF`` and the columns ``Q[:, F]``.

    Both live in buffers that grow geometrically, so that adding and removing members copies only the
    trailing part.
    """

    def __init__(self, q_columns: Callable[[np.ndarray], np.ndarray], m: int) -> None:
        self.q_columns = q_columns
        self.index: list[int] = []
        self.slot: list[int] = []  # column of self._cols that holds member k's column of Q
        self._spare: list[int] = []  # columns of self._cols freed by removals, reused by additions
        self._n_slots = 0
        self._cols = np.empty((m, 0), order="F")
        self._chol = np.empty((0, 0))

    def __len__(self) -> int:
        return len(self.index)

    def q_times(self, alpha: np.ndarray) -> np.ndarray:
        """``Q[:, F] @ alpha`` without gathering the stored columns into free-set order."""
        weights = np.zeros(self._n_slots)
        weights[self.slot] = alpha
        return self._cols[:, : self._n_slots] @ weights

    @property
    def chol(self) -> np.ndarray:
        return self._chol[: len(self), : len(self)]

    def _reserve(self, size: int, slots: int) -> None:
        if size > self._chol.shape[0]:
            capacity, n = max(size, 2 * self._chol.shape[0], 64), len(self)
            chol = np.zeros((capacity, capacity), order="F")
            chol[:n, :n] = self.chol
            self._chol = chol
        if slots > self._cols.shape[1]:
            capacity = max(slots, 2 * self._cols.shape[1], 64)
            cols = np.empty((self._cols.shape[0], capacity), order="F")
            cols[:, : self._n_slots] = self._cols[:, : self._n_slots]
            self._cols = cols

    def solve_ones(self) -> np.ndarray:
        """``Q_FF⁻¹ 1``."""
        ones = np.ones(len(self))
        return scipy.linalg.cho_solve((self.chol, True), ones, check_finite=False) if len(self) else ones

    def try_add(self, new: np.ndarray, new_cols: np.ndarray) -> bool:
        """Append ``new`` unless that makes ``Q_FF`` (numerically) singular."""
        q_fb, q_bb = new_cols[self.index], new_cols[new]
        w = scipy.linalg.solve_triangular(self.chol, q_fb, lower=True, check_finite=False) if len(self) else q_fb
        schur = q_bb - w.T @ w
        try:
            l22 = np.linalg.cholesky(schur)
        except np.linalg.LinAlgError:
            return False
        if np.min(np.diag(l22)) ** 2 <= 1e-10 * np.max(np.diag(q_bb)):
            return False
        n, b = len(self), len(new)
        reused, self._spare = self._spare[:b], self._spare[b:]
        fresh = list(range(self._n_slots, self._n_slots + b - len(reused)))
        self._reserve(n + b, self._n_slots + len(fresh))
        self._n_slots += len(fresh)
        self._chol[n:n + b, :n], self._chol[n:n + b, n:n + b] = w.T, l22
        slots = reused + fresh
        if reused:
            self._cols[:, slots] = new_cols
        else:
            self._cols[:, fresh[0]:fresh[0] + b] = new_cols
        self.slot += slots
        self.index += new.tolist()
        return True

    def remove(self, position: int) -> None:
        """Delete one member; the trailing block of the factor takes a rank-one update."""
        n, p = len(self), position
        x = self._chol[p + 1:n, p].copy()
        chol = self._chol
        chol[p:n - 1, :n] = chol[p + 1:n, :n]
        chol[:n - 1, p:n - 1] = chol[:n - 1, p + 1:n]
        chol[n - 1, :n] = 0.0
        chol[:n, n - 1] = 0.0
        tail = chol[p:n - 1, p:n - 1]
        for k in range(x.shape[0]):
            r = math.hypot(tail[k, k], x[k])
            c, s = r / tail[k, k], x[k] / tail[k, k]
            tail[k, k] = r
            tail[k + 1:, k] = (tail[k + 1:, k] + s * x[k + 1:]) / c
            x[k + 1:] = c * x[k + 1:] - s * tail[k + 1:, k]
        self._spare.append(self.slot.pop(p))
        del self.index[p]


def _active_set(kernel_columns, y, scale, tol, max_iter, initial) -> MaxMarginResult:
    m = y.shape[0]
    q_columns = lambda idx: kernel_columns(idx) * y[:, None] * y[idx][None, :]  # noqa: E731
    free = _FreeSet(q_columns, m)
    alpha = np.zeros(0)
    gradient = -np.ones(m)
    batch = max(1, int(math.sqrt(m)))
    pending = None if initial is None else np.unique(np.asarray(initial, dtype=np.int64))
    max_iter = 10 * m if max_iter is None else max_iter
    for iteration in range(1, max_iter + 1):
        in_free = np.zeros(m, dtype=bool)
        in_free[free.index] = True
        if pending is not None and len(pending):
            candidates, pending = pending[~in_free[pending]], None
        else:
            violation = np.where(in_free, 0.0, -gradient)
            order = np.argsort(-violation)[:batch]
            candidates = order[violation[order] > tol]
        if len(candidates) == 0:
            break
        size_before = len(free)
        if not _add(free, candidates, alpha):
            alpha = _singular_step(free, candidates[0], alpha)
        alpha = np.concatenate([alpha, np.zeros(len(free) - len(alpha))])
        while True:
            target = free.solve_ones()
            if np.all(target > 0):
                alpha = target
                break
            blocking = target <= 0
            ratios = np.where(blocking, alpha / np.maximum(alpha - target, 1e-300), np.inf)
            first = int(np.argmin(ratios))
            alpha = alpha + ratios[first] * (target - alpha)
            alpha[first] = 0.0
            drop = blocking & (alpha <= 1e-14 * alpha.max(initial=1.0))
            for position in np.flatnonzero(drop)[::-1]:
                free.remove(position)
            alpha = np.clip(alpha[~drop], 0.0, None)
        if len(free) <= size_before:
            batch = max(1, batch // 2)
        gradient = free.q_times(alpha) - 1.0
    else:
        warnings.warn(
            f"active-set solver stopped after max_iter={max_iter} iterations with "
            f"{len(free)} free samples; raise max_iter",
            stacklevel=3,
        )
    alpha_full = np.zeros(m)
    alpha_full[free.index] = alpha
    margins = gradient + 1.0
    kkt = max(float(np.max(np.clip(-gradient, 0, None))), float(np.max(np.abs(gradient[free.index]), initial=0)))
    return _result(alpha_full, y, margins, scale, 0.0, kkt, 0, math.inf, iteration, "active-set")


def _add(free: _FreeSet, candidates: np.ndarray, alpha: np.ndarray) -> bool:
    """Add the candidates as a block, else one by one; ``False`` when the first one is dependent on F."""
    cols = free.q_columns(candidates)
    if free.try_add(candidates, cols):
        return True
    added = False
    for j, col in zip(candidates, cols.T):
        added |= free.try_add(np.array([j]), col[:, None])
    return added


def _singular_step(free: _FreeSet, j: int, alpha: np.ndarray) -> np.ndarray:
    """``y_j phi_j`` lies in the span of the free set: move along the null direction of ``Q`` until a free
    coefficient reaches zero, drop it, then admit ``j``."""
    col = free.q_columns(np.array([j]))
    coef = scipy.linalg.cho_solve((free.chol, True), col[free.index, 0], check_finite=False)
    if not np.any(coef > 0):
        raise NotSeparableError(
            f"sample {j} is a non-positive combination of support vectors with opposite margin: the data "
            "are not separable through the origin in path space (is the training error really zero?)"
        )
    ratios = np.where(coef > 0, alpha / np.where(coef > 0, coef, 1.0), np.inf)
    position = int(np.argmin(ratios))
    step = ratios[position]
    alpha = alpha - step * coef
    free.remove(position)
    alpha = np.delete(alpha, position)
    if not free.try_add(np.array([j]), col):
        raise NotSeparableError(f"could not admit sample {j} to the free set after a degenerate step")
    return np.concatenate([np.clip(alpha, 0.0, None), [step]])
