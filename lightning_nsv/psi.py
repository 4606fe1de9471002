"""Ψ of a skip network: its extreme singular values and numerical rank (DESIGN §3), torch and scipy only.

A skip network wires M hidden units to the outputs, ``G = Ψ V`` with ``Ψ`` the N×M matrix of those units'
post-activation values on the N training samples (no bias column, never centred). Lemma 3.2 / Theorem 3.4
of Nguyen, Mukkamala & Hein (2019) need ``rank Ψ = N``. The rank is the float64 numerical rank with the
tolerance ``σ_max · max(N, M) · eps`` of ``torch.linalg.matrix_rank``.

- :func:`psi_spectrum`: σ_min, σ_max, rank and condition number; ``spectrum="fast"`` (default) without a full
  SVD, ``spectrum="full"`` by ``torch.linalg.svdvals``.
- :func:`psi_spectrum_streaming`: the same for a Ψ produced in row blocks, under a memory limit (R factor).
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch
from torch import Tensor

EPS64 = torch.finfo(torch.float64).eps
SPECTRA = ("fast", "full")
#: The fast route keeps the rows of Ψ whose pivots in a pivoted Cholesky of the Gram matrix are above this
#: fraction of the first (cond ≲ 1/sqrt(cut), where the Gram matrix still preconditions well); when a check
#: fails it tries the next, smaller set of rows.
GRAM_PIVOT_TOLS = (1e-13, 1e-10, 1e-7)
#: Below this many rows (of the smaller side) a full SVD is cheap: the fast route takes it.
SMALL_SIDE = 256
#: The fast route trusts a rank decision only with singular values at least this factor from the tolerance.
RANK_MARGIN = 10.0
#: ... and, for the singular values of the remainder, this separation from the kept rows' smallest one.
SEPARATION = 1e3
#: Largest relative residual ‖Ψᵀ… ‖ of an accepted Ritz triple of the kept rows.
RITZ_RESIDUAL = 1e-4


def as_matrix64(a: Any, name: str) -> Tensor:
    a = torch.as_tensor(a).detach().to(device="cpu", dtype=torch.float64)
    if a.dim() != 2 or a.numel() == 0:
        raise ValueError(f"`{name}` must be a non-empty 2-D matrix, got shape {tuple(a.shape)}")
    return a


def plot_axes(ax: Any) -> tuple[Any, Any]:
    """``(fig, ax)``: the given axes' figure, or a new pyplot-free figure."""
    if ax is not None:
        return ax.figure, ax
    from matplotlib.figure import Figure  # no pyplot: no global backend state

    fig = Figure(figsize=(5, 3.6), layout="constrained")
    return fig, fig.add_subplot()


@contextmanager
def blas_threads(torch_threads: int | None) -> Iterator[None]:
    """One OpenBLAS thread (scipy's) while torch's pool works, ``torch_threads`` torch threads (None: as set);
    both restored on exit. On a loaded machine the two pools otherwise fight for the cores."""
    from threadpoolctl import threadpool_limits

    saved = torch.get_num_threads()
    try:
        if torch_threads:
            torch.set_num_threads(torch_threads)
        with threadpool_limits(limits=1, user_api="blas"):
            yield
    finally:
        torch.set_num_threads(saved)


# ----------------------------------------------------------------------------------------------- the result
@dataclass(frozen=True)
class PsiSpectrum:
    """Extreme singular values of Ψ (float64, descending) and its numerical rank.

    ``top`` and ``bottom`` hold the largest and the smallest of the min(N, M) singular values (all of them,
    also in ``singular_values``, when the full spectrum was computed). ``full_rank`` means rank N, the
    condition of Lemma 3.2; it needs M ≥ N. ``condition_number`` is ``sigma_max / sigma_min`` (inf when
    ``sigma_min`` is 0). ``method``: ``"svd"`` (SVD of Ψ), ``"qr"`` (SVD of Ψ's R factor), ``"gram"`` (the
    fast route, :func:`psi_spectrum`).
    """

    top: Tensor
    bottom: Tensor
    rank: int
    tolerance: float
    num_samples: int
    num_units: int
    method: str = "svd"
    singular_values: Tensor | None = None

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

    def plot(self, ax: Any = None) -> tuple[Any, Any]:
        """Singular values (all, or the top-k and bottom-k) on a log scale with the tolerance; ``(fig, ax)``."""
        fig, ax = plot_axes(ax)
        k = min(self.num_samples, self.num_units)
        floor = self.tolerance * 1e-3
        if self.singular_values is not None:
            s = self.singular_values.clamp_min(floor).numpy()
            ax.semilogy(range(1, len(s) + 1), s, ".-", ms=3, lw=0.8, label="singular values")
        else:
            top, bottom = self.top.clamp_min(floor).numpy(), self.bottom.clamp_min(floor).numpy()
            ax.semilogy(range(1, len(top) + 1), top, "o-", ms=3, lw=0.8, label=f"largest {len(top)}")
            ax.semilogy(range(k - len(bottom) + 1, k + 1), bottom, "s-", ms=3, lw=0.8, label=f"smallest {len(bottom)}")
        ax.axhline(self.tolerance, color="C3", ls="--", lw=0.8, label="rank tolerance")
        ax.axvline(self.num_samples, color="C7", ls=":", lw=0.8, label="N")
        ax.set(xlabel="index i (descending order)", ylabel="singular value σᵢ of Ψ",
               title=f"Ψ: N={self.num_samples}, M={self.num_units}, rank={self.rank}, κ={self.condition_number:.2e}"
                     f" ({self.method})")
        ax.legend(fontsize=8)
        return fig, ax


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


# ------------------------------------------------------------------------------------------- the entry point
def psi_spectrum(psi: Any, spectrum: str = "fast", num_extremes: int = 8,
                 torch_threads: int | None = None) -> PsiSpectrum:
    """Numerical rank, σ_min, σ_max and condition number of Ψ in float64.

    The tolerance is that of ``torch.linalg.matrix_rank``: ``σ_max · max(N, M) · eps(float64)``. Ψ is used
    as it is (no centring, no bias column). Write ``B`` for Ψ or Ψᵀ, whichever has fewer rows, k×p.

    - ``spectrum="full"``: all singular values by ``torch.linalg.svdvals``, about ``4·p·k²`` flops, half of
      them matrix-vector (memory-bound).
    - ``spectrum="fast"``: no SVD of Ψ. The Gram matrix ``B Bᵀ`` (``p·k²`` flops, matrix-matrix) gets a
      pivoted Cholesky factorisation (``k³/3``), which keeps the rows of B it can resolve (cond ≲ 3·10⁶) and
      factors their Gram block ``L Lᵀ``. Lanczos on ``(L Lᵀ)⁻¹`` (triangular solves, ``k²`` a step) finds the
      smallest singular vectors of those rows, and σ_min comes from a Rayleigh–Ritz step with B itself, so
      it is not limited by the squared condition number of the Gram matrix; σ_max from Lanczos on ``B Bᵀ``.
      The other rows (near the span of the kept ones) are projected out of it with corrected semi-normal
      equations; the singular values of that remainder on its own subspace bound the rest of the spectrum.
      A rank decision is accepted only when every singular value it rests on is at least ``RANK_MARGIN``
      from the tolerance, the kept rows' σ_min is ``SEPARATION`` times the remainder's and the Ritz
      residuals are small; otherwise the exact route (the SVD of the k×k R factor of Bᵀ) answers, as it
      does below ``SMALL_SIDE`` rows. ``bottom`` then holds the smallest ``num_extremes`` singular values
      (of the remainder when there is one), ``top`` the largest. Memory: Ψ plus two k×k float64.

    Args:
        psi: N×M matrix (tensor or array) of skip-unit outputs on the training set.
        spectrum: ``"fast"`` or ``"full"``.
        num_extremes: How many of the largest and of the smallest singular values to keep (fast route).
        torch_threads: torch threads for the computation (restored afterwards); None keeps the setting.

    Raises:
        ValueError: If ``psi`` is not a non-empty 2-D matrix, or on an unknown ``spectrum``.

    Example::

        >>> psi_spectrum(torch.eye(3)).rank
        3
    """
    if spectrum not in SPECTRA:
        raise ValueError(f"`spectrum` can be {', '.join(SPECTRA)}, got {spectrum!r}")
    if num_extremes < 1:
        raise ValueError(f"`num_extremes` must be >= 1, got {num_extremes}")
    psi = as_matrix64(psi, "psi")
    n, m = psi.shape
    with blas_threads(torch_threads):
        if spectrum == "full" or min(n, m) <= SMALL_SIDE:
            return _from_singular_values(torch.linalg.svdvals(psi), n, m, "svd", num_extremes)
        return _fast_spectrum(psi if n <= m else psi.T, n, m, num_extremes)


def _exact_spectrum(b: Tensor, n: int, m: int, num_extremes: int) -> PsiSpectrum:
    r = torch.linalg.qr(b.T, mode="r").R
    return _from_singular_values(torch.linalg.svdvals(r), n, m, "qr", num_extremes)


def _lanczos_largest(apply: Callable[[np.ndarray], np.ndarray], size: int, count: int, tol: float,
                     seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The ``count`` largest eigenpairs of a symmetric positive operator on R^size (ARPACK, fixed start)."""
    from scipy.sparse.linalg import LinearOperator, eigsh

    op = LinearOperator((size, size), matvec=apply, dtype=np.float64)
    v0 = np.random.default_rng(seed).standard_normal(size)
    values, vectors = eigsh(op, k=count, which="LA", v0=v0, tol=tol, ncv=min(size, max(3 * count, 20)),
                            maxiter=50 * size)
    order = np.argsort(values)[::-1]
    return values[order], vectors[:, order]


def _gram(b: Tensor, blocks: int = 8) -> Tensor:
    """``B Bᵀ`` from its lower block triangle (block rows times the rows above them), mirrored: about
    ``(1 + 1/blocks)/2`` of the flops of one matrix product."""
    k = b.shape[0]
    gram = torch.empty(k, k, dtype=torch.float64)
    edges = [round(k * i / blocks) for i in range(blocks + 1)]
    for lo, hi in zip(edges[:-1], edges[1:]):
        gram[lo:hi, :hi] = b[lo:hi] @ b[:hi].T
        gram[:lo, lo:hi] = gram[lo:hi, :lo].T
    return gram


def _fast_spectrum(b: Tensor, n: int, m: int, num_extremes: int) -> PsiSpectrum:
    import scipy.linalg as sl
    from scipy.sparse.linalg import ArpackNoConvergence

    k = b.shape[0]
    gram = _gram(b)
    gram_f = gram.numpy().T  # symmetric: the Fortran-ordered view is the Gram matrix itself (its lower triangle)
    factor, piv, resolved, info = sl.lapack.dpstrf(gram_f, lower=1, tol=GRAM_PIVOT_TOLS[0] * float(gram.diag().max()))
    if info < 0 or resolved < 2:
        return _exact_spectrum(b, n, m, num_extremes)
    order = torch.from_numpy(piv.astype(np.int64) - 1)
    pivots = np.diag(factor)[:resolved] ** 2  # non-increasing
    try:
        top_eig, _ = _lanczos_largest(lambda x: sl.blas.dsymv(1.0, gram_f, x, lower=1), k,
                                      min(num_extremes, k - 1), tol=1e-10)
    except ArpackNoConvergence:
        return _exact_spectrum(b, n, m, num_extremes)
    top = torch.from_numpy(np.sqrt(np.maximum(top_eig, 0.0)))[:num_extremes]
    tol = float(top[0]) * max(n, m) * EPS64
    for cut in GRAM_PIVOT_TOLS:  # fewer head rows, better resolved, until the checks pass
        kept = int((pivots >= cut * pivots[0]).sum())
        if kept < 2:
            break
        lower = factor if kept == k else np.asfortranarray(factor[:kept, :kept])  # L Lᵀ = Gram[head][:, head]
        found = _split_spectrum(b, gram, order[:kept], order[kept:], lower, tol, num_extremes)
        if found is not None:
            rank, bottom = found
            return PsiSpectrum(top, bottom, rank, tol, n, m, "gram")
    return _exact_spectrum(b, n, m, num_extremes)


def _split_spectrum(b: Tensor, gram: Tensor, head: Tensor, tail: Tensor, lower: np.ndarray, tol: float,
                    num_extremes: int) -> tuple[int, Tensor] | None:
    """Rank and smallest singular values of B from its head rows (factor ``lower`` of their Gram block) and the
    remainder of its tail rows; None when a check fails."""
    import scipy.linalg as sl
    from scipy.sparse.linalg import ArpackNoConvergence

    kept, k = len(head), b.shape[0]
    count = min(num_extremes, kept - 1)
    try:
        _, inv_vec = _lanczos_largest(
            lambda x: sl.solve_triangular(lower, sl.solve_triangular(lower, x, lower=True, check_finite=False),
                                          lower=True, trans="T", check_finite=False), kept, count, tol=1e-9)
    except ArpackNoConvergence:
        return None
    # Rayleigh–Ritz with the head rows of B on the Lanczos vectors: X orthonormal, Xᵀ B_head = Y Σ Zᵀ
    x = torch.linalg.qr(torch.from_numpy(inv_vec)).Q
    embedded = torch.zeros(k, count, dtype=torch.float64)
    embedded[head] = x
    left, head_sv, right_t = torch.linalg.svd((b.T @ embedded).T, full_matrices=False)
    residual = torch.linalg.vector_norm((b @ right_t.T)[head] - (x @ left) * head_sv, dim=0) / head_sv
    head_min = float(head_sv[-1])
    if not (float(residual.max()) <= RITZ_RESIDUAL and head_min > RANK_MARGIN * tol):
        return None
    if len(tail) == 0:
        return kept, head_sv[-num_extremes:]
    tail_sv = _remainder_singular_values(b, gram, head, tail, lower, tol)
    near_tol = ((tail_sv > tol / RANK_MARGIN) & (tail_sv < tol * RANK_MARGIN)).any()
    if float(tail_sv[0]) * SEPARATION > head_min or bool(near_tol):
        return None
    return kept + int((tail_sv > tol).sum()), tail_sv[-num_extremes:]


def _remainder_singular_values(b: Tensor, gram: Tensor, head: Tensor, tail: Tensor, lower: np.ndarray,
                               tol: float) -> Tensor:
    """Ritz values of B on ``{u : u_head = -C u_tail}``, ``C`` the least-squares coefficients of the tail rows on
    the head rows (semi-normal equations, corrected once unless the remainder is already below the tolerance).

    Any ``C`` gives ``σ_{head+i}(B) <= σ_i(tail rows - Cᵀ head rows)`` (a rank-``len(head)`` change), so a
    remainder below ``tol / RANK_MARGIN`` in Frobenius norm proves the rank; its values are then only
    estimated (from its Gram matrix). Otherwise they come from an SVD of the d×p remainder, and match the
    ``d = len(tail)`` smallest singular values of B when the head's smallest one is well above them."""
    chol = torch.from_numpy(np.tril(lower))
    coef = torch.cholesky_solve(gram[head][:, tail], chol)  # (head × tail)
    embed = torch.zeros(b.shape[0], len(tail), dtype=torch.float64)
    embed[tail] = torch.eye(len(tail), dtype=torch.float64)
    embed[head] = -coef
    remainder = embed.T @ b  # tail rows minus their least-squares fit by the head rows
    if float(torch.linalg.matrix_norm(remainder)) > tol / RANK_MARGIN:
        embed[head] -= torch.cholesky_solve((b @ remainder.T)[head], chol)  # corrected semi-normal step
        remainder = embed.T @ b
    r = torch.linalg.cholesky(embed.T @ embed, upper=True)  # orthonormal basis of the subspace: embed · r⁻¹
    ritz = torch.linalg.solve_triangular(r.T, remainder, upper=False)
    if float(torch.linalg.matrix_norm(ritz)) <= tol / RANK_MARGIN:
        return torch.linalg.eigvalsh(ritz @ ritz.T).flip(0).clamp_min(0).sqrt()
    return torch.linalg.svdvals(ritz)


# ------------------------------------------------------------------------------------------- streaming Ψ
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
    with blas_threads(torch_threads):
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
