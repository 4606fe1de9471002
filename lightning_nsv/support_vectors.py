"""Network support vectors of a binary network: the names of :mod:`lightning_nsv.analysis.binary` and its helpers,
kept for existing imports (the analysis in :mod:`~lightning_nsv.analysis.binary`, its start on kernel columns in
:mod:`~lightning_nsv.analysis.warm_start`, the refusals in :mod:`~lightning_nsv.analysis.checks`, the bound in
:mod:`~lightning_nsv.analysis.bounds`). Patch an attribute in the module that uses it, not here.
"""
from lightning_nsv.analysis.binary import (
    SupportVectorAnalysis,
    _validation,
    max_margin_decision,
    network_support_vectors,
    signed_labels,
    uses_dense_kernel,
)
from lightning_nsv.analysis.bounds import compression_bound
from lightning_nsv.analysis.checks import (
    check_analysis_memory,
    check_dense_fits as _check_dense_fits,
    check_finite_network as _check_finite_network,
    check_finite_samples as _check_finite_samples,
    check_samples,
    conflicting_duplicates,
    misclassified_message as _misclassified_message,
)
from lightning_nsv.analysis.result import VALIDATION_KEYS, validation_metrics
from lightning_nsv.analysis.warm_start import (
    INITIAL_MARGINS,
    PRUNE_MAX_BYTES,
    kernel_columns as _kernel_columns,
    pruned_support,
    serve_kernel_columns,
)
from lightning_nsv.errors import NonFiniteError
from lightning_nsv.memory import available_memory_bytes, check_memory
from lightning_nsv.solver.options import KERNEL_MODES, SOLVERS, analysis_device, solver_device

# the decision, made in lightning_nsv.solver.options; kept under this name for existing callers
solver_backend_device = solver_device

__all__ = [
    "NonFiniteError",
    "SupportVectorAnalysis",
    "check_analysis_memory",
    "compression_bound",
    "conflicting_duplicates",
    "max_margin_decision",
    "network_support_vectors",
    "serve_kernel_columns",
    "signed_labels",
]
