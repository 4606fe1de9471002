"""Every figure of the package, for TensorBoard, the examples and papers; plots return ``(fig, ax)``.

- :func:`image_grid` and :func:`alpha_histogram`: the support vectors and their dual coefficients.
- Figure 7: :func:`decision_grid` evaluates the network and its max-margin classifier over a 2-D grid (the
  classifier through the kernel between grid points and the support vectors only), :func:`plot_decision_boundaries`
  draws them side by side.
- Figures 8-9: :func:`plot_path_weights`, the weights of a small network drawn as a graph coloured by sign, next to
  the signs of the path weights ``wbar`` (:func:`~lightning_nsv.path_space.path_signs`, no path materialised).
- Table II: :func:`agreement_counts` and :func:`plot_agreement`, validation samples misclassified by the network
  only, the SVM only, or both.
- Table 6: :func:`plot_unique_patterns`; Figures 1-5 and 10: :func:`plot_sweep`, error bars captioned by
  :func:`error_bar_caption`.
- Support sets of several runs (:mod:`lightning_nsv.analysis.stability`): :func:`plot_jaccard_matrix`, and
  :func:`plot_support_stability`, the matrix beside how many samples are support vectors in exactly c runs.

Single-panel figures are :data:`CARD_WIDTH` (4.5 inches) wide: one column of a two-column paper with little
scaling, and at matplotlib's 100 dpi about the 330-500 pixels that TensorBoard's image cards show, so their text
stays readable there.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import matplotlib.pyplot as plt  # for the examples; the package's figures below never touch pyplot's state
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import LogLocator, MaxNLocator, NullFormatter
import numpy as np
import torch
from torch import Tensor

from lightning_nsv.path_space import PathNetwork, PathSigns, forward_with_slopes, path_signs
from lightning_nsv.support_vectors import max_margin_decision, signed_labels
from lightning_nsv.ticks import unicode_log_ticks

__all__ = [
    "CARD_WIDTH",
    "GridDecisions",
    "agreement_counts",
    "alpha_histogram",
    "data_extent",
    "decision_grid",
    "error_bar_caption",
    "image_grid",
    "max_margin_decision",
    "plot_agreement",
    "plot_decision_boundaries",
    "plot_jaccard_matrix",
    "plot_max_margin_approach",
    "plot_path_weights",
    "plot_support_stability",
    "plot_sweep",
    "plot_unique_patterns",
    "short_number",
]

NEGATIVE, POSITIVE = "tab:red", "tab:blue"
REGION_NEGATIVE, REGION_POSITIVE = "#f4c7c3", "#c6dbef"


CARD_WIDTH = 4.5  # inches: 450 pixels at 100 dpi, near TensorBoard's image card


def short_number(value: float) -> str:
    """Two significant digits, exponent without padding: ``0.00123`` -> ``"1.2e-3"``, ``0.5`` -> ``"0.5"``."""
    if value == 0 or 1e-2 <= abs(value) < 1e3:
        return f"{value:.2g}"
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


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


def _subplots(*args: Any, figsize: tuple[float, float], **kwargs: Any):
    """``plt.subplots`` without pyplot: a :class:`~matplotlib.figure.Figure` that no backend or figure manager
    holds (a user's backend and open figures are left alone; nothing to close), drawn by whoever saves it."""
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(*args, **kwargs)


def error_bar_caption(rows: Sequence[dict[str, Any]], key: str | None = None) -> str:
    """What the error bars of summary rows are over, ``"mean ± 1 sd over 3 seeds"``, naming the points (by their
    ``key`` value) where fewer seeds reached zero training error, the only ones averaged: ``"(2 at m = 200)"``."""
    reached = [int(row["reached"]) for row in rows if row.get("reached") is not None]
    if not reached:
        return "mean ± 1 sd over seeds"
    most = max(reached)
    caption = "one seed, no error bars" if most == 1 else f"mean ± 1 sd over {most} seeds"
    fewer = [row for row in rows if row.get("reached") is not None and int(row["reached"]) < most]
    if fewer and key is not None:
        caption += " (" + ", ".join(f"{int(row['reached'])} at {key} = {row[key]}" for row in fewer) + ")"
    elif fewer:
        caption += f" (fewer at {len(fewer)} point{'s' if len(fewer) != 1 else ''})"
    return caption


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
        axes[0].legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(0.0, -0.18), ncol=3,
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
    graph.legend(loc="lower center", fontsize=7, ncol=2)
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


def plot_agreement(labels: Sequence[Any], counts: Sequence[dict[str, float]], xlabel: str = "FC depth",
                   caption: str | None = None):
    """Stacked bars of :func:`agreement_counts` per setting (Table II) and the agreement in percent; ``caption``
    (e.g. ``"mean over 3 seeds"``) says what the bars average."""
    fig, ax = _subplots(figsize=(CARD_WIDTH, 3.6))
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
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3,
              title=caption, title_fontsize=7)
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
    caption: str | None = None,
):
    """Metrics (means with ``<metric>_std`` error bars) of summary rows against the swept parameter ``x``;
    ``series`` maps each metric to its legend label. The legend's title says what the error bars are over:
    ``caption``, by default :func:`error_bar_caption` of the rows."""
    fig, ax = _subplots(figsize=(CARD_WIDTH, 3.4)) if ax is None else (ax.figure, ax)
    xs = np.array([row[x] for row in rows], dtype=float)
    for metric, label in series.items():
        mean = np.array([row[metric] for row in rows], dtype=float)
        std = np.array([row.get(f"{metric}_std", np.nan) for row in rows], dtype=float)
        ax.errorbar(xs, mean, yerr=np.where(np.isfinite(std), std, 0.0), marker="o", capsize=3, label=label)
    ax.set_xscale("log" if logx else "linear")
    if logx:
        unicode_log_ticks(ax.xaxis)
    if np.all(xs == np.round(xs)) and len(np.unique(xs)) <= 12:
        ax.set_xticks(np.unique(xs), [f"{v:g}" for v in np.unique(xs)])
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_yscale("log" if logy else "linear")
    if logy:
        unicode_log_ticks(ax.yaxis)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, title=error_bar_caption(rows, x) if caption is None else caption, title_fontsize=8)
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
    ax.legend(fontsize=8, title=error_bar_caption(rows, "m"), title_fontsize=8)
    return fig, ax


def plot_max_margin_approach(epochs: Sequence[float], cosine: Sequence[float], margin_ratio: Sequence[float],
                             title: str = "approach to the max-margin classifier"):
    """Cosine of ``wbar`` and ``v`` and the margin ratio against the epoch (log axis), one point per analysis."""
    fig, ax = _subplots(figsize=(4.5, 3.2))
    ax.plot(epochs, cosine, "o-", label="cos(w̄, v)")
    ax.plot(epochs, margin_ratio, "s-", label="margin ratio")
    ax.set_xscale("log")
    unicode_log_ticks(ax.xaxis)
    ax.set_xlabel("epoch (log scale)")
    ax.set_ylabel("value (1 = max-margin)")
    ax.set_ylim(0, 1.05)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig, ax


def plot_jaccard_matrix(jaccard: np.ndarray, names: Sequence[str], ax: Any = None):
    """The pairwise Jaccard overlaps ``|A ∩ B| / |A ∪ B|`` of k support sets as a heat map on [0, 1], each cell
    annotated with its value (two decimals), with a colour bar."""
    jaccard = np.asarray(jaccard, dtype=float)
    k = len(names)
    if jaccard.shape != (k, k):
        raise ValueError(f"`jaccard` must be {k}x{k} for {k} names, got shape {jaccard.shape}")
    fig, ax = _subplots(figsize=(CARD_WIDTH, 3.8)) if ax is None else (ax.figure, ax)
    image = ax.imshow(jaccard, vmin=0.0, vmax=1.0, cmap="viridis")
    size = float(np.clip(40 / max(k, 1), 5.0, 9.0))
    for i in range(k):
        for j in range(k):
            value = jaccard[i, j]
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=size,
                    color="black" if value > 0.6 else "white")
    ax.set_xticks(range(k), names, fontsize=size, rotation=45 if k > 4 else 0, ha="right" if k > 4 else "center")
    ax.set_yticks(range(k), names, fontsize=size)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04).set_label("Jaccard |A ∩ B| / |A ∪ B|", fontsize=8)
    return fig, ax


def plot_support_stability(jaccard: np.ndarray, names: Sequence[str], in_runs: Sequence[int],
                           chance: float | None = None, title: str | None = None):
    """Support sets of k runs on one training set: :func:`plot_jaccard_matrix` (left; ``chance`` is the overlap
    that random sets of the same sizes would have, said in the title) and, right, the training samples that are
    a support vector in exactly c of the k runs, c = 1..k (``in_runs[c]``; c = k is the core)."""
    k = len(names)
    if len(in_runs) != k + 1:
        raise ValueError(f"`in_runs` must count samples in 0..{k} runs ({k + 1} values), got {len(in_runs)}")
    fig, (heat, bars) = _subplots(1, 2, figsize=(2 * CARD_WIDTH, 3.8), gridspec_kw={"width_ratios": [1.2, 1]})
    plot_jaccard_matrix(jaccard, names, ax=heat)
    off = np.asarray(jaccard, dtype=float)[~np.eye(k, dtype=bool)]
    heading = f"support-set overlap: mean {off.mean():.2f}" if off.size else "support-set overlap"
    if chance is not None:
        heading += f"\n(random sets of these sizes: ≈ {chance:.2f})"
    heat.set_title(heading, fontsize=9)
    counts = np.asarray(in_runs[1:], dtype=float)
    where = np.arange(1, k + 1)
    bars.bar(where, counts, color=[POSITIVE if c == k else "0.6" for c in where])
    for c, n in zip(where, counts):
        bars.text(c, n, f"{int(n)}", ha="center", va="bottom", fontsize=8)
    bars.set_xticks(where, [str(c) for c in where])
    bars.set_xlabel(f"support vector in c of the {k} runs")
    bars.set_ylabel("training samples")
    bars.set_ylim(0, max(counts.max(initial=0.0), 1.0) * 1.15)
    bars.yaxis.set_major_locator(MaxNLocator(integer=True))
    core = int(counts[-1]) if k else 0
    bars.set_title(f"core (in all {k} runs): {core} sample{'' if core == 1 else 's'}", fontsize=9)
    bars.grid(alpha=0.3, axis="y")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig, (heat, bars)
