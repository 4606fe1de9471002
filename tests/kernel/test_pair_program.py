"""The compiled pair program (lightning_nsv.kernel.pair_program, pair_engines, fused) against the plain pair network
and against enumerated paths (DESIGN.md §2c)."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st
from torch import nn

from lightning_nsv.kernel import PairNetworkColumns, compute_gates, trace
from lightning_nsv.kernel import pair_engines
from lightning_nsv.kernel.fused import fuse
from lightning_nsv.kernel.pair_factors import SampleFactors, sample_factors
from lightning_nsv.kernel.pair_program import NotFusable, compile_pair_program
from lightning_nsv.models.residual import SmallResNet
from tests.kernel.test_pair_factored import _InputFirst
from tests.kernel.test_pair_network import CASES, check_against_enumeration, inputs, one_thread, randomise_bn, relative  # noqa: F401

TOL = 1e-12
pytestmark = pytest.mark.skipif(not pair_engines.numba_available(), reason="numba is not installed")


class DenseTransition(nn.Module):
    """DenseNet-style: the input joined with a conv branch, an average pool read by BatchNorm and a gate (the pool
    split over its windows' entries), a flatten and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn, self.head = nn.Conv2d(2, 3, 3, padding=1), nn.BatchNorm2d(5), nn.Linear(5 * 16, 1)

    def forward(self, x):
        h = torch.cat([x, F.relu(self.conv(x))], 1)
        h = F.relu(self.bn(F.avg_pool2d(h, 2)))
        return self.head(h.flatten(1)).squeeze(1)


class Depthwise(nn.Module):
    """MobileNet-style: a depthwise convolution of a gated value, a pointwise one, a channel slice."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.bn = nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)
        self.depthwise, self.pointwise = nn.Conv2d(4, 4, 3, padding=1, groups=4), nn.Conv2d(4, 4, 1)
        self.head = nn.Linear(2 * 64, 2)

    def forward(self, x):
        h = F.relu(self.depthwise(F.relu(self.bn(self.stem(x)))))
        return self.head(torch.flatten(F.relu(self.pointwise(h)[:, :2]), 1))


class FlatInput(nn.Module):
    """A flat input viewed as an image, a per-channel gain buffer, a permuted flatten."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.head = nn.Conv2d(2, 3, 3, padding=1), nn.Linear(3 * 36, 1)
        self.register_buffer("gain", torch.tensor([2.0, -0.5, 1.5]).view(1, 3, 1, 1))

    def forward(self, x):
        h = self.gain * F.relu(self.conv(x.view(x.size(0), 2, 6, 6)))
        return self.head(h.permute(0, 2, 3, 1).flatten(1)).squeeze(1)


EXTRA = {
    "input_first": (_InputFirst, (2, 8, 8)),
    "dense_transition": (lambda: randomise_bn(DenseTransition()), (2, 8, 8)),
    "depthwise_slice": (lambda: randomise_bn(Depthwise()), (1, 8, 8)),
    "flat_input_gain": (FlatInput, (72,)),
    "small_resnet_leaky": (lambda: randomise_bn(SmallResNet(2, 1, 3, (1, 2), beta=0.1)), (2, 8, 8)),
    "small_resnet_3_stages": (lambda: randomise_bn(SmallResNet(2, 3, 4, (1, 1, 1))), (2, 8, 8)),
}
NOT_FUSED = {"reshapes_functional_buffers"}  # a Linear over the last dim of a 2-dim value: the factored path


def columns(module, x, **kwargs):
    graph = trace(module, x)
    gates = compute_gates(graph, x)
    return PairNetworkColumns(graph, x, gates, fast=False, **kwargs)


@pytest.mark.parametrize("case", sorted(CASES) + sorted(EXTRA))
@pytest.mark.parametrize("engine", ["numba", "torch"])
def test_fused_engines_equal_the_plain_pair_network(case, engine):
    torch.manual_seed(0)
    make, shape = {**CASES, **EXTRA}[case]
    module, x = make().eval(), inputs(shape, n=7)
    plain = columns(module, x, factored=False, collapse=False)
    if case in NOT_FUSED:
        with pytest.raises(NotFusable, match="Linear over the last dim"):
            columns(module, x, engine=engine)
        assert columns(module, x).engine.startswith("factored torch (not fused: ")
        return
    fused = columns(module, x, engine=engine)
    assert fused.engine == f"fused pair program ({engine})"
    every = list(range(len(x)))
    assert relative(fused.columns_tensor(every), plain.columns_tensor(every)) < TOL
    assert relative(fused.block([5, 1, 3]), plain.block([5, 1, 3])) < TOL
    assert relative(fused.diagonal_tensor(), plain.diagonal_tensor()) < TOL


@pytest.mark.parametrize("case", ["input_first", "dense_transition", "depthwise_slice", "flat_input_gain"])
def test_new_shapes_against_enumerated_paths(case):
    """(The ResNets of EXTRA have too many paths to enumerate; the plain pair network is their reference.)"""
    torch.manual_seed(0)
    make, shape = EXTRA[case]
    check_against_enumeration(make().eval(), inputs(shape, n=3))


def exact_and_fused(module, x) -> None:
    """Against enumerated paths, fused (numba) and equal to the plain pair network."""
    check_against_enumeration(module, x)
    fused, plain = columns(module, x), columns(module, x, factored=False, collapse=False)
    assert fused.engine == "fused pair program (numba)"
    assert relative(fused.columns_tensor(range(len(x))), plain.columns_tensor(range(len(x)))) < TOL


def engines_equal_the_plain_network(module, x, engines=("numba", "torch")) -> None:
    plain = columns(module, x, factored=False, collapse=False).columns_tensor(range(len(x)))
    for engine in engines:
        assert relative(columns(module, x, engine=engine).columns_tensor(range(len(x))), plain) < TOL, engine


def _kernel(module, x, **compile_options):
    graph = trace(module, x)
    gates = compute_gates(graph, x)
    program = compile_pair_program(graph, **compile_options)
    return program, sample_factors(program, graph, x, gates)


def test_word_widths_give_the_same_kernel():
    """Masks of 20 channels in words of 8, 16, 32 or 64 bits (several words a position, or one) count alike."""
    torch.manual_seed(0)
    module = randomise_bn(SmallResNet(2, 1, 20, (1, 1))).eval()
    x = inputs((2, 8, 8), n=6)
    rows = np.arange(6)
    results = []
    for bits in (8, 16, 32, 64):
        program, factors = _kernel(module, x, word_bits=bits)
        assert program.word_bits == bits and factors.bits.dtype.itemsize * 8 == bits
        results.append(pair_engines.numba_outer(program, factors, rows, rows))
    assert all(np.array_equal(results[0], r) for r in results[1:])
    plain = columns(module, x, factored=False, collapse=False).columns_tensor(list(rows)).numpy()
    assert np.abs(results[0] - plain).max() <= TOL * np.abs(plain).max()


def test_values_are_kept_as_float32_only_where_that_is_exact():
    """float32 data gives float32 values, the same kernel as the same values in float64 on both runners; float64 data
    that float32 cannot hold keeps float64 values."""
    torch.manual_seed(0)
    module = randomise_bn(SmallResNet(2, 1, 4, (1, 1))).eval()
    x = inputs((2, 8, 8), n=7)
    program, single = _kernel(module, x)
    assert single.dense.dtype == np.float32
    widened = SampleFactors(single.bits, single.dense.astype(np.float64))
    rows = np.arange(7)
    assert np.array_equal(pair_engines.numba_outer(program, single, rows, rows),
                          pair_engines.numba_outer(program, widened, rows, rows))
    first, second = torch.from_numpy(np.repeat(rows, 7)), torch.from_numpy(np.tile(rows, 7))
    by_torch = [pair_engines.torch_pairs(program, *f.tensors("cpu"), first, second) for f in (single, widened)]
    assert by_torch[0].dtype == torch.float64 and torch.equal(*by_torch)
    fine = x.double() + 1e-12
    program, double = _kernel(module.double(), fine)
    assert not np.array_equal(double.dense.astype(np.float32), double.dense)  # float32 cannot hold them
    assert double.dense.dtype == np.float64
    with pytest.raises(ValueError, match="float64 or float32"):
        pair_engines.numba_outer(program, SampleFactors(double.bits, double.dense.astype(np.float16)), rows, rows)


def test_threads_and_blocks_do_not_change_the_kernel(monkeypatch):
    """Each pair runs the same instructions whatever thread or block it falls in: equal bit for bit."""
    torch.manual_seed(0)
    program, factors = _kernel(randomise_bn(SmallResNet(2, 1, 4, (1, 1))).eval(), inputs((2, 8, 8), n=21))
    rows, cols = np.arange(21), np.array([20, 3, 7, 7, 0])
    first = pair_engines.numba_outer(program, factors, rows, cols, threads=1)
    assert np.array_equal(first, pair_engines.numba_outer(program, factors, rows, cols, threads=2))
    monkeypatch.setattr(pair_engines, "BLOCK_SIDE", 3)
    assert np.array_equal(first, pair_engines.numba_outer(program, factors, rows, cols, threads=2))
    aligned = pair_engines.numba_pairs(program, factors, np.repeat(rows, 5), np.tile(cols, 21), threads=2)
    assert np.array_equal(first.reshape(-1), aligned)



def test_the_runner_owns_the_cores_inside_a_solve(monkeypatch):
    """Inside ``owning_the_cores`` torch runs on one thread and the compiled runner on the threads torch had
    (restored on exit, also after an error); the torch engine keeps torch's threads; the kernel is the same."""
    torch.manual_seed(0)
    module = randomise_bn(SmallResNet(2, 1, 4, (1, 1))).eval()
    x = inputs((2, 8, 8), n=12)
    numba_columns, torch_columns = columns(module, x, engine="numba"), columns(module, x, engine="torch")
    seen = []
    runner = pair_engines.numba_outer
    monkeypatch.setattr("lightning_nsv.kernel.fused.numba_outer",
                        lambda *args: seen.append((args[-1], torch.get_num_threads())) or runner(*args))
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        outside = numba_columns.block(list(range(12)))
        inside = columns(module, x, engine="numba")
        with inside.owning_the_cores():
            assert torch.get_num_threads() == 1
            values = inside.block(list(range(12)))
        assert torch.get_num_threads() == 2 and seen[0] == (None, 2) and seen[-1] == (2, 1)
        assert torch.equal(outside, values)
        with pytest.raises(RuntimeError, match="inside"):
            with numba_columns.owning_the_cores():
                raise RuntimeError("inside")
        assert torch.get_num_threads() == 2 and numba_columns.fused.threads is None
        with torch_columns.owning_the_cores():
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(saved)

@st.composite
def convolutions(draw):
    """One convolution of any geometry (1D or 2D, stride, padding or 'same', dilation, groups, bias), a gate, an
    optional pool, a flatten and a head."""
    dims = draw(st.sampled_from([1, 2]))
    size = draw(st.integers(3, 9))
    kernel, dilation = draw(st.integers(1, 4)), draw(st.integers(1, 2))
    span = dilation * (kernel - 1) + 1
    stride = draw(st.integers(1, 3))
    padding = "same" if stride == 1 and draw(st.booleans()) else draw(st.integers(0, 2))
    if padding != "same" and size + 2 * padding < span:
        padding = span
    groups = draw(st.sampled_from([1, 2]))
    conv = (nn.Conv1d, nn.Conv2d)[dims - 1](2, 2 * groups, kernel, stride, padding, dilation, groups,
                                             bias=draw(st.booleans()))
    layers = [conv, draw(st.sampled_from([nn.ReLU(), nn.LeakyReLU(0.2)]))]
    pool = draw(st.sampled_from(["none", "max", "avg"]))
    if pool != "none":
        layers.append((nn.MaxPool1d, nn.MaxPool2d)[dims - 1](2, ceil_mode=True) if pool == "max" else
                      (nn.AvgPool1d, nn.AvgPool2d)[dims - 1](2, 1, 1))
    shape = (2,) + (size,) * dims
    with torch.no_grad():
        features = nn.Sequential(*layers)(torch.zeros(1, *shape)).numel()
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(features, 1)), shape, draw(st.integers(0, 100))


@settings(max_examples=40, deadline=None)
@given(convolutions())
def test_window_sums_of_any_geometry(spec):
    module, shape, seed = spec
    torch.manual_seed(seed)
    x = inputs(shape, n=4, seed=seed)
    fused, plain = columns(module, x), columns(module, x, factored=False, collapse=False)
    assert fused.engine == "fused pair program (numba)"
    every = list(range(4))
    assert relative(fused.columns_tensor(every), plain.columns_tensor(every)) < TOL


def test_unknown_engine_and_numba_off_the_cpu_are_refused():
    module, x = CASES["conv_relu_linear"][0]().eval(), inputs((1, 8, 8))
    graph = trace(module, x)
    gates = compute_gates(graph, x)
    with pytest.raises(ValueError, match="engine must be one of 'auto', 'numba', 'torch'"):
        fuse(graph, x, gates, engine="gpu")
    graph.device = torch.device("meta")
    with pytest.raises(ValueError, match="engine='numba' runs on the CPU"):
        fuse(graph, x, gates, engine="numba")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_torch_engine_on_cuda_equals_numba():
    """The same program as torch operations on the GPU (the formulation a GPU runs) equals the CPU's runner."""
    torch.manual_seed(0)
    module = randomise_bn(SmallResNet(3, 1, 8, (1, 1))).eval()
    x = inputs((3, 16, 16), n=40)
    cpu = columns(module, x, engine="numba")
    gpu = columns(module.cuda(), x.cuda(), engine="torch")
    assert gpu.engine == "fused pair program (torch)" and gpu.device.type == "cuda"
    every = list(range(len(x)))
    assert relative(gpu.columns_tensor(every).cpu(), cpu.columns_tensor(every)) < TOL
    assert relative(gpu.diagonal_tensor().cpu(), cpu.diagonal_tensor()) < TOL


class UNetLike(nn.Module):
    """U-Net-style: a max-pooled path upsampled back (nearest and bilinear), joined with the skip, reflection
    padding before a valid convolution."""

    def __init__(self) -> None:
        super().__init__()
        self.down, self.up = nn.Conv2d(1, 2, 3, padding=1), nn.Conv2d(2, 2, 3, padding=1)
        self.pad, self.merge = nn.ReflectionPad2d(1), nn.Conv2d(4, 2, 3)
        self.head = nn.Linear(2 * 64, 1)

    def forward(self, x):
        skip = F.relu(self.down(x))
        low = F.relu(self.up(F.max_pool2d(skip, 2)))
        up = F.interpolate(low, scale_factor=2, mode="bilinear", align_corners=False) + \
            nn.functional.interpolate(low, scale_factor=2, mode="nearest")
        h = F.relu(self.merge(self.pad(torch.cat([skip, up], 1))))
        return self.head(F.pad(h, (0, 0, 0, 0), mode="constant").flatten(1)).squeeze(1)


PLANE_MAPS = {
    "upsample_nearest": lambda: nn.Upsample(scale_factor=2, mode="nearest"),
    "upsample_bilinear": lambda: nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False),
    "upsample_bilinear_corners": lambda: nn.UpsamplingBilinear2d(scale_factor=2),
    "reflection_pad": lambda: nn.ReflectionPad2d((1, 2, 0, 1)),
    "replication_pad": lambda: nn.ReplicationPad2d(1),
    "circular_pad": lambda: nn.CircularPad2d(1),
    "zero_pad": lambda: nn.ZeroPad2d((2, 0, 1, 1)),
}


@pytest.mark.parametrize("case", sorted(PLANE_MAPS))
def test_fixed_maps_of_each_plane_against_enumerated_paths(case):
    """Interpolation and padding: linear maps of each channel's plane, their constants in phi (§2c); the fused
    program and the plain pair network against enumerated paths, and both engines equal."""
    torch.manual_seed(0)
    layer = PLANE_MAPS[case]()
    with torch.no_grad():
        features = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), layer)(torch.zeros(1, 1, 6, 6)).numel()
    module = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), layer, nn.ReLU(), nn.Flatten(), nn.Linear(features, 1))
    exact_and_fused(module, inputs((1, 6, 6), n=4))


def test_a_unet_like_network_is_fused_and_exact():
    torch.manual_seed(0)
    module, x = UNetLike().eval(), inputs((1, 8, 8), n=4)
    check_against_enumeration(module, x)
    engines_equal_the_plain_network(module, x)


class FunctionalPReLU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.slope = nn.Conv2d(1, 3, 3), nn.Parameter(torch.tensor([0.2, -0.5, 1.5]))
        self.head = nn.Linear(3 * 16, 1)

    def forward(self, x):
        return self.head(F.prelu(self.conv(x), self.slope).flatten(1)).squeeze(1)


@pytest.mark.parametrize("make", [
    lambda: nn.Sequential(nn.Conv2d(1, 3, 3), nn.PReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(12, 1)),
    lambda: nn.Sequential(nn.Conv2d(1, 3, 3), nn.PReLU(3, init=0.3), nn.Conv2d(3, 2, 3), nn.PReLU(2),
                          nn.Flatten(), nn.Linear(2 * 4, 2)),
    lambda: nn.Sequential(nn.Flatten(), nn.Linear(36, 5), nn.PReLU(5), nn.Linear(5, 1)),
    FunctionalPReLU,
], ids=["one_slope", "per_channel", "mlp_per_unit", "functional"])
def test_prelu_slopes_against_enumerated_paths(make):
    """A PReLU's learned slopes are gates fixed once x is fixed (§2c): the slope of the piece in phi, one per channel
    where it has one; the per-unit PReLU of an MLP takes the pair network (no single slope for §1's formulas)."""
    torch.manual_seed(0)
    module = make().eval()
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.PReLU):
                m.weight.uniform_(-1.0, 1.5)
    exact_and_fused(module, inputs((1, 6, 6), n=5))


def test_a_prelu_of_one_slope_has_the_kernel_of_leaky_relu_with_that_slope():
    torch.manual_seed(0)
    prelu = nn.Sequential(nn.Conv2d(1, 2, 3), nn.PReLU(init=0.3), nn.Flatten(), nn.Linear(32, 1)).eval()
    leaky = copy.deepcopy(prelu)
    leaky[1] = nn.LeakyReLU(float(prelu[1].weight))
    x = inputs((1, 6, 6), n=5)
    assert torch.equal(columns(prelu, x).columns_tensor(range(5)), columns(leaky, x).columns_tensor(range(5)))


class Maxout(nn.Module):
    """Two branches and their elementwise maximum (and minimum), as a maxout unit or a max-merge of a skip."""

    def __init__(self, minimum: bool = False, functional=torch.maximum) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(1, 2, 3, padding=1), nn.Conv2d(1, 2, 3, padding=1, bias=False)
        self.fn = torch.minimum if minimum else functional
        self.head = nn.Linear(2 * 36, 1)

    def forward(self, x):
        h = self.fn(self.a(x), F.relu(self.b(x)))
        return self.head(F.relu(h).flatten(1)).squeeze(1)


class MethodMax(Maxout):
    def forward(self, x):
        return self.head(self.a(x).maximum(self.b(x)).flatten(1)).squeeze(1)


@pytest.mark.parametrize("make", [Maxout, lambda: Maxout(minimum=True), lambda: Maxout(functional=torch.max),
                                  MethodMax], ids=["maximum", "minimum", "torch_max", "method"])
def test_a_selection_between_two_branches_against_enumerated_paths(make):
    """torch.maximum/minimum of two branches: a one-hot choice per unit (§2c), ties to the first branch; the choice
    counts among the gates and the activation patterns."""
    torch.manual_seed(0)
    module, x = make().eval(), inputs((1, 6, 6), n=5)
    check_against_enumeration(module, x)
    engines_equal_the_plain_network(module, x, engines=("numba", "torch", "reference"))
    graph = trace(module, x)
    assert len(graph.gates) >= 1 and any(g.name.startswith(("maximum", "minimum", "max")) for g in graph.gates)


def test_a_tie_goes_to_the_first_branch():
    class Tie(nn.Module):
        def forward(self, x):
            return torch.maximum(x, 2 * x - x).sum((1, 2, 3))

    graph = trace(Tie(), inputs((1, 2, 2), n=2))
    gates = compute_gates(graph, inputs((1, 2, 2), n=2))
    assert bool(next(iter(gates.bits.values())).all())
