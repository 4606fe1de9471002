"""The certified fast route of :func:`~lightning_nsv.analysis.psi.psi_spectrum` (DESIGN §3): σ_min, σ_max and the
rank of Ψ without its SVD.

Write ``B`` for Ψ or Ψᵀ, whichever has fewer rows, k×p. The Gram matrix ``G = B Bᵀ`` (``p·k²`` flops,
matrix-matrix), then:


1. σ_max and the largest values: block Krylov on G, Rayleigh–Ritz with B itself, residual certificate.
2. If G has a Cholesky factor ``L Lᵀ`` (``k³/3``; else that of ``G + δI``, ``δ = GRAM_SHIFT·k·eps·σ_max²``,
   when G's smallest eigenvalues lie at its own rounding, as for σ_min ≈ 1e-8·σ_max: whether G is then
   numerically positive definite depends on the machine's BLAS): block Krylov on ``(L Lᵀ)⁻¹`` (block
   triangular solves) for the smallest singular subspace, then Rayleigh–Ritz with B itself: ``W = Bᵀ X``. The
   shift changes neither the subspace sought nor the Ritz values, which come from B. The Ritz
   values are upper bounds of the singular values they approximate (interlacing) and, computed from B,
   are not limited by G's squared condition number. Certificate (:func:`_exact_ritz`): exact residuals
   ``r = B y − μ u`` give linear and quadratic (cluster/gap) residual bounds; the result is accepted when the
   bound on σ_min is below ``CERT_RTOL`` relative, those on the other reported values below ``EXTREMES_RTOL``
   (they are drawn, not decided on), and σ_min is ``RANK_MARGIN`` times above the tolerance: rank k. A
   floating-point Ritz vector u carries rounding of about eps along the large singular directions, which
   ``y = Bᵀu/μ`` amplifies: ‖r‖/μ is at least about ``eps·κ²``, too much for the plain residual bounds; the
   bound that decides weighs the residual with ``(B Bᵀ)⁻¹`` (through an unshifted L), where that rounding
   hardly counts, and holds for the i-th smallest singular value itself. Its size is the
   squared residual over the squared relative gap to the next singular value, so on a dense spectrum it is
   far above the true error: measured at 10,000×12,000 with σ log-spaced 1 .. 1e-6 (gaps 0.28 %), the first
   certificate is 5e-5 on one machine and 1.6e-4 on another (then 1.0e-4 and 6.4e-5 six and twelve Krylov
   blocks later) while the error is ~1e-10, and 1e-6 would take 60 Krylov blocks (slower than the SVD).
   Hence ``CERT_RTOL = 1e-4``; the certified bound is returned (``sigma_min_error``). With a gap the bounds
   are tight (≤ 1e-7 at κ = 10⁸ for a separated 1 % cluster). Beyond κ ≈ 10⁷ G's own rounding
   spoils the subspace and the exact route answers. The values are accurate to about ``eps·σ_max``
   absolute, as the SVD's.
3. Otherwise (no factor, no certificate, or a Ritz value of σ_min below ``RANK_MARGIN`` times the tolerance,
   which stops the Krylov iteration at once): a pivoted Cholesky factorisation of G
   (``dpstrf``) splits the rows into ``head`` (pivots above ``PIVOT_TOL``) and ``tail``. The head's smallest
   singular value (step 2 on its rows) is a lower bound of ``σ_head(B)`` (interlacing: rank ≥ head); a
   randomised bound (Gaussian probes, computed with B, fails with probability ``2^-NORM_PROBES``) on the
   remainder of the tail rows orthogonal to the head rows bounds ``σ_{head+1}(B)`` from above: rank ≤ head
   when it is below the tolerance. Row operations change singular values, so only these two inequalities
   are used; ``bottom`` then holds that one bound (σ_min is at most it). One term of the bound, the error of
   the Gram matrix's least-squares coefficients on an already tiny vector, is an estimate
   (:func:`_remainder_bound`).
4. Any check that fails: ``torch.linalg.svdvals`` of Ψ (``method="svd"``, all singular values), as
   below ``SMALL_SIDE`` rows.

What is assumed, as by any Krylov eigensolver: the Krylov space started from a random block holds every singular
value between the reported ones and the gap used (convergence is checked, not proven). The Krylov and Rayleigh–Ritz
machinery and its certificates: :mod:`~lightning_nsv.analysis.psi_ritz`.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from lightning_nsv.analysis.psi_result import EPS64, PsiSpectrum, _from_singular_values
from lightning_nsv.analysis.psi_ritz import (CERT_RTOL, KRYLOV_EXTRA, _exact_ritz, _krylov_largest, _Ritz, _solve_lower,
                                             _times_columns, _TransposedProducts)

#: The fast route trusts a rank decision only with singular values at least this factor from the tolerance.
RANK_MARGIN = 10.0
#: Block sizes of the Krylov spaces for the smallest and the largest singular values.
BOTTOM_BLOCK, TOP_BLOCK = 32, 16
#: A relative gap (ratio of neighbouring σ² estimates) that ends a cluster at the small end of the spectrum: when
#: the default window of Ritz pairs does not certify, a window over the whole cluster is tried, whose values are
#: bounded through their gap to the rest; such a window spans at most CLUSTER_WINDOWS default ones (the
#: certificate's cost grows with the fourth power of its window, and far out the estimates are unconverged).
CLUSTER_GAP, CLUSTER_WINDOWS = 100.0, 8
#: Rows whose pivots in a pivoted Cholesky factorisation of the Gram matrix fall below this fraction of its largest
#: diagonal entry form the remainder of the rank-revealing route.
PIVOT_TOL = 1e-13
#: Times the rank-revealing route drops the last pivots from the head when the head's smallest Ritz values show
#: rows of the Gram matrix's rounding there (their pivots passed PIVOT_TOL).
HEAD_TRIMS = 2
#: Gaussian probes of the remainder's norm (the bound fails with probability 2^-NORM_PROBES).
NORM_PROBES = 48
#: A Gram matrix that is not numerically positive definite (its smallest eigenvalues at its own rounding, as for
#: σ_min ≈ 1e-8·σ_max) is factored with ``GRAM_SHIFT·k·eps·σ_max²`` added to its diagonal.
GRAM_SHIFT = 64.0


def _top_singular(b: Tensor, gram: Tensor, count: int, gen: torch.Generator) -> _Ritz | None:
    """The ``count`` largest singular values of B: block Krylov on the Gram matrix, Rayleigh–Ritz with B itself;
    the largest (σ_max) is certified, the others are Ritz values of the same space (lower bounds, interlacing).
    The exact step takes the Krylov space's leading Ritz vectors only (``W = Bᵀ X`` for 25 vectors instead of the
    whole space): σ_max needs only its linear or gap bound, which the residual of a converged vector gives."""
    def accept(x: Tensor, theta: Tensor) -> _Ritz | None:
        ritz = _exact_ritz(b, x, None, math.sqrt(max(float(theta[0]), 0.0)), False, count, theta,
                           keep=count + KRYLOV_EXTRA)
        return ritz if ritz.certified(1) else None

    return _krylov_largest(lambda v: _times_columns(gram, v), gram.shape[0], TOP_BLOCK, 1, accept, gen,
                           whole_space=False)


def _bottom_singular(b: Tensor, factor: Tensor, rows: Tensor | None, count: int, sigma_max: float,
                     gen: torch.Generator, rtol: float = CERT_RTOL, shift: float = 0.0,
                     deficient_below: float = 0.0) -> _Ritz | None:
    """The ``count`` smallest singular values of B (or of its ``rows``) with ``factor`` the Cholesky factor of their
    Gram matrix (plus ``shift·I``): block Krylov on ``(L Lᵀ)⁻¹`` (block triangular solves) finds the subspace,
    Rayleigh–Ritz with the exact rows of B gives the values and their certificate (:func:`_exact_ritz`), accepted
    for σ_min at relative error ``rtol`` (the others at :data:`EXTREMES_RTOL`). A shift leaves the eigenvectors and
    the exact Ritz values as they are; the Krylov estimates of σ² are the operator's less the shift, and the bound
    weighted through L (which needs ``L Lᵀ`` close to B Bᵀ) is not used. A cluster is looked for in the operator's
    own estimates, whose gaps above the shift are those of the spectrum. The Ritz pairs are returned uncertified
    when σ_min's Ritz value (an upper bound of σ_min, interlacing) lies below ``deficient_below``: B is then
    rank-deficient, a case for the caller's rank-revealing route."""
    solve = _solve_lower(factor)
    size = factor.shape[0]
    products = _TransposedProducts(b, rows)  # the whole Krylov space goes to each exact step

    def half(v: Tensor) -> Tensor:
        return torch.linalg.solve_triangular(factor, v, upper=False)

    def accept(x: Tensor, theta: Tensor) -> _Ritz | None:
        estimates, least = 1 / theta - shift, count + KRYLOV_EXTRA
        weighted = None if shift else half
        ritz = _exact_ritz(b, x, rows, sigma_max, True, count, estimates, weighted, keep=least,
                           products=products)
        if ritz.extremes_certified(count, rtol) or ritz.below(deficient_below, sigma_max):
            return ritz
        wider = _cluster_window(1 / theta, count, least, sigma_max)
        if wider is None:
            return None
        cluster = _exact_ritz(b, x, rows, sigma_max, True, count, estimates, weighted, keep=wider,
                              products=products)
        past, last = cluster.values[wider - 1], cluster.values[wider - 2]
        if not cluster.errors[wider - 1] <= 0.5 * (past - last):  # a singular value lies past the gap's middle
            return None
        errors = torch.minimum(cluster.errors[:least], ritz.errors)  # the Ritz values are the same: both bounds hold
        ritz = _Ritz(ritz.values, errors, ritz.vectors)
        return ritz if ritz.extremes_certified(count, rtol) else None

    return _krylov_largest(solve, size, BOTTOM_BLOCK, count, accept, gen)


def _cluster_window(estimates: Tensor, count: int, least: int, sigma_max: float) -> int | None:
    """A window of Ritz pairs over a cluster at the end of the spectrum, wider than ``least``: up to the first
    value past the largest relative gap of the estimates (σ², from the end; those up to the first one outside
    ``(0, σ_max²]`` only) beyond the first ``count``, when that gap is at least :data:`CLUSTER_GAP` and lies within
    :data:`CLUSTER_WINDOWS` times ``least``; else None. The caller checks that a singular value lies past the gap.
    A cluster at the end (e.g. 100 values at 1e-8, σ² below the Gram matrix's rounding, under a gap to 1e-3) has
    no gap inside a shorter window, and only a window over all of it bounds its values quadratically."""
    estimates = estimates[:CLUSTER_WINDOWS * least]
    outside = (estimates <= 0) | (estimates > sigma_max**2 * (1 + 1e-6))
    if bool(outside.any()):
        estimates = estimates[:int(outside.long().argmax())]
    if len(estimates) <= least:
        return None
    ratio = estimates[count:] / estimates[count - 1:-1].clamp_min(1e-300)
    widest = int(ratio.argmax())
    end = count + widest  # index of the first value past the widest gap
    return end + 1 if float(ratio[widest]) >= CLUSTER_GAP and end + 1 > least else None


def _remainder_bound(b: Tensor, gram: Tensor, factor: Tensor, head: Tensor, tail: Tensor, sigma_max: float,
                     sigma_head: float, gen: torch.Generator) -> float:
    """A bound on ``σ_{len(head)+1}(B)``, which holds with probability at least ``1 − 2^-NORM_PROBES``.

    ``Z = B_tail (I − P)``, P the orthogonal projector on the row space of ``B_head``, has
    ``σ_{h+i}(B) <= σ_i(Z)`` (for x ⊥ rows of B_head, ``‖B x‖ = ‖Z x‖``). For standard Gaussian ω,
    ``‖Z‖ <= 2·sqrt(2/π)·max_i ‖Z ω_i‖`` with probability ``1 − 2^-s`` (Halko, Martinsson & Tropp 2011, Lemma 4.1).
    ``Z ω = B_tail x − C s`` with ``x = ω − B_headᵀ y`` (y from the head's Gram factor), ``s = B_head x`` and
    ``C = B_tail B_headᵀ (B_head B_headᵀ)⁻¹``; ``B_tail x`` and ``s`` come from B itself, ``C s`` (tiny) from the Gram
    matrix, with a term for the Gram matrix's accuracy on it, plus ``2·eps·‖B_tail‖_F·‖x‖`` for the rounding of
    ``B_tail x``. The rounding of ``s`` reaches ``C s`` through C (‖C‖ in the hundreds for a poorly conditioned head):
    that term is an estimate, twice ``‖C (s − s')‖`` for ``s'`` summed in another order; an a-priori bound on it
    (``√M·eps·|B_head||x|``) would be thousands of times the rounding measured in extended precision."""
    k, p = b.shape
    solve = _solve_lower(factor)
    omega = torch.randn(p, NORM_PROBES, generator=gen, dtype=torch.float64)
    embed = torch.zeros(k, NORM_PROBES, dtype=torch.float64)
    s, x = _times_columns(b, omega)[head], omega
    for _ in range(3):  # corrected semi-normal equations, x nearly ⊥ the head rows: x ← x − B_headᵀ (G_head⁻¹ s)
        # x is updated by each small correction, not formed again as ω − B_headᵀ y: y grows to ‖ω‖/σ_min(B_head),
        # and the rounding of B_headᵀ y would keep s = B_head x at eps·κ·‖ω‖ (5.7e-11 against 1.3e-14 measured)
        x = x - _times_columns(b.T, embed.index_copy_(0, head, solve(s)))
        bx = _times_columns(b, x)
        z, s = bx[tail], bx[head]
    half = p // 2
    # s rounded in another summation order
    s_again = (_times_columns(b[:, :half], x[:half]) + _times_columns(b[:, half:], x[half:]))[head]
    # C s and C (s − s'): one gather of G's tail×head block, one solve of both right-hand sides
    cs, c_rounding = _times_columns(gram[tail[:, None], head], solve(torch.cat([s, s - s_again], 1))).split(
        NORM_PROBES, 1)
    # relative accuracy of the Gram matrix's C on s (its rounding, squared condition of the head rows)
    rel_c = min(1.0, 8 * EPS64 * math.sqrt(k) * (sigma_max / sigma_head) ** 2)
    tail_fro = math.sqrt(float(gram.diagonal()[tail].sum()))
    zeta = (torch.linalg.vector_norm(z - cs, dim=0) + rel_c * torch.linalg.vector_norm(cs, dim=0)
            + 2 * torch.linalg.vector_norm(c_rounding, dim=0)
            + 2 * EPS64 * tail_fro * torch.linalg.vector_norm(x, dim=0))
    return 2 * math.sqrt(2 / math.pi) * float(zeta.max())


def _gram(b: Tensor, blocks: int = 16) -> Tensor:
    """The symmetric ``B Bᵀ`` from its lower block triangle (block rows times the rows above them), mirrored:
    about ``(1 + 1/blocks)/2`` of the flops of one matrix product."""
    k = b.shape[0]
    gram = torch.empty(k, k, dtype=torch.float64)
    edges = sorted({round(k * i / blocks) for i in range(blocks + 1)})
    for lo, hi in zip(edges[:-1], edges[1:]):
        gram[lo:hi, :hi] = b[lo:hi] @ b[:hi].T
        gram[:lo, lo:hi] = gram[lo:hi, :lo].T
    return gram


def _cholesky(gram: Tensor, shift: float = 0.0) -> tuple[Tensor | None, int]:
    """Lower Cholesky factor of the Gram matrix plus ``shift·I`` and 0, or None and the order of the first leading
    block that is not (numerically) positive definite; ``gram`` is left as it was. One torch thread: LAPACK
    ``dpotrf`` of scipy (single-threaded, faster here than torch's); else torch's."""
    if not shift:
        return _lower_factor(gram)
    diagonal = gram.diagonal()  # shifted in place (no second k×k matrix), restored exactly
    saved = diagonal.clone()
    diagonal.add_(shift)
    try:
        return _lower_factor(gram)
    finally:
        diagonal.copy_(saved)


def _lower_factor(gram: Tensor) -> tuple[Tensor | None, int]:
    if torch.get_num_threads() == 1:
        import scipy.linalg as sl

        factor, info = sl.lapack.dpotrf(gram.numpy().T, lower=1, clean=1, overwrite_a=0)
        return (torch.from_numpy(factor), 0) if info == 0 else (None, int(info))
    factor, info = torch.linalg.cholesky_ex(gram)
    return (factor, 0) if int(info) == 0 else (None, int(info))


def _fast_spectrum(b: Tensor, n: int, m: int, num_extremes: int) -> PsiSpectrum:
    """Steps 1 and 2 of the module docstring (σ_max, then σ_min through a Cholesky factor of G), else step 3
    (:func:`_rank_revealing`); step 4, the exact route, wherever a check fails."""
    k = b.shape[0]
    if k < 8:
        return _exact_spectrum(b, n, m, num_extremes)
    count = max(1, min(num_extremes, k // 4))
    gen = torch.Generator().manual_seed(0)
    gram = _gram(b)
    top = _top_singular(b, gram, count, gen)
    if top is None:
        return _exact_spectrum(b, n, m, num_extremes)
    sigma_max = float(top.values[0])
    tol = sigma_max * max(n, m) * EPS64
    margin = RANK_MARGIN * tol  # a rank decision needs the singular values this far from the tolerance
    (factor, failed_at), shift = _cholesky(gram), 0.0
    if factor is None and k - failed_at < CLUSTER_WINDOWS * (count + KRYLOV_EXTRA):
        # the smallest eigenvalues at G's own rounding, or below 0. A failure with more rows after it than the
        # shifted route's widest cluster window certifies means about as many zero singular values: that case
        # goes straight to the rank-revealing route
        shift = GRAM_SHIFT * k * EPS64 * sigma_max**2
        factor, _ = _cholesky(gram, shift)
    if factor is not None:  # rank N unless σ_min says otherwise
        bottom = _bottom_singular(b, factor, None, count, sigma_max, gen, shift=shift,
                                  deficient_below=margin)
        if bottom is not None and float(bottom.values[0] - bottom.errors[0]) > margin:
            return PsiSpectrum(top.values[:count], bottom.values[:count].flip(0), k, tol, n, m, "gram", None,
                               float(top.errors[0]), float(bottom.errors[0]))
    del factor
    return _rank_revealing(b, gram, top, count, tol, gen, n, m, num_extremes)


def _rank_revealing(b: Tensor, gram: Tensor, top: _Ritz, count: int, tol: float, gen: torch.Generator, n: int,
                    m: int, num_extremes: int) -> PsiSpectrum:
    """Step 3 of the module docstring: the head rows of a pivoted Cholesky factorisation of G bound the rank from
    below, a randomised bound on the remainder of the other rows (:func:`_remainder_bound`) from above."""
    import scipy.linalg as sl

    sigma_max = float(top.values[0])
    margin = RANK_MARGIN * tol  # a rank decision needs the singular values this far from the tolerance
    k = b.shape[0]
    # head rows of a pivoted Cholesky factorisation, remainder of the others
    pivoted, piv, rank, info = sl.lapack.dpstrf(gram.numpy().T, lower=1, tol=PIVOT_TOL * float(gram.diagonal().max()))
    if info < 0 or rank < 2:
        return _exact_spectrum(b, n, m, num_extremes)
    order = torch.from_numpy(piv.astype(np.int64) - 1)
    for _ in range(HEAD_TRIMS + 1):
        head, tail = order[:rank], order[rank:]
        # the leading block's factor is the head's Gram factor; contiguous, else every triangular solve copies it
        head_factor = torch.from_numpy(pivoted)[:rank, :rank].contiguous()
        # only a lower bound of σ_min(B_head) matters here (rank >= head): a loose relative certificate will do
        bottom = _bottom_singular(b, head_factor, head, 1, sigma_max, gen, rtol=0.5, deficient_below=margin)
        if bottom is None:
            return _exact_spectrum(b, n, m, num_extremes)
        if float(bottom.values[0] - bottom.errors[0]) > margin:
            break
        # the last pivots took rows of G's rounding into the head: as many as its singular values below the margin
        spurious = bottom.below(margin, sigma_max)
        if not 0 < spurious <= rank - 2:
            return _exact_spectrum(b, n, m, num_extremes)
        rank -= spurious
    else:
        return _exact_spectrum(b, n, m, num_extremes)
    if len(tail) == 0:  # full rank after all: σ_min is reported, so it needs the full certificate
        if not bottom.certified(1):
            return _exact_spectrum(b, n, m, num_extremes)
        return PsiSpectrum(top.values[:count], bottom.values[:count].flip(0), k, tol, n, m, "gram", None,
                           float(top.errors[0]), float(bottom.errors[0]))
    bound = _remainder_bound(b, gram, head_factor, head, tail, sigma_max, float(bottom.values[0] - bottom.errors[0]), gen)
    if bound >= tol:
        return _exact_spectrum(b, n, m, num_extremes)
    return PsiSpectrum(top.values[:count], torch.tensor([bound], dtype=torch.float64), rank, tol, n, m, "gram", None,
                       float(top.errors[0]))


def _exact_spectrum(b: Tensor, n: int, m: int, num_extremes: int) -> PsiSpectrum:
    return _from_singular_values(torch.linalg.svdvals(b), n, m, "svd", num_extremes)
