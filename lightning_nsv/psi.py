"""The old import path of Ψ's spectrum and rank (DESIGN §3), kept working: the code lives in
:mod:`lightning_nsv.analysis.psi` (entry points, streaming), :mod:`~lightning_nsv.analysis.psi_result` (the result),
:mod:`~lightning_nsv.analysis.psi_fast` and :mod:`~lightning_nsv.analysis.psi_ritz` (the certified fast route).
Patch names where they are used (``lightning_nsv.analysis.psi.SMALL_SIDE``), not here."""
from lightning_nsv.analysis.psi import (SMALL_SIDE, SPECTRA, UNSCALED_EXPONENT, as_matrix64, check_finite,
                                        check_streaming_memory, matrix_with_singular_values, psi_spectrum,
                                        psi_spectrum_streaming, r_factor)
from lightning_nsv.analysis.psi_fast import (BOTTOM_BLOCK, CLUSTER_GAP, CLUSTER_WINDOWS, GRAM_SHIFT, HEAD_TRIMS,
                                             NORM_PROBES, PIVOT_TOL, RANK_MARGIN, TOP_BLOCK)
from lightning_nsv.analysis.psi_result import EPS64, PsiSpectrum, spectrum_summary
from lightning_nsv.analysis.psi_ritz import (CERT_RTOL, EXTREMES_RTOL, KRYLOV_CHECK, KRYLOV_EXTRA, KRYLOV_MAX_STEPS,
                                             KRYLOV_PRECHECK, KRYLOV_TRIES, RITZ_ROUNDING)
from lightning_nsv.errors import NonFiniteError
from lightning_nsv.threads import single_threaded_blas as blas_threads

__all__ = ["BOTTOM_BLOCK", "CERT_RTOL", "CLUSTER_GAP", "CLUSTER_WINDOWS", "EPS64", "EXTREMES_RTOL", "GRAM_SHIFT",
           "HEAD_TRIMS", "KRYLOV_CHECK", "KRYLOV_EXTRA", "KRYLOV_MAX_STEPS", "KRYLOV_PRECHECK", "KRYLOV_TRIES",
           "NORM_PROBES", "NonFiniteError", "PIVOT_TOL", "PsiSpectrum", "RANK_MARGIN", "RITZ_ROUNDING", "SMALL_SIDE",
           "SPECTRA", "TOP_BLOCK", "UNSCALED_EXPONENT", "as_matrix64", "blas_threads", "check_finite",
           "check_streaming_memory", "matrix_with_singular_values", "psi_spectrum", "psi_spectrum_streaming",
           "r_factor", "spectrum_summary"]
