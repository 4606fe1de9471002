"""What the path kernel of a traced network covers, for reports (:class:`ScopeSummary`), and how many distinct
activation patterns a set of samples has (:func:`unique_patterns`)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from lightning_nsv.kernel.gates import Gates
from lightning_nsv.kernel.graph import PiecewiseGraph
from lightning_nsv.kernel.piece_rules import PieceGate

__all__ = ["ScopeSummary", "scope_summary", "unique_patterns"]


@dataclass(frozen=True)
class ScopeSummary:
    """What the path kernel covers, for reports: parameter maps, gate layers (saturating pieces among them), max
    pools (maxes over a dim among them), gates per sample (units of gate layers and max-pool selections)."""

    maps: int
    gate_layers: int
    max_pools: int
    gates: int
    scope: str = "whole network"

    def __str__(self) -> str:
        plural = lambda n, word: f"{n:,} {word}{'' if n == 1 else 's'}"  # noqa: E731
        return (f"{self.scope}: {plural(self.maps, 'map')}, {plural(self.gate_layers, 'gate layer')}, "
                f"{plural(self.max_pools, 'max-pool')}, {plural(self.gates, 'gate')}")


def scope_summary(graph: PiecewiseGraph, scope: str = "whole network") -> ScopeSummary:
    units = sum(math.prod(shape) for *_, shape in graph.gates) + sum(math.prod(shape) for *_, shape in graph.pools)
    pieces = sum(isinstance(graph.rules[p.name], PieceGate) for p in graph.pools)
    return ScopeSummary(len(graph.maps()), len(graph.gates) + pieces, len(graph.pools) - pieces, units, scope)


def unique_patterns(*gate_sets: Gates) -> int:
    """Distinct activation patterns across the given sets: every slope bit and every max-pool selection of a
    sample (DESIGN.md §2). A network without gates has one (empty) pattern. Exact: each sample's pattern is a row
    of bytes (each layer's bits packed); rows are grouped by a 64-bit hash and rows that share one are compared
    byte for byte."""
    parts = []
    for gates in gate_sets:
        m = len(gates)
        row = [np.packbits(b.reshape(m, -1).cpu().numpy(), axis=1) for b in gates.bits.values()]
        row += [s.reshape(m, -1).cpu().contiguous().numpy().view(np.uint8) for s in gates.selections.values()]
        if not row:
            return 1 if sum(len(g) for g in gate_sets) else 0
        parts.append(row)
    pieces = [np.concatenate(column) for column in zip(*parts)]  # per layer, the rows of every set
    m = len(pieces[0])
    if m == 0:
        return 0
    return distinct_rows(pieces, _row_hashes(pieces))


def _row_hashes(pieces: list[np.ndarray]) -> np.ndarray:
    """A 64-bit hash of every row of the uint8 matrices ``pieces`` side by side (random odd multipliers of each
    8-byte word, summed modulo 2**64)."""
    m = len(pieces[0])
    rng = np.random.default_rng(0)
    hashes = np.zeros(m, dtype=np.uint64)
    for piece in pieces:
        words = np.zeros((m, -(-piece.shape[1] // 8) * 8), dtype=np.uint8)
        words[:, :piece.shape[1]] = piece
        words = words.view(np.uint64)
        multipliers = rng.integers(1, 2**63, size=words.shape[1], dtype=np.uint64) | np.uint64(1)
        with np.errstate(over="ignore"):
            hashes += words @ multipliers  # wraps modulo 2**64
    return hashes


def distinct_rows(pieces: list[np.ndarray], hashes: np.ndarray) -> int:
    """The number of distinct rows of the uint8 matrices ``pieces`` side by side, given a hash of each row: rows
    that share a hash are compared byte for byte, so the count is exact whatever the hash."""
    m = len(hashes)
    order = np.argsort(hashes, kind="stable")
    bounds = np.concatenate([[0], np.flatnonzero(np.diff(hashes[order])) + 1, [m]])
    sizes = np.diff(bounds)
    distinct = int((sizes == 1).sum())
    for lo, hi in zip(bounds[:-1][sizes > 1], bounds[1:][sizes > 1]):  # one hash: the distinct rows themselves
        group = order[lo:hi]
        distinct += len(np.unique(np.concatenate([piece[group] for piece in pieces], axis=1), axis=0))
    return distinct
