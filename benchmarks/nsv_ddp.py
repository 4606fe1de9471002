"""The support-vector analysis with the kernel columns computed by 1 and by 2 CPU ranks (gloo), side by side.

Same data and network as ``nsv_scale.py`` (the MNIST-shaped stand-in or ``--mnist-root``; the network comes from
its ``--cache-dir`` when present, else it is trained here with the paper's recipe). Variants, timed on rank 0
from the frozen network and data to the fitted result (no validation), each run ``--repeats`` times:

  (a) one process, ``--threads`` torch threads;
  (b) two ranks of one ``torch.distributed`` gloo group, ``--threads-per-rank`` torch threads each: rank 0 runs
      the solver inside ``ColumnSharing``, rank 1 ``serve_kernel_columns`` (every column block computed half by
      each rank and gathered on rank 0).

The support set and α of (b) are compared with (a). On one machine the ranks use the same cores as (a)'s threads.

Usage::

    flock /tmp/heavy.lock python benchmarks/nsv_ddp.py --cache-dir /tmp/nsv_cache
"""
from __future__ import annotations

import argparse
import datetime
import os
import socket
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nsv_scale  # noqa: E402

from lightning_nsv.analysis import network_support_vectors, serve_kernel_columns  # noqa: E402
from lightning_nsv.extract import find_path_part  # noqa: E402
from lightning_nsv.kernel import ColumnSharing  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "nsv_ddp.md"


def _problem(args):
    x_all, y_all = nsv_scale.load_data(args, args.m)
    x, y = x_all[: args.m], y_all[: args.m]
    model, *_ = nsv_scale.cached_model(x, y, args, f"{args.data_key}_m{args.m}_seed{args.seed}")
    return find_path_part(model).path_network(), x, y


def _rank(rank: int, port: int, args, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(args.threads_per_rank)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        net, x, y = _problem(args)
        for _ in range(args.repeats):
            dist.barrier()
            if rank == 0:
                wall, cpu = time.perf_counter(), time.process_time()
                with ColumnSharing() as sharing:
                    svm = network_support_vectors(net, x, y, sharing=sharing).svm
                queue.put(("ranks", time.perf_counter() - wall, time.process_time() - cpu, svm.support_,
                           svm.alpha_, svm.kkt_residual))
            else:
                serve_kernel_columns(net, x)
    finally:
        dist.destroy_process_group()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--m", type=int, default=20_000)
    parser.add_argument("--cache-dir", default=None, help="trained networks of nsv_scale.py (reused when present)")
    parser.add_argument("--mnist-root", default=None)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the one-process run")
    parser.add_argument("--threads-per-rank", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", default=str(RESULTS))
    args = parser.parse_args(argv)
    args.__dict__.update(seed=0, bias=False, lr=0.01, momentum=0.05, batch_size=100, max_epochs=500,
                         max_train_seconds=300.0, train_threads=1, analysis_threads=args.threads,
                         data_key="mnist" if args.mnist_root else "standin")
    load_start = os.getloadavg()[0]
    torch.set_num_threads(args.threads)
    net, x, y = _problem(args)
    single = []
    for _ in range(args.repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        svm = network_support_vectors(net, x, y).svm
        single.append((time.perf_counter() - wall, time.process_time() - cpu))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, args, queue)) for r in range(2)]
    for p in procs:
        p.start()
    ranks = [queue.get(timeout=1800) for _ in range(args.repeats)]
    for p in procs:
        p.join(timeout=120)
    same_support = all(np.array_equal(r[3], svm.support_) for r in ranks)
    alpha_diff = max(float(np.max(np.abs(r[4] - svm.alpha_)) / svm.alpha_.max()) for r in ranks)
    kkt = max(r[5] for r in ranks)
    best = lambda rows, k: min(r[k] for r in rows)  # noqa: E731
    lines = [
        "# Kernel columns by 1 and by 2 CPU ranks",
        "",
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- command: `python benchmarks/nsv_ddp.py {' '.join(argv if argv is not None else sys.argv[1:])}`",
        f"- machine: {nsv_scale.machine()}; load average (1 min) at start {load_start:.1f}, at end "
        f"{os.getloadavg()[0]:.1f}",
        f"- data: {'MNIST' if args.mnist_root else 'the MNIST-shaped stand-in of nsv_scale.py'}, m = {args.m:,}; "
        f"network 784-16-16-16-1 ReLU trained to zero error; {svm.n_support_:,} support vectors; no validation",
        f"- {args.repeats} runs of each; best and median wall / CPU seconds (CPU: rank 0's process only)",
        "",
        "| variant | wall s, best | wall s, median | CPU s (rank 0), best |",
        "|---|---:|---:|---:|",
        f"| one process, {args.threads} torch threads | {best(single, 0):.2f} | "
        f"{sorted(r[0] for r in single)[len(single) // 2]:.2f} | {best(single, 1):.2f} |",
        f"| 2 gloo ranks × {args.threads_per_rank} thread, columns shared | {best(ranks, 1):.2f} | "
        f"{sorted(r[1] for r in ranks)[len(ranks) // 2]:.2f} | {best(ranks, 2):.2f} |",
        "",
        f"Same support set as one process: {'yes' if same_support else 'NO'}; largest α difference "
        f"{alpha_diff:.1e} of the largest α; KKT residual {kkt:.1e}.",
        "",
        "Both ranks share the same cores as the one-process run's threads (one machine, no GPU), so this compares "
        "two ways of using the same cores, and shows what splitting and gathering the columns costs; each rank "
        "computes 1/world_size of every column block, so with one device or node per rank the column work divides "
        "by the number of ranks.",
    ]
    Path(args.output).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
