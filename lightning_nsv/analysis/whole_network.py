"""Network support vectors of a whole piecewise-linear network (DESIGN.md §2, §2b, §2c; issue 32).

:func:`whole_network_support_vectors` runs the analysis of :func:`~lightning_nsv.support_vectors.network_support_vectors`
(one output) or :func:`~lightning_nsv.multiclass.multiclass_support_vectors` (``K >= 2`` outputs) on the path kernel
of the *whole* traced module (convolutions, pooling, BatchNorm in eval, residual sums: :mod:`lightning_nsv.kernel`),
not only on a Linear/Leaky-ReLU head after a fixed embedding. The results are the existing result classes with the
scope of the kernel added (:class:`WholeNetworkAnalysis`, :class:`WholeNetworkMulticlassAnalysis`). Nothing here
imports Lightning.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
from torch import Tensor, nn
from torchmetrics.functional.classification import binary_accuracy, multiclass_accuracy

from lightning_nsv.errors import NonFiniteError
from lightning_nsv.kernel import (
    Gates,
    PairNetworkColumns,
    PiecewiseGraph,
    ScopeSummary,
    compute_gates,
    output_gram,
    path_norm_squared,
    scope_summary,
    trace,
    unique_patterns,
)
from lightning_nsv.kernel.pair_network import MEMORY_BYTES
from lightning_nsv.max_margin import NotSeparableError, max_margin, pair_max_margin, sample_indices
from lightning_nsv.models.layers import eval_mode
from lightning_nsv.multiclass import (
    MulticlassSupportVectorAnalysis,
    _pair_result,
    _pairs,
    centred_gram,
    class_labels,
    multiclass_max_margin,
    pair_margins,
)
from lightning_nsv.support_vectors import (
    INITIAL_MARGINS,
    SOLVERS,
    SupportVectorAnalysis,
    _check_finite_samples,
    available_memory_bytes,
    check_samples,
    compression_bound,
    signed_labels,
    solver_backend_device,
)

__all__ = ["SignsNotComputed", "WholeNetworkAnalysis", "WholeNetworkMulticlassAnalysis", "memory_estimate",
           "whole_network_support_vectors"]

# validation samples whose kernel against the support is formed at once (see _cross_kernel)
VALIDATION_CHUNK = 2048


class SignsNotComputed:
    """Stands in for :class:`~lightning_nsv.path_space.PathSigns` where the signs of ``wbar`` are not computed (the
    sign DP over layers of DESIGN.md §2 is written for Linear chains only): no metrics, falsy."""

    def to_metrics(self) -> dict[str, float]:
        return {}

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "not computed"


NOT_COMPUTED = SignsNotComputed()


class _Scoped:
    """The scope of the kernel as the first line of the report and as numbers among the metrics."""

    scope: str
    scope_counts: ScopeSummary | None

    def to_metrics(self) -> dict[str, float]:
        metrics = super().to_metrics()
        if self.scope_counts is not None:
            counts = self.scope_counts
            metrics.update(scope_maps=float(counts.maps), scope_gate_layers=float(counts.gate_layers),
                           scope_max_pools=float(counts.max_pools), scope_gates=float(counts.gates))
        return metrics

    def report(self) -> str:
        return f"path kernel of the {self.scope}\n{super().report()}"


@dataclass(frozen=True)
class WholeNetworkAnalysis(_Scoped, SupportVectorAnalysis):
    """:class:`~lightning_nsv.support_vectors.SupportVectorAnalysis` of a whole network with one output.

    Extra attributes:
        scope: :func:`~lightning_nsv.kernel.scope_summary` as text ("whole network: 5 maps, 4 gate layers, …").
        scope_counts: the same as numbers (``to_metrics()``: ``scope_maps``, ``scope_gate_layers``,
            ``scope_max_pools``, ``scope_gates``).
        signs: :data:`NOT_COMPUTED` (a :class:`SignsNotComputed`; its metrics are left out).
        n_hidden: gate units plus max-pool selections per sample (``scope_gates``).
    """

    signs: object = NOT_COMPUTED
    scope: str = ""
    scope_counts: ScopeSummary | None = field(default=None, repr=False)


@dataclass(frozen=True)
class WholeNetworkMulticlassAnalysis(_Scoped, MulticlassSupportVectorAnalysis):
    """:class:`~lightning_nsv.multiclass.MulticlassSupportVectorAnalysis` of a whole network with ``K >= 2``
    outputs (exact pair problem); ``scope``, ``scope_counts`` and ``n_hidden`` as :class:`WholeNetworkAnalysis`."""

    scope: str = ""
    scope_counts: ScopeSummary | None = field(default=None, repr=False)


# ------------------------------------------------------------------------------------------------------ memory


def _gate_bytes(graph: PiecewiseGraph) -> int:
    """Bytes of the gates of one sample: a bool per gate unit, an int32 per max-pool selection, the float64 output."""
    units = lambda shape: math.prod(shape)  # noqa: E731
    return (sum(units(g.shape) for g in graph.gates) + 4 * sum(units(p.shape) for p in graph.pools)
            + 8 * graph.num_outputs)


def memory_estimate(graph: PiecewiseGraph, m: int, n_val: int = 0, initial_columns: int | None = None,
                    block_bytes: int = MEMORY_BYTES) -> dict[str, int]:
    """What :func:`whole_network_support_vectors` holds at least, in bytes, before it allocates it: ``inputs``
    (float64 copies of the training and validation inputs), ``gates`` (of both sets), ``columns`` (the first
    ``initial_columns`` kernel columns the solver stores, ``8·m`` bytes each; it adds ``8·m`` per further sample that
    enters its free set, plus ``8·|F|²`` for its factor), ``blocks`` (one block of the pair network and of the
    float64 forward) and ``total``."""
    if initial_columns is None:
        initial_columns = INITIAL_MARGINS * int(math.sqrt(m))
    f = math.prod(graph.input_shape)
    parts = {
        "inputs": 8 * (m + n_val) * f,
        "gates": (m + n_val) * _gate_bytes(graph),
        "columns": 8 * m * (min(m, initial_columns) + 1),  # + the diagonal
        "blocks": 2 * block_bytes,
    }
    parts["total"] = sum(parts.values())
    return parts


def _check_memory(parts: dict[str, int], limit: int | None, device: torch.device) -> None:
    need = parts["total"]
    detail = ", ".join(f"{name} {value / 2**20:.1f} MiB" for name, value in parts.items() if name != "total")
    what = f"the whole-network analysis needs at least {need / 2**20:.1f} MiB ({detail})"
    fix = "analyse fewer samples, or a smaller network (or only its head: network_support_vectors)"
    if limit is not None and need > limit:
        raise ValueError(f"{what}, above memory_bytes={limit:,}; {fix}, or raise memory_bytes")
    available = available_memory_bytes()
    if available is not None and need > available:
        raise ValueError(f"{what}, more than the {available / 2**20:.1f} MiB of memory available; {fix}")
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device) \
            - torch.cuda.memory_allocated(device)
        if need > free:
            raise ValueError(f"{what}, more than the {free / 2**20:.1f} MiB free on {device}; {fix}")


# ------------------------------------------------------------------------------------------------------ checks


def _check_finite_module(module: nn.Module) -> None:
    for kind, named in (("parameter", module.named_parameters()), ("buffer", module.named_buffers())):
        for name, t in named:
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                what = "NaN" if bool(torch.isnan(t).any()) else "inf"
                raise NonFiniteError(f"{kind} {name} holds {what}: the network has diverged (lower the learning rate "
                                     "or clip gradients); no support-vector analysis of non-finite weights")


def _not_separable(x: Tensor, labels: Tensor, wrong: Tensor, on_boundary: Tensor, requirement: str) -> str:
    """Why Assumption 1 fails: the count, the first indices, and a pair of equal inputs with different labels."""
    first = torch.nonzero(wrong).reshape(-1)[:10].tolist()
    message = (f"the network misclassifies {int(wrong.sum())} of {len(labels)} training samples (first: "
               f"{', '.join(map(str, first))}{', …' if int(wrong.sum()) > len(first) else ''}; "
               f"{int((wrong & on_boundary).sum())} of them on the boundary, e.g. all units of a layer inactive): the "
               f"support-vector analysis needs {requirement} on every training sample (Assumption 1); a tie counts as "
               "an error")
    _, inverse = torch.unique(x.reshape(len(x), -1).cpu(), dim=0, return_inverse=True)
    seen: dict[int, tuple[int, float]] = {}
    for i, (group, label) in enumerate(zip(inverse.tolist(), labels.tolist())):
        other = seen.setdefault(group, (i, label))
        if other[1] != label:
            return (f"samples {other[0]} and {i} have the same input and different labels: no classifier separates "
                    f"them, the data are not separable (remove or relabel the duplicates); {message}")
    return message


def _slice_gates(gates: Gates, idx: Tensor) -> Gates:
    return Gates(gates.output[idx], {k: v[idx] for k, v in gates.bits.items()},
                 {k: v[idx] for k, v in gates.selections.items()})


def _cat_gates(first: Gates, second: Gates) -> Gates:
    return Gates(torch.cat([first.output, second.output]),
                 {k: torch.cat([v, second.bits[k]]) for k, v in first.bits.items()},
                 {k: torch.cat([v, second.selections[k]]) for k, v in first.selections.items()})


def _cross_kernel(graph: PiecewiseGraph, x_support: Tensor, gates_support: Gates, x_val: Tensor, gates_val: Gates,
                  block_bytes: int) -> Tensor:
    """``K(x_val, x_support)``, ``(n, s)`` float64 on the graph's device: a :class:`PairNetworkColumns` over the
    support followed by a chunk of validation samples, its first ``s`` columns' last rows. Memory per chunk of ``c``
    validation samples: ``8·(s + c)·(f + s)`` bytes plus their gates; the ``s×s`` block is formed once per chunk
    (wasted), so a chunk is :data:`VALIDATION_CHUNK` samples."""
    s = len(x_support)
    parts = []
    for lo in range(0, len(x_val), VALIDATION_CHUNK):
        idx = torch.arange(lo, min(len(x_val), lo + VALIDATION_CHUNK), device=graph.device)
        both = torch.cat([x_support.to(graph.device, torch.float64), x_val[lo:lo + len(idx)].to(graph.device,
                                                                                             torch.float64)])
        columns = PairNetworkColumns(graph, both, _cat_gates(gates_support, _slice_gates(gates_val, idx)),
                                     memory_bytes=block_bytes)
        parts.append(columns.columns(torch.arange(s))[s:])
    return torch.cat(parts) if parts else torch.zeros(0, s, dtype=torch.float64, device=graph.device)


# ---------------------------------------------------------------------------------------------------- analysis


def whole_network_support_vectors(
    module: nn.Module,
    x_train: Tensor,
    y_train: Tensor | np.ndarray | Sequence[int],
    x_val: Tensor | None = None,
    y_val: Tensor | np.ndarray | Sequence[int] | None = None,
    *,
    num_classes: int | None = None,
    delta: float = 0.05,
    initial: Sequence[int] | np.ndarray | Tensor | None = None,
    memory_bytes: int | None = None,
    solver: str = "auto",
    block_bytes: int = MEMORY_BYTES,
    tol: float = 1e-10,
) -> WholeNetworkAnalysis | WholeNetworkMulticlassAnalysis:
    """Fit the max-margin classifier on the path kernel of the whole ``module`` and compare it with the network.

    The module is traced in eval mode (its mode, dtype, device and weights are left as they were) into the operation
    table of DESIGN.md §2c; its gates (Leaky-ReLU-family slopes and max-pool selections) come from one float64
    forward. One output: the binary analysis of DESIGN.md §2 (labels 0/1 or ±1), as
    :func:`~lightning_nsv.support_vectors.network_support_vectors` with ``kernel="columns"``; ``K >= 2`` outputs: the
    exact multi-class pair problem of §2b (labels ``0..K−1``), as
    :func:`~lightning_nsv.multiclass.multiclass_support_vectors` with ``method="exact"``. On a plain Linear/Leaky-ReLU
    chain both give the same support, α and metrics as those functions (the kernel takes §1's factorised form).

    Differences from the head-only analyses: ``n_hidden`` (the bits of side information per support vector in the
    compression bound) counts every gate unit *and every max-pool selection* of the whole network (``scope_gates``):
    a max pool's choice is part of the activation pattern that a compression set must carry (strictly a selection
    among ``k`` window units takes ``log2 k`` bits; one bit each is what the bound uses). The signs of ``wbar`` are not
    computed (``signs`` is :data:`NOT_COMPUTED`, no ``path_*`` metrics). Unique patterns count every slope bit and
    max-pool selection.

    Cost: the trace and gates, one float64 forward (``m·scope_gates`` bytes of bits, ``4`` bytes per selection);
    kernel columns by the pair network only for samples that enter the solver's free set (``8·m`` bytes each; on a
    small CNN on 8×8 inputs about 5–12 ms a column at ``m = 1,000``, one CPU thread), and the diagonal (``m``
    pair-network evaluations). Validation: the gates of ``x_val`` and the kernel between validation samples and the
    ``s`` support samples (a :class:`~lightning_nsv.kernel.PairNetworkColumns` over the support and a chunk of
    validation samples: ``8·(s + c)·(f + s)`` bytes for a chunk of ``c``, plus an ``s×s`` block per chunk). The
    memory held at the start (:func:`memory_estimate`) is checked against ``memory_bytes`` and the memory available
    before anything large is allocated.

    Args:
        module: takes a batch of inputs ``(n, *input_shape)`` and returns ``(n,)``, ``(n, 1)`` or ``(n, K)`` logits;
            built from the operations of DESIGN.md §2c.
        x_train, y_train: training inputs in the module's input shape (images stay ``(C, H, W)``) and labels.
        x_val, y_val: optional held-out samples (``y_val`` optional too) for agreement, errors and pattern counts.
        num_classes: ``None`` (from the output: 1 → binary, ``K``); if given it must be 2 for one output, else ``K``.
        delta: confidence of the compression bound.
        initial: sample indices to try first as support vectors (a warm start: admitted whole; for ``K`` outputs all
            their pairs); default: the ``4·⌊√m⌋`` smallest network margins ``y·N(x)`` (binary), the
            ``⌊√(m(K−1))⌋`` smallest pair margins (K-class). The solution does not depend on it.
        memory_bytes: budget for what :func:`memory_estimate` counts (``None``: the memory available only).
        solver: where the binary active-set solver runs, as in ``network_support_vectors`` (``"auto"``: torch on
            CUDA, numpy on the CPU); the K-class solver runs in numpy.
        block_bytes: float64 values alive at once in one block of the pair network (a larger one on a GPU).
        tol: optimality tolerance of the solver.

    Raises:
        NotPiecewiseLinearError: when the module holds an operation outside the table (e.g. GELU), naming it.
        NonFiniteError: when parameters, buffers, inputs or outputs hold NaN or inf.
        NotSeparableError: when the network misclassifies a training sample (Assumption 1), naming how many and
            the first indices; ``N(x) = 0`` (binary) or a tie (K-class) counts as an error.
        ValueError: on labels, options, or memory that does not suffice.
    """
    if solver not in SOLVERS:
        raise ValueError(f"`solver` can be {', '.join(SOLVERS)}, got {solver!r}")
    check_samples(x_train, x_val)
    if y_val is not None and x_val is None:
        raise ValueError("y_val without x_val: pass the validation inputs too")
    m = len(x_train)
    if len(y_train) != m:
        raise ValueError(f"x_train has {m} samples and y_train {len(y_train)}")
    _check_finite_module(module)
    _check_finite_samples(x_train.reshape(m, -1), "training inputs")
    if x_val is not None:
        _check_finite_samples(x_val.reshape(len(x_val), -1), "validation inputs")
        if y_val is not None and len(y_val) != len(x_val):
            raise ValueError(f"x_val has {len(x_val)} samples and y_val {len(y_val)}")

    with eval_mode(module):
        graph = trace(module, x_train[:8])
    outputs_k = graph.num_outputs
    if num_classes is not None and num_classes != (2 if outputs_k == 1 else outputs_k):
        raise ValueError(f"num_classes={num_classes}, but the network has {outputs_k} output"
                         f"{'' if outputs_k == 1 else 's'} ({'binary: 2 classes' if outputs_k == 1 else 'K classes'})")
    binary = outputs_k == 1
    scope = scope_summary(graph)
    n_val = 0 if x_val is None else len(x_val)
    if initial is not None:
        initial = sample_indices(initial)
        if len(initial) and (initial.min() < 0 or initial.max() >= m):
            raise ValueError(f"`initial` holds indices outside [0, {m})")
    first_columns = (len(initial) if initial is not None else
                     INITIAL_MARGINS * int(math.sqrt(m)) if binary else int(math.sqrt(m * (outputs_k - 1))))
    _check_memory(memory_estimate(graph, m, n_val, first_columns, block_bytes), memory_bytes, graph.device)
    if not binary:  # fails for a network whose outputs are not those of a last Linear: before the solve
        gram = output_gram(graph).to(torch.float64).numpy()

    gates = compute_gates(graph, x_train, memory_bytes=block_bytes)
    columns = PairNetworkColumns(graph, x_train, gates, memory_bytes=block_bytes)
    diag = columns.diagonal().cpu().numpy()
    common = dict(m=m, unique_patterns_train=unique_patterns(gates), delta=delta, scope=str(scope),
                  scope_counts=scope)
    if binary:
        analysis = _binary(graph, x_train, y_train, gates, columns, diag, initial, solver, tol, scope)
    else:
        analysis = _multiclass(graph, x_train, y_train, gates, columns, diag, initial, tol, gram, scope, delta)
    analysis.update(common)
    if x_val is not None:
        val_gates = compute_gates(graph, x_val, memory_bytes=block_bytes)
        support = torch.as_tensor(analysis["svm"].support_, dtype=torch.long, device=graph.device)
        kernel = _cross_kernel(graph, columns.x[support], _slice_gates(gates, support), x_val, val_gates, block_bytes)
        svm = analysis["svm"]
        coef = (torch.from_numpy(svm.alpha_[svm.support_]) * signed_labels(y_train)[svm.support_] if binary
                else torch.from_numpy(svm.beta_[svm.support_])).to(kernel.device, torch.float64)
        analysis.update(_validation(coef, kernel, val_gates.output, val_gates, y_val, binary, outputs_k))
    if binary:
        analysis["bound"] = compression_bound(m, analysis["svm"].n_support_, scope.gates, delta)
        return WholeNetworkAnalysis(**analysis)
    return WholeNetworkMulticlassAnalysis(**analysis)


def _binary(graph, x_train, y_train, gates, columns, diag, initial, solver, tol, scope) -> dict:
    m = len(x_train)
    y = signed_labels(y_train).to(graph.device)
    outputs = gates.output.reshape(m)
    wrong = y * outputs <= 0
    if bool(wrong.any()):
        raise NotSeparableError(_not_separable(x_train, y.cpu(), wrong.cpu(), (outputs == 0).cpu(), "y·N(x) > 0"))
    initial_block = None  # a guess from the margins is admitted ⌊√m⌋ at a time, a given support whole
    if initial is None:
        initial = np.sort(torch.argsort(y * outputs)[: INITIAL_MARGINS * int(math.sqrt(m))].cpu().numpy())
    else:
        initial_block = max(1, len(initial))
    device = solver_backend_device(solver, graph.device)
    svm = max_margin(columns, y, kernel_diag=diag, initial=initial, initial_block=initial_block, device=device,
                     tol=tol)
    wbar_norm = math.sqrt(path_norm_squared(graph))
    y_cpu, outputs_cpu = y.cpu(), outputs.cpu()
    wbar_dot_v = float((torch.from_numpy(svm.alpha_) * y_cpu * outputs_cpu).sum())
    network_margin = float((y_cpu * outputs_cpu).min()) / wbar_norm
    return dict(
        svm=svm,
        n_hidden=scope.gates,
        network_margin=network_margin,
        margin_ratio=network_margin / svm.margin,
        cosine=wbar_dot_v / (wbar_norm * math.sqrt(svm.norm_v_sq)),
        wbar_norm=wbar_norm,
        bound=math.nan,  # set once the support is known
        solver_backend=svm.method if svm.method != "active-set" else (
            "numpy" if device is None else f"torch ({device})"),
    )


def _multiclass(graph, x_train, y_train, gates, columns, diag, initial, tol, gram, scope, delta) -> dict:
    num_classes = graph.num_outputs
    outputs = gates.output.reshape(len(x_train), num_classes).cpu()
    y = class_labels(y_train, num_classes, len(outputs))
    margins = pair_margins(outputs, y)
    wrong = margins.min(1) <= 0
    if wrong.any():
        ties = torch.from_numpy(margins.min(1) == 0)
        raise NotSeparableError(_not_separable(x_train, torch.from_numpy(y), torch.from_numpy(wrong), ties,
                                               "N_y(x) − N_k(x) > 0 for every k ≠ y"))

    def sample_columns(idx: np.ndarray) -> np.ndarray:
        return columns.columns(idx).cpu().numpy()

    if initial is None:
        svm = multiclass_max_margin(sample_columns, y, num_classes, kernel_diag=diag, initial_margins=margins, tol=tol)
    else:  # every pair of the given samples first (the sample-column route of multiclass_max_margin)
        pair_sample, pair_class = _pairs(y, num_classes)
        first = np.flatnonzero(np.isin(pair_sample, initial))
        pairs = pair_max_margin(sample_columns, y, num_classes, kernel_diag=diag, tol=tol, initial=first)
        svm = _pair_result(pairs, y, num_classes, pair_sample, pair_class)
    centred = centred_gram(gram)
    wc_norm = math.sqrt(max(float(np.trace(centred)), 0.0))
    network_margin = float(margins.min()) / wc_norm
    centred_outputs = (outputs - outputs.mean(1, keepdim=True)).numpy()
    side_bits = scope.gates + math.ceil(math.log2(num_classes))
    return dict(
        svm=svm,
        num_classes=num_classes,
        n_hidden=scope.gates,
        network_margin=network_margin,
        margin_ratio=network_margin / svm.margin,
        cosine=float((svm.beta_ * centred_outputs).sum()) / (wc_norm * math.sqrt(svm.norm_v_sq))
        if svm.norm_v_sq > 0 else math.nan,
        wc_norm=wc_norm,
        gram=gram,
        side_bits=side_bits,
        bound=compression_bound(len(y), svm.n_support_, side_bits, delta),
    )


def _validation(coef: Tensor, kernel: Tensor, val_outputs: Tensor, val_gates: Gates, y_val, binary: bool,
                num_classes: int) -> dict:
    """The SVM's decision ``f = K(x_val, x_support) · coef`` against the network's outputs on the validation set:
    ``sign`` (``>= 0``: +1, as ``sign(0) = +1``) of one output, else ``argmax`` (first maximum on ties)."""
    decision, val_outputs = (kernel @ coef).cpu(), val_outputs.cpu()
    n = len(val_outputs)
    if binary:
        val_outputs = val_outputs.reshape(n)
        net_pred = torch.where(val_outputs >= 0, 1.0, -1.0).to(torch.float64)
        svm_pred = torch.where(decision >= 0, 1.0, -1.0).to(torch.float64)
        agreement = float(binary_accuracy((svm_pred > 0).long(), (net_pred > 0).long())) if n else math.nan
        target = None if y_val is None else signed_labels(y_val).cpu()
    else:
        net_pred, svm_pred = val_outputs.reshape(n, num_classes).argmax(1), decision.argmax(1)
        agreement = float(multiclass_accuracy(svm_pred, net_pred, num_classes=num_classes, average="micro")) \
            if n else math.nan
        target = None if y_val is None else torch.from_numpy(class_labels(y_val, num_classes, n))
    result = {"unique_patterns_val": unique_patterns(val_gates), "val_agreement": agreement,
              "val_predictions": (net_pred, svm_pred)}
    if target is not None:
        net_wrong, svm_wrong = net_pred != target, svm_pred != target
        result.update(val_errors_network=int(net_wrong.sum()), val_errors_svm=int(svm_wrong.sum()),
                      val_errors_both=int((net_wrong & svm_wrong).sum()))
    return result
