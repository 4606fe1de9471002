"""Leaky-ReLU-family MLP for binary classification with the logistic loss."""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_nsv.compat import pl
from lightning_nsv.models.layers import mlp_sequential

OPTIMIZERS = ("sgd", "adam")


class LeakyReLUMLP(pl.LightningModule):
    """``f → Ω_1 → … → Ω_d → 1`` with ``rho(z) = gamma·z (z >= 0), beta·z (z < 0)``.

    The network is ``self.net``, an ``nn.Sequential(Flatten, Linear, act, …, Linear)``: the path part that
    :class:`~lightning_nsv.callbacks.NetworkSupportVectors` reads. Labels are 0/1; the loss is the logistic
    loss ``log(1 + exp(−y·N(x)))`` with ``y = ±1``.

    Args:
        in_features: input size ``f`` (images are flattened; digits: 64, MNIST: 784).
        widths: hidden widths ``Ω_1, …, Ω_d``.
        beta, gamma: slopes of the activation (ReLU: 0, 1; absolute value: -1, 1).
        bias: whether the Linear layers have biases.
        optimizer: ``"sgd"`` (with ``momentum``) or ``"adam"``.
        lr, momentum, weight_decay: optimiser settings.
        init_std: if given, weights are drawn from ``N(0, init_std²)`` and biases start at 0.

    Logged metrics: ``train_loss``, ``train_error`` (running, over the epoch's batches), ``val_loss``,
    ``val_error``.

    Example::

        >>> model = LeakyReLUMLP(in_features=64, widths=[16, 16], beta=0.1)
        >>> model(torch.zeros(5, 1, 8, 8)).shape
        torch.Size([5])
    """

    def __init__(
        self,
        in_features: int = 64,
        widths: Sequence[int] = (64, 64),
        beta: float = 0.1,
        gamma: float = 1.0,
        bias: bool = True,
        optimizer: str = "sgd",
        lr: float = 0.05,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        init_std: float | None = None,
    ) -> None:
        super().__init__()
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"`optimizer` can be {', '.join(OPTIMIZERS)}, got {optimizer!r}")
        if lr <= 0:
            raise ValueError(f"`lr` must be positive, got {lr}")
        if init_std is not None and init_std <= 0:
            raise ValueError(f"`init_std` must be positive or None, got {init_std}")
        self.save_hyperparameters()
        self.net = mlp_sequential(in_features, list(widths), 1, "leaky_relu", beta, gamma, bias)
        if init_std is not None:
            for layer in self.net:
                if isinstance(layer, torch.nn.Linear):
                    torch.nn.init.normal_(layer.weight, std=init_std)
                    if layer.bias is not None:
                        torch.nn.init.zeros_(layer.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x).squeeze(-1)

    def _loss_and_error(self, logits: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        loss = F.binary_cross_entropy_with_logits(logits, y.to(logits.dtype))
        return loss, ((logits >= 0).long() != y.long()).float().mean()

    def _step(self, batch: tuple[Tensor, Tensor], stage: str) -> Tensor:
        x, y = batch
        loss, error = self._loss_and_error(self(x), y)
        self.log(f"{stage}_loss", loss, on_step=False, on_epoch=True, prog_bar=stage == "train")
        self.log(f"{stage}_error", error, on_step=False, on_epoch=True, prog_bar=True)
        return loss

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._step(batch, "val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._step(batch, "test")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        hp = self.hparams
        if hp.optimizer == "adam":
            return torch.optim.Adam(self.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
        return torch.optim.SGD(self.parameters(), lr=hp.lr, momentum=hp.momentum, weight_decay=hp.weight_decay)
