"""A sample's choices (gate signs, max-pool and selection winners) do not depend on the block, the tile or the thread
count it falls in: near-ties are decided by the sample's own float64 forward run alone (kernel/ties.py)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch import nn

from lightning_nsv.kernel import compute_gates, trace
from lightning_nsv.kernel.graph import Recorder, run
from lightning_nsv.kernel.ties import TIE, near_ties
from tests.kernel.test_pair_network import randomise_bn


class NearTies(nn.Module):
    """Gates fed ``x0 − x1`` (crafted equal up to a few ulps in every other sample), then a selection between two
    branches and a max pool, after convolutions whose sums round differently by block."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6)
        self.mix = nn.Conv2d(6, 4, 3, padding=1, bias=False)
        self.head = nn.Linear(4 * 16, 1)
        with torch.no_grad():
            self.conv.weight[0].zero_()
            self.conv.weight[0, 0, 1, 1], self.conv.weight[0, 1, 1, 1] = 1.0, -1.0  # channel 0: x0 − x1
            self.conv.bias[0] = 0.0

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(x)))
        h = self.mix(h)
        h = torch.maximum(h[:, :2], h[:, 2:] * 1.0) + torch.relu(h[:, :2])
        h = torch.cat([h, h], 1)
        return self.head(nn.functional.max_pool2d(h, 2).flatten(1)).squeeze(1)


def near_tie_inputs(n: int = 70, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, 8, 8, generator=gen, dtype=torch.float64)
    x[::2, 1] = x[::2, 0] * (1 + torch.randint(-2, 3, (n - n // 2, 8, 8), generator=gen) * 2.0 ** -52)  # ulps apart
    return x  # the odd samples hold no crafted near-tie


def alone(graph, x) -> dict[str, torch.Tensor]:
    """Every sample's choices from its forward run alone, on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        parts = []
        for i in range(len(x)):
            recorder = Recorder()
            run(graph, x[i:i + 1], "forward", recorder)
            parts.append(recorder.records)
    finally:
        torch.set_num_threads(threads)
    return {name: torch.cat([p[name] for p in parts]) for name in parts[0]}


def assert_same_choices(gates, reference: dict[str, torch.Tensor]) -> None:
    for name, chosen in (*gates.bits.items(), *gates.selections.items()):
        assert torch.equal(chosen, reference[name]), name


@pytest.fixture(scope="module")
def traced():
    torch.manual_seed(0)
    module = randomise_bn(NearTies()).double()
    with torch.no_grad():  # channel 0 of the BatchNorm the identity: its gates see x0 − x1 as it is
        bn = module.bn
        bn.running_mean[0], bn.running_var[0], bn.weight[0], bn.bias[0] = 0.0, 1.0 - bn.eps, 1.0, 0.0
    x = near_tie_inputs()
    return trace(module, x[:8]), x


@pytest.mark.parametrize("rows", [1, 7, 64, 70])
@pytest.mark.parametrize("threads", [1, 2])
def test_choices_do_not_depend_on_the_block_or_the_threads(traced, rows, threads):
    graph, x = traced
    reference = alone(graph, x)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gates = compute_gates(graph, x, memory_bytes=8 * graph.peak_elements * rows)
    finally:
        torch.set_num_threads(before)
    assert_same_choices(gates, reference)


def test_the_crafted_inputs_hold_near_ties(traced):
    """The test above would hold trivially without near-ties: the inputs give some (the rule re-ran them alone)."""
    graph, x = traced
    recorder = Recorder(watch_ties=True)
    run(graph, x, "forward", recorder)
    assert recorder.ties is not None and 0 < int(recorder.ties.sum()) < len(x)
    assert TIE == 1e-10


@pytest.mark.parametrize("rows", [1, 7, 64, 70])
def test_a_block_that_rounds_otherwise_does_not_change_a_choice(traced, monkeypatch, rows):
    """Blocks of several samples made to round otherwise (a relative 1e-14 added to every convolution of a block,
    as another summation order could): the choices are still those of each sample's forward run alone. Without the
    near-tie rule the crafted near-ties flip."""
    graph, x = traced
    reference = alone(graph, x)
    round_blocks_otherwise(monkeypatch)
    gates = compute_gates(graph, x, memory_bytes=8 * graph.peak_elements * rows)
    assert_same_choices(gates, reference)


def round_blocks_otherwise(monkeypatch) -> None:
    """Every convolution of a block of several samples rounds otherwise (a relative 1e-14 of seeded noise added, as
    another summation order could); a sample alone is left exact."""
    import lightning_nsv.kernel.rules as R

    exact = R.conv2d_by_shifts

    def rounding_otherwise(inputs, weight, bias, pad):
        out = exact(inputs, weight, bias, pad)
        if len(inputs) == 1:
            return out
        noise = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
        return out + 1e-14 * out.abs().amax() * noise

    monkeypatch.setattr(R, "conv2d_by_shifts", rounding_otherwise)


def test_no_samples_give_empty_choices(traced):
    graph, x = traced
    gates = compute_gates(graph, x[:0])
    assert len(gates) == 0 and set(gates.bits) == {g.name for g in graph.gates}
    assert all(bits.shape == (0, *g.shape) for g, bits in zip(graph.gates, gates.bits.values()))


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2 ** 31), st.booleans(), st.booleans())
def test_near_ties_is_the_elementwise_rule(seed, own_scale, with_exact_zeros):
    """Per sample: any gap ``<= TIE · max |scale|`` outside the exact zeros, a NaN counting as a tie; by reductions
    (smallest gap, largest magnitude) the same as the rule written out element by element."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(6, 3, 4, dtype=torch.float64, generator=g) * 10.0 ** torch.randint(-12, 3, (6, 1, 1), generator=g)
    tiny = torch.rand(z.shape, generator=g, dtype=torch.float64) < 0.2
    gap = torch.where(tiny, z.abs() * 1e-11, z.abs())
    exact_zero = torch.rand(z.shape, generator=g) < 0.3 if with_exact_zeros else None
    scale = gap if own_scale else z
    largest = scale.abs().reshape(6, -1).max(1).values
    expected = [any(float(a) <= TIE * float(largest[i]) and not (exact_zero is not None and bool(e))
                    for a, e in zip(gap[i].reshape(-1), (exact_zero if exact_zero is not None else tiny)[i].reshape(-1)))
                for i in range(6)]
    assert near_ties(gap, scale, exact_zero).tolist() == expected
    gap[0, 0, 0] = float("nan")
    if exact_zero is not None:
        exact_zero[0, 0, 0] = False
    assert bool(near_ties(gap, scale, exact_zero)[0])
