"""What a user asks of a trained network, as pure functions and frozen results (no Lightning import).

- :mod:`~lightning_nsv.analysis.binary`: network support vectors of a Linear/Leaky-ReLU network with one output
  (DESIGN §2), :func:`network_support_vectors`, returning a :class:`SupportVectorAnalysis`; the compression bound
  in :mod:`~lightning_nsv.analysis.bounds`, the refusals in :mod:`~lightning_nsv.analysis.checks`.
- :mod:`~lightning_nsv.analysis.multiclass`: the same for K outputs (DESIGN §2b), :func:`multiclass_support_vectors`.
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
from lightning_nsv.analysis.binary import SupportVectorAnalysis, network_support_vectors
from lightning_nsv.analysis.bounds import compression_bound
from lightning_nsv.analysis.checks import check_analysis_memory, conflicting_duplicates
from lightning_nsv.analysis.multiclass import (MulticlassSupportVectorAnalysis, centred_gram, multiclass_decision,
                                               multiclass_support_vectors)
from lightning_nsv.analysis.psi import matrix_with_singular_values, psi_spectrum, psi_spectrum_streaming
from lightning_nsv.analysis.psi_result import PsiSpectrum, spectrum_summary
from lightning_nsv.analysis.result import AnalysisResult
from lightning_nsv.analysis.valley import (Assumption31Checks, EscapePath, Lemma21Certificate, LossSurface,
                                           assumption31_checks, count_duplicates, escape_path,
                                           filter_normalised_direction, lemma21_certificate, loss_surface_2d)
from lightning_nsv.analysis.warm_start import serve_kernel_columns
from lightning_nsv.analysis.whole_network import (TimeBudgetError, WholeNetworkAnalysis, WholeNetworkMulticlassAnalysis,
                                                  whole_network_cost, whole_network_support_vectors)

__all__ = ["AnalysisResult", "Assumption31Checks", "EscapePath", "Lemma21Certificate", "LossSurface",
           "MulticlassSupportVectorAnalysis", "PsiSpectrum", "SupportVectorAnalysis", "TimeBudgetError",
           "WholeNetworkAnalysis", "WholeNetworkMulticlassAnalysis", "assumption31_checks", "centred_gram",
           "check_analysis_memory", "compression_bound", "conflicting_duplicates", "count_duplicates", "escape_path",
           "filter_normalised_direction", "lemma21_certificate", "loss_surface_2d", "matrix_with_singular_values",
           "multiclass_decision", "multiclass_support_vectors", "network_support_vectors", "psi_spectrum",
           "psi_spectrum_streaming", "serve_kernel_columns", "spectrum_summary", "whole_network_cost",
           "whole_network_support_vectors"]
