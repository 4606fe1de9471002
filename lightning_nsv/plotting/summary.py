"""The summary card of one support-vector analysis: the numbers a researcher reads first, and a verdict line."""
from __future__ import annotations

import math
from typing import Any

from lightning_nsv.plotting.base import CARD_WIDTH, NEGATIVE, POSITIVE, _subplots

_FRACTIONS = (  # key, label: drawn as a bar over [0, 1]
    ("support_fraction", "s/m"),
    ("margin_ratio", "margin ratio"),
    ("cosine_wbar_v", "cosine(w̄, v)"),
    ("val_agreement", "val. agreement"),
)
KKT_SOLVED = 1e-6  # a KKT residual at or below this: the max-margin problem is solved


def _value(metrics: dict[str, float], key: str) -> float | None:
    value = metrics.get(key)
    return None if value is None or not math.isfinite(float(value)) else float(value)


def summary_verdict(metrics: dict[str, float]) -> str:
    """One line: how many of the training samples are support vectors, ``"s = 209 of 1,438 (14.5%)"``."""
    s, fraction = _value(metrics, "n_support"), _value(metrics, "support_fraction")
    if s is None:
        return "no support-vector analysis"
    return f"s = {int(s):,}" + (f" of {round(s / fraction):,} ({100 * fraction:.1f}%)" if fraction else "")


def plot_summary_card(metrics: dict[str, float], epoch: int | None = None, title: str | None = None,
                      scope: str | None = None) -> tuple[Any, Any]:
    """A card of s, s/m, margin ratio, cosine, agreement, KKT residual and the compression bound (marked vacuous
    above 1, where it says nothing), under a one-line verdict in large text (:func:`summary_verdict`).

    ``metrics``: the analysis' ``to_metrics()`` (keys without the ``nsv/`` prefix); a missing or non-finite number is
    shown as "—", the others with three significant digits (a margin ratio of 2.4e-9 reads ``2.4e-09``, not
    ``0.000``). ``scope``: what was analysed ("whole network", "head only (trunk fixed)"), in the heading. Returns
    ``(fig, ax)``.
    """
    fig, ax = _subplots(figsize=(CARD_WIDTH, 3.2))
    fig.subplots_adjust(left=0.03, right=0.97, top=0.97, bottom=0.03)
    ax.set_axis_off()
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    heading = title or ("network support vectors" + ("" if scope is None else f" of the {scope}")
                        + ("" if epoch is None else f", epoch {epoch}"))
    ax.text(0.0, 0.99, heading, fontsize=9, color="0.35", va="top")
    ax.text(0.0, 0.90, summary_verdict(metrics), fontsize=17, weight="bold", va="top")
    y = 0.64
    for key, label in _FRACTIONS:
        _row(ax, y, label, _value(metrics, key))
        y -= 0.115
    kkt = _value(metrics, "kkt_residual")
    unsolved = kkt is not None and kkt > KKT_SOLVED
    _row(ax, y, "KKT residual", kkt, "—" if kkt is None else f"{kkt:.0e}",
         "" if kkt is None else ("not solved!" if unsolved else "solved"), unsolved)
    bound = _value(metrics, "compression_bound")
    vacuous = bound is not None and bound > 1
    _row(ax, y - 0.115, "bound", bound, "—" if bound is None else f"{bound:.3g}",
         "vacuous (> 1)" if vacuous else "test-error bound", vacuous)
    return fig, ax


def _row(ax: Any, y: float, label: str, value: float | None, shown: str | None = None, note: str | None = None,
         alarm: bool = False) -> None:
    """A label, its value and, without a ``note``, a bar of the value over [0, 1]; an ``alarm`` in red."""
    ax.text(0.0, y, label, fontsize=10, va="center")
    color = NEGATIVE if alarm else "black"
    if shown is None:
        shown = "—" if value is None else f"{value:.3g}"
    ax.text(0.56, y, shown, fontsize=10, va="center", ha="right", weight="bold", color=color)
    if note is not None:
        ax.text(0.60, y, note, fontsize=10, va="center", color=color if alarm else "0.35")
        return
    left, width, height = 0.60, 0.40, 0.07
    ax.add_patch(_rectangle((left, y - height / 2), width, height, "0.9"))
    if value is not None:
        ax.add_patch(_rectangle((left, y - height / 2), width * min(max(value, 0.0), 1.0), height, POSITIVE))


def _rectangle(xy: tuple[float, float], width: float, height: float, color: str) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle(xy, width, height, color=color, linewidth=0)
