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

Any other operation sees the terms summed into the plain pair value (:meth:`Terms.value`) and runs its rule of
:mod:`lightning_nsv.kernel.rules`. The result equals the plain pair network up to rounding (tested to 1e-12).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
from torch import Tensor

from lightning_nsv.kernel import rules as R
from lightning_nsv.kernel.bitmasks import Bits, bit_overlap
from lightning_nsv.kernel.piece_rules import LineMax, PieceGate, TakeValues, WhereGate

__all__ = ["Terms", "channel_overlap", "run_factored"]


class Terms:
    """A pair value ``(P, C, *spatial)`` as ``Σ_t S_t ⊙ A_t(x) ⊙ A_t(x')`` for the pairs of a block: ``ctx.outer``
    (``P = R·Cc``: ``A_t(x)`` is ``(R, C, *spatial)``, ``A_t(x')`` ``(Cc, C, *spatial)``) or aligned pairs."""

    def __init__(self, ctx, shape: tuple[int, ...], terms: list[tuple[Tensor, Tensor | None, Tensor | None]]):
        self.ctx, self.shape, self.terms = ctx, shape, terms  # shape: (C, *spatial) of one pair
        self.rows, self.cols = len(ctx.a), len(ctx.b)
        self.pairs = self.rows * self.cols if ctx.outer else self.rows

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

    def max_pool(self, rule: R.MaxPool) -> Terms:
        """Each term split over the window units ``r`` (candidates of :meth:`MaxPool.candidates`)."""
        gates = self.ctx.gates
        out_shape, in_spatial = tuple(gates.selections[rule.name].shape[1:]), self.shape[1:]
        full = lambda s: s.expand(len(s), s.shape[1], *in_spatial)  # noqa: E731 (a shift's 1 is (1, 1, ...))
        terms = []
        for j, (unit, valid, pick) in enumerate(_units(rule, self.ctx.a.device, in_spatial, out_shape[1:])):
            hits = gates.hits(rule.name, j, unit, valid)
            hit_first, hit_second = hits[self.ctx.a], hits[self.ctx.b]
            for s, a, b in self.terms:
                terms.append((_picked_map(s, pick, full), _picked(a, pick, hit_first), _picked(b, pick, hit_second)))
        return Terms(self.ctx, out_shape, terms)

    def line_max(self, rule) -> Terms:
        """A max over a dim (:class:`~lightning_nsv.kernel.piece_rules.LineMax`): each term split over the candidates
        ``j`` of the line, ``S_t`` and ``A_t`` at ``j``, ``A_t`` times ``[x chooses j]``."""
        chosen = self.ctx.gates.selections[rule.name]
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


def _units(rule: R.MaxPool, device, in_spatial: tuple[int, ...], out_spatial: tuple[int, ...]) -> list:
    """``(unit, valid, picker)`` for each window unit of ``rule``'s windows (:func:`_picker`); once per rule,
    device and shapes (kept on the rule)."""
    cache = rule.__dict__.setdefault("_factored_units", {})
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


def _step(rule: R.Rule, args, kwargs, ctx, summed: bool = False) -> Any:
    """One node of the factored run: the factored form where it pays, else the rule on plain values. ``summed``:
    every entry of the node's value is summed by its reader (:func:`_summed_by_reader`)."""
    first = args[0] if args else None
    if summed and isinstance(rule, R.FixedMap) and isinstance(first, Terms) and _channelwise(rule, args, kwargs):
        return _channel_summed(rule, first, args, kwargs, ctx)
    if isinstance(rule, WhereGate):
        first = args[rule.position]
    if isinstance(rule, TakeValues):
        return first[0]
    spatial = isinstance(first, (Tensor, Terms)) and len(_shape(first)) >= 2
    if isinstance(rule, R.Gate) and spatial and not (rule.collapse and ctx.collapse and isinstance(first, Tensor)):
        return Terms.of(ctx, first).gate(*(ctx.bit_sides(rule.name) or ctx.sides(rule.name)))
    if isinstance(rule, LineMax) and spatial and len(rule.out_shape) >= 2:
        out = Terms.of(ctx, first).line_max(rule)
        return (out, None) if rule.with_indices else out
    if isinstance(rule, PieceGate) and spatial:  # the slopes on every factor, the flat values a term of their own
        (s_first, c_first), (s_second, c_second) = ctx.piece_sides(rule)
        gated = Terms.of(ctx, first).gate(s_first, s_second)
        return gated + Terms(ctx, gated.shape, [(None, c_first, c_second)]) if rule.starts else gated
    if isinstance(first, Terms):
        if isinstance(rule, R.Conv) and rule.groups == 1:
            return rule.pair((first.channel_sum(),), kwargs, ctx)
        if isinstance(rule, R.BatchNorm):
            return first.plus_one()
        if isinstance(rule, R.MaxPool):
            return first.max_pool(rule)
        if isinstance(rule, R.Identity):
            return first
    if isinstance(rule, R.BranchSum) and any(isinstance(a, Terms) for a in args[:2]) and \
            _shape(args[0]) == _shape(args[1]):
        return Terms.of(ctx, args[0]) + Terms.of(ctx, args[1])
    if isinstance(rule, R.BatchNorm) and isinstance(first, Tensor) and first.dim() > 2 and first.stride(1) == 0:
        return (first[:, :1] + 1.0).expand(first.shape)  # keep a conv's broadcast channels a view
    plain = lambda v: v.value() if isinstance(v, Terms) else v  # noqa: E731
    return rule.pair(fx.node.map_aggregate(args, plain), fx.node.map_aggregate(kwargs, plain), ctx)


def _channel_summed(rule: R.FixedMap, first: Terms, args, kwargs, ctx) -> Tensor:
    """The fixed map of the channel sum (the terms' overlaps, not the plain value) in channel 0, zeros elsewhere:
    what a reader that sums every entry needs, as ``Σ_c f(v)_c = f(Σ_c v_c)`` for a channel-wise ``f``."""
    total = rule.pair((first.channel_sum(), *args[1:]), kwargs, ctx)
    rest = total.new_zeros(len(total), first.shape[0] - 1, *total.shape[2:])
    return torch.cat([total, rest], 1)


def _channelwise(rule: R.FixedMap, args, kwargs) -> bool:
    """Whether the map acts on each channel alike, ``Σ_c f(v)_c = f(Σ_c v_c)``, with one coefficient ``c_o`` for
    all channels (checked once per rule on random values: a linear map that is not channel-wise fails it almost
    surely)."""
    c = getattr(rule, "c", None)
    if not isinstance(c, (int, float)) and not (isinstance(c, Tensor) and (
            c.numel() == 1 or (c.dim() == len(rule.out_shape) and c.shape[1] == 1))):
        return False
    if getattr(rule, "_channelwise", None) is None:
        shape = tuple(rule.in_shape[1:])
        probe = torch.randn(2, *shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        probe = probe.to(args[0].ctx.a.device)
        out = rule.call((probe, *args[1:]), kwargs)
        ok = out.dim() == probe.dim() and out.shape[1] == shape[0] and len(shape) >= 2
        if ok:
            summed = rule.call((probe.sum(1, keepdim=True), *args[1:]), kwargs)
            ok = summed.shape == out.sum(1, keepdim=True).shape and \
                bool(torch.allclose(summed, out.sum(1, keepdim=True), rtol=1e-10, atol=1e-10))
        rule._channelwise = ok
    return rule._channelwise


def _summed_by_reader(node: fx.Node, graph) -> bool:
    """Whether the node's only reader is a flatten from dim 1 whose only reader is a Linear (whose pair rule sums
    every entry of its input)."""
    if len(node.users) != 1:
        return False
    flat = next(iter(node.users))
    if len(flat.users) != 1 or not flat.args or flat.args[0] is not node or \
            not isinstance(graph.rules.get(next(iter(flat.users)).name), R.Linear):
        return False
    if flat.op == "call_module" and flat.graph.owning_module is not None:
        module = flat.graph.owning_module.get_submodule(flat.target)
        return isinstance(module, torch.nn.Flatten) and (module.start_dim, module.end_dim) == (1, -1)
    if flat.op not in ("call_method", "call_function") or flat.target not in ("flatten", torch.flatten):
        return False
    start = flat.args[1] if len(flat.args) > 1 else flat.kwargs.get("start_dim", 0)
    end = flat.args[2] if len(flat.args) > 2 else flat.kwargs.get("end_dim", -1)
    return start == 1 and end == -1


def _shape(v) -> tuple[int, ...]:
    return v.shape if isinstance(v, Terms) else tuple(v.shape[1:])


def run_factored(graph, x: Tensor, ctx) -> Tensor:
    """The pair network of ``graph`` on the samples ``x`` (``(m, *input_shape)``) for the pairs of ``ctx`` (an
    outer block), channels factored: the loop of :func:`lightning_nsv.kernel.graph.run` with :func:`_step` in place
    of ``rule.pair``, the pair input ``x ⊙ x'`` one term of the per-sample factors ``x[a]``, ``x[b]``."""
    x = Terms(ctx, tuple(x.shape[1:]), [(None, x[ctx.a], x[ctx.b])])
    env: dict[fx.Node, Any] = {}
    look_up = env.__getitem__
    summed = graph.__dict__.get("_summed_by_reader")
    if summed is None:  # a property of the graph: found once
        summed = graph.__dict__["_summed_by_reader"] = {node: _summed_by_reader(node, graph) for node in graph.nodes}
    for node, dead in zip(graph.nodes, graph.frees):
        if node.op == "output":
            out = env[node.args[0]]
            return out.value() if isinstance(out, Terms) else out
        env[node] = x if node.op == "placeholder" else graph.consts[node.target] if node.op == "get_attr" else \
            _step(graph.rules[node.name], fx.node.map_arg(node.args, look_up), fx.node.map_arg(node.kwargs, look_up),
                  ctx, summed[node])
        for name in dead:
            del env[name]
    raise AssertionError("an fx graph ends with its output node")
