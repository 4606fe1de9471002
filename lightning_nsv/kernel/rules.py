"""The operation table of DESIGN.md §2c: one rule per piecewise-linear operation, in five modes (fx-mapped
arguments; dim 0 holds samples, pairs of samples or the single all-ones input):

- ``forward``: the float64 network; gates, max pools and selections record their choices (a ``ForwardContext``).
- ``pair``: the *pair network* on ``x ⊙ x'``: parameter edges 1, fixed constants squared, a shift adds 1, gates
  multiply by ``sigma(x) sigma(x')``, a max pool or selection passes what both samples choose (``ctx``: a
  :class:`~lightning_nsv.kernel.factored.PairContext`).
- ``factored``: the pair network with channels kept factored (:mod:`lightning_nsv.kernel.factored`): a value is a
  :class:`~lightning_nsv.kernel.factored.Terms` or a plain pair value (``ctx``: a
  :class:`~lightning_nsv.kernel.factored.FactoredContext`); by default the ``pair`` form on plain values.
- ``norm``: the *norm network* on ones: weights squared, fixed maps 1 on each edge (their constants are in ``phi``:
  the enumerated paths' ``||wbar||²`` agrees), gates 1, every window unit, a shift ``b`` adds ``b²``.
- ``program``: the pair network's form in the compiled program (``ctx``: a
  :class:`~lightning_nsv.kernel.pair_program.ProgramContext`), or :class:`~lightning_nsv.kernel.pair_code.NotFusable`.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_nsv.kernel.factored import Terms, has_channels, pair_shape, plain
from lightning_nsv.kernel.pair_code import NotFusable
from lightning_nsv.kernel.ties import near_ties
from lightning_nsv.kernel.slopes import gate_slopes
from lightning_nsv.kernel.windows import box_sum, conv2d_by_shifts, window_coefficient

__all__ = ["Rule", "box_sum", "conv2d_by_shifts", "window_coefficient"]

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


class Rule:
    """An operation of the table; ``where`` names it for messages (``layer1.0.conv: Conv2d``)."""

    kind = "operation"
    is_map = False  # a parameter map (counts in the scope summary)
    in_shape: tuple[int, ...] = ()  # of the first input-dependent argument and of the result, batch included (probe)
    out_shape: tuple[int, ...] = ()

    def __init__(self, where: str, call: Callable[..., Any]) -> None:
        self.where, self.call = where, call  # ``call(args, kwargs)``: the operation as the module computes it

    def bind(self, in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> None:
        """Shapes of the (first) dynamic input and of the output, batch included, from the trace's probe."""

    def forward(self, args, kwargs, ctx):
        return self.call(args, kwargs)

    def pair(self, args, kwargs, ctx):
        return self.call(args, kwargs)

    def factored(self, args, kwargs, ctx):
        """The factored form; by default the pair form on the plain values (every :class:`Terms` summed)."""
        return self.pair(plain(args), plain(kwargs), ctx)

    def norm(self, args, kwargs):
        return self.call(args, kwargs)

    def program(self, args, kwargs, ctx):
        raise NotFusable(f"{self.where}: {type(self).__name__} has no form in the pair program")


class Passthrough(Rule):
    """Reshapes, concatenation, sums of branches, identity, dropout in eval: the same operation in every mode.
    ``shape_kind`` says what it does to the entries (``view``: same order, ``permute``, ``select``: indexing,
    ``join``: concatenation, ``stack``); ``name`` is its fx node's."""

    kind = "shape"

    def __init__(self, where: str, call, shape_kind: str | None = None, name: str | None = None) -> None:
        super().__init__(where, call)
        self.shape_kind, self.name = shape_kind, name

    def program(self, args, kwargs, ctx):
        return ctx.reshape(self, args, kwargs)


class Meta(Rule):
    """Sizes and integer arithmetic on them (``x.size(0)``): evaluated as written, in every mode."""

    kind = "meta"

    def program(self, args, kwargs, ctx):
        return None  # sizes are read by shape operations, whose output shapes the probe knows


class Identity(Rule):
    kind = "identity"

    def __init__(self, where: str) -> None:
        super().__init__(where, lambda args, kwargs: args[0])

    def factored(self, args, kwargs, ctx):
        return args[0] if isinstance(args[0], Terms) else super().factored(args, kwargs, ctx)

    def program(self, args, kwargs, ctx):
        return args[0]


class Squeeze(Passthrough):
    """``squeeze()`` without a dim: squeezes the non-batch dims of size 1 in the probe (never the batch dim)."""

    dims: tuple[int, ...] | None = None

    def __init__(self, where: str) -> None:
        super().__init__(where, self._squeeze, "view")

    def _squeeze(self, args, kwargs):
        x = args[0]
        dims = self.dims if self.dims is not None else tuple(d for d in range(1, x.dim()) if x.shape[d] == 1)
        return x.squeeze(dims) if dims else x

    def bind(self, in_shape, out_shape):
        self.dims = tuple(d for d in range(1, len(in_shape)) if in_shape[d] == 1)


class BranchSum(Rule):
    """``a + b`` or ``a - b`` of two input-dependent tensors: a path goes through one branch, ``(±1)² = 1``."""

    kind = "sum"

    def pair(self, args, kwargs, ctx):
        return args[0] + args[1]

    def factored(self, args, kwargs, ctx):
        """The terms of both branches, joined (where one is factored and the shapes agree)."""
        a, b = args[0], args[1]
        if (isinstance(a, Terms) or isinstance(b, Terms)) and pair_shape(a) == pair_shape(b):
            return Terms.of(ctx, a) + Terms.of(ctx, b)
        return super().factored(args, kwargs, ctx)

    def norm(self, args, kwargs):
        return args[0] + args[1]

    def program(self, args, kwargs, ctx):
        return ctx.branch_sum(self, args[0], args[1])


class Gate(Rule):
    """Leaky-ReLU family (DESIGN.md §1) and PReLU: slope ``gamma`` where ``z >= 0`` (``0`` included), ``beta`` below
    (one number, or one per channel)."""

    kind = "gate"
    # set by the trace when the input is constant over channels (after a groups=1 conv) and the only reader sums
    # over channels (a groups=1 conv, or flatten then Linear): the pair value leaves with one channel (§2c "Speed")
    collapse = False

    def __init__(self, where: str, name: str, beta, gamma: float) -> None:
        super().__init__(where, None)  # beta: a number, or a float64 tensor of one slope per channel (PReLU)
        self.name, self.beta, self.gamma = name, beta if isinstance(beta, Tensor) else float(beta), float(gamma)

    def forward(self, args, kwargs, ctx):
        z = args[0]
        bits = z >= 0
        ctx.record(self.name, bits)
        if ctx.watch_ties:
            magnitude = z.abs()
            ctx.tie(near_ties(magnitude, magnitude))
        if isinstance(self.beta, Tensor):
            return z * gate_slopes(bits, self.beta, self.gamma)
        if self.beta == 0.0 and self.gamma == 1.0:
            return torch.relu(z)  # the same values, one pass (0 below, where 0·z would give -0)
        return torch.where(bits, self.gamma * z, self.beta * z)

    def pair(self, args, kwargs, ctx):
        if self.collapse and ctx.collapse:  # Σ_c v sigma_c(x) sigma_c(x') = v · C[p](x, x')
            return args[0][:, :1] * ctx.overlap(self.name).unsqueeze(1)
        return ctx.gate(self.name, args[0])

    def factored(self, args, kwargs, ctx):
        return self.factored_gate(args[0], args, kwargs, ctx)

    def factored_gate(self, v, args, kwargs, ctx):
        """The slopes on every factor of the terms of ``v`` (``len(a) + len(b)`` samples of work), bits where the
        layer is ReLU-type; a plain value that collapses, or one without channels, takes the pair form."""
        if has_channels(v) and not (self.collapse and ctx.collapse and isinstance(v, Tensor)):
            return Terms.of(ctx, v).gate(*(ctx.bit_sides(self.name) or ctx.sides(self.name)))
        return Rule.factored(self, args, kwargs, ctx)

    def norm(self, args, kwargs):
        return args[0]

    def program(self, args, kwargs, ctx):
        return ctx.gate(self, args[0])


class Linear(Rule):
    """``nn.Linear``: a parameter map over the last dim (pair: a sum, broadcast to every output unit)."""

    kind, is_map = "linear", True

    def __init__(self, where: str, weight: Tensor, bias: Tensor | None) -> None:
        super().__init__(where, None)
        self.weight, self.bias = weight, bias

    def forward(self, args, kwargs, ctx):
        return F.linear(args[0], self.weight, self.bias)

    def pair(self, args, kwargs, ctx):
        v = args[0].sum(-1, keepdim=True).expand(*args[0].shape[:-1], self.weight.shape[0])
        return v + 1.0 if self.bias is not None else v

    def norm(self, args, kwargs):
        return F.linear(args[0], self.weight ** 2, None if self.bias is None else self.bias ** 2)

    def program(self, args, kwargs, ctx):
        return ctx.linear(self, args[0])


class Conv(Rule):
    """``nn.ConvNd`` (zero padding): pair = channel sum within each group, then a box filter, copied to the group's
    output channels (+1 with a bias)."""

    kind, is_map = "conv", True

    def __init__(self, where: str, conv: torch.nn.Module, weight: Tensor, bias: Tensor | None) -> None:
        super().__init__(where, None)
        self.weight, self.bias = weight, bias
        self.n = weight.dim() - 2
        self.stride, self.dilation, self.groups = tuple(conv.stride), tuple(conv.dilation), conv.groups
        self.padding = conv.padding
        if conv.padding == "same":
            self.left = tuple(d * (k - 1) // 2 for d, k in zip(self.dilation, self.kernel))
        else:
            self.left = (0,) * self.n if conv.padding == "valid" else tuple(conv.padding)

    @property
    def kernel(self) -> tuple[int, ...]:
        return tuple(self.weight.shape[2:])

    def bind(self, in_shape, out_shape):
        if len(in_shape) != self.n + 2:
            raise ValueError(f"{self.where}: expects a batch of shape (n, C, ...{self.n} dims), got {in_shape}")
        self.out_size = tuple(out_shape[2:])

    def _conv(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        return _CONV[self.n](x, weight, bias, self.stride, self.padding, self.dilation, self.groups)

    def forward(self, args, kwargs, ctx):
        x = args[0]
        if self.n == 2 and self.groups == 1 and self.stride == self.dilation == (1, 1) and x.dtype == torch.float64 \
                and x.device.type == "cpu" and self.padding != "same" and not (torch.is_grad_enabled() and (
                    x.requires_grad or self.weight.requires_grad)):
            return conv2d_by_shifts(x, self.weight, self.bias, self.left)
        return self._conv(x, self.weight, self.bias)

    def pair(self, args, kwargs, ctx):
        v = args[0]
        g, c_out = self.groups, self.weight.shape[0]
        if v.shape[1] > g:  # a channel sum within each group (none to do with one channel a group)
            v = v.reshape(v.shape[0], g, v.shape[1] // g, *v.shape[2:]).sum(2)
        v = box_sum(v, self.kernel, self.stride, self.left, self.dilation, self.out_size)
        if self.bias is not None:
            v = v + 1.0
        if g == 1:  # every output channel holds the same values: a view
            return v.expand(v.shape[0], c_out, *self.out_size)
        return v.unsqueeze(2).expand(v.shape[0], g, c_out // g, *self.out_size).reshape(v.shape[0], c_out,
                                                                                        *self.out_size)

    def factored(self, args, kwargs, ctx):
        """groups=1 on terms: the pair form of their channel sum (overlaps by GEMMs over channels)."""
        if self.groups == 1 and isinstance(args[0], Terms):
            return self.pair((args[0].channel_sum(),), kwargs, ctx)
        return super().factored(args, kwargs, ctx)

    def norm(self, args, kwargs):
        return self._conv(args[0], self.weight ** 2, None if self.bias is None else self.bias ** 2)

    def program(self, args, kwargs, ctx):
        return ctx.conv(self, args[0])


class BatchNorm(Rule):
    """BatchNorm in eval mode: ``a·z + b``, ``a = γ/√(var+ε)`` a parameter edge, ``b = β − a·mean`` a shift."""

    kind, is_map = "batchnorm", True

    def __init__(self, where: str, scale: Tensor, shift: Tensor) -> None:
        super().__init__(where, None)
        self.scale, self.shift = scale, shift

    def _channel(self, t: Tensor, like: Tensor) -> Tensor:
        return t.view(1, -1, *([1] * (like.dim() - 2)))

    def forward(self, args, kwargs, ctx):
        z = args[0]
        return (z * self._channel(self.scale, z)).add_(self._channel(self.shift, z))  # the same rounding, one buffer

    def pair(self, args, kwargs, ctx):
        return args[0] + 1.0

    def factored(self, args, kwargs, ctx):
        """A term ``1``; on a plain value whose channels are a broadcast view (after a conv), a view still."""
        v = args[0]
        if isinstance(v, Terms):
            return v.plus_one()
        if isinstance(v, Tensor) and v.dim() > 2 and v.stride(1) == 0:
            return (v[:, :1] + 1.0).expand(v.shape)
        return super().factored(args, kwargs, ctx)

    def norm(self, args, kwargs):
        z = args[0]
        return z * self._channel(self.scale ** 2, z) + self._channel(self.shift ** 2, z)

    def program(self, args, kwargs, ctx):
        return ctx.shift(self, args[0])


class FixedMap(Rule):
    """A fixed linear map whose coefficients in each output unit are all equal, ``c_o``: average pooling, mean,
    sum, multiplication or division by a constant, negation. The constants go into ``phi`` (§2c table), so
    pair: ``Σ c_o² x = c_o · (A x)_o``; norm (``wbar`` has weight 1 on these edges): ``Σ x = (A x)_o / c_o``."""

    kind = "fixed"
    # set by the trace when the only reader is a flatten from dim 1 read only by a Linear (which sums every entry)
    summed = False

    def __init__(self, where: str, call, coefficient: Callable[[tuple, tuple], Any]) -> None:
        super().__init__(where, call)
        self._coefficient = coefficient  # (in_shape, out_shape) -> c_o, broadcastable to the output
        self.channelwise: bool | None = None  # Σ_c f(v)_c = f(Σ_c v_c) (:meth:`is_channelwise`), found once

    def bind(self, in_shape, out_shape):
        self.c = self._coefficient(in_shape, out_shape)
        if isinstance(self.c, Tensor):
            self.inverse = torch.where(self.c != 0, 1.0 / self.c, torch.zeros_like(self.c))
        else:
            self.inverse = 1.0 / self.c if self.c != 0 else 0.0

    def pair(self, args, kwargs, ctx):
        return self.call(args, kwargs) * self.c

    def factored(self, args, kwargs, ctx):
        """Read by a sum of every entry (:attr:`summed`) and channel-wise: the map of the terms' channel sum."""
        if self.summed and isinstance(args[0], Terms) and self.is_channelwise(args, kwargs, ctx.a.device):
            return self.channel_summed(args[0], args, kwargs, ctx)
        return super().factored(args, kwargs, ctx)

    def channel_summed(self, v: Terms, args, kwargs, ctx) -> Tensor:
        """The map of the channel sum (the terms' overlaps, not the plain value) in channel 0, zeros elsewhere: what
        a reader that sums every entry needs, as ``Σ_c f(v)_c = f(Σ_c v_c)`` for a channel-wise ``f``."""
        total = self.pair((v.channel_sum(), *args[1:]), kwargs, ctx)
        rest = total.new_zeros(len(total), v.shape[0] - 1, *total.shape[2:])
        return torch.cat([total, rest], 1)

    def is_channelwise(self, args, kwargs, device) -> bool:
        """Whether the map acts on each channel alike, ``Σ_c f(v)_c = f(Σ_c v_c)``, with one coefficient ``c_o``
        for all channels (checked once on random values: a linear map that is not channel-wise fails it almost
        surely)."""
        c = self.c
        if not isinstance(c, (int, float)) and not (isinstance(c, Tensor) and (
                c.numel() == 1 or (c.dim() == len(self.out_shape) and c.shape[1] == 1))):
            return False
        if self.channelwise is None:
            shape = tuple(self.in_shape[1:])
            probe = torch.randn(2, *shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
            probe = probe.to(device)
            out = self.call((probe, *args[1:]), kwargs)
            ok = out.dim() == probe.dim() and out.shape[1] == shape[0] and len(shape) >= 2
            if ok:
                summed = self.call((probe.sum(1, keepdim=True), *args[1:]), kwargs)
                ok = summed.shape == out.sum(1, keepdim=True).shape and \
                    bool(torch.allclose(summed, out.sum(1, keepdim=True), rtol=1e-10, atol=1e-10))
            self.channelwise = ok
        return self.channelwise

    def norm(self, args, kwargs):
        return self.call(args, kwargs) * self.inverse

    def program(self, args, kwargs, ctx):
        return ctx.fixed_map(self, args, kwargs)


class PlaneMap(Rule):
    """A fixed linear map acting alike on each channel's plane, with any coefficients (interpolation, reflection,
    replication or circular padding): its matrix ``D`` on one plane, probed at :meth:`bind`. Its constants go into
    ``phi`` (§2c), so pair: ``D∘D`` (every entry squared) on each channel; norm: the indicator of ``D``'s entries
    (weight 1 on each edge)."""

    kind = "fixed"

    def __init__(self, where: str, call, plane: Callable[[Tensor], Tensor], device) -> None:
        super().__init__(where, call)
        self.plane, self.device = plane, device  # plane(x): the map on a batch of one-channel planes

    def bind(self, in_shape, out_shape):
        from lightning_nsv.kernel.pair_probes import probe_plane

        self.sparse, self.n_out = probe_plane(self.where, self.plane, tuple(in_shape[1:]), tuple(out_shape[1:]),
                                              self.device)
        self.out_spatial = tuple(out_shape[2:])

    def _apply(self, v: Tensor, squared: bool) -> Tensor:
        rows, cols, weights = (torch.as_tensor(t, device=v.device) for t in self.sparse)
        w = weights.to(v.dtype) ** 2 if squared else torch.ones_like(weights, dtype=v.dtype)
        flat = v.reshape(*v.shape[:2], -1)
        out = flat.new_zeros(*v.shape[:2], self.n_out).index_add_(2, rows, flat[:, :, cols] * w)
        return out.reshape(*v.shape[:2], *self.out_spatial)

    def pair(self, args, kwargs, ctx):
        return self._apply(args[0], squared=True)

    def norm(self, args, kwargs):
        return self._apply(args[0], squared=False)

    def program(self, args, kwargs, ctx):
        return ctx.plane_map(self, args[0])


class ParamScale(Rule):
    """``x * p`` or ``x / p`` for a learnable ``p`` (broadcast): a parameter edge (pair: 1, norm: ``p²``)."""

    kind, is_map = "scale", True

    def __init__(self, where: str, call, position: int, param: Tensor, divide: bool) -> None:
        super().__init__(where, call)
        self.position, self.param, self.divide = position, param, divide  # position of the input-dependent arg

    def pair(self, args, kwargs, ctx):
        return args[self.position] * torch.ones_like(self.param)

    def norm(self, args, kwargs):
        x = args[self.position]
        return x / self.param ** 2 if self.divide else x * self.param ** 2

    def program(self, args, kwargs, ctx):
        return ctx.same_shape(self, args[self.position])


class Shift(Rule):
    """``x ± b`` or ``b − x`` for a parameter, buffer or number ``b`` (broadcast): a path starts at every unit it
    feeds, ``wbar`` gets ``b`` (DESIGN.md §2c). Pair: ``x + 1``; norm: ``x + b²``."""

    kind = "shift"

    def __init__(self, where: str, call, position: int, value) -> None:
        super().__init__(where, call)
        self.position, self.value = position, value  # position of the input-dependent argument

    def pair(self, args, kwargs, ctx):
        one = torch.ones_like(self.value) if isinstance(self.value, Tensor) else 1.0
        return args[self.position] + one

    def norm(self, args, kwargs):
        return args[self.position] + self.value ** 2

    def program(self, args, kwargs, ctx):
        return ctx.shift(self, args[self.position])
