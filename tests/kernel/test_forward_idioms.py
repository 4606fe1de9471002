"""Idioms researchers write in ``forward``, each analysed exactly: traced (the traced graph reproduces the module's
output) and against enumerated paths (<phi, wbar> = N(x), K = Phi Phiᵀ, ||wbar||², to 1e-12). One table,
:data:`IDIOMS`; README.md's "Idioms in forward" is generated from it (:func:`readme_rows`) and checked against it."""
from __future__ import annotations

import pathlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_nsv.kernel import NotPiecewiseLinearError, trace
from tests.kernel.test_pair_network import check_against_enumeration, inputs

C, H = 2, 6  # the stem's channels, the input's side: 72 features after it


class Net(nn.Module):
    """A conv stem (``s.conv``), a head of 72 features (``s.head``), ``fn(s, x)`` as forward, ``layers`` as
    attributes."""

    def __init__(self, fn, head: int = C * H * H, outputs: int = 1, **layers) -> None:
        super().__init__()
        self.conv, self.head, self.fn = nn.Conv2d(1, C, 3, padding=1), nn.Linear(head, outputs), fn
        for name, layer in layers.items():
            setattr(self, name, layer)

    def forward(self, x):
        return self.fn(self, x)


def out(s, h):  # (n, 72) features → (n,) logits
    return s.head(h).squeeze(1)


class Loop(nn.Module):
    """A Python loop over an ``nn.ModuleList`` (``by_index``: ``for i in range(len(self.layers))``)."""

    def __init__(self, by_index: bool = False) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Conv2d(1, C, 3, padding=1), nn.Conv2d(C, C, 3, padding=1)])
        self.head, self.by_index = nn.Linear(C * H * H, 1), by_index

    def forward(self, x):
        if self.by_index:
            for i in range(len(self.layers)):
                x = F.relu(self.layers[i](x))
        else:
            for layer in self.layers:
                x = F.relu(layer(x))
        return self.head(x.flatten(1)).squeeze(1)


class SequentialLoop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, C, 3, padding=1), nn.ReLU(), nn.Conv2d(C, C, 3, padding=1), nn.ReLU())
        self.head = nn.Linear(C * H * H, 1)

    def forward(self, x):
        for layer in self.body:
            x = layer(x)
        return self.head(x.flatten(1)).squeeze(1)


class TrainingBranch(nn.Module):
    """``if self.training:`` (noise, dropout), analysed in eval mode."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.head = nn.Conv2d(1, C, 3, padding=1), nn.Linear(C * H * H, 1)

    def forward(self, x):
        h = F.relu(self.conv(x))
        if self.training:
            h = F.dropout(h + 0.1 * torch.randn_like(h), 0.5)
        return self.head(h.flatten(1)).squeeze(1)


def relu_conv(s, x):
    return F.relu(s.conv(x))


IDIOMS = [  # (name, what forward says, module)
    ("len", "`x.reshape(len(x), -1)`", lambda: Net(lambda s, x: out(s, relu_conv(s, x).reshape(len(x), -1)))),
    ("shape_0", "`x.view(x.shape[0], -1)`", lambda: Net(lambda s, x: out(s, relu_conv(s, x).view(x.shape[0], -1)))),
    ("size_0", "`x.view(x.size(0), -1)`", lambda: Net(lambda s, x: out(s, relu_conv(s, x).view(x.size(0), -1)))),
    ("shape_unpacked", "`n, c, h, w = x.shape; x.view(n, c * h * w)`", lambda: Net(lambda s, x: out(s, unpacked(
        relu_conv(s, x))))),
    ("flatten_method", "`x.flatten(1)`", lambda: Net(lambda s, x: out(s, relu_conv(s, x).flatten(1)))),
    ("torch_flatten", "`torch.flatten(x, 1)`", lambda: Net(lambda s, x: out(s, torch.flatten(relu_conv(s, x), 1)))),
    ("nn_flatten", "`self.flatten(x)` (`nn.Flatten()`)",
     lambda: Net(lambda s, x: out(s, s.flatten(relu_conv(s, x))), flatten=nn.Flatten())),
    ("reshape_minus_one", "`x.reshape(-1, 72)`", lambda: Net(lambda s, x: out(s, relu_conv(s, x).reshape(-1, 72)))),
    ("permute", "`x.permute(0, 2, 3, 1).flatten(1)`",
     lambda: Net(lambda s, x: out(s, relu_conv(s, x).permute(0, 2, 3, 1).flatten(1)))),
    ("transpose", "`x.transpose(2, 3)`, `torch.transpose`",
     lambda: Net(lambda s, x: out(s, torch.transpose(relu_conv(s, x).transpose(2, 3), 1, 3).flatten(1)))),
    ("contiguous", "`x.permute(...).contiguous().view(n, -1)`",
     lambda: Net(lambda s, x: out(s, relu_conv(s, x).permute(0, 3, 2, 1).contiguous().view(x.size(0), -1)))),
    ("output_view", "`self.head(h).view(-1)`", lambda: Net(lambda s, x: s.head(relu_conv(s, x).flatten(1)).view(-1))),
    ("module_list_loop", "`for layer in self.layers:` (`nn.ModuleList`)", Loop),
    ("module_list_by_index", "`for i in range(len(self.layers)): self.layers[i](x)`", lambda: Loop(by_index=True)),
    ("sequential_loop", "`for layer in self.body:` (`nn.Sequential`)", SequentialLoop),
    ("if_training", "`if self.training:` (noise, dropout)", TrainingBranch),
    ("dropout_training_flag", "`F.dropout(x, 0.3, training=self.training)`",
     lambda: Net(lambda s, x: out(s, F.dropout(relu_conv(s, x), 0.3, training=s.training).flatten(1)))),
    ("F_relu", "`F.relu(x)`", lambda: Net(lambda s, x: out(s, F.relu(s.conv(x)).flatten(1)))),
    ("F_relu_inplace", "`F.relu(x, inplace=True)`",
     lambda: Net(lambda s, x: out(s, F.relu(s.conv(x), inplace=True).flatten(1)))),
    ("torch_relu", "`torch.relu(x)`", lambda: Net(lambda s, x: out(s, torch.relu(s.conv(x)).flatten(1)))),
    ("method_relu", "`x.relu()`", lambda: Net(lambda s, x: out(s, s.conv(x).relu().flatten(1)))),
    ("F_leaky_relu", "`F.leaky_relu(x, 0.1)`",
     lambda: Net(lambda s, x: out(s, F.leaky_relu(s.conv(x), 0.1).flatten(1)))),
    ("F_max_pool2d", "`F.max_pool2d(x, 2)`",
     lambda: Net(lambda s, x: out(s, F.max_pool2d(relu_conv(s, x), 2).flatten(1)), head=18)),
    ("torch_max_pool2d", "`torch.max_pool2d(x, 2)`",
     lambda: Net(lambda s, x: out(s, torch.max_pool2d(relu_conv(s, x), 2).flatten(1)), head=18)),
    ("F_avg_pool2d", "`F.avg_pool2d(x, 2)`",
     lambda: Net(lambda s, x: out(s, F.relu(F.avg_pool2d(s.conv(x), 2)).flatten(1)), head=18)),
    ("F_adaptive_avg_pool2d", "`F.adaptive_avg_pool2d(x, 1)`",
     lambda: Net(lambda s, x: out(s, F.adaptive_avg_pool2d(relu_conv(s, x), 1).flatten(1)), head=C)),
    ("F_conv2d", "`F.conv2d(x, self.weight, self.bias, padding=1)`",
     lambda: Net(lambda s, x: out(s, F.relu(F.conv2d(x, s.weight, s.bias, padding=1)).flatten(1)),
                 weight=nn.Parameter(torch.randn(C, 1, 3, 3)), bias=nn.Parameter(torch.randn(C)))),
    ("torch_conv2d", "`torch.conv2d(x, self.weight, None, 1, 1)`",
     lambda: Net(lambda s, x: out(s, F.relu(torch.conv2d(x, s.weight, None, 1, 1)).flatten(1)),
                 weight=nn.Parameter(torch.randn(C, 1, 3, 3)))),
    ("F_linear", "`F.linear(x, self.weight, self.bias)`",
     lambda: Net(lambda s, x: F.linear(relu_conv(s, x).flatten(1), s.weight, s.bias).squeeze(1),
                 weight=nn.Parameter(torch.randn(1, 72) / 8), bias=nn.Parameter(torch.randn(1)))),
    ("matmul", "`x @ self.weight + self.bias`",
     lambda: Net(lambda s, x: (relu_conv(s, x).flatten(1) @ s.weight + s.bias).squeeze(1),
                 weight=nn.Parameter(torch.randn(72, 1) / 8), bias=nn.Parameter(torch.randn(1)))),
    ("torch_cat", "`torch.cat([a, b], dim=1)`, `torch.concat((a, b), 1)`",
     lambda: Net(lambda s, x: out(s, torch.concat((torch.cat([relu_conv(s, x), x], dim=1), x), 1).flatten(1)),
                 head=(C + 2) * H * H)),
    ("add_operator", "`a + b`, `a += b`", lambda: Net(lambda s, x: out(s, iadd(relu_conv(s, x) + x, x).flatten(1)))),
    ("torch_add", "`torch.add(a, b)`, `a.add(b)`",
     lambda: Net(lambda s, x: out(s, torch.add(relu_conv(s, x), x).add(x).flatten(1)))),
    ("mean_method", "`x.mean((2, 3))`, `x.mean(dim=[2, 3], keepdim=True)`",
     lambda: Net(lambda s, x: out(s, relu_conv(s, x).mean((2, 3)) + relu_conv(s, x).mean(dim=[2, 3], keepdim=True)
                                  .flatten(1)), head=C)),
    ("torch_mean", "`torch.mean(x, dim=(2, 3))`",
     lambda: Net(lambda s, x: out(s, torch.mean(relu_conv(s, x), dim=(2, 3))), head=C)),
    ("sum_forms", "`x.sum((2, 3))`, `torch.sum(x, dim=(2, 3))`",
     lambda: Net(lambda s, x: out(s, relu_conv(s, x).sum((2, 3)) + torch.sum(relu_conv(s, x), dim=(2, 3))), head=C)),
    ("mean_last_twice", "`x.mean(-1).mean(-1)`", lambda: Net(lambda s, x: out(s, relu_conv(s, x).mean(-1).mean(-1)),
                                                             head=C)),
]
NAMES = [name for name, _, _ in IDIOMS]


class Sign(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.head = nn.Conv2d(1, C, 3, padding=1), nn.Linear(C * H * H, 1)

    def forward(self, x):
        h = F.relu(self.conv(x))
        if h.sum() > 0:
            h = -h
        return self.head(h.flatten(1)).squeeze(1)


REFUSED = [  # (name, what forward says, module, what the refusal says)
    ("loop_over_pieces", "`for piece in x.chunk(2, 1):`",
     lambda: Net(lambda s, x: out(s, sum(p for p in relu_conv(s, x).chunk(2, 1)).flatten(1)), head=36),
     r"iterates over a tensor or over the pieces of a split.* take the pieces by index"),
    ("value_control_flow", "`if h.sum() > 0:`", Sign, r"Control flow that depends on tensor values"),
    ("weight_computed_in_forward", "`x @ self.weight.t()`",
     lambda: Net(lambda s, x: (relu_conv(s, x).flatten(1) @ s.weight.t()).squeeze(1),
                 weight=nn.Parameter(torch.randn(1, 72))), r"computes a tensor from parameters or constants inside"),
]


def unpacked(h):
    n, c, height, width = h.shape
    return h.view(n, c * height * width)


def iadd(a, b):
    a += b
    return a


@pytest.mark.parametrize("name", NAMES)
def test_an_idiom_is_analysed_exactly(name):
    torch.manual_seed(0)
    make = dict((n, m) for n, _, m in IDIOMS)[name]
    check_against_enumeration(make().eval(), inputs((1, H, H), n=3))


@pytest.mark.parametrize("name", [name for name, *_ in REFUSED])
def test_a_refused_idiom_says_why_and_what_to_write(name):
    make, why = next((m, w) for n, _, m, w in REFUSED if n == name)
    with pytest.raises(NotPiecewiseLinearError, match=why):
        trace(make().eval(), inputs((1, H, H), n=3))


def readme_rows() -> list[str]:
    """The README's rows: what forward says, how it is analysed, and the test."""
    return [f"| {code} | exact | `test_an_idiom_is_analysed_exactly[{name}]` |" for name, code, _ in IDIOMS] + [
        f"| {code} | refused, saying why and what to write | "
        f"`test_a_refused_idiom_says_why_and_what_to_write[{name}]` |"
        for name, code, *_ in REFUSED]


def test_the_readme_lists_every_idiom():
    readme = (pathlib.Path(__file__).parents[2] / "README.md").read_text()
    missing = [row for row in readme_rows() if row not in readme]
    assert not missing, "README.md's 'Idioms in forward' lacks:\n" + "\n".join(missing)


if __name__ == "__main__":  # the README's rows: PYTHONPATH=. python tests/kernel/test_forward_idioms.py
    print("\n".join("  " + row for row in readme_rows()))
