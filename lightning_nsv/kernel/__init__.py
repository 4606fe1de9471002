"""Path kernel of any piecewise-linear network (DESIGN.md §2c): trace a module into the operation table, fix its
gates by one float64 forward, and form kernel columns with the pair network (``K(x, x')`` = the network with every
weight 1 run on ``x ⊙ x'``), ``||wbar||²`` and the output Gram with the norm network."""
from lightning_nsv.kernel.graph import NotPiecewiseLinearError, PiecewiseGraph, trace
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

__all__ = ["Gates", "NotPiecewiseLinearError", "PairNetworkColumns", "PiecewiseGraph", "ScopeSummary",
           "compute_gates", "output_gram", "path_norm_squared", "scope_summary", "trace", "unique_patterns"]
