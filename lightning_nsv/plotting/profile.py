"""The profile of support vectors along the depth (issue 44): s/m and the compression bound at each cut."""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from lightning_nsv.plotting.base import CARD_WIDTH, LEGEND_SIZE, POSITIVE, _subplots

__all__ = ["plot_depth_profile"]


def plot_depth_profile(rows: Sequence[Any], title: str = ""):
    """s/m (left axis, linear) and the compression bound (right axis, log; 1 dashed: below it the bound says
    something) against the cut, from the input (left) to the head (right); ``rows`` hold ``index``, ``cut``,
    ``s_over_m``, ``bound`` (a :class:`~lightning_nsv.scope.profile.CutRow`); rows left out are not drawn."""
    rows = [r for r in rows if not getattr(r, "note", "")]
    fig, ax = _subplots(figsize=(CARD_WIDTH * 1.3, 3.6))
    where = np.array([r.index for r in rows], dtype=float)
    ax.plot(where, [r.s_over_m for r in rows], "o-", color=POSITIVE, label="s/m")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("s/m (support vectors / samples)", color=POSITIVE)
    ax.set_xticks([r.index for r in rows], [f"{r.index}: {r.cut}" for r in rows], rotation=30, ha="right",
                  fontsize=8)
    ax.set_xlabel("cut (input → head)")
    bounds = [r.bound if r.bound > 0 and math.isfinite(r.bound) else np.nan for r in rows]
    right = ax.twinx()
    right.semilogy(where, bounds, "s--", color="tab:red", label="compression bound")
    right.axhline(1.0, color="tab:red", lw=0.8, ls=":")
    right.set_ylabel("compression bound (log)", color="tab:red")
    lines = ax.get_lines()[:1] + right.get_lines()[:1]
    ax.legend(lines, [line.get_label() for line in lines], fontsize=LEGEND_SIZE, loc="upper right")
    if title:
        ax.set_title(title, fontsize=LEGEND_SIZE)
    fig.set_layout_engine("constrained")
    return fig, ax
