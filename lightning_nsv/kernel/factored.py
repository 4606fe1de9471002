"""The pair network with channels kept factored (DESIGN.md §2c "Speed: channels collapse", the general rule).

A pair value with channels is held as a sum of terms ``S_t(x, x')[p] · A_t(x)[c, p] · A_t(x')[c, p]``: ``S_t`` a
per-pair map with one channel (or all; ``None``: 1), ``A_t`` a per-*sample* product of the inputs, gate slopes and
max-pool selection indicators (``None``: all ones). The pair input ``x ⊙ x'`` is the term ``(None, x, x')``. Then

- a gate multiplies every ``A_t`` by the sample's slopes (``len(a) + len(b)`` samples of work, not one per pair);
- a groups=1 conv's channel sum is ``Σ_t S_t · C_t`` with the overlap ``C_t[p] = Σ_c A_t(x)[c,p] A_t(x')[c,p]``,
  for a block of rows × columns one GEMM over channels per position (the population count of ANDed words where both
  factors are 0/1 masks: ReLU-type gates and selection indicators, :mod:`lightning_nsv.kernel.bitmasks`), then a
  single-channel box filter;
- a BatchNorm, bias or shift adds a term ``1``; a residual sum joins the terms of its branches;
- a saturating piece (Hardtanh, clamp) multiplies every ``A_t`` by the slopes and adds the term
  ``(None, c(x), c(x'))`` of the flat values;
- a max pool splits every term over the ``k`` units of each window: ``S_t`` at unit ``r``, and ``A_t`` at ``r``
  times ``[x selects r]`` (``Σ_r [sel(x) = r][sel(x') = r] = [sel(x) = sel(x')]``); a max over a dim alike, over
  the candidates of each line.

Any other operation sees the terms summed into the plain pair value (:meth:`Terms.value`) and runs its rule's pair
form. The result equals the plain pair network up to rounding (tested to 1e-12).

The network is the ``factored`` mode of the graph interpreter (:func:`lightning_nsv.kernel.graph.run`): each rule
states its own factored form (``Rule.factored(args, kwargs, ctx)``, :mod:`lightning_nsv.kernel.rules`; the default
is the pair form on plain values), asking the block's :class:`FactoredContext`; the placeholder's value is
:meth:`Terms.input` and the output's :func:`plain`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch
import torch.fx as fx
from torch import Tensor

from lightning_nsv.kernel.bitmasks import Bits, bit_overlap

if TYPE_CHECKING:
    from lightning_nsv.kernel.choice_rules import MaxPool
    from lightning_nsv.kernel.piece_rules import LineMax, PieceGate

__all__ = ["FactoredContext", "PairContext", "Terms", "channel_overlap", "has_channels", "pair_shape", "plain"]


class PairContext(Protocol):
    """What a rule's ``pair(args, kwargs, ctx)`` asks of the block of pairs it runs on (the plain pair network,
    :class:`~lightning_nsv.kernel.pair_network._PairContext`): each method takes the pair values ``v``
    (``(P, *shape)``, one row per pair) and gives the node's."""

    collapse: bool  # whether a gate marked ``collapse`` passes one channel (DESIGN.md §2c "Speed")

    def gate(self, name: str, v: Tensor) -> Tensor: ...  # v · sigma(x) sigma(x') at gate layer ``name``
    def overlap(self, name: str) -> Tensor: ...  # Σ_c sigma_c(x) sigma_c(x') per position, (P, *spatial)
    def select(self, name: str, first: Tensor, second: Tensor) -> Tensor: ...  # the branch both samples choose
    def piece(self, rule: PieceGate, v: Tensor) -> Tensor: ...  # s(x) s(x') v + c(x) c(x')
    def line_select(self, rule: LineMax, v: Tensor) -> Tensor: ...  # the candidate both samples choose
    def pool(self, name: str, v: Tensor) -> Tensor: ...  # the window unit both samples select


class FactoredContext(PairContext, Protocol):
    """What a rule's ``factored(args, kwargs, ctx)`` may ask: the block (every pair ``(a[i], b[j])`` when
    ``outer``, else ``(a[p], b[p])``), the per-sample sides of its gates, pieces and choices, and, for the pair
    form on plain values (``Rule.factored``'s default), everything a :class:`PairContext` offers. A value is a
    :class:`Terms` or a plain pair value (``(P, *shape)``)."""

    a: Tensor  # the block's first samples (indices into the samples the graph runs on)
    b: Tensor  # its second samples
    outer: bool

    def sides(self, name: str) -> tuple[Tensor, Tensor]: ...  # slopes of a and b at gate layer ``name``, float64
    def bit_sides(self, name: str) -> tuple[Bits, Bits] | None: ...  # the same as bits (ReLU-type), else None
    def piece_sides(self, rule: PieceGate) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]: ...  # (s, c)
    def selections(self, name: str) -> Tensor: ...  # every sample's choices at a max pool or a max over a dim
    # [x selects unit j] of every sample at max pool ``name`` (``unit``: its flat index per output, ``valid``: real)
    def hits(self, name: str, j: int, unit: Tensor, valid: Tensor) -> Bits: ...


class Terms:
    """A pair value ``(P, C, *spatial)`` as ``Σ_t S_t ⊙ A_t(x) ⊙ A_t(x')`` for the pairs of a block: ``ctx.outer``
    (``P = R·Cc``: ``A_t(x)`` is ``(R, C, *spatial)``, ``A_t(x')`` ``(Cc, C, *spatial)``) or aligned pairs."""

    def __init__(self, ctx, shape: tuple[int, ...], terms: list[tuple[Tensor, Tensor | None, Tensor | None]]):
        self.ctx, self.shape, self.terms = ctx, shape, terms  # shape: (C, *spatial) of one pair
        self.rows, self.cols = len(ctx.a), len(ctx.b)
        self.pairs = self.rows * self.cols if ctx.outer else self.rows

    @classmethod
    def input(cls, ctx: FactoredContext, x: Tensor) -> Terms:
        """The pair input ``x ⊙ x'`` of the block: one term of the per-sample factors ``x[a]``, ``x[b]``."""
        return cls(ctx, tuple(x.shape[1:]), [(None, x[ctx.a], x[ctx.b])])

    @classmethod
    def of(cls, ctx, t: Tensor) -> Terms:
        """A plain pair value as one term (one channel of it when the channels are a broadcast view)."""
        if isinstance(t, Terms):
            return t
        s = t[:, :1] if t.shape[1] > 1 and t.stride(1) == 0 else t
        return cls(ctx, tuple(t.shape[1:]), [(s, None, None)])

    def _product(self, s: Tensor | None, first, second, out: Tensor | None = None) -> Tensor:
        """``S ⊙ A(x) ⊙ A(x')`` of one term, ``(P, C, *spatial)``; added into ``out`` (same shape) when given."""
        first, second = _dense(first), _dense(second)
        if not self.ctx.outer:
            product = s * first * second
            return product if out is None else out.add_(product)
        if s is None:  # the input term, only ever added into a value
            out.view(self.rows, self.cols, *self.shape).addcmul_(first[:, None], second[None])
            return out
        s = s.expand(self.pairs, *s.shape[1:]).reshape(self.rows, self.cols, *s.shape[1:])
        if out is None:
            return (s * first[:, None]).mul_(second[None]).reshape(self.pairs, *self.shape)
        view = out.view(self.rows, self.cols, *self.shape)
        view.addcmul_(s * first[:, None], second[None])
        return out

    def value(self) -> Tensor:
        """The plain pair value, ``(P, C, *spatial)``."""
        out = torch.zeros(self.pairs, *self.shape, dtype=torch.float64, device=self.ctx.a.device)
        for s, first, second in self.terms:
            if first is None:
                out += s
            else:
                self._product(s, first, second, out)
        return out

    def gate(self, first, second) -> Terms:
        """Every ``A_t`` times the slopes of the block's first and second samples (float64, or :class:`Bits`)."""
        return Terms(self.ctx, self.shape, [(s, _times(a, first), _times(b, second)) for s, a, b in self.terms])

    def plus_one(self) -> Terms:
        one = torch.ones((1,) * (1 + len(self.shape)), dtype=torch.float64, device=self.ctx.a.device)
        return Terms(self.ctx, self.shape, self.terms + [(one, None, None)])

    def __add__(self, other: Terms) -> Terms:
        return Terms(self.ctx, self.shape, self.terms + other.terms)

    def channel_sum(self) -> Tensor:
        """``Σ_c`` of the value, ``(P, 1, *spatial)``: overlaps by GEMMs over channels where a term has one
        channel of ``S``."""
        channels, spatial = self.shape[0], self.shape[1:]
        total = None
        for s, first, second in self.terms:
            if first is not None and (s is None or s.shape[1] == 1):
                overlap = self._overlap(first, second)  # a new tensor: the first term's product is formed in it
                if s is None:
                    total = overlap if total is None else total.add_(overlap)
                else:
                    total = overlap.mul_(s) if total is None and s.shape == overlap.shape else \
                        torch.mul(s, overlap) if total is None else total.addcmul_(s, overlap)
                continue
            if first is None:
                part = s.sum(1, keepdim=True) if s.shape[1] > 1 else s * channels
            else:
                part = self._product(s, first, second).sum(1, keepdim=True)
            total = part.expand(self.pairs, 1, *spatial).clone() if total is None else total.add_(part)
        if total is None:
            return torch.zeros(self.pairs, 1, *spatial, dtype=torch.float64, device=self.ctx.a.device)
        return total

    def _overlap(self, first, second) -> Tensor:
        return channel_overlap(first, second, self.ctx.outer).reshape(self.pairs, 1, *first.shape[2:])

    def max_pool(self, rule: MaxPool) -> Terms:
        """Each term split over the window units ``r`` (candidates of :meth:`MaxPool.candidates`)."""
        out_shape, in_spatial = tuple(self.ctx.selections(rule.name).shape[1:]), self.shape[1:]
        full = lambda s: s.expand(len(s), s.shape[1], *in_spatial)  # noqa: E731 (a shift's 1 is (1, 1, ...))
        terms = []
        for j, (unit, valid, pick) in enumerate(_units(rule, self.ctx.a.device, in_spatial, out_shape[1:])):
            hits = self.ctx.hits(rule.name, j, unit, valid)
            hit_first, hit_second = hits[self.ctx.a], hits[self.ctx.b]
            for s, a, b in self.terms:
                terms.append((_picked_map(s, pick, full), _picked(a, pick, hit_first), _picked(b, pick, hit_second)))
        return Terms(self.ctx, out_shape, terms)

    def line_max(self, rule: LineMax) -> Terms:
        """A max over a dim (:class:`~lightning_nsv.kernel.piece_rules.LineMax`): each term split over the candidates
        ``j`` of the line, ``S_t`` and ``A_t`` at ``j``, ``A_t`` times ``[x chooses j]``."""
        chosen = self.ctx.selections(rule.name)
        first, second = chosen[self.ctx.a], chosen[self.ctx.b]
        dim, terms = rule.dim, []

        def at(t, j):  # a map or factor at candidate j (a broadcast dim at its one entry), in the output's dims
            if t is None:
                return None
            t = _dense(t).select(dim, j if t.shape[dim] > 1 else 0)
            return t.unsqueeze(dim) if rule.keepdim else t

        for j in range(self.shape[dim - 1]):
            hit_first, hit_second = (first == j).to(torch.float64), (second == j).to(torch.float64)
            for s, a, b in self.terms:
                terms.append((at(s, j), _times(at(a, j), hit_first), _times(at(b, j), hit_second)))
        return Terms(self.ctx, tuple(first.shape[1:]), terms)


def _picked_map(s: Tensor | None, pick, full) -> Tensor | None:
    """A term's per-pair map at one window unit, contiguous (every overlap after the pool reads it; a strided view
    would bring all of ``s`` into the cache at each read)."""
    if s is None:
        return None
    picked = pick(full(s))
    return picked if pick.copies or len(s) == 1 or s.stride(1) == 0 else picked.contiguous()


def _dense(a):
    """A factor as float64 (``None`` stays ``None``)."""
    return a.float() if isinstance(a, Bits) else a


def _times(a, g):
    """The product of two factors (``None``: all ones), kept as bits when both are."""
    if a is None:
        return g
    if isinstance(a, Bits) and isinstance(g, Bits):
        return a & g
    return _dense(a) * _dense(g)


def _picked(a, pick, hit: Bits):
    """Factor ``a`` at one window unit (``pick``) times the samples' hit indicators of that unit."""
    if a is None:
        return hit
    if isinstance(a, Bits):
        return a.map_words(pick) & hit
    return pick(a).mul_(hit.float()) if pick.copies else pick(a) * hit.float()


def _units(rule: MaxPool, device, in_spatial: tuple[int, ...], out_spatial: tuple[int, ...]) -> list:
    """``(unit, valid, picker)`` for each window unit of ``rule``'s windows (:func:`_picker`); once per rule,
    device and shapes (kept on the rule, :attr:`MaxPool.units`)."""
    cache = rule.units
    key = (str(device), in_spatial, out_spatial)
    if key not in cache:
        candidates, valid = rule.candidates(device)
        cache[key] = [(candidates[:, j], valid[:, j], _picker(candidates[:, j], in_spatial, out_spatial,
                                                              bool(valid[:, j].all())))
                      for j in range(candidates.shape[1])]
    return cache[key]


def _picker(unit: Tensor, in_spatial: tuple[int, ...], out_spatial: tuple[int, ...], regular: bool):
    """``t[..., unit]`` over the flattened plane, reshaped to ``out_spatial``: a strided view when ``unit`` is a
    regular grid (a pool's window unit ``r`` at every output, stride ``s``), else a gather."""
    coords = torch.stack(torch.unravel_index(unit, in_spatial)).reshape(len(in_spatial), *out_spatial)
    if regular:
        slices = []
        for d in range(len(in_spatial)):
            line = coords[d].movedim(d, -1).reshape(-1, out_spatial[d])
            start = int(line[0, 0])
            step = int(line[0, 1] - line[0, 0]) if out_spatial[d] > 1 else 1
            expected = start + step * torch.arange(out_spatial[d], device=unit.device)
            if step < 1 or not bool((line == expected).all()):
                break
            slices.append(slice(start, start + step * (out_spatial[d] - 1) + 1, step))
        else:
            return _Pick(lambda t: t[(slice(None), slice(None), *slices)], copies=False)
    return _Pick(lambda t: t.flatten(2).index_select(2, unit).view(*t.shape[:2], *out_spatial), copies=True)


class _Pick:
    """A picker: ``copies`` when its result is a new tensor (a gather), not a view."""

    def __init__(self, fn, copies: bool) -> None:
        self.fn, self.copies = fn, copies

    def __call__(self, t: Tensor) -> Tensor:
        return self.fn(t)


def channel_overlap(first, second, outer: bool) -> Tensor:
    """``Σ_c first[i, c, p] second[j, c, p]``: ``(R, Cc, Q)`` for every pair when ``outer``, else ``(P, Q)`` for
    aligned rows (``Q`` the flattened positions); bit counts when both factors are :class:`Bits`."""
    if isinstance(first, Bits) and isinstance(second, Bits):
        return bit_overlap(first, second, outer)
    first, second = _dense(first), _dense(second)
    first, second = first.flatten(2), second.flatten(2)
    if not outer:
        return (first * second).sum(1)
    # one fused multiply-add per channel: a batched GEMM of tiny matrices, one per position, ran 2-5× slower (CPU)
    counts = torch.mul(first[:, None, 0], second[None, :, 0])
    for c in range(1, first.shape[1]):
        counts.addcmul_(first[:, None, c], second[None, :, c])
    return counts


def pair_shape(v) -> tuple[int, ...]:
    """The shape of one pair's value (a :class:`Terms` or a plain pair value)."""
    return v.shape if isinstance(v, Terms) else tuple(v.shape[1:])


def has_channels(v) -> bool:
    """Whether ``v`` is a pair value with channels and positions (the factored forms' domain)."""
    return isinstance(v, (Tensor, Terms)) and len(pair_shape(v)) >= 2


def plain(v):
    """``v`` with every :class:`Terms` summed into its plain pair value (through tuples, lists and dicts)."""
    return fx.node.map_aggregate(v, lambda t: t.value() if isinstance(t, Terms) else t)
