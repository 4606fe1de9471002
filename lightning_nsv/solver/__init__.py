"""Max-margin classifiers in path space (DESIGN.md §2, §2b): validate once, dispatch, solve.

Without intercept (the paper's Assumption 2, hyperplane through the origin) the dual

    min_α ½ αᵀQα − 1ᵀα   s.t. α >= 0,     Q_ij = y_i y_j K_ij,

is solved exactly by a primal active-set method in the manner of Lawson & Hanson's NNLS (1974; see
:mod:`~lightning_nsv.solver.active_set`) that keeps a Cholesky factor of ``Q`` on the free set and asks for kernel
columns only of samples that enter it. With ``intercept=True`` the paper's own protocol runs: scikit-learn
``SVC(kernel="precomputed")`` with a large ``C`` (:mod:`~lightning_nsv.solver.intercept`). Both normalise the kernel
by its mean diagonal ``c`` first; α and ``C`` are reported for the raw kernel (``C_raw = C / c``, ``α_raw = α / c``),
and the solution is checked for margin violations.

The solver reads kernels only through :class:`~lightning_nsv.solver.protocol.KernelColumns`; a dense matrix or a
function of column indices is wrapped into an adapter by the facade, once (:func:`~lightning_nsv.solver.protocol.
as_kernel_columns`).

The facade :func:`max_margin`, :func:`pair_max_margin` is :mod:`~lightning_nsv.solver.facade`; the K-class pair and
one-vs-rest problems are :mod:`~lightning_nsv.solver.multiclass`; where kernels, labels and the device are decided,
:mod:`~lightning_nsv.solver.options`.
"""
from lightning_nsv.solver.active_set import initial_indices, sample_indices, solver_progress
from lightning_nsv.solver.facade import max_margin, pair_max_margin
from lightning_nsv.solver.multiclass import (MulticlassMaxMarginResult, OneVsRestResult, class_labels,
                                             multiclass_max_margin, one_vs_rest_max_margin, pair_margins)
from lightning_nsv.solver.options import KERNEL_MODES, SOLVERS, SolverOptions, analysis_device, solver_device
from lightning_nsv.solver.protocol import KernelColumns
from lightning_nsv.solver.result import MaxMarginResult, NotSeparableError

__all__ = ["KERNEL_MODES", "KernelColumns", "MaxMarginResult", "MulticlassMaxMarginResult", "NotSeparableError",
           "OneVsRestResult", "SOLVERS", "SolverOptions", "analysis_device", "class_labels", "initial_indices",
           "max_margin", "multiclass_max_margin", "one_vs_rest_max_margin", "pair_margins", "pair_max_margin",
           "sample_indices", "solver_device", "solver_progress"]
