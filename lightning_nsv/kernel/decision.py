"""The max-margin classifier in path space as a function of the input: ``f(x) = Σ_i α_i y_i K(x, x_i) + b`` over its
support vectors, on a :class:`~lightning_nsv.kernel.network.PathNetwork`, and the ±1 labels it reads."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from lightning_nsv.kernel.formulas import forward_with_slopes, path_kernel
from lightning_nsv.kernel.inputs import as_tensor_on
from lightning_nsv.kernel.network import PathNetwork

__all__ = ["kernel_to_support", "max_margin_decision", "signed_labels"]


def signed_labels(y: Tensor | np.ndarray | Sequence[int]) -> Tensor:
    """Labels in ``{-1, +1}`` (float64, shape ``(n,)``) from ``{0, 1}``, booleans or ``{-1, +1}`` (a tensor, an array or
    a list, of shape ``(n,)`` or ``(n, 1)``)."""
    y = y if isinstance(y, Tensor) else torch.as_tensor(np.asarray(y))
    if y.dim() > 1:  # (n, 1) times outputs (n,) would broadcast to (n, n)
        if y.dim() != 2 or y.shape[1] != 1:
            raise ValueError(f"binary labels need one label per sample, shape (n,) or (n, 1), got {tuple(y.shape)}")
        y = y[:, 0]
    values = set(torch.unique(y).tolist())
    if not values <= {0, 1, -1}:
        raise ValueError(f"binary labels must be 0/1 or -1/+1, got values {sorted(values)[:10]}: class labels, "
                         "not scores or probabilities (threshold those first)")
    return torch.where(y > 0, 1.0, -1.0).to(torch.float64)



def max_margin_decision(
    net: PathNetwork,
    x_support: Tensor,
    y_support: Tensor,
    alpha_support: np.ndarray | Tensor,
    x: Tensor,
    intercept: float = 0.0,
    block_size: int | None = None,
    slopes_support: Sequence[Tensor] | None = None,
    slopes_x: Sequence[Tensor] | None = None,
) -> Tensor:
    """Decision function of the max-margin classifier, ``f(x) = Σ_i α_i y_i K(x, x_i) + b`` over support vectors.

    Cost: the path kernel between the ``n`` query points and the ``s`` support vectors, ``O(n·s·(f + Σ Ω_l))``.

    Args:
        net: the path part at the weights the SVM was fitted for.
        x_support, y_support, alpha_support: the support vectors (path-space inputs), their labels (0/1 or ±1)
            and dual coefficients (``svm.alpha_[svm.support_]``).
        x: query points, ``(n, f)`` path-space inputs.
        intercept: ``svm.intercept_``.
        slopes_support, slopes_x: the slopes of both sets, when known (otherwise computed).
    """
    if not len(x_support) == len(y_support) == len(alpha_support):
        raise ValueError(
            f"x_support, y_support and alpha_support must have one entry per support vector, got "
            f"{len(x_support)}, {len(y_support)} and {len(alpha_support)}"
        )
    net = net.to(x.device)
    kernel = kernel_to_support(net, x_support, x, slopes_support, slopes_x, block_size)
    coef = as_tensor_on(alpha_support, net.dtype, kernel.device)
    coef = coef * signed_labels(y_support).to(kernel.device, net.dtype)
    return kernel @ coef + intercept


def kernel_to_support(net: PathNetwork, x_support: Tensor, x: Tensor, slopes_support: Sequence[Tensor] | None,
                      slopes_x: Sequence[Tensor] | None, block_size: int | None) -> Tensor:
    """``K(x, x_i)`` between the queries ``x`` and the support samples, ``(n, s)``, on the device of ``x`` (which
    ``net`` is on), with the slopes of either set computed when not given."""
    x_support = x_support.to(x.device, net.dtype).reshape(len(x_support), -1)
    x = x.to(net.dtype).reshape(len(x), -1)
    if slopes_support is None:
        slopes_support = forward_with_slopes(net, x_support)[1]
    if slopes_x is None:
        slopes_x = forward_with_slopes(net, x)[1]
    return path_kernel(x, slopes_x, x_support, slopes_support, bias=net.biases is not None, block_size=block_size)
