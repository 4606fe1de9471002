"""The rest of the piecewise-linear vocabulary (issue 42, DESIGN.md §2c "Beyond ReLU"): saturating pieces (Hardtanh,
ReLU6, clamp), gates written with torch.where, maxes over a dim (maxout), each alone against enumerated paths and on
every engine, and their refusals (tests/kernel/test_vocabulary_gates_networks.py: mixed networks, near-ties, the analysis of a
trained network, random architectures)."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_nsv.kernel import NotPiecewiseLinearError, compute_gates, trace
from lightning_nsv.kernel.pair_program import NotFusable
from lightning_nsv.kernel.path_norm import path_norm_squared
from lightning_nsv.kernel.piece_rules import HIGH, LINEAR, LOW
from tests.kernel.test_pair_network import (check_against_enumeration, inputs, one_thread, randomise_bn,  # noqa: F401
                                     relative)
from tests.kernel.test_pair_factored import both
from tests.kernel.test_pair_program import TOL, columns, engines_equal_the_plain_network

ENGINES = ("numba", "torch", "reference")


class Functional(nn.Module):
    """conv → ``act`` → conv (→ BN) → ReLU → Linear: the operation between two parameter maps, ``outputs`` logits."""

    def __init__(self, act, outputs: int = 1, channels: int = 2, bn: bool = False) -> None:
        super().__init__()
        self.act = act
        self.conv1 = nn.Conv2d(1, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(self.width(channels), 2, 3, bias=False)
        self.bn = nn.BatchNorm2d(2) if bn else nn.Identity()
        self.head = nn.Linear(2 * 16, outputs)
        self.outputs = outputs

    def width(self, channels: int) -> int:
        return channels

    def forward(self, x):
        out = self.head(F.relu(self.bn(self.conv2(self.act(self.conv1(x))))).flatten(1))
        return out.squeeze(1) if self.outputs == 1 else out


class Maxout(Functional):
    """A maxout of ``k`` channels after the first conv (its channel count ``k`` times as many)."""

    def __init__(self, form: str, k: int = 2, outputs: int = 1, bn: bool = False) -> None:
        self.form, self.k = form, k
        super().__init__(None, outputs, channels=2 * k, bn=bn)
        del self.act

    def width(self, channels: int) -> int:
        return 1 if self.form in ("channels_keepdim", "max_keepdim") else channels // self.k

    def act(self, z):
        n, c, h, w = z.shape
        if self.form == "view_amax":
            return z.view(n, c // self.k, self.k, h, w).amax(2)
        if self.form == "view_max_values":
            return z.view(n, c // self.k, self.k, h, w).max(dim=2).values
        if self.form == "reshape_torch_max":
            return torch.max(z.reshape(n, c // self.k, self.k, h, w), 2)[0]
        if self.form == "reshape_torch_amax_keepdim":
            return torch.amax(z.reshape(n, c // self.k, self.k, h, w), 2, keepdim=True).squeeze(2)
        if self.form == "channels_keepdim":
            return z.amax(dim=1, keepdim=True)
        if self.form == "max_keepdim":
            return torch.max(z, dim=1, keepdim=True).values
        if self.form == "min_view":
            return z.view(n, c // self.k, self.k, h, w).amin(2)
        raise AssertionError(self.form)


class WhereGate(nn.Module):
    """``torch.where`` written as a gate, slope ``a`` a number, a buffer or a learned parameter (as a PReLU's)."""

    def __init__(self, form: str, a: float = 0.2, buffer: bool = False, learned: bool = False) -> None:
        super().__init__()
        self.form = form
        if buffer:
            self.register_buffer("a", torch.tensor(a))
        elif learned:
            self.a = nn.Parameter(torch.tensor(a))
        else:
            self.a = a

    def forward(self, z):
        if self.form == "gt":
            return torch.where(z > 0, z, self.a * z)
        if self.form == "ge":
            return torch.where(z >= 0, z, z * self.a)
        if self.form == "lt":
            return torch.where(z < 0, self.a * z, z)
        if self.form == "le":
            return torch.where(torch.le(z, 0), z * self.a, z)
        if self.form == "relu":
            return torch.where(z.gt(0), z, 0.0)
        raise AssertionError(self.form)


class Lambda(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, z):
        return self.fn(z)


SATURATING = {
    "Hardtanh": lambda: nn.Hardtanh(-0.4, 0.5),
    "ReLU6": lambda: nn.ReLU6(),
    "ReLU6_inplace": lambda: nn.ReLU6(inplace=True),  # in place on a value nothing else reads
    "F.hardtanh": lambda: Lambda(lambda z: F.hardtanh(z, -0.3, 0.2)),
    "F.relu6": lambda: Lambda(F.relu6),
    "torch.clamp": lambda: Lambda(lambda z: torch.clamp(z, min=-0.25, max=0.6)),
    "Tensor.clamp": lambda: Lambda(lambda z: z.clamp(-0.5, 0.1)),
    "clamp_min": lambda: Lambda(lambda z: z.clamp_min(-0.2)),
    "clamp_max": lambda: Lambda(lambda z: torch.clamp_max(z, 0.3)),
    "clamp_min_0": lambda: Lambda(lambda z: z.clamp(min=0)),
}
WHERE = {f"where_{form}": (lambda form=form: WhereGate(form)) for form in ("gt", "ge", "lt", "le", "relu")}
WHERE["where_buffer"] = lambda: WhereGate("gt", 0.3, buffer=True)
WHERE["where_learned"] = lambda: WhereGate("lt", -0.4, learned=True)
MAXOUT = ["view_amax", "view_max_values", "reshape_torch_max", "reshape_torch_amax_keepdim", "channels_keepdim",
          "max_keepdim", "min_view"]


def scaled(module: nn.Module, factor: float = 3.0, seed: int = 0) -> nn.Module:
    """Larger weights (every piece visited on unit-normal inputs), BatchNorms randomised, eval mode."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.mul_(factor)
    return randomise_bn(module, seed).eval()


def everything(module: nn.Module, x: torch.Tensor, fused: bool = True) -> None:
    """Enumerated paths (phi·wbar = N(x), K = ΦΦᵀ, ||wbar||²), every engine equal to the plain pair network, and
    the compiled program chosen on its own."""
    check_against_enumeration(module, x)
    engines_equal_the_plain_network(module, x, engines=ENGINES if fused else ("auto", "reference"))
    factored, plain = both(module, x, fast=False)  # the factored network on every block, however small
    every = list(range(len(x)))
    assert relative(factored.columns_tensor(every), plain.columns_tensor(every)) < TOL
    assert relative(factored.diagonal_tensor(), plain.diagonal_tensor()) < TOL
    engine = columns(module, x).engine
    assert engine == "fused pair program (numba)" if fused else engine.startswith("factored torch (not fused"), engine


def pieces_visited(module: nn.Module, x: torch.Tensor) -> set:
    graph = trace(module, x)
    gates = compute_gates(graph, x)
    return {int(v) for p in graph.pools for v in gates.selections[p.name].unique()}


# ---------------------------------------------------------------------------------------------- each alone


@pytest.mark.parametrize("outputs", [1, 3])
@pytest.mark.parametrize("name", sorted(SATURATING))
def test_saturating_pieces_against_enumerated_paths(name, outputs):
    """Slope 1 in the linear piece, 0 saturated, and a path start of flat value lo, 0 or hi (§2c)."""
    module = scaled(Functional(SATURATING[name](), outputs=outputs, bn=outputs == 3), 15.0 if "6" in name else 3.0)
    x = inputs((1, 6, 6), n=5)
    everything(module, x)
    if name != "clamp_min_0":  # every piece of the layer is visited: the test reads each rule
        expected = {LINEAR, LOW, HIGH} if name not in ("clamp_min", "clamp_max") else \
            {LINEAR, LOW if name == "clamp_min" else HIGH}
        assert pieces_visited(module, x) == expected


@pytest.mark.parametrize("outputs", [1, 2])
@pytest.mark.parametrize("name", sorted(WHERE))
def test_where_gates_against_enumerated_paths(name, outputs):
    everything(scaled(Functional(WHERE[name](), outputs=outputs)), inputs((1, 6, 6), n=5))


@pytest.mark.parametrize("outputs", [1, 3])
@pytest.mark.parametrize("form", MAXOUT)
def test_maxout_against_enumerated_paths(form, outputs):
    """A max over a dim: the edge from the candidate chosen, 1 (§2c); the chosen indices are recorded."""
    module = scaled(Maxout(form, outputs=outputs, bn=outputs == 3))
    x = inputs((1, 6, 6), n=5)
    everything(module, x)
    graph = trace(module, x)
    gates = compute_gates(graph, x)
    (layer,) = graph.pools
    chosen = gates.selections[layer.name]
    assert chosen.dtype == torch.int32 and {0, 1} <= set(chosen.unique().tolist())


def test_maxout_of_an_mlp_and_a_max_over_every_class():
    """``h.view(n, D // k, k).amax(2)`` between Linears (a maxout MLP), and ``x.max(dim=1)`` of a (n, k) value."""

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(6, 6), nn.Linear(2, 3)

        def forward(self, x):
            h = self.a(x.flatten(1))
            return self.b(h.view(x.size(0), 2, 3).amax(2)).max(dim=1).values

    everything(scaled(MLP()), inputs((6,), n=6))


@pytest.mark.parametrize("outputs", [1, 3])
def test_each_operation_in_an_mlp(outputs):
    """Linear → Hardtanh → Linear → where gate → Linear → ReLU6 → maxout of pairs → Linear (no channel dims)."""

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.c, self.d = nn.Linear(6, 5), nn.Linear(5, 4), nn.Linear(4, 6), nn.Linear(3, outputs)

        def forward(self, x):
            h = self.b(F.hardtanh(self.a(x), -0.4, 0.6))
            h = F.relu6(4 * self.c(torch.where(h > 0, h, 0.2 * h)))
            out = self.d(h.view(x.size(0), 3, 2).amax(2))
            return out.squeeze(1) if outputs == 1 else out

    everything(scaled(MLP()), inputs((6,), n=6))


def test_a_max_over_time_of_a_conv1d():
    """``x.max(dim=-1).values`` of a Conv1d's map (a text CNN's max over time), after a clamp."""

    class Text(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.head = nn.Conv1d(2, 3, 3), nn.Linear(3, 2)

        def forward(self, x):
            return self.head(self.conv(x).clamp(-0.5, 0.5).max(dim=-1).values)

    everything(scaled(Text()), inputs((2, 7), n=6))


def test_a_max_over_channels_dropping_the_channel_dim_falls_back_visibly():
    """No compiled form where the channel dim goes and positions stay: the factored torch network, said so."""

    class Drop(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.head = nn.Conv2d(1, 3, 3), nn.Linear(16, 1)

        def forward(self, x):
            return self.head(self.conv(x).amax(1).flatten(1)).squeeze(1)

    module, x = scaled(Drop()), inputs((1, 6, 6), n=5)
    everything(module, x, fused=False)
    assert "a max over the channels that drops the channel dim" in columns(module, x).engine
    with pytest.raises(NotFusable, match="keepdim=True is fused"):
        columns(module, x, engine="numba")


# ---------------------------------------------------------------------------------------------- kernels that agree


def test_a_where_gate_has_the_kernel_of_leaky_relu():
    where = scaled(Functional(WhereGate("gt", 0.3)))
    leaky = copy.deepcopy(where)
    leaky.act = nn.LeakyReLU(0.3)
    x = inputs((1, 6, 6), n=5)
    assert torch.equal(columns(where, x).columns_tensor(range(5)), columns(leaky, x).columns_tensor(range(5)))


def test_clamp_at_zero_is_a_relu_and_relu6_is_hardtanh_0_6():
    """``clamp(min=0)`` has no path start (its flat value is 0 for every x): the kernel and ||wbar||² of a ReLU;
    ReLU6 is Hardtanh(0, 6)."""
    x = inputs((1, 6, 6), n=5)
    clamp = scaled(Functional(SATURATING["clamp_min_0"]()))
    relu = copy.deepcopy(clamp)
    relu.act = nn.ReLU()
    assert relative(columns(clamp, x).columns_tensor(range(5)), columns(relu, x).columns_tensor(range(5))) < TOL
    assert path_norm_squared(trace(clamp, x)) == path_norm_squared(trace(relu, x))
    six = scaled(Functional(nn.ReLU6()), factor=20.0)
    hard = copy.deepcopy(six)
    hard.act = nn.Hardtanh(0.0, 6.0)
    assert torch.equal(columns(six, x).columns_tensor(range(5)), columns(hard, x).columns_tensor(range(5)))
    assert HIGH in pieces_visited(six, x)


def test_opposite_saturations_meet_in_the_kernel():
    """Two samples saturated on opposite sides of one unit: the kernel counts ``lo·hi`` (one start per unit)."""
    lo, hi = -0.5, 2.0
    clamp = Lambda(lambda x: x.clamp(lo, hi).sum(1))
    x = torch.tensor([[-3.0], [5.0], [0.25]])
    kernel = columns(clamp, x).columns_tensor(range(3))
    expected = torch.tensor([[lo * lo, lo * hi, 0.0], [hi * lo, hi * hi, 0.0], [0.0, 0.0, 0.25 * 0.25]],
                            dtype=torch.float64)
    assert relative(kernel, expected) < TOL


# ---------------------------------------------------------------------------------------------- refusals


class Refused(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.conv, self.fn = nn.Conv2d(1, 2, 3), fn
        self.register_buffer("bound", torch.rand(2, 1, 1))
        self.learned = nn.Parameter(torch.tensor(0.5))

    def forward(self, x):
        return self.fn(self, self.conv(x)).flatten(1).sum(1)


@pytest.mark.parametrize("fn, why", [
    (lambda m, z: torch.where(z > 1, z, 0.1 * z), "compares with 1, not with 0"),
    (lambda m, z: torch.where(z > 0, z, z * z), "of two input-dependent tensors multiplies"),
    (lambda m, z: torch.where(z > 0, z, 0.5 * z + 1), "not the compared value and a copy of it"),
    (lambda m, z: torch.where(z > 0, 2 * z, 0.5 * z), "not the compared value and a copy of it"),
    (lambda m, z: torch.where(z.sum(1, keepdim=True) > 0, z, 0.1 * z), "not the compared value"),
    (lambda m, z: z * (z > 0), "reads the comparison"),
    (lambda m, z: torch.where(z > 0, z, m.bound * z), "not the compared value and a copy of it"),
    (lambda m, z: z.clamp(min=m.bound), "bounds are tensors of several values"),
    (lambda m, z: z.clamp(0.5, -0.5), "exceeds its upper bound"),
    (lambda m, z: z.clamp(max=m.learned), "bound is a learned parameter"),
    (lambda m, z: torch.clamp(z, min=z.mean((1, 2, 3), keepdim=True)), "clamps by a bound that depends on the input"),
    (lambda m, z: z.max(dim=1)[1].float(), "indices of a max"),
    (lambda m, z: z.max(dim=1).indices, "reads .indices of a max"),
    (lambda m, z: z.max(dim=1) + 1, "as a whole"),
    (lambda m, z: z.amax(dim=(1, 2)), "over every dim \\(or several\\)"),
    (lambda m, z: z.amax(0), "over the batch dim"),
    (lambda m, z: z.max(), "over every dim"),
    (lambda m, z: torch.max(z, m.bound), "elementwise clamp by per-unit bounds"),
    (lambda m, z: F.hardshrink(z), "saturated pieces"),
    (lambda m, z: z + F.relu6(z, inplace=True), "in place, which another operation also reads"),
    (lambda m, z: z.clamp_(-1, 1) + z, "in place, which another operation also reads"),
    (lambda m, z: z * 2 + F.hardtanh(z, -1, 1, True), "in place, which another operation also reads"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_refusals_in_their_own_terms(fn, why):
    with pytest.raises(NotPiecewiseLinearError, match=why):
        trace(Refused(fn), inputs((1, 6, 6)))


def test_a_linear_output_reshaped_into_positions_keeps_every_entry():
    """A Linear's pair value (one number) viewed as channels × positions, then gated: every position reads it (the
    compiled program once read past it: a wrong kernel, found with the maxout MLP)."""

    class Reshaped(nn.Module):
        def __init__(self, act) -> None:
            super().__init__()
            self.a, self.b, self.act = nn.Linear(6, 6), nn.Linear(6, 1), act

        def forward(self, x):
            return self.b(self.act(self.a(x.flatten(1)).view(x.size(0), 2, 3)).flatten(1)).squeeze(1)

    for act in (nn.ReLU(), nn.Hardtanh(-0.3, 0.3)):
        everything(scaled(Reshaped(act)), inputs((6,), n=5))
