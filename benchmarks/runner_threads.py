"""The compiled pair runner between torch operations: torch's threads against the runner's (issue 40).

A solve alternates small torch steps with tiles of the pair program. torch's OpenMP workers spin for a while after
each parallel operation; on a machine with as many cores as threads they take those cores from the runner's threads.
This times a tile of the pair program of ``SmallResNet(3, 1, 16, (1, 1))`` (random weights, BatchNorm statistics
randomised, 3×32×32 inputs) right after a torch operation on two threads, three ways, interleaved:

- ``alone``: no torch operation before the tile;
- ``after torch``: a float64 matrix product (or an elementwise op) on torch's two threads just before;
- ``owning the cores``: the same, inside ``PairNetworkColumns.owning_the_cores()`` (torch on one thread there,
  the runner on two), as the analysis runs its solve.

Run ``python benchmarks/runner_threads.py`` (about 1 min); writes ``benchmarks/results/runner_threads.md``.
"""
from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--samples", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=15, help="tiles of each kind (medians reported)")
    parser.add_argument("--output", default=str(HERE / "results" / "runner_threads.md"))
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from pair_floor import randomised

    from lightning_nsv.kernel import PairNetworkColumns, compute_gates, trace
    from lightning_nsv.models.residual import SmallResNet

    torch.set_num_threads(2)
    torch.manual_seed(0)
    net = randomised(SmallResNet(3, 1, 16, (1, 1)))
    x = torch.randn(args.samples, 3, 32, 32)
    graph = trace(net, x[:8])
    columns = PairNetworkColumns(graph, x, compute_gates(graph, x), cache_bytes=0)
    a = torch.randn(2000, 300, dtype=torch.float64)
    b = torch.randn(4_000_000, dtype=torch.float64)
    steps = {"a matrix product": lambda: (a @ a.T).sum(), "an elementwise op": lambda: (b * 2).sum()}
    rng = np.random.default_rng(0)
    shapes = [(args.samples - 10, 15), (15, 15)]
    columns.fused.outer(torch.arange(8), torch.arange(8))  # compile or load the runner
    rows_out = []
    for step_name, step in steps.items():
        for shape in shapes:
            times = {"alone": [], "after torch": [], "owning the cores": []}
            for _ in range(args.repeats):
                rows = torch.from_numpy(rng.permutation(args.samples)[:shape[0]])
                cols = torch.from_numpy(rng.permutation(args.samples)[:shape[1]])
                for kind in times:
                    if kind == "owning the cores":
                        with columns.owning_the_cores():
                            step()
                            start = time.perf_counter()
                            columns.fused.outer(rows, cols)
                    else:
                        if kind == "after torch":
                            step()
                        start = time.perf_counter()
                        columns.fused.outer(rows, cols)
                    times[kind].append((time.perf_counter() - start) / (shape[0] * shape[1]) * 1e6)
            rows_out.append((step_name, shape, {k: float(np.median(v)) for k, v in times.items()}))
    command = "python benchmarks/runner_threads.py" + (" " + " ".join(argv) if argv else "")
    lines = ["# The pair runner between torch operations (`benchmarks/runner_threads.py`)", "",
             f"`{command}` — {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
             f"{platform.machine()}, torch {torch.__version__}, 2 threads on a 2-core machine shared with other "
             "jobs.", "", (__doc__ or "").split("\n\n")[1].replace("\n", " "), "",
             "| torch step before the tile | tile (rows × columns) | alone µs a pair | after torch µs a pair | "
             "owning the cores µs a pair | after torch / owning |", "|---|---|---|---|---|---|"]
    for step_name, shape, t in rows_out:
        lines.append(f"| {step_name} | {shape[0]} × {shape[1]} | {t['alone']:.2f} | {t['after torch']:.2f} | "
                     f"{t['owning the cores']:.2f} | {t['after torch'] / t['owning the cores']:.2f} |")
    text = "\n".join(lines) + "\n"
    Path(args.output).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
