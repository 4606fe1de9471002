"""Network support vectors of multi-class heads (DESIGN.md §2b).

A head with ``K`` outputs computes ``N_k(x) = <phi(x), wbar_k>`` with the path features ``phi`` of §1, shared by
all outputs. The max-margin reference is the multi-class hard-margin SVM through the origin,

    min ½ Σ_k ||v_k||²   s.t.   <phi(x_i), v_{y_i} − v_k> >= 1   for all i, k ≠ y_i,

which is the binary dual of §2 with every label +1 on one variable per pair ``p = (i, k)``, ``k ≠ y_i``:

    Q_pq = K(x_i, x_j) · c_pq,   c_pq = <d_p, d_q> = [y_i = y_j] − [y_i = l] − [k = y_j] + [k = l],
    d_p = e_{y_i} − e_k,   q = (j, l).

The pair problem is solved exactly by :func:`~lightning_nsv.max_margin.pair_max_margin`: the kernel column
``K(·, x_j)`` of a sample is computed once and shared by its ``K − 1`` pairs, the margins of all pairs come from
``f = K[:, S] β`` and no column of ``Q`` is ever stored. One-vs-rest
(``K`` binary problems on the same kernel) is the alternative protocol. Nothing here imports Lightning.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch
from torch import Tensor
from torchmetrics.functional.classification import multiclass_accuracy

from lightning_nsv.path_space import (
    PathKernelColumns,
    PathNetwork,
    analysis_inputs,
    as_tensor_on,
    forward_with_slopes,
    path_kernel,
    path_kernel_diagonal,
    unique_patterns,
)
from lightning_nsv.solver import MaxMarginResult, NotSeparableError, max_margin, pair_max_margin
from lightning_nsv.solver.options import SolverOptions, plan
from lightning_nsv.solver.pair_store import SampleRows
from lightning_nsv.solver.protocol import KernelColumns, as_kernel_columns
from lightning_nsv.support_vectors import check_analysis_memory, check_samples, compression_bound, validation_metrics

__all__ = [
    "MulticlassMaxMarginResult",
    "MulticlassSupportVectorAnalysis",
    "OneVsRestResult",
    "centred_gram",
    "class_labels",
    "multiclass_decision",
    "multiclass_max_margin",
    "multiclass_support_vectors",
    "one_vs_rest_max_margin",
    "output_gram",
    "pair_margins",
]

METHODS = ("exact", "ovr")
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
    :func:`~lightning_nsv.max_margin.pair_max_margin`: margins from ``f = K[:, S] β`` (``m·s_samples·K`` per
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


# ------------------------------------------------------------------------------------ network in path space


def output_gram(net: PathNetwork) -> np.ndarray:
    """``G_kl = <wbar_k, wbar_l>`` (``K×K``) without enumerating paths.

    Paths to outputs ``k`` and ``l`` share everything below the last hidden layer, so
    ``G_kl = Σ_j A_d[k, j] A_d[l, j] M_j + b_k b_l`` with ``M`` the squared-weight mass reaching last-hidden
    unit ``j``: a forward pass of ones through element-wise squared weights, adding ``b²`` at each hidden layer.
    For ``K = 1`` this is :func:`~lightning_nsv.path_space.path_norm_squared`.
    """
    mass = torch.ones(net.in_features, dtype=net.dtype, device=net.device)
    for k, a in enumerate(net.weights[:-1]):
        mass = (a * a) @ mass
        if net.biases is not None:
            mass = mass + net.biases[k] ** 2
    out = net.weights[-1]
    gram = (out * mass) @ out.T
    if net.biases is not None:
        gram = gram + torch.outer(net.biases[-1], net.biases[-1])
    return gram.to("cpu", torch.float64).numpy()


def centred_gram(gram: np.ndarray) -> np.ndarray:
    """Gram matrix of the centred ``wc_k = wbar_k − (1/K) Σ_l wbar_l``; its trace is
    ``||Wc||² = Σ_k G_kk − (1/K) Σ_kl G_kl``. Only differences of outputs classify, so ``Wc`` is the network's
    direction in the space of ``V`` (``Σ_k v_k = 0``)."""
    k = gram.shape[0]
    centre = np.eye(k) - 1.0 / k
    return centre @ gram @ centre


def multiclass_decision(
    net: PathNetwork,
    x_support: Tensor,
    beta_support: np.ndarray | Tensor,
    x: Tensor,
    *,
    slopes_support: Sequence[Tensor] | None = None,
    slopes_x: Sequence[Tensor] | None = None,
    block_size: int | None = None,
) -> Tensor:
    """``f_k(x) = Σ_i β_ik K(x_i, x)`` over the support samples, shape ``(n, K)``; predict ``argmax_k f_k``.

    Cost: the path kernel between the ``n`` queries and the ``s`` support samples, ``O(n·s·(f + Σ Ω_l))``.
    """
    net = net.to(x.device)
    beta_support = as_tensor_on(beta_support, net.dtype, x.device)
    if len(x_support) != beta_support.shape[0]:
        raise ValueError(f"x_support has {len(x_support)} samples and beta_support {beta_support.shape[0]} rows")
    x_support = x_support.to(x.device, net.dtype).reshape(len(x_support), -1)
    x = x.to(net.dtype).reshape(len(x), -1)
    if slopes_support is None:
        slopes_support = forward_with_slopes(net, x_support)[1]
    if slopes_x is None:
        slopes_x = forward_with_slopes(net, x)[1]
    kernel = path_kernel(x, slopes_x, x_support, slopes_support, bias=net.biases is not None, block_size=block_size)
    return kernel @ beta_support


# ----------------------------------------------------------------------------------------------- the analysis


@dataclass(frozen=True)
class MulticlassSupportVectorAnalysis:
    """What the multi-class max-margin classifier in path space says about a network at zero training error.

    Attributes:
        svm: the exact pair solution or the one-vs-rest solutions.
        m, num_classes, n_hidden: training samples, outputs ``K``, hidden units of the path part.
        network_margin: ``min_p (N_{y_i}(x_i) − N_k(x_i)) / ||Wc||`` (both methods).
        margin_ratio: ``network_margin · ||V||`` (exact method; ≤ 1, 1 iff the network is max-margin), else ``None``.
        cosine: ``<Wc, V> / (||Wc|| ||V||)``, ``<Wc, V> = Σ_ik β_ik (N_k − mean_l N_l)(x_i)``, which for the exact
            method is ``Σ_p α_p (N_{y_i}(x_i) − N_k(x_i))``.
        wc_norm: ``||Wc||``; ``gram``: ``G_kl = <wbar_k, wbar_l>``.
        per_class_cosine / per_class_network_margin / per_class_margin_ratio: one-vs-rest only, against the
            network's class-``k``-against-the-rest score ``N_k − mean_l N_l`` (direction ``wc_k``).
        unique_patterns_train / unique_patterns_val: distinct activation patterns.
        bound: compression bound with ``side_bits`` per support sample: the ``n_hidden`` activation bits and
            ``⌈log2 K⌉`` class-label bits (conservative: a compression set of labelled samples carries its labels).
        val_agreement: fraction of validation samples where ``argmax_k N_k`` equals ``argmax_k f_k``.
        val_errors_network / val_errors_svm / val_errors_both: misclassified validation samples.
        val_predictions: ``(network, svm)`` class predictions on the validation set.
    """

    svm: MulticlassMaxMarginResult | OneVsRestResult
    m: int
    num_classes: int
    n_hidden: int
    network_margin: float
    margin_ratio: float | None
    cosine: float
    wc_norm: float
    gram: np.ndarray = field(repr=False)
    unique_patterns_train: int = 0
    side_bits: int = 0
    bound: float = math.nan
    delta: float = 0.05
    per_class_cosine: tuple[float, ...] | None = None
    per_class_network_margin: tuple[float, ...] | None = None
    per_class_margin_ratio: tuple[float, ...] | None = None
    unique_patterns_val: int | None = None
    val_agreement: float | None = None
    val_errors_network: int | None = None
    val_errors_svm: int | None = None
    val_errors_both: int | None = None
    val_predictions: tuple[Tensor, Tensor] | None = field(default=None, repr=False)

    @property
    def method(self) -> str:
        return self.svm.method

    @property
    def n_support(self) -> int:
        return self.svm.n_support_

    def to_metrics(self) -> dict[str, float]:
        metrics = {
            **self.svm.to_metrics(),
            "network_margin": self.network_margin,
            "cosine_wbar_v": self.cosine,
            "wbar_centred_norm": self.wc_norm,
            "unique_patterns_train": float(self.unique_patterns_train),
            "compression_bound": self.bound,
        }
        if self.margin_ratio is not None:
            metrics["margin_ratio"] = self.margin_ratio
        per_class = {
            "cosine_wbar_v": self.per_class_cosine,
            "network_margin": self.per_class_network_margin,
            "margin_ratio": self.per_class_margin_ratio,
        }
        for name, values in per_class.items():
            metrics.update({f"{name}_class{k}": float(v) for k, v in enumerate(values or ())})
        metrics.update(validation_metrics(self))
        return metrics

    def report(self) -> str:
        """A short human-readable summary."""
        svm = self.svm
        per_class = ", ".join(f"{k}: {n}" for k, n in enumerate(svm.n_support_per_class))
        lines = [
            f"network support vectors ({self.num_classes} classes, {self.method}): {self.n_support} of m={self.m} "
            f"(s/m = {self.n_support / self.m:.4f}), KKT residual {svm.kkt_residual:.1e}",
            f"support vectors per class{' problem' if self.method == 'ovr' else ''}: {per_class}",
        ]
        if isinstance(svm, MulticlassMaxMarginResult):
            lines.append(
                f"max margin 1/||V|| = {svm.margin:.4g} ({svm.n_support_pairs} support pairs); network margin = "
                f"{self.network_margin:.4g} (ratio {self.margin_ratio:.4f}); cosine(Wc, V) = {self.cosine:.4f}"
            )
        else:
            lines.append(f"network margin = {self.network_margin:.4g}; cosine(Wc, V) = {self.cosine:.4f}")
            for k, msg in enumerate(svm.not_separable):
                lines.append(
                    f"  class {k}: not separable from the rest" if msg is not None else
                    f"  class {k}: margin {svm.margins[k]:.4g}, network margin {self.per_class_network_margin[k]:.4g} "
                    f"(ratio {self.per_class_margin_ratio[k]:.4f}), cosine {self.per_class_cosine[k]:.4f}"
                )
        lines.append(
            f"activation patterns: {self.unique_patterns_train} unique on train"
            + ("" if self.unique_patterns_val is None else f", {self.unique_patterns_val} on validation")
        )
        if self.val_agreement is not None:
            lines.append(
                f"validation: network and SVM agree on {100 * self.val_agreement:.2f}%"
                + ("" if self.val_errors_network is None else
                   f"; errors network {self.val_errors_network}, SVM {self.val_errors_svm}, both {self.val_errors_both}")
            )
        lines.append(
            f"compression bound (delta={self.delta}, {self.side_bits} bits per support vector): {self.bound:.4g}"
        )
        return "\n".join(lines)


def _check_zero_error(outputs: Tensor, y: np.ndarray) -> np.ndarray:
    """Pair margins of the network; raises unless every one is positive and every output finite."""
    finite = torch.isfinite(outputs).all(1).numpy()
    margins = pair_margins(outputs, y)
    wrong = ~finite | (margins.min(1) <= 0)
    if wrong.any():
        raise NotSeparableError(
            f"the network misclassifies {int(wrong.sum())} of {len(y)} training samples ({int((~finite).sum())} "
            "of them with non-finite outputs): the support-vector analysis needs N_y(x) − N_k(x) > 0 for every "
            "training sample and every k ≠ y (Assumption 1); a tie counts as an error"
        )
    return margins


def multiclass_support_vectors(
    net: PathNetwork,
    x_train: Tensor,
    y_train: Tensor,
    x_val: Tensor | None = None,
    y_val: Tensor | None = None,
    *,
    method: str = "exact",
    delta: float = 0.05,
    tol: float = 1e-10,
    max_iter: int | None = None,
    block_size: int | None = None,
    solver: str = "auto",
) -> MulticlassSupportVectorAnalysis:
    """Fit the multi-class max-margin classifier on the path kernel of ``net`` and compare it with the network.

    Cost: kernel columns ``K(·, x_j)`` only for samples that enter the solver (``8·m`` bytes each, computed
    once); ``method="exact"`` has ``m(K − 1)`` dual variables, an ``m×s×K`` product per solver iteration and
    ``8·|F|²`` bytes for the factor of the free pairs (m = 20,000, K = 10: about 1 min, 2.5 GiB, see
    ``benchmarks/results/multiclass_scale.md``); ``"ovr"`` solves ``K`` problems of ``m`` variables. Validation
    needs the kernel between validation samples and support samples only.

    Args:
        net: the path part at the frozen weights, ``K >= 2`` outputs.
        x_train, y_train: path-space inputs ``(m, f)`` and class labels in ``[0, K)``.
        x_val, y_val: optional held-out samples for agreement and pattern counts.
        method: ``"exact"`` (the multi-class SVM of DESIGN.md §2b) or ``"ovr"`` (one-vs-rest).
        delta: confidence of the compression bound.
        tol, max_iter: passed to :func:`max_margin`.
        block_size: rows per block of the kernel computation.
        solver: as for :func:`~lightning_nsv.support_vectors.network_support_vectors`; the pair problem is solved on
            the CPU with numpy, so ``"torch"`` is not honoured (a warning says so).

    Raises:
        NotSeparableError: when the network misclassifies a training sample (Assumption 1 fails).
    """
    num_classes = net.num_outputs
    if num_classes < 2:
        raise ValueError("the network has 1 output unit: use support_vectors.network_support_vectors")
    if method not in METHODS:
        raise ValueError(f"`method` can be {', '.join(METHODS)}, got {method!r}")
    check_samples(x_train, x_val)
    device = plan(SolverOptions(solver=solver, tol=tol, max_iter=max_iter), x_train.device, multiclass=True).device
    net, x_train, x_val = net.to(device), x_train.to(device), None if x_val is None else x_val.to(device)
    y_train, y_val = (y.to(device) if isinstance(y, Tensor) else y for y in (y_train, y_val))
    check_analysis_memory(net, len(x_train), 0 if x_val is None else len(x_val), device=device)
    outputs, slopes_train = forward_with_slopes(net, x_train)
    y = class_labels(y_train, num_classes, len(outputs))
    margins = _check_zero_error(outputs, y)
    x_train = analysis_inputs(x_train.reshape(len(y), -1), net.dtype)
    bias = net.biases is not None

    columns = PathKernelColumns(x_train, slopes_train, net.betas, net.gammas, bias=bias, dtype=net.dtype)

    diag = path_kernel_diagonal(x_train, slopes_train, bias=bias, dtype=net.dtype).numpy()
    centred_outputs = (outputs - outputs.mean(1, keepdim=True)).numpy()
    if method == "exact":
        svm = multiclass_max_margin(columns, y, num_classes, kernel_diag=diag, initial_margins=margins, tol=tol,
                                    max_iter=max_iter)
    else:
        svm = one_vs_rest_max_margin(columns, y, num_classes, kernel_diag=diag, initial_scores=centred_outputs,
                                     tol=tol, max_iter=max_iter)

    gram = output_gram(net)
    centred = centred_gram(gram)
    wc_norm = math.sqrt(max(float(np.trace(centred)), 0.0))
    network_margin = float(margins.min()) / wc_norm
    wc_dot_v = float((svm.beta_ * centred_outputs).sum())
    n_hidden = sum(net.hidden_widths)
    side_bits = n_hidden + math.ceil(math.log2(num_classes))
    analysis = dict(
        svm=svm,
        m=len(y),
        num_classes=num_classes,
        n_hidden=n_hidden,
        network_margin=network_margin,
        margin_ratio=network_margin / svm.margin if method == "exact" else None,
        cosine=wc_dot_v / (wc_norm * math.sqrt(svm.norm_v_sq)) if svm.norm_v_sq > 0 else math.nan,
        wc_norm=wc_norm,
        gram=gram,
        unique_patterns_train=unique_patterns(slopes_train, gammas=net.gammas),
        side_bits=side_bits,
        bound=compression_bound(len(y), svm.n_support_, side_bits, delta),
        delta=delta,
    )
    if method == "ovr":
        analysis.update(_one_vs_rest_comparison(svm, centred, centred_outputs, y))
    if x_val is not None:
        analysis.update(_validation(net, x_train, slopes_train, svm, x_val, y_val, block_size))
    return MulticlassSupportVectorAnalysis(**analysis)


def _one_vs_rest_comparison(svm: OneVsRestResult, centred: np.ndarray, scores: np.ndarray, y: np.ndarray) -> dict:
    """Per class: ``wc_k`` (score ``N_k − mean_l N_l``) against the class's max-margin ``v_k``."""
    cosines, network_margins, ratios = [], [], []
    for k, result in enumerate(svm.classes):
        norm = math.sqrt(max(centred[k, k], 0.0))
        signs = np.where(y == k, 1.0, -1.0)
        network_margins.append(float((signs * scores[:, k]).min()) / norm)
        if result is None:
            cosines.append(math.nan)
            ratios.append(math.nan)
            continue
        cosines.append(float(svm.beta_[:, k] @ scores[:, k]) / (norm * math.sqrt(result.norm_v_sq)))
        ratios.append(network_margins[-1] / result.margin)
    return dict(per_class_cosine=tuple(cosines), per_class_network_margin=tuple(network_margins),
                per_class_margin_ratio=tuple(ratios))


def _validation(net, x_train, slopes_train, svm, x_val, y_val, block_size) -> dict:
    val_outputs, slopes_val = forward_with_slopes(net, x_val)
    sv = torch.from_numpy(svm.support_)
    decision = multiclass_decision(net, x_train[sv], svm.beta_[svm.support_], x_val,
                                   slopes_support=[s[sv] for s in slopes_train], slopes_x=slopes_val,
                                   block_size=block_size)
    net_pred, svm_pred = val_outputs.argmax(1), decision.argmax(1)
    result = {
        "unique_patterns_val": unique_patterns(slopes_val, gammas=net.gammas),
        "val_agreement": float(multiclass_accuracy(svm_pred, net_pred, num_classes=net.num_outputs, average="micro"))
        if len(net_pred) else float("nan"),
        "val_predictions": (net_pred, svm_pred),
    }
    if y_val is not None:
        target = torch.from_numpy(class_labels(y_val, net.num_outputs, len(net_pred)))
        net_wrong, svm_wrong = net_pred != target, svm_pred != target
        result.update(
            val_errors_network=int(net_wrong.sum()),
            val_errors_svm=int(svm_wrong.sum()),
            val_errors_both=int((net_wrong & svm_wrong).sum()),
        )
    return result
