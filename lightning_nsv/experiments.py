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
Every file is written atomically (:mod:`lightning_nsv.atomic`): a crash leaves the previous version whole. Files and
flags live in :mod:`lightning_nsv.experiment_io` (re-exported here: ``from lightning_nsv.experiments import
write_csv`` keeps working).
"""
from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

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
from lightning_nsv.experiment_io import (FIGURE_FORMATS, example_parser, figure_options, markdown_table, parse, quiet,
                                         read_csv, read_trials, replot, save_figures, usage_error, write_csv,
                                         write_results)
from lightning_nsv.models.conv_fc import ConvFCNet
from lightning_nsv.models.mlp import LeakyReLUMLP
from lightning_nsv.analysis.binary import SupportVectorAnalysis

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
    "read_trials",
    "replot",
    "report_sweep",
    "run_sweep",
    "run_trial",
    "save_figures",
    "seeds",
    "summarise",
    "sweep_and_report",
    "usage_error",
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
    callback_options: dict[str, Any] | None = None,
    **sweep_kwargs: Any,
) -> list[dict[str, Any]]:
    """The whole of a sweep example: :func:`run_sweep` (unless ``rows`` of an earlier run are given, or
    ``--from-trials`` names CSV files of one, :func:`read_trials`; ``--replot`` only draws ``<name>.csv`` again, see
    :func:`replot`; both refuse a CSV without rows or the grid's keys, before anything is written),
    :func:`summarise` by the grid's keys, ``figure(summary)`` (a figure, or a dict of file-name suffix to figure)
    and :func:`write_results`; returns the summary. ``callback_options`` go to the callback after
    :func:`callback_kwargs` (e.g. ``{"scope": "head"}``)."""
    by = list(grid[0])
    if getattr(args, "replot", False):
        return replot(args, name, figure, by)
    if rows is None and getattr(args, "from_trials", None):
        rows = read_trials(args, [*by, "zero_error"])
    if rows is None:
        rows = run_sweep(args, grid, build, callback_kwargs={**callback_kwargs(args), **(callback_options or {})},
                         **sweep_kwargs)
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
    callback_options: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """:func:`sweep_and_report` over one parameter ``key``, plotted by :func:`~lightning_nsv.plotting.plot_sweep`
    (``series`` maps summary metrics to legend labels)."""
    from lightning_nsv.plotting import plot_sweep

    def figure(summary: list[dict[str, Any]]) -> Any:
        return plot_sweep(summary, key, series, xlabel=xlabel, ylabel=ylabel, logx=logx, title=title)[0]

    return sweep_and_report(args, name, [{key: value} for value in values], build, figure, table,
                            callback_options=callback_options)


def seeds(args: argparse.Namespace) -> range:
    """The trial seeds: ``--seed``, ``--seed + 1``, … (``--trials`` of them)."""
    return range(args.seed, args.seed + args.trials)


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
