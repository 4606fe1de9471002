"""Time σ_min, σ_max, rank and condition number of Ψ: the fast route of :func:`lightning_nsv.analysis.psi_spectrum`
against a full float64 SVD (``torch.linalg.svdvals``) of the same matrix, in the same run.

Cases (float64, CPU):

- ``full rank``, ``rank-deficient``, ``near-deficient``: N×M matrices ``U diag(s) Vᵀ`` with a known spectrum
  (:func:`lightning_nsv.analysis.matrix_with_singular_values`, random orthogonal U, V from signs, permutations and
  DCTs): s log-spaced 1 .. 1e-6; 70 % of s log-spaced 1 .. 1e-4 and the rest 0; 99 % log-spaced 1 .. 1e-3 and
  1 % at 1e-8 (a gap, above the tolerance);
- ``skip-rand``: Ψ (N×400) of a random, frozen softplus ``SkipNetwork`` (mode ``skip_rand``) on N Gaussian
  inputs; its spectrum is the SVD's.

σ_min rel err is against the known σ_min (the SVD's for skip-rand); where σ_min is 0 both routes report a value
below the tolerance, shown instead (the fast route's is its bound on σ_rank+1). "certified σ_min bound": the fast
route's own bound on its σ_min error, relative. σ_max rel err likewise. "rank equal": the fast route's rank equals
the known rank and the SVD's.

Usage::

    python benchmarks/psi_rank.py                     # N = 10,000, M = 12,000 (about 5 GB peak)
    python benchmarks/psi_rank.py --n 2000 --m 2400 --out /tmp/psi_rank.md
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch

from lightning_nsv.analysis import matrix_with_singular_values, psi_spectrum
from lightning_nsv.analysis.psi_result import EPS64
from lightning_nsv.models.skip import SkipNetwork


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def known_spectra(k: int) -> dict[str, np.ndarray]:
    r, gap = int(0.7 * k), k // 100
    return {
        "full rank": np.logspace(0, -6, k),
        "rank-deficient": np.concatenate([np.logspace(0, -4, r), np.zeros(k - r)]),
        "near-deficient": np.concatenate([np.logspace(0, -3, k - gap), np.full(gap, 1e-8)]),
    }


def skip_rand_psi(n: int, m: int) -> torch.Tensor:
    width = m // 4
    model = SkipNetwork.mlp(64, [width] * 4, 10, "softplus", num_skip_units=m - width, mode="skip_rand", skip_seed=0)
    x = torch.randn(n, 64, generator=torch.Generator().manual_seed(0))
    return model.psi(x, batch_size=2000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10_000, help="rows N of the known-spectrum cases")
    parser.add_argument("--m", type=int, default=12_000, help="columns M of the known-spectrum cases")
    parser.add_argument("--skip-units", type=int, default=400, help="M of the skip-rand case (N rows)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a loaded machine)")
    parser.add_argument("--out", default="benchmarks/results/psi_rank.md")
    names = [*known_spectra(2), "skip-rand"]
    parser.add_argument("--cases", nargs="+", default=names, choices=names, metavar="CASE",
                        help=f"cases to run (default: all of {', '.join(names)})")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.linalg.svdvals(torch.randn(200, 200, dtype=torch.float64))  # warm up LAPACK
    rows = []
    cases = [(name, s, (args.n, args.m)) for name, s in known_spectra(min(args.n, args.m)).items()]
    cases.append(("skip-rand", None, (args.n, args.skip_units)))
    cases = [case for case in cases if case[0] in args.cases]
    for name, s, (n, m) in cases:
        psi = skip_rand_psi(n, m) if s is None else matrix_with_singular_values(s, n, m, seed=0)
        exact, t_svd = timed(lambda: torch.linalg.svdvals(psi))
        svd_rank = int((exact > exact[0] * max(n, m) * EPS64).sum())
        fast, t_fast = timed(lambda: psi_spectrum(psi))
        truth = exact.numpy() if s is None else s
        known_rank = int((truth > truth[0] * max(n, m) * EPS64).sum())
        for method, seconds, rank, smin, smax, bound in (
                ("full SVD (svdvals)", t_svd, svd_rank, float(exact[-1]), float(exact[0]), None),
                (f"fast ({fast.method})", t_fast, fast.rank, fast.sigma_min, fast.sigma_max, fast.sigma_min_error)):
            err = (f"{abs(smin - truth[-1]) / truth[-1]:.1e}" if truth[-1] > 0
                   else f"σ_min {smin:.1e} < tol {fast.tolerance:.1e}")
            cert = "" if bound is None else f"{bound / smin:.1e}"
            if bound is None and fast.method == "gram" and method.startswith("fast"):
                cert = "bound on σ_rank+1 (probabilistic)"
            rows.append((name, f"{n}×{m}", method, f"{seconds:.1f}", err, cert,
                         f"{abs(smax - truth[0]) / truth[0]:.1e}",
                         "yes" if rank == known_rank == svd_rank else f"no ({rank} vs {known_rank})"))
        rows.append((name, "", "speed-up", f"{t_svd / t_fast:.1f}×", "", "", "", ""))
        print(*rows[-3:], sep="\n", flush=True)
        del psi, exact
    lines = [
        "# Ψ rank: fast route vs full SVD",
        "",
        f"- date: {datetime.date.today().isoformat()}",
        f"- machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"{args.threads} torch thread(s), load average {os.getloadavg()[0]:.1f} at the end",
        f"- command: `flock /tmp/heavy.lock python benchmarks/psi_rank.py --n {args.n} --m {args.m} "
        f"--skip-units {args.skip_units} --threads {args.threads}"
        + ("" if args.cases == names else " --cases " + " ".join(f"'{c}'" for c in args.cases)) + "`",
        "",
        "| case | shape | method | wall s | σ_min rel err | certified σ_min bound (rel) | σ_max rel err | rank equal |",
        "|---|---|---|---|---|---|---|---|",
        *("| " + " | ".join(r) + " |" for r in rows),
    ]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
