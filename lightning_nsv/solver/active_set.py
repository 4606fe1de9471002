"""The active-set algorithm of the max-margin dual through the origin (DESIGN.md §2), on its own.

    min_α ½ αᵀQα − 1ᵀα   s.t. α >= 0,     Q_ij = y_i y_j K_ij / scale,

solved exactly by a primal active-set method in the manner of Lawson & Hanson's NNLS (*Solving Least Squares
Problems*, 1974, ch. 23; the dual is a non-negative least-squares problem in the features): a free set F holds the
samples with ``α > 0``; each iteration admits the most violated samples (``1 − y_i f(x_i) > tol``) as a block, moves
``α_F`` towards ``Q_FF⁻¹ 1`` and drops members whose coefficient reaches zero on the way. ``Q_FF`` is held as a
Cholesky factor updated by block steps and downdated by QR (:mod:`lightning_nsv.solver.factor`); the loop sees ``Q``
only through its free set's :class:`~lightning_nsv.solver.store_protocol.Store`
(:mod:`lightning_nsv.solver.column_store`, :mod:`lightning_nsv.solver.pair_store`). A candidate in the span of F takes
a degenerate step along the null direction; if none exists the data are not separable through the origin
(:class:`~lightning_nsv.solver.result.NotSeparableError`). At the end ``α_F`` is refined against the exact columns
(iterative refinement) and the KKT residual reported.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
import warnings
from typing import Callable, Iterator

import numpy as np
import scipy.linalg
import torch

from lightning_nsv.solver.factor import FreeSet, NumpyFreeSet
from lightning_nsv.solver.result import MaxMarginResult, NotSeparableError, make_result
from lightning_nsv.solver.store_protocol import Candidates, Store

__all__ = ["active_set", "initial_indices", "sample_indices", "solver_progress"]

ROUNDING_ALPHA = 1e-12  # α below this fraction of the largest α is rounding, not a support vector
DROP_BATCH = 64  # members dropped in a descent before the factor is downdated
MAX_REFINEMENTS = 3  # steps of iterative refinement at the end
INVERSE_BLOCK = 32  # columns of Q_FF⁻¹ solved for at a time in a descent


def active_set(store: Store, y: np.ndarray, scale: float, tol: float, max_iter: int | None, initial: np.ndarray | None,
               free_set: type[FreeSet] = NumpyFreeSet, initial_block: int | None = None) -> MaxMarginResult:
    """Solve the dual for ``Q`` given by ``store`` (labels ``y`` in ±1, ``Q`` divided by ``scale``), with ``free_set``
    (:class:`~lightning_nsv.solver.factor.NumpyFreeSet` or ``TorchFreeSet``) holding F; see the module docstring."""
    m = y.shape[0]
    report = _PROGRESS.get()
    free = free_set(store)
    alpha = np.zeros(0)
    gradient = -np.ones(m)
    batch = max(1, int(math.sqrt(m)))
    initial_block = batch if initial_block is None else initial_block
    pending = None if initial is None else initial_indices(initial, m)
    max_iter = 10 * m if max_iter is None else max_iter
    refinements = 0
    for iteration in range(1, max_iter + 1):
        candidates, pending = _candidates(free, gradient, pending, initial_block, batch, tol)
        if len(candidates) == 0:
            # optimal up to the factor's rounding: refine α on the free set against the exact columns
            residual = np.max(np.abs(gradient[free.index]), initial=0.0)
            if residual <= tol or refinements >= MAX_REFINEMENTS:
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
    return _solution(free, alpha, gradient, y, scale, tol, iteration)


def _candidates(free: FreeSet, gradient, pending, initial_block: int, batch: int, tol: float):
    """``(candidates, pending)``: the next block of ``initial`` (``pending``) that violates the margin, most violated
    first, while one is left (members that the blocks before made redundant are never fetched); else the ``batch``
    most violated samples outside F."""
    m = gradient.shape[0]
    in_free = np.zeros(m, dtype=bool)
    in_free[free.index] = True
    candidates = pending[:0] if pending is not None else np.zeros(0, dtype=np.int64)
    if pending is not None:
        pending = pending[~in_free[pending] & (-gradient[pending] > tol)]
        order = np.argsort(gradient[pending], kind="stable")
        candidates, pending = pending[order[:initial_block]], pending[order[initial_block:]]
        pending = pending if len(pending) else None
    if not len(candidates):
        violation = np.where(in_free, 0.0, -gradient)
        order = np.argpartition(-violation, min(batch, m - 1))[:batch]
        order = order[np.argsort(-violation[order])]
        candidates = order[violation[order] > tol]
    return candidates, pending


def _solution(free: FreeSet, alpha, gradient, y, scale, tol, iteration) -> MaxMarginResult:
    """The result for the final free set: α on all samples, rounding-size α set to 0, the KKT residual (warned
    about when above ``tol``)."""
    m = y.shape[0]
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
            stacklevel=4,
        )
    return make_result(alpha_full, y, margins, scale, 0.0, kkt, 0, math.inf, iteration, "active-set")


def _descend(free: FreeSet, alpha: np.ndarray) -> np.ndarray:
    """Move from feasible ``alpha`` towards ``Q_FF⁻¹ 1``, dropping members whose coefficient reaches zero.

    Dropped members D stay in the factor for up to :data:`DROP_BATCH` steps and are held at zero by the equality
    constraints ``x_D = 0``: ``x = t + W μ``, ``t = Q_FF⁻¹ 1``, ``W = Q_FF⁻¹ E_D``, ``W_DD μ = −t_D`` (Lawson & Hanson's
    NNLS steps in the range space of ``Q_FF``); the columns of ``W`` come from one blocked solve for the members that
    block the step (:class:`_InverseColumns`), so a step costs ``O(n·|D|)``; then one downdate removes them all
    (:meth:`FreeSet.remove`)."""
    while True:
        alpha, dropped, done = _descend_steps(free, alpha)
        free.remove(dropped)
        alpha = np.clip(np.delete(alpha, dropped), 0.0, None)
        if done:
            return alpha


def _descend_steps(free: FreeSet, alpha: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """Steps of :func:`_descend` on one factor: ``(alpha, dropped positions, reached the target)``."""
    n = len(alpha)
    if not n:
        return alpha, np.zeros(0, dtype=np.int64), True
    unconstrained = free.solve_ones()
    inverse = _InverseColumns(free)
    dropped = np.zeros(n, dtype=bool)
    order: list[int] = []  # the dropped positions in the order they were dropped
    while True:
        target = unconstrained
        if order:
            w_dd = inverse.rows(order)
            try:
                gram = scipy.linalg.cho_factor((w_dd + w_dd.T) / 2, lower=True, check_finite=False)
            except np.linalg.LinAlgError:  # Q_FF too ill-conditioned to hold members at zero: downdate now
                return alpha, np.flatnonzero(dropped), False
            target = unconstrained + inverse.columns(order) @ scipy.linalg.cho_solve(
                gram, -unconstrained[order], check_finite=False)
            target[dropped] = 0.0
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
        order += new.tolist()
        if len(order) >= min(DROP_BATCH, n):
            return alpha, np.flatnonzero(dropped), False
        inverse.solve_for(new, np.flatnonzero(blocking & ~dropped)[np.argsort(ratios[blocking & ~dropped])])


class _InverseColumns:
    """Columns ``Q_FF⁻¹ e_k`` of members k, solved for in blocks: with those asked for, the members that block the
    current step (most blocking first, up to :data:`INVERSE_BLOCK` in all), which the steps after it mostly drop;
    one blocked solve reads the factor once for all of them, where one solve per member would read it each time."""

    def __init__(self, free: FreeSet) -> None:
        self.free = free
        self.column = np.full(len(free), -1, dtype=np.int64)
        self.solved = np.zeros((len(free), 0))

    def solve_for(self, needed: np.ndarray, likely: np.ndarray) -> None:
        """Make sure the columns of ``needed`` are at hand, solving for those of ``likely`` too when a solve is due."""
        missing = needed[self.column[needed] < 0]
        if not len(missing):
            return
        extra = likely[self.column[likely] < 0]
        block = np.concatenate([missing, extra[~np.isin(extra, missing)]])[:max(INVERSE_BLOCK, len(missing))]
        unit = np.zeros((len(self.column), len(block)), order="F")
        unit[block, np.arange(len(block))] = 1.0
        self.column[block] = self.solved.shape[1] + np.arange(len(block))
        self.solved = np.hstack([self.solved, self.free.solve(unit)])

    def columns(self, members: list[int]) -> np.ndarray:
        return self.solved[:, self.column[members]]

    def rows(self, members: list[int]) -> np.ndarray:
        """``(Q_FF⁻¹)[members, members]``."""
        return self.solved[np.ix_(members, self.column[members])]


def _refine(free: FreeSet, alpha: np.ndarray, gradient: np.ndarray) -> np.ndarray:
    """One step of iterative refinement ``α_F ← α_F − Q_FF⁻¹ (Q_FF α_F − 1)``, residual from the exact columns;
    coefficients that would turn negative are left to the next active-set step."""
    refined = alpha - free.solve(gradient[free.index])
    return refined if np.all(refined > 0) else np.where(refined > 0, refined, alpha)


def _add(free: FreeSet, candidates: np.ndarray) -> Candidates | None:
    """Add the candidates as a block, else one by one; None when one was added, else the first one's columns (it is
    dependent on F: the caller's singular step takes them)."""
    columns = free.fetch(candidates)
    if free.try_add(columns):
        return None
    added = False
    for k in range(len(candidates)):
        added |= free.try_add(columns.single(k))
    return None if added else columns.single(0)


def initial_indices(initial, m: int) -> np.ndarray:
    """``initial`` (see :func:`sample_indices`) without repeats, in the order of their first occurrence, refused
    unless every index lies in ``[0, m)``."""
    indices = _distinct_in_order(sample_indices(initial))
    if len(indices) and (indices.min() < 0 or indices.max() >= m):
        raise ValueError(f"`initial` must hold sample indices in [0, {m}), got values in "
                         f"[{indices.min()}, {indices.max()}]")
    return indices


def sample_indices(initial) -> np.ndarray:
    """Sample indices given as a list, an array or a tensor (any device), as int64; refuses values that are not whole
    numbers (no silent truncation)."""
    values = np.asarray(initial.cpu() if isinstance(initial, torch.Tensor) else initial).reshape(-1)
    if values.dtype == bool or not (np.issubdtype(values.dtype, np.integer) or np.all(np.mod(values, 1) == 0)):
        raise ValueError(f"`initial` must hold integer sample indices, got {values[:5].tolist()} "
                         f"(dtype {values.dtype})")
    return values.astype(np.int64)


def _singular_step(free: FreeSet, columns: Candidates, alpha: np.ndarray) -> np.ndarray:
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


def _distinct_in_order(indices: np.ndarray) -> np.ndarray:
    """``indices`` without repeats, in the order of their first occurrence: a block of ``initial`` whose members all
    violate the margin equally (at the start) is fetched in the caller's order, e.g. that of an input-Gram cache's
    rows, which then serves the block without a copy."""
    _, first = np.unique(indices, return_index=True)
    return indices[np.sort(first)]


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
