"""Figures for TensorBoard and examples; each function returns ``(fig, ax)``."""
from __future__ import annotations

import math
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402


def image_grid(images: torch.Tensor, titles: Sequence[str] | None = None, columns: int = 8):
    """Images ``(n, C, H, W)`` in a grid, each scaled to its own range."""
    n = images.shape[0]
    columns = max(1, min(columns, n))
    rows = max(1, math.ceil(n / columns))
    fig, axes = plt.subplots(rows, columns, figsize=(1.3 * columns, 1.45 * rows), squeeze=False)
    for k, ax in enumerate(axes.flat):
        ax.axis("off")
        if k >= n:
            continue
        img = images[k].detach().float().cpu()
        img = (img - img.min()) / (img.max() - img.min() + 1e-12)
        if img.shape[0] == 1:
            ax.imshow(img[0].numpy(), cmap="gray")
        else:
            ax.imshow(img.permute(1, 2, 0).numpy())
        if titles is not None:
            ax.set_title(titles[k], fontsize=7)
    fig.tight_layout()
    return fig, axes


def alpha_histogram(alpha: np.ndarray, bins: int = 40):
    """Histogram of the dual coefficients of the support vectors on a log axis."""
    fig, ax = plt.subplots(figsize=(5, 3.2))
    alpha = np.asarray(alpha)
    alpha = alpha[alpha > 0]
    if alpha.size:
        edges = np.logspace(np.log10(alpha.min()), np.log10(alpha.max()) + 1e-9, bins + 1)
        ax.hist(alpha, bins=edges)
        ax.set_xscale("log")
    ax.set_xlabel("α of support vectors")
    ax.set_ylabel("count")
    ax.set_title(f"{alpha.size} support vectors")
    fig.tight_layout()
    return fig, ax
