"""The columns ``Q[:, F]`` of the active-set solver's free set F, for ``Q`` given by columns (DESIGN.md §2).

Kept in the blocks they were computed in, served lazily from ``Q[F ∪ new, new]`` where the provider offers that
block, compacted when removed members' (dead) columns pile up: :class:`ColumnStore` on the CPU (numpy),
:class:`DeviceColumnStore` with its blocks as tensors on a device. :func:`store_for` builds one from a
:class:`~lightning_nsv.solver.protocol.KernelColumns`. Both are a :class:`~lightning_nsv.solver.store_protocol.Store`
of :class:`~lightning_nsv.solver.store_protocol.StoredCandidates` (:class:`FullColumns`, :class:`LazyColumns`), what
:class:`~lightning_nsv.solver.factor.FreeSet` asks.
"""
from __future__ import annotations

import sys
from typing import Callable

import numpy as np
import torch

from lightning_nsv.memory import base_page_empty
from lightning_nsv.solver.protocol import KernelColumns
from lightning_nsv.solver.store_protocol import DeviceStore, Store, StoredCandidates

__all__ = ["ColumnStore", "DeviceColumnStore", "DeviceFullColumns", "FullColumns", "LazyColumns", "admits_lazily",
           "store_for", "device_q_columns"]

# the store compacts when its dead columns outnumber max(64, members / 32) and take over 64 MiB: a compaction
# shrinks (or copies) the blocks with the largest share of dead ones until half the allowance remains, so small
# stores are left alone
DEAD_COLUMNS_MIN, DEAD_COLUMNS_SHARE, DEAD_BYTES_MIN = 64, 32, 64 << 20
NARROW_BLOCK, NARROW_BLOCKS = 16, 32  # this many stored blocks narrower than NARROW_BLOCK columns are merged
PENDING = -1  # the block of a member admitted lazily, before its column is formed


def store_for(provider: KernelColumns, y: np.ndarray, scale: float,
              device: torch.device | None = None) -> Store[StoredCandidates]:
    """The store of ``Q = (y yᵀ ∘ K) / scale`` for ``provider``'s ``K``: numpy on the CPU (``device`` None), lazy
    candidates where the provider offers float64 blocks ``Q[idx, idx]``; else tensors on ``device``."""
    if device is not None:
        return DeviceColumnStore(device_q_columns(provider, y, scale, device), len(y), device)
    return ColumnStore(lambda idx: provider.signed_columns(idx, y, scale), len(y),
                       (lambda idx: provider.signed_block(idx, y, scale)) if admits_lazily(provider, device) else None)


def admits_lazily(provider: KernelColumns, device: torch.device | None = None) -> bool:
    """Whether the store of :func:`store_for` admits candidates from their block ``Q[F ∪ new, new]`` and forms full
    columns only for those still free when the margins are next needed (:class:`LazyColumns`): on the CPU (numpy,
    ``device`` None) for a provider of float64 blocks. Then a wide block of candidates costs no column for the
    members that the descent after it drops at once."""
    # a block rounded apart from the columns (float32: by 1e-7) would pass a duplicate sample for an independent one
    return device is None and provider.offers_block and provider.dtype == torch.float64


def device_q_columns(provider: KernelColumns, y: np.ndarray, scale: float, device: torch.device):
    """``idx -> Q[:, idx]`` as an ``(m, b)`` float64 tensor on ``device``."""
    return lambda idx: provider.signed_rows(idx, y, scale).to(device, torch.float64).T


class FullColumns(StoredCandidates):
    """Full columns ``Q[:, new]`` of a block of candidates, ``(n, b)``, Fortran order."""

    def __init__(self, new: np.ndarray, cols: np.ndarray) -> None:
        self.new, self.cols = new, cols

    def take(self, rows) -> np.ndarray:
        """``Q[rows, new]``."""
        return self.cols[rows]

    def single(self, k: int) -> "FullColumns":
        return FullColumns(self.new[k:k + 1], self.cols[:, k:k + 1].copy(order="F"))

    def store_into(self, store: ColumnStore) -> None:
        """Keep the columns in ``store`` as one block (:meth:`ColumnStore.admit`)."""
        store.admit_full(self.new, self.cols)


class LazyColumns(StoredCandidates):
    """``Q[rows, new]`` of a block of candidates for ``rows`` the members of F when they were fetched and ``new``
    itself: all that admitting them and the descent after it read. Their full columns are formed only for those
    still in F when ``Q[:, F] α`` is next needed (:meth:`ColumnStore.q_times`): a candidate that the descent drops
    again at once costs no kernel column. ``full``: columns ``Q[:, new[k]]`` already at hand (a stored dead one)."""

    def __init__(self, new: np.ndarray, sub: np.ndarray, position: np.ndarray, full: dict[int, np.ndarray]) -> None:
        self.new, self.sub, self._position, self.full = new, sub, position, full

    def take(self, rows) -> np.ndarray:
        """``Q[rows, new]`` (``rows`` among the members at the fetch and ``new``)."""
        positions = self._position[np.asarray(rows, dtype=np.int64)]
        if len(positions) and positions.min() < 0:
            raise RuntimeError("a row outside the members at the fetch and the candidates was asked of lazy columns")
        return self.sub[positions]

    def single(self, k: int) -> "LazyColumns":
        j = int(self.new[k])
        return LazyColumns(self.new[k:k + 1], self.sub[:, k:k + 1], self._position,
                           {j: self.full[j]} if j in self.full else {})

    def store_into(self, store: ColumnStore) -> None:
        """Keep in ``store`` the columns at hand, and the others as pending (:meth:`ColumnStore.admit`)."""
        store.admit_lazy(self)


class ColumnStore(Store[StoredCandidates]):
    """The columns ``Q[:, F]`` of the free set for a ``Q`` given by columns: kept in the blocks they were computed
    in (no copies as F grows); a removed member's column stays in its block with weight zero until the dead columns
    outnumber 1/32 of the members (64 at least) and take over 64 MiB, then the blocks with the largest share of dead
    columns are compacted until half that many remain; a sample fetched again meanwhile (one that left F and
    re-enters it) is copied from its dead column instead of asked of ``q_columns``. Memory ``8·n`` bytes per stored
    column: the members' and at most ``max(64, members / 32, 2**23 / n)`` dead ones."""

    def __init__(self, q_columns: Callable[[np.ndarray], np.ndarray], n: int,
                 q_block: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
        self.q_columns = q_columns
        self.q_block = q_block  # idx -> Q[idx, idx]: with it, candidates are fetched lazily (LazyColumns)
        self.n = n
        self._blocks: list[np.ndarray] = []  # (n, b) arrays of columns of Q
        self._samples: list[np.ndarray] = []  # the sample of each column of each block
        self._where: list[tuple[int, int]] = []  # (block, column) of member k; (PENDING, sample): no column yet
        self.reused = 0  # columns served from dead ones instead of asked of q_columns
        self.skipped = 0  # candidates admitted lazily that left F before their column was formed

    def fetch(self, new: np.ndarray, members: list[int] | None = None) -> FullColumns | LazyColumns:
        """The columns of candidates ``new``: full (:class:`FullColumns`), or with ``q_block`` and the members of F
        (``members``) given, :class:`LazyColumns`."""
        if self.q_block is None or members is None:
            return FullColumns(*self._fetched(new))
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
        return LazyColumns(new, sub, position, self._stored_dead(new, count=False))

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

    def admit(self, columns: StoredCandidates) -> None:
        """The candidates of ``columns`` (from :meth:`fetch`) joined F, after its members."""
        columns.store_into(self)

    def admit_full(self, new: np.ndarray, cols) -> None:
        """Candidates ``new`` with their full columns ``cols`` joined F: one block."""
        block = self._append_block(new, cols)
        self._where += [(block, c) for c in range(len(new))]
        self._merge_if_narrow()

    def admit_lazy(self, columns: LazyColumns) -> None:
        """Candidates fetched lazily joined F (entries in the order of ``columns.new``, as the members'): those with a
        column at hand (a stored dead one) in one block, the others pending until :meth:`_complete`."""
        new = columns.new.tolist()
        at_hand = [j for j in new if j in columns.full]
        self.reused += len(at_hand)
        column = {j: c for c, j in enumerate(at_hand)}
        block = self._append_block(np.asarray(at_hand), self._joined([columns.full[j] for j in at_hand])) \
            if at_hand else PENDING
        self._where += [(block, column[j]) if j in column else (PENDING, j) for j in new]
        self._merge_if_narrow()  # blocks of a few reused dead columns, as re-entering samples make them

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
        which the KKT residual of the solution shows; on one OpenBLAS thread, as the solver runs: two are 20–30%
        faster alone, but their spinning then slowed torch's next column GEMMs, 2.05 s against 1.45 s end to end at
        m = 20,000)."""
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
        # the memory contract of KernelColumns.signed_columns: only such blocks are changed (a base that is no
        # array, a tensor or a buffer, is not)
        rows = block.base
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


class DeviceFullColumns(FullColumns):
    """:class:`FullColumns` as an ``(n, b)`` float64 tensor on the solver's device."""

    def take(self, rows) -> torch.Tensor:
        return self.cols[torch.as_tensor(np.asarray(rows, dtype=np.int64), device=self.cols.device)]

    def single(self, k: int) -> "DeviceFullColumns":
        return DeviceFullColumns(self.new[k:k + 1], self.cols[:, k:k + 1].clone())


class DeviceColumnStore(ColumnStore, DeviceStore[StoredCandidates]):
    """:class:`ColumnStore` with its blocks as tensors on ``device`` (``q_columns`` gives ``(n, b)`` tensors there);
    ``Q[:, F] α`` comes back as a numpy vector."""

    def __init__(self, q_columns: Callable[[np.ndarray], torch.Tensor], n: int, device: torch.device) -> None:
        super().__init__(q_columns, n)
        self.device = device

    def fetch(self, new: np.ndarray, members: list[int] | None = None) -> DeviceFullColumns:
        """Full columns of the candidates ``new`` (the members are not needed: no lazy route on a device)."""
        return DeviceFullColumns(*self._fetched(new))

    def _without_dead(self, b: int, columns: list[int]) -> torch.Tensor:
        return self._columns_of(self._blocks[b], columns)

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


