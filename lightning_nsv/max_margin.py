"""Max-margin classifiers in path space (DESIGN.md §2).

Without intercept (the paper's Assumption 2, hyperplane through the origin) the dual is

    min_α ½ αᵀQα − 1ᵀα   s.t. α >= 0,     Q_ij = y_i y_j K_ij,

solved exactly by an active-set method that keeps a Cholesky factor of ``Q`` on the free set and asks for
kernel columns only of samples that enter it. With ``intercept=True`` the paper's own protocol runs:
scikit-learn ``SVC(kernel="precomputed")`` with a large ``C``.

Both normalise the kernel by its mean diagonal ``c`` first; α and ``C`` are reported for the raw kernel
(``C_raw = C / c``, ``α_raw = α / c``), and the solution is checked for margin violations.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
import sys
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np
import scipy.linalg
import scipy.linalg.lapack
import torch

from lightning_nsv.memory import base_page_empty
from lightning_nsv.threads import single_threaded_blas

__all__ = ["MaxMarginResult", "NotSeparableError", "max_margin", "pair_max_margin", "solver_progress"]

KernelColumns = Callable[[np.ndarray], np.ndarray]
LIBSVM_TOL = 1e-5


class NotSeparableError(ValueError):
    """The embedded training data cannot be separated by a hyperplane through the origin."""


@dataclass(frozen=True)
class MaxMarginResult:
    """Solution of the max-margin problem; ``_``-suffixed fields follow scikit-learn's convention.

    Attributes:
        alpha_: dual coefficients for the raw kernel, shape ``(m,)``, zero off the support.
        support_: indices of the support vectors (``alpha_ > 0``), sorted.
        intercept_: the bias ``b`` (0 without intercept).
        norm_v_sq: ``||v||² = αᵀQα`` of the max-margin direction ``v = Σ α_i y_i phi(x_i)``.
        margin: geometric margin ``1 / ||v||``.
        kkt_residual: largest violation of the optimality conditions, in units of functional margin:
            ``max(max_i (1 − y_i f(x_i))_+, max_{i ∈ support} |y_i f(x_i) − 1|)`` (free support vectors only
            with intercept), plus ``|Σ α_i y_i|`` relative to ``Σ α_i`` with intercept.
        n_margin_violations: training samples with ``y_i f(x_i) < 1 − 1e-6`` (``1 − 1e-4`` for libsvm, whose
            stopping tolerance is ``1e-5``).
        kernel_scale: ``c``, the mean diagonal the kernel was divided by.
        C_effective: penalty on the raw kernel (``inf`` for the exact hard-margin solver).
        n_at_bound: support vectors with ``α = C`` (soft-margin ones; should be 0).
        functional_margins: ``y_i f(x_i)`` on the training set (raw scale, 1 on the margin).
        iterations: solver iterations.
        method: ``"active-set"`` or ``"libsvm"``.
    """

    alpha_: np.ndarray
    support_: np.ndarray
    intercept_: float
    norm_v_sq: float
    margin: float
    kkt_residual: float
    n_margin_violations: int
    kernel_scale: float
    C_effective: float
    n_at_bound: int
    functional_margins: np.ndarray = field(repr=False)
    iterations: int
    method: str

    @property
    def n_support_(self) -> int:
        return int(self.support_.shape[0])

    def to_metrics(self) -> dict[str, float]:
        return {
            "n_support": float(self.n_support_),
            "support_fraction": self.n_support_ / self.alpha_.shape[0],
            "svm_margin": self.margin,
            "kkt_residual": self.kkt_residual,
            "svm_margin_violations": float(self.n_margin_violations),
            "svm_alpha_at_bound": float(self.n_at_bound),
        }


def _validate(kernel_diag: np.ndarray, y: np.ndarray) -> np.ndarray:
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


def max_margin(
    kernel: np.ndarray | torch.Tensor | KernelColumns,
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
        kernel: dense ``(m, m)`` kernel, or a function returning the columns ``K[:, idx]`` for an index array
            (then ``kernel_diag`` is required). A function object with a method ``signed_columns(idx, y, scale)``
            (e.g. :class:`~lightning_nsv.path_space.PathKernelColumns`) gives the solver's columns
            ``y_i y_j K_ij / scale`` itself, Fortran-ordered float64; they are then taken as finite (a Gram
            matrix with the finite diagonal checked here). With a method ``signed_block(idx, y, scale)`` too
            (``Q[idx, idx]``) and float64 columns (its ``dtype``, when it has one), the numpy solver admits
            candidates from that block and the members' stored columns and forms full columns only for those still
            free when the margins are next needed.
        y: labels in ``{-1, +1}``.
        kernel_diag: ``diag(K)`` when ``kernel`` is a function.
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
            time there for these small, latency-bound steps, and more accurate products). A ``kernel`` with
            ``signed_rows(idx, y, scale)`` (e.g. :class:`~lightning_nsv.path_space.PathKernelColumns` on that
            device) hands its columns over in place.
            Solutions agree with the numpy ones to rounding (tested on the CPU).

    Raises:
        ValueError: on shapes or labels that do not fit.
        NotSeparableError: when no hyperplane through the origin separates the data.
    """
    y = y.detach().cpu().numpy() if isinstance(y, torch.Tensor) else np.asarray(y)
    if callable(kernel):
        if kernel_diag is None:
            raise ValueError("kernel_diag is required when kernel is a function of column indices")
        columns, diag = kernel, np.asarray(kernel_diag, dtype=np.float64)
    else:
        on_device = device is not None and not intercept and isinstance(kernel, torch.Tensor)
        dense = kernel.detach() if on_device else (
            kernel.detach().cpu().numpy() if isinstance(kernel, torch.Tensor) else np.asarray(kernel))
        if dense.ndim != 2 or dense.shape[0] != dense.shape[1]:
            raise ValueError(f"Precomputed kernel must be a square matrix. Input is a {tuple(dense.shape)} matrix.")
        if on_device:  # the solver takes rows by index (K symmetric), moved to its device a block at a time
            columns = dense.to(torch.float64)
            diag = torch.diagonal(columns).cpu().numpy().copy()
        else:
            dense = dense.astype(np.float64, copy=False)
            columns, diag = (lambda idx: dense[idx].T), np.diag(dense).copy()  # K symmetric: rows are contiguous
            if device is not None:
                columns = torch.from_numpy(dense)
    y = _validate(diag, y)
    scale = float(diag.mean())
    if intercept:
        full = dense / scale if not callable(kernel) else columns(np.arange(y.shape[0])) / scale
        return _svc_with_intercept(full, y, scale, C)
    if initial_block is not None and not (isinstance(initial_block, (int, np.integer))
                                          and not isinstance(initial_block, bool) and initial_block >= 1):
        raise ValueError(f"`initial_block` must be a positive integer, got {initial_block!r}")
    return _active_set(columns, y, scale, tol, max_iter, initial, None if device is None else torch.device(device),
                       initial_block)


def pair_max_margin(
    sample_columns: KernelColumns,
    labels: np.ndarray,
    num_classes: int,
    *,
    kernel_diag: np.ndarray,
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
    factor).

    Args:
        sample_columns: function returning the kernel columns ``K[:, idx]`` (``(m, len(idx))``) for sample indices.
        labels: class labels in ``[0, num_classes)``, shape ``(m,)``.
        kernel_diag: ``diag(K)``.
        tol, max_iter: as :func:`max_margin` (``max_iter`` counts pair iterations, default ``10·m(K − 1)``).
        initial: pair indices to try first.

    Returns:
        The result over the pair variables (``alpha_``, ``support_`` and ``functional_margins`` index pairs).
    """
    labels = np.asarray(labels, dtype=np.int64)
    diag = np.asarray(kernel_diag, dtype=np.float64)
    if labels.ndim != 1 or labels.shape != diag.shape:
        raise ValueError(f"labels must have shape {diag.shape}, got {labels.shape}")
    if num_classes < 2 or (len(labels) and (labels.min() < 0 or labels.max() >= num_classes)):
        raise ValueError(f"labels must lie in [0, num_classes) with num_classes >= 2, got num_classes={num_classes}")
    pair_diag = 2.0 * np.repeat(diag, num_classes - 1)
    ones = _validate(pair_diag, np.ones(len(pair_diag)))
    scale = float(pair_diag.mean())
    store = _PairStore(sample_columns, labels, num_classes, scale)
    with single_threaded_blas():
        return _active_set_loop(store, ones, scale, tol, max_iter, initial)


def _result(alpha_n, y, margins_n, scale, intercept, kkt, n_bound, C_eff, iterations, method, slack=1e-6):
    support = np.flatnonzero(alpha_n > 0)
    norm_v_sq_n = float(alpha_n[support] @ (margins_n[support] - intercept * y[support]))
    return MaxMarginResult(
        alpha_=alpha_n / scale,
        support_=support,
        intercept_=float(intercept),
        norm_v_sq=norm_v_sq_n / scale,
        margin=1.0 / math.sqrt(norm_v_sq_n / scale) if norm_v_sq_n > 0 else float("inf"),
        kkt_residual=float(kkt),
        n_margin_violations=int(np.sum(margins_n < 1 - slack)),
        kernel_scale=scale,
        C_effective=C_eff,
        n_at_bound=n_bound,
        functional_margins=margins_n,
        iterations=iterations,
        method=method,
    )


def _svc_with_intercept(kernel_n: np.ndarray, y: np.ndarray, scale: float, C: float) -> MaxMarginResult:
    from sklearn.svm import SVC

    svc = SVC(kernel="precomputed", C=C, tol=LIBSVM_TOL, shrinking=False, max_iter=-1)
    svc.fit(kernel_n, y)
    alpha_n = np.zeros(y.shape[0])
    alpha_n[svc.support_] = np.abs(svc.dual_coef_[0])
    b = float(svc.intercept_[0])
    margins = y * (kernel_n[:, svc.support_] @ svc.dual_coef_[0] + b)
    at_bound = alpha_n >= C * (1 - 1e-8)
    free = (alpha_n > 0) & ~at_bound
    kkt = max(
        float(np.max(np.clip(1 - margins, 0, None))),
        float(np.max(np.abs(margins[free] - 1), initial=0.0)),
        abs(float(alpha_n @ y)) / max(float(alpha_n.sum()), 1e-300),
    )
    if at_bound.any():
        warnings.warn(
            f"{int(at_bound.sum())} support vectors reached C={C} on the normalised kernel: the solution is "
            "soft-margin. Increase C.",
            stacklevel=3,
        )
    return _result(alpha_n, y, margins, scale, b, kkt, int(at_bound.sum()), C / scale, 0, "libsvm",
                   slack=10 * LIBSVM_TOL)


class _DenseColumns:
    """Full columns ``Q[:, new]`` of a block of candidates, ``(n, b)``, Fortran order."""

    def __init__(self, new: np.ndarray, cols: np.ndarray) -> None:
        self.new, self.cols = new, cols

    def take(self, rows) -> np.ndarray:
        """``Q[rows, new]``."""
        return self.cols[rows]

    def single(self, k: int) -> "_DenseColumns":
        return _DenseColumns(self.new[k:k + 1], self.cols[:, k:k + 1].copy(order="F"))


PENDING = -1  # the block of a member admitted lazily, before its column is formed


class _LazyColumns:
    """``Q[rows, new]`` of a block of candidates for ``rows`` the members of F when they were fetched and ``new``
    itself: all that admitting them and the descent after it read. Their full columns are formed only for those
    still in F when ``Q[:, F] α`` is next needed (:meth:`_ColumnStore.q_times`): a candidate that the descent drops
    again at once costs no kernel column. ``full``: columns ``Q[:, new[k]]`` already at hand (a stored dead one)."""

    def __init__(self, new: np.ndarray, sub: np.ndarray, position: np.ndarray, full: dict[int, np.ndarray]) -> None:
        self.new, self.sub, self._position, self.full = new, sub, position, full

    def take(self, rows) -> np.ndarray:
        """``Q[rows, new]`` (``rows`` among the members at the fetch and ``new``)."""
        positions = self._position[np.asarray(rows, dtype=np.int64)]
        if len(positions) and positions.min() < 0:
            raise RuntimeError("a row outside the members at the fetch and the candidates was asked of lazy columns")
        return self.sub[positions]

    def single(self, k: int) -> "_LazyColumns":
        j = int(self.new[k])
        return _LazyColumns(self.new[k:k + 1], self.sub[:, k:k + 1], self._position,
                            {j: self.full[j]} if j in self.full else {})


class _ColumnStore:
    """The columns ``Q[:, F]`` of the free set for a ``Q`` given by columns: kept in the blocks they were computed
    in (no copies as F grows); a removed member's column stays in its block with weight zero until the dead columns
    outnumber 1/32 of the members (64 at least) and take over 64 MiB, then the blocks with the largest share of dead
    columns are compacted until half that many remain; a sample fetched again meanwhile (one that left F and
    re-enters it) is copied from its dead column instead of asked of ``q_columns``. Memory ``8·n`` bytes per stored
    column: the members' and at most ``max(64, members / 32, 2**23 / n)`` dead ones."""

    def __init__(self, q_columns: Callable[[np.ndarray], np.ndarray], n: int,
                 q_block: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
        self.q_columns = q_columns
        self.q_block = q_block  # idx -> Q[idx, idx]: with it, candidates are fetched lazily (_LazyColumns)
        self.n = n
        self._blocks: list[np.ndarray] = []  # (n, b) arrays of columns of Q
        self._samples: list[np.ndarray] = []  # the sample of each column of each block
        self._where: list[tuple[int, int]] = []  # (block, column) of member k; (PENDING, sample): no column yet
        self.reused = 0  # columns served from dead ones instead of asked of q_columns
        self.skipped = 0  # candidates admitted lazily that left F before their column was formed

    def fetch(self, new: np.ndarray, members: list[int] | None = None):
        """The columns of candidates ``new``: full (:class:`_DenseColumns`), or with ``q_block`` and the members of F
        (``members``) given, :class:`_LazyColumns`."""
        if self.q_block is None or members is None:
            return _DenseColumns(*self._fetched(new))
        self._complete()
        new = np.asarray(new, dtype=np.int64)
        members = np.asarray(members, dtype=np.int64)
        n, b = len(members), len(new)
        sub = base_page_empty((n + b, b))
        for block, rows_of_block, positions in self._member_columns():
            sub[positions] = block[new][:, rows_of_block].T  # Q[member, new] = Q[new, member]
        sub[n:] = self.q_block(new)
        position = np.full(self.n, -1, dtype=np.int64)
        position[members], position[new] = np.arange(n), n + np.arange(b)
        return _LazyColumns(new, sub, position, self._stored_dead(new, count=False))

    def _member_columns(self):
        """``(block, columns, member positions)`` of each block holding live members' columns."""
        by_block: dict[int, tuple[list[int], list[int]]] = {}
        for k, (b, c) in enumerate(self._where):
            columns, positions = by_block.setdefault(b, ([], []))
            columns.append(c)
            positions.append(k)
        return [(self._blocks[b], columns, positions) for b, (columns, positions) in by_block.items()]

    def _complete(self) -> None:
        """Form the full columns of the members admitted lazily (one call of ``q_columns``)."""
        pending = [k for k, (b, _) in enumerate(self._where) if b == PENDING]
        if not pending:
            return
        samples = np.array([self._where[k][1] for k in pending], dtype=np.int64)
        block = self._append_block(*self._fetched(samples))
        at = {int(j): c for c, j in enumerate(self._samples[block])}
        for k in pending:
            self._where[k] = (block, at[self._where[k][1]])
        self._merge_if_narrow()

    def _fetched(self, new: np.ndarray):
        """``(order, Q[:, order])`` for ``order`` the samples ``new``, those that left F but whose columns are still
        stored (dead) first, copied, then the others, asked of ``q_columns`` in their order: a sample that re-enters F
        costs no new kernel column."""
        new = np.asarray(new, dtype=np.int64)
        copies = self._stored_dead(new)
        if not copies:
            return new, self.q_columns(new)
        found = np.array([j for j in new.tolist() if j in copies], dtype=np.int64)
        rest = np.array([j for j in new.tolist() if j not in copies], dtype=np.int64)
        parts = [copies[j] for j in found.tolist()] + ([self.q_columns(rest)] if len(rest) else [])
        return np.concatenate([found, rest]), self._joined(parts)

    def _stored_dead(self, new: np.ndarray, count: bool = True) -> dict[int, np.ndarray]:
        """``sample -> Q[:, sample]`` copied from the stored dead columns of those of ``new`` that have one; ``count``:
        add them to :attr:`reused` now (a lazy fetch counts them when they are admitted)."""
        dead = self._dead_columns()
        copies = {j: self._columns_of(self._blocks[dead[j][0]], [dead[j][1]]) for j in new.tolist() if j in dead}
        if count:
            self.reused += len(copies)
        return copies

    def _append_block(self, samples: np.ndarray, cols) -> int:
        """Store the columns ``cols`` of ``samples`` as a new block; its index."""
        self._blocks.append(cols)
        self._samples.append(np.asarray(samples, dtype=np.int64).copy())
        return len(self._blocks) - 1

    def _merge_if_narrow(self) -> None:
        if sum(block.shape[1] < NARROW_BLOCK for block in self._blocks) >= NARROW_BLOCKS:
            self._merge_narrow()

    def _dead_columns(self) -> dict[int, tuple[int, int]]:
        """``sample -> (block, column)`` of the stored columns of samples outside F."""
        live = {w for w in self._where if w[0] != PENDING}
        if len(live) == sum(len(s) for s in self._samples):
            return {}
        return {int(j): (b, c) for b, samples in enumerate(self._samples) for c, j in enumerate(samples.tolist())
                if (b, c) not in live}

    def admit(self, columns) -> None:
        if isinstance(columns, _LazyColumns):  # entries in the order of columns.new, as the members'
            new = columns.new.tolist()
            at_hand = [j for j in new if j in columns.full]
            self.reused += len(at_hand)
            column = {j: c for c, j in enumerate(at_hand)}
            block = self._append_block(np.asarray(at_hand), self._joined([columns.full[j] for j in at_hand])) \
                if at_hand else PENDING
            self._where += [(block, column[j]) if j in column else (PENDING, j) for j in new]
            self._merge_if_narrow()  # blocks of a few reused dead columns, as re-entering samples make them
            return
        block = self._append_block(columns.new, columns.cols)
        self._where += [(block, c) for c in range(len(columns.new))]
        self._merge_if_narrow()

    def _merge_narrow(self) -> None:
        """The live columns of the blocks narrower than :data:`NARROW_BLOCK` in one block (a product per block in
        :meth:`q_times`: single columns admitted one by one, e.g. on near-duplicate samples, would make it a loop)."""
        live = self._live_columns()
        narrow = [b for b, block in enumerate(self._blocks) if block.shape[1] < NARROW_BLOCK]
        renumber, blocks, samples, parts, merged_samples, width = {}, [], [], [], [], 0
        for b, block in enumerate(self._blocks):
            if block.shape[1] >= NARROW_BLOCK:
                renumber.update({(b, c): (len(blocks), c) for c in live.get(b, [])})
                blocks.append(block)
                samples.append(self._samples[b])
        merged = len(blocks)
        for b in narrow:
            columns = live.get(b, [])
            renumber.update({(b, c): (merged, width + k) for k, c in enumerate(columns)})
            width += len(columns)
            if columns:
                parts.append(self._columns_of(self._blocks[b], columns))
                merged_samples.append(self._samples[b][columns])
        if parts:
            blocks.append(self._joined(parts))
            samples.append(np.concatenate(merged_samples))
        self._blocks, self._samples = blocks, samples
        self._renumber(renumber)

    @staticmethod
    def _joined(parts: list[np.ndarray]) -> np.ndarray:
        rows = base_page_empty((sum(part.shape[1] for part in parts), parts[0].shape[0]))
        at = 0
        for part in parts:
            rows[at:at + part.shape[1]] = part.T
            at += part.shape[1]
        return rows.T

    def q_times(self, index: list[int], alpha: np.ndarray) -> np.ndarray:
        """``Q[:, F] @ alpha`` (numpy's gemv: torch's on these Fortran-ordered blocks measured 2–4× less accurate,
        which the KKT residual of the solution shows)."""
        self._complete()
        weights = [np.zeros(block.shape[1]) for block in self._blocks]
        for (b, c), a in zip(self._where, alpha):
            weights[b][c] = a
        return self._times(weights)

    def _times(self, weights: list[np.ndarray]) -> np.ndarray:
        out = np.zeros(self.n)
        for block, w in zip(self._blocks, weights):
            out += block @ w
        return out

    @staticmethod
    def _columns_of(block: np.ndarray, columns: list[int]) -> np.ndarray:
        # rows of the transpose into C-ordered rows whose transpose is the Fortran-ordered block: on the Fortran-
        # ordered views of torch's memory that q_columns may give, 10× faster than block[:, columns]
        rows = base_page_empty((len(columns), block.shape[0]))
        np.take(block.T, np.asarray(columns, dtype=np.int64), axis=0, out=rows)
        return rows.T

    def keep(self, kept: np.ndarray, members: int) -> None:
        """Members at positions ``kept`` stay; the others left F."""
        kept_set = set(np.asarray(kept).tolist())
        self.skipped += sum(1 for k, (b, _) in enumerate(self._where) if b == PENDING and k not in kept_set)
        self._where = [self._where[k] for k in kept]
        stored = sum(block.shape[1] for block in self._blocks)
        dead_allowed = max(DEAD_COLUMNS_MIN, DEAD_BYTES_MIN // (8 * max(self.n, 1)), members // DEAD_COLUMNS_SHARE)
        if stored > members + dead_allowed:
            self._compact(dead_allowed // 2)

    def _without_dead(self, b: int, columns: list[int]) -> np.ndarray:
        """Block ``b`` with only its ``columns`` (ascending), taken out of the store: shrunk in place when it is the
        transpose of a C-ordered array that owns its memory and nothing else refers to (the live columns moved to the
        front, the rest given back by ``realloc``: no second copy in memory, no fresh pages), else copied."""
        block = self._blocks[b]
        rows = getattr(block, "base", None)
        if not (isinstance(rows, np.ndarray) and rows.flags.owndata and rows.flags.c_contiguous
                and rows.shape == block.shape[::-1]):
            return self._columns_of(block, columns)
        del block
        self._blocks[b] = None  # the store's own view
        if sys.getrefcount(rows) > 2:  # this name and the call's: another view is held (a candidate's columns)
            return self._columns_of(rows.T, columns)
        for k, c in enumerate(columns):
            if k != c:
                rows[k] = rows[c]  # c > k: rows move up, each read before it is overwritten
        rows.resize((len(columns), rows.shape[1]))
        return rows.T

    def _renumber(self, renumber: dict[tuple[int, int], tuple[int, int]]) -> None:
        """The members' ``(block, column)`` after the blocks were rebuilt (those admitted lazily have none yet)."""
        self._where = [w if w[0] == PENDING else renumber[w] for w in self._where]

    def _live_columns(self) -> dict[int, list[int]]:
        """The members' columns in each block that holds any, ascending."""
        live: dict[int, list[int]] = {}
        for b, c in self._where:
            if b != PENDING:
                live.setdefault(b, []).append(c)
        return {b: sorted(columns) for b, columns in live.items()}

    def _compact(self, keep_dead: int = 0) -> None:
        """Drop dead columns, from the blocks where they are the largest share first, until at most ``keep_dead``
        remain: a block loses its dead columns in place where it can (:meth:`_without_dead`), else is copied without
        them, one block at a time (memory then peaks at one block more); a block without live columns is dropped, the
        others stay as they are (copying a block to free a few of its columns costs more than it frees)."""
        live = self._live_columns()
        dead = {b: block.shape[1] - len(live.get(b, [])) for b, block in enumerate(self._blocks)}
        excess = sum(dead.values()) - keep_dead
        compacted = set()
        for b in sorted(dead, key=lambda b: (-dead[b] / self._blocks[b].shape[1], b)):
            if excess <= 0 or not dead[b]:
                break
            compacted.add(b)
            excess -= dead[b]
        renumber, blocks, samples = {}, [], []
        for b in range(len(self._blocks)):
            if b not in live:
                self._blocks[b] = None
                continue
            width = self._blocks[b].shape[1]
            columns = live[b] if b in compacted else list(range(width))
            kept = self._blocks[b] if len(columns) == width else self._without_dead(b, columns)
            self._blocks[b] = None  # free the old block before the next copy
            renumber.update({(b, c): (len(blocks), k) for k, c in enumerate(columns)})
            blocks.append(kept)
            samples.append(self._samples[b][columns])
        self._blocks, self._samples = blocks, samples
        self._renumber(renumber)


class _PairColumns:
    """``Q[:, new]`` of multi-class pairs, formed on request from the sample kernel rows of a :class:`_PairStore`."""

    def __init__(self, store: "_PairStore", new: np.ndarray) -> None:
        self.store, self.new = store, new

    def take(self, rows) -> np.ndarray:
        """``Q[rows, new] = K(x_i, x_j) c_pq / scale`` for pairs ``p = (i, k)`` in ``rows``, ``q = (j, l)`` in ``new``."""
        st = self.store
        rows = np.asarray(rows, dtype=np.int64)
        kernel = st.sample_rows[np.ix_(st.slot[st.pair_sample[self.new]], st.pair_sample[rows])].T
        return kernel * (st.directions[rows] @ st.directions[self.new].T) / st.scale

    def single(self, k: int) -> "_PairColumns":
        return _PairColumns(self.store, self.new[k:k + 1])


class _PairStore:
    """``Q`` of the multi-class pair problem (DESIGN.md §2b) from sample kernel columns: ``K(x_j, ·)`` is computed
    once for each sample ``j`` with a pair that is ever a candidate and kept as a row of an ``(s, m)`` buffer;
    ``Q[:, F] α`` comes from ``f = K[:, S] β`` (``β_jk`` the class coefficients of the free pairs), an ``m×s×K``
    product, and blocks of ``Q_FF`` from ``K_SS`` times ``c_pq = <d_p, d_q>``, ``d_p = e_{y_i} − e_k``.
    Memory ``8·m·s`` bytes (against ``8·m(K − 1)`` per free pair for :class:`_ColumnStore`)."""

    def __init__(self, sample_columns, labels: np.ndarray, num_classes: int, scale: float) -> None:
        m = labels.shape[0]
        self.sample_columns, self.labels, self.scale = sample_columns, labels, scale
        classes = np.broadcast_to(np.arange(num_classes), (m, num_classes))
        self.pair_sample = np.repeat(np.arange(m), num_classes - 1)
        self.pair_class = classes[classes != labels[:, None]]
        self.directions = np.zeros((len(self.pair_sample), num_classes))  # d_p as rows
        pairs = np.arange(len(self.pair_sample))
        self.directions[pairs, labels[self.pair_sample]] = 1.0
        self.directions[pairs, self.pair_class] = -1.0
        self.slot = np.full(m, -1, dtype=np.int64)
        self.count = 0
        self._rows = np.empty((0, m))

    @property
    def sample_rows(self) -> np.ndarray:
        """``K(x_j, ·)`` of the stored samples, one row per slot."""
        return self._rows[: self.count]

    def fetch(self, new: np.ndarray) -> _PairColumns:
        samples = self.pair_sample[new]
        missing = np.unique(samples[self.slot[samples] < 0])
        if len(missing):
            need = self.count + len(missing)
            if need > self._rows.shape[0]:  # pages of np.empty are only touched when written
                grown = base_page_empty((max(need, 2 * self._rows.shape[0], 64), self._rows.shape[1]))
                grown[: self.count] = self._rows[: self.count]
                self._rows = grown
            self._rows[self.count:need] = _finite_columns(self.sample_columns(missing)).T
            self.slot[missing] = np.arange(self.count, need)
            self.count = need
        return _PairColumns(self, new)

    def admit(self, columns: _PairColumns) -> None:
        pass

    def class_coefficients(self, index, alpha: np.ndarray) -> np.ndarray:
        """``β`` per stored sample slot, ``(s, K)``: ``β_jk = Σ_{p=(j,·)} α_p (d_p)_k``."""
        index = np.asarray(index, dtype=np.int64)
        beta = np.zeros((self.count, self.directions.shape[1]))
        np.add.at(beta, self.slot[self.pair_sample[index]], alpha[:, None] * self.directions[index])
        return beta

    def q_times(self, index, alpha: np.ndarray) -> np.ndarray:
        """``Q[:, F] α`` over all pairs: ``(f_{y_i}(x_i) − f_k(x_i)) / scale``."""
        beta = torch.from_numpy(self.class_coefficients(index, alpha))
        f = (torch.from_numpy(self.sample_rows).T @ beta).numpy()  # torch's own thread pool for the large product
        return (f[self.pair_sample, self.labels[self.pair_sample]] - f[self.pair_sample, self.pair_class]) / self.scale

    def keep(self, kept: np.ndarray, members: int) -> None:
        pass


class _FreeSet:
    """Free set F of the active-set method: the Cholesky factor of ``Q_FF`` and a store that gives ``Q[rows, new]``
    for candidates and ``Q[:, F] α`` (:class:`_ColumnStore`, or :class:`_PairStore` for the multi-class pairs)."""

    def __init__(self, store) -> None:
        self.store = store
        self.index: list[int] = []
        self._chol = np.zeros((0, 0), order="F")
        self._memory: np.ndarray | None = None  # the factor is a view of its first n² entries; it never shrinks

    def __len__(self) -> int:
        return len(self.index)

    @property
    def chol(self) -> np.ndarray:
        """Lower Cholesky factor of ``Q_FF``, exactly ``n×n`` and Fortran-ordered so that LAPACK reads it in place."""
        return self._chol

    def fetch(self, new: np.ndarray):
        if getattr(self.store, "q_block", None) is not None:
            return self.store.fetch(new, self.index)
        return self.store.fetch(new)

    def q_times(self, alpha: np.ndarray) -> np.ndarray:
        """``Q[:, F] @ alpha``."""
        return self.store.q_times(self.index, alpha)

    def solve(self, rhs: np.ndarray) -> np.ndarray:
        """``Q_FF⁻¹ rhs``."""
        if not len(self):
            return rhs
        return scipy.linalg.cho_solve((self.chol, True), rhs, check_finite=False)

    def solve_ones(self) -> np.ndarray:
        return self.solve(np.ones(len(self)))

    def lower_solve(self, rhs: np.ndarray) -> np.ndarray:
        """``L⁻¹ rhs``."""
        return scipy.linalg.solve_triangular(self.chol, rhs, lower=True, check_finite=False)

    def lower_t_solve(self, rhs: np.ndarray) -> np.ndarray:
        """``L⁻ᵀ rhs``."""
        return scipy.linalg.solve_triangular(self.chol, rhs, lower=True, trans="T", check_finite=False)

    def try_add(self, columns) -> bool:
        """Append the candidates of ``columns`` (from :meth:`fetch`) unless that makes ``Q_FF`` (numerically)
        singular."""
        new = columns.new
        q_fb, q_bb = columns.take(np.asarray(self.index, dtype=np.int64)), columns.take(new)
        w = self.lower_solve(q_fb) if len(self) else q_fb
        schur = q_bb - w.T @ w
        try:
            l22 = np.linalg.cholesky(schur)
        except np.linalg.LinAlgError:
            return False
        if np.min(np.diag(l22)) ** 2 <= 1e-10 * np.max(np.diag(q_bb)):
            return False
        n, b = len(self), len(new)
        chol = self._grown(n + b)
        chol[:n, n:], chol[n:, :n], chol[n:, n:] = 0.0, w.T, l22
        self._chol = chol
        self.store.admit(columns)
        self.index += new.tolist()
        return True

    def _grown(self, size: int) -> np.ndarray:
        """The factor as the leading ``n×n`` block of a ``size×size`` Fortran array (the rest to be filled): in the
        memory of the old factor while it holds ``size²`` entries, e.g. after a downdate (columns moved last to first:
        each lands at or after where it was), else in that memory enlarged in place (``realloc``: the old factor is not
        held twice), else in new memory."""
        n = len(self)
        if (self._memory is None or self._memory.size < size * size) and not self._enlarged(size * size):
            old = self._memory[:n * n].reshape((n, n), order="F") if n else None
            self._memory = base_page_empty(size * size)
            chol = self._memory.reshape((size, size), order="F")
            if n:
                chol[:n, :n] = old
            return chol
        flat = self._memory
        for hi in range(n, 0, -GROW_COLUMNS):
            lo = max(0, hi - GROW_COLUMNS)
            source = flat[lo * n:hi * n].reshape((n, hi - lo), order="F")
            flat[lo * size:hi * size].reshape((size, hi - lo), order="F")[:n] = source  # numpy buffers overlaps
        return flat[:size * size].reshape((size, size), order="F")

    def _enlarged(self, entries: int) -> bool:
        """Whether the factor's memory could be resized in place to ``entries`` (no other view of it held)."""
        if self._memory is None:
            return False
        self._chol = None  # the factor is a view of the memory: numpy resizes only memory that nothing views
        try:
            self._memory.resize(entries)
        except ValueError:
            return False
        return True

    def remove(self, positions: np.ndarray) -> None:
        """Delete members. The kept rows after the first deleted one, ``M = [L_KK | L_KD]``, span the new trailing
        block ``M Mᵀ``: a triangular-pentagonal QR (LAPACK ``tpqrt``) of ``[L_KKᵀ; L_KDᵀ]`` gives its factor in
        ``O(k·r²)`` for ``k`` deleted and ``r`` trailing members, a panel of :data:`REMOVE_COLUMNS` rows of it at a
        time (``tpmqrt`` applies a panel's reflectors to the rows after it). The new factor is written over the old
        one's memory (its first ``(n − k)²`` entries, column by column): besides it only ``L_KD`` and one panel are
        copied (``O(r·(k + 256))`` memory, not the ``r×r`` trailing block)."""
        positions = np.unique(np.asarray(positions, dtype=np.int64))
        if not len(positions):
            return
        n, p = len(self), int(positions[0])
        keep = np.setdiff1d(np.arange(n), positions)
        after = keep[keep > p]
        r, chol, size = len(after), self._chol, len(keep)
        # the deleted columns' entries of the kept rows, before the old factor is overwritten
        pentagon = _submatrix(chol, after, positions).T if r else None  # F-contiguous (k, r)
        flat = chol.reshape(-1, order="F")  # a view: chol is Fortran-contiguous
        for lo in range(0, p, REMOVE_COLUMNS):
            # column j moves from offset j·n to j·size <= j·n: a strip is read whole before it is written, and
            # what it overwrites was read with the strips before it
            hi = min(p, lo + REMOVE_COLUMNS)
            strip = chol[keep, lo:hi]
            flat[lo * size:hi * size] = strip.ravel(order="F")
        factor = flat[:size * size].reshape((size, size), order="F")
        for lo in range(0, r, REMOVE_COLUMNS):
            # rows lo:hi of [L_KKᵀ; L_KDᵀ]'s QR from old columns after[lo:hi], which the new columns p + [0, hi)
            # written so far end before (p + hi)·size <= after[hi]·n: the columns still to be read are intact
            hi = min(r, lo + REMOVE_COLUMNS)
            panel = _submatrix(chol, after[lo:], after[lo:hi]).T  # F-ordered (hi − lo, r − lo), upper-trapezoidal
            width = hi - lo
            head, reflectors, t, info = scipy.linalg.lapack.dtpqrt(0, min(32, width), panel[:, :width],
                                                                     pentagon[:, lo:hi], overwrite_a=1, overwrite_b=1)
            if info != 0:
                raise RuntimeError(f"LAPACK dtpqrt failed with info={info}")
            panel[:, :width] = head
            if hi < r:
                tail, rest, info = scipy.linalg.lapack.dtpmqrt(0, reflectors, t, panel[:, width:], pentagon[:, hi:],
                                                                 side="L", trans="T", overwrite_a=1, overwrite_b=1)
                if info != 0:
                    raise RuntimeError(f"LAPACK dtpmqrt failed with info={info}")
                panel[:, width:], pentagon[:, hi:] = tail, rest
            panel *= np.sign(np.diag(panel[:, :width]))[:, None]
            columns = factor[:, p + lo:p + hi]
            columns[:p + lo] = 0.0
            columns[p + lo:] = panel.T  # the strictly lower part of the panel's head is 0
        self._chol = factor
        self.index = [self.index[k] for k in keep]
        self.store.keep(keep, len(self.index))


def _submatrix(a: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``a[np.ix_(rows, cols)]`` (C order) for increasing ``cols``, a run of consecutive columns at a time (several
    times faster than ``np.ix_`` on a Fortran-ordered factor)."""
    out = np.empty((len(rows), len(cols)))
    starts = np.flatnonzero(np.diff(cols, prepend=-2) != 1)
    for lo, hi in zip(starts, [*starts[1:], len(cols)]):
        out[:, lo:hi] = a[rows, cols[lo]:cols[lo] + hi - lo]
    return out


class _DeviceColumns(_DenseColumns):
    """:class:`_DenseColumns` as an ``(n, b)`` float64 tensor on the solver's device."""

    def take(self, rows) -> torch.Tensor:
        return self.cols[torch.as_tensor(np.asarray(rows, dtype=np.int64), device=self.cols.device)]

    def single(self, k: int) -> "_DeviceColumns":
        return _DeviceColumns(self.new[k:k + 1], self.cols[:, k:k + 1].clone())


class _DeviceColumnStore(_ColumnStore):
    """:class:`_ColumnStore` with its blocks as tensors on ``device`` (``q_columns`` gives ``(n, b)`` tensors there);
    ``Q[:, F] α`` comes back as a numpy vector."""

    def __init__(self, q_columns: Callable[[np.ndarray], torch.Tensor], n: int, device: torch.device) -> None:
        super().__init__(q_columns, n)
        self.device = device

    def fetch(self, new: np.ndarray) -> _DeviceColumns:
        return _DeviceColumns(*self._fetched(new))

    def _times(self, weights: list[np.ndarray]) -> np.ndarray:
        out = torch.zeros(self.n, dtype=torch.float64, device=self.device)
        for block, w in zip(self._blocks, weights):
            out.addmv_(block, torch.from_numpy(w).to(self.device))
        return out.cpu().numpy()

    def _columns_of(self, block: torch.Tensor, columns: list[int]) -> torch.Tensor:
        return block[:, torch.as_tensor(columns, device=self.device)]

    @staticmethod
    def _joined(parts: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(parts, dim=1)


class _DeviceFreeSet(_FreeSet):
    """:class:`_FreeSet` with the Cholesky factor of ``Q_FF`` a float64 tensor on the store's device: admission by
    a block Cholesky step, deletion by a QR of the kept trailing rows (what LAPACK ``tpqrt`` does on the CPU path).
    Vectors in and out are numpy arrays (``n`` or ``m`` entries a step: small next to the columns)."""

    def __init__(self, store: _DeviceColumnStore) -> None:
        super().__init__(store)
        self.device = store.device
        self._chol = torch.zeros(0, 0, dtype=torch.float64, device=self.device)

    def _on_device(self, values) -> torch.Tensor:
        values = values if isinstance(values, torch.Tensor) else torch.from_numpy(np.asarray(values, dtype=np.float64))
        return values.to(self.device, torch.float64)

    def _apply(self, solve, rhs) -> np.ndarray:
        """``solve`` (of a matrix on the device) applied to a vector or matrix ``rhs``, as numpy."""
        b = self._on_device(rhs)
        out = solve(b[:, None] if b.ndim == 1 else b)
        return (out[:, 0] if b.ndim == 1 else out).cpu().numpy()

    def lower_solve(self, rhs) -> np.ndarray:
        return self._apply(lambda b: torch.linalg.solve_triangular(self._chol, b, upper=False), rhs)

    def lower_t_solve(self, rhs) -> np.ndarray:
        return self._apply(lambda b: torch.linalg.solve_triangular(self._chol.T, b, upper=True), rhs)

    def solve(self, rhs) -> np.ndarray:
        if not len(self):
            return rhs.cpu().numpy() if isinstance(rhs, torch.Tensor) else rhs
        return self._apply(lambda b: torch.cholesky_solve(b, self._chol), rhs)

    def try_add(self, columns: _DeviceColumns) -> bool:
        new, n = columns.new, len(self)
        q_fb, q_bb = columns.take(np.asarray(self.index, dtype=np.int64)), columns.take(new)
        w = torch.linalg.solve_triangular(self._chol, q_fb, upper=False) if n else q_fb
        l22, info = torch.linalg.cholesky_ex(q_bb - w.T @ w)
        if int(info) != 0 or float(torch.diagonal(l22).min()) ** 2 <= 1e-10 * float(torch.diagonal(q_bb).max()):
            return False
        b = len(new)
        chol = torch.zeros(n + b, n + b, dtype=torch.float64, device=self.device)
        chol[:n, :n], chol[n:, :n], chol[n:, n:] = self._chol, w.T, l22
        self._chol = chol
        self.store.admit(columns)
        self.index += new.tolist()
        return True

    def remove(self, positions: np.ndarray) -> None:
        """Delete members: with ``p`` the first deleted position, the kept rows after it, ``M = L[after, p:]``,
        give the new trailing block ``M Mᵀ = Rᵀ R`` from a QR of ``Mᵀ``."""
        positions = np.unique(np.asarray(positions, dtype=np.int64))
        if not len(positions):
            return
        n, p = len(self), int(positions[0])
        keep = np.setdiff1d(np.arange(n), positions)
        kept = torch.as_tensor(keep, device=self.device)
        after = kept[kept > p]
        chol = self._chol
        factor = chol[kept][:, kept]
        if len(after):
            r = torch.linalg.qr(chol[after, p:].T, mode="r").R
            factor[p:, p:] = (r * torch.sign(torch.diagonal(r))[:, None]).T
        self._chol = factor
        self.index = [self.index[k] for k in keep]
        self.store.keep(keep, len(self.index))


def _active_set(kernel_columns, y, scale, tol, max_iter, initial, device=None, initial_block=None) -> MaxMarginResult:
    m = y.shape[0]
    if device is not None:
        store = _DeviceColumnStore(_device_q_columns(kernel_columns, y, scale, device), m, device)
        with single_threaded_blas():
            return _active_set_loop(store, y, scale, tol, max_iter, initial, _DeviceFreeSet, initial_block)
    signed_columns = getattr(kernel_columns, "signed_columns", None)

    def q_columns(idx):
        if signed_columns is not None:
            # a Gram matrix of finite features with a finite diagonal: |Q_ij| <= sqrt(Q_ii Q_jj), finite
            return signed_columns(idx, y, scale)
        cols = np.multiply(_finite_columns(kernel_columns(idx)), y[:, None], order="F")  # the caller's array stays
        cols *= (y[idx] / scale)[None, :]
        return cols

    signed_block = getattr(kernel_columns, "signed_block", None)
    if getattr(kernel_columns, "dtype", torch.float64) != torch.float64:
        # a block rounded apart from the columns (float32: by 1e-7) would pass a duplicate sample for an independent one
        signed_block = None
    q_block = None if signed_block is None else (lambda idx: signed_block(idx, y, scale))
    with single_threaded_blas():
        return _active_set_loop(_ColumnStore(q_columns, m, q_block), y, scale, tol, max_iter, initial, None,
                                initial_block)


def _device_q_columns(kernel_columns, y: np.ndarray, scale: float, device: torch.device):
    """``idx -> Q[:, idx]`` as an ``(m, b)`` float64 tensor on ``device``."""
    labels = torch.from_numpy(y).to(device)
    if isinstance(kernel_columns, torch.Tensor):  # a dense kernel: its rows are its columns
        def columns(idx):
            rows = torch.as_tensor(np.asarray(idx), dtype=torch.long, device=kernel_columns.device)
            return kernel_columns[rows].to(device, torch.float64).T
    elif hasattr(kernel_columns, "signed_rows"):
        return lambda idx: kernel_columns.signed_rows(idx, y, scale).to(device, torch.float64).T
    elif hasattr(kernel_columns, "signed_columns"):
        return lambda idx: torch.from_numpy(kernel_columns.signed_columns(idx, y, scale)).to(device)
    else:
        def columns(idx):
            cols = kernel_columns(idx)
            cols = cols if isinstance(cols, torch.Tensor) else torch.from_numpy(_finite_columns(cols))
            return cols.to(device, torch.float64)

    def q_columns(idx):
        cols = columns(idx)
        if not bool(torch.isfinite(cols).all()):
            _finite_columns(cols.cpu().numpy())  # raises, naming the sample
        column_labels = labels[torch.as_tensor(np.asarray(idx), dtype=torch.long, device=device)]
        return cols * labels[:, None] * (column_labels / scale)[None, :]

    return q_columns


def _finite_columns(cols) -> np.ndarray:
    cols = np.asarray(cols, dtype=np.float64)
    if not np.all(np.isfinite(cols)):
        bad = np.flatnonzero(~np.all(np.isfinite(cols), axis=1))
        raise ValueError(f"kernel columns hold NaN or inf in row {bad[0]} ({len(bad)} rows in all): sample "
                         f"{bad[0]} has non-finite values (check the inputs and the network)")
    return cols


_PROGRESS: contextvars.ContextVar[Callable[[int, int, float], None] | None] = contextvars.ContextVar(
    "max_margin_progress", default=None)


@contextlib.contextmanager
def solver_progress(report: Callable[[int, int, float], None]) -> Iterator[None]:
    """Call ``report(iteration, free_set_size, largest_violation)`` after every active-set iteration run inside
    the ``with`` block (for progress bars; the solver's result does not depend on it)."""
    token = _PROGRESS.set(report)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


def _active_set_loop(store, y, scale, tol, max_iter, initial, free_set=None, initial_block=None) -> MaxMarginResult:
    m = y.shape[0]
    report = _PROGRESS.get()
    free = (free_set or _FreeSet)(store)
    alpha = np.zeros(0)
    gradient = -np.ones(m)
    batch = max(1, int(math.sqrt(m)))
    initial_block = batch if initial_block is None else initial_block
    pending = None if initial is None else _distinct_in_order(sample_indices(initial))
    if pending is not None and len(pending) and (pending.min() < 0 or pending.max() >= m):
        raise ValueError(f"`initial` must hold sample indices in [0, {m}), got values in "
                         f"[{pending.min()}, {pending.max()}]")
    max_iter = 10 * m if max_iter is None else max_iter
    refinements = 0
    for iteration in range(1, max_iter + 1):
        in_free = np.zeros(m, dtype=bool)
        in_free[free.index] = True
        candidates = pending[:0] if pending is not None else np.zeros(0, dtype=np.int64)
        if pending is not None:
            # `initial` first, in blocks of `initial_block`, most violated first: members that the blocks before
            # made redundant are never fetched
            pending = pending[~in_free[pending] & (-gradient[pending] > tol)]
            order = np.argsort(gradient[pending], kind="stable")
            candidates, pending = pending[order[:initial_block]], pending[order[initial_block:]]
            pending = pending if len(pending) else None
        if not len(candidates):
            violation = np.where(in_free, 0.0, -gradient)
            order = np.argpartition(-violation, min(batch, m - 1))[:batch]
            order = order[np.argsort(-violation[order])]
            candidates = order[violation[order] > tol]
        if len(candidates) == 0:
            # optimal up to the factor's rounding: refine α on the free set against the exact columns
            residual = np.max(np.abs(gradient[free.index]), initial=0.0)
            if residual <= tol or refinements >= 3:
                break
            refinements += 1
            alpha = _refine(free, alpha, gradient)
            gradient = free.q_times(alpha) - 1.0
            continue
        size_before = len(free)
        dependent = _add(free, candidates)
        if dependent is not None:
            alpha = _singular_step(free, dependent, alpha)
        alpha = np.concatenate([alpha, np.zeros(len(free) - len(alpha))])
        alpha = _descend(free, alpha)
        if len(free) <= size_before:
            batch = max(1, batch // 2)
        gradient = free.q_times(alpha) - 1.0
        if report is not None:
            report(iteration, len(free), float(np.max(-gradient, initial=0.0)))
    else:
        warnings.warn(
            f"active-set solver stopped after max_iter={max_iter} iterations with "
            f"{len(free)} free samples; raise max_iter",
            stacklevel=3,
        )
    alpha_full = np.zeros(m)
    alpha_full[free.index] = alpha
    # a member on the margin whose optimal α is 0 can keep an α of rounding size: it is no support vector
    alpha_full[alpha_full <= ROUNDING_ALPHA * alpha_full.max(initial=0.0)] = 0.0
    margins = gradient + 1.0
    kkt = max(float(np.max(np.clip(-gradient, 0, None))), float(np.max(np.abs(gradient[free.index]), initial=0)))
    if kkt > max(tol, 1e-10):
        warnings.warn(
            f"the active-set solution reached a KKT residual of {kkt:.1e} (asked for {tol:.0e}): the kernel on "
            f"the {len(free)} support vectors is nearly singular (near-duplicate samples?). Deduplicate the "
            "data or pass a larger `tol`.",
            stacklevel=3,
        )
    return _result(alpha_full, y, margins, scale, 0.0, kkt, 0, math.inf, iteration, "active-set")


def _distinct_in_order(indices: np.ndarray) -> np.ndarray:
    """``indices`` without repeats, in the order of their first occurrence: a block of ``initial`` whose members all
    violate the margin equally (at the start) is fetched in the caller's order, e.g. that of an input-Gram cache's
    rows, which then serves the block without a copy."""
    _, first = np.unique(indices, return_index=True)
    return indices[np.sort(first)]


# the column store compacts when its dead columns outnumber max(64, members / 32) and take over 64 MiB: a
# compaction shrinks (or copies) the blocks with the largest share of dead ones until half the allowance remains,
# so small stores are left alone
DEAD_COLUMNS_MIN, DEAD_COLUMNS_SHARE, DEAD_BYTES_MIN = 64, 32, 64 << 20
ROUNDING_ALPHA = 1e-12  # α below this fraction of the largest α is rounding, not a support vector
DROP_BATCH = 64  # members dropped in a descent before the factor is downdated
REMOVE_COLUMNS = GROW_COLUMNS = 256  # columns of the factor moved at a time in a downdate or an update
NARROW_BLOCK, NARROW_BLOCKS = 16, 32  # this many stored blocks narrower than NARROW_BLOCK columns are merged


def _descend(free: _FreeSet, alpha: np.ndarray) -> np.ndarray:
    """Move from feasible ``alpha`` towards ``Q_FF⁻¹ 1``, dropping members whose coefficient reaches zero.

    Dropped members D stay in the factor ``L`` for up to :data:`DROP_BATCH` steps and are held at zero by the
    equality constraints ``x_D = 0``: ``x = L⁻ᵀ(u + Z μ)``, ``u = L⁻¹ 1``, ``Z = L⁻¹ E_D``, ``(ZᵀZ) μ = −Zᵀu``
    (two triangular solves a step); then one downdate removes them all (:meth:`_FreeSet.remove`)."""
    while True:
        alpha, dropped, done = _descend_steps(free, alpha)
        free.remove(dropped)
        alpha = np.clip(np.delete(alpha, dropped), 0.0, None)
        if done:
            return alpha


def _descend_steps(free: _FreeSet, alpha: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """Steps of :func:`_descend` on one factor: ``(alpha, dropped positions, reached the target)``."""
    n = len(alpha)
    if not n:
        return alpha, np.zeros(0, dtype=np.int64), True
    u = free.lower_solve(np.ones(n))
    dropped = np.zeros(n, dtype=bool)
    z = np.zeros((n, 0))
    while True:
        if z.shape[1]:
            try:
                gram = scipy.linalg.cho_factor(z.T @ z, lower=True, check_finite=False)
            except np.linalg.LinAlgError:  # Q_FF too ill-conditioned to hold members at zero: downdate now
                return alpha, np.flatnonzero(dropped), False
            mu = scipy.linalg.cho_solve(gram, -(z.T @ u), check_finite=False)
            target = free.lower_t_solve(u + z @ mu)
            target[dropped] = 0.0
        else:
            target = free.lower_t_solve(u)
        blocking = (target <= 0) & ~dropped
        if not blocking.any():
            return target, np.flatnonzero(dropped), True
        ratios = np.full(n, np.inf)
        step_room = alpha[blocking] - target[blocking]  # >= alpha >= 0 where blocking
        ratios[blocking] = np.where(step_room > 0, alpha[blocking] / np.where(step_room > 0, step_room, 1.0), 0.0)
        first = int(np.argmin(ratios))
        alpha = alpha + min(ratios[first], 1.0) * (target - alpha)
        alpha[first] = 0.0
        new = np.flatnonzero(blocking & (alpha <= 1e-14 * alpha.max(initial=1.0)))
        alpha[new] = 0.0
        alpha[~dropped] = np.clip(alpha[~dropped], 0.0, None)
        dropped[new] = True
        if dropped.sum() >= min(DROP_BATCH, n):
            return alpha, np.flatnonzero(dropped), False
        unit = np.zeros((n, len(new)))
        unit[new, np.arange(len(new))] = 1.0
        z = np.hstack([z, free.lower_solve(unit)])


def _refine(free: _FreeSet, alpha: np.ndarray, gradient: np.ndarray) -> np.ndarray:
    """One step of iterative refinement ``α_F ← α_F − Q_FF⁻¹ (Q_FF α_F − 1)``, residual from the exact columns;
    coefficients that would turn negative are left to the next active-set step."""
    refined = alpha - free.solve(gradient[free.index])
    return refined if np.all(refined > 0) else np.where(refined > 0, refined, alpha)


def _add(free: _FreeSet, candidates: np.ndarray):
    """Add the candidates as a block, else one by one; None when one was added, else the first one's columns (it is
    dependent on F: the caller's singular step takes them)."""
    columns = free.fetch(candidates)
    if free.try_add(columns):
        return None
    added = False
    for k in range(len(candidates)):
        added |= free.try_add(columns.single(k))
    return None if added else columns.single(0)


def sample_indices(initial) -> np.ndarray:
    """Sample indices given as a list, an array or a tensor (any device), as int64; refuses values that are not whole
    numbers (no silent truncation)."""
    values = np.asarray(initial.cpu() if hasattr(initial, "cpu") else initial).reshape(-1)
    if values.dtype == bool or not (np.issubdtype(values.dtype, np.integer) or np.all(np.mod(values, 1) == 0)):
        raise ValueError(f"`initial` must hold integer sample indices, got {values[:5].tolist()} "
                         f"(dtype {values.dtype})")
    return values.astype(np.int64)


def _singular_step(free: _FreeSet, columns, alpha: np.ndarray) -> np.ndarray:
    """``y_j phi_j`` (``columns``: those of the one candidate j, from :func:`_add`) lies in the span of the free set:
    move along the null direction of ``Q`` until a free coefficient reaches zero, drop it, then admit ``j``."""
    j = int(columns.new[0])
    coef = free.solve(columns.take(np.asarray(free.index))[:, 0])
    if not np.any(coef > 0):
        raise NotSeparableError(
            f"sample {j} is a non-positive combination of support vectors with opposite margin: the data "
            "are not separable through the origin in path space (is the training error really zero?)"
        )
    ratios = np.where(coef > 0, alpha / np.where(coef > 0, coef, 1.0), np.inf)
    position = int(np.argmin(ratios))
    step = ratios[position]
    alpha = alpha - step * coef
    free.remove(np.array([position]))
    alpha = np.delete(alpha, position)
    if not free.try_add(columns):
        raise NotSeparableError(
            f"could not admit sample {j} to the free set after a degenerate step: its signed path features stay in "
            "the span of the support vectors', so the data are likely not separable through the origin in path "
            "space (e.g. a sample and its negative with one label, or duplicates with opposite labels)"
        )
    return np.concatenate([np.clip(alpha, 0.0, None), [step]])
