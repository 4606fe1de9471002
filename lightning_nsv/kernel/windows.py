"""Window sums and a stride-1 convolution as plain tensor operations, for the rules of
:mod:`lightning_nsv.kernel.rules` (the pair network's box filters, the float64 forward's convolutions)."""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["box_sum", "conv2d_by_shifts", "window_coefficient"]


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
    """A stride-1 2D convolution with zero padding ``pad``, as one batched GEMM ``(C_out, C_in) @ (C_in, L)`` per
    kernel offset over each padded image flattened: the output at flat position ``r`` reads positions
    ``r + i·W + j``, which stay within its row for every position kept (float64 on a CPU: several times faster than
    torch's convolution, equal up to the order of the sums; no channels-last copies: 32×32 maps of 16 channels 0.15
    ms a sample against 0.25 for GEMMs over channels-last rows)."""
    n, c_in, h, w = x.shape
    c_out, _, kh, kw = weight.shape
    big_h, big_w = h + 2 * pad[0], w + 2 * pad[1]
    out_h, out_w = big_h - kh + 1, big_w - kw + 1
    flat = F.pad(x, (pad[1], pad[1], pad[0], pad[0])).reshape(n, c_in, big_h * big_w)
    length = (out_h - 1) * big_w + out_w  # the last kept output is at length - 1
    out = x.new_empty(n, c_out, out_h * big_w)
    kept = out[:, :, :length]
    for i in range(kh):
        for j in range(kw):
            part, taps = flat[:, :, i * big_w + j:i * big_w + j + length], weight[:, :, i, j].expand(n, c_out, c_in)
            torch.bmm(taps, part, out=kept) if i == j == 0 else kept.baddbmm_(taps, part)
    out = out.view(n, c_out, out_h, big_w)[:, :, :, :out_w].contiguous()
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
