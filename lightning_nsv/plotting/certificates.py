"""Figures of a skip network's certificates (DESIGN §3): Ψ's singular values with the rank tolerance, the loss along
the escape path of Theorem 3.4, and a filter-normalised slice of the loss surface. The result classes of
:mod:`lightning_nsv.analysis` draw themselves through these (``result.plot(ax)``)."""
from __future__ import annotations

from typing import Any

import torch

from lightning_nsv.plotting.base import LEGEND_SIZE, plot_axes
from lightning_nsv.ticks import unicode_log_ticks


def plot_psi_spectrum(spectrum: Any, ax: Any = None) -> tuple[Any, Any]:
    """Singular values of a :class:`~lightning_nsv.analysis.PsiSpectrum` (all, or the top-k and bottom-k) on a log
    scale with the tolerance; ``(fig, ax)``."""
    fig, ax = plot_axes(ax)
    k = min(spectrum.num_samples, spectrum.num_units)
    floor = spectrum.tolerance * 1e-3
    if spectrum.singular_values is not None:
        s = spectrum.singular_values.clamp_min(floor).numpy()
        ax.semilogy(range(1, len(s) + 1), s, ".-", ms=3, lw=0.8, label="singular values")
    else:
        top, bottom = spectrum.top.clamp_min(floor).numpy(), spectrum.bottom.clamp_min(floor).numpy()
        ax.semilogy(range(1, len(top) + 1), top, "o-", ms=3, lw=0.8, label=f"largest {len(top)}")
        ax.semilogy(range(k - len(bottom) + 1, k + 1), bottom, "s-", ms=3, lw=0.8, label=f"smallest {len(bottom)}")
    unicode_log_ticks(ax.yaxis)
    ax.axhline(spectrum.tolerance, color="C3", ls="--", lw=0.8, label="rank tolerance")
    ax.axvline(spectrum.num_samples, color="C7", ls=":", lw=0.8, label="N")
    ax.set(xlabel="index i (descending order)", ylabel="singular value σᵢ of Ψ",
           title=f"Ψ: N={spectrum.num_samples}, M={spectrum.num_units}, rank={spectrum.rank}, "
                 f"κ={spectrum.condition_number:.2e} ({spectrum.method})")
    ax.legend(fontsize=LEGEND_SIZE)
    return fig, ax


def plot_escape_path(path: Any, ax: Any = None) -> tuple[Any, Any]:
    """Loss along the segment of an :class:`~lightning_nsv.analysis.EscapePath`, the current loss and ε/2;
    ``(fig, ax)``."""
    fig, ax = plot_axes(ax)
    ax.plot(path.lambdas.numpy(), path.losses.numpy(), "-", label="Φ(U, V(λ))")
    ax.axhline(path.start_loss, color="C1", ls="--", lw=0.8, label="current loss")
    ax.axhline(path.eps / 2, color="C2", ls=":", lw=0.8, label="ε/2")
    ax.set_yscale("log")
    unicode_log_ticks(ax.yaxis)
    status = "" if path.applies else f" (does not apply: residual {path.residual:.1e})"
    ax.set(xlabel="λ", ylabel="mean cross-entropy", title=f"escape path to V*{status}")
    ax.legend(fontsize=LEGEND_SIZE)
    return fig, ax


def plot_loss_surface(surface: Any, ax: Any = None) -> tuple[Any, Any]:
    """Filled contour of ``log10`` of a :class:`~lightning_nsv.analysis.LossSurface`, the current weights marked;
    ``(fig, ax)``."""
    fig, ax = plot_axes(ax)
    a, b = torch.meshgrid(surface.t1, surface.t2, indexing="ij")
    cs = ax.contourf(a.numpy(), b.numpy(), surface.losses.clamp_min(1e-12).log10().numpy(), levels=20)
    fig.colorbar(cs, ax=ax, label="log10 mean cross-entropy")
    ax.plot([0], [0], "w*", ms=8, label="current weights")
    ax.set(xlabel="step along direction 1 (t₁)", ylabel="step along direction 2 (t₂)",
           title="loss surface, filter-normalised slice")
    ax.legend(fontsize=LEGEND_SIZE, loc="upper right")
    return fig, ax
