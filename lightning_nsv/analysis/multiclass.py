"""Network support vectors of multi-class heads (DESIGN.md §2b): the multi-class max-margin classifier in path space
of a network at zero training error (solved by :mod:`lightning_nsv.solver.multiclass`), compared with the network.
Nothing here imports Lightning.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
from torch import Tensor
from torchmetrics.functional.classification import multiclass_accuracy

from lightning_nsv.analysis.bounds import compression_bound
from lightning_nsv.analysis.checks import (check_analysis_memory, check_finite_network, check_finite_samples,
                                           check_samples, check_two_classes)
from lightning_nsv.analysis.result import SupportVectorResult, validation_fields, validation_metrics
from lightning_nsv.kernel.columns import PathKernelColumns
from lightning_nsv.kernel.decision import kernel_to_support
from lightning_nsv.kernel.formulas import (check_block_size, forward_with_slopes, output_gram, path_kernel_diagonal,
                                           unique_patterns)
from lightning_nsv.kernel.inputs import analysis_inputs, as_tensor_on
from lightning_nsv.kernel.network import PathNetwork
from lightning_nsv.solver import NotSeparableError
from lightning_nsv.solver.multiclass import (MulticlassMaxMarginResult, OneVsRestResult, class_labels,
                                             multiclass_max_margin, one_vs_rest_max_margin, pair_margins)
from lightning_nsv.solver.options import SolverOptions, plan
from lightning_nsv.validate import check_choice

__all__ = ["METHODS", "MulticlassSupportVectorAnalysis", "centred_gram", "multiclass_decision",
           "multiclass_support_vectors"]

METHODS = ("exact", "ovr")


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
    return kernel_to_support(net, x_support, x, slopes_support, slopes_x, block_size) @ beta_support


@dataclass(frozen=True)
class MulticlassSupportVectorAnalysis(SupportVectorResult):
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
        metrics = self._support_metrics(cosine_wbar_v=self.cosine, wbar_centred_norm=self.wc_norm)
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

    @property
    def bound_bits(self) -> int:
        """Bits of side information per support vector in the compression bound."""
        return self.side_bits

    def report(self) -> str:
        """A short human-readable summary."""
        svm = self.svm
        per_class = ", ".join(f"{k}: {n}" for k, n in enumerate(svm.n_support_per_class))
        lines = [
            f"network support vectors ({self.num_classes} classes, {self.method}): {self.n_support} of m={self.m} "
            f"(s/m = {self.n_support / self.m:.4g}), KKT residual {svm.kkt_residual:.1e}",
            f"support vectors per class{' problem' if self.method == 'ovr' else ''}: {per_class}",
        ]
        if isinstance(svm, MulticlassMaxMarginResult):
            lines.append(
                f"max margin 1/||V|| = {svm.margin:.4g} ({svm.n_support_pairs} support pairs); network margin = "
                f"{self.network_margin:.4g} (ratio {self.margin_ratio:.4g}); cosine(Wc, V) = {self.cosine:.4g}"
            )
        else:
            lines.append(f"network margin = {self.network_margin:.4g}; cosine(Wc, V) = {self.cosine:.4g}")
            lines.extend(self._class_lines())
        return "\n".join(lines + self._report_end(self.side_bits))

    def _class_lines(self) -> list[str]:
        """One-vs-rest: one line per class problem."""
        return [
            f"  class {k}: not separable from the rest" if msg is not None else
            f"  class {k}: margin {self.svm.margins[k]:.4g}, network margin {self.per_class_network_margin[k]:.4g} "
            f"(ratio {self.per_class_margin_ratio[k]:.4g}), cosine {self.per_class_cosine[k]:.4g}"
            for k, msg in enumerate(self.svm.not_separable)
        ]


def _check_zero_error(outputs: Tensor, y: np.ndarray) -> np.ndarray:
    """Pair margins of the network (finite outputs); raises unless every one is positive."""
    margins = pair_margins(outputs, y)
    wrong = margins.min(1) <= 0
    if wrong.any():
        raise NotSeparableError(
            f"the network misclassifies {int(wrong.sum())} of {len(y)} training samples (first: "
            f"{', '.join(map(str, np.flatnonzero(wrong)[:3]))}): the support-vector analysis needs "
            "N_y(x) − N_k(x) > 0 for every training sample and every k ≠ y (Assumption 1); a tie counts as an error"
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
        solver: as for :func:`~lightning_nsv.analysis.binary.network_support_vectors`; the pair problem is solved on
            the CPU with numpy, so ``"torch"`` is not honoured (a warning says so).

    Raises:
        NonFiniteError: when weights, biases, inputs or outputs hold NaN or inf.
        NotSeparableError: when the network misclassifies a training sample (Assumption 1 fails).
        ValueError: on labels or options that do not fit.
    """
    num_classes = net.num_outputs
    if num_classes < 2:
        raise ValueError("the network has 1 output unit: use support_vectors.network_support_vectors")
    check_choice("method", method, METHODS)
    check_block_size(block_size)
    check_finite_network(net)
    check_samples(x_train, x_val, y_val)
    check_finite_samples(x_train.reshape(len(x_train), -1), "training inputs")
    device = plan(SolverOptions(solver=solver, tol=tol, max_iter=max_iter), x_train.device, multiclass=True).device
    net, x_train, x_val = net.to(device), x_train.to(device), None if x_val is None else x_val.to(device)
    y_train, y_val = (y.to(device) if isinstance(y, Tensor) else y for y in (y_train, y_val))
    check_analysis_memory(net, len(x_train), 0 if x_val is None else len(x_val), device=device)
    outputs, slopes_train = forward_with_slopes(net, x_train)
    check_finite_samples(outputs, "network outputs")
    y = class_labels(y_train, num_classes, len(outputs))
    check_two_classes(y, num_classes)
    margins = _check_zero_error(outputs, y)
    x_train = analysis_inputs(x_train.reshape(len(y), -1), net.dtype)
    centred_outputs = (outputs - outputs.mean(1, keepdim=True)).numpy()
    svm = _solve(net, x_train, slopes_train, y, method, margins, centred_outputs, tol, max_iter)
    analysis = _summaries(net, svm, y, margins, centred_outputs, slopes_train, delta)
    if x_val is not None:
        analysis.update(_validation(net, x_train, slopes_train, svm, x_val, y_val, block_size))
    return MulticlassSupportVectorAnalysis(**analysis)


def _solve(net: PathNetwork, x_train: Tensor, slopes_train: Sequence[Tensor], y: np.ndarray, method: str,
           margins: np.ndarray, centred_outputs: np.ndarray, tol: float,
           max_iter: int | None) -> MulticlassMaxMarginResult | OneVsRestResult:
    """The exact pair problem or the ``K`` one-vs-rest problems on kernel columns computed on demand."""
    bias = net.biases is not None
    columns = PathKernelColumns(x_train, slopes_train, net.betas, net.gammas, bias=bias, dtype=net.dtype)
    diag = path_kernel_diagonal(x_train, slopes_train, bias=bias, dtype=net.dtype).numpy()
    if method == "exact":
        return multiclass_max_margin(columns, y, net.num_outputs, kernel_diag=diag, initial_margins=margins, tol=tol,
                                     max_iter=max_iter)
    return one_vs_rest_max_margin(columns, y, net.num_outputs, kernel_diag=diag, initial_scores=centred_outputs,
                                  tol=tol, max_iter=max_iter)


def _summaries(net: PathNetwork, svm: MulticlassMaxMarginResult | OneVsRestResult, y: np.ndarray,
               margins: np.ndarray, centred_outputs: np.ndarray, slopes_train: Sequence[Tensor], delta: float) -> dict:
    """The fields of :class:`MulticlassSupportVectorAnalysis` but validation."""
    num_classes = net.num_outputs
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
        margin_ratio=network_margin / svm.margin if svm.method == "exact" else None,
        cosine=wc_dot_v / (wc_norm * math.sqrt(svm.norm_v_sq)) if svm.norm_v_sq > 0 else math.nan,
        wc_norm=wc_norm,
        gram=gram,
        unique_patterns_train=unique_patterns(slopes_train, gammas=net.gammas),
        side_bits=side_bits,
        bound=compression_bound(len(y), svm.n_support_, side_bits, delta),
        delta=delta,
    )
    if svm.method == "ovr":
        analysis.update(_one_vs_rest_comparison(svm, centred, centred_outputs, y))
    return analysis


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
    """The validation fields: the SVM's class decision on ``x_val`` against the network's."""
    val_outputs, slopes_val = forward_with_slopes(net, x_val)
    sv = torch.from_numpy(svm.support_)
    decision = multiclass_decision(net, x_train[sv], svm.beta_[svm.support_], x_val,
                                   slopes_support=[s[sv] for s in slopes_train], slopes_x=slopes_val,
                                   block_size=block_size)
    net_pred, svm_pred = val_outputs.argmax(1), decision.argmax(1)
    target = None if y_val is None else torch.from_numpy(class_labels(y_val, net.num_outputs, len(net_pred)))
    return validation_fields(
        net_pred, svm_pred, target,
        lambda: float(multiclass_accuracy(svm_pred, net_pred, num_classes=net.num_outputs, average="micro")),
        unique_patterns(slopes_val, gammas=net.gammas))
