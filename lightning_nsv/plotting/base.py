"""What every figure of the package shares: the card width, the class colours, figures without pyplot and the
caption of error bars."""
from __future__ import annotations

from typing import Any, Sequence

from matplotlib.figure import Figure

NEGATIVE, POSITIVE = "tab:red", "tab:blue"
REGION_NEGATIVE, REGION_POSITIVE = "#f4c7c3", "#c6dbef"

CARD_WIDTH = 4.5  # inches: 450 pixels at 100 dpi, near TensorBoard's image card
# legends (and their titles) in points: 7-8 could not be read on TensorBoard's image card (issue 43)
LEGEND_SIZE = 10


def short_number(value: float) -> str:
    """Two significant digits, exponent without padding: ``0.00123`` -> ``"1.2e-3"``, ``0.5`` -> ``"0.5"``."""
    if value == 0 or 1e-2 <= abs(value) < 1e3:
        return f"{value:.2g}"
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _subplots(*args: Any, figsize: tuple[float, float], **kwargs: Any):
    """``plt.subplots`` without pyplot: a :class:`~matplotlib.figure.Figure` that no backend or figure manager
    holds (a user's backend and open figures are left alone; nothing to close), drawn by whoever saves it."""
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(*args, **kwargs)


def plot_axes(ax: Any) -> tuple[Any, Any]:
    """``(fig, ax)``: the given axes' figure, or a new pyplot-free figure of one panel."""
    if ax is not None:
        return ax.figure, ax
    fig = Figure(figsize=(5, 3.6), layout="constrained")
    return fig, fig.add_subplot()


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
