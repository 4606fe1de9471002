"""Rayleigh–Ritz with Ψ itself and its residual certificates, on a block Krylov space (DESIGN §3, the fast route of
:func:`~lightning_nsv.analysis.psi.psi_spectrum`; the steps that use these: :mod:`~lightning_nsv.analysis.psi_fast`).

- :func:`_krylov_largest`: block Lanczos with full reorthogonalisation for the largest eigenpairs of a symmetric
  positive operator (the Gram matrix, or its inverse through a Cholesky factor).
- :func:`_exact_ritz`: the Ritz values of B on that space, computed with B itself, each with a certified bound
  (linear, Kato–Temple, cluster and ``A⁻¹``-weighted residual bounds).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from lightning_nsv.analysis.psi_result import EPS64

#: Largest certified relative error of σ_min and σ_max on the fast route (else it works on or falls back).
CERT_RTOL = 1e-4
#: Largest certified relative error of the other smallest values it reports (``bottom``, drawn in the figure).
EXTREMES_RTOL = 1e-2
#: Krylov blocks at most, blocks between two looks at the Ritz pairs, Ritz vectors beyond the reported ones that go
#: to the exact Rayleigh–Ritz step, and the operator's relative residual at which that step is tried.
KRYLOV_MAX_STEPS, KRYLOV_CHECK, KRYLOV_EXTRA, KRYLOV_PRECHECK = 60, 6, 24, 1e-5
#: Exact Rayleigh–Ritz attempts before the Krylov route gives up (each costs about ``4·N·M·d`` flops for a
#: d-dimensional space, so a certificate that does not come within a few is better left to the exact route).
KRYLOV_TRIES = 3
#: The rounding of a Ritz value formed with B itself (``W = Bᵀ X``), in units of ``eps·σ_max``.
RITZ_ROUNDING = 8


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
    errors = torch.minimum(resid, _cluster_bounds(res, mu, lam, nxt, outward))
    if half_solve is not None and smallest and c > 1:
        weighted = _weighted_bounds(res, mu, lam, est, nxt, half_solve)
        if weighted is not None:
            errors = torch.minimum(errors, weighted)
    _kato_temple(errors, mu, resid, lam, nxt, outward, count)
    errors = errors.clamp_min(RITZ_ROUNDING * EPS64 * sigma_max)
    return _Ritz(mu, errors, u)


def _cluster_bounds(res: Tensor, mu: Tensor, lam: Tensor, nxt: Tensor, outward: float) -> Tensor:
    """Quadratic residual bound for a cluster (Mathias 1998 / Li & Li 2005; DESIGN §3, the fast route): the first
    j Ritz values are within ``‖R_j‖₂² / δ_j`` (in σ²) of j eigenvalues of ``B Bᵀ``; value i takes the best window
    that holds it. Returned in σ (divided by μ)."""
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
    return best / mu.clamp_min(1e-300)


def _weighted_bounds(res: Tensor, mu: Tensor, lam: Tensor, est: Tensor, nxt: Tensor,
                     half_solve: Callable[[Tensor], Tensor]) -> Tensor | None:
    """The ``A⁻¹``-weighted bound of the smallest values (DESIGN §3, the fast route; derived in
    :func:`_exact_ritz`): ``μ_i − sqrt(μ_i² − (β / (β − μ_j²))² · Σ_{i<=j} ‖S_i‖²_{A⁻¹})`` for the best window j; None
    when the Gram matrix's estimated relative error η exceeds 0.1."""
    c = len(mu)
    eta = 3 * float(((est[:c] - lam) / lam.clamp_min(1e-300)).abs().max())
    eta = max(eta, 1e-6)
    if eta > 0.1:
        return None
    weighted = torch.cumsum(lam * torch.linalg.vector_norm(half_solve(res), dim=0) ** 2 * (1 + eta), 0)
    energy = torch.full((c,), math.inf, dtype=torch.float64)
    for j in range(1, c):
        beta = float(nxt[j]) * (1 - eta)
        if beta > float(lam[j - 1]):
            energy[j - 1] = (beta / (beta - float(lam[j - 1]))) ** 2 * float(weighted[j - 1])
    energy = energy.flip(0).cummin(0).values.flip(0)  # σ² error of value i: best window holding it
    low = (lam - energy).clamp_min(0).sqrt()
    return mu - low


def _kato_temple(errors: Tensor, mu: Tensor, resid: Tensor, lam: Tensor, nxt: Tensor, outward: float,
                 count: int) -> None:
    """Kato–Temple (DESIGN §3, the fast route): value i is within ``μ ‖r‖² / δ`` of a singular value, δ its gap (in
    σ²) to both neighbours; lowers ``errors`` in place where that is tighter, for the first ``count`` values."""
    for i in range(min(count, len(mu) - 1)):  # one value at a time, gap to both neighbours
        gap = outward * (float(nxt[i + 1]) - float(lam[i]))
        if i > 0:
            gap = min(gap, abs(float(lam[i]) - float(lam[i - 1])))
        if gap > 2 * float(mu[i] * resid[i]):
            errors[i] = min(float(errors[i]), float(mu[i] * resid[i] ** 2 / gap))


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
