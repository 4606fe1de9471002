"""The operation table of DESIGN.md §2c: one rule per piecewise-linear operation.

Every rule evaluates its operation in three modes, on the values of its (fx-mapped) arguments:

- ``forward``: the float64 network itself; gates record their slope bits, max pools their selections.
- ``pair``: the *pair network* (run on ``x ⊙ x'``): every parameter edge 1, every fixed constant squared, a shift
  (bias, added parameter or constant) adds 1, gates multiply by ``sigma(x) sigma(x')``, a max pool passes the unit
  both samples select.
- ``norm``: the *norm network* (run on ones): every weight squared, every fixed map with coefficient 1 on each of
  its edges, gates 1, max pools pass every window unit, a shift ``b`` adds ``b²`` — its output is ``||wbar||²``.
  Fixed constants (1/k of an average, c of ``c·x``) are in ``phi`` (§2c table), so ``wbar`` has 1 on their edges;
  DESIGN.md §2c's "every fixed constant squared" would belong with constants in ``wbar`` and a kernel without
  them (the enumerated paths decide: ``||wbar||²`` of the enumeration matches this rule).

The batch dimension (0) holds samples, pairs of samples or the single all-ones input.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["Rule"]

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


class Passthrough(Rule):
    """Reshapes, concatenation, sums of branches, identity, dropout in eval: the same operation in every mode."""

    kind = "shape"


class Meta(Rule):
    """Sizes and integer arithmetic on them (``x.size(0)``): evaluated as written, in every mode."""

    kind = "meta"


class Identity(Rule):
    kind = "identity"

    def __init__(self, where: str) -> None:
        super().__init__(where, lambda args, kwargs: args[0])


class Squeeze(Passthrough):
    """``squeeze()`` without a dim: squeezes the non-batch dims of size 1 in the probe (never the batch dim)."""

    dims: tuple[int, ...] | None = None

    def __init__(self, where: str) -> None:
        super().__init__(where, self._squeeze)

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


class Gate(Rule):
    """Leaky-ReLU family (DESIGN.md §1): slope ``gamma`` where ``z >= 0`` (``0`` included), ``beta`` below."""

    kind = "gate"
    # set by the trace when the input is constant over channels (after a groups=1 conv) and the only reader sums
    # over channels (a groups=1 conv, or flatten then Linear): the pair value leaves with one channel (§2c "Speed")
    collapse = False

    def __init__(self, where: str, name: str, beta: float, gamma: float) -> None:
        super().__init__(where, None)
        self.name, self.beta, self.gamma = name, float(beta), float(gamma)

    def forward(self, args, kwargs, ctx):
        z = args[0]
        bits = z >= 0
        ctx.record(self.name, bits)
        return torch.where(bits, self.gamma * z, self.beta * z)

    def pair(self, args, kwargs, ctx):
        if self.collapse and ctx.collapse:  # Σ_c v sigma_c(x) sigma_c(x') = v · C[p](x, x')
            return args[0][:, :1] * ctx.overlap(self.name).unsqueeze(1)
        return ctx.gate(self.name, args[0])

    def norm(self, args, kwargs):
        return args[0]


def box_sum(v: Tensor, kernel: Sequence[int], stride: Sequence[int], left: Sequence[int],
            dilation: Sequence[int], out_size: Sequence[int]) -> Tensor:
    """Window sums of each channel of ``v`` (``(B, C, *spatial)``): zero padding ``left`` before each spatial dim (as
    much as needed after it), ``out_size`` windows per dim. Separable: per dim, a sum of ``k`` strided slices (a
    float64 convolution with a ones kernel is several times slower on a CPU); a dim of stride 1 adds the slices that
    overlap the input without forming the padded copy."""
    if all(s == 1 for s in stride):
        for d in range(len(kernel)):
            v = _box_line(v, 2 + d, kernel[d], dilation[d], left[d], out_size[d])
        return v
    pads: list[int] = []
    for d in reversed(range(len(kernel))):  # F.pad lists the last dim first
        need = (out_size[d] - 1) * stride[d] + dilation[d] * (kernel[d] - 1) + 1
        pads += [left[d], max(0, need - v.shape[2 + d] - left[d])]
    if any(pads):
        v = F.pad(v, pads)
    for d in range(len(kernel)):
        axis, length = 2 + d, (out_size[d] - 1) * stride[d] + 1
        step = (slice(None),) * axis + (slice(None, None, stride[d]),)
        total = None
        for i in range(kernel[d]):
            part = v.narrow(axis, i * dilation[d], length)[step]
            total = part.clone() if total is None else total.add_(part)
        v = total
    return v


def conv2d_by_shifts(x: Tensor, weight: Tensor, bias: Tensor | None, pad: Sequence[int]) -> Tensor:
    """A stride-1 2D convolution with zero padding ``pad``, as one GEMM ``(L, C_in) @ (C_in, C_out)`` per kernel
    offset over the padded images, channels last and flattened: the output at row ``r`` reads rows ``r + i·W + j``,
    which stay within ``r``'s image for every position kept (float64 on a CPU: several times faster than torch's
    convolution, equal up to the order of the sums)."""
    n, _, h, w = x.shape
    c_out, _, kh, kw = weight.shape
    big_h, big_w = h + 2 * pad[0], w + 2 * pad[1]
    out_h, out_w = big_h - kh + 1, big_w - kw + 1
    flat = F.pad(x, (pad[1], pad[1], pad[0], pad[0])).permute(0, 2, 3, 1).reshape(n * big_h * big_w, -1)
    rows = (n - 1) * big_h * big_w + (out_h - 1) * big_w + out_w  # the last kept output is row rows - 1
    out = x.new_empty(n * big_h * big_w, c_out)
    for i in range(kh):
        for j in range(kw):
            part, taps = flat[i * big_w + j:i * big_w + j + rows], weight[:, :, i, j].T
            torch.mm(part, taps, out=out[:rows]) if i == j == 0 else out[:rows].addmm_(part, taps)
    out = out.view(n, big_h, big_w, c_out)[:, :out_h, :out_w].permute(0, 3, 1, 2).contiguous()
    return out if bias is None else out.add_(bias.view(1, -1, 1, 1))


def _box_line(v: Tensor, axis: int, k: int, dilation: int, left: int, out: int) -> Tensor:
    """Stride-1 window sums along ``axis``: ``out[i] = Σ_t v[i + t·dilation - left]`` over the entries inside ``v``;
    a slice that covers every output starts the sum (no zero fill of the borders, a strided write along the last
    dim)."""
    n = v.shape[axis]
    spans = []  # (lo, hi, offset): outputs lo..hi-1 read v at i + offset
    for t in range(k):
        offset = t * dilation - left
        lo, hi = max(0, -offset), min(out, n - offset)
        if hi > lo:
            spans.append((lo, hi, offset))
    if not spans:
        return v.new_zeros((*v.shape[:axis], out, *v.shape[axis + 1:]))
    spans.sort(key=lambda span: span[1] - span[0] < out)  # a full span first, if there is one
    lo, hi, offset = spans[0]
    shape = (*v.shape[:axis], out, *v.shape[axis + 1:])
    rest = spans[1:]  # the spans added after the first
    if hi - lo == out and rest:  # the full span and the next one summed in one pass
        full, (lo, hi, offset), rest = v.narrow(axis, offset, out), rest[0], rest[1:]
        total = v.new_empty(shape)
        torch.add(full.narrow(axis, lo, hi - lo), v.narrow(axis, lo + offset, hi - lo),
                  out=total.narrow(axis, lo, hi - lo))
        for start, stop in ((0, lo), (hi, out)):  # the border entries of the full span alone
            if stop > start:
                total.narrow(axis, start, stop - start).copy_(full.narrow(axis, start, stop - start))
    elif hi - lo == out:
        total = v.narrow(axis, offset, out).clone()
    else:
        total = v.new_zeros(shape)
        total.narrow(axis, lo, hi - lo).copy_(v.narrow(axis, lo + offset, hi - lo))
    for lo, hi, offset in rest:
        total.narrow(axis, lo, hi - lo).add_(v.narrow(axis, lo + offset, hi - lo))
    return total


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


def window_coefficient(pool: Callable[[Tensor], Tensor], in_shape: tuple[int, ...], device) -> Tensor:
    """``c_o`` of a channel-wise pool with equal coefficients in each window (average pooling): the largest response
    of output ``o`` to the unit inputs of one channel. Shape ``(1, 1, *out)``. Once per trace; cost ``units²`` per
    plane (seconds for a 112×112 plane)."""
    spatial = tuple(in_shape[2:])
    units = math.prod(spatial)
    step = max(1, (8 << 20) // units)  # unit inputs per call: about 64 MiB of float64
    best = None
    for lo in range(0, units, step):
        basis = torch.zeros(min(step, units - lo), units, dtype=torch.float64, device=device)
        basis[torch.arange(len(basis)), torch.arange(lo, lo + len(basis))] = 1.0
        out = pool(basis.view(len(basis), 1, *spatial)).amax(0, keepdim=True)
        best = out if best is None else torch.maximum(best, out)
    return best


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
        return out

    def pair(self, args, kwargs, ctx):
        return ctx.pool(self.name, args[0])

    def norm(self, args, kwargs):
        return self.window_sum(args[0], self.out_shape)

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
