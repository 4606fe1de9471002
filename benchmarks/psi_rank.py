"""Time Ψ and its rank at N = M = 10,000: PsiRankMonitor's routes against torch's direct SVD / matrix_rank.

Routes, all in float64 on the CPU:

- ``psi``: computing Ψ (N×M) with ``SkipNetwork.psi`` over the inputs in batches;
- ``svd``: :func:`lightning_nsv.valley.psi_spectrum` (``torch.linalg.svdvals``), the route below the memory limit;
- ``matrix_rank``: ``torch.linalg.matrix_rank(Ψ)``, the baseline (same tolerance, also an SVD);
- ``streaming``: the route :func:`lightning_nsv.valley.psi_spectrum_streaming` takes above its memory limit
  when M <= N: the R factor of Ψ updated over batches of rows (Ψ never held whole; forward passes included)
  and its singular values. At N = M it holds as much as Ψ itself; it saves memory when N and M differ.

Usage::

    python benchmarks/psi_rank.py                  # N = M = 10,000 (about 2.4 GB peak)
    python benchmarks/psi_rank.py --n 2000 --m 2000
"""
from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import torch

from lightning_nsv.models.skip import SkipNetwork
from lightning_nsv.valley import psi_spectrum, r_factor


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10_000, help="training samples N")
    parser.add_argument("--m", type=int, default=10_000, help="skip units M <= N (10 hidden layers share them)")
    parser.add_argument("--activation", default="softplus")
    parser.add_argument("--out", default="benchmarks/results/psi_rank.txt")
    args = parser.parse_args()
    if args.m > args.n:
        parser.error(f"--m must be at most --n (the ΨᵀΨ route), got {args.m} > {args.n}")
    width = -(-args.m // 10)
    model = SkipNetwork.mlp(64, [width] * 10, 10, args.activation, num_skip_units=args.m - width, skip_seed=0)
    x = torch.randn(args.n, 64, generator=torch.Generator().manual_seed(0))
    torch.linalg.svdvals(torch.randn(200, 200, dtype=torch.float64))  # warm up LAPACK
    psi, t_psi = timed(lambda: model.psi(x, batch_size=1000))
    spec, t_svd = timed(lambda: psi_spectrum(psi))
    rank, t_rank = timed(lambda: int(torch.linalg.matrix_rank(psi)))
    del psi
    sv, t_stream = timed(lambda: torch.linalg.svdvals(r_factor(model.iter_psi(x, batch_size=1000), model.num_units)))
    stream_rank = int((sv > spec.tolerance).sum())  # psi_spectrum_streaming's rule: σ_max · max(N, M) · eps
    diff = float((sv - spec.singular_values).abs().max()) / spec.sigma_max
    lines = [
        f"Ψ rank benchmark: N={args.n}, M={model.num_units}, {args.activation} MLP 64-{width}x10-10, float64, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"load average {os.getloadavg()[0]:.1f} at the end",
        f"compute Ψ (SkipNetwork.psi)           {t_psi:8.1f} s",
        f"psi_spectrum (svdvals)                {t_svd:8.1f} s   rank {spec.rank}, σ_max {spec.sigma_max:.4g}, "
        f"σ_min {spec.sigma_min:.3g}",
        f"torch.linalg.matrix_rank (baseline)   {t_rank:8.1f} s   rank {rank}",
        f"streaming QR route (incl. forward)    {t_stream:8.1f} s   rank {stream_rank}, holds about "
        f"{16 * model.num_units ** 2 / 2**20:.0f} MiB (R + buffer) where Ψ takes "
        f"{8 * args.n * model.num_units / 2**20:.0f}",
        f"largest difference of the singular values, streaming vs SVD, relative to σ_max: {diff:.2e}",
    ]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
