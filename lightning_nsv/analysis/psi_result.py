"""The result of Ψ's spectrum (DESIGN §3): its extreme singular values, numerical rank and their certificates.

Written by :func:`lightning_nsv.analysis.psi.psi_spectrum` (and its streaming twin); read by the callbacks
(``to_metrics()``), people (``summary()``) and figures (``plot()``, drawn by :mod:`lightning_nsv.plotting`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lightning_nsv.analysis.result import AnalysisResult

EPS64 = torch.finfo(torch.float64).eps


@dataclass(frozen=True)
class PsiSpectrum(AnalysisResult):
    """Extreme singular values of Ψ (float64, descending) and its numerical rank.

    ``top`` and ``bottom`` hold the largest and the smallest of the min(N, M) singular values (all of them,
    also in ``singular_values``, when the full spectrum was computed). ``full_rank`` means rank N, the
    condition of Lemma 3.2; it needs M ≥ N. ``condition_number`` is ``sigma_max / sigma_min`` (inf when
    ``sigma_min`` is 0). ``method``: ``"svd"`` (SVD of Ψ), ``"qr"`` (SVD of Ψ's R factor), ``"gram"`` (the
    fast route, :func:`psi_spectrum`; when its rank is below min(N, M), ``bottom`` holds one number, an upper
    bound of σ_{rank+1}, …, σ_min, below the tolerance).
    """

    top: Tensor
    bottom: Tensor
    rank: int
    tolerance: float
    num_samples: int
    num_units: int
    method: str = "svd"
    singular_values: Tensor | None = None
    #: Fast route: the certified bounds on |σ − reported| of ``top[0]`` (σ_max) and ``bottom[-1]`` (σ_min, when
    #: the rank is full; else None, ``bottom`` being itself a bound). None from the SVD routes.
    sigma_max_error: float | None = None
    sigma_min_error: float | None = None

    @property
    def sigma_max(self) -> float:
        return float(self.top[0])

    @property
    def sigma_min(self) -> float:
        return float(self.bottom[-1])

    @property
    def condition_number(self) -> float:
        return self.sigma_max / self.sigma_min if self.sigma_min > 0 else math.inf

    @property
    def full_rank(self) -> bool:
        return self.rank == self.num_samples

    def to_metrics(self) -> dict[str, float]:
        return {
            "rank": float(self.rank),
            "sigma_min": self.sigma_min,
            "sigma_max": self.sigma_max,
            "condition_number": self.condition_number,
            "num_samples": float(self.num_samples),
            "num_units": float(self.num_units),
            "full_rank": float(self.full_rank),
        }

    def summary(self) -> str:
        """One line: shape, rank, σ_min, condition number and whether rank Ψ = N holds."""
        return spectrum_summary(self.to_metrics())

    def report(self) -> str:
        """:meth:`summary`."""
        return self.summary()

    def plot(self, ax: Any = None) -> tuple[Any, Any]:
        """Singular values (all, or the top-k and bottom-k) on a log scale with the tolerance; ``(fig, ax)``
        (:func:`~lightning_nsv.plotting.plot_psi_spectrum`)."""
        from lightning_nsv.plotting import plot_psi_spectrum  # matplotlib only where a figure is drawn

        return plot_psi_spectrum(self, ax)


def spectrum_summary(metrics: dict[str, float]) -> str:
    """The line of :meth:`PsiSpectrum.summary` from its ``to_metrics()`` (plain values, e.g. a checkpoint's)."""
    n, m, rank = (int(metrics[key]) for key in ("num_samples", "num_units", "rank"))
    numbers = f"σ_min {metrics['sigma_min']:.3g}, cond {metrics['condition_number']:.3g}"
    if rank == n:
        return f"Ψ: N={n}, M={m}, rank {rank} = N ({numbers}): the no-bad-valley condition holds"
    return f"Ψ: N={n}, M={m}, rank {rank} < N ({numbers}): the no-bad-valley condition does not hold"


def _from_singular_values(s: Tensor, n: int, m: int, method: str, num_extremes: int) -> PsiSpectrum:
    tol = float(s[0]) * max(n, m) * EPS64
    j = min(num_extremes, len(s))
    return PsiSpectrum(s[:j].clone(), s[-j:].clone(), int((s > tol).sum()), tol, n, m, method, s)
