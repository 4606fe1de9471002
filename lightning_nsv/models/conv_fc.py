"""Convolutional trunk + fully connected Leaky-ReLU head (the CNN of Snyder & Vishwanath, App. VII-C)."""
from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from lightning_nsv.models.layers import make_activation
from lightning_nsv.models.mlp import LeakyReLUMLP

__all__ = ["ConvFCNet", "conv_trunk"]


def conv_trunk(
    in_channels: int,
    channels: int = 64,
    padding: int = 1,
    beta: float = 0.1,
    gamma: float = 1.0,
    bias: bool = True,
) -> list[nn.Module]:
    """The paper's trunk: 3 × (3×3 convolution of ``channels`` filters, stride 1, activation), with 2×2
    max-pooling between them, ending in ``nn.Flatten``.

    With ``padding=1`` every convolution keeps the size, so an ``H×W`` image leaves the trunk as
    ``channels × ⌊⌊H/2⌋/2⌋ × ⌊⌊W/2⌋/2⌋``: 8×8 digits → 64·2·2 = 256 features, 28×28 MNIST → 64·7·7 = 3136,
    32×32 CIFAR-10 → 64·8·8 = 4096. Without padding (``padding=0``) each convolution removes 2 pixels and
    an 8×8 image would shrink to nothing (8 → 6 → 3 → 1 → none).
    """
    layers: list[nn.Module] = []
    for k, c_in in enumerate((in_channels, channels, channels)):
        if k:
            layers.append(nn.MaxPool2d(2))
        layers += [nn.Conv2d(c_in, channels, 3, stride=1, padding=padding, bias=bias),
                   make_activation("leaky_relu", beta, gamma)]
    return layers + [nn.Flatten()]


class ConvFCNet(LeakyReLUMLP):
    """Convolutional trunk followed by ``fc_depth`` fully connected Leaky-ReLU layers of width ``fc_width``.

    ``self.net`` is one ``nn.Sequential(conv trunk…, nn.Flatten(), Linear, act, …, Linear)``: the
    :class:`~lightning_nsv.callbacks.NetworkSupportVectors` callback reads the layers after the ``Flatten`` as the
    path part and treats the flattened trunk output ``e(x)`` as the input of path space (DESIGN.md §1, CNN + FC),
    with no extra arguments. The trunk (:func:`conv_trunk`) uses the same activation as the head.

    Training is :class:`~lightning_nsv.models.mlp.LeakyReLUMLP`'s: the logistic loss on labels 0/1 with one
    logit (``num_classes=1``), or cross-entropy on labels ``0..K-1`` with ``num_classes=K >= 2`` (a network for
    multiclass experiments; the support-vector analysis needs one logit). Labels are checked in every batch.
    The optimizer is set by ``optimizer``, ``lr``, ``momentum`` and ``weight_decay``
    (LightningCLI's ``--optimizer``, when given, replaces them; see ``LeakyReLUMLP``).

    Args:
        in_channels: Image channels (digits and MNIST: 1, CIFAR-10: 3).
        image_size: ``(H, W)`` or one int for square images; only used to size the first Linear layer.
        fc_depth: Number of hidden fully connected layers ("FC depth"), ``>= 0``.
        fc_width: Width of each hidden fully connected layer.
        conv_channels: Filters of each convolution.
        padding: Zero padding of each 3×3 convolution (1 keeps the size; see :func:`conv_trunk`).
        beta: Slope of the activation for negative inputs, in the trunk and the head (ReLU: 0).
        gamma: Slope of the activation for non-negative inputs (ReLU: 1).
        bias: Biases in every convolution and Linear layer.
        num_classes: Outputs; 1 for the binary logit the support-vector analysis reads, K >= 2 for K classes.
        optimizer: ``"sgd"`` (with ``momentum``) or ``"adam"``.
        lr: Learning rate.
        momentum: SGD momentum (ignored by Adam).
        weight_decay: L2 penalty of the optimizer.
        init_std: If given, the Linear layers' weights are drawn from ``N(0, init_std²)`` and their biases start
            at 0; otherwise PyTorch's default initialisation.

    Raises:
        ValueError: When the trunk leaves no pixels for ``image_size``, or on sizes below 1; in any batch
            on labels that are not integers in ``0..max(1, num_classes-1)``.

    Logged metrics: ``train_loss``, ``train_error_running``, ``val_loss``, ``val_error``, ``test_loss``,
    ``test_error``, as ``LeakyReLUMLP`` (error = 1 − accuracy, micro-averaged over samples for K classes).

    Example::

        >>> model = ConvFCNet(in_channels=1, image_size=8, fc_depth=2)
        >>> model(torch.zeros(5, 1, 8, 8)).shape
        torch.Size([5])
        >>> model.embedding_features
        256
    """

    def __init__(
        self,
        in_channels: int = 1,
        image_size: int | tuple[int, int] = (8, 8),
        fc_depth: int = 2,
        fc_width: int = 64,
        conv_channels: int = 64,
        padding: int = 1,
        beta: float = 0.1,
        gamma: float = 1.0,
        bias: bool = True,
        num_classes: int = 1,
        optimizer: Literal["sgd", "adam"] = "sgd",
        lr: float = 0.01,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        init_std: float | None = None,
    ) -> None:
        size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        if min(in_channels, conv_channels, fc_width, num_classes, *size) < 1 or fc_depth < 0 or padding < 0:
            raise ValueError(
                f"sizes must be positive (fc_depth, padding >= 0), got in_channels={in_channels}, image_size={size}, "
                f"fc_depth={fc_depth}, fc_width={fc_width}, conv_channels={conv_channels}, padding={padding}, "
                f"num_classes={num_classes}"
            )
        trunk = conv_trunk(in_channels, conv_channels, padding, beta, gamma, bias)
        features = _trunk_features(trunk, in_channels, size)
        super().__init__(in_features=features, widths=[fc_width] * fc_depth, beta=beta, gamma=gamma, bias=bias,
                         optimizer=optimizer, lr=lr, momentum=momentum, weight_decay=weight_decay, init_std=init_std)
        self.save_hyperparameters(ignore=["in_features", "widths"])  # this class's arguments, not the head's
        head = list(self.net)  # LeakyReLUMLP's Flatten, Linear, act, …, Linear(1)
        if num_classes > 1:
            head[-1] = nn.Linear(head[-1].in_features, num_classes, bias=bias)
            if init_std is not None:
                nn.init.normal_(head[-1].weight, std=init_std)
                if bias:
                    nn.init.zeros_(head[-1].bias)
        self.net = nn.Sequential(*trunk[:-1], *head)
        self.embedding_features = features
        self._build_metrics(num_classes)


def _trunk_features(trunk: list[nn.Module], in_channels: int, size: tuple[int, int]) -> int:
    with torch.no_grad():
        try:
            out = nn.Sequential(*trunk)(torch.zeros(1, in_channels, *size))
        except RuntimeError as err:
            raise ValueError(
                f"the convolutional trunk leaves no pixels of a {size[0]}x{size[1]} image ({err}); use padding=1"
            ) from None
    return int(out.shape[1])
