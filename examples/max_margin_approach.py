"""Does a network trained past zero training error approach the max-margin classifier in path space?

At zero training error a Leaky-ReLU network is a linear classifier in path space. For a *linear* model trained
by gradient descent on the logistic loss the direction converges to the max-margin one, slowly: the angle gap
shrinks like 1/log t (Soudry et al., 2018). This example keeps training after the first zero-error epoch
(``NetworkSupportVectors(stop_on_zero_error=False, every_n_epochs=E)``) and records at every analysis the margin
ratio (network margin / max margin), the cosine between the network's path weights and the max-margin direction,
s, the overlap with the previous support set and the samples whose activation pattern changed, for

- ``binary``: digits 0-4 vs 5-9, ``LeakyReLUMLP`` (one logit, logistic loss), and
- ``multiclass``: the 10 digits, ``LeakyReLUMLP(num_classes=10)`` (cross-entropy; the multi-class SVM through
  the origin over (sample, class) pairs, DESIGN §2b).

    python examples/max_margin_approach.py                       # both tasks, --epochs 2000 --every 10
    python examples/max_margin_approach.py --tasks multiclass --epochs 5000 --every 25
    python examples/max_margin_approach.py --replot --out examples/results   # figure from the CSVs

Writes under ``--out``: ``max_margin_approach_<task>.csv`` (one row per analysis: epoch, margin_ratio, cosine,
s, support_jaccard_previous, patterns_changed, train_loss, …), ``max_margin_approach_fit.csv`` (the fits
``1 - cos ≈ a / log t + b`` and ``1 - margin ratio ≈ a / log t + b``), ``max_margin_approach.png``/``.pdf``
(top: cosine and margin ratio against the epoch, log axis; bottom: 1 - cosine against 1 / log(epoch), where the
1/log t rate is a straight line, with the fit), and TensorBoard logs (``tensorboard/<task>/``: training curves
and the ``nsv/`` metrics of every analysis; ``tensorboard/summary/``: the figure and the fit table).
"""
from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from lightning_nsv.atomic import write_text
from lightning_nsv.callbacks import NetworkSupportVectors
from lightning_nsv.compat import pl, submodule
from lightning_nsv.experiments import (
    example_parser, figure_options, make_datamodule, make_model, markdown_table, parse, read_csv, save_figures,
    write_csv,
)
from lightning_nsv.plotting.base import LEGEND_SIZE

NAME = "max_margin_approach"
TASKS = ("binary", "multiclass")
COLUMNS = ("epoch", "margin_ratio", "cosine_wbar_v", "n_support", "support_fraction", "support_jaccard_previous",
           "patterns_changed", "train_loss", "network_margin", "svm_margin", "val_agreement", "kkt_residual")
FIT_TABLE = {"task": "task", "quantity": "quantity", "a": "a", "b": "b", "r2": "R²", "points": "analyses",
             "first_epoch": "from epoch", "last_epoch": "to epoch", "last_value": "last value"}


class LossRecorder(pl.Callback):
    """Mean training loss of every epoch (the batch losses, weighted by batch size), keyed by epoch."""

    def __init__(self) -> None:
        self.losses: dict[int, float] = {}
        self._sum, self._n = 0.0, 0

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._sum, self._n = 0.0, 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        n = len(batch[1])
        self._sum += float(loss.detach()) * n
        self._n += n

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if self._n:
            self.losses[trainer.current_epoch] = self._sum / self._n


def run_task(args: argparse.Namespace, task: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Train one network for ``--epochs`` epochs with the repeated analysis; one row per analysis."""
    pl.seed_everything(args.seed, workers=True, verbose=False)
    datamodule = make_datamodule(args.data, m=args.m, seed=args.data_seed, batch_size=args.batch_size, task=task)
    model = make_model("mlp", datamodule, widths=[args.width] * args.depth, beta=args.beta, bias=args.bias,
                       optimizer=args.optimizer, lr=args.lr, momentum=args.momentum,
                       num_classes=2 if task == "binary" else 10)
    logger = submodule("loggers").TensorBoardLogger(str(args.out), name="tensorboard", version=task,
                                                    default_hp_metric=False)
    callback = NetworkSupportVectors(every_n_epochs=args.every, stop_on_zero_error=False, seed=args.seed,
                                     max_images=0)
    losses = LossRecorder()
    trainer = pl.Trainer(
        max_epochs=args.epochs, logger=logger, callbacks=[losses, callback], accelerator="cpu", devices=1,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        check_val_every_n_epoch=max(1, min(args.every * 10, args.epochs)), num_sanity_val_steps=0,
        log_every_n_steps=10,
    )
    start = time.perf_counter()
    trainer.fit(model, datamodule=datamodule)
    seconds = time.perf_counter() - start
    rows = []
    for entry in callback.history:
        # the callback's epoch is the 0-based index of the epoch just trained; the row counts epochs trained
        epoch = int(entry["epoch"])
        row = {key: entry.get(key) for key in COLUMNS}
        row["epoch"] = epoch + 1
        row["train_loss"] = losses.losses.get(epoch)
        row.update({k: v for k, v in entry.items() if k.startswith("n_support_class")})
        rows.append(row)
    info = {"task": task, "m": len(datamodule.train_dataset), "seconds": round(seconds, 1),
            "zero_error_epoch": None if callback.zero_error_epoch is None else callback.zero_error_epoch + 1,
            "analyses": len(rows), "epochs": args.epochs}
    return rows, info


def fit_log_rate(epochs: np.ndarray, gap: np.ndarray) -> dict[str, float]:
    """Least squares ``gap ≈ a / log(epoch) + b`` (the linear-model rate of Soudry et al.), with R²."""
    keep = np.isfinite(gap) & (epochs > 1)
    x, y = 1.0 / np.log(epochs[keep]), gap[keep]
    if len(x) < 3:
        return {"a": math.nan, "b": math.nan, "r2": math.nan, "points": int(len(x))}
    a, b = np.polyfit(x, y, 1)
    residual = y - (a * x + b)
    total = float(((y - y.mean()) ** 2).sum())
    return {"a": float(a), "b": float(b), "r2": 1 - float((residual ** 2).sum()) / total if total > 0 else math.nan,
            "points": int(len(x))}


def fits(results: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    table = []
    for task, rows in results.items():
        epochs = np.array([float(r["epoch"]) for r in rows])
        for quantity, key in (("1 - cosine", "cosine_wbar_v"), ("1 - margin ratio", "margin_ratio")):
            values = np.array([math.nan if r.get(key) is None else float(r[key]) for r in rows])
            entry = {"task": task, "quantity": quantity, **fit_log_rate(epochs, 1 - values)}
            entry.update(first_epoch=int(epochs[0]) if len(epochs) else None,
                         last_epoch=int(epochs[-1]) if len(epochs) else None,
                         last_value=float(values[-1]) if len(values) else math.nan)
            table.append(entry)
    return table


def figure(results: dict[str, list[dict[str, Any]]], table: list[dict[str, Any]]):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(results), figsize=(4.6 * len(results), 6.6), squeeze=False)
    fitted = {(row["task"], row["quantity"]): row for row in table}
    for column, (task, rows) in enumerate(results.items()):
        top, bottom = axes[0, column], axes[1, column]
        epochs = np.array([float(r["epoch"]) for r in rows])
        cosine = np.array([float(r["cosine_wbar_v"]) for r in rows]) if rows else np.array([])
        ratio = np.array([math.nan if r.get("margin_ratio") is None else float(r["margin_ratio"]) for r in rows])
        top.plot(epochs, cosine, "-", lw=1.4, label="cos(w̄, v)")
        top.plot(epochs, ratio, "-", lw=1.4, label="margin ratio")
        top.set_xscale("log")
        top.set_xlabel("epoch (log scale)")
        top.set_ylabel("value (1 = max-margin)")
        top.set_title(f"{task}: approach to the max-margin classifier", fontsize=9)
        top.legend(fontsize=LEGEND_SIZE, loc="best")
        top.grid(alpha=0.3)
        if len(epochs):
            x = 1.0 / np.log(np.maximum(epochs, 2.0))
            for values, label, marker in ((1 - cosine, "1 − cos", "o"), (1 - ratio, "1 − margin ratio", "s")):
                bottom.plot(x, values, marker, ms=2.5, alpha=0.6, label=label)
            for quantity, colour in (("1 - cosine", "C0"), ("1 - margin ratio", "C1")):
                fit = fitted.get((task, quantity))
                if fit and np.isfinite(fit["a"]):
                    grid = np.linspace(0, x.max(), 50)
                    bottom.plot(grid, fit["a"] * grid + fit["b"], "--", color=colour, lw=1,
                                label=f"a/log t + b: a={fit['a']:.3g}, b={fit['b']:.3g}, R²={fit['r2']:.2f}")
        bottom.set_xlim(left=0)
        bottom.set_xlabel("1 / log(epoch)   (0: t → ∞)")
        bottom.set_ylabel("gap (1/log t rate: a straight line)")
        bottom.legend(fontsize=LEGEND_SIZE, loc="best")
        bottom.grid(alpha=0.3)
    fig.suptitle("one seed, bundled digits; dashed: least-squares fit of the 1/log t rate (Soudry et al. 2018)",
                 fontsize=8)
    fig.tight_layout()
    return fig


def write_outputs(args: argparse.Namespace, results: dict[str, list[dict[str, Any]]], log: bool) -> list[dict]:
    import matplotlib.pyplot as plt

    out = Path(args.out)
    table = fits(results)
    write_csv(table, out / f"{NAME}_fit.csv")
    fig = figure(results, table)
    written = save_figures(fig, out / NAME, **figure_options(args))
    text = markdown_table(table, FIT_TABLE)
    if log:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(out / "tensorboard" / "summary"))
        writer.add_figure(f"{NAME}/figure", fig, close=False)
        writer.add_text(f"{NAME}/fit", text + "\n\none seed; gap ≈ a / log(epoch) + b by least squares")
        writer.close()
    plt.close(fig)
    print(text)
    print("wrote " + ", ".join(str(p) for p in written), flush=True)
    return table


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = example_parser(NAME, __doc__, data=("digits",), from_trials=False, max_epochs=2000, width=64, depth=2,
                            beta=0.1, bias=True, batch_size=50, lr=0.05)
    parser.add_argument("--epochs", type=int, default=2000, help="epochs to train (past zero training error)")
    parser.add_argument("--every", type=int, default=10, help="analyse every this many epochs")
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    parser.add_argument("--replot", action="store_true", help="only draw the figure again from the task CSVs")
    args = parse(parser, argv)
    if args.quick:
        args.epochs, args.every, args.m = min(args.epochs, 30), min(args.every, 5), args.m or 100
    if args.epochs < 1 or args.every < 1:
        parser.error("--epochs and --every must be positive")
    out = Path(args.out)
    results, infos = {}, []
    for task in args.tasks:
        path = out / f"{NAME}_{task}.csv"
        if args.replot:
            results[task] = read_csv(path)
            continue
        rows, info = run_task(args, task)
        if rows:
            write_csv(rows, path)
        else:  # no analysis ran (zero training error never reached): a header-only CSV
            write_text(path, ",".join(COLUMNS) + "\n")
        results[task] = rows
        infos.append(info)
        last = rows[-1] if rows else {}
        print(f"{task}: m = {info['m']}, zero training error at epoch {info['zero_error_epoch']}, "
              f"{info['analyses']} analyses in {info['epochs']} epochs ({info['seconds']} s); last: "
              f"cos {last.get('cosine_wbar_v')}, margin ratio {last.get('margin_ratio')}, s {last.get('n_support')}",
              flush=True)
    if infos:
        write_csv(infos, out / f"{NAME}_runs.csv")
    table = write_outputs(args, results, log=not args.replot)
    return {"results": results, "fits": table, "runs": infos}


if __name__ == "__main__":
    main()
