"""The slopes of a gate layer (DESIGN.md §1, §2c "other slopes"): ``gamma`` where ``z >= 0``, ``beta`` below, with
``beta`` one number (the Leaky-ReLU family, a PReLU of one parameter) or one per channel (a PReLU per channel)."""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["gate_slopes", "relu_type"]


def relu_type(beta) -> bool:
    """Whether the slopes are ``gamma`` times a 0/1 mask (``beta = 0``, one number)."""
    return not isinstance(beta, Tensor) and beta == 0.0


def gate_slopes(bits: Tensor, beta, gamma: float) -> Tensor:
    """``sigma`` as float64 for the bits ``z >= 0`` of shape ``(n, C, *spatial)`` (DESIGN.md §1: 0.1 in float32 is
    not 0.1): a per-channel ``beta`` (a tensor of ``C`` values) broadcast over the positions."""
    if relu_type(beta):
        ones = bits.to(torch.float64)
        return ones if gamma == 1.0 else ones.mul_(gamma)
    below = torch.as_tensor(beta, dtype=torch.float64, device=bits.device)
    if below.dim() == 1 and bits.dim() >= 2:
        below = below.view(1, -1, *[1] * (bits.dim() - 2))
    return torch.where(bits, torch.tensor(gamma, dtype=torch.float64, device=bits.device), below)
