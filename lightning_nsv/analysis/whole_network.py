"""Network support vectors of a whole piecewise-linear network (DESIGN.md §2, §2b, §2c; issue 32).

:func:`whole_network_support_vectors` runs the analysis of
:func:`~lightning_nsv.analysis.network_support_vectors` (one output) or
:func:`~lightning_nsv.analysis.multiclass_support_vectors` (``K >= 2`` outputs) on the path kernel of the *whole*
traced module (convolutions, pooling, BatchNorm in eval, residual sums: :mod:`lightning_nsv.kernel`), not only on a
Linear/Leaky-ReLU head after a fixed embedding. The results are the existing result classes with the scope of the
kernel added (:class:`WholeNetworkAnalysis`, :class:`WholeNetworkMulticlassAnalysis`). Memory:
:mod:`lightning_nsv.analysis.whole_network_memory`. Nothing here imports Lightning.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import Tensor, nn

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
from lightning_nsv.kernel.cut import Float64Embedding, cut_network
from lightning_nsv.kernel.pair_network import MEMORY_BYTES
from lightning_nsv.kernel.pair_sharded import ShardedPairColumns
from lightning_nsv.kernel.sharded import ColumnSharing
from lightning_nsv.analysis.whole_network_checks import (check_arguments, check_input_shape, check_scope_name,
                                                         check_zero_error)
from lightning_nsv.analysis.whole_network_budget import (DEFAULT_TIME_BUDGET, AnalysisCost, CostEstimate,
                                                         TimeBudgetError, check_budgets, check_cost_arguments,
                                                         check_cost_options, estimate_cost, say_to_stderr)
from lightning_nsv.analysis.whole_network_validation import held_out
from lightning_nsv.analysis.whole_network_memory import (BudgetedColumns, cache_budget, memory_budget,
                                                         memory_estimate)
from lightning_nsv.solver import initial_indices, max_margin, pair_max_margin
from lightning_nsv.models.layers import eval_mode
from lightning_nsv.analysis.multiclass import MulticlassSupportVectorAnalysis, centred_gram
from lightning_nsv.solver.multiclass import _pair_result, _pairs, class_labels, multiclass_max_margin
from lightning_nsv.analysis.binary import SupportVectorAnalysis, signed_labels
from lightning_nsv.analysis.bounds import compression_bound
from lightning_nsv.analysis.warm_start import INITIAL_MARGINS
from lightning_nsv.solver.options import solver_device as solver_backend_device

__all__ = ["SignsNotComputed", "TimeBudgetError", "WholeNetworkAnalysis", "WholeNetworkMulticlassAnalysis",
           "memory_estimate", "serve_whole_network_columns", "whole_network_cost", "whole_network_support_vectors"]

BUDGET_ADVICE = ("its head after a fixed embedding (network_support_vectors on the embedded inputs; "
                 "NetworkSupportVectors(scope='head'))")


class SignsNotComputed:
    """Stands in for :class:`~lightning_nsv.kernel.PathSigns` where the signs of ``wbar`` are not computed (the
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
        text = f"path kernel of the {self.scope}\n{super().report()}"
        if self.kernel_pairs:
            estimate = "" if self.estimate is None else (
                f" (estimated at most {self.estimate.pairs:,}, {self.estimate.seconds_per_pair * 1e6:.2f} µs a pair)")
            text += f"\nkernel: {self.kernel_engine}; {self.kernel_pairs:,} pairs of the pair network{estimate}"
        return text


@dataclass(frozen=True)
class WholeNetworkAnalysis(_Scoped, SupportVectorAnalysis):
    """:class:`~lightning_nsv.analysis.SupportVectorAnalysis` of a whole network with one output.

    Extra attributes:
        scope: :func:`~lightning_nsv.kernel.scope_summary` as text ("whole network: 5 maps, 4 gate layers, …").
        kernel_engine, kernel_pairs: how the kernel entries were computed (``PairNetworkColumns.engine``) and how many
            pair-network evaluations the analysis ran (training kernel, diagonal, validation kernel).
        estimate: the :class:`~lightning_nsv.analysis.whole_network_budget.CostEstimate` said before the solve.
        scope_counts: the same as numbers (``to_metrics()``: ``scope_maps``, ``scope_gate_layers``,
            ``scope_max_pools``, ``scope_gates``).
        signs: :data:`NOT_COMPUTED` (a :class:`SignsNotComputed`; its metrics are left out).
        n_hidden: gate units plus max-pool selections per sample (``scope_gates``).
    """

    signs: object = NOT_COMPUTED
    scope: str = ""
    scope_counts: ScopeSummary | None = field(default=None, repr=False)
    kernel_engine: str = ""
    kernel_pairs: int = 0
    estimate: CostEstimate | None = field(default=None, repr=False)


@dataclass(frozen=True)
class WholeNetworkMulticlassAnalysis(_Scoped, MulticlassSupportVectorAnalysis):
    """:class:`~lightning_nsv.analysis.MulticlassSupportVectorAnalysis` of a whole network with ``K >= 2``
    outputs (exact pair problem); ``scope``, ``scope_counts`` and ``n_hidden`` as :class:`WholeNetworkAnalysis`."""

    scope: str = ""
    scope_counts: ScopeSummary | None = field(default=None, repr=False)
    kernel_engine: str = ""
    kernel_pairs: int = 0
    estimate: CostEstimate | None = field(default=None, repr=False)


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
    scope_name: str = "whole network",
    sharing: ColumnSharing | None = None,
    time_budget: float | None = DEFAULT_TIME_BUDGET,
    say: Callable[[str], None] | None = say_to_stderr,
    progress: bool = True,
    budget_advice: str = BUDGET_ADVICE,
    traced: PiecewiseGraph | None = None,
    gates: Gates | None = None,
    start: str | None = None,
) -> WholeNetworkAnalysis | WholeNetworkMulticlassAnalysis:
    """Fit the max-margin classifier on the path kernel of the whole ``module`` and compare it with the network.

    The module is traced in eval mode (its mode, dtype, device and weights are left as they were) into the operation
    table of DESIGN.md §2c; its gates (Leaky-ReLU-family slopes and max-pool selections) come from one float64
    forward. One output: the binary analysis of DESIGN.md §2 (labels 0/1 or ±1), as
    :func:`~lightning_nsv.analysis.network_support_vectors` with ``kernel="columns"``; ``K >= 2`` outputs: the
    exact multi-class pair problem of §2b (labels ``0..K−1``), as
    :func:`~lightning_nsv.analysis.multiclass_support_vectors` with ``method="exact"``. On a plain Linear/Leaky-ReLU
    chain both give the same support, α and metrics as those functions (the kernel takes §1's factorised form).

    Differences from the head-only analyses: ``n_hidden`` (the bits of side information per support vector in the
    compression bound) counts every gate unit *and every max-pool selection* of the whole network (``scope_gates``):
    a max pool's choice is part of the activation pattern that a compression set must carry (strictly a selection
    among ``k`` window units takes ``log2 k`` bits; one bit each is what the bound uses). The signs of ``wbar`` are not
    computed (``signs`` is :data:`NOT_COMPUTED`, no ``path_*`` metrics). Unique patterns count every slope bit and
    max-pool selection.

    Cost: the trace and gates, one float64 forward (``m·scope_gates`` bytes of bits, ``4`` bytes per selection);
    the per-sample factors of the compiled pair program (:mod:`lightning_nsv.kernel.fused`; 37 KiB a sample for
    SmallResNet(16) on 3×32×32); kernel columns by the pair network only for samples that enter the solver's free set
    (``8·m`` bytes each), one evaluation a pair (about 3 µs for SmallResNet(16) on 3×32×32 on two CPU threads), up to
    about ``m²/2`` pairs (whole networks keep most samples in the free set; the bound:
    :func:`~lightning_nsv.analysis.whole_network_budget.kernel_pairs`), and the diagonal (``m`` evaluations). The rate
    is measured first on a tile of pairs, and the estimate is said (``say``) when the analysis will take more than
    about 10 s, and checked against ``time_budget``. Validation: the gates of ``x_val`` and the kernel between
    validation samples and the ``s`` support samples (a :class:`~lightning_nsv.kernel.PairNetworkColumns` over the
    support and a chunk of ``c`` validation samples: ``8·(s + c)·(f + s)`` bytes, ``c`` =
    :data:`~lightning_nsv.analysis.whole_network_validation.VALIDATION_CHUNK`). What is allocated before the
    solve (:func:`memory_estimate`) is checked against ``memory_bytes`` and the memory available before it is
    allocated, and the solver's kernel columns (``8·m`` bytes per sample asked for) against the same budget before
    each is formed: a refusal names the numbers.

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
        memory_bytes: budget in bytes for what :func:`memory_estimate` counts and the kernel columns the solver
            forms (``None``: the memory available at the start only); checked before each allocation.
        solver: where the binary active-set solver runs, as in ``network_support_vectors`` (``"auto"``: torch on
            CUDA, numpy on the CPU); the K-class solver runs in numpy.
        block_bytes: float64 values alive at once in one block of the pair network (a larger one on a GPU).
        tol: optimality tolerance of the solver.
        scope_name: what ``module`` is, for the scope line (e.g. ``"layers after the trunk `features`"`` when the
            inputs are a fixed embedding's outputs).
        sharing: a :class:`~lightning_nsv.kernel.ColumnSharing` of the root rank of a ``torch.distributed``
            group: the solver's kernel columns are computed by every rank on its shard of the rows
            (:class:`~lightning_nsv.kernel.pair_sharded.ShardedPairColumns`; the other ranks run
            :func:`serve_whole_network_columns` on the same module and inputs meanwhile).
        time_budget: seconds (default an hour); the analysis is refused up front (:class:`TimeBudgetError`, saying
            how many samples would fit) when its cost estimate is above it; ``None`` or ``inf``: no limit.
        say: where the estimate goes when the analysis will take more than about 10 s (default: stderr; ``None``:
            not said).
        progress: a bar of the pair-network evaluations against the estimate, with an ETA, for analyses that long.
        budget_advice: what a refusal suggests besides a subsample (a caller with a head names it).
        traced: the graph of ``module`` traced already with its current weights (the callback's zero-error pass),
            used instead of a new trace.
        gates: the gates of ``x_train`` computed already on that graph (:func:`~lightning_nsv.kernel.compute_gates`,
            the same for any split of the samples), used instead of a new float64 forward.
        start: the name of a submodule (``named_modules()``) or ``"input"``: the analysis starts at its input; what
            comes before is a fixed embedding ``h(x)``, computed in float64 (eval mode), and the part after it is
            analysed on ``h(x)`` (:func:`~lightning_nsv.kernel.cut.cut_network`; refused, naming the connection, where
            a skip connection crosses the cut). ``traced`` and ``gates`` are then those of that part on ``h(x)``;
            ``scope_name`` defaults to ``"layers from `start`"``.

    Raises:
        NotPiecewiseLinearError: when the module holds an operation outside the table (e.g. GELU), naming it.
        TimeBudgetError: when the estimate is above ``time_budget``.
        NonFiniteError: when parameters, buffers, inputs or outputs hold NaN or inf.
        NotSeparableError: when the network misclassifies a training sample (Assumption 1), naming how many and
            the first indices; ``N(x) = 0`` (binary) or a tie (K-class) counts as an error.
        ValueError: on labels, options, or memory that does not suffice.
    """
    if start is not None:
        module, x_train, x_val = _cut(module, start, x_train, x_val)
        scope_name = f"layers from `{start}`" if scope_name == "whole network" else scope_name
    check_arguments(module, x_train, y_train, x_val, y_val, solver, delta)
    check_scope_name(scope_name)
    time_budget = check_cost_options(time_budget, say, progress, budget_advice)
    check_budgets(block_bytes, memory_bytes)
    started = time.perf_counter()
    m = len(x_train)
    graph = _trace(module, x_train) if traced is None else traced
    if gates is not None and len(gates) != m:
        raise ValueError(f"`gates` are of {len(gates)} samples, `x_train` holds {m}")
    num_outputs = graph.num_outputs
    if num_classes is not None and num_classes != (2 if num_outputs == 1 else num_outputs):
        kind = "1 output (binary: 2 classes)" if num_outputs == 1 else f"{num_outputs} outputs"
        raise ValueError(f"num_classes={num_classes}, but the network has {kind}")
    binary = num_outputs == 1
    y, y_val = _labels(y_train, y_val, num_outputs, m, None if x_val is None else len(x_val))
    if initial is not None:
        initial = initial_indices(initial, m)
    cost = AnalysisCost(time_budget, say, progress, budget_advice, started)
    try:
        fit = _fit(graph, x_train, y, block_bytes=block_bytes, n_val=0 if x_val is None else len(x_val),
                   memory_bytes=memory_bytes, sharing=sharing, initial=initial, solver=solver, tol=tol, delta=delta,
                   scope_name=scope_name, cost=cost, gates=gates)
        with fit.columns.owning_the_cores():
            validation = {} if x_val is None else held_out(graph, fit.columns, fit.gates, fit.solved.svm, y, x_val,
                                                            y_val, binary, block_bytes, cost.validation_pairs)
    finally:
        cost.close()
    common = dict(svm=fit.solved.svm, m=fit.m, n_hidden=fit.scope.gates, network_margin=fit.solved.network_margin,
                  margin_ratio=fit.solved.margin_ratio, cosine=fit.solved.cosine,
                  unique_patterns_train=fit.unique_patterns_train, bound=fit.bound, delta=fit.delta,
                  scope=str(fit.scope), scope_counts=fit.scope, kernel_engine=fit.columns.engine,
                  kernel_pairs=cost.pairs + fit.columns.pairs_evaluated, estimate=cost.estimate, **validation)
    if binary:
        return WholeNetworkAnalysis(wbar_norm=fit.solved.norm, solver_backend=fit.solved.solver_backend, **common)
    return WholeNetworkMulticlassAnalysis(wc_norm=fit.solved.norm, gram=fit.solved.gram, num_classes=num_outputs,
                                          side_bits=fit.side_bits, **common)


@dataclass(frozen=True)
class _Solved:
    """The max-margin solve and the network against it: ``norm`` is ‖w̄‖ (one output) or ‖W_c‖ (K outputs)."""

    svm: Any
    network_margin: float
    margin_ratio: float
    cosine: float
    norm: float
    solver_backend: str | None = None
    gram: np.ndarray | None = None


@dataclass(frozen=True)
class _Fit:
    """What the fit gives the analysis, with the ``columns`` and ``gates`` the held-out step reads."""

    solved: _Solved
    m: int
    scope: ScopeSummary
    unique_patterns_train: int
    delta: float
    bound: float
    side_bits: int
    columns: PairNetworkColumns
    gates: Gates


def _fit(graph, x_train, y, *, block_bytes, n_val, memory_bytes, sharing, initial, solver, tol, delta,
         scope_name, cost: AnalysisCost, gates: Gates | None = None) -> _Fit:
    """Memory check, gates, Assumption 1, the columns (shared by the ranks with ``sharing``) and the solve."""
    m, num_outputs = len(x_train), graph.num_outputs
    binary = num_outputs == 1
    parts = memory_estimate(graph, m, n_val, block_bytes)
    budget = memory_budget(parts, memory_bytes, graph.device)
    gram = None if binary else output_gram(graph).to(torch.float64).numpy()  # needs a last Linear: before the solve

    if gates is None:
        gates = compute_gates(graph, x_train, memory_bytes=block_bytes)
    outputs = gates.output.reshape(m, num_outputs).cpu()
    margins = check_zero_error(x_train, y, outputs, binary)
    columns = PairNetworkColumns(graph, x_train, gates, memory_bytes=block_bytes,
                                 cache_bytes=cache_budget(parts["total"], budget, m))
    scope = scope_summary(graph, scope_name)
    patterns = unique_patterns(gates)
    with columns.owning_the_cores():  # the estimate's tile, the diagonal and the solve
        cost.before_solve(columns, n_val, parts["total"])
        shared = columns if sharing is None else ShardedPairColumns(columns, sharing.group, sharing.root)
        budgeted = BudgetedColumns(shared, parts["total"], budget)
        diag = budgeted.diagonal()
        if binary:
            solved = _binary(graph, y, outputs[:, 0], margins, budgeted, diag, initial, solver, tol)
            side_bits = scope.gates
        else:
            side_bits = scope.gates + math.ceil(math.log2(num_outputs))
            solved = _multiclass(y.numpy(), outputs, margins, budgeted, diag, initial, tol, gram)
    return _Fit(solved, m, scope, patterns, delta,
                compression_bound(m, solved.svm.n_support_, side_bits, delta), side_bits, columns, gates)


def whole_network_cost(module: nn.Module, x_sample: Tensor, m: int, n_val: int = 0, *,
                       block_bytes: int = MEMORY_BYTES, memory_bytes: int | None = None,
                       start: str | None = None) -> CostEstimate:
    """What :func:`whole_network_support_vectors` of ``module`` on ``m`` training samples (and ``n_val`` validation
    samples) will cost, before training: the pair network's rate measured on the samples ``x_sample`` (a few dozen
    training inputs; the rate depends on the architecture, not the weights) and the memory the analysis allocates
    before its solver (refused here already where it does not fit). A few tenths of a second. ``m >= 1`` and
    ``n_val >= 0`` are integers (Python or numpy); ``m`` may be smaller than ``len(x_sample)``. ``start``: of the
    analysis from that cut on, as :func:`whole_network_support_vectors`."""
    started = time.perf_counter()
    if start is not None:
        module, x_sample, _ = _cut(module, start, x_sample, None)
    m, n_val = check_cost_arguments(x_sample, m, n_val, block_bytes, memory_bytes)
    check_input_shape(module, x_sample)
    graph = _trace(module, x_sample)
    parts = memory_estimate(graph, m, n_val, block_bytes)
    budget = memory_budget(parts, memory_bytes, graph.device)
    columns = PairNetworkColumns(graph, x_sample, compute_gates(graph, x_sample, memory_bytes=block_bytes),
                                 memory_bytes=block_bytes, cache_bytes=0)
    return estimate_cost(columns, n_val, parts["total"], time.perf_counter() - started, m=m,
                         cached_columns=cache_budget(parts["total"], budget, m) // (8 * max(1, m)))


def serve_whole_network_columns(module: nn.Module, x_train: Tensor, *, block_bytes: int = MEMORY_BYTES,
                                group: Any = None, root: int = 0) -> int:
    """The other ranks' side of :func:`whole_network_support_vectors` with ``sharing``: trace the same module,
    fix the gates of the same ``x_train`` and compute this rank's shard of the rows of every block of columns the
    root asks for, until its :class:`~lightning_nsv.kernel.ColumnSharing` block ends; the number of blocks."""
    check_input_shape(module, x_train)
    graph = _trace(module, x_train)
    gates = compute_gates(graph, x_train, memory_bytes=block_bytes)
    columns = PairNetworkColumns(graph, x_train, gates, memory_bytes=block_bytes)
    with columns.owning_the_cores():
        return ShardedPairColumns(columns, group, root).serve()


def _cut(module: nn.Module, start: str, x_train: Tensor,
         x_val: Tensor | None) -> tuple[nn.Module, Tensor, Tensor | None]:
    """The part of ``module`` after the cut at ``start`` and the float64 embedded inputs."""
    cut = cut_network(module, start)
    embed = Float64Embedding(cut.before)
    return cut.after, embed(x_train), None if x_val is None else embed(x_val)


def _trace(module: nn.Module, x_train: Tensor) -> PiecewiseGraph:
    with eval_mode(module):
        return trace(module, x_train[:8])


def _labels(y_train, y_val, num_outputs: int, m: int, n_val: int | None) -> tuple[Tensor, Tensor | None]:
    """Labels on the CPU, with the outputs (the solvers and the summaries run there): ±1, or class indices."""
    if num_outputs == 1:
        return signed_labels(y_train).cpu(), None if y_val is None else signed_labels(y_val).cpu()
    y = torch.from_numpy(class_labels(y_train, num_outputs, m))
    return y, None if y_val is None else torch.from_numpy(class_labels(y_val, num_outputs, n_val))


def _binary(graph, y, outputs, margins, columns, diag, initial, solver, tol) -> _Solved:
    m = len(y)
    initial_block = None  # a guess from the margins is admitted ⌊√m⌋ at a time, a given support whole
    if initial is None:
        initial = np.sort(np.argsort(margins, kind="stable")[: INITIAL_MARGINS * int(math.sqrt(m))])
    else:
        initial_block = max(1, len(initial))
    device = solver_backend_device(solver, graph.device)
    svm = max_margin(columns, y, kernel_diag=diag, initial=initial, initial_block=initial_block, device=device,
                     tol=tol)
    wbar_norm = math.sqrt(path_norm_squared(graph))
    network_margin = float(margins.min()) / wbar_norm
    return _Solved(
        svm=svm,
        network_margin=network_margin,
        margin_ratio=network_margin / svm.margin,
        cosine=float((torch.from_numpy(svm.alpha_) * y * outputs).sum()) / (wbar_norm * math.sqrt(svm.norm_v_sq)),
        norm=wbar_norm,
        solver_backend=svm.method if svm.method != "active-set" else (
            "numpy" if device is None else f"torch ({device})"),
    )


def _multiclass(y, outputs, margins, columns, diag, initial, tol, gram) -> _Solved:
    num_classes = outputs.shape[1]
    if initial is None:
        svm = multiclass_max_margin(columns, y, num_classes, kernel_diag=diag, initial_margins=margins, tol=tol)
    else:  # every pair of the given samples first (the sample-column route of multiclass_max_margin)
        pair_sample, pair_class = _pairs(y, num_classes)
        first = np.flatnonzero(np.isin(pair_sample, initial))
        pairs = pair_max_margin(columns, y, num_classes, kernel_diag=diag, tol=tol, initial=first)
        svm = _pair_result(pairs, y, num_classes, pair_sample, pair_class)
    wc_norm = math.sqrt(max(float(np.trace(centred_gram(gram))), 0.0))
    network_margin = float(margins.min()) / wc_norm
    centred_outputs = (outputs - outputs.mean(1, keepdim=True)).numpy()
    return _Solved(
        svm=svm,
        network_margin=network_margin,
        margin_ratio=network_margin / svm.margin,
        cosine=float((svm.beta_ * centred_outputs).sum()) / (wc_norm * math.sqrt(svm.norm_v_sq))
        if svm.norm_v_sq > 0 else math.nan,
        norm=wc_norm,
        gram=gram,
    )
