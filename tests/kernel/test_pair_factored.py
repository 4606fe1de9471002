"""The factored pair network (lightning_nsv.kernel.factored) against the plain one (DESIGN.md §2c "Speed")."""
from __future__ import annotations

import pytest
import torch

from lightning_nsv.kernel import PairNetworkColumns, compute_gates, trace
from lightning_nsv.kernel import factored as F
from lightning_nsv.kernel import rules as R
from lightning_nsv.models.residual import SmallResNet
from tests.kernel.test_pair_network import CASES, inputs, randomise_bn, relative


def both(module, x, **kwargs):
    graph = trace(module, x)
    gates = compute_gates(graph, x)
    fast = PairNetworkColumns(graph, x, gates, factored=True, engine="reference", **kwargs)
    fast.factored_min_side = 1  # every block factored, however small
    return fast, PairNetworkColumns(graph, x, gates, factored=False, collapse=False, **kwargs)


@pytest.mark.parametrize("case", sorted(CASES))
def test_factored_equals_plain_pair_network(case):
    torch.manual_seed(0)
    make, shape = CASES[case]
    fast, plain = both(make(), inputs(shape, n=6), fast=False)
    assert relative(fast.columns_tensor([4, 0, 2]), plain.columns_tensor([4, 0, 2])) < 1e-13
    assert relative(fast.diagonal_tensor(), plain.diagonal_tensor()) < 1e-13
    assert relative(fast.block([1, 3, 5]), plain.block([1, 3, 5])) < 1e-13


@pytest.mark.parametrize("blocks, beta", [((1, 1), 0.0), ((1, 2), 0.1), ((2, 0, 1), 0.0)])
def test_small_resnet_keeps_terms_through_pools_and_sums(blocks, beta, monkeypatch):
    """Max pools split the terms (the factored form reaches the head), and the kernel is the plain one."""
    torch.manual_seed(0)
    net = randomise_bn(SmallResNet(2, 1, 3, blocks, beta=beta)).eval()
    x = inputs((2, 8, 8), n=5)
    fast, plain = both(net, x)
    splits = []
    original = F.Terms.max_pool
    monkeypatch.setattr(F.Terms, "max_pool", lambda self, rule: splits.append(rule.name) or original(self, rule))
    columns = fast.columns_tensor([0, 3])
    assert len(splits) == (len(blocks) - 1)
    assert relative(columns, plain.columns_tensor([0, 3])) < 1e-13
    assert relative(fast.diagonal_tensor(), plain.diagonal_tensor()) < 1e-13


class _InputFirst(torch.nn.Module):
    """The input read before any conv: gated, max-pooled, summed with a conv branch, convolved and concatenated."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.head = torch.nn.Conv2d(2, 2, 3, padding=1), torch.nn.Linear(5 * 16, 1)
        self.mix, self.pool = torch.nn.Conv2d(2, 1, 3, padding=1), torch.nn.MaxPool2d(2)

    def forward(self, x):
        summed = self.conv(x) + torch.relu(x)
        mixed = torch.cat([self.mix(summed), summed], 1)
        return self.head(torch.flatten(torch.cat([self.pool(mixed), self.pool(x)], 1), 1))


@pytest.mark.parametrize("case", ["input_first", "reshapes_functional_buffers", "conv1d_abs"])
def test_pair_input_as_per_sample_factors(case, monkeypatch):
    """The factored network takes the pair input ``x ⊙ x'`` as the term ``(1, x, x')``, never formed where a conv
    reads it; a gate, a pool, a sum, a concatenation or a reshape of it equals the plain pair network."""
    torch.manual_seed(0)
    make, shape = (lambda: _InputFirst(), (2, 8, 8)) if case == "input_first" else CASES[case]
    fast, plain = both(make(), inputs(shape, n=6), fast=False)
    combined = []
    original = F.Terms.value
    monkeypatch.setattr(F.Terms, "value", lambda self: combined.append(self.shape) or original(self))
    assert relative(fast.columns_tensor([4, 0, 2]), plain.columns_tensor([4, 0, 2])) < 1e-13
    assert relative(fast.block([1, 3, 5]), plain.block([1, 3, 5])) < 1e-13
    if case == "conv1d_abs":
        assert not combined  # the conv reads the input's channel overlap


def test_pair_network_columns_follow_the_solver_protocol():
    """The solver reads PairNetworkColumns as it is: numpy columns and diagonal, signed forms consistent."""
    import numpy as np

    from lightning_nsv.solver.protocol import KernelColumns, signed

    torch.manual_seed(0)
    net = randomise_bn(SmallResNet(1, 1, 2, (1, 1))).eval()
    x = inputs((1, 8, 8), n=6)
    columns, _ = both(net, x)
    assert isinstance(columns, KernelColumns) and columns.offers_block
    idx = np.array([4, 1])
    kernel = columns.columns_tensor(idx).numpy()
    assert isinstance(columns.columns(idx), np.ndarray) and np.array_equal(columns.columns(idx), kernel)
    assert np.array_equal(columns.diagonal(), columns.diagonal_tensor().numpy())
    signs = np.array([1.0, -1.0, 1.0, 1.0, -1.0, -1.0])
    expected = signed(kernel, signs, idx, 2.0)
    assert np.allclose(columns.signed_columns(idx, signs, 2.0), expected, rtol=1e-15, atol=0)
    assert np.allclose(columns.signed_rows(idx, signs, 2.0).numpy(), expected.T, rtol=1e-15, atol=0)
    assert np.allclose(columns.signed_block(idx, signs, 2.0), expected[idx], rtol=1e-15, atol=0)


class _ScaledChannels(torch.nn.Module):
    """A fixed map that is not channel-wise (a constant per channel) between the last gate and the head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.head = torch.nn.Conv2d(1, 2, 3), torch.nn.Linear(2 * 36, 1)
        self.register_buffer("gain", torch.tensor([2.0, -3.0]).view(1, 2, 1, 1))

    def forward(self, x):
        return self.head(torch.flatten(self.conv(x).relu() * self.gain, 1))


@pytest.mark.parametrize("case, summed", [("tiny_resnet_3_outputs", 1), ("adaptive_avgpool_3_outputs", 1),
                                          ("avgpool_include_pad", 1), ("scaled_channels", 0)])
def test_channel_sum_before_a_summing_head(case, summed, monkeypatch):
    """A channel-wise fixed map read only by flatten and a Linear takes the terms' channel sum, not their value;
    a map that is not channel-wise takes the value. Both equal the plain pair network."""
    torch.manual_seed(0)
    make, shape = (lambda: _ScaledChannels(), (1, 8, 8)) if case == "scaled_channels" else CASES[case]
    fast, plain = both(make(), inputs(shape, n=6), fast=False)
    calls = []
    original = R.FixedMap.channel_summed
    monkeypatch.setattr(R.FixedMap, "channel_summed", lambda *a: calls.append(1) or original(*a))
    columns = fast.columns_tensor([4, 0, 2])
    assert len(calls) == summed
    assert relative(columns, plain.columns_tensor([4, 0, 2])) < 1e-13
    assert relative(fast.block([1, 3, 5]), plain.block([1, 3, 5])) < 1e-13


def test_blocks_keep_their_budgets(monkeypatch):
    """Factored blocks take up to ``factored_block_scale`` times the budget, blocks of the plain network (too few
    rows or columns) the budget itself; the kernel is the plain network's either way."""
    torch.manual_seed(0)
    net = randomise_bn(SmallResNet(1, 1, 2, (1, 1))).eval()
    x = inputs((1, 8, 8), n=23)
    graph = trace(net, x)
    gates = compute_gates(graph, x)
    budget = 8 * graph.peak_elements * 20  # 20 pairs a plain block
    fast = PairNetworkColumns(graph, x, gates, memory_bytes=budget, engine="reference")
    plain = PairNetworkColumns(graph, x, gates, memory_bytes=budget, factored=False, collapse=False)
    sizes = []
    original = PairNetworkColumns.pairs
    monkeypatch.setattr(PairNetworkColumns, "pairs",
                        lambda self, a, b, outer=False: sizes.append((len(a), len(b))) or original(self, a, b, outer))
    rows = torch.arange(len(x))
    for idx in (list(range(12)), [3, 1, 4]):  # the tiles of K[:, idx] (columns_tensor reads kept columns first)
        sizes.clear()
        assert relative(fast._tiles(rows, torch.tensor(idx)), plain._tiles(rows, torch.tensor(idx))) < 1e-13
        fast_sizes = sizes[:len(sizes) // 2]
        assert all(r * c <= (20 if min(r, c) < fast.factored_min_side else 20 * fast.factored_block_scale)
                   for r, c in fast_sizes)
        assert any(min(r, c) < fast.factored_min_side for r, c in fast_sizes)
