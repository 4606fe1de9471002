"""The fully connected Leaky-ReLU-family part of a network, as the path-space formulas read it (DESIGN.md §1)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from lightning_nsv.errors import check_has_data

__all__ = ["PathNetwork"]


@dataclass(frozen=True)
class PathNetwork:
    """The fully connected Leaky-ReLU-family part of a network, in the dtype of the analysis.

    Attributes:
        weights: ``A_0 (Ω_1×f), A_1, …, A_d (K×Ω_d)``, ``K >= 1`` output units (``K = 1``: binary).
        biases: ``b_1, …, b_d, b_{d+1}`` or ``None`` for a network without biases.
        betas: negative-side slope of each hidden layer (``d`` values).
        gammas: positive-side slope of each hidden layer.
    """

    weights: tuple[Tensor, ...]
    biases: tuple[Tensor, ...] | None
    betas: tuple[float, ...]
    gammas: tuple[float, ...]

    def __post_init__(self) -> None:
        depth = len(self.weights) - 1
        if depth < 0:
            raise ValueError("a PathNetwork needs at least one weight matrix")
        if len(self.betas) != depth or len(self.gammas) != depth:
            raise ValueError(
                f"need one (beta, gamma) per hidden layer: {depth} hidden layers, got "
                f"{len(self.betas)} betas and {len(self.gammas)} gammas"
            )
        for k in range(1, depth + 1):
            if self.weights[k].shape[1] != self.weights[k - 1].shape[0]:
                raise ValueError(
                    f"weights[{k}] has shape {tuple(self.weights[k].shape)} but weights[{k - 1}] has "
                    f"{self.weights[k - 1].shape[0]} outputs"
                )
        if self.weights[-1].shape[0] < 1:
            raise ValueError("the output layer must have at least 1 unit, got 0")
        if self.biases is not None and [b.shape[0] for b in self.biases] != [w.shape[0] for w in self.weights]:
            raise ValueError(
                f"bias sizes {[b.shape[0] for b in self.biases]} do not match layer widths "
                f"{[w.shape[0] for w in self.weights]}"
            )

    @classmethod
    def from_tensors(
        cls,
        weights: Sequence[Tensor],
        biases: Sequence[Tensor] | None,
        betas: Sequence[float],
        gammas: Sequence[float],
        dtype: torch.dtype = torch.float64,
    ) -> "PathNetwork":
        """Detached copies on the CPU in ``dtype``."""
        check_has_data([(f"weights[{k}]", w) for k, w in enumerate(weights)]
                       + [(f"biases[{k}]", b) for k, b in enumerate(biases or ())], "the network's head")
        cast = lambda ts: tuple(t.detach().to("cpu", dtype).clone() for t in ts)  # noqa: E731
        return cls(cast(weights), None if biases is None else cast(biases), tuple(map(float, betas)),
                   tuple(map(float, gammas)))

    @property
    def dtype(self) -> torch.dtype:
        return self.weights[0].dtype

    @property
    def device(self) -> torch.device:
        return self.weights[0].device

    def to(self, device: torch.device | str) -> "PathNetwork":
        """The same network with its tensors on ``device`` (itself when they are there already)."""
        device = torch.device(device)
        if self.device == device or (device.index is None and self.device.type == device.type):
            return self
        move = lambda ts: tuple(t.to(device) for t in ts)  # noqa: E731
        return PathNetwork(move(self.weights), None if self.biases is None else move(self.biases), self.betas,
                           self.gammas)

    @property
    def depth(self) -> int:
        """Number of hidden layers ``d``."""
        return len(self.weights) - 1

    @property
    def in_features(self) -> int:
        return self.weights[0].shape[1]

    @property
    def num_outputs(self) -> int:
        """Output units ``K`` (1 for a binary network)."""
        return self.weights[-1].shape[0]

    @property
    def hidden_widths(self) -> tuple[int, ...]:
        return tuple(w.shape[0] for w in self.weights[:-1])

    @property
    def num_paths(self) -> int:
        """Coordinates of path space: ``f·Ω_1···Ω_d`` plus, with biases, the paths seeded at each layer."""
        widths = self.hidden_widths
        count = self.in_features * math.prod(widths)
        if self.biases is not None:
            count += 1 + sum(math.prod(widths[k:]) for k in range(len(widths)))
        return count

