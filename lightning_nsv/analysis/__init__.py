"""What a user asks of a trained network, as pure functions and frozen results (no Lightning import).

- :mod:`~lightning_nsv.analysis.psi`: Ψ of a skip network, its extreme singular values and numerical rank
  (DESIGN §3), :func:`psi_spectrum` (the certified fast route: :mod:`~lightning_nsv.analysis.psi_fast`) and
  :func:`psi_spectrum_streaming`, returning a :class:`PsiSpectrum`.
- :mod:`~lightning_nsv.analysis.valley`: the loss-valley certificates of skip networks (DESIGN §3): Lemma 2.1,
  the escape path of Theorem 3.4, Assumption 3.1, a 2-D slice of the loss.
- :mod:`~lightning_nsv.analysis.whole_network`: network support vectors of a whole piecewise-linear network
  (DESIGN §2c): :func:`whole_network_support_vectors`, binary and K-class, with the scope of what was analysed;
  :func:`whole_network_cost`, what it will cost, before training.

Every result is a frozen dataclass on one base, :class:`~lightning_nsv.analysis.result.AnalysisResult`:
``to_metrics()`` (a flat dict of floats, what the callbacks log) and ``report()`` (Markdown).
"""
from lightning_nsv.analysis.psi import psi_spectrum, psi_spectrum_streaming
from lightning_nsv.analysis.psi_result import PsiSpectrum
from lightning_nsv.analysis.result import AnalysisResult
from lightning_nsv.analysis.whole_network import (TimeBudgetError, WholeNetworkAnalysis, WholeNetworkMulticlassAnalysis,
                                                  whole_network_cost, whole_network_support_vectors)
from lightning_nsv.analysis.valley import (Assumption31Checks, EscapePath, Lemma21Certificate, LossSurface,
                                           assumption31_checks, escape_path, lemma21_certificate, loss_surface_2d)

__all__ = ["AnalysisResult", "Assumption31Checks", "EscapePath", "Lemma21Certificate", "LossSurface", "PsiSpectrum",
           "TimeBudgetError", "WholeNetworkAnalysis", "WholeNetworkMulticlassAnalysis", "assumption31_checks",
           "escape_path", "lemma21_certificate", "loss_surface_2d", "psi_spectrum", "psi_spectrum_streaming",
           "whole_network_cost", "whole_network_support_vectors"]
