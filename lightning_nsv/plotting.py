"""Every figure of the package, for TensorBoard, the examples and papers; plots return ``(fig, ax)``.

- :func:`image_grid` and :func:`alpha_histogram`: the support vectors and their dual coefficients.
- Figure 7: :func:`decision_grid` evaluates the network and its max-margin classifier over a 2-D grid (the
  classifier through the kernel between grid points and the support vectors only), :func:`plot_decision_boundaries`
  draws them side by side.
- Figures 8-9: :func:`plot_path_weights`, the weights of a small network drawn as a graph coloured by sign, next to
  the signs of the path weights ``wbar`` (:func:`~lightning_nsv.path_space.path_signs`, no path materialised).
- Table II: :func:`agreement_counts` and :func:`plot_agreement`, validation samples misclassified by the network
  only, the SVM only, or both.
- Table 6: :func:`plot_unique_patterns`; Figures 1-5 and 10: :func:`plot_sweep`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import Tensor  # noqa: E402

from lightning_nsv.path_space import PathNetwork, PathSigns, forward_with_slopes, path_signs  # noqa: E402
from lightning_nsv.support_vectors import max_margin_decision, signed_labels  # noqa: E402

__all__ = [
    "GridDecisions",
    "agreement_counts",
    "alpha_histogram",
    "data_extent",
    "decision_grid",
    "image_grid",
    "max_margin_decision",
    "plot_agreement",
    "plot_decision_boundaries",
    "plot_path_weights",
    "plot_sweep",
    "plot_unique_patterns",
]

NEGATIVE, POSITIVE = "tab:red", "tab:blue"


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
):
    """Two panels: the network's classes and the max-margin classifier's over the grid (Figure 7), with the
    training points and, circled, the support vectors."""
    if axes is None:
        fig, axes = plt.subplots(1, 2, figsize=(8, 3.8), sharex=True, sharey=True)
    else:
        fig = axes[0].figure
    x_train = np.asarray(x_train, dtype=np.float64).reshape(len(x_train), -1)
    labels = signed_labels(torch.as_tensor(np.asarray(y_train))).numpy()
    for ax, values, title in zip(axes, (grid.network, grid.svm), titles):
        ax.contourf(grid.xs, grid.ys, (values >= 0).astype(float), levels=[-0.5, 0.5, 1.5],
                    colors=["#f4c7c3", "#c6dbef"])
        ax.contour(grid.xs, grid.ys, values, levels=[0.0], colors="k", linewidths=1.0)
        for label, color in ((-1.0, NEGATIVE), (1.0, POSITIVE)):
            chosen = labels == label
            ax.scatter(x_train[chosen, 0], x_train[chosen, 1], s=6, c=color, linewidths=0)
        if support is not None and len(support):
            ax.scatter(x_train[support, 0], x_train[support, 1], s=28, facecolors="none", edgecolors="k",
                       linewidths=0.7, label=f"{len(support)} support vectors")
            ax.legend(loc="lower right", fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.set_xlim(grid.xs[0], grid.xs[-1])
        ax.set_ylim(grid.ys[0], grid.ys[-1])
    return fig, axes


def plot_path_weights(net: PathNetwork, signs: PathSigns | None = None):
    """Figures 8-9: the network drawn as a graph (edge colour = sign, width = magnitude within its layer) and
    the share of paths, and of path mass ``Σ|wbar_p|``, that is positive."""
    signs = path_signs(net) if signs is None else signs
    fig, (graph, bars) = plt.subplots(1, 2, figsize=(9, 3.8), gridspec_kw={"width_ratios": [2.2, 1]})
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
    graph.set_ylim(-0.8, height + 0.1)
    graph.plot([], [], color=POSITIVE, label="positive weight")
    graph.plot([], [], color=NEGATIVE, label="negative weight")
    graph.legend(loc="lower center", fontsize=7, ncol=2)
    negative_mass = 1 - signs.positive_mass_fraction
    negative_count = signs.negative_count / signs.num_paths
    bars.bar([0, 1], [signs.positive_count_fraction, signs.positive_mass_fraction], color=POSITIVE, label="positive")
    bars.bar([0, 1], [negative_count, negative_mass],
             bottom=[signs.positive_count_fraction, signs.positive_mass_fraction], color=NEGATIVE, label="negative")
    bars.set_xticks([0, 1], [f"paths\n({signs.num_paths})", "path mass\nΣ|w̄_p|"])
    bars.set_ylim(0, 1)
    bars.set_title(f"w̄ > 0 on {100 * signs.positive_count_fraction:.1f}% of paths,\n"
                   f"{100 * signs.positive_mass_fraction:.2f}% of path mass", fontsize=8)
    bars.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig, (graph, bars)


def agreement_counts(metrics: dict[str, float]) -> dict[str, float]:
    """Table II from the callback's metrics: validation samples misclassified by the network only, by the SVM
    only, by both, and the agreement of the two (fraction)."""
    both = metrics["val_errors_both"]
    return {
        "network_only": metrics["val_errors_network"] - both,
        "svm_only": metrics["val_errors_svm"] - both,
        "both": both,
        "agreement": metrics["val_agreement"],
    }


def plot_agreement(labels: Sequence[Any], counts: Sequence[dict[str, float]], xlabel: str = "FC depth"):
    """Stacked bars of :func:`agreement_counts` per setting (Table II) and the agreement in percent."""
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    where = np.arange(len(labels))
    bottom = np.zeros(len(labels))
    for key, color, text in (("both", "0.35", "both"), ("network_only", "tab:orange", "network only"),
                             ("svm_only", "tab:green", "SVM only")):
        values = np.array([c[key] for c in counts], dtype=float)
        ax.bar(where, values, bottom=bottom, color=color, label=text)
        bottom += values
    ax.set_xticks(where, [str(v) for v in labels])
    ax.set_xlabel(xlabel)
    ax.set_ylabel("misclassified validation samples")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3)
    twin = ax.twinx()
    twin.plot(where, [100 * c["agreement"] for c in counts], "k.-")
    twin.set_ylabel("agreement network / SVM (%)")
    twin.set_ylim(min(95.0, *(100 * c["agreement"] - 0.5 for c in counts)), 100.2)
    fig.tight_layout()
    return fig, ax


def plot_sweep(
    rows: Sequence[dict[str, Any]],
    x: str,
    series: dict[str, str],
    *,
    xlabel: str,
    ylabel: str,
    logx: bool = False,
    logy: bool = False,
    title: str | None = None,
    ax: Any = None,
):
    """Metrics (means with ``<metric>_std`` error bars) of summary rows against the swept parameter ``x``;
    ``series`` maps each metric to its legend label."""
    fig, ax = plt.subplots(figsize=(5, 3.6)) if ax is None else (ax.figure, ax)
    xs = np.array([row[x] for row in rows], dtype=float)
    for metric, label in series.items():
        mean = np.array([row[metric] for row in rows], dtype=float)
        std = np.array([row.get(f"{metric}_std", np.nan) for row in rows], dtype=float)
        ax.errorbar(xs, mean, yerr=np.where(np.isfinite(std), std, 0.0), marker="o", capsize=3, label=label)
    ax.set_xscale("log" if logx else "linear")
    if not logx and np.all(xs == np.round(xs)):
        ax.set_xticks(xs)
    ax.set_yscale("log" if logy else "linear")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=9)
    if len(series) > 1:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig, ax


def plot_unique_patterns(rows: Sequence[dict[str, Any]], n_test: int | None = None):
    """Table 6: unique activation patterns on the training and test sets against ``m``, with ``m`` itself (one
    pattern per sample) for reference."""
    fig, ax = plot_sweep(rows, "m", {"unique_patterns_train": "train", "unique_patterns_val": "test"},
                         xlabel="training samples m", ylabel="unique activation patterns", logx=True, logy=True)
    ms = np.array([row["m"] for row in rows], dtype=float)
    ax.plot(ms, ms, "k--", lw=0.8, label="m (one per sample)")
    if n_test is not None:
        ax.axhline(n_test, color="0.5", ls=":", lw=0.8, label=f"test samples ({n_test})")
    ax.legend(fontsize=8)
    return fig, ax
