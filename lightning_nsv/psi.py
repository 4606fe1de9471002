"""Ψ of a skip network: its extreme singular values and numerical rank (DESIGN §3), torch and scipy only.

A skip network wires M hidden units to the outputs, ``G = Ψ V`` with ``Ψ`` the N×M matrix of those units'
post-activation values on the N training samples (no bias column, never centred). Lemma 3.2 / Theorem 3.4
of Nguyen, Mukkamala & Hein (2019) need ``rank Ψ = N``. The rank is the float64 numerical rank with the
tolerance ``σ_max · max(N, M) · eps`` of ``torch.linalg.matrix_rank``.

- :func:`psi_spectrum`: σ_min, σ_max, rank and condition number; ``spectrum="fast"`` (default) without a full
  SVD (Gram matrix, Cholesky, block Krylov, Rayleigh–Ritz with Ψ itself, certified, SVD fallback),
  ``spectrum="full"`` by ``torch.linalg.svdvals``.
- :func:`psi_spectrum_streaming`: the same for a Ψ produced in row blocks, under a memory limit (R factor).
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch
from torch import Tensor

from lightning_nsv.errors import NonFiniteError

EPS64 = torch.finfo(torch.float64).eps
SPECTRA = ("fast", "full")
#: Up to this many rows (of the smaller side) a full SVD is cheap (0.1 s for 400×10,000) and the fast route takes it.
SMALL_SIDE = 512
#: The fast route trusts a rank decision only with singular values at least this factor from the tolerance.
RANK_MARGIN = 10.0
#: Largest certified relative error of σ_min and σ_max on the fast route (else it works on or falls back).
CERT_RTOL = 1e-4
#: Largest certified relative error of the other smallest values it reports (``bottom``, drawn in the figure).
EXTREMES_RTOL = 1e-2
#: Block sizes of the Krylov spaces for the smallest and the largest singular values.
BOTTOM_BLOCK, TOP_BLOCK = 32, 16
#: Krylov blocks at most, blocks between two looks at the Ritz pairs, Ritz vectors beyond the reported ones that go
#: to the exact Rayleigh–Ritz step, and the operator's relative residual at which that step is tried.
KRYLOV_MAX_STEPS, KRYLOV_CHECK, KRYLOV_EXTRA, KRYLOV_PRECHECK = 60, 6, 24, 1e-5
#: Exact Rayleigh–Ritz attempts before the Krylov route gives up (each costs about ``4·N·M·d`` flops for a
#: d-dimensional space, so a certificate that does not come within a few is better left to the exact route).
KRYLOV_TRIES = 3
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
#: The fast route works on Ψ scaled by a power of two (exact) when max |Ψ| lies outside ``2^±UNSCALED_EXPONENT``:
#: its residual Gram matrices hold σ⁴, which overflow or underflow far from 1.
UNSCALED_EXPONENT = 32
#: The rounding of a Ritz value formed with B itself (``W = Bᵀ X``), in units of ``eps·σ_max``.
RITZ_ROUNDING = 8


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
        from lightning_nsv.ticks import unicode_log_ticks  # matplotlib only where a figure is drawn

        unicode_log_ticks(ax.yaxis)
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
    - ``spectrum="fast"``: no SVD of Ψ. The Gram matrix ``G = B Bᵀ`` (``p·k²`` flops, matrix-matrix), then:

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

      What is assumed, as by any Krylov eigensolver: the Krylov space started from a random block holds every
      singular value between the reported ones and the gap used (convergence is checked, not proven). Memory:
      Ψ plus two or three k×k float64, and a copy of Ψ scaled by a power of two when max |Ψ| lies outside
      ``2^±UNSCALED_EXPONENT``. ``sigma_min_error`` and ``sigma_max_error`` hold the certified bounds.

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
    if spectrum not in SPECTRA:
        raise ValueError(f"`spectrum` can be {', '.join(SPECTRA)}, got {spectrum!r}")
    if num_extremes < 1:
        raise ValueError(f"`num_extremes` must be >= 1, got {num_extremes}")
    psi = as_matrix64(psi, "psi")
    n, m = psi.shape
    largest = check_finite(psi, "psi")
    with blas_threads(torch_threads):
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


def _times_columns(a: Tensor, v: Tensor) -> Tensor:
    """``a @ v`` for a large ``a`` and a few columns ``v``, formed as ``(vᵀ aᵀ)ᵀ``: the same product, which the
    BLAS ran 2–3.5× faster in that form (a short, wide left factor) at every size measured (10,000² by 8–48
    columns, MKL on one thread: 0.17 s against 0.52 s for 16 columns)."""
    return (v.T @ a.T).T


def _solve_lower(factor: Tensor) -> Callable[[Tensor], Tensor]:
    """``x -> (L Lᵀ)⁻¹ x`` for a lower Cholesky factor (two block triangular solves, BLAS3)."""
    def solve(x: Tensor) -> Tensor:
        y = torch.linalg.solve_triangular(factor, x, upper=False)
        return torch.linalg.solve_triangular(factor.mT, y, upper=True)
    return solve


def _orthonormal(x: Tensor, against: Tensor | None = None) -> Tensor:
    """Orthonormal columns spanning ``x`` minus its part in ``span(against)`` (orthonormal): two passes of block
    Gram–Schmidt, a QR, and one more pass and QR, so that a nearly dependent block stays orthogonal."""
    for _ in range(2):
        if against is not None:
            for _ in range(2):
                x = x - _times_columns(against, _times_columns(against.T, x))
        x = torch.linalg.qr(x).Q
    return x


@dataclass(frozen=True)
class _Ritz:
    """Ritz values ``values`` of B on a subspace, with ``errors``: each value is within its error of a singular
    value of B. ``vectors``: the left Ritz vectors (rows of B, orthonormal columns)."""

    values: Tensor
    errors: Tensor
    vectors: Tensor

    def certified(self, count: int, rtol: float = CERT_RTOL) -> bool:
        return bool((self.errors[:count] <= rtol * self.values[:count]).all())

    def extremes_certified(self, count: int, rtol: float) -> bool:
        """The first value within ``rtol``, the first ``count`` within :data:`EXTREMES_RTOL` (or ``rtol``)."""
        return self.certified(1, rtol) and self.certified(count, max(rtol, EXTREMES_RTOL))

    def below(self, threshold: float, sigma_max: float) -> int:
        """How many Ritz values lie below ``threshold`` by more than their rounding: upper bounds (interlacing) of
        as many smallest singular values, which then lie below it too."""
        return int((self.values + RITZ_ROUNDING * EPS64 * sigma_max < threshold).sum())


class _TransposedProducts:
    """``Bᵀ x`` (B's ``rows`` only, if given) for a Krylov basis that only ever gains columns: the columns seen
    before are not multiplied again (each exact step of a growing space would otherwise repeat them all)."""

    def __init__(self, b: Tensor, rows: Tensor | None) -> None:
        self.b, self.rows = b, rows
        self.basis: Tensor | None = None
        self.products: Tensor | None = None
        self.ritz: tuple[Tensor, Tensor, Tensor, Tensor] | None = None

    def _of(self, x: Tensor) -> Tensor:
        full = x if self.rows is None else torch.zeros(self.b.shape[0], x.shape[1], dtype=x.dtype).index_copy_(
            0, self.rows, x)
        return _times_columns(self.b.T, full)

    def __call__(self, x: Tensor) -> Tensor:
        done = 0 if self.basis is None else self.basis.shape[1]
        if done and (done > x.shape[1] or not torch.equal(x[:, :done], self.basis)):
            done = 0  # not the same basis grown: start again
        new = self._of(x[:, done:])
        self.products = new if not done else torch.cat([self.products, new], 1)
        self.basis, self.ritz = x, None
        return self.products

    def rayleigh_ritz(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``X`` (orthonormal, ``span(x)``) and the SVD ``Y, μ, Zᵀ`` of ``W = Bᵀ X = (Bᵀ x) R⁻¹``; the last answer
        again for the same ``x`` (a wider window of the same space)."""
        if self.basis is not x or self.ritz is None:
            images = self(x)
            q, r = torch.linalg.qr(x)
            w = torch.linalg.solve_triangular(r, images, upper=True, left=False)
            self.ritz = (q, *torch.linalg.svd(w, full_matrices=False))  # μ descending
        return self.ritz


def _exact_ritz(b: Tensor, x: Tensor, rows: Tensor | None, sigma_max: float, smallest: bool, count: int,
                estimates: Tensor, half_solve: Callable[[Tensor], Tensor] | None = None,
                keep: int | None = None, products: _TransposedProducts | None = None) -> _Ritz:
    """Rayleigh–Ritz with the exact B (or its ``rows``) on ``span(x)``, certified by exact residuals.

    ``W = Bᵀ X`` (X orthonormal) has the Ritz values μ as singular values, ``W = Y diag(μ) Zᵀ``; with ``u = X z``,
    ``Bᵀ u = μ y`` holds exactly and ``r = B y − μ u`` gives ``‖B Bᵀ u − μ² u‖ = μ ‖r‖``. So

    - some singular value of B lies within ``‖r‖`` of μ (linear bound, always valid);
    - each value is within ``μ ‖r‖² / δ`` of a singular value, δ the gap (in σ²) to its neighbours (Kato–Temple);
    - the ``j`` Ritz values nearest the end of the spectrum are within ``‖R_j‖₂² / δ_j`` (in σ²) of ``j``
      eigenvalues of ``B Bᵀ``, ``R_j`` their block residual and ``δ_j`` the gap to the rest of the spectrum
      (quadratic residual bound for a cluster, Mathias 1998 / Li & Li 2005). ``δ_j`` is taken from the next Ritz
      value and ``estimates`` (the Krylov operator's eigenvalue estimates of σ², same order): this assumes that the
      subspace holds every singular value up to there, the assumption of any Krylov eigensolver.

    - smallest values, with ``half_solve`` (``x -> L⁻¹ x``, L the Cholesky factor of the computed Gram matrix
      ``G̃ = L Lᵀ``): for the first j Ritz values μ_1 <= ... <= μ_j and ``β <= σ_{j+1}²``,
      ``0 <= μ_i² − σ_i² <= (β / (β − μ_j²))² · Σ_{i<=j} ‖S_i‖²_{A⁻¹}`` for every i <= j, with ``A = B Bᵀ`` and
      ``S_i = μ_i r_i`` its residuals (the error of the trace of the Ritz values is a sum over the eigenvectors
      outside the first j of ``‖D_f‖² (λ_f − λ_1)``, and ``‖D_f‖ <= ‖(S)_f‖ / (λ_f − μ_j²)``). The ``A⁻¹``-norm
      weighs each residual component by ``1/λ_f``: the rounding a floating-point Ritz vector carries along the
      large singular directions, which makes ``‖r‖`` about ``eps·κ²·μ``, hardly counts, so this bound stays near
      ``eps²κ²`` where the others give ``(eps·κ²)²/gap``. ``‖S‖²_{A⁻¹} <= (1 + η)‖L⁻¹ S‖²`` with η the
      Gram matrix's relative error, estimated as 3 times the largest disagreement between the Krylov estimates
      (from G̃) and the exact Ritz values of the window (at least 1e-6; the bound is not used beyond η = 0.1;
      a window over a cluster may reach pairs that have not converged, which only makes η larger).

    ``x`` may span the whole Krylov space while residuals are formed for the ``keep`` extreme Ritz pairs only: the
    residuals are then orthogonal to the whole space, which holds the neighbours beyond the window, so their
    weighted norms stay small. ``products`` keeps ``Bᵀ x`` of the columns of an earlier call
    whose ``x`` this one extends, and the decomposition of W for the same ``x``.

    The error of each value is the smallest of these bounds (the best window ``j`` that holds it), at least
    ``RITZ_ROUNDING·eps·σ_max`` (the rounding of ``Bᵀ X``)."""
    x, left, mu, right_t = (products or _TransposedProducts(b, rows)).rayleigh_ritz(x)  # W = Bᵀ X = Y diag(μ) Zᵀ
    keep = len(mu) if keep is None else min(keep, len(mu))
    pick = slice(len(mu) - keep, None) if smallest else slice(0, keep)  # residuals of the extreme ones only
    left, mu, right_t = left[:, pick], mu[pick], right_t[pick]
    u = _times_columns(x, right_t.T)
    by = _times_columns(b, left)
    res = (by if rows is None else by[rows]) - u * mu  # r_i = B y_i − μ_i u_i
    if smallest:
        mu, res, u = mu.flip(0), res.flip(1), u.flip(1)
    resid = torch.linalg.vector_norm(res, dim=0)
    lam = mu**2
    est = estimates[:len(mu)]
    # neighbours' σ² on either side (the next Ritz value or the Krylov estimate, whichever is nearer)
    nxt = torch.minimum(lam, est) if smallest else torch.maximum(lam, est)
    outward = 1.0 if smallest else -1.0  # the sign of (next value − this one), away from the end of the spectrum
    c = len(mu)
    scaled = res * mu  # block residual R of B Bᵀ: columns μ_i r_i
    gram_r = scaled.T @ scaled
    window = torch.full((c,), math.inf, dtype=torch.float64)  # window[j]: bound for the first j + 1 values
    for j in range(1, c):  # window: the first j values; the next one bounds the gap
        gap = outward * (float(nxt[j]) - float(lam[j - 1]))  # <= 0 (no bound) for a neighbour out of order
        norm2 = float(torch.linalg.eigvalsh(gram_r[:j, :j])[-1].clamp_min(0))  # ‖R_j‖₂²
        if gap > 2 * math.sqrt(norm2):
            window[j - 1] = norm2 / gap
    best = window.flip(0).cummin(0).values.flip(0)  # value i: the best window that holds it
    errors = torch.minimum(resid, best / mu.clamp_min(1e-300))
    if half_solve is not None and smallest and c > 1:
        eta = 3 * float(((est[:c] - lam) / lam.clamp_min(1e-300)).abs().max())
        eta = max(eta, 1e-6)
        if eta <= 0.1:
            weighted = torch.cumsum(lam * torch.linalg.vector_norm(half_solve(res), dim=0) ** 2 * (1 + eta), 0)
            energy = torch.full((c,), math.inf, dtype=torch.float64)
            for j in range(1, c):
                beta = float(nxt[j]) * (1 - eta)
                if beta > float(lam[j - 1]):
                    energy[j - 1] = (beta / (beta - float(lam[j - 1]))) ** 2 * float(weighted[j - 1])
            energy = energy.flip(0).cummin(0).values.flip(0)  # σ² error of value i: best window holding it
            low = (lam - energy).clamp_min(0).sqrt()
            errors = torch.minimum(errors, mu - low)
    for i in range(min(count, c - 1)):  # one value at a time (Kato–Temple), gap to both neighbours
        gap = outward * (float(nxt[i + 1]) - float(lam[i]))
        if i > 0:
            gap = min(gap, abs(float(lam[i]) - float(lam[i - 1])))
        if gap > 2 * float(mu[i] * resid[i]):
            errors[i] = min(float(errors[i]), float(mu[i] * resid[i] ** 2 / gap))
    errors = errors.clamp_min(RITZ_ROUNDING * EPS64 * sigma_max)
    return _Ritz(mu, errors, u)


def _krylov_largest(apply: Callable[[Tensor], Tensor], dim: int, block: int, count: int,
                    accept: Callable[[Tensor, Tensor], _Ritz | None], gen: torch.Generator,
                    whole_space: bool = True) -> _Ritz | None:
    """Block Krylov (block Lanczos with full reorthogonalisation) for the largest eigenpairs of the symmetric
    positive operator ``apply`` on R^dim. Every ``KRYLOV_CHECK`` blocks the Ritz pairs of the Krylov space are
    formed; once the ``count`` largest have relative residual below ``KRYLOV_PRECHECK`` the space (``whole_space``)
    or only those Ritz vectors and ``KRYLOV_EXTRA`` more, with the eigenvalue estimates, go to ``accept`` (the exact
    certificate), whose answer, when not None, is returned. None when the space is exhausted, ``KRYLOV_MAX_STEPS``
    blocks are spent or ``KRYLOV_TRIES`` certificates failed."""
    block = min(block, dim)
    q = _orthonormal(torch.randn(dim, block, generator=gen, dtype=torch.float64))
    basis, images, tries = [q], [], 0
    for step in range(1, KRYLOV_MAX_STEPS + 1):
        images.append(apply(basis[-1]))
        size = sum(v.shape[1] for v in basis)
        last = size >= dim or step == KRYLOV_MAX_STEPS
        if step % KRYLOV_CHECK == 0 or last:
            qs, zs = torch.cat(basis, 1), torch.cat(images, 1)
            t = qs.T @ zs
            theta, s = torch.linalg.eigh((t + t.T) / 2)
            everything = theta.flip(0)
            keep = min(size, count + KRYLOV_EXTRA)
            s = s[:, -keep:].flip(1)
            theta = theta[-keep:].flip(0)
            x = _times_columns(qs, s)
            rel = torch.linalg.vector_norm(_times_columns(zs, s) - x * theta, dim=0) / theta.abs().clamp_min(1e-300)
            worst = float(rel[:count].max())
            if worst <= KRYLOV_PRECHECK or last:
                found = accept(qs if whole_space else x, everything)  # Rayleigh–Ritz with B on that space
                if found is not None:
                    return found
                tries += 1
                if last or tries >= KRYLOV_TRIES:
                    return None
        if last:
            return None
        basis.append(_orthonormal(images[-1][:, :dim - size], torch.cat(basis, 1)))  # the last block fills R^dim
    return None


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
    import scipy.linalg as sl

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
    # rank-revealing: head rows of a pivoted Cholesky factorisation, remainder of the others
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
