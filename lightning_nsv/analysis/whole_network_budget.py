"""What a whole-network analysis will cost, said before it is paid (:mod:`lightning_nsv.analysis.whole_network`).

The kernel columns of a whole network come from the pair network, one evaluation a pair; the solver asks for the
columns of the samples that enter its free set, and whole networks keep most of their samples there (s/m of
0.47–0.99 measured on CIFAR), so the analysis costs up to the dense kernel's ``m(m + 1)/2`` pairs. Its rate is
measured on this machine for this network on a small tile of pairs (:func:`estimate_cost`); the estimate is said
before the solve when it is above :data:`SAY_ABOVE_SECONDS`, and refused when above the caller's time budget
(:class:`TimeBudgetError`, saying what would fit). :class:`PairBar` shows the pairs done against that bound, with
an ETA.
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass

import torch

from lightning_nsv.analysis.checks import check_finite_samples
from lightning_nsv.validate import check_bytes, check_flag, check_time_budget, is_count

__all__ = ["DEFAULT_TIME_BUDGET", "SAY_ABOVE_SECONDS", "AnalysisCost", "CostEstimate", "PairBar", "TimeBudgetError",
           "check_budgets", "check_cost_arguments", "check_cost_options", "estimate_cost", "say_to_stderr"]

SAY_ABOVE_SECONDS = 10.0
DEFAULT_TIME_BUDGET = 3600.0  # seconds: an analysis estimated above it is refused unless the caller raises it
CALIBRATION_SECONDS = 0.05  # the tile of pairs timed grows until it takes this long


class TimeBudgetError(ValueError):
    """The analysis would take longer than the time budget allows."""


def check_cost_options(time_budget, say, progress, advice) -> float | None:
    """Refuse what :class:`AnalysisCost` would misuse late (``say`` called only when an analysis is long, ``progress``
    read as a truth value): the budget as :func:`check_time_budget` returns it."""
    if say is not None and not callable(say):
        raise TypeError(f"`say` must be a function that takes the estimate's text (e.g. print, or a logger's info) or "
                        f"None (not said), got {say!r} ({type(say).__name__})")
    check_flag("progress", progress, "; a string such as 'no' would count as True")
    if not isinstance(advice, str) or not advice.strip():
        raise ValueError(f"`budget_advice` must be a non-empty string (what a time-budget refusal suggests besides a "
                         f"subsample, e.g. the network's head), got {advice!r}")
    return check_time_budget(time_budget)


def check_budgets(block_bytes, memory_bytes) -> None:
    """Refuse a ``block_bytes`` or ``memory_bytes`` (``None``: no budget) that is no positive integer."""
    check_bytes("block_bytes", block_bytes)
    if memory_bytes is not None:
        check_bytes("memory_bytes", memory_bytes)


def check_cost_arguments(x_sample, m, n_val, block_bytes, memory_bytes) -> tuple[int, int]:
    """Refuse what :func:`~lightning_nsv.analysis.whole_network.whole_network_cost` cannot measure or count: no
    tensor of samples, non-finite samples, ``m`` or ``n_val`` that are no integers ``>= 1`` and ``>= 0`` (numpy
    integers are taken, as Python ints)."""
    if not isinstance(x_sample, torch.Tensor) or not len(x_sample):
        got = f"a tensor of shape {tuple(x_sample.shape)}" if isinstance(x_sample, torch.Tensor) else \
            type(x_sample).__name__
        raise ValueError(f"`x_sample` must be a few training inputs, a tensor (n, *input_shape) with n >= 1 (e.g. "
                         f"x_train[:32]), got {got}")
    for name, value, low, what in (("m", m, 1, "training"), ("n_val", n_val, 0, "validation")):
        if not (is_count(value) and value >= low):
            raise ValueError(f"`{name}` must be an integer >= {low} (the {what} samples the analysis will take), got "
                             f"{value!r} ({type(value).__name__})")
    check_budgets(block_bytes, memory_bytes)
    if x_sample.is_floating_point():
        check_finite_samples(x_sample.reshape(len(x_sample), -1), "x_sample inputs")
    return int(m), int(n_val)


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    days = seconds / 86400
    if days < 730:
        return f"{days:.0f} days"
    years = days / 365.25
    return f"{years:,.0f} years" if years < 1e6 else f"{years:.1e} years"


def _per_pair(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.2f} µs"
    return f"{seconds * 1e3:.2f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _count(n: float) -> str:
    for scale, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M")):
        if n >= scale:
            return f"{n / scale:.2f} {unit}" if n < 1000 * scale else f"{n:.2e}"
    return f"{n:,.0f}"


def _bytes(n: float) -> str:
    for shift, unit in ((40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")):
        if n >= 1 << shift:
            return f"{n / 2 ** shift:.1f} {unit}" if n < 1024 << shift else f"{n / 2 ** 40:.2e} TiB"
    return f"{n:.0f} B"


@dataclass(frozen=True)
class CostEstimate:
    """An upper bound of the analysis' cost, from rates measured on this machine for this network.

    Attributes:
        m, n_val: training and validation samples.
        pairs: pair-network evaluations at most: the dense kernel (:func:`kernel_pairs`: about ``m²/2`` while the
            kernel's kept columns hold every column, else ``m²``), the diagonal ``m`` and the validation kernel
            ``n_val · m`` (whole networks need 75–100% of the first: s/m of 0.5–1).
        seconds_per_pair: measured on a tile of ``calibration_pairs`` pairs of the training set.
        solver_seconds: the solver's Cholesky factor if every sample enters it (``m³/3`` flops at the float64
            GEMM rate measured here).
        spent_seconds: the trace, gates and calibration, already done.
        memory_bytes: at most: what is allocated before the solve (``before_solve_bytes``) and the solver's columns
            and factor with every sample a support vector (``16·m²`` bytes).
        engine: how kernel entries are computed (``PairNetworkColumns.engine``).
    """

    m: int
    n_val: int
    pairs: int
    seconds_per_pair: float
    calibration_pairs: int
    solver_seconds: float
    spent_seconds: float
    before_solve_bytes: int
    memory_bytes: int
    engine: str
    flops_per_second: float

    def __post_init__(self) -> None:
        rates = (self.seconds_per_pair, self.solver_seconds, self.flops_per_second)
        if not (is_count(self.m) and self.m >= 1 and is_count(self.n_val) and self.n_val >= 0
                and all(math.isfinite(r) and r >= 0 for r in rates) and self.flops_per_second > 0):
            raise ValueError(f"a cost estimate needs m >= 1 and n_val >= 0 samples (integers), finite rates >= 0 and a "
                             f"GEMM rate > 0, got m={self.m!r}, n_val={self.n_val!r}, seconds_per_pair="
                             f"{self.seconds_per_pair!r}, solver_seconds={self.solver_seconds!r}, flops_per_second="
                             f"{self.flops_per_second!r}")

    @property
    def seconds(self) -> float:
        """Seconds still to come, at most."""
        return self.pairs * self.seconds_per_pair + self.solver_seconds

    def describe(self) -> str:
        return (f"whole-network analysis of m = {self.m:,}: up to {_count(self.pairs)} pairs (the dense kernel; whole "
                f"networks need 75–100% of it) at {_per_pair(self.seconds_per_pair)} a pair (measured on "
                f"{self.calibration_pairs:,} pair{'' if self.calibration_pairs == 1 else 's'}, {self.engine}), up to "
                f"{_duration(self.seconds)} more"
                f"{f' (the solver {_duration(self.solver_seconds)} of it)' if self.solver_seconds >= 1 else ''} and "
                f"up to {_bytes(self.memory_bytes)} ({_bytes(self.before_solve_bytes)} before the solver starts, "
                "then 16·m bytes per support vector)")

    def affordable_m(self, budget: float) -> int:
        """The largest number of training samples (at most this estimate's ``m``) whose cost still to come fits
        ``budget`` seconds, from this one's rates; ``budget`` as :func:`check_time_budget` takes it (``None`` or
        ``inf``: ``m``). What is already spent (:attr:`spent_seconds`) is not counted against it, as in
        :meth:`check`."""
        budget = check_time_budget(budget)
        if budget is None or budget == math.inf:
            return self.m

        def cost(m: int) -> float:
            return (m * m / 2 + m + self.n_val * m) * self.seconds_per_pair + m ** 3 / 3 / self.flops_per_second
        lo, hi = 0, self.m
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if cost(mid) <= budget else (lo, mid - 1)
        return lo

    def check(self, time_budget: float | None, advice: str) -> None:
        """Refuses (:class:`TimeBudgetError`) when the estimate is above ``time_budget`` seconds, saying what
        fits: a subsample of the largest size that does, and ``advice`` (the head of the network, where there is
        one)."""
        time_budget = check_time_budget(time_budget)
        if time_budget is None or self.seconds <= time_budget:
            return
        fits = self.affordable_m(time_budget)
        raise TimeBudgetError(
            f"the {self.describe()}: above time_budget={time_budget:g} s. Within it fit about m = {fits:,} training "
            f"samples (a random subsample) or {advice}; or pass time_budget=None (or a larger budget) to run it "
            "anyway")


def _gemm_flops(device: torch.device) -> float:
    """This machine's float64 GEMM rate (flops/s), best of three 384×384 products."""
    a = torch.randn(384, 384, dtype=torch.float64, device=device)
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        (a @ a).sum().item()
        best = min(best, time.perf_counter() - start)
    return 2 * 384 ** 3 / max(best, 1e-9)


def estimate_cost(columns, n_val: int, before_solve_bytes: int, spent_seconds: float, m: int | None = None,
                  cached_columns: int | None = None) -> CostEstimate:
    """Times ``columns`` (a :class:`~lightning_nsv.kernel.PairNetworkColumns`) on a tile of its pairs that grows
    until it takes :data:`CALIBRATION_SECONDS` (a first call, which may compile the runner, is not timed) and
    returns the :class:`CostEstimate` of an analysis of ``m`` training samples (default: the columns' own, whose
    kept columns bound the pairs; else ``cached_columns``)."""
    n = len(columns)
    m = n if m is None else m
    started = time.perf_counter()
    cached = columns.cache.capacity if cached_columns is None else cached_columns
    bound = kernel_pairs(m, cached, columns.tile_width) + n_val * m
    rows, cols = 4, 4
    columns.time_pairs(torch.arange(min(n, 2)), torch.arange(min(n, 2)))
    while True:
        seconds, pairs = columns.time_pairs(_spread(n, rows), _spread(n, cols))
        if seconds >= CALIBRATION_SECONDS or 4 * pairs > bound / 8 or (rows >= n and cols >= n):
            break
        rows, cols = min(n, 2 * rows), min(n, 2 * cols)
    flops = _gemm_flops(columns.device)
    return CostEstimate(
        m=m, n_val=n_val, pairs=bound, seconds_per_pair=seconds / max(pairs, 1),
        calibration_pairs=pairs, solver_seconds=m ** 3 / 3 / flops, flops_per_second=flops,
        spent_seconds=spent_seconds + time.perf_counter() - started, before_solve_bytes=before_solve_bytes,
        memory_bytes=before_solve_bytes + 16 * m * m, engine=columns.engine)


def kernel_pairs(m: int, cached_columns: int, width: int) -> int:
    """Pair-network evaluations of the training kernel at most: every entry once, each unordered pair once
    (``K[r, j] = K[j, r]``) while the columns kept by the kernel hold the columns computed so far (``m(m + w)/2``,
    ``w`` the columns computed at once), and the diagonal; every entry of every column once where they cannot."""
    columns = m * (m + width) // 2 if cached_columns >= m else m * m
    return columns + m


def _spread(m: int, count: int) -> torch.Tensor:
    return torch.linspace(0, m - 1, min(m, count)).round().long().unique()


class PairBar:
    """A tqdm bar of the pair-network evaluations against the estimate's bound, with an ETA (``enabled``)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc="whole-network kernel", unit=" pairs", unit_scale=True, leave=False,
                            dynamic_ncols=True, file=sys.stderr)

    def __call__(self, pairs: int) -> None:
        if self.bar is not None:
            self.bar.update(pairs)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class AnalysisCost:
    """The cost estimate said, checked against the budget, and the bar of pairs, for one analysis."""

    def __init__(self, time_budget, say, progress: bool, advice: str, started: float) -> None:
        self.time_budget, self.say, self.progress, self.advice, self.started = time_budget, say, progress, advice, \
            started
        self.estimate: CostEstimate | None = None
        self.bar = PairBar(0, enabled=False)
        self.pairs = 0  # of the validation kernel's columns, counted by the bar's hook

    def before_solve(self, columns, n_val: int, before_solve_bytes: int) -> None:
        """Estimate the cost on ``columns`` (a :class:`~lightning_nsv.kernel.PairNetworkColumns`), say it when long,
        refuse it above the budget, and count the pairs it runs on the bar."""
        if not columns.by_pairs:  # §1's GEMMs of a Linear chain: fast, no estimate
            return
        self.estimate = estimate_cost(columns, n_val, before_solve_bytes, time.perf_counter() - self.started)
        long = self.estimate.seconds + self.estimate.spent_seconds > SAY_ABOVE_SECONDS
        if long and self.say is not None:
            self.say(f"lightning_nsv: the {self.estimate.describe()}")
        self.estimate.check(self.time_budget, self.advice)
        self.bar = PairBar(self.estimate.pairs, enabled=self.progress and long)
        columns.on_pairs = self.bar

    def validation_pairs(self, pairs: int) -> None:
        self.pairs += pairs
        self.bar(pairs)

    def close(self) -> None:
        self.bar.close()


def say_to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)

