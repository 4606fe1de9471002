"""A CIFAR-shaped two-class stand-in for the benchmarks and examples that cannot download CIFAR-10 (no internet):
frogs and ships drawn from a seed, the shapes and the difficulty of the real task, none of its images."""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["frogs_ships_standin"]


def frogs_ships_standin(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` images ``(n, 3, 32, 32)`` and labels 0/1 (half each), deterministic in ``seed``.

    Every image is smooth colour noise (8×8 Gaussian noise upsampled bilinearly, sd 0.5) plus pixel noise (sd 0.15).
    Class 0 ("frog") adds a green-brown tint and a Gaussian blob of random centre and width; class 1 ("ship") a
    blue tint growing towards the bottom and a dark horizontal bar (a hull) at a random height and length.
    Channels are standardised over the set."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randperm(n, generator=g) % 2
    x = F.interpolate(0.5 * torch.randn(n, 3, 8, 8, generator=g), size=(32, 32), mode="bilinear",
                      align_corners=False)
    x += 0.15 * torch.randn(n, 3, 32, 32, generator=g)
    rows = torch.arange(32.0).view(1, 32, 1)
    cols = torch.arange(32.0).view(1, 1, 32)
    centre = 8 + 16 * torch.rand(n, 2, generator=g)
    width = 3 + 5 * torch.rand(n, generator=g)
    blob = torch.exp(-((rows - centre[:, :1, None]) ** 2 + (cols - centre[:, 1:, None]) ** 2)
                     / (2 * width.view(n, 1, 1) ** 2))
    height = (14 + 12 * torch.rand(n, generator=g)).view(n, 1, 1)
    half = (4 + 10 * torch.rand(n, generator=g)).view(n, 1, 1)
    bar = ((rows - height).abs() < 2) & ((cols - 16).abs() < half)
    frog = torch.tensor([-0.1, 0.5, -0.3]).view(1, 3, 1, 1) * blob[:, None]
    ship = torch.tensor([-0.3, -0.1, 0.4]).view(1, 3, 1, 1) * (rows / 32)[None] - 0.8 * bar[:, None].float()
    x += torch.where(y.view(n, 1, 1, 1) == 0, frog, ship)
    x = (x - x.mean((0, 2, 3), keepdim=True)) / x.std((0, 2, 3), keepdim=True)
    return x, y
