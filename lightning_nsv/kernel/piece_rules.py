"""The rest of the piecewise-linear vocabulary (DESIGN.md §2c "Beyond ReLU"): rules of the operation table for a
saturating affine piece, a gate written with ``torch.where`` and a max over a dim (maxout).

- *Saturated piece = path start with its constant.* Hardtanh, ReLU6 and clamp give each unit a slope
  ``s(x) ∈ {0, 1}`` (1 in the linear piece) and a flat value ``c(x)`` (the bound it saturates at, 0 in the linear
  piece): ``z ↦ s(x)·z + c(x)``. The flat value is a fixed constant once x is fixed, so the unit is one more path
  start, as a bias is, with ``phi = c(x)`` and ``wbar`` what lies downstream (weight 1 on the start). The pair
  network maps ``P ↦ s(x)s(x')·P + c(x)c(x')`` (the product ``lo·hi`` where the two samples saturate on opposite
  sides), the norm network ``v ↦ v + 1`` (slope 1, the start's weight 1). A unit whose bounds are both 0 or absent
  (``clamp_min(z, 0)``, a ReLU) has no start: its flat value is 0 for every x.
- *Another slope.* ``torch.where(z > 0, z, a·z)`` is the Leaky-ReLU gate of slopes ``(a, 1)``: its slope goes into
  ``phi`` (:class:`~lightning_nsv.kernel.rules.Gate`), the same kernel as ``LeakyReLU(a)``.
- *Selection over a dim = one-hot choice.* ``x.max(dim)``/``amax`` keep one candidate of each line along ``dim``:
  the edge from the chosen candidate, indicator 1, as a max pool's window (ties: torch's index on the float64
  forward). The pair network passes the candidate both samples choose, else 0; the norm network sums the line.
"""
from __future__ import annotations

import torch
from torch import Tensor

from lightning_nsv.kernel.factored import Terms, has_channels
from lightning_nsv.kernel.rules import Gate, Rule
from lightning_nsv.kernel.ties import near_ties

__all__ = ["ForwardOnly", "LineMax", "PieceGate", "TakeValues", "WhereGate", "piece_sides"]

LOW, LINEAR, HIGH = 0, 1, 2  # the piece of a saturating unit, as recorded


def piece_sides(piece: Tensor, lo: float | None, hi: float | None) -> tuple[Tensor, Tensor]:
    """``(s, c)``: the slope (1 in the linear piece) and the flat value of each unit, float64, from its piece."""
    slope = (piece == LINEAR).to(torch.float64)
    flat = torch.zeros_like(slope)
    if lo is not None:
        flat = torch.where(piece == LOW, lo, flat)
    if hi is not None:
        flat = torch.where(piece == HIGH, hi, flat)
    return slope, flat


class PieceGate(Rule):
    """Hardtanh, ReLU6, clamp with constant bounds ``lo`` and ``hi`` (``None``: none): a gate of slope ``s ∈ {0, 1}``
    plus a path start of flat value ``c ∈ {lo, 0, hi}`` (the module docstring). Recorded as a selection layer
    ``name``: the piece of each unit (:data:`LOW`, :data:`LINEAR`, :data:`HIGH`; ``lo <= z <= hi`` is linear)."""

    kind = "piece"

    def __init__(self, where: str, name: str, lo: float | None, hi: float | None) -> None:
        super().__init__(where, None)
        self.name, self.lo, self.hi = name, lo, hi
        self.starts = bool(lo) or bool(hi)  # a flat value other than 0 for some x

    def forward(self, args, kwargs, ctx):
        z = args[0]
        piece = torch.full(z.shape, LINEAR, dtype=torch.int32, device=z.device)
        gaps = []
        if self.lo is not None:
            piece[z < self.lo] = LOW
            gaps.append((z - self.lo).abs())
        if self.hi is not None:
            piece[z > self.hi] = HIGH
            gaps.append((z - self.hi).abs())
        ctx.record(self.name, piece)
        if ctx.watch_ties and gaps:
            bound = max(abs(b) for b in (self.lo, self.hi) if b is not None)
            gap = gaps[0] if len(gaps) == 1 else torch.minimum(*gaps)
            ctx.tie(near_ties(gap, z.abs().clamp(min=bound)))
        return z.clamp(self.lo, self.hi)

    def pair(self, args, kwargs, ctx):
        return ctx.piece(self, args[0])

    def factored(self, args, kwargs, ctx):
        """The slopes on every factor, the flat values a term of their own (a path start)."""
        if not has_channels(args[0]):
            return super().factored(args, kwargs, ctx)
        (s_first, c_first), (s_second, c_second) = ctx.piece_sides(self)
        gated = Terms.of(ctx, args[0]).gate(s_first, s_second)
        return gated + Terms(ctx, gated.shape, [(None, c_first, c_second)]) if self.starts else gated

    def norm(self, args, kwargs):
        return args[0] + 1.0 if self.starts else args[0]

    def program(self, args, kwargs, ctx):
        return ctx.piece(self, args[0])


class WhereGate(Gate):
    """``torch.where(z > 0, z, a·z)`` (or ``z >= 0``; ``z < 0``, ``z <= 0`` with the branches swapped): the gate of
    slopes ``beta = a``, ``gamma = 1`` on ``z``, argument ``position`` of the call (0 included in ``gamma``'s piece:
    both pieces give 0 there)."""

    def __init__(self, where: str, name: str, beta: float, position: int) -> None:
        super().__init__(where, name, beta, 1.0)
        self.position = position

    def forward(self, args, kwargs, ctx):
        return super().forward((args[self.position],), kwargs, ctx)

    def pair(self, args, kwargs, ctx):
        return ctx.gate(self.name, args[self.position])

    def factored(self, args, kwargs, ctx):
        return self.factored_gate(args[self.position], args, kwargs, ctx)

    def norm(self, args, kwargs):
        return args[self.position]

    def program(self, args, kwargs, ctx):
        return ctx.gate(self, args[self.position])


class ForwardOnly(Rule):
    """A value read only by a rule that takes its meaning from it (the comparison and the scaled copy of a
    :class:`WhereGate`): computed in the forward, nothing in the pair, norm and program modes."""

    kind = "forward only"

    def pair(self, args, kwargs, ctx):
        return None

    def factored(self, args, kwargs, ctx):
        return None

    def norm(self, args, kwargs):
        return None

    def program(self, args, kwargs, ctx):
        return None


class LineMax(Rule):
    """``x.max(dim)``, ``torch.max(x, dim)``, ``amax``, and the minima (``minimum``), ``dim >= 1``, with or without
    ``keepdim``: a selection of one candidate along ``dim`` (the module docstring). Recorded as a selection layer
    ``name``: the chosen index along ``dim`` (torch's on ties), in the shape of the output. ``with_indices``: the
    call returns ``(values, indices)`` (read through :class:`TakeValues`)."""

    kind = "select"

    def __init__(self, where: str, name: str, dim: int, keepdim: bool, minimum: bool, with_indices: bool) -> None:
        super().__init__(where, None)
        self.name, self.dim, self.keepdim = name, dim, keepdim
        self.minimum, self.with_indices = minimum, with_indices

    def bind(self, in_shape, out_shape):
        self.dim = self.dim + len(in_shape) if self.dim < 0 else self.dim
        self.lines = in_shape[self.dim]

    def _out(self, v: Tensor):
        return (v, None) if self.with_indices else v

    def forward(self, args, kwargs, ctx):
        z = args[0]
        dim = self.dim + z.dim() if self.dim < 0 else self.dim
        values, index = (torch.min if self.minimum else torch.max)(z, dim, keepdim=True)
        chosen = index if self.keepdim else index.squeeze(dim)
        ctx.record(self.name, chosen.to(torch.int32))
        if ctx.watch_ties and z.shape[dim] > 1:  # the runner-up of each line: the chosen candidate set aside
            far = float("inf") if self.minimum else float("-inf")
            rest = z.scatter(dim, index, far)
            second = (torch.amin if self.minimum else torch.amax)(rest, dim, keepdim=True)
            ctx.tie(near_ties((values - second).abs(), z, exact_zero=values == 0))
        return self._out(values if self.keepdim else values.squeeze(dim))

    def chosen(self, index: Tensor) -> Tensor:
        """A recorded index in the shape of the input's lines (size 1 along ``dim``), int64."""
        index = index.to(torch.long)
        return index if self.keepdim else index.unsqueeze(self.dim)

    def pair(self, args, kwargs, ctx):
        return self._out(ctx.line_select(self, args[0]))

    def factored(self, args, kwargs, ctx):
        """Each term split over the candidates of its line (:meth:`~lightning_nsv.kernel.factored.Terms.line_max`)."""
        if has_channels(args[0]) and len(self.out_shape) >= 2:
            return self._out(Terms.of(ctx, args[0]).line_max(self))
        return super().factored(args, kwargs, ctx)

    def norm(self, args, kwargs):
        return self._out(args[0].sum(self.dim, keepdim=self.keepdim))

    def program(self, args, kwargs, ctx):
        return self._out(ctx.line_max(self, args[0]))


class TakeValues(Rule):
    """``.values`` or ``[0]`` of a :class:`LineMax` that returns ``(values, indices)``."""

    kind = "shape"

    def __init__(self, where: str) -> None:
        super().__init__(where, lambda args, kwargs: args[0][0])

    def factored(self, args, kwargs, ctx):
        return args[0][0]  # the values as they are: terms stay terms

    def program(self, args, kwargs, ctx):
        return args[0][0]
