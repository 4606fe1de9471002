"""The operation table of DESIGN.md §2c: one rule per piecewise-linear operation, in four modes (fx-mapped
arguments; dim 0 holds samples, pairs of samples or the single all-ones input):

- ``forward``: the float64 network; gates, max pools and selections record their choices (a ``ForwardContext``).
- ``pair``: the *pair network* on ``x ⊙ x'``: parameter edges 1, fixed constants squared, a shift adds 1, gates
  multiply by ``sigma(x) sigma(x')``, a max pool or selection passes what both samples choose.
- ``norm``: the *norm network* on ones: weights squared, fixed maps 1 on each edge (their constants are in ``phi``:
  the enumerated paths' ``||wbar||²`` agrees), gates 1, every window unit, a shift ``b`` adds ``b²``.
- ``program``: the pair network's form in the compiled program (``ctx``: a
  :class:`~lightning_nsv.kernel.pair_program.ProgramContext`), or :class:`~lightning_nsv.kernel.pair_code.NotFusable`.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

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
            ctx.tie(near_ties(z.abs(), z))
        if isinstance(self.beta, Tensor):
            return z * gate_slopes(bits, self.beta, self.gamma)
        if self.beta == 0.0 and self.gamma == 1.0:
            return torch.relu(z)  # the same values, one pass (0 below, where 0·z would give -0)
        return torch.where(bits, self.gamma * z, self.beta * z)

    def pair(self, args, kwargs, ctx):
        if self.collapse and ctx.collapse:  # Σ_c v sigma_c(x) sigma_c(x') = v · C[p](x, x')
            return args[0][:, :1] * ctx.overlap(self.name).unsqueeze(1)
        return ctx.gate(self.name, args[0])

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
        return z * self._channel(self.scale, z) + self._channel(self.shift, z)

    def pair(self, args, kwargs, ctx):
        return args[0] + 1.0

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

    def __init__(self, where: str, call, coefficient: Callable[[tuple, tuple], Any]) -> None:
        super().__init__(where, call)
        self._coefficient = coefficient  # (in_shape, out_shape) -> c_o, broadcastable to the output

    def bind(self, in_shape, out_shape):
        self.c = self._coefficient(in_shape, out_shape)
        if isinstance(self.c, Tensor):
            self.inverse = torch.where(self.c != 0, 1.0 / self.c, torch.zeros_like(self.c))
        else:
            self.inverse = 1.0 / self.c if self.c != 0 else 0.0

    def pair(self, args, kwargs, ctx):
        return self.call(args, kwargs) * self.c

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

    def program(self, args, kwargs, ctx):
        return ctx.max_pool(self, args[0])

    def candidates(self, device) -> tuple[Tensor, Tensor]:
        """The units of each output's window within a channel's plane (flat indices), ``(outputs, k)`` int64,
        and which are real (windows of an adaptive pool differ in size), from :attr:`window_sum` on the unit
        inputs; once per rule."""
        if getattr(self, "_candidates", None) is None or self._candidates[0].device != torch.device(device):
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
