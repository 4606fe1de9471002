"""Nguyen, Mukkamala & Hein (ICLR 2019), central finding: a deep sigmoid network that SGD cannot fit reaches
zero training error once M >= N of its hidden units are wired straight to the output; and where Ψ has rank N,
the loss landscape has no bad local valley (Theorem 3.4), which the escape-path certificate checks.

Two cases, each trained in three modes on a subset of the bundled digits (10 classes):

- ``deep`` (default N = 400, 8 hidden sigmoid layers of 64 units, N skip units): the paper's finding, where the
  theory's condition *fails*: deep sigmoid layers at their initialisation vary so little across samples that
  Ψ is numerically rank-deficient (rank < N although M >= N), so the escape-path certificate does not apply
  (its least-squares V* has a residual and an enormous norm);
- ``full_rank`` (default N = 150, 2 hidden sigmoid layers of 128 units, all 128 units of the first layer
  wired to the output as well: M = 256 >= N): Ψ has rank N with σ_min far above the rank tolerance, and the
  escape-path certificate *holds*: ``Ψ V* = Y t*`` is solved exactly and the loss along the segment from the
  current output weights to V* stays in the sublevel set of the current loss: no bad valley.

The modes:

- ``original``: the network as it is, trained with SGD;
- ``skip_rand``: the last hidden layer plus the case's skip units drawn with the seed from the lower layers feed
  the output; the hidden weights U stay at their random initialisation and only V is trained. The problem is
  convex in V; it is solved with full-batch L-BFGS (``--rand-optimizer sgd`` trains it like the paper, with
  SGD, which needs thousands of epochs here);
- ``skip_sgd``: the same skip network with U and V trained by SGD.

Writes to ``--out``: ``skip_networks.csv`` (one row per case and mode: train and test accuracy, the loss, rank
of Ψ, σ_min, the Lemma 2.1 and escape-path certificates and ‖V*‖), ``skip_networks.png`` (training loss per
epoch and the accuracies, one row of panels per case) and ``tensorboard/<case>-<mode>/`` (training curves, the
``psi/`` and ``valley/`` metrics and figures of :class:`~lightning_nsv.callbacks.psi_rank.PsiRankMonitor` and
:class:`~lightning_nsv.callbacks.loss_valley.LossValleyMonitor`).

Usage::

    python examples/skip_networks.py                                   # both cases, about a minute on 2 CPU cores
    python examples/skip_networks.py --cases full_rank                 # only the case where the theorem holds
    python examples/skip_networks.py --data mnist --data-root data --m 1000 --width 160 --cases deep
"""
from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import torch

from lightning_nsv.callbacks.loss_valley import LossValleyMonitor
from lightning_nsv.callbacks.psi_rank import PsiRankMonitor
from lightning_nsv.compat import pl
from lightning_nsv.datamodules import CIFAR10_CLASSES
from lightning_nsv.plotting.base import LEGEND_SIZE
from lightning_nsv.experiments import make_datamodule, markdown_table, quiet, save_figures, write_csv
from lightning_nsv.models.skip import MODES, SkipNetwork

COLUMNS = {"case": "case", "mode": "mode", "optimizer": "optimizer", "N": "N", "M": "M", "psi_rank": "rank Ψ",
           "psi_sigma_min_text": "σ_min", "train_loss": "train loss", "train_acc": "train acc", "test_acc": "test acc",
           "lemma21": "Lemma 2.1", "escape_verdict": "escape path (Thm 3.4)", "escape_target_norm_text": "‖V*‖",
           "seconds": "s"}
CASES = ("deep", "full_rank")


class Case(NamedTuple):
    """One network and training subset: ``m`` samples, ``depth`` hidden layers of ``width`` units and
    ``skip_units`` units drawn from the layers below the last (None: N)."""

    name: str
    m: int
    depth: int
    width: int
    skip_units: int | None


def cases(args: argparse.Namespace) -> list[Case]:
    """The cases of ``--cases``, from the flags (``--m`` ... for ``deep``, ``--full-rank-*`` for ``full_rank``)."""
    known = {"deep": Case("deep", args.m, args.depth, args.width, args.skip_units),
             "full_rank": Case("full_rank", args.full_rank_m, args.full_rank_depth, args.full_rank_width,
                               args.full_rank_skip_units)}
    return [known[name] for name in args.cases.split(",")]


def escape_verdict(valley: dict[str, float]) -> str:
    """The escape-path certificate in words: it holds when ``Ψ V* = Y t*`` is solved (rank Ψ = N) and the loss
    along the segment stays in the sublevel set of the current loss."""
    if not valley["escape_applies"]:
        return "does not apply"
    return "holds: no bad valley" if valley["escape_in_sublevel_set"] else "fails (rounding?)"


class _LossHistory(pl.Callback):
    """The epoch-mean training loss, for the figure."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.losses.append(float(trainer.callback_metrics["train_loss"]))


@torch.no_grad()
def accuracy(model: SkipNetwork, dataset: Any) -> float:
    """Accuracy of the frozen network on a whole TensorDataset (eval mode, restored)."""
    x, y = dataset.tensors
    training = model.training
    model.eval()
    correct = sum(int((model(xb).argmax(1) == yb).sum()) for xb, yb in zip(x.split(1024), y.split(1024)))
    model.train(training)
    return correct / len(y)


def run_mode(args: argparse.Namespace, case: Case, mode: str) -> tuple[dict[str, Any], list[float]]:
    pl.seed_everything(args.seed, verbose=False)
    lbfgs = mode == "skip_rand" and args.rand_optimizer == "lbfgs"
    extra = {"classes": CIFAR10_CLASSES} if args.data == "cifar" else {}
    dm = make_datamodule(args.data, m=case.m, seed=args.data_seed, root=args.data_root, download=args.download,
                         batch_size=case.m if lbfgs else args.batch_size, task="multiclass", **extra)
    dm.setup("fit")
    n = len(dm.train_dataset)
    model = SkipNetwork.mlp(
        math.prod(dm.input_shape), [case.width] * case.depth, dm.num_classes, args.activation,
        num_skip_units=0 if mode == "original" else (n if case.skip_units is None else case.skip_units), mode=mode,
        skip_seed=args.seed, optimizer="lbfgs" if lbfgs else "sgd", lr=1.0 if lbfgs else args.lr,
        momentum=args.momentum,
    )
    history = _LossHistory()
    callbacks = [history, PsiRankMonitor(every_n_epochs=args.check_every),
                 LossValleyMonitor(every_n_epochs=args.check_every, surface_points=args.surface_points,
                                   seed=args.seed)]
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        logger=pl.loggers.TensorBoardLogger(args.out, name="tensorboard", version=f"{case.name}-{mode}"),
        callbacks=callbacks, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        check_val_every_n_epoch=args.check_every, num_sanity_val_steps=0, log_every_n_steps=1,
        accelerator="cpu", deterministic=True,
    )
    start = time.perf_counter()
    trainer.fit(model, dm.train_dataloader(), dm.val_dataloader())  # loaders: the model's and data's seeds differ
    psi, valley = callbacks[1].last_metrics, callbacks[2].last_metrics
    row = {
        "case": case.name, "mode": mode, "optimizer": model.hparams.optimizer, "epochs": args.epochs, "N": n,
        "M": model.num_units, "depth": case.depth, "width": case.width,
        "psi_rank": int(psi["rank"]), "psi_full_rank": int(psi["full_rank"]), "psi_sigma_min": psi["sigma_min"],
        "psi_sigma_max": psi["sigma_max"], "psi_condition_number": psi["condition_number"],
        "train_loss": valley["mean_loss"], "train_acc": accuracy(model, dm.train_dataset),
        "test_acc": accuracy(model, dm.val_dataset), "n_test": len(dm.val_dataset),
        "lemma21": int(valley["lemma21_certified"]), "escape_applies": int(valley["escape_applies"]),
        "escape_in_sublevel_set": int(valley["escape_in_sublevel_set"]), "escape_residual": valley["escape_residual"],
        "escape_start_loss": valley["escape_start_loss"], "escape_max_loss": valley["escape_max_loss"],
        "escape_target_loss": valley["escape_target_loss"], "escape_target_norm": valley["escape_target_norm"],
        "escape_verdict": escape_verdict(valley), "assumption31": int(valley["assumption31_satisfied"]),
        "seed": args.seed, "data_seed": args.data_seed, "seconds": round(time.perf_counter() - start, 1),
    }
    print(f"{case.name} {mode}: train acc {row['train_acc']:.4f}, test acc {row['test_acc']:.4f}, rank Ψ "
          f"{row['psi_rank']} of N = {n} (M = {row['M']}, σ_min {row['psi_sigma_min']:.2g}), escape path "
          f"{row['escape_verdict']} (‖V*‖ {row['escape_target_norm']:.2g}), {row['seconds']} s", flush=True)
    return row, history.losses


def table_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows with σ_min and ‖V*‖ as two-digit text (they span 15 orders of magnitude)."""
    return [{**r, "psi_sigma_min_text": f"{r['psi_sigma_min']:.2g}",
             "escape_target_norm_text": f"{r['escape_target_norm']:.2g}"} for r in rows]


def plot(rows: Sequence[dict[str, Any]], curves: dict[tuple[str, str], list[float]], titles: dict[str, str]) -> Any:
    """One row of panels per case: the training loss per epoch of each mode and the accuracies."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.8 * len(titles)), layout="constrained")
    axes = fig.subplots(len(titles), 2, squeeze=False)
    for (ax_loss, ax_acc), (case, title) in zip(axes, titles.items()):
        case_rows = [r for r in rows if r["case"] == case]
        for r in case_rows:
            losses = curves[case, r["mode"]]
            label = f"{r['mode']} (rank Ψ {r['psi_rank']} of N = {r['N']})"
            ax_loss.semilogy(range(1, len(losses) + 1), losses, label=label)
        ax_loss.set(xlabel="epoch", ylabel="training loss (epoch mean)", title=title)
        ax_loss.legend(fontsize=LEGEND_SIZE)
        x = torch.arange(len(case_rows)).numpy()
        for shift, key in ((-0.2, "train_acc"), (0.2, "test_acc")):
            bars = ax_acc.bar(x + shift, [100 * r[key] for r in case_rows], width=0.4, label=key.replace("_acc", ""))
            ax_acc.bar_label(bars, fmt="%.1f", fontsize=8)
        ax_acc.set_xticks(x, [f"{r['mode']}\nescape path:\n{r['escape_verdict']}" for r in case_rows], fontsize=8)
        ax_acc.set(ylabel="accuracy (%)", ylim=(0, 125), title=f"{case}: accuracy after training")
        ax_acc.legend(loc="upper center", ncols=2, fontsize=LEGEND_SIZE)
    return fig


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", default="runs/skip_networks", help="output directory (CSV, PNG, tensorboard/)")
    parser.add_argument("--data", choices=["digits", "mnist", "cifar"], default="digits", help="10-class data set")
    parser.add_argument("--data-root", default=None, help="directory holding MNIST/raw or cifar-10-batches-py")
    parser.add_argument("--download", action="store_true", help="let torchvision download MNIST/CIFAR-10")
    parser.add_argument("--cases", default="deep,full_rank",
                        help=f"comma-separated, of {', '.join(CASES)}: the deep network where rank Ψ < N, the "
                             "shallow one where rank Ψ = N and the escape-path certificate holds")
    parser.add_argument("--m", type=int, default=400, help="deep case: training samples N")
    parser.add_argument("--depth", type=int, default=8, help="deep case: hidden layers")
    parser.add_argument("--width", type=int, default=64, help="deep case: units per hidden layer")
    parser.add_argument("--skip-units", type=int, default=None, help="deep case: units drawn from lower layers "
                                                                      "(default: N)")
    parser.add_argument("--full-rank-m", type=int, default=150, help="full_rank case: training samples N")
    parser.add_argument("--full-rank-depth", type=int, default=2, help="full_rank case: hidden layers")
    parser.add_argument("--full-rank-width", type=int, default=128, help="full_rank case: units per hidden layer")
    parser.add_argument("--full-rank-skip-units", type=int, default=128,
                        help="full_rank case: units drawn from lower layers (M = width + this; needs M >= N)")
    parser.add_argument("--activation", default="sigmoid", help="sigmoid, softplus, tanh, relu, leaky_relu")
    parser.add_argument("--epochs", type=int, default=200, help="training epochs of every mode")
    parser.add_argument("--batch-size", type=int, default=50, help="SGD batch size")
    parser.add_argument("--lr", type=float, default=0.1, help="SGD learning rate")
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    parser.add_argument("--rand-optimizer", choices=["lbfgs", "sgd"], default="lbfgs",
                        help="optimizer of the convex skip_rand problem (lbfgs: full batch)")
    parser.add_argument("--modes", default="original,skip_rand,skip_sgd",
                        help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--check-every", type=int, default=20, help="epochs between Ψ/valley checks")
    parser.add_argument("--surface-points", type=int, default=11, help="grid of the 2-D loss slice (0: off)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the network, the skip units and the slice")
    parser.add_argument("--data-seed", type=int, default=0, help="seed of the split and the training subset")
    parser.add_argument("--quick", action="store_true", help="tiny sizes and few epochs: a smoke test in seconds")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads; small networks run fastest on one, 0 keeps torch's default")
    args = parser.parse_args(argv)
    if args.quick:
        args.m, args.depth, args.width, args.epochs, args.check_every, args.surface_points = 60, 4, 24, 6, 3, 3
        args.full_rank_m, args.full_rank_depth, args.full_rank_width, args.full_rank_skip_units = 60, 2, 48, 48
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.check_every > args.epochs:
        parser.error(f"--check-every ({args.check_every}) must be at most --epochs ({args.epochs})")
    unknown = set(args.cases.split(",")) - set(CASES)
    if unknown:
        parser.error(f"--cases can be {', '.join(CASES)}, got {', '.join(sorted(unknown))}")
    quiet()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    rows, curves, titles = [], {}, {}
    for case in cases(args):
        titles[case.name] = f"{case.name}: {args.data}, N = {case.m}, {case.depth}x{case.width} {args.activation}"
        for mode in args.modes.split(","):
            row, curves[case.name, mode] = run_mode(args, case, mode)
            rows.append(row)
    write_csv(rows, Path(args.out) / "skip_networks.csv")
    fig = plot(rows, curves, titles)
    save_figures(fig, Path(args.out) / "skip_networks")
    table = markdown_table(table_rows(rows), COLUMNS)
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(Path(args.out) / "tensorboard" / "summary")) as writer:
        writer.add_text("skip_networks/table", table)
        writer.add_figure("skip_networks/figure", fig)
    print(f"\n{'; '.join(titles.values())}; results in {args.out}\n{table}", flush=True)
    return rows


if __name__ == "__main__":
    main()
