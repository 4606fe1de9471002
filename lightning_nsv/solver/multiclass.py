"""The multi-class max-margin problem through the origin (DESIGN.md §2b), on kernel columns.

A head with ``K`` outputs computes ``N_k(x) = <phi(x), wbar_k>`` with the path features ``phi`` of §1, shared by
all outputs. The max-margin reference is the multi-class hard-margin SVM through the origin,

    min ½ Σ_k ||v_k||²   s.t.   <phi(x_i), v_{y_i} − v_k> >= 1   for all i, k ≠ y_i,

which is the binary dual of §2 with every label +1 on one variable per pair ``p = (i, k)``, ``k ≠ y_i``:

    Q_pq = K(x_i, x_j) · c_pq,   c_pq = <d_p, d_q> = [y_i = y_j] − [y_i = l] − [k = y_j] + [k = l],
    d_p = e_{y_i} − e_k,   q = (j, l).

The pair problem is solved exactly by :func:`~lightning_nsv.solver.pair_max_margin`: the kernel column
``K(·, x_j)`` of a sample is computed once and shared by its ``K − 1`` pairs, the margins of all pairs come from
``f = K[:, S] β`` and no column of ``Q`` is ever stored. One-vs-rest
(``K`` binary problems on the same kernel) is the alternative protocol.
The analysis of a network, :func:`~lightning_nsv.analysis.multiclass.multiclass_support_vectors`, calls it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from torch import Tensor

from lightning_nsv.solver.facade import max_margin, pair_max_margin
from lightning_nsv.solver.pair_store import SampleRows
from lightning_nsv.solver.protocol import KernelColumns, as_kernel_columns
from lightning_nsv.solver.result import MaxMarginResult, NotSeparableError

__all__ = ["MulticlassMaxMarginResult", "OneVsRestResult", "class_labels", "multiclass_max_margin",
           "one_vs_rest_max_margin", "pair_margins"]

SampleColumns = Callable[[np.ndarray], np.ndarray]  # or a KernelColumns


# --------------------------------------------------------------------------------------------- labels, margins


def class_labels(y: Tensor | np.ndarray, num_classes: int, m: int | None = None) -> np.ndarray:
    """Integer class labels in ``[0, num_classes)`` as an int64 array."""
    y = y.detach().cpu().numpy() if isinstance(y, Tensor) else np.asarray(y)
    if y.ndim != 1 or (m is not None and y.shape[0] != m):
        raise ValueError(f"labels must have shape ({m if m is not None else 'n'},), got {y.shape}")
    labels = y.astype(np.int64)
    if not np.array_equal(labels, y) or (len(y) and (labels.min() < 0 or labels.max() >= num_classes)):
        raise ValueError(
            f"class labels must be integers in [0, {num_classes}), got values {np.unique(y)[:10].tolist()}"
        )
    return labels


def pair_margins(outputs: Tensor | np.ndarray, y: np.ndarray) -> np.ndarray:
    """``N_{y_i}(x_i) − N_k(x_i)`` as an ``(m, K)`` float64 array, ``+inf`` at ``k = y_i`` (no pair there)."""
    outputs = outputs.detach().cpu().numpy() if isinstance(outputs, Tensor) else np.asarray(outputs)
    outputs = outputs.astype(np.float64)
    rows = np.arange(len(y))
    with np.errstate(invalid="ignore"):  # non-finite outputs: nan margins, reported by the caller
        margins = outputs[rows, y][:, None] - outputs
    margins[rows, y] = np.inf
    return margins


def _pairs(y: np.ndarray, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """The pairs ``(i, k)``, ``k ≠ y_i``, sample-major: ``(pair_sample, pair_class)``, ``m(K − 1)`` each."""
    classes = np.broadcast_to(np.arange(num_classes), (len(y), num_classes))
    other = classes != y[:, None]
    return np.repeat(np.arange(len(y)), num_classes - 1), classes[other]


# ------------------------------------------------------------------------------------------- kernel columns


def _smallest(values: np.ndarray, count: int) -> np.ndarray:
    count = min(count, values.size)
    return np.argpartition(values, count - 1)[:count] if count else np.zeros(0, dtype=np.int64)


# ---------------------------------------------------------------------------------------- exact pair problem


@dataclass(frozen=True)
class MulticlassMaxMarginResult:
    """Solution of the multi-class max-margin problem through the origin.

    Attributes:
        alpha_: ``α_(i,k)`` as an ``(m, K)`` array, 0 at ``k = y_i`` and off the support pairs.
        beta_: ``β_ik = [k = y_i] Σ_{l≠y_i} α_(i,l) − α_(i,k)``; ``v_k = Σ_i β_ik phi(x_i)``, rows sum to 0.
        support_: samples with some ``α_(i,k) > 0`` (the network support vectors), sorted.
        n_support_per_class: support samples of each class (by their label).
        n_support_pairs: pairs with ``α > 0``.
        norm_v_sq: ``||V||² = Σ_k ||v_k||² = Σ α``.
        margin: ``1 / ||V||``.
        kkt_residual: largest violation of the optimality conditions over pairs, in functional-margin units.
        n_margin_violations: pairs with ``f_{y_i}(x_i) − f_k(x_i) < 1 − 1e-6``.
        functional_margins: ``f_{y_i}(x_i) − f_k(x_i)`` as ``(m, K)``, ``+inf`` at ``k = y_i``.
        iterations: active-set iterations.
        pair_problem: the solver's result on the pair variables (order: sample-major, classes ≠ y_i ascending).
    """

    alpha_: np.ndarray = field(repr=False)
    beta_: np.ndarray = field(repr=False)
    support_: np.ndarray
    n_support_per_class: tuple[int, ...]
    n_support_pairs: int
    norm_v_sq: float
    margin: float
    kkt_residual: float
    n_margin_violations: int
    functional_margins: np.ndarray = field(repr=False)
    iterations: int
    pair_problem: MaxMarginResult = field(repr=False)
    method: str = "exact"

    @property
    def n_support_(self) -> int:
        return int(self.support_.shape[0])

    def to_metrics(self) -> dict[str, float]:
        metrics = {
            "n_support": float(self.n_support_),
            "support_fraction": self.n_support_ / self.alpha_.shape[0],
            "n_support_pairs": float(self.n_support_pairs),
            "svm_margin": self.margin,
            "kkt_residual": self.kkt_residual,
            "svm_margin_violations": float(self.n_margin_violations),
        }
        metrics.update({f"n_support_class{k}": float(n) for k, n in enumerate(self.n_support_per_class)})
        return metrics


def multiclass_max_margin(
    kernel: np.ndarray | Tensor | SampleColumns | KernelColumns,
    y: np.ndarray | Tensor,
    num_classes: int,
    *,
    kernel_diag: np.ndarray | None = None,
    initial_margins: np.ndarray | None = None,
    tol: float = 1e-10,
    max_iter: int | None = None,
    structured: bool = True,
) -> MulticlassMaxMarginResult:
    """Exact multi-class max-margin classifier through the origin, as the pair problem of the module docstring.

    Cost: ``m(K − 1)`` dual variables; sample kernel columns are computed once for each sample that has a
    candidate pair (``8·m·s_samples`` bytes). ``structured=True`` (default) solves it with
    :func:`~lightning_nsv.solver.pair_max_margin`: margins from ``f = K[:, S] β`` (``m·s_samples·K`` per
    iteration), plus ``8·|F|²`` bytes for the factor of ``Q_FF``. ``structured=False`` runs the generic
    :func:`max_margin` on pair columns of ``Q``, ``8·m(K − 1)`` bytes per free pair (≈ 20 GB at m = 20,000,
    K = 10): a reference for small problems.

    Args:
        kernel: dense ``(m, m)`` path kernel, a :class:`~lightning_nsv.solver.protocol.KernelColumns`, or a
            function returning its columns ``K[:, idx]`` for an index array (then ``kernel_diag`` is required).
        y: class labels in ``[0, num_classes)``.
        num_classes: ``K >= 2``.
        kernel_diag: ``diag(K)`` when ``kernel`` is a function.
        initial_margins: ``(m, K)`` network margins ``N_{y_i} − N_k`` (e.g. :func:`pair_margins`); the
            ``⌊√(m(K−1))⌋`` smallest pairs start the working set.
        tol, max_iter: passed to the solver (``max_iter`` counts pair iterations).
        structured: the structured solver (``True``) or generic pair columns (``False``), same answer.

    Raises:
        NotSeparableError: when no ``V`` satisfies the pair constraints.
    """
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    columns, diag = as_kernel_columns(kernel, kernel_diag)
    m = diag.shape[0]
    y = class_labels(y, num_classes, m)
    pair_sample, pair_class = _pairs(y, num_classes)
    initial = None
    if initial_margins is not None:
        candidates = np.asarray(initial_margins, dtype=np.float64)[pair_sample, pair_class]
        initial = _smallest(candidates, int(math.sqrt(len(pair_sample))))
    if structured:
        pairs = pair_max_margin(columns, y, num_classes, kernel_diag=diag, tol=tol, max_iter=max_iter,
                                initial=initial)
    else:
        pairs = _generic_pair_problem(columns, diag, y, num_classes, pair_sample, pair_class, tol, max_iter,
                                      initial)
    return _pair_result(pairs, y, num_classes, pair_sample, pair_class)


def _generic_pair_problem(columns, diag, y, num_classes, pair_sample, pair_class, tol, max_iter, initial):
    m = diag.shape[0]
    cache = SampleRows(columns, m)
    # d_p = e_{y_i} − e_k for every pair, one row per class: c_pq = D[y_j, p] − D[l, p]
    d = np.zeros((num_classes, len(pair_sample)), dtype=np.int8)
    d[y[pair_sample], np.arange(len(pair_sample))] = 1
    d[pair_class, np.arange(len(pair_sample))] = -1

    def pair_columns(idx: np.ndarray) -> np.ndarray:
        samples, classes = pair_sample[idx], pair_class[idx]
        block = cache.rows(samples)[:, pair_sample]  # (len(idx), m(K−1)): K(x_j, x_i) for every pair p = (i, ·)
        block *= d[y[samples]] - d[classes]
        return block.T

    return max_margin(pair_columns, np.ones(len(pair_sample)), kernel_diag=2.0 * diag[pair_sample], tol=tol,
                      max_iter=max_iter, initial=initial)


def _pair_result(pairs: MaxMarginResult, y, num_classes, pair_sample, pair_class) -> MulticlassMaxMarginResult:
    m = y.shape[0]
    alpha = np.zeros((m, num_classes))
    alpha[pair_sample, pair_class] = pairs.alpha_
    beta = -alpha
    beta[np.arange(m), y] = alpha.sum(1)
    margins = np.full((m, num_classes), np.inf)
    margins[pair_sample, pair_class] = pairs.functional_margins
    support = np.flatnonzero((alpha > 0).any(1))
    return MulticlassMaxMarginResult(
        alpha_=alpha,
        beta_=beta,
        support_=support,
        n_support_per_class=tuple(np.bincount(y[support], minlength=num_classes).tolist()),
        n_support_pairs=pairs.n_support_,
        norm_v_sq=pairs.norm_v_sq,
        margin=pairs.margin,
        kkt_residual=pairs.kkt_residual,
        n_margin_violations=pairs.n_margin_violations,
        functional_margins=margins,
        iterations=pairs.iterations,
        pair_problem=pairs,
    )


# ------------------------------------------------------------------------------------------------ one-vs-rest


@dataclass(frozen=True)
class OneVsRestResult:
    """``K`` binary max-margin problems through the origin, class ``k`` (+1) against the rest (−1).

    Attributes:
        classes: the solution for each class, ``None`` where class ``k`` is not separable from the rest.
        not_separable: the solver's message for each class that is not separable, else ``None``.
        alpha_: ``α^k_i`` as ``(m, K)``.
        beta_: ``β_ik = α^k_i s^k_i`` (``s^k_i = ±1``); ``v_k = Σ_i β_ik phi(x_i)``, ``f_k(x) = Σ_i β_ik K(x_i, x)``.
        support_: samples that are a support vector of some class problem, sorted.
        n_support_per_class: support vectors of each class problem (0 where not separable).
        norm_v_sq: ``Σ_k ||v_k||²`` over the separable classes.
        kkt_residual: largest KKT residual of the separable class problems.
    """

    classes: tuple[MaxMarginResult | None, ...] = field(repr=False)
    not_separable: tuple[str | None, ...]
    alpha_: np.ndarray = field(repr=False)
    beta_: np.ndarray = field(repr=False)
    support_: np.ndarray
    n_support_per_class: tuple[int, ...]
    norm_v_sq: float
    kkt_residual: float
    method: str = "ovr"

    @property
    def n_support_(self) -> int:
        return int(self.support_.shape[0])

    @property
    def margins(self) -> tuple[float, ...]:
        """``1 / ||v_k||`` per class (``nan`` where not separable)."""
        return tuple(math.nan if r is None else r.margin for r in self.classes)

    def to_metrics(self) -> dict[str, float]:
        metrics = {
            "n_support": float(self.n_support_),
            "support_fraction": self.n_support_ / self.alpha_.shape[0],
            "kkt_residual": self.kkt_residual,
            "n_classes_not_separable": float(sum(msg is not None for msg in self.not_separable)),
        }
        for k, result in enumerate(self.classes):
            metrics[f"n_support_class{k}"] = float(self.n_support_per_class[k])
            metrics[f"svm_margin_class{k}"] = math.nan if result is None else result.margin
            metrics[f"kkt_residual_class{k}"] = math.nan if result is None else result.kkt_residual
        return metrics


def one_vs_rest_max_margin(
    kernel: np.ndarray | Tensor | SampleColumns | KernelColumns,
    y: np.ndarray | Tensor,
    num_classes: int,
    *,
    kernel_diag: np.ndarray | None = None,
    initial_scores: np.ndarray | None = None,
    tol: float = 1e-10,
    max_iter: int | None = None,
) -> OneVsRestResult:
    """One binary max-margin problem through the origin per class, all on one kernel (columns shared).

    Cost: the union of the classes' support candidates in kernel columns (``8·m`` bytes each, computed once),
    plus what :func:`max_margin` needs for one class at a time.

    Args:
        kernel, y, num_classes, kernel_diag, tol, max_iter: as :func:`multiclass_max_margin`.
        initial_scores: ``(m, K)`` network scores for class ``k`` against the rest (e.g. centred outputs); the
            ``⌊√m⌋`` samples with the smallest ``s^k_i · score_ik`` start each class's working set.
    """
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    columns, diag = as_kernel_columns(kernel, kernel_diag)
    m = diag.shape[0]
    y = class_labels(y, num_classes, m)
    cache = SampleRows(columns, m)
    results, messages = [], []
    alpha, beta = np.zeros((m, num_classes)), np.zeros((m, num_classes))
    for k in range(num_classes):
        signs = np.where(y == k, 1.0, -1.0)
        initial = None if initial_scores is None else _smallest(signs * initial_scores[:, k], int(math.sqrt(m)))
        try:
            result = max_margin(cache, signs, kernel_diag=diag, tol=tol, max_iter=max_iter, initial=initial)
        except NotSeparableError as err:
            results.append(None)
            messages.append(f"class {k} against the rest: {err}")
            continue
        results.append(result)
        messages.append(None)
        alpha[:, k] = result.alpha_
        beta[:, k] = result.alpha_ * signs
    solved = [r for r in results if r is not None]
    return OneVsRestResult(
        classes=tuple(results),
        not_separable=tuple(messages),
        alpha_=alpha,
        beta_=beta,
        support_=np.flatnonzero((alpha > 0).any(1)),
        n_support_per_class=tuple(0 if r is None else r.n_support_ for r in results),
        norm_v_sq=float(sum(r.norm_v_sq for r in solved)),
        kkt_residual=max((r.kkt_residual for r in solved), default=math.nan),
    )
