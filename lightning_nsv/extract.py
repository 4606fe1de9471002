"""Find the path part of a module: a chain of Linear and Leaky-ReLU-family layers, optionally after a trunk."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lightning_nsv.models.layers import LeakyReLUFamily
from lightning_nsv.kernel.network import PathNetwork

__all__ = ["PathPart", "UnsupportedNetworkError", "find_path_part"]

SUPPORTED = (
    "nn.Linear, nn.ReLU, nn.LeakyReLU, lightning_nsv LeakyReLUFamily, nn.Identity and nn.Dropout, "
    "ending in a Linear layer with one output (binary: the logit) or K >= 2 outputs (multi-class: the class "
    "scores), optionally after an embedding trunk that ends with nn.Flatten"
)


class UnsupportedNetworkError(ValueError):
    """The module has no path part that the support-vector analysis can read."""


def _activation_slopes(layer: nn.Module) -> tuple[float, float] | None:
    if isinstance(layer, nn.ReLU):
        return 0.0, 1.0
    if isinstance(layer, nn.LeakyReLU):
        return float(layer.negative_slope), 1.0
    if isinstance(layer, LeakyReLUFamily):
        return layer.beta, layer.gamma
    return None


@dataclass(frozen=True)
class PathPart:
    """The fully connected Leaky-ReLU-family head of a network and the trunk that feeds it.

    Attributes:
        name: where the head was found, for messages.
        embedding: the layers before the head (ending with ``nn.Flatten``), or ``None``.
        linears: the head's Linear layers, in order.
        betas, gammas: the slopes of the activation after each hidden Linear layer (1, 1 where there is none).
    """

    name: str
    embedding: nn.Module | None
    linears: tuple[nn.Linear, ...]
    betas: tuple[float, ...]
    gammas: tuple[float, ...]

    @property
    def has_bias(self) -> bool:
        return any(layer.bias is not None for layer in self.linears)

    @property
    def num_outputs(self) -> int:
        """1 for a binary head (its logit), K for a K-class head."""
        return self.linears[-1].out_features

    @property
    def num_hidden_units(self) -> int:
        return sum(layer.out_features for layer in self.linears[:-1])

    def embed(self, x: Tensor) -> Tensor:
        """Inputs of path space: the trunk's output (or ``x``), flattened to ``(n, f)``."""
        if self.embedding is not None:
            x = self.embedding(x)
        return x.reshape(x.shape[0], -1)

    def path_network(self, dtype: torch.dtype = torch.float64) -> PathNetwork:
        """Snapshot of the current weights; absent biases of some layers count as zero."""
        biases = None
        if self.has_bias:
            biases = [
                layer.bias if layer.bias is not None else torch.zeros(layer.out_features) for layer in self.linears
            ]
        return PathNetwork.from_tensors(
            [layer.weight for layer in self.linears], biases, self.betas, self.gammas, dtype=dtype
        )


def _resolve(module: nn.Module, dotted: str, what: str) -> nn.Module:
    try:
        return module.get_submodule(dotted)
    except AttributeError as err:
        raise UnsupportedNetworkError(
            f"{type(module).__name__} has no submodule {dotted!r} for `{what}`: {err}"
        ) from None


#: Names of a trunk and the head after it, read as such where a module has both (and no other outermost Sequential).
TRUNK_AND_HEAD = (("trunk", "head"), ("features", "classifier"), ("backbone", "head"), ("body", "head"),
                  ("encoder", "head"))


def _outermost_sequentials(module: nn.Module) -> list[tuple[str, nn.Sequential]]:
    candidates = [(name, sub) for name, sub in module.named_modules() if isinstance(sub, nn.Sequential)]
    return [(n, s) for n, s in candidates if not any(n.startswith(o + ".") for o, _ in candidates if o != n)]


def trunk_and_head(module: nn.Module) -> tuple[str, str] | None:
    """``(trunk, head)`` where the module's only outermost Sequentials are named as in :data:`TRUNK_AND_HEAD`."""
    names = {name for name, _ in _outermost_sequentials(module)}
    found = [pair for pair in TRUNK_AND_HEAD if names == set(pair)]
    return found[0] if found else None


def _find_sequential(module: nn.Module) -> tuple[str, nn.Sequential]:
    if isinstance(module, nn.Sequential):
        return type(module).__name__, module
    outermost = _outermost_sequentials(module)
    if len(outermost) != 1:
        found = ", ".join(n for n, _ in outermost) or "none"
        raise UnsupportedNetworkError(
            f"{type(module).__name__}: could not tell which nn.Sequential holds the classifier (found: {found}). "
            "Pass `path_module` (and `embedding` for a separate trunk) naming the submodules."
        )
    return outermost[0]


def find_path_part(module: nn.Module, path_module: str | None = None, embedding: str | None = None) -> PathPart:
    """Locate the Linear/Leaky-ReLU chain that ends a network.

    Without arguments the module itself (if an ``nn.Sequential``) or its only outermost ``nn.Sequential`` is
    read; the layers after its last ``nn.Flatten`` form the head and those up to it the trunk. A module whose only
    outermost Sequentials are a trunk and a head named as in :data:`TRUNK_AND_HEAD` (``trunk`` and ``head``,
    ``features`` and ``classifier``, …) is read as ``path_module=head, embedding=trunk``; the callback checks that
    the module's output is that head's.

    Args:
        module: the network or LightningModule.
        path_module: dotted name of the ``nn.Sequential`` head, for modules with several.
        embedding: dotted name of a trunk applied before the head (its output is flattened).

    Raises:
        UnsupportedNetworkError: naming the module and layer when the head holds anything else than
            the supported layers.
    """
    if path_module is None and embedding is None and not isinstance(module, nn.Sequential):
        named = trunk_and_head(module)
        if named is not None:  # e.g. `self.trunk` and `self.head`: the head after the trunk as a fixed embedding
            embedding, path_module = named
    name, seq = _head_sequential(module, path_module)
    layers = list(seq.children())
    flatten_at = max((i for i, layer in enumerate(layers) if isinstance(layer, nn.Flatten)), default=-1)
    trunk_layers, head = layers[: flatten_at + 1], layers[flatten_at + 1:]
    trunk = _resolve(module, embedding, "embedding") if embedding is not None else None
    if trunk_layers:
        trunk = nn.Sequential(trunk, *trunk_layers) if trunk is not None else nn.Sequential(*trunk_layers)
    where = f"{type(module).__name__}" + ("" if name == type(module).__name__ else f".{name}")
    linears, betas, gammas = _read_head(head, flatten_at + 1, where)
    return PathPart(where, trunk, tuple(linears), tuple(betas), tuple(gammas))


def _head_sequential(module: nn.Module, path_module: str | None) -> tuple[str, nn.Sequential]:
    """The ``nn.Sequential`` that holds the path part and its name: ``path_module``, or the one found."""
    if path_module is None:
        return _find_sequential(module)
    seq = _resolve(module, path_module, "path_module")
    if not isinstance(seq, nn.Sequential):
        raise UnsupportedNetworkError(
            f"{type(module).__name__}.{path_module} is a {type(seq).__name__}; `path_module` must name an "
            "nn.Sequential"
        )
    return path_module, seq


def _read_head(head: list[nn.Module], first: int, where: str) -> tuple[list[nn.Linear], list[float], list[float]]:
    """The Linear layers of ``head`` (layers numbered from ``first``) and the slopes between them (1, 1 where two
    Linear layers follow each other); refuses anything else, naming ``where`` and the layer."""
    linears: list[nn.Linear] = []
    betas: list[float] = []
    gammas: list[float] = []
    pending_activation = False
    for index, layer in enumerate(head, start=first):
        if isinstance(layer, (nn.Identity, nn.Dropout)):
            continue
        if isinstance(layer, nn.Linear):
            _check_widths(layer, index, where)
            if linears and not pending_activation:
                betas.append(1.0)
                gammas.append(1.0)
            linears.append(layer)
            pending_activation = False
            continue
        beta, gamma = _activation_after_linear(layer, index, where, bool(linears) and not pending_activation)
        betas.append(beta)
        gammas.append(gamma)
        pending_activation = True
    if not linears:
        raise UnsupportedNetworkError(f"{where} has no Linear layer after its trunk. Supported: {SUPPORTED}.")
    if pending_activation:
        raise UnsupportedNetworkError(
            f"{where} ends with an activation; the path part must end with the Linear layer that gives the logit."
        )
    return linears, betas, gammas


def _check_widths(layer: nn.Linear, index: int, where: str) -> None:
    if not layer.in_features or not layer.out_features:
        raise UnsupportedNetworkError(
            f"{where}: layer {index}, {layer!r}, has no {'inputs' if not layer.in_features else 'outputs'}: "
            "every layer of the path part needs at least one unit (a head without hidden units passes no "
            "path); give it a positive width."
        )


def _activation_after_linear(layer: nn.Module, index: int, where: str, after_linear: bool) -> tuple[float, float]:
    """``(beta, gamma)`` of a supported activation that directly follows a Linear layer, else a refusal."""
    slopes = _activation_slopes(layer)
    if slopes is None:
        raise UnsupportedNetworkError(
            f"{where}: layer {index}, {layer!r}, is not supported in the path part. "
            f"Supported: {SUPPORTED}."
        )
    if not after_linear:
        raise UnsupportedNetworkError(
            f"{where}: activation {layer!r} at layer {index} does not follow a Linear layer. Supported: {SUPPORTED}."
        )
    return slopes
