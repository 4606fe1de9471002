"""Building blocks shared by the package's networks."""
from __future__ import annotations

import contextlib
from typing import Iterator, Literal, Sequence, get_args

import torch
from torch import nn

Activation = Literal["leaky_relu", "relu", "abs", "linear", "sigmoid", "softplus", "tanh"]
ACTIVATIONS: tuple[str, ...] = get_args(Activation)


class LeakyReLUFamily(nn.Module):
    """``rho(z) = gamma * z`` for ``z >= 0`` and ``beta * z`` for ``z < 0``.

    ReLU is ``beta=0, gamma=1``, Leaky-ReLU ``beta=0.01``, absolute value ``beta=-1, gamma=1`` and the
    identity ``beta=gamma=1``.
    """

    def __init__(self, beta: float = 0.1, gamma: float = 1.0) -> None:
        super().__init__()
        self.beta = float(beta)
        self.gamma = float(gamma)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.where(z >= 0, self.gamma * z, self.beta * z)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, gamma={self.gamma}"


def make_activation(name: Activation, beta: float = 0.1, gamma: float = 1.0) -> nn.Module:
    """Activation module by name; ``beta``/``gamma`` apply to the Leaky-ReLU family only."""
    if name == "leaky_relu":
        return LeakyReLUFamily(beta, gamma)
    if name == "relu":
        return LeakyReLUFamily(0.0, 1.0)
    if name == "abs":
        return LeakyReLUFamily(-1.0, 1.0)
    if name == "linear":
        return LeakyReLUFamily(1.0, 1.0)
    if name == "sigmoid":
        return nn.Sigmoid()
    if name == "softplus":
        return nn.Softplus()
    if name == "tanh":
        return nn.Tanh()
    raise ValueError(f"`activation` can be {', '.join(ACTIVATIONS)}, got {name!r}")


def mlp_sequential(
    in_features: int,
    widths: Sequence[int],
    out_features: int,
    activation: Activation = "leaky_relu",
    beta: float = 0.1,
    gamma: float = 1.0,
    bias: bool = True,
    flatten: bool = True,
) -> nn.Sequential:
    """``Flatten, Linear, act, ..., Linear(out_features)``: the chain the path-space maths reads."""
    if in_features < 1 or out_features < 1 or any(w < 1 for w in widths):
        raise ValueError(
            f"sizes must be positive, got in_features={in_features}, widths={list(widths)}, "
            f"out_features={out_features}"
        )
    check_layers_fit(in_features, widths, out_features, bias)
    layers: list[nn.Module] = [nn.Flatten()] if flatten else []
    fan_in = in_features
    for width in widths:
        layers += [nn.Linear(fan_in, width, bias=bias), make_activation(activation, beta, gamma)]
        fan_in = width
    layers.append(nn.Linear(fan_in, out_features, bias=bias))
    return nn.Sequential(*layers)


def check_layers_fit(in_features: int, widths: Sequence[int], out_features: int, bias: bool = True) -> None:
    """Refuse, before torch allocates them, Linear layers whose parameters do not fit in the memory available
    (``widths=[200000, 200000]`` ended in torch's "[enforce fail at alloc_cpu.cpp] … bytes")."""
    from lightning_nsv.memory import check_memory

    sizes = [in_features, *widths, out_features]
    count = sum(a * b + (b if bias else 0) for a, b in zip(sizes, sizes[1:]))
    item = torch.empty((), dtype=torch.get_default_dtype()).element_size()
    nbytes = count * item
    check_memory(nbytes, f"Linear layers of sizes {'→'.join(map(str, sizes))} hold {count:,} parameters, "
                         f"{nbytes:,} bytes ({nbytes / 1e9:.1f} GB) in {torch.get_default_dtype()}",
                 "choose narrower layers (training needs about 3-4 times that again for gradients and optimizer "
                 "state)")


class PlainHookAttributes:
    """Mixin for a ``LightningModule``: the attributes the Trainer rewrites around every hook call are set
    with ``object.__setattr__``.

    The Trainer sets ``pl_module._current_fx_name`` twice around each of the ~20 hook and strategy calls of a
    training step; through ``nn.Module.__setattr__`` (which first checks the value against ``Parameter``,
    ``Module`` and ``Buffer``, the first and last through Python-level ``__instancecheck__``) that is about
    2.5 µs a call, 0.1 ms a step. For these names and ``str``/``None`` values, ``nn.Module.__setattr__`` ends in
    ``object.__setattr__`` anyway; any other name or value takes the usual path.
    """

    _plain_hook_attributes: frozenset[str] = frozenset({"_current_fx_name"})

    def __setattr__(self, name: str, value: object) -> None:
        if name in self._plain_hook_attributes and (value is None or type(value) is str):
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)


@contextlib.contextmanager
def eval_mode(module: nn.Module) -> Iterator[None]:
    """Put ``module`` in eval mode and restore the mode of every submodule afterwards."""
    flags = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, training in flags:
            m.training = training
