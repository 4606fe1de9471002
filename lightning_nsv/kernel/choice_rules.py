"""Rules of the operation table (DESIGN.md §2c) for a choice of one input among several: ``torch.maximum`` and
``minimum`` of two branches (:class:`Select`) and max pooling (:class:`MaxPool`). The edge from the input chosen
has indicator 1; the pair network passes what both samples choose, the norm network every input (gate 1). (A max
over a dim is :class:`~lightning_nsv.kernel.piece_rules.LineMax`.)
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

from lightning_nsv.kernel.factored import Terms
from lightning_nsv.kernel.rules import Rule
from lightning_nsv.kernel.ties import near_ties

__all__ = ["MaxPool", "Select"]


class Select(Rule):
    """``torch.maximum``/``minimum`` of two input-dependent branches: a selection between them (§2c), the edge from
    the branch chosen, indicator 1 (ties: the first branch). Recorded as a gate layer ``name`` whose bit is set where
    the first branch is chosen. Pair: the branch both samples choose, else 0; norm: both branches (gate 1)."""

    kind = "select"

    def __init__(self, where: str, name: str, minimum: bool) -> None:
        super().__init__(where, None)
        self.name, self.minimum = name, minimum

    def forward(self, args, kwargs, ctx):
        a, b = args[0], args[1]
        first = a <= b if self.minimum else a >= b
        ctx.record(self.name, first)
        if ctx.watch_ties:
            ctx.tie(near_ties((a - b).abs(), torch.maximum(a.abs(), b.abs()), exact_zero=(a == 0) & (b == 0)))
        return torch.where(first, a, b)

    def pair(self, args, kwargs, ctx):
        return ctx.select(self.name, args[0], args[1])

    def norm(self, args, kwargs):
        return args[0] + args[1]

    def program(self, args, kwargs, ctx):
        return ctx.select(self, args[0], args[1])


class MaxPool(Rule):
    """Max pooling (also adaptive): the edge from the selected input unit (ties: torch's index on the float64
    forward). Pair: the unit both samples select, else 0; norm: every unit of the window (gate 1)."""

    kind = "maxpool"

    def __init__(self, where: str, name: str, pool: Callable[[Tensor], tuple[Tensor, Tensor]],
                 window_sum: Callable[[Tensor, tuple], Tensor]) -> None:
        super().__init__(where, None)
        self.name, self.pool, self.window_sum = name, pool, window_sum
        self._candidates: tuple[Tensor, Tensor] | None = None  # :meth:`candidates`, formed once
        # the factored network's window units and their pickers, per device and shapes (factored._units)
        self.units: dict[tuple, list] = {}

    def bind(self, in_shape, out_shape):
        self.in_shape, self.out_shape = in_shape, out_shape

    def forward(self, args, kwargs, ctx):
        out, index = self.pool(args[0])
        ctx.record(self.name, index.to(torch.int32))
        if ctx.watch_ties:  # the runner-up of each window: the input with the chosen unit at -inf
            rest = args[0].flatten(2).scatter(2, index.flatten(2), float("-inf")).view_as(args[0])
            ctx.tie(near_ties(out - self.pool(rest)[0], args[0], exact_zero=out == 0))
        return out

    def pair(self, args, kwargs, ctx):
        return ctx.pool(self.name, args[0])

    def norm(self, args, kwargs):
        return self.window_sum(args[0], self.out_shape)

    def factored(self, args, kwargs, ctx):
        """Each term split over the window units (:meth:`~lightning_nsv.kernel.factored.Terms.max_pool`)."""
        return args[0].max_pool(self) if isinstance(args[0], Terms) else super().factored(args, kwargs, ctx)

    def program(self, args, kwargs, ctx):
        return ctx.max_pool(self, args[0])

    def candidates(self, device) -> tuple[Tensor, Tensor]:
        """The units of each output's window within a channel's plane (flat indices), ``(outputs, k)`` int64,
        and which are real (windows of an adaptive pool differ in size), from :attr:`window_sum` on the unit
        inputs; once per rule."""
        if self._candidates is None or self._candidates[0].device != torch.device(device):
            spatial = tuple(self.in_shape[2:])
            units = math.prod(spatial)
            member = []
            for lo in range(0, units, 1024):
                basis = torch.zeros(min(1024, units - lo), units, dtype=torch.float64, device=device)
                basis[torch.arange(len(basis)), torch.arange(lo, lo + len(basis))] = 1.0
                member.append(self.window_sum(basis.view(len(basis), 1, *spatial), self.out_shape).flatten(1) != 0)
            member = torch.cat(member).T  # (outputs, units)
            k = int(member.sum(1).max())
            order = torch.sort(member.to(torch.int8), dim=1, descending=True, stable=True).indices[:, :k]
            self._candidates = (order, torch.gather(member, 1, order))
        return self._candidates
