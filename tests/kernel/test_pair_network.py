"""The pair network (DESIGN.md §2c) against explicitly enumerated paths of tiny networks."""
from __future__ import annotations

import copy

import numpy as np

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st
from torch import nn

from lightning_nsv.kernel import (NotPiecewiseLinearError, PairNetworkColumns, compute_gates, output_gram, path_kernel,
                                  path_norm_squared, scope_summary, trace, unique_patterns)
from lightning_nsv.kernel.rules import Linear
from lightning_nsv.models.layers import LeakyReLUFamily, mlp_sequential
from tests.pair_reference import output_phi, shared_paths

TOL = 1e-12


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny float64 convolutions: one thread is ~1000× faster than two on a shared host."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-300))


def randomise_bn(module: nn.Module, seed: int = 0) -> nn.Module:
    gen = torch.Generator().manual_seed(seed)
    for m in module.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen))
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
            if m.affine:
                m.weight.data.copy_(torch.randn(m.num_features, generator=gen))
                m.bias.data.copy_(torch.randn(m.num_features, generator=gen))
    return module.eval()


def reference_output(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return copy.deepcopy(module).double()(x.double())


def check_against_enumeration(module: nn.Module, x: torch.Tensor) -> dict[str, float]:
    """<phi, wbar> = N(x), K = Phi Phiᵀ (columns, block, diagonal), ||wbar||² or the output Gram, all to 1e-12."""
    graph = trace(module, x)
    gates = compute_gates(graph, x)
    n_x = reference_output(module, x)
    cols = PairNetworkColumns(graph, x, gates, fast=False, memory_bytes=1 << 16)
    kernel = cols.columns_tensor(range(len(x)))
    plain = PairNetworkColumns(graph, x, gates, fast=False, collapse=False, memory_bytes=1 << 16)
    errors = {"output_vs_module": relative(gates.output, n_x), "plain": relative(plain.columns_tensor(range(len(x))), kernel)}
    for k in range(graph.num_outputs):
        phi, wbar = output_phi(graph, x, k)
        out_k = n_x if n_x.dim() == 1 else n_x[:, k]
        errors[f"phi_wbar_{k}"] = relative(phi @ wbar, out_k)
        errors[f"kernel_{k}"] = relative(kernel, phi @ phi.T)
        if graph.num_outputs == 1:
            errors["norm"] = abs(path_norm_squared(graph) - float(wbar @ wbar)) / float(wbar @ wbar)
    errors["block"] = relative(cols.block([2, 0, 1]), kernel[[2, 0, 1]][:, [2, 0, 1]])
    errors["diagonal"] = relative(cols.diagonal_tensor(), kernel.diagonal())
    errors["gram_diagonal"] = relative(output_gram(graph).diagonal(), _norm_outputs(graph))
    assert max(errors.values()) < TOL, errors
    return errors


def _norm_outputs(graph):
    from lightning_nsv.kernel.path_norm import _norm
    return _norm(graph).reshape(-1).cpu()


class Residual(nn.Module):
    """Conv trunk with a residual sum, a learnable scale and shift, constants, a concatenation and a mean."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 2, 3, padding=1)
        self.bn = nn.BatchNorm2d(2)
        self.block = nn.Sequential(nn.Conv2d(2, 2, 3, padding="same", bias=False), nn.LeakyReLU(0.2),
                                   nn.Dropout(0.3))
        self.scale = nn.Parameter(torch.randn(2, 1, 1))
        self.shift = nn.Parameter(torch.randn(2, 1, 1))
        self.head = nn.Linear(2 * 4 * 4 + 2, 1)

    def forward(self, x):
        h = F.relu(self.bn(self.conv1(x - 0.5)))
        h = h + self.scale * self.block(h) - h / 4
        h = F.max_pool2d(h, 2) + self.shift
        pooled = h.mean((2, 3))
        return self.head(torch.cat([torch.flatten(h, 1), 2.0 * pooled], dim=1)).squeeze(1)


class TinyResNet(nn.Module):
    """A ResNet basic block with a strided 1×1 downsample, BatchNorm everywhere, in-place ReLU, global average
    pooling and a 3-class head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.bn0 = nn.Conv2d(1, 2, 3, padding=1, bias=False), nn.BatchNorm2d(2)
        self.conv1, self.bn1 = nn.Conv2d(2, 2, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(2)
        self.conv2, self.bn2 = nn.Conv2d(2, 2, 3, padding=1, bias=False), nn.BatchNorm2d(2)
        self.down = nn.Sequential(nn.Conv2d(2, 2, 1, stride=2, bias=False), nn.BatchNorm2d(2))
        self.relu = nn.ReLU(inplace=True)
        self.pool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(2, 3)

    def forward(self, x):
        x = self.relu(self.bn0(self.stem(x)))
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out = self.relu(out + self.down(x))
        return self.fc(torch.flatten(self.pool(out), 1))


class Reshapes(nn.Module):
    """Functional and method forms: view with a size, unsqueeze/permute/transpose, in-place sum, buffers as a constant
    scale and shift, division by a parameter, negation, functional pools, sum, dropout in eval, an output index."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 3, padding=1, bias=False)
        self.register_buffer("offset", torch.tensor([0.25, -0.5]).view(1, 2, 1, 1))
        self.register_buffer("gain", torch.tensor([2.0, -3.0]).view(1, 2, 1, 1))
        self.divisor = nn.Parameter(torch.tensor([1.5, -0.7]).view(2, 1, 1))
        self.unflatten = nn.Unflatten(1, (2, 16))
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        h = x.view(x.size(0), 2, 6, 6) + self.offset
        h = self.conv(h)
        h += self.gain * h.relu()
        h = -F.avg_pool2d(h, 2, stride=1) / self.divisor        # (n, 2, 5, 5)
        h = F.adaptive_max_pool2d(h, (4, 4))
        h = F.dropout(h, 0.5, training=False)
        h = self.unflatten(torch.flatten(h, 1)).unsqueeze(1)     # (n, 1, 2, 16)
        h = h.permute(0, 1, 3, 2).transpose(2, 3).squeeze(1)    # (n, 2, 16)
        h = self.head(h).sum(1) + torch.sum(h, dim=(1, 2), keepdim=True)[:, 0]
        return h[:, 1]


def conv_net(conv: nn.Module, pool: nn.Module, features: int, outputs: int = 1, act: nn.Module | None = None):
    return nn.Sequential(conv, act or nn.ReLU(), pool, nn.Flatten(), nn.Linear(features, outputs))


def inputs(shape, n=4, seed=1):
    return torch.randn(n, *shape, generator=torch.Generator().manual_seed(seed))


CASES = {
    "conv_relu_linear": (lambda: conv_net(nn.Conv2d(1, 2, 3, padding=1), nn.Identity(), 2 * 64), (1, 8, 8)),
    "conv_stride_dilation_groups": (lambda: nn.Sequential(
        nn.Conv2d(2, 4, 3, stride=2, padding=2, dilation=2, groups=2), LeakyReLUFamily(0.1, 1.0),
        nn.Conv2d(4, 2, (2, 3), padding="same", bias=False), nn.Flatten(), nn.Linear(2 * 16, 1)), (2, 8, 8)),
    "batchnorm_maxpool": (lambda: randomise_bn(nn.Sequential(
        nn.Conv2d(1, 3, 3, bias=False), nn.BatchNorm2d(3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(27, 1))), (1, 8, 8)),
    "maxpool_padding_ceil": (lambda: conv_net(nn.Conv2d(1, 2, 3), nn.MaxPool2d(3, stride=2, padding=1,
                                                                               ceil_mode=True),
                                              2 * 16), (1, 8, 8)),
    "maxpool_dilation": (lambda: conv_net(nn.Conv2d(1, 1, 3, padding=1), nn.MaxPool2d(2, dilation=2), 9),
                         (1, 8, 8)),
    "adaptive_maxpool": (lambda: conv_net(nn.Conv2d(1, 2, 3), nn.AdaptiveMaxPool2d((4, 3)), 24), (1, 8, 8)),
    "avgpool_exclude_pad_ceil": (lambda: conv_net(nn.Conv2d(1, 2, 3), nn.AvgPool2d(3, 2, 1, ceil_mode=True,
                                                                                  count_include_pad=False),
                                                  2 * 16), (1, 8, 8)),
    "avgpool_include_pad": (lambda: conv_net(nn.Conv2d(1, 2, 3, padding=1), nn.AvgPool2d(3, 2, 1), 2 * 16),
                            (1, 8, 8)),
    "adaptive_avgpool_3_outputs": (lambda: conv_net(nn.Conv2d(1, 2, 3), nn.AdaptiveAvgPool2d((4, 3)), 24, 3),
                                   (1, 8, 8)),
    "residual_scale_shift_cat_mean": (lambda: randomise_bn(Residual()), (1, 8, 8)),
    "conv1d_abs": (lambda: nn.Sequential(nn.Conv1d(2, 3, 3, stride=2, padding=1), LeakyReLUFamily(-1.0, 1.0),
                                         nn.AvgPool1d(2), nn.Flatten(), nn.Linear(6, 2)), (2, 8)),
    "conv3d_bn_maxpool": (lambda: randomise_bn(nn.Sequential(
        nn.Conv3d(1, 2, 2), nn.BatchNorm3d(2), nn.ReLU(), nn.MaxPool3d(2, ceil_mode=True), nn.Flatten(),
        nn.Linear(16, 1))), (1, 4, 4, 4)),
    "reshapes_functional_buffers": (lambda: Reshapes(), (72,)),
    "tiny_resnet_3_outputs": (lambda: randomise_bn(TinyResNet()), (1, 6, 6)),
    "mlp_bias": (lambda: mlp_sequential(16, [5, 4], 1, beta=0.1), (4, 4)),
    "mlp_no_bias_3_outputs": (lambda: mlp_sequential(16, [5, 4], 3, activation="relu", bias=False), (16,)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_pair_network_equals_enumerated_paths(case):
    torch.manual_seed(0)
    make, shape = CASES[case]
    check_against_enumeration(make(), inputs(shape))


def test_multi_output_gram_equals_shared_path_space():
    torch.manual_seed(0)
    module = conv_net(nn.Conv2d(1, 2, 3), nn.MaxPool2d(2), 18, outputs=3)
    x = inputs((1, 8, 8))
    graph = trace(module, x)
    gates = compute_gates(graph, x)
    last = next(name for name, rule in graph.rules.items() if isinstance(rule, Linear))
    phi, wbar = shared_paths(graph, x, last)
    assert relative(phi @ wbar, reference_output(module, x)) < TOL
    assert relative(output_gram(graph), wbar.T @ wbar) < TOL
    kernel = PairNetworkColumns(graph, x, gates).columns_tensor(range(len(x)))
    assert relative(kernel, phi @ phi.T) < TOL


@pytest.mark.parametrize("beta", [0.0, 0.1, -1.0, 1.0])
@pytest.mark.parametrize("bias", [False, True])
def test_mlp_pair_network_equals_factorised_kernel(beta, bias):
    torch.manual_seed(int(10 * beta) + bias)
    module = mlp_sequential(12, [6, 5, 4], 1, beta=beta, bias=bias)
    x = inputs((12,), n=9)
    graph = trace(module, x)
    assert graph.chain is not None
    gates = compute_gates(graph, x)
    slopes = [torch.where(gates.bits[g[0]], torch.tensor(g[3], dtype=torch.float64),
                          torch.tensor(g[2], dtype=torch.float64)) for g in graph.gates]
    factorised = path_kernel(x.double(), slopes, bias=bias)
    pair = PairNetworkColumns(graph, x, gates, fast=False).columns_tensor(range(9))
    fast = PairNetworkColumns(graph, x, gates).columns_tensor(range(9))
    assert relative(pair, factorised) < TOL
    assert relative(fast, factorised) < TOL
    assert relative(PairNetworkColumns(graph, x, gates).diagonal_tensor(), factorised.diagonal()) < TOL


def test_batchnorm_folded_into_bias_free_conv_gives_same_kernel():
    torch.manual_seed(0)
    conv, bn = nn.Conv2d(1, 2, 3, bias=False).double(), nn.BatchNorm2d(2).double()
    unfolded = randomise_bn(nn.Sequential(conv, bn, nn.ReLU(), nn.Flatten(), nn.Linear(72, 1).double()))
    folded_conv = nn.Conv2d(1, 2, 3).double()
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    folded_conv.weight.data = conv.weight.data * scale.detach()[:, None, None, None]
    folded_conv.bias.data = (bn.bias - scale * bn.running_mean).detach()
    folded = nn.Sequential(folded_conv, nn.ReLU(), nn.Flatten(), unfolded[4]).eval()
    x = inputs((1, 8, 8), n=6).double()
    kernels, norms = [], []
    for module in (unfolded, folded):
        graph = trace(module, x)
        kernels.append(PairNetworkColumns(graph, x, compute_gates(graph, x)).columns_tensor(range(6)))
        norms.append(path_norm_squared(graph))
    assert relative(kernels[0], kernels[1]) < TOL
    assert norms[0] == pytest.approx(norms[1], rel=1e-12)


def test_module_unchanged_by_trace_and_gates():
    torch.manual_seed(0)
    module = randomise_bn(Residual())
    module.block[2].eval()  # the whole module stays in eval except what the user set; record everything
    modes = {name: m.training for name, m in module.named_modules()}
    state = {k: v.clone() for k, v in module.state_dict().items()}
    x = inputs((1, 8, 8))
    graph = trace(module, x)
    gates = compute_gates(graph, x)
    PairNetworkColumns(graph, x, gates).columns_tensor([0, 1])
    path_norm_squared(graph)
    assert {name: m.training for name, m in module.named_modules()} == modes
    assert all(v.dtype == state[k].dtype and torch.equal(v, state[k]) for k, v in module.state_dict().items())
    assert gates.output.dtype == torch.float64
    assert all(b.dtype == torch.bool for b in gates.bits.values())
    assert all(s.dtype == torch.int32 for s in gates.selections.values())


def test_scope_summary_and_unique_patterns():
    torch.manual_seed(0)
    module = Residual().eval()
    x = inputs((1, 8, 8), n=6)
    graph = trace(module, x)
    gates = compute_gates(graph, x)
    summary = scope_summary(graph)
    # maps: conv1, bn, block conv, learnable scale, head; gates: 2 layers of 2×8×8, one max pool of 2×4×4
    assert (summary.maps, summary.gate_layers, summary.max_pools, summary.gates) == (5, 2, 1, 288)
    assert str(summary) == "whole network: 5 maps, 2 gate layers, 1 max-pool, 288 gates"
    rows = torch.cat([b.reshape(6, -1).long() for b in gates.bits.values()]
                     + [s.reshape(6, -1).long() for s in gates.selections.values()], 1)
    doubled = torch.cat([x, x[:2]])
    gates2 = compute_gates(graph, doubled)
    count = torch.unique(rows, dim=0).shape[0]
    assert count > 1 and unique_patterns(gates) == count
    assert unique_patterns(gates, gates2) == count
    assert unique_patterns(compute_gates(graph, x[:3]), compute_gates(graph, x[3:])) == count



@pytest.mark.parametrize("hashes", ["computed", "all equal", "two values"])
def test_distinct_rows_is_exact_whatever_the_hash(hashes):
    """Rows that share a hash are compared byte for byte: one hash for every row, or two, count the same as the
    real hash and as numpy's unique rows."""
    from lightning_nsv.kernel.summary import _row_hashes, distinct_rows

    rng = np.random.default_rng(3)
    base = rng.integers(0, 2, size=(40, 13), dtype=np.uint8)
    rows = np.concatenate([base, base[:17], base[5:9]])
    pieces = [np.packbits(rows[:, :9], axis=1), rows[:, 9:].copy()]
    expected = len(np.unique(rows, axis=0))
    given = {"computed": _row_hashes(pieces), "all equal": np.zeros(len(rows), dtype=np.uint64),
             "two values": (np.arange(len(rows)) % 2).astype(np.uint64)}[hashes]
    assert distinct_rows(pieces, given) == expected == 40

class GELUBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 1, 3)
        self.act = nn.GELU()

    def forward(self, x):
        return self.act(self.conv(x))


class Wrap(nn.Module):
    def __init__(self, body) -> None:
        super().__init__()
        self.body = body
        self.head = nn.Linear(36, 1)

    def forward(self, x):
        return self.head(torch.flatten(self.body(x), 1))


class Lambda(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 1, 3)
        self.fn = fn

    def forward(self, x):
        return torch.flatten(self.fn(self, self.conv(x)), 1).sum(1)


REFUSALS = {
    "gelu": (Wrap(nn.Sequential(nn.Conv2d(1, 1, 3), nn.Sequential(GELUBlock()))), "body.1.0.act: GELU",
             "GELU's slope varies continuously"),
    "sigmoid": (Lambda(lambda s, h: torch.sigmoid(h)), "sigmoid", "slope varies continuously"),
    "tanh": (Lambda(lambda s, h: h.tanh()), "tanh", "slope varies continuously"),
    "softplus": (Lambda(lambda s, h: F.softplus(h)), "softplus", "slope varies continuously"),
    "product": (Lambda(lambda s, h: F.relu(h) * h), "mul", "product"),
    "softmax": (Lambda(lambda s, h: F.softmax(h, dim=-1)), "softmax", "softmax"),
    "layernorm": (Lambda(lambda s, h: F.layer_norm(h, h.shape[-1:])), "layer_norm", "statistic of the sample"),
    "unknown_function": (Lambda(lambda s, h: torch.cumsum(h, 2)), "cumsum", "never skipped"),
    "batch_mixing": (Lambda(lambda s, h: h - h.mean(0, keepdim=True)), "mean", "batch"),
    "control_flow": (Lambda(lambda s, h: h if h.sum() > 0 else -h), "", "control flow"),
}


SMOOTH_ACTIVATIONS = {"gelu", "sigmoid", "tanh", "softplus"}
CHOICE = {"batch_mixing": "reduce over dims >= 1"}  # the first choice offered, where it is not a trunk


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_refusals_name_the_operation_and_the_choices(case):
    module, where, why = REFUSALS[case]
    with pytest.raises(NotPiecewiseLinearError) as info:
        trace(module, inputs((1, 8, 8)))
    message = str(info.value)
    assert where in message and why in message, message
    if case != "control_flow":  # only the choices that apply: a piecewise-linear activation only for an activation
        assert "Choices: " + CHOICE.get(case, "move it into a trunk") in message and "fold" not in message, message
        assert ("replace it by a piecewise-linear activation" in message) == (case in SMOOTH_ACTIVATIONS), message


def test_gelu_refusal_names_the_qualified_module():
    module = Wrap(nn.Sequential(nn.Conv2d(1, 1, 3), nn.Sequential(GELUBlock())))
    with pytest.raises(NotPiecewiseLinearError, match=r"body\.1\.0\.act: GELU is not piecewise linear"):
        trace(module, inputs((1, 8, 8)))


@pytest.mark.parametrize("layer, why", [
    (nn.LayerNorm([6, 6]), "statistic of the sample"), (nn.GroupNorm(1, 1), "statistic of the sample"),
    (nn.Sigmoid(), "slope varies"), (nn.Tanh(), "slope varies"), (nn.Softplus(), "slope varies"),
    (nn.Hardshrink(), "saturated pieces"), (nn.ConstantPad2d(1, 0.5), "not in the operation table"),
    (nn.BatchNorm2d(1).train(), "training mode"), (nn.Dropout(0.5).train(), "dropout in training mode"),
])
def test_refused_modules(layer, why):
    module = nn.Sequential(nn.Conv2d(1, 1, 3), layer, nn.Flatten(), nn.Linear(36, 1))
    with pytest.raises(NotPiecewiseLinearError, match=why):
        trace(module, inputs((1, 8, 8)))


def test_refused_attention():
    """(A convolution's padding_mode, once refused here, is analysed: tests/kernel/test_vocabulary_linear.py.)"""

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = nn.MultiheadAttention(4, 1, batch_first=True)

        def forward(self, x):
            return self.attn(x, x, x)[0].sum((1, 2))
    with pytest.raises(NotPiecewiseLinearError, match="attn: MultiheadAttention"):
        trace(Attention(), inputs((3, 4)))


@st.composite
def architectures(draw):
    """A random tiny CNN: 1–2 conv blocks (stride, padding, dilation, groups, bias, BN, gate, pool), a Linear head."""
    channels = draw(st.sampled_from([1, 2]))
    size = 6
    layers: list[nn.Module] = []
    for _ in range(draw(st.integers(1, 2))):
        groups = draw(st.sampled_from([1, channels]))
        out = groups * draw(st.integers(1, 2))
        kernel, dilation = draw(st.integers(1, 3)), draw(st.integers(1, 2))
        padding = draw(st.integers(0, (kernel * dilation) // 2))
        stride = draw(st.integers(1, 2))
        span = dilation * (kernel - 1) + 1
        if size + 2 * padding < span:
            continue
        layers.append(nn.Conv2d(channels, out, kernel, stride, padding, dilation, groups,
                                bias=draw(st.booleans())))
        size = (size + 2 * padding - span) // stride + 1
        channels = out
        if draw(st.booleans()):
            layers.append(nn.BatchNorm2d(channels))
        layers.append(draw(st.sampled_from([nn.ReLU(), nn.LeakyReLU(0.1), LeakyReLUFamily(-1.0, 1.0),
                                            nn.Identity()])))
        if size >= 2:
            pool = draw(st.sampled_from(["none", "max", "avg", "adaptive_max", "adaptive_avg"]))
            if pool != "none":
                layers.append({"max": nn.MaxPool2d(2, ceil_mode=True), "avg": nn.AvgPool2d(2, 1, 1),
                               "adaptive_max": nn.AdaptiveMaxPool2d(2),
                               "adaptive_avg": nn.AdaptiveAvgPool2d(2)}[pool])
                size = {"max": (size + 1) // 2, "avg": size + 1}.get(pool, 2)
    outputs = draw(st.sampled_from([1, 2]))
    layers += [nn.Flatten(), nn.Linear(channels * size * size, outputs)]
    return layers, draw(st.integers(0, 1000))


@settings(max_examples=12, deadline=None)
@given(architectures())
def test_random_architectures_against_enumeration(spec):
    layers, seed = spec
    torch.manual_seed(seed)
    module = randomise_bn(nn.Sequential(*layers), seed)
    check_against_enumeration(module, inputs((layers[0].in_channels, 6, 6), n=3, seed=seed))


def test_pair_blocks_do_not_depend_on_memory_budget():
    torch.manual_seed(0)
    module = randomise_bn(Residual())
    x = inputs((1, 8, 8), n=7)
    graph = trace(module, x)
    gates = compute_gates(graph, x, memory_bytes=1 << 12)
    small = PairNetworkColumns(graph, x, gates, memory_bytes=1 << 12).columns_tensor([3, 1, 4])
    large = PairNetworkColumns(graph, x, compute_gates(graph, x)).columns_tensor([3, 1, 4])
    assert torch.equal(small, large)


def test_plain_chain_takes_the_fast_path_and_others_do_not():
    x = inputs((4, 4))
    assert trace(mlp_sequential(16, [5, 4], 1), x).chain is not None
    assert trace(mlp_sequential(16, [5], 3, bias=False), x).chain is not None
    assert trace(nn.Sequential(nn.Flatten(), nn.Linear(16, 3), nn.Linear(3, 1)), x).chain is None
    assert trace(CASES["conv_relu_linear"][0](), inputs((1, 8, 8))).chain is None
    mixed = nn.Sequential(nn.Flatten(), nn.Linear(16, 3), nn.ReLU(), nn.Linear(3, 1, bias=False))
    assert trace(mixed, x).chain is None  # a bias-free last layer: §1's bias variant would count its bias paths


class Outputs(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.fn = fn

    def forward(self, x):
        return self.fn(self, self.fc(x))


@pytest.mark.parametrize("fn, match", [
    (lambda s, h: (h, h), "one tensor of logits"),
    (lambda s, h: h.t(), "batch|operation table"),
    (lambda s, h: h.permute(1, 0), "batch"),
    (lambda s, h: h.reshape(-1), "batch"),
    (lambda s, h: h[0], "batch"),
    (lambda s, h: torch.cat([h, h], 0), "batch"),
    (lambda s, h: h * s.fc.weight.sum(), "computes a tensor from parameters"),
    (lambda s, h: h / h[:, :1], "input-dependent"),
    (lambda s, h: h.sum(), "batch"),
    (lambda s, h: torch.cumsum(h, 1), "cumsum is not in the operation table"),  # (F.linear is: idioms)
    (lambda s, h: h.mean(h.dim() - 1), "computed inside forward"),
])
def test_refused_graphs(fn, match):
    with pytest.raises(ValueError, match=match):
        trace(Outputs(fn), inputs((4,)))


def test_two_inputs_refused():
    class Two(nn.Module):
        def forward(self, x, y):
            return x.sum(1) + y.sum(1)
    with pytest.raises(NotPiecewiseLinearError, match="2 arguments"):
        trace(Two(), inputs((4,)))


def test_non_finite_values_are_errors():
    from lightning_nsv.errors import NonFiniteError
    module = mlp_sequential(4, [3], 1)
    graph = trace(module, inputs((4,)))
    bad = inputs((4,))
    bad[1, 2] = float("nan")
    with pytest.raises(NonFiniteError):
        compute_gates(graph, bad)
    module[1].weight.data[0, 0] = float("inf")
    with pytest.raises(NonFiniteError):
        trace(module, inputs((4,)))


def test_float32_module_analysed_in_float64_exactly():
    """0.1 in float32 is not 0.1: slopes and every computation are float64 whatever the module's dtype."""
    torch.manual_seed(0)
    module = nn.Sequential(nn.Conv1d(1, 2, 3), nn.LeakyReLU(0.1), nn.Flatten(), nn.Linear(12, 1))
    x = inputs((1, 8), n=5)
    graph = trace(module, x)
    gates = compute_gates(graph, x)
    assert graph.rules["_1"].beta == 0.1
    check_against_enumeration(module, x)
    assert next(module.parameters()).dtype == torch.float32


def test_lightning_module_in_training_mode_is_read_as_is():
    """A LightningModule of the package (no BatchNorm or dropout): traced in training mode, left in it."""
    from lightning_nsv.models import ConvFCNet
    torch.manual_seed(0)
    model = ConvFCNet(in_channels=1, image_size=8, fc_depth=1, fc_width=4, conv_channels=2)
    x = inputs((1, 8, 8), n=5)
    graph = trace(model, x)
    assert model.training and next(model.parameters()).dtype == torch.float32
    assert str(scope_summary(graph)) == "whole network: 5 maps, 4 gate layers, 2 max-pools, 212 gates"
    gates = compute_gates(graph, x)
    assert relative(gates.output, reference_output(model, x)) < TOL
    kernel = PairNetworkColumns(graph, x, gates).columns_tensor(range(5))
    phi, _ = output_phi(graph, x, 0)
    assert relative(kernel, phi @ phi.T) < TOL


COLLAPSIBLE = {
    "conv_relu_conv": lambda: nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), nn.Conv2d(3, 2, 3),
                                            nn.LeakyReLU(0.1), nn.Flatten(), nn.Linear(72, 2)),
    "conv_bn_abs_conv_maxpool": lambda: randomise_bn(nn.Sequential(
        nn.Conv2d(2, 3, 3, bias=False), nn.BatchNorm2d(3), LeakyReLUFamily(-1.0, 1.0), nn.Conv2d(3, 2, 2, stride=2),
        nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(2, 1))),
}


@pytest.mark.parametrize("case", sorted(COLLAPSIBLE))
def test_channel_collapse_equals_plain_pair_network(case):
    """DESIGN.md §2c "Speed": gates between a groups=1 conv and a channel sum enter through overlap counts."""
    torch.manual_seed(0)
    module = COLLAPSIBLE[case]()
    x = inputs((2, 8, 8), n=6)
    graph = trace(module, x)
    collapsed = [g for g in graph.gates if graph.rules[g[0]].collapse]
    assert len(collapsed) == {"conv_relu_conv": 2, "conv_bn_abs_conv_maxpool": 1}[case]
    gates = compute_gates(graph, x)
    plain = PairNetworkColumns(graph, x, gates, collapse=False)
    fused = PairNetworkColumns(graph, x, gates)
    assert relative(fused.columns_tensor([4, 0, 2]), plain.columns_tensor([4, 0, 2])) < 1e-14
    assert relative(fused.diagonal_tensor(), plain.diagonal_tensor()) < 1e-14
    assert relative(fused.block([1, 3]), plain.block([1, 3])) < 1e-14
    check_against_enumeration(module, x)


def test_columns_drive_the_max_margin_solver_like_a_dense_kernel():
    from lightning_nsv.solver import max_margin
    torch.manual_seed(0)
    module = CASES["batchnorm_maxpool"][0]()
    x = inputs((1, 8, 8), n=40, seed=3)
    graph = trace(module, x)
    gates = compute_gates(graph, x)
    y = torch.where(gates.output.reshape(-1) >= 0, 1.0, -1.0).double().numpy()  # zero error by construction
    cols = PairNetworkColumns(graph, x, gates)
    dense = cols.columns_tensor(range(40)).numpy()
    exact = max_margin(dense, y)
    served = max_margin(cols, y, kernel_diag=cols.diagonal_tensor().numpy())
    assert set(served.support_) == set(exact.support_)
    assert np.allclose(served.alpha_, exact.alpha_, rtol=1e-8, atol=1e-12)
    assert np.allclose(cols.signed_columns([3, 5], y, 2.0), dense[:, [3, 5]] * y[:, None] * y[[3, 5]] / 2.0,
                       rtol=1e-15, atol=0)


@pytest.mark.parametrize("fn, name", [(lambda s, h: torch.matmul(h, h), "matmul"), (lambda s, h: h @ h, "matmul"),
                                      (lambda s, h: torch.bmm(h[:, 0], h[:, 0]), "bmm")])
def test_a_product_of_two_input_dependent_tensors_is_named_as_one(fn, name):
    """Not "its settings are computed inside forward": a product of two input-dependent tensors, said so."""
    with pytest.raises(NotPiecewiseLinearError, match=rf"{name}: .*{name} of two input-dependent tensors multiplies "
                                                      r"paths of both \(a product is not linear in path space\)"):
        trace(Lambda(fn), inputs((1, 8, 8)))


def test_len_of_the_input_is_its_batch_size():
    module = Lambda(lambda s, h: h.reshape(len(h), -1))
    check_against_enumeration(module, inputs((1, 8, 8), n=3))
    assert "len" not in globals()  # len(x) traced as a size only while tracing


def test_a_linear_operation_outside_the_table_is_headed_linear():
    module = Lambda(lambda s, h: h.chunk(2, 1)[h.size(1) - 1])
    with pytest.raises(NotPiecewiseLinearError, match=r"is linear but not in the operation table yet: "
                                                      r"its pieces are read at an index computed inside "
                                                      r"forward.* Choices: take the pieces by constant index"):
        trace(module, inputs((1, 8, 8)))
