"""Support vectors along the depth (issue 44): the analysis of one trained network from every valid cut (or the ones
given), from the input (the whole network) to the head, with the cost of each said first. Where does the network go
from "almost every sample is needed" to "a few dozen are"?"""
from __future__ import annotations

import csv
import io
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from lightning_nsv.analysis.whole_network_budget import TimeBudgetError
from lightning_nsv.kernel.cut import valid_cuts
from lightning_nsv.models.layers import eval_mode
from lightning_nsv.scope.base import AnalysisOptions
from lightning_nsv.scope.choice import EXAMPLE_SAMPLES
from lightning_nsv.scope.cut import CutScope
from lightning_nsv.scope.outputs import module_inputs

__all__ = ["CutRow", "DepthProfile", "support_vector_profile"]

COST_SAMPLES = 32  # training inputs the pair network's rate is measured on


@dataclass(frozen=True)
class CutRow:
    """One cut of a :class:`DepthProfile`: where (``index`` from the input, ``cut``, what is analysed: ``part``
    ``"whole"`` for the pair network or ``"head"`` for a Linear/Leaky-ReLU chain), the numbers of its analysis
    (``s`` support vectors of ``m``; ``bits``: side information per support vector in the bound), the support
    vectors it shares with the next cut, the estimated and the measured seconds; ``note``: why it was not analysed."""

    index: int
    cut: str
    part: str
    m: int
    s: int
    s_over_m: float
    margin_ratio: float
    cosine: float
    val_agreement: float
    bound: float
    bits: int
    unique_patterns: int
    shared_with_next: int | None
    estimate_seconds: float | None
    seconds: float
    note: str = ""


@dataclass(frozen=True)
class DepthProfile:
    """The analyses of one network from each cut, in order of depth; ``supports`` the support vectors' indices."""

    network: str
    rows: tuple[CutRow, ...]
    supports: dict[str, np.ndarray]

    def table(self) -> str:
        """A markdown table, one line per cut."""
        head = ("| # | cut | part | s | s/m | margin ratio | cosine | val. agreement | bound (bits) | patterns "
                "| shared with next | est. s | s |")
        lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
        for r in self.rows:
            if r.note:
                lines.append(f"| {r.index} | `{r.cut}` | {r.part} | {r.note} |" + " |" * 9)
                continue
            shared = "–" if r.shared_with_next is None else str(r.shared_with_next)
            estimate = "–" if r.estimate_seconds is None else f"{r.estimate_seconds:.2g}"
            lines.append(f"| {r.index} | `{r.cut}` | {r.part} | {r.s} | {r.s_over_m:.3f} | {r.margin_ratio:.3g} | "
                         f"{r.cosine:.3g} | {_percent(r.val_agreement)} | {r.bound:.3g} ({r.bits}) | "
                         f"{r.unique_patterns} | {shared} | {estimate} | {r.seconds:.2g} |")
        return "\n".join(lines)

    def csv(self) -> str:
        out = io.StringIO()
        writer = csv.DictWriter(out, [f.name for f in fields(CutRow)], lineterminator="\n")
        writer.writeheader()
        for row in self.rows:
            writer.writerow(asdict(row))
        return out.getvalue()

    def figure(self) -> Any:
        from lightning_nsv.plotting import plot_depth_profile

        return plot_depth_profile(self.rows, title=self.network)[0]

    def write(self, directory: str | Path, tensorboard: bool = True) -> dict[str, Path]:
        """``profile.md``, ``profile.csv``, ``profile_supports.json`` (each cut's support vectors, indices into the
        training set), ``profile.png`` and (``tensorboard``) a TensorBoard run in ``directory`` (scalars against the
        cut index, the table as text, the figure); the paths by kind."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        paths = {"table": directory / "profile.md", "csv": directory / "profile.csv",
                 "supports": directory / "profile_supports.json", "figure": directory / "profile.png"}
        paths["table"].write_text(f"{self.network}\n\n{self.table()}\n", encoding="utf-8")
        paths["csv"].write_text(self.csv(), encoding="utf-8")
        paths["supports"].write_text(json.dumps({cut: support.tolist() for cut, support in self.supports.items()}),
                                     encoding="utf-8")
        figure = self.figure()
        figure.savefig(paths["figure"], dpi=120)
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            paths["tensorboard"] = directory / "tensorboard"
            with SummaryWriter(str(paths["tensorboard"])) as writer:
                for row in (r for r in self.rows if not r.note):
                    for key in ("s", "s_over_m", "margin_ratio", "cosine", "val_agreement", "bound",
                                "unique_patterns", "seconds"):
                        writer.add_scalar(f"profile/{key}", float(getattr(row, key)), row.index)
                writer.add_text("profile/table", self.table())
                writer.add_figure("profile/figure", figure)
        return paths


def _percent(value: float) -> str:
    return "–" if value is None or math.isnan(value) else f"{100 * value:.1f}%"


def _say_to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def support_vector_profile(module: nn.Module, x: Tensor, y: Tensor, x_val: Tensor | None = None,
                           y_val: Tensor | None = None, cuts: Sequence[str] | None = None, *, every: bool = False,
                           options: AnalysisOptions = AnalysisOptions(),
                           say: Callable[[str], None] | None = _say_to_stderr) -> DepthProfile:
    """The support-vector analysis of ``module`` (trained to zero error on ``x, y``) from each cut in ``cuts``
    (names of ``named_modules()``, or ``"input"``; default :func:`~lightning_nsv.kernel.cut.valid_cuts`: the input,
    the input of every layer and residual block that holds a Linear or a convolution, the head's first Linear;
    ``every``: at every module whose input is a cut, activations and pools included), each
    by :class:`~lightning_nsv.scope.cut.CutScope` (the part before the cut a fixed float64 embedding). The cost of
    every cut is estimated and said first (``say``; cuts near the input cost as much as a whole-network analysis); a
    cut whose estimate is above ``options.time_budget`` is left out with a note, the others analysed in order.

    Raises:
        ValueError: where a cut given is not valid (a skip connection crosses it: named), or on the inputs.
        NotSeparableError: where the network misclassifies a training sample.
    """
    say = say or (lambda line: None)
    cuts = list(valid_cuts(module, every) if cuts is None else cuts)
    x, x_val = module_inputs(module, x), None if x_val is None else module_inputs(module, x_val)
    n_val = 0 if x_val is None else len(x_val)
    scopes, estimates = [], []
    with eval_mode(module), torch.no_grad():
        for name in cuts:
            scope = CutScope.build(module, x[:EXAMPLE_SAMPLES], name)
            scopes.append(scope)
            estimate = scope.estimate_cost(x[:COST_SAMPLES], len(x), n_val)
            estimates.append(estimate)
            say(f"cut {len(scopes) - 1} `{name}` ({scope.line}): " + (
                "the head's kernel, fast" if estimate is None else estimate.describe()))
    rows, supports = [], {}
    for index, (name, scope, estimate) in enumerate(zip(cuts, scopes, estimates)):
        part = scope.inner.kind  # "head": a Linear/Leaky-ReLU chain; "whole": the pair network
        try:
            if estimate is not None:
                estimate.check(options.time_budget, scope.budget_advice)
        except TimeBudgetError as err:
            say(f"cut {index} `{name}` left out: {err}")
            rows.append(CutRow(index, name, part, len(x), 0, *[math.nan] * 5, 0, 0, None, estimate.seconds, 0.0,
                               note="left out: over the time budget"))
            continue
        started = time.perf_counter()
        with eval_mode(module), torch.no_grad():
            embedded, embedded_val = scope.embed(x), None if x_val is None else scope.embed(x_val)
        analysis = scope.analyse(scope.freeze(), embedded, y, embedded_val, y_val, options)
        seconds = time.perf_counter() - started
        supports[name] = np.asarray(analysis.svm.support_)
        agreement = math.nan if analysis.val_agreement is None else float(analysis.val_agreement)
        rows.append(CutRow(index, name, part, analysis.m, len(supports[name]), len(supports[name]) / analysis.m,
                           float(analysis.margin_ratio), float(analysis.cosine), agreement, float(analysis.bound),
                           analysis.bound_bits, int(analysis.unique_patterns_train), None,
                           None if estimate is None else float(estimate.seconds), seconds))
        say(f"cut {index} `{name}`: s = {rows[-1].s} of {analysis.m} (s/m {rows[-1].s_over_m:.3f}), bound "
            f"{analysis.bound:.3g}, {seconds:.1f} s")
    rows = [_with_shared(row, supports, rows[i + 1].cut if i + 1 < len(rows) else None) for i, row in enumerate(rows)]
    return DepthProfile(type(module).__name__, tuple(rows), supports)


def _with_shared(row: CutRow, supports: dict[str, np.ndarray], following: str | None) -> CutRow:
    if row.cut not in supports or following not in supports:
        return row
    shared = len(np.intersect1d(supports[row.cut], supports[following]))
    return CutRow(**{**asdict(row), "shared_with_next": shared})
