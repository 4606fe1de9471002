"""Ψ of a skip network: its extreme singular values and numerical rank (DESIGN §3), torch and scipy only.

A skip network wires M hidden units to the outputs, ``G = Ψ V`` with ``Ψ`` the N×M matrix of those units'
post-activation values on the N training samples (no bias column, never centred). Lemma 3.2 / Theorem 3.4
of Nguyen, Mukkamala & Hein (2019) need ``rank Ψ = N``. The rank is the float64 numerical rank with the
tolerance ``σ_max · max(N, M) · eps`` of ``torch.linalg.matrix_rank``.

- :func:`psi_spectrum`: σ_min, σ_max, rank and condition number; ``spectrum="fast"`` (default) without a full
  SVD (Gram matrix, Cholesky, block Krylov, Rayleigh–Ritz with Ψ itself, certified, SVD fallback:
  :mod:`~lightning_nsv.analysis.psi_fast`), ``spectrum="full"`` by ``torch.linalg.svdvals``.
- :func:`psi_spectrum_streaming`: the same for a Ψ produced in row blocks, under a memory limit (R factor).
- :func:`matrix_with_singular_values`: a dense matrix of a known spectrum, to check the routes.

The result, :class:`~lightning_nsv.analysis.psi_result.PsiSpectrum`, is in :mod:`~lightning_nsv.analysis.psi_result`.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable, Iterable

import numpy as np
import torch
from torch import Tensor

from lightning_nsv.analysis.psi_fast import _fast_spectrum
from lightning_nsv.analysis.psi_result import PsiSpectrum, _from_singular_values
from lightning_nsv.errors import NonFiniteError
from lightning_nsv.threads import single_threaded_blas
from lightning_nsv.validate import check_choice

SPECTRA = ("fast", "full")
#: Up to this many rows (of the smaller side) a full SVD is cheap (0.1 s for 400×10,000) and the fast route takes it.
SMALL_SIDE = 512
#: The fast route works on Ψ scaled by a power of two (exact) when max |Ψ| lies outside ``2^±UNSCALED_EXPONENT``:
#: its residual Gram matrices hold σ⁴, which overflow or underflow far from 1.
UNSCALED_EXPONENT = 32


def as_matrix64(a: Any, name: str) -> Tensor:
    a = torch.as_tensor(a).detach().to(device="cpu", dtype=torch.float64)
    if a.dim() != 2 or a.numel() == 0:
        raise ValueError(f"`{name}` must be a non-empty 2-D matrix, got shape {tuple(a.shape)}")
    return a


def psi_spectrum(psi: Any, spectrum: str = "fast", num_extremes: int = 8,
                 torch_threads: int | None = None) -> PsiSpectrum:
    """Numerical rank, σ_min, σ_max and condition number of Ψ in float64.

    The tolerance is that of ``torch.linalg.matrix_rank``: ``σ_max · max(N, M) · eps(float64)``. Ψ is used
    as it is (no centring, no bias column). Write ``B`` for Ψ or Ψᵀ, whichever has fewer rows, k×p.

    - ``spectrum="full"``: all singular values by ``torch.linalg.svdvals``, about ``4·p·k²`` flops, half of
      them matrix-vector (memory-bound).
    - ``spectrum="fast"``: no SVD of Ψ. The Gram matrix ``G = B Bᵀ`` (``p·k²`` flops, matrix-matrix), block Krylov
      on G and on ``(L Lᵀ)⁻¹`` (L its Cholesky factor), Rayleigh–Ritz with B itself and certified residual bounds; a
      pivoted Cholesky factorisation of G bounds the rank of a deficient Ψ; ``torch.linalg.svdvals`` wherever a
      check fails, as below ``SMALL_SIDE`` rows. Each step, what it assumes and how accurate it is:
      :mod:`lightning_nsv.analysis.psi_fast`. Memory: Ψ plus two or three k×k float64, and a copy of Ψ scaled by
      a power of two when max |Ψ| lies outside ``2^±UNSCALED_EXPONENT``. ``sigma_min_error`` and
      ``sigma_max_error`` hold the certified bounds.

    Args:
        psi: N×M matrix (tensor or array) of skip-unit outputs on the training set.
        spectrum: ``"fast"`` or ``"full"``.
        num_extremes: How many of the largest and of the smallest singular values to keep (fast route).
        torch_threads: torch threads for the computation (restored afterwards); None keeps the setting.

    Raises:
        ValueError: If ``psi`` is not a non-empty 2-D matrix, or on an unknown ``spectrum``.
        NonFiniteError: If ``psi`` has non-finite values (a ValueError).

    Example::

        >>> psi_spectrum(torch.eye(3)).rank
        3
    """
    check_choice("spectrum", spectrum, SPECTRA)
    if num_extremes < 1:
        raise ValueError(f"`num_extremes` must be >= 1, got {num_extremes}")
    psi = as_matrix64(psi, "psi")
    n, m = psi.shape
    largest = check_finite(psi, "psi")
    with single_threaded_blas(torch_threads):
        if spectrum == "full" or min(n, m) <= SMALL_SIDE:
            return _from_singular_values(torch.linalg.svdvals(psi), n, m, "svd", num_extremes)
        b = psi if n <= m else psi.T
        exponent = math.frexp(largest)[1]
        if abs(exponent) <= UNSCALED_EXPONENT:
            return _fast_spectrum(b, n, m, num_extremes)
        return _scaled(_fast_spectrum(b * 2.0**-exponent, n, m, num_extremes), 2.0**exponent)


def check_finite(a: Tensor, name: str) -> float:
    """``max |a|``, or a :class:`NonFiniteError` naming the first row with a NaN or an infinity (one pass, no
    temporary)."""
    low, high = torch.aminmax(a)  # NaN propagates
    largest = max(-float(low), float(high))
    if not math.isfinite(largest):
        rows = (~torch.isfinite(a)).any(1).nonzero().flatten()
        raise NonFiniteError(f"`{name}` has non-finite values (NaN or inf) in {len(rows)} of its {a.shape[0]} "
                             f"rows, the first row {int(rows[0])}: a diverged network or non-finite inputs; no "
                             "spectrum of a non-finite matrix")
    return largest


def _scaled(spectrum: PsiSpectrum, factor: float) -> PsiSpectrum:
    """The spectrum of ``factor·Ψ`` from that of Ψ (``factor`` a power of two: exact)."""
    def times(value: Any) -> Any:
        return None if value is None else value * factor

    return replace(spectrum, top=spectrum.top * factor, bottom=spectrum.bottom * factor,
                   tolerance=spectrum.tolerance * factor, singular_values=times(spectrum.singular_values),
                   sigma_max_error=times(spectrum.sigma_max_error), sigma_min_error=times(spectrum.sigma_min_error))


# ----------------------------------------------------------------------------------------- streaming Ψ
def r_factor(blocks: Iterable[Any], rows_per_qr: int) -> Tensor:
    """R of the QR factorisation of the matrix that ``blocks`` stack vertically, without holding that matrix.

    Streaming (TSQR) update: rows are buffered until ``rows_per_qr`` are held, then ``R <- qr([R; rows]).R``.
    R (at most C×C for C columns) has the singular values of the whole matrix, and, Householder QR being
    backward stable, as accurately as an SVD of the matrix itself; forming ``AᵀA`` instead would square the
    condition number. Cost: about ``2·(C + rows_per_qr)·C²`` flops per update.
    """
    r, buffer, held = None, [], 0
    for block in blocks:
        buffer.append(torch.as_tensor(block).to(torch.float64))
        held += len(buffer[-1])
        if held >= rows_per_qr:
            r, buffer, held = torch.linalg.qr(torch.cat(buffer if r is None else [r, *buffer]), mode="r").R, [], 0
    if buffer:
        r = torch.linalg.qr(torch.cat(buffer if r is None else [r, *buffer]), mode="r").R
    if r is None:
        raise ValueError("`blocks` yielded no block of Ψ")
    return r


def check_streaming_memory(num_samples: int, num_units: int, max_memory_bytes: int) -> None:
    """Raises the ValueError of :func:`psi_spectrum_streaming` when ``max_memory_bytes`` is below both Ψ
    (``8·N·M`` bytes) and its R factor with as many buffered rows (``16·min(N, M)²``)."""
    n, m, k = num_samples, num_units, min(num_samples, num_units)
    if 8 * n * m > max_memory_bytes and 16 * k * k > max_memory_bytes:
        raise ValueError(
            f"Ψ is {n}x{m} and even its {k}x{k} R factor with as many buffered rows ({16 * k * k / 2**20:.1f} MiB in "
            f"float64) exceeds max_memory_bytes={max_memory_bytes}; raise the limit or use fewer training samples "
            "or skip units"
        )


def psi_spectrum_streaming(
    blocks: Callable[[slice], Iterable[Tensor]], num_samples: int, num_units: int, max_memory_bytes: int,
    spectrum: str = "fast", num_extremes: int = 8, torch_threads: int | None = None,
) -> PsiSpectrum:
    """Spectrum of a Ψ that is produced in row blocks, holding at most about ``max_memory_bytes``.

    - ``8·N·M <= max_memory_bytes``: Ψ is assembled and :func:`psi_spectrum` answers (``spectrum`` route).
    - otherwise, ``M <= N``: the M×M R factor of Ψ is accumulated over its row blocks (:func:`r_factor`,
      one pass over the data), and its singular values are those of Ψ.
    - otherwise (``M > N``): the N×N R factor of Ψᵀ is accumulated over column chunks of Ψ (N×w, w as large
      as the limit allows), one pass over the data per chunk.

    Both streaming routes hold ``min(N, M)²`` float64 plus a buffer of rows that fills the rest of the limit,
    keep the SVD's accuracy and tolerance and give the full spectrum of R (``method="qr"``).

    Args:
        blocks: ``blocks(columns)`` yields the row blocks of ``Ψ[:, columns]``, top to bottom.
        num_samples: N, the number of rows the blocks add up to.
        num_units: M.
        max_memory_bytes: Bytes Ψ (or its R factor and row buffer) may take.
        spectrum, num_extremes, torch_threads: as in :func:`psi_spectrum`.

    Raises:
        ValueError: If even twice the ``min(N, M)²`` R factor exceeds ``max_memory_bytes``, or the blocks do
            not add up to N×M.
        NonFiniteError: If Ψ has non-finite values.
    """
    n, m = num_samples, num_units
    if 8 * n * m <= max_memory_bytes:
        psi = torch.cat([torch.as_tensor(b, dtype=torch.float64) for b in blocks(slice(None))])
        if psi.shape != (n, m):
            raise ValueError(f"the blocks of Ψ add up to {tuple(psi.shape)}, expected N x M = {n}x{m}")
        return psi_spectrum(psi, spectrum, num_extremes, torch_threads)
    check_streaming_memory(n, m, max_memory_bytes)
    k = min(n, m)
    rows = (max_memory_bytes - 8 * k * k) // (8 * k)  # rows of k columns (Ψ when M <= N, Ψᵀ otherwise), >= k
    if m <= n:
        r = r_factor(blocks(slice(None)), rows)
    else:
        r = r_factor((torch.cat(list(blocks(slice(c, min(c + rows, m))))).T for c in range(0, m, rows)), rows)
    if r.shape[1] != k:
        raise ValueError(f"the streamed rows have {r.shape[1]} columns, expected min(N, M) = {k} for Ψ of {n}x{m}")
    if not bool(torch.isfinite(r).all()):
        raise NonFiniteError(f"Ψ ({n}x{m}, streamed) has non-finite values (NaN or inf): a diverged network or "
                             "non-finite inputs; no spectrum of a non-finite matrix")
    with single_threaded_blas(torch_threads):
        return _from_singular_values(torch.linalg.svdvals(r), n, m, "qr", num_extremes)


# ------------------------------------------------------------------------------------- known-spectrum Ψ
def _random_orthogonal_along(a: np.ndarray, axis: int, rng: np.random.Generator, rounds: int = 2) -> np.ndarray:
    """``a`` times a random dense orthogonal matrix along ``axis``: ``rounds`` of random signs, a random
    permutation and an orthonormal DCT-II, O(size·log size) per vector instead of a QR of a size² matrix."""
    from scipy.fft import dct

    size = a.shape[axis]
    shape = [1, 1]
    shape[axis] = size
    for _ in range(rounds):
        a = a * rng.choice([-1.0, 1.0], size).reshape(shape)
        a = np.take(a, rng.permutation(size), axis=axis)
        a = dct(a, type=2, norm="ortho", axis=axis, workers=1)
    return a


def matrix_with_singular_values(singular_values: Any, num_rows: int, num_cols: int, seed: int = 0) -> Tensor:
    """A dense ``num_rows×num_cols`` float64 matrix ``U diag(s) Vᵀ`` with the given singular values and random
    orthogonal U, V (products of random signs, permutations and DCTs), for checking rank routes on a known
    spectrum. Cost: O(rows·cols·log) and one float64 copy of the matrix."""
    s = np.asarray(singular_values, dtype=np.float64)
    if s.ndim != 1 or len(s) > min(num_rows, num_cols):
        raise ValueError(f"need at most min(rows, cols) = {min(num_rows, num_cols)} singular values, got shape {s.shape}")
    rng = np.random.default_rng(seed)
    a = np.zeros((num_rows, num_cols))
    a[np.arange(len(s)), np.arange(len(s))] = s
    a = _random_orthogonal_along(a, 1, rng)
    return torch.from_numpy(np.ascontiguousarray(_random_orthogonal_along(a, 0, rng)))
