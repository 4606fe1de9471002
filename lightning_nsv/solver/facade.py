"""The solver's facade (:mod:`lightning_nsv.solver`): validate once, wrap a dense matrix or a function of column
indices once, dispatch to the active-set method or the intercept protocol."""
from __future__ import annotations

import numpy as np
import torch

from lightning_nsv.solver.active_set import active_set
from lightning_nsv.solver.column_store import store_for
from lightning_nsv.solver.factor import NumpyFreeSet, TorchFreeSet
from lightning_nsv.solver.intercept import svc_with_intercept
from lightning_nsv.solver.options import SolverOptions
from lightning_nsv.solver.pair_store import PairStore
from lightning_nsv.solver.protocol import KernelColumns, as_kernel_columns
from lightning_nsv.solver.result import MaxMarginResult
from lightning_nsv.threads import single_threaded_blas

__all__ = ["checked_labels", "max_margin", "pair_max_margin"]


def max_margin(
    kernel,
    y: np.ndarray | torch.Tensor,
    *,
    kernel_diag: np.ndarray | None = None,
    intercept: bool = False,
    C: float = 1e7,
    tol: float = 1e-10,
    max_iter: int | None = None,
    initial: np.ndarray | None = None,
    initial_block: int | None = None,
    device: str | torch.device | None = None,
) -> MaxMarginResult:
    """Max-margin classifier on a precomputed kernel.

    Cost without intercept: at most one kernel column per sample that enters the free set, ``O(m·s)`` memory
    for those columns and ``O(s²)`` per step for the Cholesky factor, ``s`` the number of support vectors.
    With intercept, scikit-learn needs the dense ``m×m`` kernel.

    Args:
        kernel: a :class:`~lightning_nsv.solver.protocol.KernelColumns` (e.g.
            :class:`~lightning_nsv.kernel.columns.PathKernelColumns`: signed columns ``y_i y_j K_ij / scale`` from the
            provider itself, and with float64 blocks ``Q[idx, idx]`` the numpy solver admits candidates from that
            block and forms full columns only for those still free when the margins are next needed); a dense
            ``(m, m)`` kernel (numpy or a tensor); or a function returning the columns ``K[:, idx]`` for an index
            array (then ``kernel_diag`` is required; any other method it has is not used).
        y: labels in ``{-1, +1}``.
        kernel_diag: ``diag(K)`` when ``kernel`` is a function (a provider's own diagonal otherwise, unless given).
        intercept: ``False`` for the hyperplane through the origin (exact); ``True`` for ``SVC`` with intercept.
        C: penalty of the intercept protocol on the normalised kernel (large: hard margin).
        tol: optimality tolerance on ``1 − y_i f(x_i)`` for the active-set solver.
        max_iter: bound on active-set iterations (default ``10·m``).
        initial: indices to try first as support vectors (e.g. smallest network margins).
        initial_block: members of ``initial`` admitted at a time while they violate the margin, most violated
            first (default ``⌊√m⌋``). A previous support is best admitted whole (``len(initial)``): most of it is
            support again, and one wide block needs fewer, more efficient column computations and solver steps
            than many narrow ones; for a guess, narrow blocks keep the members that earlier blocks made redundant
            from being computed at all.
        device: where the active-set solver keeps the kernel columns and the Cholesky factor and runs its
            products, triangular solves and factor updates (torch, float64); ``None``: numpy on the CPU (less CPU
            time there for these small, latency-bound steps, and more accurate products). A provider hands its
            rows over through :meth:`~lightning_nsv.solver.protocol.KernelColumns.signed_rows` on its own device, a
            dense tensor is read a block of rows at a time where it lies. Solutions agree with the numpy ones to
            rounding (tested on the CPU).

    Raises:
        ValueError: on shapes, labels or options that do not fit.
        NotSeparableError: when no hyperplane through the origin separates the data.
    """
    options = SolverOptions(intercept=intercept, C=C, tol=tol, max_iter=max_iter, initial_block=initial_block)
    y = y.detach().cpu().numpy() if isinstance(y, torch.Tensor) else np.asarray(y)
    columns, diag = as_kernel_columns(kernel, kernel_diag, tensor=device is not None and not intercept)
    y = checked_labels(diag, y)
    scale = float(diag.mean())
    if intercept:
        return svc_with_intercept(columns.columns(np.arange(y.shape[0])) / scale, y, scale, C)
    return _through_origin(columns, y, scale, options, initial, None if device is None else torch.device(device))


def _through_origin(columns: KernelColumns, y: np.ndarray, scale: float, options: SolverOptions,
                    initial: np.ndarray | None, device: torch.device | None) -> MaxMarginResult:
    """The active-set solve of the problem through the origin, its columns kept on ``device`` (numpy: ``None``)."""
    store = store_for(columns, y, scale, device)
    with single_threaded_blas():
        return active_set(store, y, scale, options.tol, options.max_iter, initial,
                          NumpyFreeSet if device is None else TorchFreeSet, options.initial_block)


def pair_max_margin(
    sample_columns,
    labels: np.ndarray,
    num_classes: int,
    *,
    kernel_diag: np.ndarray | None = None,
    tol: float = 1e-10,
    max_iter: int | None = None,
    initial: np.ndarray | None = None,
) -> MaxMarginResult:
    """The multi-class pair problem of DESIGN.md §2b, exactly, in its structured form.

    The same dual and active-set method as :func:`max_margin` with every label +1 on the ``m(K − 1)`` pairs
    ``p = (i, k)``, ``k ≠ y_i`` (sample-major, classes ascending), ``Q_pq = K(x_i, x_j) c_pq``; but ``Q`` is never
    formed column by column: sample kernel columns ``K(·, x_j)`` are asked for once per sample that has a candidate
    pair (``8·m·s_samples`` bytes), ``Q[:, F] α`` is ``f_{y_i}(x_i) − f_k(x_i)`` with ``f = K[:, S] β`` (an
    ``m×s×K`` product per iteration) and ``Q_FF`` comes from ``K_SS`` and the ``c_pq`` (``8·|F|²`` bytes for its
    factor). On the CPU, with numpy.

    Args:
        sample_columns: a :class:`~lightning_nsv.solver.protocol.KernelColumns`, or a function returning the kernel
            columns ``K[:, idx]`` (``(m, len(idx))``) for sample indices (then ``kernel_diag`` is required).
        labels: class labels in ``[0, num_classes)``, shape ``(m,)``.
        kernel_diag: ``diag(K)``.
        tol, max_iter: as :func:`max_margin` (``max_iter`` counts pair iterations, default ``10·m(K − 1)``).
        initial: pair indices to try first.

    Returns:
        The result over the pair variables (``alpha_``, ``support_`` and ``functional_margins`` index pairs).
    """
    options = SolverOptions(tol=tol, max_iter=max_iter)
    columns, diag = as_kernel_columns(sample_columns, kernel_diag)
    labels = np.asarray(labels, dtype=np.int64)
    if labels.ndim != 1 or labels.shape != diag.shape:
        raise ValueError(f"labels must have shape {diag.shape}, got {labels.shape}")
    if num_classes < 2 or (len(labels) and (labels.min() < 0 or labels.max() >= num_classes)):
        raise ValueError(f"labels must lie in [0, num_classes) with num_classes >= 2, got num_classes={num_classes}")
    pair_diag = 2.0 * np.repeat(diag, num_classes - 1)
    ones = checked_labels(pair_diag, np.ones(len(pair_diag)))
    scale = float(pair_diag.mean())
    store = PairStore(columns, labels, num_classes, scale)
    with single_threaded_blas():
        return active_set(store, ones, scale, options.tol, options.max_iter, initial)


def checked_labels(kernel_diag: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``y`` as float64 after checking its shape and values (±1) and that the kernel's diagonal is finite and
    positive (a zero sample has no margin)."""
    y = np.asarray(y)
    if y.ndim != 1 or y.shape[0] != kernel_diag.shape[0]:
        raise ValueError(f"y must have shape ({kernel_diag.shape[0]},), got {y.shape}")
    values = set(np.unique(y).tolist())
    if not values <= {-1, 1}:
        raise ValueError(f"labels must be -1 or +1, got values {sorted(values)}")
    bad = np.flatnonzero(~np.isfinite(kernel_diag))
    if len(bad):
        raise ValueError(f"kernel diagonal is NaN or inf at sample {bad[0]} ({len(bad)} samples in all): that "
                         "sample's inputs or the network hold non-finite values")
    bad = np.flatnonzero(kernel_diag <= 0)
    if len(bad):
        cause = ("a zero sample has no margin; remove it" if kernel_diag[bad[0]] == 0 else
                 "K(x, x) < 0 cannot come from a kernel (an inner product): check how the kernel was computed")
        raise ValueError(f"kernel diagonal must be finite and positive, got {kernel_diag[bad[0]]:.3g} at sample "
                         f"{bad[0]} ({len(bad)} samples in all): {cause}")
    return y.astype(np.float64)
