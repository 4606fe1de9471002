"""Exact multi-class network support vectors at scale (DESIGN.md §2b, issue 10 item 3).

A 784-16-16-16-10 ReLU MLP without biases is trained with cross-entropy (plain torch, Adam) until every training
sample is classified correctly (``N_y(x) − N_k(x) > 0`` for all k ≠ y, float64, weights frozen); then
``multiclass_support_vectors(method="exact")`` analyses it end to end (validation included). Reported: wall and
CPU time, the process's peak resident set size during the analysis, support samples and pairs, and the KKT
residual recomputed over all ``m(K − 1)`` pairs from fresh kernel columns of the support (independent of the
solver). ``--check-m`` also solves the first samples with the generic pair-column mode and compares.

Data: MNIST digits from ``--mnist-root`` (torchvision's local files, ``<root>/MNIST/raw``; nothing is downloaded)
or the MNIST-shaped stand-in of ``benchmarks/nsv_scale.py`` with its digit labels 0-9.

    flock /tmp/heavy.lock python benchmarks/multiclass_scale.py --cache-dir /tmp/nsv_cache \
        --output benchmarks/results/multiclass_scale.md
"""
from __future__ import annotations

import argparse
import datetime
import math
import os
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nsv_scale import PeakRSS, digits_standin, gib, machine  # noqa: E402

from lightning_nsv.analysis import multiclass_support_vectors  # noqa: E402
from lightning_nsv.kernel import PathKernelColumns, PathNetwork, forward_with_slopes  # noqa: E402
from lightning_nsv.solver import multiclass_max_margin  # noqa: E402

WIDTHS = (16, 16, 16)
CLASSES = 10


def load_data(args, n):
    if args.mnist_root:
        from torchvision.datasets import MNIST

        data = MNIST(args.mnist_root, train=True, download=False)
        order = torch.randperm(len(data.targets), generator=torch.Generator().manual_seed(args.seed))[:n]
        return data.data[order].to(torch.float32).div(255).unsqueeze(1), data.targets[order].long()
    return digits_standin(n, args.seed, digit_labels=True)


def make_model() -> nn.Sequential:
    sizes = (784, *WIDTHS)
    layers = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [nn.Linear(a, b, bias=False), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(sizes[-1], CLASSES, bias=False))


def path_network(model: nn.Sequential) -> PathNetwork:
    weights = [layer.weight for layer in model if isinstance(layer, nn.Linear)]
    return PathNetwork.from_tensors(weights, None, (0.0,) * len(WIDTHS), (1.0,) * len(WIDTHS))


def training_errors(model, x_flat, y) -> int:
    with torch.no_grad():
        out, _ = forward_with_slopes(path_network(model), x_flat)
    top = out.gather(1, y[:, None])
    out = out.clone()
    out.scatter_(1, y[:, None], -math.inf)
    return int((out.max(1).values >= top[:, 0]).sum())


def train(x, y, args):
    """Adam (lr ``--lr``), cross-entropy, batch ``--batch-size``, until zero training error (float64 check)."""
    torch.manual_seed(args.seed)
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    x_flat = x.reshape(len(x), -1)
    g = torch.Generator().manual_seed(args.seed)
    start, epoch, errors = time.perf_counter(), 0, len(x)
    while epoch < args.max_epochs and errors:
        epoch += 1
        for batch in torch.randperm(len(x), generator=g).split(args.batch_size):
            loss = F.cross_entropy(model(x_flat[batch]), y[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        errors = training_errors(model, x_flat, y)
        if epoch % 10 == 0:
            print(f"epoch {epoch}: {errors} training errors, {time.perf_counter() - start:.0f} s", flush=True)
    return model, epoch, time.perf_counter() - start, errors


def cached_model(x, y, args):
    source = "mnist" if args.mnist_root else "standin"
    path = Path(args.cache_dir) / f"multiclass_{source}_m{args.m}_seed{args.seed}.pt" if args.cache_dir else None
    if path is not None and path.exists():
        saved = torch.load(path, weights_only=True)
        model = make_model()
        model.load_state_dict(saved["state"])
        return model, int(saved["epochs"]), float(saved["seconds"]), int(saved["errors"]), True
    model, epochs, seconds, errors = train(x, y, args)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"state": model.state_dict(), "epochs": epochs, "seconds": seconds, "errors": errors}, path)
    return model, epochs, seconds, errors, False


def kkt_over_all_pairs(net, x64, y, svm) -> float:
    """``max(max_p (1 − margin_p)_+, max_{α_p>0} |margin_p − 1|)`` with ``f = K[:, S] β_S`` from fresh columns."""
    _, slopes = forward_with_slopes(net, x64)
    columns = PathKernelColumns(x64, slopes, net.betas, net.gammas)
    f = np.zeros((len(y), CLASSES))
    support = svm.support_
    for start in range(0, len(support), 512):
        block = support[start:start + 512]
        f += columns.numpy(block) @ svm.beta_[block]
    margins = f[np.arange(len(y)), y][:, None] - f
    others = np.ones_like(margins, dtype=bool)
    others[np.arange(len(y)), y] = False
    violation = np.clip(1 - margins[others], 0, None).max()
    slack = np.abs(margins[svm.alpha_ > 0] - 1).max(initial=0.0)
    return float(max(violation, slack))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--m", type=int, default=20_000)
    parser.add_argument("--val-size", type=int, default=2_000)
    parser.add_argument("--mnist-root", default=None, help="torchvision MNIST root with local files")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--max-epochs", type=int, default=400)
    parser.add_argument("--train-threads", type=int, default=1)
    parser.add_argument("--check-m", type=int, default=2_000, help="compare with the generic mode on this many (0: skip)")
    parser.add_argument("--cache-dir", default=None, help="save the trained network here and reuse it")
    parser.add_argument("--train-only", action="store_true")
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    load_start = os.getloadavg()[0]
    wall_start = time.perf_counter()

    x_all, y_all = load_data(args, args.m + args.val_size)
    x, y = x_all[: args.m], y_all[: args.m]
    x_val, y_val = x_all[args.m:], y_all[args.m:]
    threads = torch.get_num_threads()
    torch.set_num_threads(args.train_threads)
    model, epochs, train_s, errors, cached = cached_model(x, y, args)
    torch.set_num_threads(threads)
    print(f"trained: {epochs} epochs, {train_s:.0f} s, {errors} errors{' (cached)' if cached else ''}", flush=True)
    if errors or args.train_only:
        return

    net = path_network(model)
    x64 = x.reshape(len(x), -1).to(torch.float64)
    with PeakRSS() as mem:
        wall, cpu = time.perf_counter(), time.process_time()
        analysis = multiclass_support_vectors(net, x64, y, x_val.reshape(len(x_val), -1), y_val, method="exact")
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    svm = analysis.svm
    kkt = kkt_over_all_pairs(net, x64, y.numpy(), svm)
    print(analysis.report(), flush=True)
    print(f"analysis {wall:.1f} s wall, {cpu:.1f} s CPU, peak {gib(mem.peak)} GiB; KKT over all pairs {kkt:.1e}")

    check = None
    if args.check_m:
        n = args.check_m
        _, slopes = forward_with_slopes(net, x64[:n])
        columns = PathKernelColumns(x64[:n], slopes, net.betas, net.gammas)
        diag = np.array([columns.numpy(np.array([i]))[i, 0] for i in range(n)])
        outputs = forward_with_slopes(net, x64[:n])[0].numpy()
        from lightning_nsv.solver import pair_margins

        margins = pair_margins(outputs, y[:n].numpy())
        runs = {}
        for structured in (True, False):
            t = time.perf_counter()
            runs[structured] = (multiclass_max_margin(columns.numpy, y[:n], CLASSES, kernel_diag=diag,
                                                      initial_margins=margins, structured=structured),
                                time.perf_counter() - t)
        (a, ta), (b, tb) = runs[True], runs[False]
        check = dict(n=n, same_support=bool(np.array_equal(a.support_, b.support_)),
                     alpha_diff=float(np.abs(a.alpha_ - b.alpha_).max() / b.alpha_.max()),
                     kkt=(a.kkt_residual, b.kkt_residual), seconds=(ta, tb), s=a.n_support_, pairs=a.n_support_pairs)
        print(f"check m={n}: {check}")

    total = time.perf_counter() - wall_start
    if args.output:
        source = ("MNIST (torchvision local files, training split, random subset)" if args.mnist_root else
                  "**not MNIST** (no MNIST on this machine): the MNIST-shaped stand-in of `benchmarks/nsv_scale.py` "
                  "(`digits_standin`, seed 0) with its digit labels 0-9; validation: the next "
                  f"{args.val_size:,} generated samples")
        counts = np.bincount(y.numpy(), minlength=CLASSES)
        lines = [
            "# Exact multi-class network support vectors at m = {:,}".format(args.m),
            "",
            f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
            f"- command: `{' '.join(shlex.quote(a) for a in ['python', *sys.argv])}`",
            f"- machine: {machine()}",
            f"- data: {source}; class counts {counts.tolist()}",
            f"- network: 784-{'-'.join(map(str, WIDTHS))}-{CLASSES} ReLU, no biases; Adam lr {args.lr}, batch "
            f"{args.batch_size}, cross-entropy, seed {args.seed}; {epochs} epochs ({train_s:.0f} s"
            f"{', loaded from --cache-dir' if cached else ''}) to zero training error (float64 check)",
            f"- load average (1 min) at start {load_start:.1f}, at end {os.getloadavg()[0]:.1f} (shared cores: "
            f"timings are noisy); total wall time of the run {total:.0f} s",
            "",
            "`multiclass_support_vectors(net, x, y, x_val, y_val, method=\"exact\")`, end to end (validation on "
            f"{args.val_size:,} samples included): the pair problem with m(K − 1) = {args.m * (CLASSES - 1):,} "
            "variables in the solver's structured mode (sample kernel columns, DESIGN.md §2b). Peak = the "
            "process's peak resident set size during the analysis (data and network included).",
            "",
            "| wall s | CPU s | peak GiB | support samples | support pairs | KKT (solver) | KKT over all pairs, fresh columns | val agreement |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
            f"| {wall:.1f} | {cpu:.1f} | {gib(mem.peak)} | {svm.n_support_:,} | {svm.n_support_pairs:,} | "
            f"{svm.kkt_residual:.1e} | {kkt:.1e} | {100 * analysis.val_agreement:.2f}% |",
            "",
            f"- support samples per class: {list(svm.n_support_per_class)}; margin 1/||V|| = {svm.margin:.4g}; "
            f"network margin ratio {analysis.margin_ratio:.4f}; cosine(Wc, V) {analysis.cosine:.4f}; "
            f"{svm.iterations} solver iterations",
            "- the generic pair-column mode would keep a column of length m(K − 1) per free pair: "
            f"{8 * args.m * (CLASSES - 1) * svm.n_support_pairs / 2**30:.1f} GiB for the support pairs alone",
        ]
        if check:
            lines.append(
                f"- check on the first {check['n']:,} samples, structured against generic mode: same support "
                f"{check['same_support']}, max |Δα| / max α = {check['alpha_diff']:.1e}, KKT {check['kkt'][0]:.1e} / "
                f"{check['kkt'][1]:.1e}, {check['s']} support samples, {check['pairs']} pairs, "
                f"{check['seconds'][0]:.1f} s / {check['seconds'][1]:.1f} s")
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
