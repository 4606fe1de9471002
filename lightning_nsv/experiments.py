"""The runner behind ``examples/``: train with the support-vector callback over seeds, average, write results.

An example builds a grid of parameters (``[{"m": 100}, {"m": 200}, …]``) and a function that turns one point
and a seed into a model factory and a data module; :func:`run_sweep` trains every point ``--trials`` times with
:class:`~lightning_nsv.callbacks.NetworkSupportVectors` (training stops at the first zero-error epoch, where the
analysis runs), :func:`summarise` averages the trials that reached zero training error (as the paper does, 3
trials) and :func:`write_results` writes, under ``--out``:

- ``<name>.csv``: one row per grid point, means and standard deviations over the trials that reached zero error,
  with the counts ``trials`` and ``reached``;
- ``<name>_trials.csv``: one row per trial, including the trials that did not reach zero error;
- ``<name>.png`` and ``<name>.pdf`` (``--format``, ``--dpi``; and any further figures the example makes);
- ``tensorboard/<point>-seed=<k>/``: each trial's training curves and ``nsv/`` metrics, and
  ``tensorboard/summary/``: the figures (mean ± 1 sd error bars against the swept parameter, one per metric of
  the table) and the table as text. The summary is not logged as scalars: with the parameter as the step,
  TensorBoard's smoothing would draw values that were never measured.

``--replot`` draws the figures again from ``<out>/<name>.csv`` without training (new style, same numbers).
Every file is written atomically (:mod:`lightning_nsv.atomic`): a crash leaves the previous version whole.
"""
from __future__ import annotations

import argparse
import csv
import io
import logging
import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch

from lightning_nsv.atomic import save_figure, write_text
from lightning_nsv.callbacks import NetworkSupportVectors
from lightning_nsv.compat import pl, submodule
from lightning_nsv.datamodules import (
    BinaryMNISTDataModule,
    CIFAR10FrogsShipsDataModule,
    ClassificationDataModule,
    DigitsDataModule,
    QuadrantDataModule,
    Toy2DDataModule,
)
from lightning_nsv.models.conv_fc import ConvFCNet
from lightning_nsv.models.mlp import LeakyReLUMLP
from lightning_nsv.support_vectors import SupportVectorAnalysis

__all__ = [
    "DATASETS",
    "FIGURE_FORMATS",
    "SUMMARY_METRICS",
    "Trial",
    "callback_kwargs",
    "cnn_point",
    "data_for",
    "example_parser",
    "figure_options",
    "make_datamodule",
    "make_model",
    "markdown_table",
    "mlp_point",
    "parse",
    "quiet",
    "read_csv",
    "replot",
    "report_sweep",
    "run_sweep",
    "run_trial",
    "save_figures",
    "seeds",
    "summarise",
    "sweep_and_report",
    "write_csv",
    "write_results",
]

DATASETS = ("digits", "mnist", "cifar", "toy", "quadrant")
SUMMARY_METRICS = (
    "n_support", "support_fraction", "zero_error_epoch", "val_agreement", "val_error_network", "val_error_svm",
    "val_errors_network", "val_errors_svm", "val_errors_both", "margin_ratio", "cosine_wbar_v",
    "compression_bound", "unique_patterns_train", "unique_patterns_val", "kkt_residual",
    "path_positive_count_fraction", "path_positive_mass_fraction", "n_val",
)
FIGURE_FORMATS = ("png", "pdf", "svg")
ModelFactory = Callable[[], pl.LightningModule]


def make_datamodule(
    data: str,
    *,
    m: int | None = None,
    seed: int = 0,
    root: str | None = None,
    download: bool = False,
    batch_size: int = 100,
    random_labels: bool = False,
    **kwargs: Any,
) -> ClassificationDataModule:
    """The data module of ``--data``: ``digits`` (bundled), ``mnist`` (0-4 vs 5-9) and ``cifar`` (frogs vs ships,
    channels standardised) from ``root``, ``toy`` (``name=`` one of the 2-D sets) or ``quadrant``; ``kwargs`` go to
    the data module's own arguments."""
    common = dict(m=m, seed=seed, batch_size=batch_size, random_labels=random_labels)
    if data in ("mnist", "cifar"):
        if root is None:
            raise ValueError(f"--data {data} reads the files under --data-root; none was given")
        if data == "mnist":
            return BinaryMNISTDataModule(root, download=download, **common, **kwargs)
        return CIFAR10FrogsShipsDataModule(root, download=download, normalize=True, **common, **kwargs)
    modules = {"digits": DigitsDataModule, "toy": Toy2DDataModule, "quadrant": QuadrantDataModule}
    if data not in modules:
        raise ValueError(f"`data` can be {', '.join(DATASETS)}, got {data!r}")
    return modules[data](**common, **kwargs)


def make_model(kind: str, datamodule: ClassificationDataModule, **kwargs: Any) -> pl.LightningModule:
    """``"mlp"``: :class:`LeakyReLUMLP` on the flattened inputs; ``"cnn"``: :class:`ConvFCNet` on images."""
    shape = tuple(datamodule.input_shape)
    if kind == "mlp":
        return LeakyReLUMLP(in_features=math.prod(shape), **kwargs)
    if kind == "cnn":
        if len(shape) != 3:
            raise ValueError(f"a ConvFCNet needs image inputs (C, H, W), the data have shape {shape}")
        return ConvFCNet(in_channels=shape[0], image_size=shape[1:], **kwargs)
    raise ValueError(f"`kind` can be mlp, cnn, got {kind!r}")


@dataclass
class Trial:
    """One training run: the grid point, the seed and what the support-vector callback found.

    ``analysis`` is ``None`` when the network never reached zero training error within the epochs allowed.
    """

    params: dict[str, Any]
    seed: int
    analysis: SupportVectorAnalysis | None
    metrics: dict[str, float]
    zero_error_epoch: int | None
    epochs: int
    seconds: float
    model: pl.LightningModule
    datamodule: ClassificationDataModule

    @property
    def reached(self) -> bool:
        return self.analysis is not None

    def row(self) -> dict[str, Any]:
        """The trial as one CSV row: parameters, seed, whether zero error was reached, and the ``nsv`` metrics."""
        row = {**self.params, "seed": self.seed, "m": len(self.datamodule.train_dataset),
               "zero_error": int(self.reached), "zero_error_epoch": self.zero_error_epoch,
               "epochs": self.epochs, "seconds": round(self.seconds, 2)}
        if self.reached:
            n_val = len(self.datamodule.val_dataset)
            row["n_val"] = n_val
            row.update(self.metrics)
            if "val_errors_network" in self.metrics and n_val:
                row["val_error_network"] = self.metrics["val_errors_network"] / n_val
                row["val_error_svm"] = self.metrics["val_errors_svm"] / n_val
        return row

    def describe(self) -> str:
        point = ", ".join(f"{k}={v}" for k, v in self.params.items())
        if not self.reached:
            return (f"{point}, seed {self.seed}: NOT at zero training error after {self.epochs} epochs "
                    f"({self.seconds:.1f} s) - left out of the averages")
        a = self.analysis
        text = (f"{point}, seed {self.seed}: zero training error at epoch {self.zero_error_epoch}, "
                f"s = {a.n_support} of m = {a.m} (s/m = {a.n_support / a.m:.3f})")
        if a.val_agreement is not None:
            text += f", validation agreement {100 * a.val_agreement:.2f}%"
        return text + f" ({self.seconds:.1f} s)"


def run_trial(
    make: ModelFactory,
    datamodule: ClassificationDataModule,
    *,
    seed: int,
    params: dict[str, Any],
    out: str | Path,
    max_epochs: int,
    check_every: int = 1,
    val_every: int = 10,
    callback_kwargs: dict[str, Any] | None = None,
) -> Trial:
    """Seed everything, build the model, train until zero training error (or ``max_epochs``) and analyse.

    ``check_every`` is the callback's ``every_n_epochs``: with ``check_every == max_epochs`` the analysis runs
    once, at the end of training (the quadrant experiment, where the weights matter long after zero error).
    TensorBoard logs go to ``<out>/tensorboard/<params>-seed=<seed>``.
    """
    pl.seed_everything(seed, workers=True, verbose=False)
    model = make()
    version = "-".join([*(f"{k}={v}" for k, v in params.items()), f"seed={seed}"])
    logger = submodule("loggers").TensorBoardLogger(str(out), name="tensorboard", version=version,
                                                    default_hp_metric=False)
    callback = NetworkSupportVectors(every_n_epochs=check_every, seed=seed, **(callback_kwargs or {}))
    trainer = pl.Trainer(
        max_epochs=max_epochs, logger=logger, callbacks=[callback], accelerator="auto", devices=1,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        check_val_every_n_epoch=max(1, min(val_every, max_epochs)), num_sanity_val_steps=0, log_every_n_steps=1,
    )
    start = time.perf_counter()
    trainer.fit(model, datamodule=datamodule)
    seconds = time.perf_counter() - start
    return Trial(dict(params), seed, callback.analysis, dict(callback.metrics), callback.zero_error_epoch,
                 trainer.current_epoch, seconds, model, datamodule)


def run_sweep(
    args: argparse.Namespace,
    grid: Iterable[dict[str, Any]],
    build: Callable[[dict[str, Any], int], tuple[ModelFactory, ClassificationDataModule]],
    *,
    max_epochs: int | None = None,
    on_trial: Callable[[Trial], None] | None = None,
    **trial_kwargs: Any,
) -> list[dict[str, Any]]:
    """Train every grid point with every seed of :func:`seeds`; returns one row per trial.

    ``build(point, seed)`` returns the model factory and the data module. ``on_trial`` sees each finished
    :class:`Trial` (with its model and analysis) before it is dropped. Remaining keyword arguments go to
    :func:`run_trial`; ``out`` is ``args.out``.
    """
    rows = []
    for point in grid:
        for seed in seeds(args):
            make, datamodule = build(point, seed)
            trial = run_trial(make, datamodule, seed=seed, params=point, out=args.out,
                              max_epochs=max_epochs or args.max_epochs, **trial_kwargs)
            print(trial.describe(), flush=True)
            if on_trial is not None:
                on_trial(trial)
            rows.append(trial.row())
    return rows


def summarise(
    rows: Sequence[dict[str, Any]], by: Sequence[str], metrics: Sequence[str] = SUMMARY_METRICS
) -> list[dict[str, Any]]:
    """Mean and standard deviation of ``metrics`` over the trials of each ``by`` group that reached zero error.

    Groups keep the order of first appearance; ``trials`` and ``reached`` count the trials; a metric of a group
    where no trial reached zero error is NaN.
    """
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in by), []).append(row)
    summary = []
    for key, members in groups.items():
        done = [r for r in members if r.get("zero_error")]
        entry: dict[str, Any] = dict(zip(by, key))
        entry.update(trials=len(members), reached=len(done))
        for metric in metrics:
            values = np.array([r[metric] for r in done if r.get(metric) is not None], dtype=float)
            if done and not any(metric in r for r in done):
                continue
            entry[metric] = float(values.mean()) if values.size else math.nan
            entry[f"{metric}_std"] = float(values.std()) if values.size else math.nan
        summary.append(entry)
    return summary


def write_csv(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Rows with the union of their keys as columns (in order of first appearance)."""
    columns = list(dict.fromkeys(k for row in rows for k in row))
    buffer = io.StringIO(newline="")
    writer = csv.DictWriter(buffer, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    return write_text(path, buffer.getvalue())


def markdown_table(rows: Sequence[dict[str, Any]], columns: dict[str, str]) -> str:
    """A Markdown table of ``columns`` (key -> header); floats with 4 significant digits, ``mean ± std`` where
    the row has ``<key>_std``."""
    def cell(row: dict[str, Any], key: str) -> str:
        value = row.get(key)
        if isinstance(value, float):
            text = "—" if math.isnan(value) else f"{value:.4g}"
            std = row.get(f"{key}_std")
            if isinstance(std, float) and not math.isnan(value) and std > 1e-9 * max(1.0, abs(value)):
                text += f" ± {std:.2g}"
            return text
        return "" if value is None else str(value)

    lines = ["| " + " | ".join(columns.values()) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row, key) for key in columns) + " |" for row in rows]
    return "\n".join(lines)


def write_results(
    args: argparse.Namespace,
    name: str,
    rows: Sequence[dict[str, Any]],
    summary: Sequence[dict[str, Any]],
    figures: dict[str, Any],
    table: dict[str, str],
    step_key: str | None = None,
) -> Path:
    """Write ``<name>.csv`` (summary), ``<name>_trials.csv``, each figure in every ``--format`` (``figures`` maps
    a file-name suffix, ``""`` for ``<name>.png``, to a matplotlib figure) and the TensorBoard summary; print the
    table.

    TensorBoard gets the figures as ``<name>/figure<suffix>``, the table as ``<name>/table`` and, when the sweep
    is over one numeric parameter ``step_key``, one error-bar figure per metric of the table,
    ``<name>/sweep/<metric>``.
    """
    import matplotlib.pyplot as plt
    from torch.utils.tensorboard import SummaryWriter

    out = Path(args.out)
    write_csv(summary, out / f"{name}.csv")
    write_csv(rows, out / f"{name}_trials.csv")
    writer = SummaryWriter(str(out / "tensorboard" / "summary"))
    for suffix, figure in figures.items():
        save_figures(figure, out / f"{name}{suffix}", **figure_options(args))
        writer.add_figure(f"{name}/figure{suffix}", figure, close=False)
        plt.close(figure)
    for metric, figure in _metric_figures(summary, table, step_key).items():
        writer.add_figure(f"{name}/sweep/{metric}", figure, close=True)
    text = markdown_table(summary, table)
    spread = "one seed" if args.trials == 1 else "mean ± sd over the seeds that reached zero training error"
    writer.add_text(f"{name}/table", f"{text}\n\n{spread}")
    writer.close()
    missed = [r for r in rows if not r.get("zero_error")]
    print(f"\n{name}: {len(rows) - len(missed)} of {len(rows)} trials reached zero training error; results in {out}")
    print(text, flush=True)
    return out


def _metric_figures(summary: Sequence[dict[str, Any]], table: dict[str, str], key: str | None) -> dict[str, Any]:
    """One error-bar figure per averaged metric of ``table`` against the numeric sweep parameter ``key``."""
    from lightning_nsv.plotting import plot_sweep

    if key is None or not all(isinstance(row.get(key), (int, float)) for row in summary):
        return {}
    xs = [float(row[key]) for row in summary]
    logx = min(xs) > 0 and max(xs) >= 8 * min(xs)
    figures = {}
    for metric, label in table.items():
        if metric != key and any(f"{metric}_std" in row for row in summary):
            figures[metric] = plot_sweep(summary, key, {metric: label}, xlabel=table.get(key, key), ylabel=label,
                                         logx=logx)[0]
    return figures


def figure_options(args: argparse.Namespace) -> dict[str, Any]:
    """``formats`` and ``dpi`` of :func:`save_figures` from ``--format`` and ``--dpi``."""
    return {"formats": getattr(args, "format", ("png", "pdf")), "dpi": getattr(args, "dpi", 200)}


def save_figures(figure: Any, stem: str | Path, formats: Sequence[str] = ("png", "pdf"), dpi: int = 200) -> list[Path]:
    """``<stem>.<format>`` for each of ``formats`` (raster formats at ``dpi``), each written atomically."""
    stem = Path(stem)
    return [save_figure(figure, stem.with_name(f"{stem.name}.{fmt}"), dpi=dpi, bbox_inches="tight")
            for fmt in formats]


def replot(args: argparse.Namespace, name: str, figure: Callable[[list[dict[str, Any]]], Any]) -> list[dict[str, Any]]:
    """``--replot``: the figures of ``<out>/<name>.csv`` in every ``--format``, nothing trained or logged."""
    path = Path(args.out) / f"{name}.csv"
    if not path.is_file():
        raise FileNotFoundError(f"--replot reads {path}, which does not exist: run the example with --out "
                                f"{args.out} first, or point --out at the folder holding {name}.csv")
    import matplotlib.pyplot as plt

    summary = read_csv(path)
    figures = figure(summary)
    for suffix, fig in (figures if isinstance(figures, dict) else {"": figures}).items():
        written = save_figures(fig, Path(args.out) / f"{name}{suffix}", **figure_options(args))
        plt.close(fig)
        print("wrote " + ", ".join(str(p) for p in written), flush=True)
    return summary


def sweep_and_report(
    args: argparse.Namespace,
    name: str,
    grid: Sequence[dict[str, Any]],
    build: Callable[[dict[str, Any], int], tuple[ModelFactory, ClassificationDataModule]],
    figure: Callable[[list[dict[str, Any]]], Any],
    table: dict[str, str],
    *,
    rows: Sequence[dict[str, Any]] | None = None,
    metrics: Sequence[str] = SUMMARY_METRICS,
    **sweep_kwargs: Any,
) -> list[dict[str, Any]]:
    """The whole of a sweep example: :func:`run_sweep` (unless ``rows`` of an earlier run are given, or
    ``--from-trials`` names CSV files of one; ``--replot`` only draws ``<name>.csv`` again, see :func:`replot`),
    :func:`summarise` by the grid's keys, ``figure(summary)`` (a figure, or a dict of file-name suffix to figure)
    and :func:`write_results`; returns the summary."""
    by = list(grid[0])
    if getattr(args, "replot", False):
        return replot(args, name, figure)
    if rows is None and getattr(args, "from_trials", None):
        rows = [row for path in args.from_trials for row in read_csv(path)]
    if rows is None:
        rows = run_sweep(args, grid, build, callback_kwargs=callback_kwargs(args), **sweep_kwargs)
    summary = summarise(rows, by, metrics)
    figures = figure(summary)
    figures = figures if isinstance(figures, dict) else {"": figures}
    write_results(args, name, rows, summary, figures, table, step_key=by[0] if len(by) == 1 else None)
    return summary


def report_sweep(
    args: argparse.Namespace,
    name: str,
    key: str,
    values: Sequence[Any],
    build: Callable[[dict[str, Any], int], tuple[ModelFactory, ClassificationDataModule]],
    table: dict[str, str],
    *,
    series: dict[str, str],
    xlabel: str,
    ylabel: str,
    logx: bool = False,
    title: str | None = None,
) -> list[dict[str, Any]]:
    """:func:`sweep_and_report` over one parameter ``key``, plotted by :func:`~lightning_nsv.plotting.plot_sweep`
    (``series`` maps summary metrics to legend labels)."""
    from lightning_nsv.plotting import plot_sweep

    def figure(summary: list[dict[str, Any]]) -> Any:
        return plot_sweep(summary, key, series, xlabel=xlabel, ylabel=ylabel, logx=logx, title=title)[0]

    return sweep_and_report(args, name, [{key: value} for value in values], build, figure, table)


def seeds(args: argparse.Namespace) -> range:
    """The trial seeds: ``--seed``, ``--seed + 1``, … (``--trials`` of them)."""
    return range(args.seed, args.seed + args.trials)


def example_parser(
    name: str,
    description: str,
    *,
    data: Sequence[str] = ("digits", "mnist"),
    max_epochs: int = 200,
    from_trials: bool = True,
    **defaults: Any,
) -> argparse.ArgumentParser:
    """The flags every example shares; the first of ``data`` is the default data set, ``defaults`` override the
    model defaults (``width``, ``depth``, ``beta``, ``lr``, …). ``from_trials`` adds ``--from-trials``, which
    :func:`sweep_and_report` reads instead of training (for examples whose results are all in the trials CSV)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add = parser.add_argument
    add("--out", default=f"runs/{name}", help="output directory (CSV, PNG, tensorboard/)")
    add("--data", choices=list(data), default=data[0], help="data set")
    add("--data-root", default=None, help="directory holding MNIST/raw or cifar-10-batches-py")
    add("--download", action="store_true", help="let torchvision download MNIST/CIFAR-10 into --data-root")
    add("--trials", type=int, default=3, help="trials (seeds) per point, averaged")
    add("--seed", type=int, default=0, help="seed of the first trial (initialisation); trials use seed, seed+1, …")
    add("--data-seed", type=int, default=0, help="seed of the validation split and the training subset (fixed)")
    add("--max-epochs", type=int, default=max_epochs, help="epochs allowed to reach zero training error")
    add("--m", type=int, default=None, help="training samples (default: the whole training pool)")
    add("--width", type=int, default=16, help="hidden width")
    add("--depth", type=int, default=3, help="hidden layers")
    add("--beta", type=float, default=0.0, help="negative slope of the activation (0: ReLU, 0.1: Leaky-ReLU)")
    add("--bias", action=argparse.BooleanOptionalAction, default=False, help="biases in the Linear layers")
    add("--optimizer", choices=["sgd", "adam"], default="sgd")
    add("--lr", type=float, default=0.05, help="learning rate")
    add("--momentum", type=float, default=0.9, help="SGD momentum")
    add("--batch-size", type=int, default=100)
    add("--intercept", action="store_true",
        help="fit the SVM with an intercept (the paper's SVC protocol) instead of through the origin")
    add("--threads", type=int, default=1, help="torch CPU threads (small networks run fastest on 1)")
    add("--quick", action="store_true", help="tiny sizes, 1 trial, Adam: a smoke test in seconds")
    add("--format", type=_formats, default=("png", "pdf"), metavar="LIST",
        help=f"comma-separated figure formats, of {', '.join(FIGURE_FORMATS)}")
    add("--dpi", type=int, default=200, help="resolution of raster figures (PNG), at least 150 for print")
    if from_trials:
        add("--from-trials", nargs="+", metavar="CSV",
            help="summarise and plot these *_trials.csv files (concatenated) instead of training")
        add("--replot", action="store_true", help="only draw the figures again from <out>/<name>.csv")
    parser.set_defaults(**defaults)
    return parser


def _formats(text: str) -> tuple[str, ...]:
    formats = tuple(dict.fromkeys(part.strip().lower().lstrip(".") for part in text.split(",") if part.strip()))
    unknown = [f for f in formats if f not in FIGURE_FORMATS]
    if unknown or not formats:
        raise argparse.ArgumentTypeError(f"formats can be {', '.join(FIGURE_FORMATS)} (comma-separated), got {text!r}")
    return formats


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse the flags, set the torch threads, make ``--out`` and :func:`quiet` Lightning.

    ``--quick`` means one trial, batches of 20 at most, 100 epochs at most and Adam with learning rate 0.01.
    """
    args = parser.parse_args(argv)
    if args.trials < 1:
        parser.error(f"--trials must be at least 1, got {args.trials}")
    if args.dpi < 1:
        parser.error(f"--dpi must be positive, got {args.dpi}")
    if args.data in ("mnist", "cifar") and args.data_root is None:
        parser.error(f"--data {args.data} needs --data-root (the directory holding the files)")
    if args.quick:
        args.trials, args.batch_size, args.max_epochs = 1, min(args.batch_size, 20), min(args.max_epochs, 100)
        args.optimizer, args.lr = "adam", 0.01
    torch.set_num_threads(args.threads)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    quiet()
    return args


def data_for(args: argparse.Namespace, point: dict[str, Any], **kwargs: Any) -> ClassificationDataModule:
    """The data module of ``args.data`` for a grid point (``m`` and ``random_labels`` may be swept)."""
    return make_datamodule(args.data, m=point.get("m", args.m), seed=args.data_seed, root=args.data_root,
                           download=args.download, batch_size=args.batch_size,
                           random_labels=point.get("random_labels", False), **kwargs)


def mlp_point(
    args: argparse.Namespace, point: dict[str, Any], seed: int
) -> tuple[ModelFactory, ClassificationDataModule]:
    """:func:`run_sweep`'s ``build`` for :class:`LeakyReLUMLP` sweeps: ``width``, ``depth``, ``m`` and
    ``random_labels`` come from the point where it has them, the rest from the flags."""
    datamodule = data_for(args, point)
    widths = [point.get("width", args.width)] * point.get("depth", args.depth)
    return (lambda: make_model("mlp", datamodule, widths=widths, beta=args.beta, bias=args.bias,
                               optimizer=args.optimizer, lr=args.lr, momentum=args.momentum)), datamodule


def cnn_point(
    args: argparse.Namespace, point: dict[str, Any], seed: int
) -> tuple[ModelFactory, ClassificationDataModule]:
    """:func:`run_sweep`'s ``build`` for :class:`ConvFCNet` sweeps over ``fc_depth`` (and ``m``)."""
    datamodule = data_for(args, point)
    return (lambda: make_model("cnn", datamodule, fc_depth=point.get("fc_depth", args.depth), fc_width=args.width,
                               beta=args.beta, bias=args.bias, optimizer=args.optimizer, lr=args.lr,
                               momentum=args.momentum)), datamodule


def callback_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {"intercept": args.intercept}


def read_csv(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a CSV written by :func:`write_csv`, numbers parsed (``int`` where integral), ``True``/``False`` as
    booleans, blanks as ``None``."""
    def value(text: str) -> Any:
        if text == "":
            return None
        if text in ("True", "False"):
            return text == "True"
        for kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                pass
        return text

    with Path(path).open(newline="") as handle:
        return [{k: value(v) for k, v in row.items()} for row in csv.DictReader(handle)]


def quiet() -> None:
    """Keep Lightning's per-run banners and data-loader hints off the console."""
    for logger in ("pytorch_lightning", "lightning.pytorch", "lightning_fabric", "lightning.fabric"):
        logging.getLogger(logger).setLevel(logging.WARNING)
    for message in (".*does not have many workers.*", ".*number of training batches.*", ".*LeafSpec.*",
                    ".*log_every_n_steps.*"):
        warnings.filterwarnings("ignore", message=message)
