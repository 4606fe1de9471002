"""Whole-network support vectors of a small ResNet at scale (issue 32 item 5; DESIGN.md §2c, §6).

For each m of ``--sizes``, in a fresh process (so that its peak memory is its own): train
``SmallResNet(in_channels=3, num_classes=1, width, blocks)`` with plain torch on the m samples until zero training
error (eval mode, float64: ``y·N(x) > 0`` everywhere; samples still wrong after ``--train-seconds`` are relabelled
by the network's own sign and counted in the report), then time ``whole_network_support_vectors(net, x, y)`` end
to end, with its steps (trace, gates, diagonal, solve) and the process's peak resident memory (``VmHWM`` reset
before the analysis; ``ru_maxrss`` where that is refused) and, on CUDA, torch's allocator peak. Sizes up to
``--dense-max`` also build the dense kernel from the same pair network (all m columns in one call) and solve
``max_margin`` on it: time, and the support set against the on-demand analysis. ``--profile`` adds a cProfile of
the first size's analysis (top functions by own time).

Data: a CIFAR-shaped (3×32×32) two-class stand-in, deterministic (:func:`standin`); with ``--cifar-root``, real
CIFAR-10 frogs (6) against ships (8) from a local torchvision root (``<root>/cifar-10-batches-py``, no download).

Writes ``benchmarks/results/whole_network_scale.json`` and ``.md`` (``--output`` for another stem).
Run ``python benchmarks/whole_network_scale.py --help``; see ``benchmarks/README.md``.
"""
from __future__ import annotations

import argparse
import cProfile
import ctypes
import datetime
import io
import json
import platform
import pstats
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent


# ------------------------------------------------------------------------------------------------------------ data
def cifar(root: str, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` CIFAR-10 training images of frogs (label 0) and ships (label 1), standardised, a seeded draw."""
    from torchvision.datasets import CIFAR10

    data = CIFAR10(root, train=True, download=False)
    targets = np.asarray(data.targets)
    keep = np.flatnonzero(np.isin(targets, (6, 8)))
    if n > len(keep):
        raise SystemExit(f"CIFAR-10 holds {len(keep)} frogs and ships, asked for m = {n}")
    keep = np.random.default_rng(seed).permutation(keep)[:n]
    x = torch.from_numpy(data.data[keep]).permute(0, 3, 1, 2).float() / 255
    x = (x - x.mean((0, 2, 3), keepdim=True)) / x.std((0, 2, 3), keepdim=True)
    return x, torch.from_numpy((targets[keep] == 8).astype(np.int64))


# -------------------------------------------------------------------------------------------------------- training
def train(x: torch.Tensor, y: torch.Tensor, args) -> tuple[torch.nn.Module, dict]:
    """Adam (lr 3e-3, batches of 128, BCE) until the eval-mode network has zero error on every sample; what is
    still wrong after ``--train-seconds`` is relabelled by the network's own sign (counted)."""
    from lightning_nsv.models.residual import SmallResNet

    torch.manual_seed(args.seed)
    net = SmallResNet(3, 1, args.width, tuple(args.blocks))
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    start, epochs, errors = time.perf_counter(), 0, len(y)
    while errors and time.perf_counter() - start < args.train_seconds:
        net.train()
        for batch in torch.randperm(len(x)).split(128):
            opt.zero_grad()
            F.binary_cross_entropy_with_logits(net(x[batch]), y[batch].float()).backward()
            opt.step()
        epochs += 1
        errors = int((_signs(net, x) != y).sum())
    net.eval()
    relabelled = int((_signs(net, x) != y).sum())
    y = _signs(net, x)
    return net, {"epochs": epochs, "train_s": time.perf_counter() - start, "relabelled": relabelled, "labels": y}


def epoch_seconds(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int = 2) -> float:
    """The fastest of ``epochs`` float32 training epochs of a copy of ``net`` over ``x`` (Adam, batches of 128,
    forward, backward and step: the unit the analysis is measured in)."""
    import copy

    net = copy.deepcopy(net).float().train()
    opt = torch.optim.Adam(net.parameters(), lr=1e-4)
    best = float("inf")
    for _ in range(epochs):
        start = time.perf_counter()
        for batch in torch.randperm(len(x)).split(128):
            opt.zero_grad()
            F.binary_cross_entropy_with_logits(net(x[batch]), y[batch].float()).backward()
            opt.step()
        best = min(best, time.perf_counter() - start)
    return best


def floor_us(net: torch.nn.Module, x: torch.Tensor, threads: int) -> tuple[float, dict]:
    """The floor of a pair (``benchmarks/pair_floor.py``: operations by kind × this machine's rates), µs on
    ``threads`` threads, and the operation counts."""
    sys.path.insert(0, str(HERE))
    from pair_floor import KINDS, counts, rates

    from lightning_nsv.kernel import trace
    from lightning_nsv.kernel.fused import pair_program

    ops = counts(pair_program(trace(net, x[:8])))
    rate = rates(repeats=3)
    return sum(ops[k] * rate[k] for k in KINDS) / 1e3 / threads, ops


def _signs(net: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Labels 1 where the float64 eval-mode output is > 0, else 0 (``N = 0`` is wrong for either label)."""
    net.eval()
    with torch.no_grad():
        out = torch.cat([net.double()(c.double()) for c in x.split(512)])
    net.float()
    return (out > 0).long()


# ----------------------------------------------------------------------------------------------------- one size
def _count_pairs(engine: str = "auto") -> list:
    """The analysis's :class:`PairNetworkColumns`, collected as it makes them (their ``pairs_evaluated``), on
    ``engine`` (``"reference"``: the torch factored pair network the compiled program replaced)."""
    import lightning_nsv.analysis.whole_network as whole
    from lightning_nsv.kernel import PairNetworkColumns

    made = []

    class Counted(PairNetworkColumns):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "engine": engine})
            made.append(self)

    whole.PairNetworkColumns = Counted
    return made


def _reset_peak() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _peak_mib(field: str = "VmHWM") -> float:
    """The process's peak resident memory (``VmRSS``: the current one), MiB."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def one_size(args) -> dict:
    """Train, analyse and (small m) compare with the dense kernel, in this process; the record of the size."""
    from lightning_nsv.analysis.whole_network import whole_network_support_vectors
    from lightning_nsv.datamodules.standin import frogs_ships_standin
    from lightning_nsv.kernel import PairNetworkColumns, compute_gates, trace
    from lightning_nsv.solver import max_margin

    torch.set_num_threads(args.threads)
    m = args.child
    x, y = cifar(args.cifar_root, m, args.seed) if args.cifar_root else frogs_ships_standin(m, args.seed)
    device = torch.device(args.device)
    net, trained = train(x, y, args)
    y = trained.pop("labels")
    net, x = net.to(device), x.to(device)
    record = {"m": m, **trained, "device": str(device)}
    _reset_peak()
    record["rss_before_mib"] = _peak_mib("VmRSS")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    made = _count_pairs()
    profiler = cProfile.Profile() if args.profile else None
    start = time.perf_counter()
    if profiler:
        profiler.enable()
    analysis = whole_network_support_vectors(net, x, y, block_bytes=args.block_mib << 20, time_budget=None)
    if profiler:
        profiler.disable()
    record.update(analysis_s=time.perf_counter() - start, peak_rss_mib=_peak_mib(),
                  n_support=len(analysis.svm.support_), margin=float(analysis.svm.margin),
                  margin_ratio=float(analysis.margin_ratio), cosine=float(analysis.cosine), scope=analysis.scope,
                  pairs=sum(c.pairs_evaluated for c in made), threads=torch.get_num_threads(),
                  engine=analysis.kernel_engine)
    if analysis.estimate is not None:
        e = analysis.estimate
        record.update(estimate_pairs=e.pairs, estimate_us=e.seconds_per_pair * 1e6,
                      estimate_s=e.seconds + e.spent_seconds)
    record["epoch_s"] = epoch_seconds(net, x, y)
    record["floor_us"], record["ops"] = floor_us(net, x, torch.get_num_threads())
    if args.reference_max and m <= args.reference_max:  # the torch factored network, same process and data
        made = _count_pairs("reference")
        start = time.perf_counter()
        old = whole_network_support_vectors(net, x, y, block_bytes=args.block_mib << 20, time_budget=None, say=None)
        record.update(reference_s=time.perf_counter() - start, reference_pairs=sum(c.pairs_evaluated for c in made),
                      reference_same_support=sorted(old.svm.support_.tolist()) == sorted(
                          analysis.svm.support_.tolist()),
                      reference_margin_rel_diff=abs(old.svm.margin - analysis.svm.margin) / old.svm.margin)
    if device.type == "cuda":
        record["cuda_peak_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
    if profiler:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.profile)
        record["profile"] = out.getvalue()
    if m <= args.dense_max:
        graph = trace(net, x[:8])
        gates = compute_gates(graph, x)
        start = time.perf_counter()
        provider = PairNetworkColumns(graph, x, gates, memory_bytes=args.block_mib << 20)
        dense = provider.columns(np.arange(m))
        record["dense_kernel_s"] = time.perf_counter() - start
        record["dense_pairs"] = provider.pairs_evaluated
        start = time.perf_counter()
        svm = max_margin(dense, (2 * y - 1).numpy().astype(np.float64), tol=1e-10)
        record["dense_solve_s"] = time.perf_counter() - start
        record["dense_same_support"] = sorted(svm.support_.tolist()) == sorted(analysis.svm.support_.tolist())
        record["dense_margin_rel_diff"] = abs(svm.margin - analysis.svm.margin) / svm.margin
    return record


# ---------------------------------------------------------------------------------------------------------- report
GPU_NOTE = ("Everything after training runs on the module's device (`--device cuda`). There the compiled pair program "
            "runs as torch operations over batches of pairs (engine 'torch', the same instructions as the numba "
            "runner, tested equal on the CPU); the gates, the column cache and the torch solver stay on the device. "
            "Not measured here: no GPU was lent. An estimate from the program's arithmetic (about 45,000 operations "
            "a pair for SmallResNet(16), most of them streaming passes over per-pair maps of 1,024 float64 values) "
            "and an H100's ~3 TB/s: 0.1-0.3 µs a pair, 10-30x these two cores. The command: "
            "`python benchmarks/whole_network_scale.py --device cuda --block-mib 1024 --sizes 2000 10000`.")


def markdown(records: list[dict], args, command: str) -> str:
    data = f"CIFAR-10 frogs vs ships from {args.cifar_root}" if args.cifar_root else (
        "the CIFAR-shaped stand-in of `lightning_nsv.datamodules.standin.frogs_ships_standin()` (3×32×32, two classes: smooth colour noise plus a "
        "green-brown blob, or a blue gradient and a dark bar)")
    lines = [
        "# Whole-network support vectors at scale (`benchmarks/whole_network_scale.py`)",
        "",
        f"`{command}` — {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.machine()}, "
        f"torch {torch.__version__}, {args.threads} torch thread(s) on a 2-core machine shared with other jobs.",
        "",
        f"Data: {data}. Network: `SmallResNet(3, 1, width={args.width}, blocks={tuple(args.blocks)})` trained "
        "with Adam to zero training error (eval mode, float64); `relabelled` counts samples still wrong after "
        f"{args.train_seconds:.0f} s of training, labelled by the network's own sign. `epoch s`: the fastest of two "
        "float32 training epochs of the same network over the same samples (Adam, batches of 128), in the same "
        "process; `floor`: the pair's operations by kind times this machine's rate for each (`pair_floor.py`), "
        "over the threads; `reference`: the same analysis with the torch factored pair network the compiled "
        "program replaced (`engine='reference'`).",
        "",
        "| m | analysis s | epoch s | analysis / epoch | pairs (m²) | µs a pair | floor µs | × floor | "
        "estimate: pairs at most, µs, s | peak RSS MiB (before) | support | reference s (× slower) | same support "
        "| dense kernel s | train s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        if "error" in r:
            lines.append(f"| {r['m']:,} | failed: {r['error']} |" + " |" * 13)
            continue
        squares = lambda k: f"{r[k]:,} ({r[k] / r['m'] ** 2:.2f})" if k in r else "—"  # noqa: E731
        per_pair = 1e6 * r["analysis_s"] / r["pairs"] if r.get("pairs") else float("nan")
        estimate = f"{r['estimate_pairs']:,}, {r['estimate_us']:.2f}, {r['estimate_s']:.0f}" if "estimate_s" in r \
            else "—"
        reference = f"{r['reference_s']:.1f} ({r['reference_s'] / r['analysis_s']:.1f}×)" if "reference_s" in r \
            else "—"
        lines.append(
            f"| {r['m']:,} | {r['analysis_s']:.1f} | {r['epoch_s']:.2f} | {r['analysis_s'] / r['epoch_s']:.1f} | "
            f"{squares('pairs')} | {per_pair:.2f} | {r['floor_us']:.2f} | {per_pair / r['floor_us']:.1f} | "
            f"{estimate} | {r['peak_rss_mib']:.0f} ({r.get('rss_before_mib', float('nan')):.0f}) | {r['n_support']} "
            f"| {reference} | {r.get('reference_same_support', r.get('dense_same_support', '—'))} | "
            f"{r['dense_kernel_s']:.1f} |" if "dense_kernel_s" in r else
            f"| {r['m']:,} | {r['analysis_s']:.1f} | {r['epoch_s']:.2f} | {r['analysis_s'] / r['epoch_s']:.1f} | "
            f"{squares('pairs')} | {per_pair:.2f} | {r['floor_us']:.2f} | {per_pair / r['floor_us']:.1f} | "
            f"{estimate} | {r['peak_rss_mib']:.0f} ({r.get('rss_before_mib', float('nan')):.0f}) | {r['n_support']} "
            f"| {reference} | {r.get('reference_same_support', '—')} | — |")
        lines[-1] += f" {r['train_s']:.0f} |"
    lines += ["", f"Scope: {records[0].get('scope', '')}; kernel: {records[0].get('engine', '')}", "",
              "**GPU.** " + GPU_NOTE, ""]
    for r in records:
        if "profile" in r:
            lines += [f"## Profile of the analysis at m = {r['m']:,} (cProfile, own time)", "", "```",
                      r["profile"].strip(), "```", ""]
    return "\n".join(lines)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[2000, 10000], help="training set sizes m")
    p.add_argument("--width", type=int, default=16, help="SmallResNet channels")
    p.add_argument("--blocks", type=int, nargs="+", default=[1, 1], help="residual blocks per stage")
    p.add_argument("--cifar-root", default=None, help="torchvision CIFAR-10 root (no download); else the stand-in")
    p.add_argument("--device", default="cpu", help="where the analysis runs (training runs on the CPU)")
    p.add_argument("--block-mib", type=int, default=128, help="memory of one pair-network block (block_bytes)")
    p.add_argument("--dense-max", type=int, default=500, help="largest m that also builds the dense kernel")
    p.add_argument("--reference-max", type=int, default=0,
                   help="largest m that is also analysed with the torch factored pair network (engine='reference')")
    p.add_argument("--train-seconds", type=float, default=240.0, help="training time limit per size")
    p.add_argument("--profile", type=int, default=0, help="cProfile the first size: print this many functions")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per size (its process is ended after)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", default=str(HERE / "results" / "whole_network_scale"), help="results file stem")
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse(argv)
    if args.child is not None:
        print(json.dumps(one_size(args)))
        return
    records = []
    for k, m in enumerate(args.sizes):
        child = [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]), "--child", str(m)]
        if k:
            child += ["--profile", "0"]
        try:
            done = subprocess.run(child, capture_output=True, text=True, timeout=args.timeout)
            reason = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1][:200]
            record = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else \
                {"m": m, "error": reason}
        except subprocess.TimeoutExpired:
            record = {"m": m, "error": f"over --timeout {args.timeout:.0f} s"}
        records.append(record)
        print({k: v for k, v in record.items() if k != "profile"}, flush=True)
    command = "python benchmarks/whole_network_scale.py " + " ".join(argv if argv is not None else sys.argv[1:])
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output + ".json").write_text(json.dumps({"records": records, "gpu": GPU_NOTE}, indent=1))
    Path(args.output + ".md").write_text(markdown(records, args, command.strip()))


if __name__ == "__main__":
    main()
