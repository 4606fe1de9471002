"""Path kernel of any piecewise-linear network (DESIGN.md §2c).

Trace a module into the operation table (or get :class:`NotPiecewiseLinearError` naming what is not piecewise
linear), fix its gates by one float64 forward, and form kernel columns with the pair network (``K(x, x')`` = the
network with every weight 1 run on ``x ⊙ x'``); ``||wbar||²`` and the output Gram come from the norm network::

    graph = trace(module, x[:8])              # the module is not changed
    gates = compute_gates(graph, x)           # N(x) in gates.output, slope bits, max-pool selections
    kernel = PairNetworkColumns(graph, x, gates)
    kernel.columns(idx)                       # K[:, idx], numpy float64 (a KernelColumns, as the solver reads it)
    kernel.columns_tensor(idx)                # the same on the module's device
    path_norm_squared(graph), output_gram(graph), scope_summary(graph), unique_patterns(gates)

Beyond ReLU (DESIGN.md §2c, :mod:`~lightning_nsv.kernel.piece_rules`): once x is fixed every non-linearity is a
choice among affine pieces. A gate of another slope (PReLU, ``torch.where(z > 0, z, a * z)``) puts the slope of its
piece into ``phi``. A saturated piece (Hardtanh, ReLU6, clamp) outputs a constant: the unit is then a path start with
that constant as its input, as a bias is, so the pair network maps ``P ↦ s(x)s(x')·P + c(x)c(x')`` (slopes 0 or 1,
flat values lo, 0 or hi). A selection (max pool, ``torch.maximum``: :mod:`~lightning_nsv.kernel.choice_rules`; a max
over channels — maxout) is a one-hot choice: the pair network passes the candidate that both samples choose, else 0.

Linear/Leaky-ReLU chains keep §1's factorised kernel in the modules beside this one: ``network`` (``PathNetwork``),
``formulas`` (the formulas of §1, one short function each), ``inputs``, ``gram_cache``, ``columns``
(``PathKernelColumns``), ``path_signs``, ``decision`` (the max-margin classifier as a function of ``x``) and
``sharded`` (DDP); ``factored``, ``column_cache`` and ``pair_sharded`` serve the pair network. ``path_norm_squared``,
``output_gram`` and ``unique_patterns`` exported here read a traced graph and its gates; those of a ``PathNetwork``
and its slopes are :mod:`~lightning_nsv.kernel.formulas`'s.
"""
from lightning_nsv.kernel.columns import PathKernelColumns
from lightning_nsv.kernel.decision import max_margin_decision, signed_labels
from lightning_nsv.kernel.formulas import forward_with_slopes, path_kernel, path_kernel_diagonal, slopes
from lightning_nsv.kernel.graph import GateLayer, NotPiecewiseLinearError, PiecewiseGraph, PoolLayer, trace
from lightning_nsv.kernel.gram_cache import InputGramCache
from lightning_nsv.kernel.network import PathNetwork
from lightning_nsv.kernel.pair_network import (
    Gates,
    PairNetworkColumns,
    ScopeSummary,
    compute_gates,
    output_gram,
    path_norm_squared,
    scope_summary,
    unique_patterns,
)
from lightning_nsv.kernel.path_signs import PathSigns, path_signs
from lightning_nsv.kernel.sharded import ColumnSharing, ShardedKernelColumns

__all__ = ["ColumnSharing", "GateLayer", "Gates", "InputGramCache", "NotPiecewiseLinearError", "PairNetworkColumns",
           "PathKernelColumns", "PathNetwork", "PathSigns", "PiecewiseGraph", "PoolLayer", "ScopeSummary",
           "ShardedKernelColumns", "compute_gates", "forward_with_slopes", "max_margin_decision", "output_gram",
           "path_kernel", "path_kernel_diagonal", "path_norm_squared", "path_signs", "scope_summary", "signed_labels",
           "slopes", "trace", "unique_patterns"]
