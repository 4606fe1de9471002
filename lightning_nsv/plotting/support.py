"""Figures of one analysis: the support vectors as images, their α, the decision boundaries of the network and
its max-margin classifier (Figure 7), the path weights' signs (Figures 8-9), the approach to the max-margin
classifier."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import LogLocator, MaxNLocator, NullFormatter
import numpy as np
import torch
from torch import Tensor

from lightning_nsv.kernel.decision import max_margin_decision, signed_labels
from lightning_nsv.kernel.formulas import forward_with_slopes
from lightning_nsv.kernel.network import PathNetwork
from lightning_nsv.kernel.path_signs import PathSigns, path_signs
from lightning_nsv.plotting.base import (CARD_WIDTH, LEGEND_SIZE, NEGATIVE, POSITIVE, REGION_NEGATIVE,
                                         REGION_POSITIVE, _subplots)
from lightning_nsv.ticks import unicode_log_ticks


def image_grid(
    images: torch.Tensor,
    titles: Sequence[str] | None = None,
    columns: int = 8,
    *,
    total: int | None = None,
    max_images: int = 16,
    what: str = "support vectors by α",
):
    """The first ``max_images`` of ``images`` ``(n, C, H, W)`` in a grid of at most ``columns`` columns, each
    scaled to its own range, with a suptitle that says how many of ``total`` (default ``n``) it shows.

    The grid is :data:`CARD_WIDTH` wide whatever the number of tiles, so that few tiles are large: at most 4
    columns up to 16 images, 6 up to 36, then ``columns``; titles get the largest font (up to 10 pt) at which the
    longest fits its tile (short ones such as ``f"α={short_number(a)}"`` stay large).
    """
    if max_images < 1:
        raise ValueError(f"`max_images` must be at least 1, got {max_images}")
    total = images.shape[0] if total is None else total
    n = min(images.shape[0], max_images)
    columns = max(1, min(columns, n, 4 if n <= 16 else 6 if n <= 36 else columns))
    rows = max(1, math.ceil(n / columns))
    tile = CARD_WIDTH / columns
    longest = max((len(t) for t in titles[:n]), default=1) if titles is not None else 1
    title_size = float(np.clip(0.9 * 72 * tile / (0.6 * longest), 5.0, 10.0))
    fig, axes = _subplots(rows, columns, figsize=(CARD_WIDTH, rows * (tile + title_size / 60) + 0.35),
                             squeeze=False)
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
            ax.set_title(titles[k], fontsize=title_size, pad=2)
    shown = f"top {n} of {total}" if n < total else f"all {total}"
    fig.suptitle(f"{shown} {what}", fontsize=10)
    fig.tight_layout(pad=0.3, h_pad=0.4, w_pad=0.2)
    return fig, axes


def alpha_histogram(alpha: np.ndarray, bins: int = 40):
    """Histogram of the dual coefficients α of the support vectors on a log axis whose limits are whole decades,
    with at most 5 labelled ticks (unlabelled minor ticks)."""
    fig, ax = _subplots(figsize=(CARD_WIDTH, 3.0))
    alpha = np.asarray(alpha, dtype=float)
    alpha = alpha[alpha > 0]
    if alpha.size:
        low, high = math.floor(np.log10(alpha.min())), math.ceil(np.log10(alpha.max()))
        high = max(high, low + 1)
        edges = np.logspace(np.log10(alpha.min()), np.log10(alpha.max()) + 1e-9, bins + 1)
        ax.hist(alpha, bins=edges, color=POSITIVE)
        ax.set_xscale("log")
        unicode_log_ticks(ax.xaxis)
        ax.set_xlim(10.0 ** low, 10.0 ** high)
        ax.xaxis.set_major_locator(LogLocator(base=10, numticks=5))
        ax.xaxis.set_minor_locator(LogLocator(base=10, subs=np.arange(2, 10), numticks=12))
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("dual coefficient α (log scale)")
    ax.set_ylabel("support vectors")
    ax.set_title(f"α of {alpha.size} support vectors", fontsize=10)
    ax.grid(alpha=0.3, which="major")
    fig.tight_layout()
    return fig, ax


@dataclass(frozen=True)
class GridDecisions:
    """The network's output and the max-margin decision function over a 2-D grid.

    Attributes:
        xs, ys: grid coordinates, ``(W,)`` and ``(H,)``.
        network, svm: values at the grid points, ``(H, W)``; class ``+1`` where ``>= 0``.
    """

    xs: np.ndarray
    ys: np.ndarray
    network: np.ndarray
    svm: np.ndarray

    @property
    def agreement(self) -> float:
        """Fraction of grid points where the two classifiers give the same class."""
        return float(np.mean((self.network >= 0) == (self.svm >= 0)))


def data_extent(x: Tensor | np.ndarray, pad: float = 0.15) -> tuple[float, float, float, float]:
    """``(x_min, x_max, y_min, y_max)`` of 2-D points, widened by ``pad`` of the range on each side."""
    x = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
    if x.shape[1] != 2:
        raise ValueError(f"decision boundaries need 2-D inputs, got {x.shape[1]} features")
    low, high = x.min(0), x.max(0)
    span = np.maximum(high - low, 1e-12)
    return low[0] - pad * span[0], high[0] + pad * span[0], low[1] - pad * span[1], high[1] + pad * span[1]


def decision_grid(
    net: PathNetwork,
    x_support: Tensor,
    y_support: Tensor,
    alpha_support: np.ndarray | Tensor,
    intercept: float = 0.0,
    *,
    extent: tuple[float, float, float, float],
    resolution: int = 200,
) -> GridDecisions:
    """The network and its max-margin classifier (:func:`max_margin_decision`) on a ``resolution²`` grid."""
    if resolution < 2:
        raise ValueError(f"`resolution` must be at least 2, got {resolution}")
    xs = np.linspace(extent[0], extent[1], resolution)
    ys = np.linspace(extent[2], extent[3], resolution)
    grid_x, grid_y = np.meshgrid(xs, ys)
    points = torch.from_numpy(np.stack([grid_x.ravel(), grid_y.ravel()], 1))
    outputs, slopes = forward_with_slopes(net, points)
    network = outputs.numpy().reshape(grid_x.shape)
    svm = max_margin_decision(net, x_support, y_support, alpha_support, points, intercept, slopes_x=slopes).numpy()
    return GridDecisions(xs, ys, network, svm.reshape(grid_x.shape))


def plot_decision_boundaries(
    grid: GridDecisions,
    x_train: Tensor | np.ndarray,
    y_train: Tensor | np.ndarray,
    support: np.ndarray | None = None,
    axes: Sequence[Any] | None = None,
    titles: tuple[str, str] = ("network", "max-margin classifier"),
    legend: bool = True,
):
    """Two panels: the network's classes and the max-margin classifier's over the grid (Figure 7), with the
    training points and, circled, the support vectors. Axes are the input features ``x₁``, ``x₂``; ``legend``
    puts the classes (points and regions) and the support vectors in a legend below the panels."""
    own_figure = axes is None
    if own_figure:
        fig, axes = _subplots(1, 2, figsize=(8, 4.3), sharex=True, sharey=True)
    else:
        fig = axes[0].figure
    x_train = np.asarray(x_train, dtype=np.float64).reshape(len(x_train), -1)
    labels = signed_labels(torch.as_tensor(np.asarray(y_train))).numpy()
    for ax, values, title in zip(axes, (grid.network, grid.svm), titles):
        ax.contourf(grid.xs, grid.ys, (values >= 0).astype(float), levels=[-0.5, 0.5, 1.5],
                    colors=[REGION_NEGATIVE, REGION_POSITIVE])
        ax.contour(grid.xs, grid.ys, values, levels=[0.0], colors="k", linewidths=1.0)
        for label, color in ((-1.0, NEGATIVE), (1.0, POSITIVE)):
            chosen = labels == label
            ax.scatter(x_train[chosen, 0], x_train[chosen, 1], s=6, c=color, linewidths=0)
        if support is not None and len(support):
            ax.scatter(x_train[support, 0], x_train[support, 1], s=28, facecolors="none", edgecolors="k",
                       linewidths=0.7)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("input x₁")
        ax.set_ylabel("input x₂")
        ax.set_xlim(grid.xs[0], grid.xs[-1])
        ax.set_ylim(grid.ys[0], grid.ys[-1])
    if legend:
        handles = [
            Line2D([], [], ls="", marker="o", ms=4, color=NEGATIVE, label="class −1"),
            Line2D([], [], ls="", marker="o", ms=4, color=POSITIVE, label="class +1"),
            Patch(color=REGION_NEGATIVE, label="decided −1"),
            Patch(color=REGION_POSITIVE, label="decided +1"),
            Line2D([], [], color="k", lw=1.0, label="decision boundary"),
        ]
        if support is not None and len(support):
            handles.append(Line2D([], [], ls="", marker="o", ms=6, mfc="none", mec="k",
                                      label=f"{len(support)} support vectors"))
        axes[0].legend(handles=handles, fontsize=LEGEND_SIZE, loc="upper left", bbox_to_anchor=(0.0, -0.18), ncol=3,
                       frameon=False)
    if own_figure:
        fig.tight_layout()
    return fig, axes


def plot_path_weights(net: PathNetwork, signs: PathSigns | None = None):
    """Figures 8-9: the network drawn as a graph (edge colour = sign, width = magnitude within its layer) and
    the share of paths, and of path mass ``Σ|wbar_p|``, that is positive."""
    signs = path_signs(net) if signs is None else signs
    fig, (graph, bars) = _subplots(1, 2, figsize=(9, 3.8), gridspec_kw={"width_ratios": [2.2, 1]})
    sizes = [net.in_features, *net.hidden_widths, 1]
    height = max(sizes)
    position = [np.linspace(0, height - 1, n) if n > 1 else np.array([(height - 1) / 2]) for n in sizes]
    for k, a in enumerate(net.weights):
        a = a.numpy()
        scale = max(float(np.abs(a).max()), 1e-300)
        for i in range(a.shape[0]):
            for j in range(a.shape[1]):
                graph.plot([k, k + 1], [position[k][j], position[k + 1][i]], lw=0.4 + 3.0 * abs(a[i, j]) / scale,
                           color=POSITIVE if a[i, j] > 0 else NEGATIVE, alpha=0.85, zorder=1)
        graph.text(k + 0.5, height - 0.4, f"{int((a < 0).sum())} of {a.size} < 0", ha="center", fontsize=7)
    for k, ys in enumerate(position):
        graph.scatter(np.full(len(ys), k), ys, s=60, c="white", edgecolors="k", zorder=2)
    graph.set_xticks(range(len(sizes)), ["input", *(f"layer {k}" for k in range(1, len(sizes) - 1)), "output"])
    graph.set_yticks([])
    graph.set_ylabel("neurons of the layer")
    graph.set_ylim(-0.8, height + 0.1)
    graph.plot([], [], color=POSITIVE, label="positive weight")
    graph.plot([], [], color=NEGATIVE, label="negative weight")
    graph.legend(loc="lower center", fontsize=LEGEND_SIZE, ncol=2)
    negative_mass = 1 - signs.positive_mass_fraction
    negative_count = signs.negative_count / signs.num_paths
    bars.bar([0, 1], [signs.positive_count_fraction, signs.positive_mass_fraction], color=POSITIVE, label="positive")
    bars.bar([0, 1], [negative_count, negative_mass],
             bottom=[signs.positive_count_fraction, signs.positive_mass_fraction], color=NEGATIVE, label="negative")
    bars.set_xticks([0, 1], [f"paths\n({signs.num_paths})", "path mass\nΣ|w̄_p|"])
    bars.set_ylim(0, 1)
    bars.set_ylabel("fraction")
    bars.set_title(f"w̄ > 0 on {100 * signs.positive_count_fraction:.1f}% of paths,\n"
                   f"{100 * signs.positive_mass_fraction:.2f}% of path mass", fontsize=8)
    bars.legend(fontsize=LEGEND_SIZE, loc="lower right")
    fig.tight_layout()
    return fig, (graph, bars)


def plot_max_margin_approach(epochs: Sequence[float], cosine: Sequence[float], margin_ratio: Sequence[float],
                             title: str = "approach to the max-margin classifier"):
    """Cosine of ``wbar`` and ``v`` and the margin ratio against the epoch (log axis), one point per analysis."""
    fig, ax = _subplots(figsize=(4.5, 3.2))
    ax.plot(epochs, cosine, "o-", label="cos(w̄, v)")
    ax.plot(epochs, margin_ratio, "s-", label="margin ratio")
    if max(epochs) >= 10 * min(epochs):  # a log axis once the analyses span a decade; under one its labels crowd
        ax.set_xscale("log")
        unicode_log_ticks(ax.xaxis)
        ax.set_xlabel("epoch (log scale)")
    else:
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("epoch")
    ax.set_ylabel("value (1 = max-margin)")
    ax.set_ylim(0, 1.05)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=LEGEND_SIZE, loc="lower right")
    fig.tight_layout()
    return fig, ax
