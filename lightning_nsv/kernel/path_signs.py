"""Signs of the path weights ``wbar`` (DESIGN.md §1), summed over all paths without enumerating them."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lightning_nsv.kernel.network import PathNetwork

__all__ = ["PathSigns", "path_signs"]


@dataclass(frozen=True)
class PathSigns:
    """Signs of the path weights ``wbar``, summed over all paths without enumerating them."""

    positive_mass: float
    negative_mass: float
    positive_count: float
    negative_count: float
    num_paths: int

    @property
    def positive_mass_fraction(self) -> float:
        total = self.positive_mass + self.negative_mass
        return self.positive_mass / total if total > 0 else float("nan")

    @property
    def positive_count_fraction(self) -> float:
        return self.positive_count / self.num_paths

    def to_metrics(self) -> dict[str, float]:
        return {
            "path_positive_mass_fraction": self.positive_mass_fraction,
            "path_positive_count_fraction": self.positive_count_fraction,
            "path_negative_count": self.negative_count,
            "path_zero_count": self.num_paths - self.positive_count - self.negative_count,
        }


def path_signs(net: PathNetwork) -> PathSigns:
    """Positive and negative path mass (sum of ``|wbar_p|``) and path counts by sign.

    Dynamic programme over layers: the positive and negative mass entering each neuron obey
    ``P' = A⁺P + A⁻N``, ``N' = A⁺N + A⁻P`` (``A⁺``, ``A⁻`` the positive and negative parts of ``A``);
    counts use the indicators ``[A > 0]``, ``[A < 0]``. Counts are exact up to ``2**53`` paths.
    """
    if net.num_outputs != 1:
        raise ValueError(f"path_signs needs 1 output unit, got {net.num_outputs}")

    def propagate(pos_part, neg_part, pos_bias, neg_bias):
        pos = torch.ones(net.in_features, dtype=net.dtype, device=net.device)
        neg = torch.zeros_like(pos)
        for k, a in enumerate(net.weights):
            pos, neg = pos_part(a) @ pos + neg_part(a) @ neg, pos_part(a) @ neg + neg_part(a) @ pos
            if net.biases is not None:
                pos, neg = pos + pos_bias(net.biases[k]), neg + neg_bias(net.biases[k])
        return float(pos[0]), float(neg[0])

    pos_mass, neg_mass = propagate(lambda a: a.clamp(min=0), lambda a: (-a).clamp(min=0),
                                   lambda b: b.clamp(min=0), lambda b: (-b).clamp(min=0))
    ind_pos, ind_neg = (lambda a: (a > 0).to(net.dtype)), (lambda a: (a < 0).to(net.dtype))
    pos_count, neg_count = propagate(ind_pos, ind_neg, ind_pos, ind_neg)
    return PathSigns(pos_mass, neg_mass, pos_count, neg_count, net.num_paths)
