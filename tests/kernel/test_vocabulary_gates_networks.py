"""The rest of the vocabulary (tests/kernel/test_vocabulary_gates.py) together: saturating pieces, where gates and maxouts in
conv/BN/residual networks against enumerated paths and on every engine, their near-ties, the support-vector analysis
of trained networks, random tiny architectures mixing them."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given, settings, strategies as st
from torch import nn

from lightning_nsv.kernel import compute_gates, trace
from lightning_nsv.kernel.piece_rules import LINEAR
from tests.kernel.test_pair_network import check_against_enumeration, inputs, one_thread, relative  # noqa: F401
from tests.kernel.test_pair_factored import both
from tests.kernel.test_pair_program import TOL, columns, engines_equal_the_plain_network
from tests.kernel.test_vocabulary_gates import ENGINES, Functional, Lambda, Maxout, WhereGate, everything, scaled


# ---------------------------------------------------------------------------------------------- in combination


class Mixed(nn.Module):
    """conv → BN → Hardtanh, a residual block with a where gate, a maxout, ReLU6, a clamp, a max pool."""

    def __init__(self, outputs: int = 1) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.conv3 = nn.Conv2d(2, 2, 3, padding=1)
        self.act, self.pool = nn.Hardtanh(-0.5, 0.7), nn.MaxPool2d(2)
        self.head = nn.Linear(2 * 9, outputs)
        self.outputs = outputs

    def forward(self, x):
        h = self.act(self.bn1(self.conv1(x)))
        z = self.conv2(h)
        h = h + torch.where(z > 0, z, 0.1 * z)  # residual
        n, c, a, b = h.shape
        h = h.view(n, c // 2, 2, a, b).amax(2)  # maxout of pairs of channels
        h = F.relu6(self.conv3(h)).clamp(max=0.8)
        out = self.head(self.pool(h).flatten(1))
        return out.squeeze(1) if self.outputs == 1 else out


@pytest.mark.parametrize("outputs", [1, 3])
def test_every_operation_in_one_residual_network(outputs):
    everything(scaled(Mixed(outputs), factor=2.0), inputs((1, 6, 6), n=4))


def test_the_scope_counts_pieces_as_gate_layers_and_maxouts_as_max_pools():
    """Hardtanh, ReLU6 and clamp are gate layers (a gate and its flat values), the where gate one, the maxout and the
    max pool max-pools; every unit's choice counts once."""
    from lightning_nsv.kernel import scope_summary

    summary = scope_summary(trace(Mixed().eval(), inputs((1, 6, 6))))
    assert (summary.maps, summary.gate_layers, summary.max_pools) == (5, 4, 2)
    assert summary.gates == 4 * 36 + 4 * 36 + 2 * 36 + 2 * 36 + 2 * 36 + 2 * 9


# ---------------------------------------------------------------------------------------------- choices and ties


def test_choices_do_not_depend_on_the_block():
    """Pieces, where-gate bits and maxout indices are the same whatever the forward's block (near-tie rule)."""
    module = scaled(Mixed(), factor=2.0)
    x = inputs((1, 6, 6), n=9)
    x[3] = x[2]  # exact ties of a maxout (its two candidates are equal when both saturate)
    graph = trace(module, x)
    whole, rows = compute_gates(graph, x), compute_gates(graph, x, memory_bytes=1)
    for name in whole.bits:
        assert torch.equal(whole.bits[name], rows.bits[name])
    for name in whole.selections:
        assert torch.equal(whole.selections[name], rows.selections[name])


def test_breakpoints_and_ties_follow_the_conventions():
    """A unit at a bound is in the linear piece (both pieces give the bound); a where gate at 0 takes slope 1; a tie
    of a max goes to torch's index; outputs exact."""
    x = torch.tensor([[-1.0, 0.5, 2.0, 0.0]])
    graph = trace(Lambda(lambda z: z.clamp(-1.0, 2.0).sum(1)), x)
    assert compute_gates(graph, x).selections[graph.pools[0].name].tolist() == [[LINEAR] * 4]
    graph = trace(Lambda(lambda z: torch.where(z > 0, z, 0.5 * z).sum(1)), x)
    assert compute_gates(graph, x).bits[graph.gates[0].name].tolist() == [[False, True, True, True]]
    tie = torch.tensor([[1.0, 3.0, 3.0]])
    graph = trace(Lambda(lambda z: z.max(dim=1).values), tie)
    gates = compute_gates(graph, tie)
    assert gates.selections[graph.pools[0].name].tolist() == [int(tie.max(dim=1).indices)]
    assert float(gates.output) == 3.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_torch_engine_on_cuda_equals_numba():
    module, x = scaled(Mixed(3), factor=2.0), inputs((1, 6, 6), n=12)
    cpu = columns(module, x, engine="numba").columns_tensor(range(len(x)))
    gpu = columns(module.cuda(), x.cuda(), engine="torch")
    assert gpu.engine == "fused pair program (torch)" and gpu.device.type == "cuda"
    assert relative(gpu.columns_tensor(range(len(x))).cpu(), cpu) < TOL


class VocabularyTies(nn.Module):
    """A clamp fed ``x0 − x1 + 0.5`` at its bound 0.5, a where gate fed ``x0 − x1``, a maxout of ``(x0, x1)``:
    every choice a near-tie where the inputs are crafted ulps apart (tests/kernel/test_gate_ties.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.mix = nn.Conv2d(2, 4, 1), nn.Conv2d(2, 2, 3, padding=1)
        self.head = nn.Linear(2 * 64, 1)
        with torch.no_grad():
            self.conv.weight.copy_(torch.tensor([[1.0, -1.0], [1.0, -1.0], [1.0, 0.0], [0.0, 1.0]]).view(4, 2, 1, 1))
            self.conv.bias.copy_(torch.tensor([0.5, 0.0, 0.0, 0.0]))

    def forward(self, x):
        z = self.conv(x)
        u = z[:, 1:2]
        pieces = torch.cat([z[:, :1].clamp(-0.5, 0.5), torch.where(u > 0, u, 0.2 * u)], 1)
        top = z.view(x.size(0), 2, 2, 8, 8).amax(2)
        return self.head(self.mix(pieces + top).flatten(1)).squeeze(1)


@pytest.mark.parametrize("rows", [1, 7, 70])
def test_near_ties_of_the_new_choices_are_decided_alone(rows, monkeypatch):
    """Blocks that round otherwise (tests/kernel/test_gate_ties.py) give the choices of each sample's forward run alone."""
    from lightning_nsv.kernel.graph import Recorder, run
    from tests.kernel.test_gate_ties import alone, assert_same_choices, near_tie_inputs, round_blocks_otherwise

    module, x = VocabularyTies().double(), near_tie_inputs()
    graph = trace(module, x[:8])
    recorder = Recorder(watch_ties=True)
    run(graph, x, "forward", recorder)
    assert 0 < int(recorder.ties.sum()) < len(x)
    reference = alone(graph, x)
    round_blocks_otherwise(monkeypatch)
    assert_same_choices(compute_gates(graph, x, memory_bytes=8 * graph.peak_elements * rows), reference)


# ---------------------------------------------------------------------------------------------- the analysis


class Logits(nn.Module):
    """The module's logits as ``(n, K)`` (one column for a binary net), as the analysis and the trainer read them."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x):
        return self.module(x).reshape(x.size(0), -1)


@pytest.mark.parametrize("make, classes", [
    (lambda: Functional(nn.Hardtanh(-0.5, 0.5)), [3, 8]),
    (lambda: Functional(WhereGate("gt", 0.1)), [3, 8]),
    (lambda: Functional(Lambda(lambda z: z.clamp(-0.2, 0.3))), [3, 8]),
    (lambda: Maxout("view_amax"), [3, 8]),
    (lambda: Mixed(outputs=3), [0, 3, 8]),
], ids=["hardtanh", "where", "clamp", "maxout", "mixed_three_classes"])
def test_whole_network_support_vectors_on_a_trained_network(make, classes):
    """A net trained to zero error with the operation: the analysis runs (on the compiled program) and its support
    and dual are those of the dense solve on the plain pair network's kernel."""
    import numpy as np

    from lightning_nsv.analysis.whole_network import whole_network_support_vectors
    from lightning_nsv.solver import max_margin
    from lightning_nsv.solver import multiclass_max_margin
    from tests.analysis.test_whole_network import digits, train_to_zero_error

    torch.manual_seed(0)
    x, y, _, _ = digits(classes, 60)
    x = F.adaptive_avg_pool2d(x, 6)
    module = train_to_zero_error(Logits(make()), x, y).eval()
    analysis = whole_network_support_vectors(module, x, y)
    assert analysis.svm.kkt_residual < 1e-8
    assert columns(module, x).engine == "fused pair program (numba)"
    dense = columns(module, x, factored=False, collapse=False).columns_tensor(range(len(x)))
    if len(classes) == 2:
        exact = max_margin(dense, torch.where(y > 0, 1.0, -1.0))
    else:
        exact = multiclass_max_margin(dense, y, 3, structured=False)
    np.testing.assert_array_equal(analysis.svm.support_, exact.support_)
    assert relative(torch.as_tensor(analysis.svm.alpha_), torch.as_tensor(exact.alpha_)) < 1e-8


# ---------------------------------------------------------------------------------------------- random architectures


ACTS = ["hardtanh", "relu6", "clamp", "clamp_min", "where", "relu", "maxout"]


class Random(nn.Module):
    """conv blocks each ending in one of :data:`ACTS` (maxout halves the channels), optional BN and residual sums."""

    def __init__(self, spec) -> None:
        super().__init__()
        blocks, self.outputs = spec["blocks"], spec["outputs"]
        self.convs, self.bns, self.acts, self.residual = nn.ModuleList(), nn.ModuleList(), [], []
        channels = 1
        for act, bn, residual, bias in blocks:
            out = 4 if act == "maxout" else 2
            self.convs.append(nn.Conv2d(channels, out, 3, padding=1, bias=bias))
            self.bns.append(nn.BatchNorm2d(out) if bn else nn.Identity())
            self.acts.append(act)
            self.residual.append(residual and channels == (2 if act == "maxout" else out))
            channels = 2
        self.head = nn.Linear(channels * 16, self.outputs)

    def forward(self, x):
        for conv, bn, act, residual in zip(self.convs, self.bns, self.acts, self.residual):
            z = bn(conv(x))
            if act == "hardtanh":
                h = F.hardtanh(z, -0.5, 0.4)
            elif act == "relu6":
                h = F.relu6(4 * z)
            elif act == "clamp":
                h = z.clamp(-0.3, 0.6)
            elif act == "clamp_min":
                h = torch.clamp_min(z, -0.2)
            elif act == "where":
                h = torch.where(z >= 0, z, 0.3 * z)
            elif act == "relu":
                h = F.relu(z)
            else:
                h = z.view(z.size(0), 2, 2, 4, 4).amax(2)
            x = x + h if residual else h
        out = self.head(x.flatten(1))
        return out.squeeze(1) if self.outputs == 1 else out


@st.composite
def mixed_architectures(draw):
    blocks = [(draw(st.sampled_from(ACTS)), draw(st.booleans()), draw(st.booleans()), draw(st.booleans()))
              for _ in range(draw(st.integers(1, 2)))]
    return {"blocks": blocks, "outputs": draw(st.sampled_from([1, 2])), "seed": draw(st.integers(0, 1000))}


@settings(max_examples=10, deadline=None)
@given(mixed_architectures())
@example({"blocks": [("maxout", True, False, True), ("hardtanh", True, True, False)], "outputs": 2, "seed": 1})
@example({"blocks": [("where", False, False, True), ("relu6", True, True, True)], "outputs": 1, "seed": 2})
@example({"blocks": [("clamp", True, False, False), ("clamp_min", False, True, True)], "outputs": 2, "seed": 3})
def test_random_architectures_mixing_the_vocabulary(spec):
    torch.manual_seed(spec["seed"])
    module = scaled(Random(spec), factor=2.0, seed=spec["seed"])
    x = inputs((1, 4, 4), n=3, seed=spec["seed"])
    check_against_enumeration(module, x)
    engines_equal_the_plain_network(module, x, engines=ENGINES)
    factored, plain = both(module, x, fast=False)
    assert relative(factored.columns_tensor(range(len(x))), plain.columns_tensor(range(len(x)))) < TOL
