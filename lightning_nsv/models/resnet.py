"""A small ResNet-style CNN as a LightningModule: :class:`~lightning_nsv.models.residual.SmallResNet`, trained as
:class:`~lightning_nsv.models.mlp.LeakyReLUMLP`."""
from __future__ import annotations

from typing import Literal, Sequence

from torch import Tensor

from lightning_nsv.models.mlp import LeakyReLUMLP
from lightning_nsv.models.residual import SmallResNet

__all__ = ["ResNetClassifier"]


class ResNetClassifier(LeakyReLUMLP):
    """Stem (3×3 conv–BatchNorm–act), stages of residual blocks ``act(x + BN(conv(act(BN(conv(x))))))`` with 2×2
    max-pooling between stages, global average pooling and one Linear layer (:class:`SmallResNet`).

    ``self.net`` is the :class:`~lightning_nsv.models.residual.SmallResNet`. Every operation is piecewise linear once
    the BatchNorm layers are in eval mode, so the whole network is a linear classifier in its path space: read it with
    :func:`~lightning_nsv.analysis.whole_network_support_vectors` (DESIGN.md §2c). There is no Linear/Leaky-ReLU head
    after an ``nn.Flatten`` for the head-only protocol (paper 000's CNN + FC; that is :class:`ConvFCNet`).

    Training is :class:`~lightning_nsv.models.mlp.LeakyReLUMLP`'s: the logistic loss on labels 0/1 with one logit
    (``num_classes=1``), or cross-entropy on labels ``0..K-1`` with ``num_classes=K >= 2``. Labels are checked in
    every batch. The optimizer is set by ``optimizer``, ``lr``, ``momentum`` and ``weight_decay`` (LightningCLI's
    ``--optimizer``, when given, replaces them; see ``LeakyReLUMLP``). The training error a support-vector analysis
    needs is that of the frozen network in eval mode, with BatchNorm's running statistics.

    Args:
        in_channels: Image channels (digits and MNIST: 1, CIFAR-10: 3); any image size (global average pooling).
        num_classes: Outputs; 1 for the binary logit, K >= 2 for K class scores.
        width: Channels of every convolution.
        blocks: Residual blocks per stage, e.g. ``[1, 1]``; a 2×2 max-pool precedes every stage but the first.
        beta: Slope of the activation for negative inputs (ReLU: 0, Leaky-ReLU: 0.1).
        gamma: Slope of the activation for non-negative inputs (ReLU: 1).
        optimizer: ``"sgd"`` (with ``momentum``) or ``"adam"``.
        lr: Learning rate.
        momentum: SGD momentum (ignored by Adam).
        weight_decay: L2 penalty of the optimizer (BatchNorm's scales and shifts included).

    Raises:
        ValueError: On sizes below 1, an empty ``blocks`` or a negative count in it, an unknown optimizer or a
            non-positive ``lr``; in any batch on labels that are not integers in ``0..max(1, num_classes-1)``.

    Logged metrics: ``train_loss``, ``train_error_running``, ``val_loss``, ``val_error``, ``test_loss``,
    ``test_error``, as ``LeakyReLUMLP`` (error = 1 − accuracy, micro-averaged over samples for K classes).

    Example::

        >>> model = ResNetClassifier(in_channels=1, width=8, blocks=[1, 1])
        >>> model(torch.zeros(5, 1, 8, 8)).shape
        torch.Size([5])
        >>> ResNetClassifier(in_channels=3, num_classes=10)(torch.zeros(2, 3, 32, 32)).shape
        torch.Size([2, 10])
    """

    def __init__(
        self,
        in_channels: int = 1,
        num_classes: int = 1,
        width: int = 16,
        blocks: Sequence[int] = (1, 1),
        beta: float = 0.0,
        gamma: float = 1.0,
        optimizer: Literal["sgd", "adam"] = "sgd",
        lr: float = 0.05,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
    ) -> None:
        net = SmallResNet(in_channels, num_classes, width, blocks, beta, gamma)  # checks the sizes first
        super().__init__(in_features=width, widths=[], beta=beta, gamma=gamma, optimizer=optimizer, lr=lr,
                         momentum=momentum, weight_decay=weight_decay, num_classes=num_classes)
        self.save_hyperparameters(ignore=["in_features", "widths"])
        for name in ("bias", "init_std"):  # saved by LeakyReLUMLP, not arguments of this class (checkpoints rebuild it)
            self.hparams.pop(name, None)
        self.hparams["blocks"] = [int(b) for b in blocks]  # a list in hparams.yaml, whatever sequence was given
        self.net = net
        self._build_metrics(num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)  # (n,) or (n, K) already: no squeeze, which would drop the batch dim of one sample
