"""The input-Gram cache: rows of ``X Xᵀ`` kept between analyses of the same training inputs (a warm start)."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from lightning_nsv.kernel.inputs import _input_gram_rows, _InputChunks, as_tensor_on, random_projection

__all__ = ["InputGramCache", "RowSource", "gather_rows", "whole_block"]

COMPACT_ROWS = 64  # rows moved at a time when the kept rows of the cache are compacted in place
RECOMPUTE_HITS_BELOW = 8  # a request with fewer than 1/8 kept rows recomputes them (a row's product ~ 10 copies)


class RowSource(NamedTuple):
    """Where some of the rows asked of :meth:`InputGramCache.row_sources` are: ``block[rows]`` are the rows at
    ``positions`` of the request (``positions`` ``None``: all of them; ``rows`` ``None``: the whole block, in order).
    ``block`` is the cache's: read it, do not write it."""

    positions: Tensor | None
    block: Tensor
    rows: Tensor | None


class InputGramCache:
    """Rows of the input Gram ``X Xᵀ`` kept between analyses of the same training inputs (a warm start).

    ``X Xᵀ`` is most of the cost of kernel columns and does not change while the network trains; the slope Grams
    are cheap. Pass one cache to repeated analyses (``network_support_vectors(..., cache=cache)``): each analysis
    reads the rows it finds, computes the others, and keeps the rows of its support vectors for the next one.
    The inputs are identified by ``(shape, dtype, X r)`` for a fixed random ``r``; other inputs reset the cache.

    Memory: ``8·m`` bytes per kept row (float64): ``8·m·s`` between analyses, up to ``8·m·s'`` during one
    (``s'`` the samples whose columns the solver asked for), on the device of ``X``.
    """

    def __init__(self) -> None:
        self._fingerprint: tuple | None = None
        self._slot: Tensor | None = None  # kept row of each sample (order of computation), -1 when absent
        self._blocks: list[Tensor] = []  # rows in the blocks they were computed in: no copies as the cache grows
        self._starts: list[int] = []  # first slot of each block
        self._next_slot = 0
        self.hits = self.misses = 0

    def __len__(self) -> int:
        """Samples whose rows are kept."""
        return 0 if self._slot is None else int((self._slot >= 0).sum())

    @property
    def nbytes(self) -> int:
        """Memory of the kept rows' blocks (a block compacted in place keeps its memory)."""
        return sum(block.untyped_storage().nbytes() for block in self._blocks)

    @property
    def samples(self) -> Tensor:
        """Samples whose rows are kept, in slot order."""
        if self._slot is None:
            return torch.zeros(0, dtype=torch.long)
        held = torch.nonzero(self._slot >= 0)[:, 0]
        return held[torch.argsort(self._slot[held])]

    def in_slot_order(self, samples: np.ndarray) -> np.ndarray:
        """``samples`` with those whose rows are kept first, in the order of the rows (a block of them is then served
        without a copy), the others after them in their order."""
        samples = np.asarray(samples, dtype=np.int64)
        if self._slot is None or not len(samples) or samples.min() < 0 or samples.max() >= len(self._slot):
            return samples  # nothing kept, or indices the caller refuses
        slots = self._slot.cpu().numpy()[samples]
        held = slots >= 0
        return np.concatenate([samples[held][np.argsort(slots[held], kind="stable")], samples[~held]])

    @staticmethod
    def _identify(x: Tensor, dtype: torch.dtype) -> tuple:
        return (tuple(x.shape), x.dtype, dtype, x.device), random_projection(x, torch.Generator().manual_seed(0)).cpu()

    def attach(self, x: Tensor, dtype: torch.dtype | None = None) -> bool:
        """Use the cache for inputs ``x`` and rows in ``dtype`` (default that of ``x``); ``True`` when its rows
        belong to them, else it is emptied."""
        fingerprint = self._identify(x, x.dtype if dtype is None else dtype)
        if self._fingerprint is not None and fingerprint[0] == self._fingerprint[0] \
                and torch.equal(fingerprint[1], self._fingerprint[1]):
            return True
        self._fingerprint = fingerprint
        self._slot = torch.full((x.shape[0],), -1, dtype=torch.long, device=x.device)
        self._blocks, self._starts, self._next_slot = [], [], 0
        return False

    def rows(self, x: Tensor, idx: Tensor, dtype: torch.dtype | None = None) -> Tensor:
        """``(X Xᵀ)[idx, :]`` in ``dtype`` (default the one the cache was attached with; a new tensor), from kept rows
        where present; computed rows are kept."""
        if dtype is None:
            dtype = x.dtype if self._fingerprint is None else self._fingerprint[0][2]
        view = self.rows_view(_InputChunks(x, dtype), idx)
        return view.clone() if self.shares(view) else view

    def rows_view(self, chunks: _InputChunks, idx: Tensor) -> Tensor:
        """:meth:`rows` of ``chunks.x`` in ``chunks.dtype``, but the cache's own block when it holds exactly these
        rows (read it, do not write it)."""
        sources = self.row_sources(chunks, idx)
        if not len(idx):
            return chunks.x.new_empty(0, chunks.x.shape[0], dtype=chunks.dtype)
        whole = whole_block(sources)
        return whole if whole is not None else gather_rows(sources, len(idx), slice(None))

    def row_sources(self, chunks: _InputChunks, idx: Tensor) -> list[RowSource]:
        """Where the rows ``(X Xᵀ)[idx, :]`` are, after the missing ones are computed and kept: a :class:`RowSource`
        for each block that holds some. Read the blocks, do not write them; :func:`gather_rows` copies a range of
        columns."""
        x = chunks.x
        if self._fingerprint is not None and self._fingerprint[0][2] != chunks.dtype:
            raise ValueError(f"the cache holds rows in {self._fingerprint[0][2]}, asked for {chunks.dtype}: attach it "
                             "again for another dtype")
        if not len(idx):
            return []
        distinct = len(torch.unique(idx)) == len(idx)
        missing = idx[self._slot[idx] < 0]
        if not distinct:
            missing = torch.unique(missing)
        self.misses += len(missing)
        self.hits += len(idx) - len(missing)
        if distinct and len(missing) and len(idx) - len(missing) <= len(idx) // RECOMPUTE_HITS_BELOW:
            # a few kept rows among new ones: recomputing them costs less than gathering the block together
            missing = idx
        if len(missing):
            self._blocks.append(_input_gram_rows(chunks, missing))
            self._starts.append(self._next_slot)
            self._slot[missing] = torch.arange(self._next_slot, self._next_slot + len(missing), device=x.device)
            self._next_slot += len(missing)
        slots = self._slot[idx]
        return [RowSource(None, self._blocks[-1], None)] if self._is_last_block(slots) else self._sources(slots)

    def _is_last_block(self, slots: Tensor) -> bool:
        """Whether ``slots`` are exactly those of the last block, in order."""
        return len(slots) == len(self._blocks[-1]) and torch.equal(
            slots, torch.arange(self._starts[-1], self._next_slot, device=slots.device))

    def gram_among(self, samples: Tensor) -> Tensor:
        """``(X Xᵀ)[samples][:, samples]`` from the kept rows (every sample's row must be kept); not counted in
        :attr:`hits`. Cost: a gather of ``len(samples)`` columns from each block that holds some of the rows."""
        slots = self._slot[samples] if self._slot is not None else torch.full((len(samples),), -1)
        if bool((slots < 0).any()):
            raise ValueError("gram_among needs the kept rows of every sample")
        out = self._blocks[0].new_empty(len(samples), len(samples))
        for start, block in zip(self._starts, self._blocks):
            positions = torch.nonzero((slots >= start) & (slots < start + len(block)))[:, 0]
            if len(positions):
                out[positions] = block[:, samples][slots[positions] - start]
        return out

    def holds(self, samples: Tensor) -> bool:
        """Whether the rows of all ``samples`` are kept."""
        return self._slot is not None and bool((self._slot[samples] >= 0).all())

    def shares(self, rows: Tensor) -> bool:
        """Whether ``rows`` is one of the cache's own blocks (to be read, not written)."""
        return any(rows.data_ptr() == block.data_ptr() for block in self._blocks)

    def keep(self, samples) -> None:
        """Keep the rows of ``samples`` only (e.g. the support vectors), freeing the others."""
        if not self._blocks:
            return
        samples = as_tensor_on(samples, torch.long, self._slot.device)
        samples = torch.unique(samples[self._slot[samples] >= 0])
        slots, order = torch.sort(self._slot[samples])  # kept in slot order: each block's rows are copied once
        samples = samples[order]
        kept = None
        if self._is_last_block(slots):
            kept = self._blocks[-1]
        elif len(samples):
            kept = self._compacted(slots)
        self._slot.fill_(-1)
        self._slot[samples] = torch.arange(len(samples), device=self._slot.device)
        self._blocks, self._starts = ([kept], [0]) if kept is not None else ([], [])
        self._next_slot = len(samples)

    def _compacted(self, slots: Tensor) -> Tensor:
        """The rows of ``slots`` (ascending) as one block: in the first block's memory when they fill at least half
        of it, as after a warm start (no new memory to fault in, no copy of the rows already in place), else new."""
        first = self._blocks[0]
        capacity = first.untyped_storage().nbytes() // max(1, first.shape[1] * first.element_size())
        in_place = len(first) >= len(slots) >= capacity / 2  # of its memory: a block compacted before keeps all of it
        kept = first[:len(slots)] if in_place else first.new_empty(len(slots), first.shape[1])
        bounds = torch.searchsorted(slots, torch.tensor(self._starts + [self._next_slot], device=slots.device))
        for start, block, lo, hi in zip(self._starts, self._blocks, bounds[:-1].tolist(), bounds[1:].tolist()):
            if hi <= lo:
                continue
            rows = slots[lo:hi] - start
            if not (in_place and block is first):
                torch.index_select(block, 0, rows, out=kept[lo:hi])
                continue
            # first's own kept rows move up (row j from rows[j] >= j), a chunk read whole before it is written:
            # the rows it overwrites were read with the chunks before it, the later chunks read rows past it
            for a in range(0, hi, COMPACT_ROWS):
                z = min(hi, a + COMPACT_ROWS)
                if int(rows[z - 1]) != z - 1:  # distinct, ascending and >= j: in place exactly when the last one is
                    first[a:z] = first.index_select(0, rows[a:z])
        return kept

    def _sources(self, slots: Tensor) -> list[RowSource]:
        """The :class:`RowSource` of each block that holds some of ``slots``."""
        sources = []
        for start, block in zip(self._starts, self._blocks):
            positions = torch.nonzero((slots >= start) & (slots < start + len(block)))[:, 0]
            if len(positions) == len(slots):
                return [RowSource(None, block, slots - start)]
            if len(positions):
                sources.append(RowSource(positions, block, slots[positions] - start))
        return sources


def whole_block(sources: list[RowSource]) -> Tensor | None:
    """The cache's block when :meth:`InputGramCache.row_sources` found the rows to be exactly one whole block, in
    order (read it in place), else ``None``."""
    return sources[0].block if len(sources) == 1 and sources[0].rows is None else None


def gather_rows(sources: list[RowSource], count: int, cols: slice,
                out: Tensor | None = None) -> Tensor:
    """Columns ``cols`` of the ``count`` rows that :meth:`InputGramCache.row_sources` located (not a
    :func:`whole_block`: read that in place), copied into ``out`` (a new ``(count, width)`` tensor when ``None``;
    contiguous)."""
    first = sources[0].block
    width = len(range(first.shape[1])[cols])
    out = first.new_empty(count, width) if out is None else out
    for positions, block, rows in sources:
        part = block[:, cols]
        if positions is None:
            torch.index_select(part, 0, rows, out=out)
        else:
            out.index_copy_(0, positions, part.index_select(0, rows))
    return out
