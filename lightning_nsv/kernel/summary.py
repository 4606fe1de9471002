"""What the path kernel of a traced network covers, for reports (:class:`ScopeSummary`), and how many distinct
activation patterns a set of samples has (:func:`unique_patterns`)."""
from __future__ import annotations

import math
from dataclasses import dataclass

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
    sample (DESIGN.md §2). A network without gates has one (empty) pattern."""
    rows = []
    for gates in gate_sets:
        parts = [b.reshape(len(gates), -1).to(torch.uint8) for b in gates.bits.values()]
        parts += [s.reshape(len(gates), -1).contiguous().view(torch.uint8) for s in gates.selections.values()]
        if not parts:
            return 1 if sum(len(g) for g in gate_sets) else 0
        rows.append(torch.cat([p.reshape(len(gates), -1).cpu() for p in parts], dim=1))
    data = torch.cat(rows)
    if data.shape[0] == 0:
        return 0
    bits_end = sum(b[0].numel() for b in gate_sets[0].bits.values())
    bits, rest = data[:, :bits_end], data[:, bits_end:]
    pad = (-bits.shape[1]) % 8
    packed = torch.nn.functional.pad(bits, (0, pad)).reshape(len(data), -1, 8)
    packed = (packed << torch.arange(7, -1, -1, dtype=torch.uint8)).sum(-1, dtype=torch.uint8)
    return int(torch.unique(torch.cat([packed, rest], dim=1), dim=0).shape[0])
