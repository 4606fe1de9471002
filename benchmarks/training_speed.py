"""Training speed: a LeakyReLUMLP epoch under the Trainer against a plain PyTorch loop, side by side.

Data: m = 20,000 random MNIST-shaped samples (784 uniform [0, 1] features, labels 1 where the mean of the
first 392 pixels exceeds the mean of the others), generated from ``--seed``; a 5,000-sample held-out set is
split off by the data module and not used (validation is off in every variant). Network 784-16-16-16-1
ReLU with biases, batch 100, SGD lr 0.01 momentum 0.05, logistic loss, ``torch.set_num_threads(1)`` in
every variant (a 16-wide MLP gains nothing from more threads here).

Variants, interleaved epoch by epoch-block so that machine load hits all alike:
  (a) plain loop over in-memory tensors, a fresh ``torch.randperm`` per epoch, batches ``x[idx]``;
  (a2) (a) with batches ``x.index_select(0, idx)``, the data module's slicing;
  (b) ``Trainer.fit`` with the package's data module (a ``ClassificationDataModule`` subclass over the same
      tensors), progress bar on (``refresh_rate=1``, Lightning's default), logger off, no checkpointing;
  (c) (b) with ``NetworkSupportVectors()`` attached (it checks zero training error after every epoch);
  (d) (b) with the progress bar off;
  (e) the Trainer's own floor: (b) with a bare LightningModule (same layers, ``training_step`` returns the loss,
      nothing logged, no label check);
  (f) (b) with ``TQDMProgressBar(refresh_rate=20)``: a Trainer setting, the bar still on;
  (g) (f) with ``LeakyReLUMLP(manual_optimization=True)``, the opt-in manual optimisation (the same updates);
  (h) (f) with 10 optimiser steps per ``training_step`` (``SuperBatchMLP``, defined here: the data module's
      batch is 1,000 samples, cut into the plain loop's 10 batches of 100, so the trajectory is the plain
      loop's; but the Trainer's batch hooks, ``batch_idx`` and ``limit_train_batches`` count super-batches).

Every epoch is timed in wall time and in process CPU time (one thread: less sensitive to other work on shared
cores). ``--breakdown`` adds the per-step time of the parts of one (b) epoch and one plain-loop epoch, timed
in-process by wrapping the Trainer's methods.

Usage::

    flock /tmp/heavy.lock python benchmarks/training_speed.py --rounds 4 --epochs 5 --breakdown
    python benchmarks/training_speed.py --rounds 1 --epochs 3                 # a quick look
"""
from __future__ import annotations

import argparse
import collections
import datetime
import functools
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from lightning_nsv.callbacks import NetworkSupportVectors
from lightning_nsv.compat import PACKAGE, Callback, pl, submodule
from lightning_nsv.datamodules import ClassificationDataModule
from lightning_nsv.models import LeakyReLUMLP

RESULTS = Path(__file__).resolve().parent / "results" / "training_speed.md"
MODEL = dict(in_features=784, widths=[16, 16, 16], beta=0.0, gamma=1.0, bias=True, optimizer="sgd", lr=0.01,
             momentum=0.05)
BATCH = 100
SUPER = 10  # optimiser steps per training_step in variant (h)
BREAKDOWN_EPOCHS = 6


def random_mnist(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, 28, 28, generator=g)
    flat = x.flatten(1)
    y = (flat[:, :392].mean(1) > flat[:, 392:].mean(1)).long()
    return x, y


class RandomMNISTDataModule(ClassificationDataModule):
    """The benchmark's tensors through the package's data-module logic (split, subset, loaders)."""

    is_image = True
    input_shape = (1, 28, 28)

    def __init__(self, n_samples: int = 25_000, **kwargs) -> None:
        super().__init__(**kwargs)
        self.n_samples = n_samples

    def _load(self):
        return *random_mnist(self.n_samples, self.seed), None


class EpochTimer(Callback):
    """Wall and CPU time from one training epoch's start to the next (the last epoch ends at ``on_train_end``)."""

    def __init__(self) -> None:
        self.starts: list[tuple[float, float]] = []
        self.end = (0.0, 0.0)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.starts.append((time.perf_counter(), time.process_time()))

    def on_train_end(self, trainer, pl_module) -> None:
        self.end = (time.perf_counter(), time.process_time())

    @property
    def epoch_seconds(self) -> list[tuple[float, float]]:
        return [(b[0] - a[0], b[1] - a[1]) for a, b in zip(self.starts, self.starts[1:] + [self.end])]


def plain_loop(x: torch.Tensor, y: torch.Tensor, epochs: int, seed: int,
               index_select: bool = False) -> list[tuple[float, float]]:
    torch.manual_seed(seed)
    model = LeakyReLUMLP(**MODEL)
    optimizer = model.configure_optimizers()
    times = []
    for _ in range(epochs):
        start = time.perf_counter(), time.process_time()
        for idx in torch.randperm(len(x)).split(BATCH):
            xb, yb = (x.index_select(0, idx), y.index_select(0, idx)) if index_select else (x[idx], y[idx])
            loss = F.binary_cross_entropy_with_logits(model(xb), yb.float())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        times.append((time.perf_counter() - start[0], time.process_time() - start[1]))
    return times


class BareMLP(pl.LightningModule):
    """The layers of ``LeakyReLUMLP`` and its optimiser, nothing else: what the Trainer costs by itself."""

    def __init__(self) -> None:
        super().__init__()
        self.model = LeakyReLUMLP(**MODEL)

    def training_step(self, batch, batch_idx):
        return F.binary_cross_entropy_with_logits(self.model(batch[0]), batch[1].float())

    def configure_optimizers(self):
        return self.model.configure_optimizers()


class SuperBatchMLP(LeakyReLUMLP):
    """``SUPER`` optimiser steps per ``training_step``: a batch of ``SUPER * BATCH`` samples cut into batches of
    ``BATCH``, in order (the batches of batch size ``BATCH`` when the data module's is ``SUPER * BATCH``), under
    manual optimisation. Not in the package: the Trainer's batch hooks, ``batch_idx``, ``limit_train_batches``,
    ``val_check_interval`` and ``every_n_train_steps`` checkpointing then count super-batches."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs, manual_optimization=True)

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        for i, sub in enumerate(zip(batch[0].split(BATCH), batch[1].split(BATCH))):
            loss = self._step(sub, batch_idx * SUPER + i, "train")
            optimizer.zero_grad()
            self.manual_backward(loss)
            optimizer.step()
        return loss.detach()


class TimedNSV(NetworkSupportVectors):
    """``NetworkSupportVectors`` whose end-of-epoch work (the zero-error check before zero error) is timed."""

    seconds: list[float] = []  # every epoch of every run, wall time

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        start = time.perf_counter()
        super().on_train_epoch_end(trainer, pl_module)
        TimedNSV.seconds.append(time.perf_counter() - start)


def trainer_fit(epochs: int, seed: int, n_samples: int, m: int, with_nsv: bool = False, bar: bool = True,
                model: Callable[[], pl.LightningModule] = lambda: LeakyReLUMLP(**MODEL), refresh_rate: int = 1,
                batch_size: int = BATCH, extra: tuple = ()) -> list[tuple[float, float]]:
    torch.manual_seed(seed)
    module = model()
    dm = RandomMNISTDataModule(n_samples=n_samples, m=m, seed=seed, batch_size=batch_size)
    timer = EpochTimer()
    callbacks = [TimedNSV(), timer] if with_nsv else [timer]
    if bar and refresh_rate != 1:
        callbacks.append(submodule("callbacks").TQDMProgressBar(refresh_rate=refresh_rate))
    trainer = pl.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_model_summary=False, enable_progress_bar=bar, limit_val_batches=0,
                         num_sanity_val_steps=0, callbacks=callbacks + list(extra))
    trainer.fit(module, datamodule=dm)
    return timer.epoch_seconds


class _Timers:
    """Accumulated wall time of wrapped methods, by label."""

    def __init__(self) -> None:
        self.seconds: collections.Counter[str] = collections.Counter()
        self._undo: list[tuple[Any, str, Any]] = []

    def wrap(self, owner: Any, name: str, label: str) -> None:
        original = owner.__dict__[name]

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - start

        self._undo.append((owner, name, original))
        setattr(owner, name, timed)

    def restore(self) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()


def breakdown(x: torch.Tensor, y: torch.Tensor, seed: int, n_samples: int, m: int) -> list[str]:
    """Per-step microseconds of the parts of a (b) epoch and a plain-loop epoch: of ``BREAKDOWN_EPOCHS`` epochs
    after a warm-up one, the fastest of each."""
    fetchers = submodule("loops.fetchers")
    automatic = submodule("loops.optimization.automatic")
    strategy = submodule("strategies.strategy").Strategy
    tqdm_bar = submodule("callbacks").TQDMProgressBar
    steps = m // BATCH
    timers = _Timers()
    parts = [
        (submodule("loops.training_epoch_loop")._TrainingEpochLoop, "advance", "whole step"),
        (fetchers._PrefetchDataFetcher, "__next__", "next batch (DataLoader, sampler, dataset slice, fetcher)"),
        (strategy, "batch_to_device", "batch transfer hooks"),
        (automatic._AutomaticOptimization, "run", "automatic optimisation (closure + step)"),
        (strategy, "training_step", "training_step (forward, loss, metric record)"),
        (strategy, "backward", "backward (with its hooks)"),
        (torch.optim.Optimizer, "zero_grad", "zero_grad"),
        (tqdm_bar, "on_train_batch_end", "progress bar (refresh every step)"),
    ]
    for owner, name, label in parts:
        timers.wrap(owner, name, label)
    epochs: list[dict[str, float]] = []

    class EachEpoch(Callback):
        def on_train_epoch_start(self, trainer, pl_module) -> None:
            timers.seconds.clear()

        def on_train_epoch_end(self, trainer, pl_module) -> None:
            epochs.append(dict(timers.seconds))

    try:
        trainer_fit(BREAKDOWN_EPOCHS + 1, seed, n_samples, m, extra=(EachEpoch(),))
    finally:
        timers.restore()
    # the fastest epoch after the first: the one least disturbed by other work on the machine
    trainer_parts = min(epochs[1:], key=lambda parts: parts["whole step"])
    # the plain loop, timed part by part
    torch.manual_seed(seed)
    model = LeakyReLUMLP(**MODEL)
    optimizer = model.configure_optimizers()
    plain_epochs: list[collections.Counter[str]] = []
    for epoch in range(BREAKDOWN_EPOCHS + 1):
        plain: collections.Counter[str] = collections.Counter()
        t0 = time.perf_counter()
        for idx in torch.randperm(len(x)).split(BATCH):
            t1 = time.perf_counter()
            xb, yb = x[idx], y[idx]
            t2 = time.perf_counter()
            loss = F.binary_cross_entropy_with_logits(model(xb), yb.float())
            t3 = time.perf_counter()
            optimizer.zero_grad()
            t4 = time.perf_counter()
            loss.backward()
            t5 = time.perf_counter()
            optimizer.step()
            t6 = time.perf_counter()
            for label, a, b in (("slice", t1, t2), ("forward + loss", t2, t3), ("zero_grad", t3, t4),
                                ("backward", t4, t5), ("optimizer.step", t5, t6)):
                plain[label] += b - a
        plain["whole step"] = time.perf_counter() - t0
        plain_epochs.append(plain)
    plain = min(plain_epochs[1:], key=lambda parts: parts["whole step"])
    us = lambda seconds: f"{1e6 * seconds / steps:.0f}"  # noqa: E731
    step = trainer_parts["whole step"]
    closure = trainer_parts["automatic optimisation (closure + step)"]
    inner = sum(trainer_parts[k] for k in ("training_step (forward, loss, metric record)", "backward (with its hooks)",
                                           "zero_grad"))
    rest = step - sum(trainer_parts[k] for k in ("next batch (DataLoader, sampler, dataset slice, fetcher)",
                                                 "batch transfer hooks", "automatic optimisation (closure + step)",
                                                 "progress bar (refresh every step)"))
    lines = ["", "## Where a step's time goes (`--breakdown`)", "",
             f"The fastest of {BREAKDOWN_EPOCHS} epochs (after a warm-up one) of (b) and of (a), {steps} steps each; "
             "microseconds per step, wall time, measured in-process by wrapping the Trainer's methods (a wrapper "
             "costs about 1 µs).", "",
             "| part of a (b) step | µs / step |", "|---|---:|"]
    for label in ("next batch (DataLoader, sampler, dataset slice, fetcher)", "batch transfer hooks",
                  "automatic optimisation (closure + step)", "training_step (forward, loss, metric record)",
                  "backward (with its hooks)", "zero_grad"):
        prefix = "&nbsp;&nbsp;of which " if label in ("training_step (forward, loss, metric record)",
                                                      "backward (with its hooks)", "zero_grad") else ""
        lines.append(f"| {prefix}{label} | {us(trainer_parts[label])} |")
    lines += [f"| &nbsp;&nbsp;of which optimizer.step and the closure's own bookkeeping | {us(closure - inner)} |",
              f"| progress bar (refresh every step) | {us(trainer_parts['progress bar (refresh every step)'])} |",
              f"| the loop's own hooks and bookkeeping (the rest) | {us(rest)} |",
              f"| **whole step** | **{us(step)}** |", "", "| part of a plain-loop (a) step | µs / step |", "|---|---:|"]
    for label in ("slice", "forward + loss", "zero_grad", "backward", "optimizer.step"):
        lines.append(f"| {label} | {us(plain[label])} |")
    lines.append(f"| **whole step** | **{us(plain['whole step'])}** |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each runs every variant once")
    parser.add_argument("--epochs", type=int, default=6, help="epochs per variant and round")
    parser.add_argument("--m", type=int, default=20_000, help="training samples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--breakdown", action="store_true", help="also time the parts of a step")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    n_samples = args.m + args.m // 4  # val_fraction 0.2 leaves exactly m in the pool
    dm = RandomMNISTDataModule(n_samples=n_samples, m=args.m, seed=args.seed)
    dm.setup("fit")
    x, y = dm.train_dataset.tensors
    load = os.getloadavg()[0]
    started = time.perf_counter()
    fit = functools.partial(trainer_fit, seed=args.seed, n_samples=n_samples, m=args.m)
    variants = {
        "plain": ("(a) plain loop, in-memory tensors, randperm per epoch, `x[idx]`",
                  lambda e: plain_loop(x, y, e, args.seed)),
        "plain isel": ("(a2) (a) with `x.index_select(0, idx)`", lambda e: plain_loop(x, y, e, args.seed, True)),
        "trainer": ("(b) Trainer + data module, progress bar on", lambda e: fit(e)),
        "trainer+nsv": ("(c) (b) + NetworkSupportVectors()", lambda e: fit(e, with_nsv=True)),
        "no bar": ("(d) (b), progress bar off", lambda e: fit(e, bar=False)),
        "bare": ("(e) (b) with a bare LightningModule (the Trainer's floor)", lambda e: fit(e, model=BareMLP)),
        "rr20": ("(f) (b) with `TQDMProgressBar(refresh_rate=20)`", lambda e: fit(e, refresh_rate=20)),
        "manual": ("(g) (f) with `LeakyReLUMLP(manual_optimization=True)` (opt-in)",
                   lambda e: fit(e, refresh_rate=20, model=lambda: LeakyReLUMLP(**MODEL, manual_optimization=True))),
        "super": (f"(h) {SUPER} optimiser steps per `training_step` (benchmark-only `SuperBatchMLP`), bar refreshed "
                  "every 20 steps as in (f)",
                  lambda e: fit(e, refresh_rate=2, model=lambda: SuperBatchMLP(**MODEL), batch_size=SUPER * BATCH)),
    }
    times: dict[str, list[tuple[float, float]]] = {key: [] for key in variants}
    for _ in range(args.rounds):
        for key, (_, run) in variants.items():
            # the first epoch of each run warms up (allocations, Lightning's setup): left out of the medians
            times[key] += run(args.epochs + 1)[1:]
    wall = {k: [t[0] for t in v] for k, v in times.items()}
    cpu = {k: [t[1] for t in v] for k, v in times.items()}
    med = lambda d, k: statistics.median(d[k])  # noqa: E731
    lines = [
        "# Training speed: Trainer against a plain PyTorch loop",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}",
        f"- command: `{' '.join(['python', f'benchmarks/{Path(__file__).name}', *(sys.argv[1:] if argv is None else argv)])}`",
        f"- machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; Python "
        f"{platform.python_version()}, torch {torch.__version__}, {PACKAGE} {pl.__version__}; "
        f"torch threads 1 in every variant; load average (1 min) at start {load:.1f}, at end {os.getloadavg()[0]:.1f}",
        f"- data: m = {args.m:,} random MNIST-shaped samples (784 features uniform in [0, 1], binary labels from "
        "the pixels), in memory; validation off",
        f"- network: 784-16-16-16-1 ReLU with biases, SGD lr 0.01 momentum 0.05, batch {BATCH} "
        f"({args.m // BATCH} steps per epoch), logistic loss",
        f"- {args.rounds} rounds x {args.epochs} timed epochs per variant, interleaved (the first epoch of each "
        f"run is warm-up and not counted); total wall time {time.perf_counter() - started:.0f} s",
        "",
        "| variant | wall s / epoch, median | min | CPU s / epoch, median | min | ratio to (a): wall medians | "
        "wall minima | CPU medians | CPU minima |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key in variants:
        lines.append(
            f"| {variants[key][0]} | {med(wall, key):.3f} | {min(wall[key]):.3f} | {med(cpu, key):.3f} | "
            f"{min(cpu[key]):.3f} | {med(wall, key) / med(wall, 'plain'):.2f} | "
            f"{min(wall[key]) / min(wall['plain']):.2f} | {med(cpu, key) / med(cpu, 'plain'):.2f} | "
            f"{min(cpu[key]) / min(cpu['plain']):.2f} |")
    nsv = [100 * (f(d['trainer+nsv']) / f(d['trainer']) - 1) for d in (wall, cpu) for f in (statistics.median, min)]
    check = statistics.median(TimedNSV.seconds)
    lines += ["", f"The callback's zero-error check before zero error, timed inside (c): median {1e3 * check:.1f} ms per "
              f"epoch, max {1e3 * max(TimedNSV.seconds):.1f} ms, {100 * check / med(wall, 'trainer+nsv'):.1f}% of (c)'s "
              f"median epoch. (c) against (b) from the epoch times: {nsv[0]:.1f}% (wall medians), {nsv[1]:.1f}% (wall "
              f"minima), {nsv[2]:.1f}% (CPU medians), {nsv[3]:.1f}% (CPU minima): the cores are shared with other work "
              "(CPU time, one thread, moves with the load as wall time does), so minima are the less noisy figures."]
    if args.breakdown:
        lines += breakdown(x, y, args.seed, n_samples, args.m)
    report = "\n".join(lines) + "\n"
    print(report)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    if args.output.exists():
        # keep a hand-written reading below the generated part
        old = args.output.read_text()
        marker = "\n## Reading"
        if marker in old:
            report += old[old.index(marker):]
    args.output.write_text(report)


if __name__ == "__main__":
    main()
