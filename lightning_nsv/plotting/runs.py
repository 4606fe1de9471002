"""Figures across runs: sweeps with error bars (Figures 1-5 and 10, Table 6), network/SVM agreement (Table II),
and the support sets of several runs on one training set (:mod:`lightning_nsv.compare`)."""
from __future__ import annotations

from typing import Any, Sequence

from matplotlib.ticker import MaxNLocator, NullFormatter
import numpy as np

from lightning_nsv.plotting.base import CARD_WIDTH, LEGEND_SIZE, POSITIVE, _subplots, error_bar_caption
from lightning_nsv.ticks import unicode_log_ticks


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
    ax.legend(fontsize=LEGEND_SIZE, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3,
              title=caption, title_fontsize=LEGEND_SIZE)
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
    ax.legend(fontsize=LEGEND_SIZE, title=error_bar_caption(rows, x) if caption is None else caption,
              title_fontsize=LEGEND_SIZE)
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
    ax.legend(fontsize=LEGEND_SIZE, title=error_bar_caption(rows, "m"), title_fontsize=LEGEND_SIZE)
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
