"""Linear maps added to the operation table (DESIGN.md §2c, kernel/linear_vocabulary.py): a convolution's reflect,
replicate or circular padding_mode (its pad, then the convolution without padding), transposed convolutions,
chunk/split/narrow/unbind. Each alone and in small conv/BN/residual networks, binary and 3-class: against enumerated
paths (<phi, wbar> = N(x), K = Phi Phiᵀ, ||wbar||², to 1e-12), every engine equal to the plain pair network, and the
whole-network analysis on each."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_nsv.analysis.whole_network import whole_network_support_vectors
from lightning_nsv.kernel import NotPiecewiseLinearError, trace
from lightning_nsv.kernel import pair_engines
from lightning_nsv.kernel.graph import run
from lightning_nsv.models.layers import eval_mode
from tests.kernel.test_pair_network import check_against_enumeration, inputs, randomise_bn, relative
from tests.kernel.test_pair_program import columns
from tests.analysis.test_whole_network import digits, own_labels, two_classes

TOL = 1e-12
pytestmark = pytest.mark.skipif(not pair_engines.numba_available(), reason="numba is not installed")


class Apply(nn.Module):
    """A conv stem with a ReLU, ``fn(self, h)``, a ReLU, a flatten and a head of ``outputs``."""

    def __init__(self, fn, shape=(1, 6, 6), stem: nn.Module | None = None, outputs: int = 1, **layers) -> None:
        super().__init__()
        n = len(shape) - 1
        self.stem = stem or (nn.Conv1d, nn.Conv2d)[n - 1](shape[0], 4, 3, padding=1)
        self.fn = fn
        for name, layer in layers.items():
            setattr(self, name, layer)
        with torch.no_grad():
            features = self.body(torch.zeros(1, *shape)).numel()
        self.head, self.outputs = nn.Linear(features, outputs), outputs

    def body(self, x):
        return torch.flatten(F.relu(self.fn(self, F.relu(self.stem(x)))), 1)

    def forward(self, x):
        out = self.head(self.body(x))
        return out.squeeze(1) if self.outputs == 1 else out


def layer(make, shape=(1, 6, 6), fused: bool = True):
    """An :data:`OPERATIONS` entry: the module ``make()`` after the stem."""
    return lambda outputs=1: Apply(lambda s, h: s.layer(h), shape, outputs=outputs, layer=make()), shape, fused


def apply(fn, shape=(1, 6, 6), fused: bool = True, **layers):
    """An :data:`OPERATIONS` entry: ``fn(self, h)`` after the stem."""
    return lambda outputs=1: Apply(fn, shape, outputs=outputs, **{k: v() for k, v in layers.items()}), shape, fused


class Combined(nn.Module):
    """Reflect-padded stem, BatchNorm, a chunk into a circular-padded residual branch and a skip, a transposed
    convolution up, a narrow, a split joined back, a head of ``outputs``."""

    def __init__(self, outputs: int = 1) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, 4, 3, padding=1, padding_mode="reflect")
        self.bn = nn.BatchNorm2d(4)
        self.branch = nn.Conv2d(2, 2, 3, padding=1, padding_mode="circular", bias=False)
        self.up = nn.ConvTranspose2d(2, 3, 2, stride=2)
        self.head, self.outputs = nn.Linear(3 * 8 * 8, outputs), outputs

    def forward(self, x):
        a, b = F.relu(self.bn(self.stem(x))).chunk(2, 1)
        h = F.relu(self.up(F.relu(self.branch(a)) + b))
        first, rest = torch.split(h.narrow(3, 2, 8), [1, 2], dim=1)
        out = self.head(torch.cat([rest, first], 1).flatten(1))
        return out.squeeze(1) if self.outputs == 1 else out


SMALL, ROW, SHORT = (1, 5, 5), (1, 10), (1, 8)
OPERATIONS = {  # name: (module of `outputs`, input shape, fused into the pair program)
    "conv2d_reflect": layer(lambda: nn.Conv2d(4, 3, 3, padding=1, padding_mode="reflect")),
    "conv2d_replicate_stride": layer(lambda: nn.Conv2d(4, 3, 3, stride=2, padding=2, padding_mode="replicate")),
    "conv2d_circular_groups": layer(lambda: nn.Conv2d(4, 4, 3, padding=(1, 2), groups=2, padding_mode="circular")),
    "conv2d_reflect_same_even": layer(lambda: nn.Conv2d(4, 2, 4, padding="same", padding_mode="reflect", bias=False)),
    "conv1d_reflect_dilation": layer(lambda: nn.Conv1d(4, 2, 3, padding=2, dilation=2, padding_mode="reflect"), ROW),
    "conv1d_circular": layer(lambda: nn.Conv1d(4, 2, 3, padding=1, padding_mode="circular"), ROW),
    "conv_transpose2d": layer(lambda: nn.ConvTranspose2d(4, 3, 3), SMALL),
    "conv_transpose2d_stride_padding": layer(
        lambda: nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1, output_padding=1), SMALL),
    "conv_transpose2d_groups_no_bias": layer(lambda: nn.ConvTranspose2d(4, 4, 2, stride=2, groups=2, bias=False),
                                             SMALL),
    "conv_transpose2d_dilation": layer(lambda: nn.ConvTranspose2d(4, 2, 2, stride=2, dilation=2), SMALL),
    "conv_transpose1d_stride": layer(lambda: nn.ConvTranspose1d(4, 2, 3, stride=2, padding=1, output_padding=1),
                                     SHORT),
    "functional_conv_transpose2d": apply(lambda s, h: F.conv_transpose2d(h, s.w, s.b, stride=2, padding=1), SMALL,
                                         w=lambda: nn.Parameter(torch.randn(4, 2, 3, 3)),
                                         b=lambda: nn.Parameter(torch.randn(2))),
    "chunk": apply(lambda s, h: torch.cat([h.chunk(2, 1)[1], 2.0 * h.chunk(2, 1)[0]], 1)),
    "split_sections": apply(lambda s, h: swap(torch.split(h, [1, 3], 1))),
    "tensor_split_size": apply(lambda s, h: add(h.split(2, dim=1))),
    "narrow_channels": apply(lambda s, h: torch.narrow(h, 1, 1, 2)),
    "narrow_method_negative": apply(lambda s, h: h.narrow(-3, -2, 2)),
    "unbind_channels": apply(lambda s, h: h.unbind(1)[2].unsqueeze(1) - h.unbind(1)[0].unsqueeze(1), fused=False),
    "split_spatial": apply(lambda s, h: torch.cat([h.split(4, 3)[1], h.split(4, 3)[0]], 3), fused=False),
    "chunk_rows": apply(lambda s, h: add3(h.chunk(3, 2))),
    "chunk_read_whole": apply(lambda s, h: torch.cat(h.chunk(2, 1)[::-1], 1) - torch.cat(torch.split(h, 3, 1), 1)),
    "unbind_stacked": apply(lambda s, h: torch.stack(h.unbind(1)[1:3], 1), fused=False),
    "combined": (lambda outputs=1: randomise_bn(Combined(outputs)), (1, 4, 6), True),
}


def swap(pieces):
    return torch.cat([pieces[1], pieces[0]], 1)


def add(pieces):
    return pieces[0] + pieces[1]


def add3(pieces):
    return pieces[0] + pieces[1] + pieces[2]


def alive(make, x) -> nn.Module:
    """The first of ``make(1)`` over seeds whose output is not the same on every sample (every unit off)."""
    for seed in range(20):
        torch.manual_seed(seed)
        module = make(1).eval()
        with torch.no_grad():
            if float(module(x).std()) > 1e-6:
                return module
    raise AssertionError("every unit off for 20 seeds")


def every_engine_equals_the_plain_network(module, x, fused: bool) -> None:
    """The reference and auto engines, and (fused) numba and torch, equal to the plain pair network; a graph the
    program does not express says so in ``engine``."""
    plain = columns(module, x, factored=False, collapse=False).columns_tensor(range(len(x)))
    auto = columns(module, x)
    if fused:
        assert auto.engine == "fused pair program (numba)"
    else:
        assert auto.engine.startswith("factored torch (not fused: "), auto.engine
    for engine in ("reference", "auto") + (("numba", "torch") if fused else ()):
        assert relative(columns(module, x, engine=engine).columns_tensor(range(len(x))), plain) < TOL, engine
    assert relative(auto.block([2, 0, 1]), plain[[2, 0, 1]][:, [2, 0, 1]]) < TOL


@pytest.mark.parametrize("outputs", [1, 3])
@pytest.mark.parametrize("case", sorted(OPERATIONS))
def test_against_enumerated_paths_and_every_engine(case, outputs):
    torch.manual_seed(0)
    make, shape, fused = OPERATIONS[case]
    module = make(outputs).eval()
    check_against_enumeration(module, inputs(shape, n=3))
    every_engine_equals_the_plain_network(module, inputs(shape, n=6), fused)


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_a_padding_mode_is_its_pad_then_the_unpadded_convolution(mode):
    """The same kernel as F.pad(x, p, mode) before the convolution with padding 0, and the pair network counts the
    weights that join two units: 2 at a reflected border, not the 0/1 connectivity (DESIGN.md §2c)."""
    torch.manual_seed(0)
    conv = nn.Conv2d(1, 1, 3, padding=1, padding_mode=mode)
    plain = nn.Conv2d(1, 1, 3)
    plain.load_state_dict(conv.state_dict())
    padded = nn.Sequential(conv, nn.Flatten(), nn.Linear(36, 1))
    written = nn.Sequential({"reflect": nn.ReflectionPad2d, "replicate": nn.ReplicationPad2d,
                             "circular": nn.CircularPad2d}[mode](1), plain, nn.Flatten(), padded[2])
    x = inputs((1, 6, 6), n=4)
    k = columns(padded, x).columns_tensor(range(4))
    assert relative(k, columns(written, x).columns_tensor(range(4))) < TOL
    if mode == "reflect":  # the unit (1, 1) is padded at (2, 2) and reflected to (0, 2), (2, 0), (0, 0)
        graph = trace(nn.Sequential(conv, nn.Flatten()).eval(), x)
        unit = torch.zeros(1, 1, 6, 6, dtype=torch.float64)
        unit[0, 0, 1, 1] = 1.0
        w = conv.weight.detach().double()[0, 0] ** 2
        expected = w.sum() + w[0].sum() + w[:, 0].sum() + w[0, 0]  # one edge per (weight, input, output)
        expected += 36 * float(conv.bias.detach()) ** 2  # the bias starts a path at each output
        assert float(run(graph, unit, "norm").sum()) == pytest.approx(float(expected), rel=1e-12)


def test_refusals_name_what_is_left():
    """A transposed convolution called with output_size=, pieces of a split read other than by index."""

    class OutputSize(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = nn.ConvTranspose2d(1, 1, 3, stride=2)

        def forward(self, x):
            return self.up(x, output_size=[12, 12]).flatten(1).sum(1)
    with pytest.raises(NotPiecewiseLinearError, match=r"up: ConvTranspose2d is linear but not in the operation table "
                                                      r"yet: output_size= .* Choices: set output_padding"):
        trace(OutputSize(), inputs((1, 5, 5)))
    split_by_input = Apply(lambda s, h: h.split(h.size(1) // 2, 1)[0])
    with pytest.raises(NotPiecewiseLinearError, match="sizes are computed inside forward|computed inside forward"):
        trace(split_by_input, inputs((1, 6, 6)))

    class BufferWeight(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("kernel", torch.ones(1, 1, 3, 3))

        def forward(self, x):
            return F.conv2d(x, self.kernel).flatten(1).sum(1)
    with pytest.raises(NotPiecewiseLinearError, match="its weight is a buffer or constant"):
        trace(BufferWeight(), inputs((1, 6, 6)))
    looped = Apply(lambda s, h: h, layer=nn.Identity())
    looped.fn = lambda s, h: sum(piece for piece in h.chunk(2, 1))
    with pytest.raises(NotPiecewiseLinearError, match=r"iterates over .* take the pieces by index"):
        trace(looped, inputs((1, 6, 6)))


@pytest.mark.parametrize("case", sorted(OPERATIONS))
def test_the_whole_network_analysis_runs(case):
    make, shape, _ = OPERATIONS[case]
    x = digits([3, 8], 30)[0].flatten(1)[:, 20:20 + math.prod(shape)].reshape(-1, *shape) - 0.5  # the middle rows
    module = two_classes(alive(make, x), x)
    with eval_mode(module):
        y = own_labels(module, x)
    analysis = whole_network_support_vectors(module, x, y)
    assert analysis.n_support >= 1 and analysis.wbar_norm > 0


def test_reading_a_splits_shapes_leaves_the_module_as_it_was():
    """The shapes of a split come from one forward of the traced graph: BatchNorm in training mode (refused) keeps
    its running statistics, the random state is as before."""
    module = Apply(lambda s, h: s.bn(h).chunk(2, 1)[0], bn=nn.BatchNorm2d(4)).train()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    state = torch.random.get_rng_state()
    with pytest.raises(NotPiecewiseLinearError, match="BatchNorm in training mode"):
        trace(module, inputs((1, 6, 6)))
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())
    assert torch.equal(torch.random.get_rng_state(), state)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("case", ["combined", "conv_transpose2d_groups_no_bias", "chunk_rows"])
def test_on_cuda_the_torch_engine_equals_numba(case):
    torch.manual_seed(0)
    make, shape, _ = OPERATIONS[case]
    module, x = make(3).eval(), inputs(shape, n=8)
    cpu = columns(module, x, engine="numba").columns_tensor(range(len(x)))
    gpu = columns(module.cuda(), x.cuda(), engine="torch")
    assert gpu.engine == "fused pair program (torch)"
    assert relative(gpu.columns_tensor(range(len(x))).cpu(), cpu) < TOL
