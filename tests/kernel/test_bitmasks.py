"""Packed 0/1 factors of the pair network (lightning_nsv.kernel.bitmasks) against float64 brute force."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from lightning_nsv.kernel import bitmasks as B
from lightning_nsv.kernel import factored as F
from lightning_nsv.models.residual import SmallResNet
from tests.kernel.test_pair_factored import both
from tests.kernel.test_pair_network import inputs, randomise_bn, relative


def brute_overlap(a: torch.Tensor, b: torch.Tensor, outer: bool) -> torch.Tensor:
    a, b = a.reshape(*a.shape[:2], -1), b.reshape(*b.shape[:2], -1)
    if not outer:
        return (a * b).sum(1)
    return (a[:, None] * b[None]).sum(2)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 4), cols=st.integers(1, 4), channels=st.integers(1, 40),
       spatial=st.lists(st.integers(1, 5), min_size=0, max_size=2), density=st.sampled_from([0.0, 0.3, 0.9, 1.0]),
       scales=st.sampled_from([(1.0, 1.0), (2.0, 0.5), (1.5, 3.0)]), seed=st.integers(0, 2 ** 16))
def test_overlap_and_unpacking_equal_float_brute_force(rows, cols, channels, spatial, density, scales, seed):
    """Any channel count (one word, several, a partial last word), all-ones words (the int16 sign bit), scales."""
    gen = torch.Generator().manual_seed(seed)
    mask_a = torch.rand(rows, channels, *spatial, generator=gen) < density
    mask_b = torch.rand(cols, channels, *spatial, generator=gen) < density
    a, b = B.Bits.pack(mask_a, scales[0]), B.Bits.pack(mask_b, scales[1])
    dense_a, dense_b = mask_a.double() * scales[0], mask_b.double() * scales[1]
    assert a.shape == tuple(mask_a.shape) and len(a) == rows
    assert torch.equal(a.float(), dense_a) and torch.equal(b.float(), dense_b)
    assert torch.equal(B.bit_overlap(a, b, outer=True), brute_overlap(dense_a, dense_b, True))
    aligned = B.Bits.pack(mask_b[:1].expand(rows, *mask_b.shape[1:]), scales[1])
    assert torch.equal(B.bit_overlap(a, aligned, outer=False), brute_overlap(dense_a, aligned.float(), False))
    both_masks = a & B.Bits.pack(mask_a.flip(0), 2.0)
    assert torch.equal(both_masks.float(), dense_a * mask_a.flip(0).double() * 2.0)


def test_popcount_of_every_int16_word():
    """All 65,536 words, the sign bit's included: the shifts, the wrap-around and the final multiply are exact."""
    from lightning_nsv.kernel.bitmasks import _popcount_

    words = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    expected = torch.tensor([bin(w & 0xFFFF).count("1") for w in range(-32768, 32768)], dtype=torch.int16)
    assert torch.equal(_popcount_(words.clone()), expected)


def test_a_full_word_counts_sixteen():
    ones = B.Bits.pack(torch.ones(1, 16, 3, dtype=torch.bool))
    assert int(ones.words.min()) == -1  # every bit of the int16 word, the sign bit included
    assert B.bit_overlap(ones, ones, outer=True).tolist() == [[[16.0, 16.0, 16.0]]]


@pytest.mark.parametrize("beta, gamma, expect_bits", [(0.0, 1.0, True), (0.0, 1.5, True), (0.1, 1.0, False)])
def test_relu_type_gates_take_the_bit_counts_and_keep_the_kernel(beta, gamma, expect_bits, monkeypatch):
    """ReLU-type gates (slope 0 below) and max-pool hits are counted as bits, leaky ones in float64; both give the
    plain pair network's kernel."""
    torch.manual_seed(0)
    net = randomise_bn(SmallResNet(2, 1, 18, (1, 1), beta=beta, gamma=gamma)).eval()  # 18 channels: two words
    x = inputs((2, 8, 8), n=5)
    fast, plain = both(net, x)
    calls = []
    original = B.bit_overlap
    monkeypatch.setattr(F, "bit_overlap", lambda *args: calls.append(1) or original(*args))
    columns = fast.columns_tensor([0, 3, 4])
    assert bool(calls) == expect_bits
    assert relative(columns, plain.columns_tensor([0, 3, 4])) < 1e-13
    assert relative(fast.block([1, 2]), plain.block([1, 2])) < 1e-13


@settings(max_examples=60, deadline=None)
@given(dims=st.integers(1, 2), size=st.integers(1, 7), k=st.integers(1, 4), stride=st.integers(1, 3),
       dilation=st.integers(1, 2), pad=st.integers(0, 3), seed=st.integers(0, 2 ** 16))
def test_box_sum_is_a_ones_convolution(dims, size, k, stride, dilation, pad, seed):
    """Window sums (the pair rule of a convolution) equal a float64 convolution with a ones kernel, with and
    without the stride-1 route that skips the padded copy."""
    from lightning_nsv.kernel.rules import box_sum

    span = dilation * (k - 1) + 1
    if size + 2 * pad < span:
        return
    v = torch.randn(2, 3, *(size,) * dims, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    conv = {1: torch.nn.functional.conv1d, 2: torch.nn.functional.conv2d}[dims]
    ones = torch.ones(3, 1, *(k,) * dims, dtype=torch.float64)
    reference = conv(v, ones, None, stride, pad, dilation, 3)
    out = box_sum(v, (k,) * dims, (stride,) * dims, (pad,) * dims, (dilation,) * dims, tuple(reference.shape[2:]))
    assert out.shape == reference.shape
    assert torch.allclose(out, reference, rtol=1e-13, atol=1e-13)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 3), c_in=st.integers(1, 4), c_out=st.integers(1, 3), h=st.integers(1, 7), w=st.integers(1, 7),
       kh=st.integers(1, 4), kw=st.integers(1, 4), ph=st.integers(0, 2), pw=st.integers(0, 2), bias=st.booleans(),
       seed=st.integers(0, 2 ** 16))
def test_conv2d_by_shifts_is_torchs_convolution(n, c_in, c_out, h, w, kh, kw, ph, pw, bias, seed):
    """The float64 forward's stride-1 convolution (one GEMM per kernel offset on the flattened padded images) equals
    torch's, any sizes, kernels, paddings and biases; the first and last images' borders included."""
    from lightning_nsv.kernel.rules import conv2d_by_shifts

    if h + 2 * ph < kh or w + 2 * pw < kw:
        return
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c_in, h, w, dtype=torch.float64, generator=gen)
    weight = torch.randn(c_out, c_in, kh, kw, dtype=torch.float64, generator=gen)
    b = torch.randn(c_out, dtype=torch.float64, generator=gen) if bias else None
    reference = torch.nn.functional.conv2d(x, weight, b, padding=(ph, pw))
    out = conv2d_by_shifts(x, weight, b, (ph, pw))
    assert out.shape == reference.shape and out.is_contiguous()
    assert torch.allclose(out, reference, rtol=1e-13, atol=1e-13)
