import pytest
import torch
from torch import nn

from lightning_nsv.extract import UnsupportedNetworkError, find_path_part
from lightning_nsv.kernel import forward_with_slopes
from lightning_nsv.models import LeakyReLUFamily, LeakyReLUMLP


def head_output(part, x):
    return forward_with_slopes(part.path_network(), part.embed(x))[0]


def test_reads_sequential_with_every_supported_activation():
    torch.manual_seed(0)
    seq = nn.Sequential(
        nn.Flatten(), nn.Linear(12, 5), nn.ReLU(), nn.Dropout(0.0), nn.Linear(5, 4), nn.LeakyReLU(0.2),
        nn.Linear(4, 3), LeakyReLUFamily(-1.0, 1.0), nn.Linear(3, 3), nn.Identity(), nn.Linear(3, 1),
    )
    part = find_path_part(seq)
    assert part.betas == (0.0, 0.2, -1.0, 1.0)
    assert part.gammas == (1.0, 1.0, 1.0, 1.0)
    assert part.num_hidden_units == 5 + 4 + 3 + 3
    x = torch.randn(9, 3, 4)
    torch.testing.assert_close(head_output(part, x), seq(x)[:, 0].double(), rtol=1e-5, atol=1e-6)


def test_trunk_before_flatten_is_the_embedding():
    torch.manual_seed(0)
    seq = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.Tanh(), nn.Flatten(), nn.Linear(32, 4), nn.ReLU(),
                        nn.Linear(4, 1, bias=False))
    part = find_path_part(seq)
    x = torch.randn(5, 1, 4, 4)
    assert part.embed(x).shape == (5, 32)
    assert part.has_bias
    torch.testing.assert_close(head_output(part, x), seq(x)[:, 0].double(), rtol=1e-5, atol=1e-6)


def test_finds_the_sequential_of_a_lightning_module_and_named_parts():
    model = LeakyReLUMLP(in_features=64, widths=[8, 8], beta=0.3)
    part = find_path_part(model)
    assert part.name == "LeakyReLUMLP.net" and part.betas == (0.3, 0.3)

    class TwoParts(nn.Module):
        def __init__(self):
            super().__init__()
            self.trunk = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten())
            self.head = nn.Sequential(nn.Linear(8, 3), nn.ReLU(), nn.Linear(3, 1))

    module = TwoParts()
    found = find_path_part(module)  # named `trunk` and `head`: read as such
    assert found.name == "TwoParts.head" and found.embedding is module.trunk
    module.stem, module.top = module.trunk, module.head  # other names: which is which is not said
    del module.trunk, module.head
    with pytest.raises(UnsupportedNetworkError, match="could not tell which nn.Sequential .*found: stem, top"):
        find_path_part(module)
    module.trunk, module.head = module.stem, module.top
    del module.stem, module.top
    part = find_path_part(module, path_module="head", embedding="trunk")
    x = torch.randn(4, 1, 4, 4)
    torch.testing.assert_close(head_output(part, x), module.head(module.trunk(x))[:, 0].double(), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize(
    "layers, message",
    [
        ([nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 1)], r"layer 1, Tanh\(\), is not supported in the path part"),
        ([nn.Linear(4, 3), nn.BatchNorm1d(3), nn.ReLU(), nn.Linear(3, 1)], r"BatchNorm1d.*is not supported"),
        ([nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 1), nn.Sigmoid()], r"Sigmoid\(\).*is not supported"),
        ([nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 1), nn.ReLU()], r"ends with an activation"),
        ([nn.Linear(4, 3), nn.ReLU(), nn.ReLU(), nn.Linear(3, 1)], r"does not follow a Linear layer"),
        ([nn.Conv2d(1, 1, 1), nn.Flatten()], r"has no Linear layer after its trunk"),
    ],
)
def test_unsupported_heads_are_named(layers, message):
    class UserNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.classifier = nn.Sequential(*layers)

    with pytest.raises(UnsupportedNetworkError, match=message) as info:
        find_path_part(UserNet())
    assert "UserNet" in str(info.value)


def test_multi_output_heads_are_read_with_their_outputs():
    part = find_path_part(nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 10)))
    assert part.num_outputs == 10 and part.path_network().num_outputs == 10
    assert find_path_part(nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 1))).num_outputs == 1


def test_bad_submodule_names():
    model = LeakyReLUMLP(in_features=64, widths=[4])
    with pytest.raises(UnsupportedNetworkError, match="has no submodule 'body'"):
        find_path_part(model, path_module="body")
    with pytest.raises(UnsupportedNetworkError, match=r"net.1 is a Linear; `path_module` must name an nn.Sequential"):
        find_path_part(model, path_module="net.1")
    with pytest.raises(UnsupportedNetworkError, match="found: none"):
        find_path_part(nn.Module())


class _TrunkAndHead(torch.nn.Module):
    """A trunk (not piecewise linear) and a head named as researchers name them, the head after the trunk."""

    def __init__(self, names=("trunk", "head")):
        super().__init__()
        self.names = names
        setattr(self, names[0], torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.GELU(), torch.nn.Flatten()))
        setattr(self, names[1], torch.nn.Sequential(torch.nn.Linear(72, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)))

    def forward(self, x):
        return getattr(self, self.names[1])(getattr(self, self.names[0])(x))


@pytest.mark.parametrize("names", [("trunk", "head"), ("features", "classifier"), ("backbone", "head")])
def test_a_head_beside_a_trunk_is_found_by_their_names(names):
    from lightning_nsv.scope import choose_scope

    module = _TrunkAndHead(names)
    part = find_path_part(module)
    x = torch.randn(5, 1, 8, 8)
    assert part.name == f"_TrunkAndHead.{names[1]}" and part.embedding is getattr(module, names[0])
    with torch.no_grad():
        head = forward_with_slopes(part.path_network(), part.embed(x).double())[0]
        torch.testing.assert_close(head, module(x).double()[:, 0], rtol=1e-5, atol=1e-6)
    decision = choose_scope(module, x)  # GELU: the whole module is refused, `auto` falls back to that head
    assert decision.scope.kind == "head" and "is not analysed because" in decision.fallback
    assert decision.scope.output_mismatch(module, x, "the example") is None


def test_names_alone_do_not_make_a_head_of_a_third_sequential():
    module = _TrunkAndHead()
    module.extra = torch.nn.Sequential(torch.nn.Identity())
    with pytest.raises(UnsupportedNetworkError, match="could not tell which nn.Sequential"):
        find_path_part(module)


@pytest.mark.parametrize("after, suggests_whole", [(torch.sigmoid, False), (lambda out: 2 * out, True)])
def test_a_head_that_is_not_the_output_suggests_the_whole_network_only_where_it_traces(after, suggests_whole):
    from lightning_nsv.scope import ScopeRequest, choose_scope

    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 1))

        def forward(self, x):
            return after(self.net(x))

    module, x = Scaled(), torch.randn(8, 4)
    scope = choose_scope(module, x, ScopeRequest("head")).scope
    message = scope.output_mismatch(module, x, "the example")
    assert "is not the output of its path part" in message
    assert ("scope='whole'" in message) == suggests_whole
