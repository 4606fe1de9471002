"""Network support vectors of a binary network: the max-margin classifier in path space of a network at zero
training error, compared with the network (DESIGN.md §2). Pure functions over a
:class:`~lightning_nsv.kernel.network.PathNetwork` and tensors."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
from torch import Tensor
from torchmetrics.functional.classification import binary_accuracy

from lightning_nsv.analysis.bounds import compression_bound
from lightning_nsv.analysis.checks import (check_analysis_memory, check_dense_fits, check_finite_network,
                                           check_finite_samples, check_samples, check_two_classes,
                                           misclassified_message)
from lightning_nsv.analysis.result import SupportVectorResult, validation_fields, validation_metrics
from lightning_nsv.analysis.warm_start import INITIAL_MARGINS, first_candidates, kernel_columns
from lightning_nsv.kernel.decision import max_margin_decision, signed_labels
from lightning_nsv.kernel.formulas import (check_block_size, forward_with_slopes, path_kernel, path_kernel_diagonal,
                                           path_norm_squared, unique_patterns)
from lightning_nsv.kernel.gram_cache import InputGramCache
from lightning_nsv.kernel.inputs import analysis_inputs
from lightning_nsv.kernel.network import PathNetwork
from lightning_nsv.kernel.path_signs import PathSigns, path_signs
from lightning_nsv.kernel.sharded import ColumnSharing
from lightning_nsv.solver import MaxMarginResult, NotSeparableError, initial_indices, max_margin
from lightning_nsv.solver.column_store import admits_lazily
from lightning_nsv.solver.options import Plan, SolverOptions, plan

__all__ = ["SupportVectorAnalysis", "network_support_vectors", "uses_dense_kernel"]


@dataclass(frozen=True)
class SupportVectorAnalysis(SupportVectorResult):
    """What the max-margin classifier in path space says about a network at zero training error.

    Attributes:
        svm: the max-margin solution (α, support vectors, KKT residual).
        m: training samples.
        network_margin: ``min_j y_j N(x_j) / ||wbar||``.
        margin_ratio: ``network_margin / svm.margin`` (≤ 1; 1 iff the network is the max-margin classifier).
        cosine: cosine of ``wbar`` and the max-margin direction ``v`` in path space.
        wbar_norm: ``||wbar||``.
        unique_patterns_train / unique_patterns_val: distinct activation patterns.
        val_agreement: fraction of validation samples where ``sign N(x)`` equals the SVM's prediction.
        val_errors_network / val_errors_svm / val_errors_both: misclassified validation samples.
        bound: sample-compression bound with ``n_hidden`` bits per support vector.
        signs: signs of the path weights ``wbar`` (fractions of paths and of path mass that are positive).
        val_predictions: ``(network, svm)`` predictions in ``{-1, +1}`` on the validation set.
        solver_backend: where the solver ran: ``"numpy"`` (the CPU), ``"torch (DEVICE)"`` or ``"libsvm"``.
    """

    svm: MaxMarginResult
    m: int
    n_hidden: int
    network_margin: float
    margin_ratio: float
    cosine: float
    wbar_norm: float
    unique_patterns_train: int
    bound: float
    delta: float
    signs: PathSigns
    unique_patterns_val: int | None = None
    val_agreement: float | None = None
    val_errors_network: int | None = None
    val_errors_svm: int | None = None
    val_errors_both: int | None = None
    val_predictions: tuple[Tensor, Tensor] | None = field(default=None, repr=False)
    solver_backend: str = "numpy"

    @property
    def n_support(self) -> int:
        return self.svm.n_support_

    def to_metrics(self) -> dict[str, float]:
        metrics = self._support_metrics(margin_ratio=self.margin_ratio, cosine_wbar_v=self.cosine)
        metrics.update(self.signs.to_metrics())
        metrics.update(validation_metrics(self))
        return metrics

    @property
    def bound_bits(self) -> int:
        """Bits of side information per support vector in the compression bound."""
        return self.n_hidden

    def report(self) -> str:
        """A short human-readable summary."""
        return "\n".join([
            f"network support vectors: {self.n_support} of m={self.m} (s/m = {self.n_support / self.m:.4g}), "
            f"solver {self.svm.method}, KKT residual {self.svm.kkt_residual:.1e}",
            f"max margin 1/||v|| = {self.svm.margin:.4g}; network margin = {self.network_margin:.4g} "
            f"(ratio {self.margin_ratio:.4g}); cosine(wbar, v) = {self.cosine:.4g}",
            *self._report_end(self.n_hidden),
        ])


def uses_dense_kernel(kernel: str, intercept: bool) -> bool:
    """Whether :func:`network_support_vectors` builds the dense ``m×m`` kernel (else columns on demand):
    :attr:`~lightning_nsv.solver.options.SolverOptions.dense`."""
    return SolverOptions(kernel=kernel, intercept=intercept).dense


def network_support_vectors(
    net: PathNetwork,
    x_train: Tensor,
    y_train: Tensor,
    x_val: Tensor | None = None,
    y_val: Tensor | None = None,
    *,
    intercept: bool = False,
    C: float = 1e7,
    delta: float = 0.05,
    kernel: str = "auto",
    max_dense_bytes: int = 4 << 30,
    block_size: int | None = None,
    initial: Sequence[int] | np.ndarray | Tensor | None = None,
    cache: InputGramCache | None = None,
    sharing: ColumnSharing | None = None,
    solver: str = "auto",
) -> SupportVectorAnalysis:
    """Fit the max-margin classifier on the path kernel of ``net`` and compare it with the network.

    Cost: with ``kernel="columns"`` only the kernel columns of samples that enter the solver's free set
    (``8·m·s'`` bytes for ``s'`` of them, ``O(m·s'·(f + Σ Ω_l))`` time); with ``kernel="dense"`` the ``m×m``
    path kernel in float64 (``8·m²`` bytes, m = 60,000: 28.8 GB; ``O(m²·(f + Σ Ω_l))`` time). ``"auto"`` takes
    columns for the problem through the origin (faster at every size measured) and the dense kernel for the
    intercept protocol, which needs it, up to ``max_dense_bytes``. Validation needs the kernel between validation
    samples and support vectors only. Computations run on the device of ``x_train`` when it is the CPU or CUDA
    (inputs elsewhere, e.g. on MPS, which has no float64, are moved to the CPU), the solver's too unless
    ``solver="numpy"`` (see ``solver``).

    Args:
        net: the path part at the frozen weights.
        x_train, y_train: path-space inputs ``(m, f)`` and labels (0/1 or ±1).
        x_val, y_val: optional held-out samples for agreement and pattern counts.
        intercept: ``True`` for the paper's ``SVC`` protocol with an intercept.
        C: penalty of the intercept protocol on the normalised kernel.
        delta: confidence of the compression bound.
        kernel: ``"auto"``, ``"dense"`` or ``"columns"`` (see Cost).
        max_dense_bytes: largest dense kernel ``"auto"`` builds.
        block_size: rows per block of the dense kernel and of the validation kernel (a positive integer).
        initial: sample indices to try first as support vectors, e.g. the support of a previous analysis
            (a warm start), admitted to the solver's free set as one block (those that violate the margin); default:
            the support kept in ``cache`` for these inputs (with ``solver`` torch or a float32 network less the
            members that the max-margin problem on that support alone no longer needs,
            :func:`~lightning_nsv.analysis.warm_start.pruned_support`), else the
            ``4·⌊√m⌋`` smallest network margins ``y·N(x)``, admitted as one block by the numpy solver on float64
            (which forms full columns only for the members it keeps), else ``⌊√m⌋`` at a time, most violated first,
            while they violate the margin. The solution does not depend on it; the time does. Refused unless its
            indices lie in ``[0, m)``; the intercept protocol (scikit-learn's ``SVC``) takes no warm start.
        cache: an :class:`~lightning_nsv.kernel.gram_cache.InputGramCache` to pass to every analysis of the same
            training inputs (e.g. after more epochs): rows of ``X Xᵀ`` it holds are not recomputed, and it keeps
            those of this analysis's support (``8·m·s`` bytes; up to ``8·m·s'`` during the analysis) and warm
            starts the next one from that support. Used with kernel columns only.
        sharing: a :class:`~lightning_nsv.kernel.sharded.ColumnSharing` of the root rank of a ``torch.distributed``
            group: the kernel columns are computed by every rank of the group on its shard of the rows (the other
            ranks run :func:`~lightning_nsv.analysis.warm_start.serve_kernel_columns` on the same inputs meanwhile); ``cache`` is then not used.
        solver: where the active-set solver of the problem through the origin keeps its columns and factor:
            ``"torch"`` on the device of ``x_train``, ``"numpy"`` on the CPU; ``"auto"`` (default) takes torch for
            CUDA inputs and numpy otherwise (less CPU time there). Same solution either way, to rounding.

    Raises:
        NonFiniteError: when weights, biases, inputs or outputs hold NaN or inf.
        NotSeparableError: when ``y·N(x) <= 0`` for a training sample (Assumption 1 fails). A sample with
            ``N(x) = 0`` counts as an error here: it has no margin, whatever ``sign(0)`` says.
        ValueError: on labels, options or a dense kernel that does not fit in memory.
    """
    options = SolverOptions(kernel=kernel, solver=solver, intercept=intercept, C=C, max_dense_bytes=max_dense_bytes)
    check_block_size(block_size)
    check_finite_network(net)
    check_samples(x_train, x_val, y_val)
    if initial is not None:
        initial = initial_indices(initial, len(x_train))
    decided = plan(options, x_train.device)
    x_train, y = _training_set(x_train, y_train, intercept, decided.device)
    on_device = net.to(decided.device)
    x_train = analysis_inputs(x_train, net.dtype)  # float32 inputs stay float32: the kernels convert them exactly
    _check_memory(net, len(y), x_val, decided, max_dense_bytes if kernel == "auto" else None, intercept)
    outputs, slopes_train = _separable_outputs(on_device, x_train, y)
    if decided.dense:
        svm = max_margin(path_kernel(x_train.to(net.dtype), slopes_train, bias=net.biases is not None,
                                     block_size=block_size), y, intercept=intercept, C=C, device=decided.solver_device,
                         initial=initial, initial_block=None if initial is None else max(1, len(initial)))
    else:
        svm = _solve_on_columns(on_device, x_train, slopes_train, y, outputs, initial,
                                None if sharing is not None else cache, sharing, decided)
    analysis = _summaries(net, svm, y, outputs, slopes_train, delta, decided)
    if x_val is not None:
        analysis.update(_validation(on_device, x_train, slopes_train, y, svm, x_val.to(decided.device), y_val,
                                    block_size))
    return SupportVectorAnalysis(**analysis)


def _training_set(x_train: Tensor, y_train: Tensor, intercept: bool, device: torch.device) -> tuple[Tensor, Tensor]:
    """``x_train`` flattened on ``device`` and the labels in ±1, refused when not finite or mismatched."""
    x_train = x_train.to(device)
    x_train = x_train.reshape(len(x_train), -1)
    check_finite_samples(x_train, "training inputs")
    y = signed_labels(y_train).to(device)
    if len(y) != len(x_train):
        raise ValueError(f"x_train has {len(x_train)} samples and y_train {len(y)}")
    check_two_classes(y, 1)
    return x_train, y


def _check_memory(net: PathNetwork, m: int, x_val: Tensor | None, decided: Plan, limit: int | None,
                  intercept: bool) -> None:
    """Refuse, before anything of size ``m`` is allocated, a dense kernel or per-sample arrays that do not fit."""
    if decided.dense:
        dense_bytes = m * m * torch.finfo(net.dtype).bits // 8
        check_dense_fits(dense_bytes, m, limit, intercept, decided.device)
    check_analysis_memory(net, m, 0 if x_val is None else len(x_val),
                          0 if decided.dense else min(m, INITIAL_MARGINS * int(math.sqrt(m))), decided.device)


def _separable_outputs(net: PathNetwork, x_train: Tensor, y: Tensor) -> tuple[Tensor, list[Tensor]]:
    """``N(x)`` and the slopes on the training set; refused unless finite and ``y·N(x) > 0`` everywhere."""
    outputs, slopes_train = forward_with_slopes(net, x_train)
    check_finite_samples(outputs[:, None], "network outputs")
    errors = int((y * outputs <= 0).sum())
    if errors:
        raise NotSeparableError(misclassified_message(x_train, y, outputs, errors))
    return outputs, slopes_train


def _solve_on_columns(net: PathNetwork, x_train: Tensor, slopes_train: Sequence[Tensor], y: Tensor, outputs: Tensor,
                      initial, cache: InputGramCache | None, sharing: ColumnSharing | None,
                      decided: Plan) -> MaxMarginResult:
    """The problem through the origin on kernel columns computed on demand (shared by the ranks of ``sharing``);
    ``cache`` keeps the rows of the support for the next analysis."""
    columns = kernel_columns(net, x_train, slopes_train, cache)
    columns = columns if sharing is None else sharing.columns(columns)
    initial, initial_block = first_candidates(net, x_train, slopes_train, y, outputs, initial, cache,
                                              admits_lazily(columns, decided.solver_device))
    diag = path_kernel_diagonal(x_train, slopes_train, bias=net.biases is not None, dtype=net.dtype)
    svm = max_margin(columns, y, kernel_diag=diag.cpu().numpy(), initial=initial, initial_block=initial_block,
                     device=decided.solver_device)
    if cache is not None:
        cache.keep(svm.support_)
    return svm


def _summaries(net: PathNetwork, svm: MaxMarginResult, y: Tensor, outputs: Tensor, slopes_train: Sequence[Tensor],
               delta: float, decided: Plan) -> dict:
    """The fields of :class:`SupportVectorAnalysis` but validation: margins, cosine, patterns, bound, path signs."""
    net = net.to("cpu")  # the scalar summaries below
    wbar_norm = math.sqrt(path_norm_squared(net))
    y_cpu, outputs_cpu = y.cpu(), outputs.cpu().to(torch.float64)
    alpha = torch.from_numpy(svm.alpha_)
    wbar_dot_v = float((alpha * y_cpu * outputs_cpu).sum())
    network_margin = float((y_cpu * outputs_cpu).min()) / wbar_norm
    n_hidden = sum(net.hidden_widths)
    return dict(
        svm=svm,
        m=len(y),
        n_hidden=n_hidden,
        network_margin=network_margin,
        margin_ratio=network_margin / svm.margin,
        cosine=wbar_dot_v / (wbar_norm * math.sqrt(svm.norm_v_sq)),
        wbar_norm=wbar_norm,
        unique_patterns_train=unique_patterns(slopes_train, gammas=net.gammas),
        bound=compression_bound(len(y), svm.n_support_, n_hidden, delta),
        delta=delta,
        signs=path_signs(net),
        solver_backend=svm.method if svm.method != "active-set" else decided.backend,
    )


def _validation(net, x_train, slopes_train, y, svm, x_val, y_val, block_size) -> dict:
    """The validation fields: the SVM's decision on ``x_val`` against the network's."""
    val_outputs, slopes_val = forward_with_slopes(net, x_val)
    sv = torch.from_numpy(svm.support_)
    decision = max_margin_decision(net, x_train[sv], y[sv], svm.alpha_[svm.support_], x_val, svm.intercept_,
                                   block_size=block_size, slopes_support=[s[sv] for s in slopes_train],
                                   slopes_x=slopes_val)
    svm_pred = torch.where(decision >= 0, 1.0, -1.0).to("cpu", torch.float64)
    net_pred = torch.where(val_outputs >= 0, 1.0, -1.0).to("cpu", torch.float64)
    return validation_fields(net_pred, svm_pred, None if y_val is None else signed_labels(y_val).cpu(),
                             lambda: float(binary_accuracy((svm_pred > 0).long(), (net_pred > 0).long())),
                             unique_patterns(slopes_val, gammas=net.gammas))
