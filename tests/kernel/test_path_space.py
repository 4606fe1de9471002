import pytest
import torch

from lightning_nsv.kernel import PathNetwork, forward_with_slopes, path_kernel, path_kernel_diagonal, path_signs
from lightning_nsv.kernel.formulas import path_norm_squared, slopes, unique_patterns
from lightning_nsv.models.layers import mlp_sequential
from tests.reference import materialise_phi, materialise_wbar

BETAS = [0.0, 0.1, -1.0, 1.0]


def random_net(widths, in_features=4, beta=0.1, gamma=1.0, bias=True, seed=0) -> PathNetwork:
    gen = torch.Generator().manual_seed(seed)
    sizes = [in_features, *widths, 1]
    weights = [torch.randn(sizes[k + 1], sizes[k], generator=gen, dtype=torch.float64) for k in range(len(sizes) - 1)]
    biases = [torch.randn(s, generator=gen, dtype=torch.float64) for s in sizes[1:]] if bias else None
    return PathNetwork(tuple(weights), None if biases is None else tuple(biases), (beta,) * len(widths),
                       (gamma,) * len(widths))


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-300))


@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("widths", [(), (3,), (3, 2), (2, 3, 2)])
def test_path_expansion_matches_network_and_kernel(beta, bias, widths):
    net = random_net(widths, beta=beta, bias=bias, seed=len(widths))
    x = torch.randn(7, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    outputs, layer_slopes = forward_with_slopes(net, x)
    phi, wbar = materialise_phi(net, x), materialise_wbar(net)

    assert phi.shape == (7, net.num_paths)
    assert relative(phi @ wbar, outputs) < 1e-10
    kernel = path_kernel(x, layer_slopes, bias=bias)
    assert relative(kernel, phi @ phi.T) < 1e-10
    assert relative(path_kernel_diagonal(x, layer_slopes, bias=bias), (phi * phi).sum(1)) < 1e-10
    assert path_norm_squared(net) == pytest.approx(float(wbar @ wbar), rel=1e-10)

    signs = path_signs(net)
    assert signs.positive_count == int((wbar > 0).sum())
    assert signs.negative_count == int((wbar < 0).sum())
    assert signs.positive_mass == pytest.approx(float(wbar.clamp(min=0).sum()), rel=1e-10)
    assert signs.negative_mass == pytest.approx(float((-wbar).clamp(min=0).sum()), rel=1e-10)


@pytest.mark.parametrize("bias", [False, True])
def test_cross_kernel_blockwise_equals_materialised(bias):
    net = random_net((3, 3), beta=0.1, bias=bias)
    gen = torch.Generator().manual_seed(3)
    x_a, x_b = torch.randn(5, 4, generator=gen, dtype=torch.float64), torch.randn(6, 4, generator=gen, dtype=torch.float64)
    _, s_a = forward_with_slopes(net, x_a)
    _, s_b = forward_with_slopes(net, x_b)
    expected = materialise_phi(net, x_a) @ materialise_phi(net, x_b).T
    for block_size in (1, 2, None):
        assert relative(path_kernel(x_a, s_a, x_b, s_b, bias=bias, block_size=block_size), expected) < 1e-10
    own = materialise_phi(net, x_b) @ materialise_phi(net, x_b).T
    for block_size in (1, 2, 4, None):  # the kernel of one set mirrors its upper blocks
        assert relative(path_kernel(x_b, s_b, bias=bias, block_size=block_size), own) < 1e-10


@pytest.mark.parametrize("block_size", [None, 7, 64])
def test_kernel_of_one_set_is_exactly_symmetric(block_size):
    # a BLAS product X Xᵀ need not be exactly symmetric (observed with 784 features); the kernel must be
    net = random_net((8, 5), in_features=784, bias=False)
    x = torch.randn(64, 784, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    _, layer_slopes = forward_with_slopes(net, x)
    kernel = path_kernel(x, layer_slopes, block_size=block_size)
    assert torch.equal(kernel, kernel.T)
    assert relative(kernel, materialise_phi(net, x) @ materialise_phi(net, x).T) < 1e-10


@pytest.mark.parametrize("beta", BETAS)
def test_forward_matches_torch_module(beta):
    torch.manual_seed(0)
    module = mlp_sequential(6, [5, 4], 1, "leaky_relu", beta=beta, gamma=1.0).double()
    linears = [m for m in module if isinstance(m, torch.nn.Linear)]
    net = PathNetwork.from_tensors([m.weight for m in linears], [m.bias for m in linears], [beta] * 2, [1.0] * 2)
    x = torch.randn(10, 6, dtype=torch.float64)
    assert torch.allclose(forward_with_slopes(net, x)[0], module(x)[:, 0], rtol=1e-12, atol=1e-12)


def test_slopes_convention_and_dtype():
    z = torch.tensor([-2.0, 0.0, 3.0], dtype=torch.float64)
    assert slopes(z, 0.1, 1.0).tolist() == [0.1, 1.0, 1.0]
    assert slopes(z, 0.1, 1.0).dtype == torch.float64
    assert slopes(z, 0.1, 1.0)[0].item() == 0.1  # computed in float64, not rounded through float32
    assert slopes(z, -1.0, 1.0).tolist() == [-1.0, 1.0, 1.0]


def test_num_paths_counts_bias_paths():
    net = random_net((3, 2), in_features=4, bias=True)
    assert net.num_paths == 4 * 3 * 2 + (3 * 2 + 2) + 1
    assert random_net((3, 2), in_features=4, bias=False).num_paths == 24


def test_unique_patterns_by_hand():
    layer1 = torch.tensor([[1.0, 0.1], [1.0, 0.1], [0.1, 0.1], [1.0, 1.0]])
    layer2 = torch.tensor([[1.0], [0.1], [1.0], [1.0]])
    assert unique_patterns([layer1, layer2], gammas=[1.0, 1.0]) == 4
    assert unique_patterns([layer1[:2], layer2[:2] * 0 + 1.0], gammas=[1.0, 1.0]) == 1
    assert unique_patterns([layer1[:2], layer2[:2]], [layer1[:2], layer2[:2]], gammas=[1.0, 1.0]) == 2
    wide = torch.ones(3, 20)
    wide[1, 13] = 0.0
    assert unique_patterns([wide], gammas=[1.0]) == 2


@pytest.mark.parametrize("widths", [(3,), (16, 16, 16), (40, 40), (64,), (100, 7)])
def test_unique_patterns_counts_distinct_rows(widths):
    """Against a set of tuples: patterns of one machine word (<= 64 units) and of several, with repeats."""
    g = torch.Generator().manual_seed(len(widths))
    layers = [torch.where(torch.rand(300, w, generator=g) < 0.5, 1.0, 0.2) for w in widths]
    repeated = [torch.cat([s, s[:120], s[7:9]]) for s in layers]
    for slopes in (layers, repeated, [s[:40].repeat(3, 1) for s in layers]):
        bits = torch.cat([s == 1.0 for s in slopes], dim=1)
        assert unique_patterns(slopes, gammas=[1.0] * len(widths)) == len(set(map(tuple, bits.tolist())))


def test_path_signs_all_positive_network():
    net = random_net((3, 3), bias=False)
    positive = PathNetwork(tuple(w.abs() for w in net.weights), None, net.betas, net.gammas)
    signs = path_signs(positive)
    assert signs.positive_count_fraction == 1.0
    assert signs.positive_mass_fraction == 1.0
    assert signs.positive_mass == pytest.approx(float(materialise_wbar(positive).sum()))


def test_path_network_validation_messages():
    w = [torch.randn(3, 4), torch.randn(1, 3)]
    with pytest.raises(ValueError, match="one \\(beta, gamma\\) per hidden layer"):
        PathNetwork.from_tensors(w, None, [0.1, 0.1], [1.0])
    with pytest.raises(ValueError, match="weights\\[1\\] has shape \\(1, 2\\)"):
        PathNetwork.from_tensors([torch.randn(3, 4), torch.randn(1, 2)], None, [0.1], [1.0])
    with pytest.raises(ValueError, match="output layer must have at least 1 unit, got 0"):
        PathNetwork.from_tensors([torch.randn(3, 4), torch.randn(0, 3)], None, [0.1], [1.0])
    with pytest.raises(ValueError, match="bias sizes"):
        PathNetwork.from_tensors(w, [torch.randn(2), torch.randn(1)], [0.1], [1.0])
    net = PathNetwork.from_tensors(w, None, [0.1], [1.0])
    with pytest.raises(ValueError, match="inputs have 5 features, the path network expects 4"):
        forward_with_slopes(net, torch.randn(2, 5))
    with pytest.raises(ValueError, match="x_a has 4 features and x_b 3"):
        path_kernel(torch.randn(2, 4), [torch.ones(2, 3)], torch.randn(2, 3), [torch.ones(2, 3)])
