"""Whole columns of a symmetric kernel kept by its provider, and the symmetry ``K[r, j] = K[j, r]`` that spares pairs.

:class:`~lightning_nsv.kernel.pair_network.PairNetworkColumns` evaluates every entry by the pair network, about one
forward pass each; the solver of a whole network asks for nearly every column (``s ≈ m``). :func:`cached_columns`
computes each unordered pair at most once, as far as the cache holds the earlier columns: an entry ``K[r, j]`` is read
from the kept column ``r``, or from a column ``r`` computed earlier in the same call, and only the other rows go to the
pair network. :func:`symmetric_block` forms ``K[idx, idx]`` from the kept columns and the upper triangle of tiles of
the rest, and the cache keeps that block until the next one: the solver asks for the block of its candidates, then
for the columns of those it admits, whose rows among the candidates are then read from the block. Nothing here
imports Lightning.
"""
from __future__ import annotations

import itertools
from typing import Callable

import torch
from torch import Tensor

__all__ = ["ColumnCache", "cached_columns", "even_parts", "even_split", "symmetric_block"]

Tiles = Callable[[Tensor, Tensor], Tensor]  # (rows, cols) -> K[rows][:, cols]


class ColumnCache:
    """Whole columns ``K[:, j]`` (all ``m`` rows, float64) of a symmetric kernel, up to ``budget_bytes``.

    Memory: ``8·m`` bytes per kept column, grown by doubling up to ``⌊budget_bytes / 8m⌋`` columns (the whole kernel,
    ``8·m²`` bytes, at most); while it grows the old and the new store are alive at once. The first columns kept stay:
    once full, later columns are read by symmetry from the kept ones but not kept themselves. Besides: the last block
    ``K[b, b]`` of :func:`symmetric_block` when ``8·|b|²`` is within the budget (as large as that block's answer).
    """

    def __init__(self, m: int, budget_bytes: int, device: torch.device) -> None:
        if budget_bytes < 0:
            raise ValueError(f"cache_bytes must be >= 0 (0: no cache), got {budget_bytes}")
        self.capacity = min(m, budget_bytes // (8 * max(1, m)))
        self.slot = torch.full((m,), -1, dtype=torch.long, device=device)  # row of the store holding column j
        self.store = torch.empty(0, m, dtype=torch.float64, device=device)  # kept column j in store[slot[j]]
        self.size = 0
        self.budget = budget_bytes
        self.block_pos = torch.full((m,) if budget_bytes else (0,), -1, dtype=torch.long, device=device)
        self.block: Tensor | None = None  # K[b, b], sample r at row and column block_pos[r]

    def __len__(self) -> int:
        """Columns kept."""
        return self.size

    @property
    def nbytes(self) -> int:
        return self.store.numel() * 8

    def add(self, cols: Tensor, values: Tensor) -> None:
        """Keep ``values`` (``(m, len(cols))``, the columns ``cols``, distinct and not yet kept) as far as room is
        left."""
        take = min(len(cols), self.capacity - self.size)
        if take <= 0:
            return
        if self.size + take > len(self.store):
            rows = min(self.capacity, max(self.size + take, 2 * len(self.store)))
            grown = self.store.new_empty(rows, self.store.shape[1])
            grown[:self.size] = self.store[:self.size]
            self.store = grown
        self.store[self.size:self.size + take] = values[:, :take].T
        self.slot[cols[:take]] = torch.arange(self.size, self.size + take, device=self.slot.device)
        self.size += take

    def keep_block(self, samples: Tensor, values: Tensor) -> None:
        """Keep ``values = K[samples][:, samples]`` (distinct samples) in place of the last block, if small enough."""
        if 0 < 8 * len(samples) ** 2 <= self.budget:
            self.block_pos.fill_(-1)
            self.block_pos[samples] = torch.arange(len(samples), device=samples.device)
            self.block = values

    def block_rows(self, rows: Tensor, cols: Tensor) -> Tensor:
        """Row (and column) of each of ``rows`` in the kept block, -1 where absent, all -1 unless every column of
        ``cols`` is in it."""
        if self.block is None or not bool((self.block_pos[cols] >= 0).all()):
            return torch.full_like(rows, -1)
        return self.block_pos[rows]


def even_split(t: Tensor, most: int) -> tuple[Tensor, ...]:
    """``t`` in the fewest chunks of at most ``most`` entries, of sizes that differ by one at most: no narrow last
    chunk (the solver asks for ~√m columns at a time; a chunk of a few columns would run the pair network's slow
    narrow tiles)."""
    return t.tensor_split(max(1, -(-len(t) // most))) if len(t) else ()


def even_parts(t: Tensor, most: int) -> list[tuple[int, Tensor]]:
    """:func:`even_split` of ``t``, each part with its offset."""
    parts = even_split(t, most)
    return list(zip(itertools.accumulate((len(p) for p in parts[:-1]), initial=0), parts))


def cached_columns(cache: ColumnCache, idx: Tensor, lo: int, hi: int, width: int, tiles: Tiles) -> Tensor:
    """``K[lo:hi, idx]`` from the kept columns, by symmetry, and ``tiles`` for the rest (see the module).

    The new columns go ``width`` at a time: an entry ``K[r, j]`` of a new column ``j`` is ``cache column r`` at row
    ``j`` when ``r`` is kept, else (all rows asked for) the column ``r`` of an earlier chunk at row ``j``, else the
    kept block's entry when ``r`` and every column of the chunk are in it; the others come from ``tiles``. Only a
    request for all ``m`` rows keeps its columns: a slice of the rows (a DDP shard of
    :mod:`lightning_nsv.kernel.pair_sharded`) reads kept columns and keeps nothing, since column ``r``'s row ``j`` is
    then outside the slice for most ``j``."""
    m, device = len(cache.slot), idx.device
    unique, inverse = torch.unique(idx, return_inverse=True)
    out = torch.empty(hi - lo, len(unique), dtype=torch.float64, device=device)
    slots = cache.slot[unique]
    kept = torch.nonzero(slots >= 0)[:, 0]
    out[:, kept] = cache.store[slots[kept], lo:hi].T
    whole = lo == 0 and hi == m
    done = torch.full((m,), -1, dtype=torch.long, device=device)  # column of `out` of a sample computed here
    rows = torch.arange(lo, hi, device=device)
    for chunk in even_split(torch.nonzero(slots < 0)[:, 0], width):
        cols = unique[chunk]
        row_slots, row_done, row_block = cache.slot[rows], done[rows], cache.block_rows(rows, cols)
        from_cache = torch.nonzero(row_slots >= 0)[:, 0]
        from_call = torch.nonzero((row_slots < 0) & (row_done >= 0))[:, 0]
        from_block = torch.nonzero((row_slots < 0) & (row_done < 0) & (row_block >= 0))[:, 0]
        rest = torch.nonzero((row_slots < 0) & (row_done < 0) & (row_block < 0))[:, 0]
        # K[r, j] = K[j, r]: row j of the kept column r, or of the column r computed in an earlier chunk; or the block
        out[from_cache[:, None], chunk[None]] = cache.store[row_slots[from_cache][:, None], cols[None]]
        out[from_call[:, None], chunk[None]] = out[cols[:, None], row_done[from_call][None]].T
        if len(from_block):
            at = cache.block_pos[cols]
            out[from_block[:, None], chunk[None]] = cache.block[row_block[from_block][:, None], at[None]]
        out[rest[:, None], chunk[None]] = tiles(rows[rest], cols)
        if whole:
            done[cols] = chunk
            cache.add(cols, out[:, chunk])
    return out[:, inverse]


def symmetric_block(cache: ColumnCache, idx: Tensor, width: int, tiles: Tiles) -> Tensor:
    """``K[idx][:, idx]``: entries in a kept column (or its row) from the cache, the rest by ``tiles`` on the tiles
    ``i <= j`` of ``width`` samples (a tile below the diagonal is the transpose of one above it); kept as the
    cache's block."""
    unique, inverse = torch.unique(idx, return_inverse=True)
    out = torch.empty(len(unique), len(unique), dtype=torch.float64, device=idx.device)
    slots = cache.slot[unique]
    kept = torch.nonzero(slots >= 0)[:, 0]
    values = cache.store[slots[kept]][:, unique]  # K[kept, unique] = K[unique, kept]ᵀ
    out[kept] = values
    out[:, kept] = values.T
    missing = even_split(torch.nonzero(slots < 0)[:, 0], width)
    for a, first in enumerate(missing):
        for second in missing[a:]:
            tile = tiles(unique[first], unique[second])
            out[first[:, None], second[None]] = tile
            out[second[:, None], first[None]] = tile.T
    cache.keep_block(unique, out)
    return out[inverse][:, inverse]
