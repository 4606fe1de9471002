"""The floor of one pair of the whole-network path kernel, against what the compiled pair program costs (issue 40).

For each network: trace it, compile its pair program (:mod:`lightning_nsv.kernel.pair_program`) and count the
elementary operations one pair costs, by kind: AND + popcount of one word (``popcount``), one float64 multiply-add
(``fma``), one add of a window sum (``add``), one gathered read (``gather``), other elementwise steps (``other``).
Then measure this machine's rate for each kind in a fused numba loop over data in the L1 cache (one thread,
best of several runs): the floor of a pair is ``Σ count × ns``, over the threads. Last, time the program itself on a
tile of pairs (numba, one and two threads) and the torch factored network it replaces (``engine="reference"``) on
the same tile, in this process: µs a pair, the ratio, and the multiple of the floor.

Networks (random weights, BatchNorm statistics randomised, 3×32×32 inputs): ``SmallResNet(3, 1, 16, (1, 1))`` (issue
40's network) and ``ResNetClassifier`` as the CIFAR config builds it (width 32, blocks [1, 1, 1]).

Run ``python benchmarks/pair_floor.py`` (about 2 min); writes ``benchmarks/results/pair_floor.md`` (``--output``).
"""
from __future__ import annotations

import argparse
import datetime
import platform
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
KINDS = ("popcount", "fma", "add", "gather", "other")


def counts(program) -> dict[str, int]:
    """Elementary operations one pair costs, by kind, from the program's instructions."""
    from lightning_nsv.kernel import pair_code as P

    out = dict.fromkeys(KINDS, 0)
    for row in program.code:
        op, n = int(row[0]), int(row[4])
        if op == P.OVERLAP_TERMS:
            for t in range(int(row[5])):
                out["popcount"] += n * int(program.table[int(row[6]) + 3 * t + 2])
                out["fma"] += n
        elif op == P.OVERLAP_DENSE:
            out["fma"] += n * (int(row[7]) + 1)
        elif op == P.BOX:
            out["add"] += int(row[4]) * int(row[7]) * int(row[6]) * int(row[8])
        elif op == P.GATHER:
            out["gather"] += n
        elif op == P.SPMV:
            ptr = int(row[5])
            out["gather"] += int(program.table[ptr + n] - program.table[ptr])
        else:
            out["other"] += n
    return out


def rates(repeats: int = 7) -> dict[str, float]:
    """ns per operation of each kind in a fused numba loop over 1,024 positions held in the L1 cache."""
    from numba import njit

    from lightning_nsv.kernel.pair_engines import _popcount

    @njit(cache=True)
    def popcount_loop(d, m, a, b, reps):
        for _ in range(reps):
            for p in range(len(d)):
                d[p] += m[p] * _popcount(a[p] & b[p])

    @njit(cache=True)
    def fma_loop(d, a, b, reps):
        for _ in range(reps):
            for p in range(len(d)):
                d[p] += a[p] * b[p]

    @njit(cache=True)
    def add_loop(d, a, reps):
        n = len(d) - 2
        for _ in range(reps):
            for p in range(n):
                d[p] = a[p] + a[p + 1] + a[p + 2]

    @njit(cache=True)
    def gather_loop(d, a, index, reps):
        for _ in range(reps):
            for p in range(len(d)):
                d[p] = a[index[p]]

    @njit(cache=True)
    def other_loop(d, a, reps):
        for _ in range(reps):
            for p in range(len(d)):
                d[p] = a[p] + 1.0

    n, reps = 1024, 20000
    rng = np.random.default_rng(0)
    d, a, b, m = (rng.random(n + 2) for _ in range(4))
    words_a, words_b = (rng.integers(0, 2 ** 16, n).astype(np.uint16) for _ in range(2))
    index = rng.permutation(n).astype(np.int64)
    loops = {"popcount": lambda r: popcount_loop(d[:n], m, words_a, words_b, r),
             "fma": lambda r: fma_loop(d[:n], a, b, r), "add": lambda r: add_loop(d, a, r),
             "gather": lambda r: gather_loop(d[:n], a, index, r), "other": lambda r: other_loop(d[:n], a, r)}
    out = {}
    for kind, loop in loops.items():
        loop(1)
        best = min(_seconds(lambda: loop(reps)) for _ in range(repeats))
        out[kind] = best / (reps * n) * 1e9 / (2 if kind == "add" else 1)  # the add loop adds twice a position
    return out


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def networks(names):
    from lightning_nsv.models.residual import SmallResNet

    made = {"SmallResNet(3, 1, 16, (1, 1))": lambda: SmallResNet(3, 1, 16, (1, 1)),
            "ResNetClassifier CIFAR config (width 32, blocks [1, 1, 1])": lambda: SmallResNet(3, 1, 32, (1, 1, 1))}
    return {name: make for name, make in made.items() if not names or any(n in name for n in names)}


def randomised(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    for layer in module.modules():
        if isinstance(layer, torch.nn.modules.batchnorm._BatchNorm):
            layer.running_mean.copy_(0.1 * torch.randn(layer.num_features, generator=gen))
            layer.running_var.copy_(torch.rand(layer.num_features, generator=gen) + 0.5)
    return module.eval()


def measure(name: str, make, args, rate: dict[str, float]) -> dict:
    from lightning_nsv.kernel import PairNetworkColumns, compute_gates, trace
    from lightning_nsv.kernel.fused import fuse

    torch.manual_seed(args.seed)
    module = randomised(make(), args.seed)
    x = torch.randn(args.rows, 3, 32, 32, generator=torch.Generator().manual_seed(args.seed))
    graph = trace(module, x[:8])
    gates = compute_gates(graph, x)
    fused = fuse(graph, x, gates, engine="numba")
    ops = counts(fused.program)
    floor_ns = sum(ops[k] * rate[k] for k in KINDS)
    rows, cols = torch.arange(args.rows), torch.arange(args.cols)
    fused.outer(rows[:8], cols[:8])  # compile or load the runner
    record = {"network": name, "program": fused.program.describe(), "ops": ops, "floor_us_1": floor_ns / 1e3,
              "factor_kib": fused.nbytes / len(x) / 1024}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        record[f"fused_us_{threads}"] = min(_seconds(lambda: fused.outer(rows, cols)) for _ in range(3)) / (
            args.rows * args.cols) * 1e6
    reference = PairNetworkColumns(graph, x, gates, engine="reference", cache_bytes=0)
    torch.set_num_threads(2)
    first = fused.outer(rows, cols)
    start = time.perf_counter()
    second = reference._tiles(rows, cols)
    record["reference_us_2"] = (time.perf_counter() - start) / (args.rows * args.cols) * 1e6
    record["max_rel_diff"] = float((first - second).abs().max() / second.abs().max())
    return record


def markdown(records: list[dict], rate: dict[str, float], args, command: str) -> str:
    lines = [
        "# The floor of a pair, and the compiled pair program (`benchmarks/pair_floor.py`)", "",
        f"`{command}` — {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.machine()}, "
        f"torch {torch.__version__}, a 2-core machine shared with other jobs.", "",
        "This machine's rate for each kind of elementary operation, in a fused numba loop over 1,024 positions in "
        "the L1 cache (one thread, best of 7):", "",
        "| kind | what | ns an operation |", "|---|---|---|",
        f"| popcount | `d[p] += m[p] · popcount(a[p] & b[p])`, 16-bit words | {rate['popcount']:.3f} |",
        f"| fma | `d[p] += a[p] · b[p]` | {rate['fma']:.3f} |",
        f"| add | `d[p] = a[p] + a[p+1] + a[p+2]`, a 3-tap window sum, per add | {rate['add']:.3f} |",
        f"| gather | `d[p] = a[index[p]]` | {rate['gather']:.3f} |",
        f"| other | `d[p] = a[p] + 1` | {rate['other']:.3f} |", "",
        f"Pairs: a tile of {args.rows} rows × {args.cols} columns of random 3×32×32 inputs (random weights, "
        "BatchNorm statistics randomised). `floor`: Σ operations × ns, one thread (two threads: half). "
        "`reference`: the torch factored pair network it replaces (`engine=\"reference\"`), two threads.", "",
        "| network | popcount | fma | add | gather | other | floor µs (1 thread / 2) | fused µs (1 / 2 threads) | "
        "× floor (2 threads) | reference µs (2 threads) | reference / fused | factors KiB a sample | "
        "max rel. diff |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        o = r["ops"]
        lines.append(
            f"| {r['network']} | {o['popcount']:,} | {o['fma']:,} | {o['add']:,} | {o['gather']:,} | "
            f"{o['other']:,} | {r['floor_us_1']:.2f} / {r['floor_us_1'] / 2:.2f} | {r['fused_us_1']:.2f} / "
            f"{r['fused_us_2']:.2f} | {r['fused_us_2'] / (r['floor_us_1'] / 2):.1f} | {r['reference_us_2']:.1f} | "
            f"{r['reference_us_2'] / r['fused_us_2']:.1f} | {r['factor_kib']:.1f} | {r['max_rel_diff']:.1e} |")
    lines += ["", "Programs:", ""] + [f"- {r['network']}: {r['program']}" for r in records] + [""]
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=400, help="rows of the timed tile")
    p.add_argument("--cols", type=int, default=48, help="columns of the timed tile")
    p.add_argument("--networks", nargs="*", default=[], help="substrings of the network names to run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", default=str(HERE / "results" / "pair_floor.md"))
    args = p.parse_args(argv)
    rate = rates()
    records = []
    for name, make in networks(args.networks).items():
        records.append(measure(name, make, args, rate))
        print(records[-1], flush=True)
    command = "python benchmarks/pair_floor.py " + " ".join(argv if argv is not None else [])
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(markdown(records, rate, args, command.strip()))


if __name__ == "__main__":
    main()
