"""A small ResNet-style CNN (convolutions, BatchNorm, residual sums, pooling) whose whole function is piecewise linear.

Plain ``nn.Module``s, no Lightning: the path kernel of the whole network (DESIGN.md §2c) reads them as they are, the
residual sum written in :meth:`ResidualBlock.forward` included.
"""
from __future__ import annotations

from typing import Sequence

from torch import Tensor, nn

from lightning_nsv.models.layers import make_activation

__all__ = ["ResidualBlock", "SmallResNet"]


class ResidualBlock(nn.Module):
    """``act(x + BN(conv(act(BN(conv(x))))))`` with two bias-free 3×3 convolutions that keep the size."""

    def __init__(self, channels: int, beta: float = 0.0, gamma: float = 1.0) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.act = make_activation("leaky_relu", beta, gamma)

    def forward(self, x: Tensor) -> Tensor:
        out = self.act(self.bn1(self.conv1(x)))
        return self.act(x + self.bn2(self.conv2(out)))


class SmallResNet(nn.Module):
    """Stem (conv–BN–act), stages of :class:`ResidualBlock` with 2×2 max-pooling between stages, global average
    pooling and one Linear layer to ``num_classes`` outputs (``num_classes=1``: one logit, shape ``[n]``).

    Args:
        in_channels: Image channels (digits: 1, CIFAR-10: 3).
        num_classes: 1 for the binary logit, ``K >= 2`` for K class scores.
        width: Channels of every convolution.
        blocks: Residual blocks per stage; a 2×2 max-pool precedes every stage but the first.
        beta: Slope of the activation for negative inputs (ReLU: 0).
        gamma: Slope of the activation for non-negative inputs.

    Example::

        >>> import torch
        >>> SmallResNet(in_channels=3, width=8)(torch.zeros(4, 3, 32, 32)).shape
        torch.Size([4])
    """

    def __init__(self, in_channels: int = 3, num_classes: int = 1, width: int = 16,
                 blocks: Sequence[int] = (1, 1), beta: float = 0.0, gamma: float = 1.0) -> None:
        super().__init__()
        blocks = [int(b) for b in blocks]
        if min(in_channels, num_classes, width) < 1 or not blocks or min(blocks) < 0:
            raise ValueError(f"sizes must be positive and blocks non-negative, got in_channels={in_channels}, "
                             f"num_classes={num_classes}, width={width}, blocks={blocks}")
        self.num_classes = num_classes
        self.stem = nn.Sequential(nn.Conv2d(in_channels, width, 3, padding=1, bias=False), nn.BatchNorm2d(width),
                                  make_activation("leaky_relu", beta, gamma))
        stages: list[nn.Module] = []
        for k, count in enumerate(blocks):
            if k:
                stages.append(nn.MaxPool2d(2))
            stages += [ResidualBlock(width, beta, gamma) for _ in range(count)]
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(width, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        features = self.pool(self.stages(self.stem(x))).flatten(1)
        out = self.fc(features)
        return out.squeeze(-1) if self.num_classes == 1 else out
