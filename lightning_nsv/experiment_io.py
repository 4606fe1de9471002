"""The files and flags of the examples (:mod:`lightning_nsv.experiments` trains): CSV rows in and out, Markdown
tables, figures in every ``--format`` with the TensorBoard summary (:func:`write_results`), ``--replot``, and the
shared command-line flags (:func:`example_parser`, :func:`parse`). No Lightning import.

Every file is written atomically (:mod:`lightning_nsv.atomic`): a crash leaves the previous version whole.
"""
from __future__ import annotations

import argparse
import csv
import io
import logging
import math
import warnings
from pathlib import Path
from typing import Any, Callable, NoReturn, Sequence

import torch

from lightning_nsv.atomic import save_figure, write_text

__all__ = ["FIGURE_FORMATS", "example_parser", "figure_options", "markdown_table", "parse", "quiet", "read_csv",
           "read_trials", "replot", "save_figures", "usage_error", "write_csv", "write_results"]

FIGURE_FORMATS = ("png", "pdf", "svg")


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

    if key is None or not summary or not all(isinstance(row.get(key), (int, float)) for row in summary):
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


def replot(args: argparse.Namespace, name: str, figure: Callable[[list[dict[str, Any]]], Any],
           columns: Sequence[str] = ()) -> list[dict[str, Any]]:
    """``--replot``: the figures of ``<out>/<name>.csv`` in every ``--format``, nothing trained or logged. A CSV
    without rows or without one of ``columns`` (the sweep's parameters) is refused (:func:`usage_error`)."""
    path = Path(args.out) / f"{name}.csv"
    if not path.is_file():
        raise FileNotFoundError(f"--replot reads {path}, which does not exist: run the example with --out "
                                f"{args.out} first, or point --out at the folder holding {name}.csv")
    import matplotlib.pyplot as plt

    summary = _checked_rows(args, "--replot", path, columns,
                            f"run the example (or --from-trials) with --out {args.out} to write it again")
    figures = figure(summary)
    for suffix, fig in (figures if isinstance(figures, dict) else {"": figures}).items():
        written = save_figures(fig, Path(args.out) / f"{name}{suffix}", **figure_options(args))
        plt.close(fig)
        print("wrote " + ", ".join(str(p) for p in written), flush=True)
    return summary


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
    if args.threads < 1:
        parser.error(f"--threads must be a positive integer, got {args.threads}")
    if args.data in ("mnist", "cifar") and args.data_root is None:
        parser.error(f"--data {args.data} needs --data-root (the directory holding the files)")
    if args.quick:
        args.trials, args.batch_size, args.max_epochs = 1, min(args.batch_size, 20), min(args.max_epochs, 100)
        args.optimizer, args.lr = "adam", 0.01
    torch.set_num_threads(args.threads)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    quiet()
    args._parser = parser  # for usage_error
    return args


def usage_error(args: argparse.Namespace, message: str) -> NoReturn:
    """Refuse as argparse refuses a flag (usage, ``<prog>: error: <message>``, exit status 2) with the parser
    that :func:`parse` used; with a plain ``SystemExit`` and the message for namespaces made otherwise."""
    parser = getattr(args, "_parser", None)
    if parser is None:
        raise SystemExit(f"error: {message}")
    parser.error(message)


def read_trials(args: argparse.Namespace, columns: Sequence[str]) -> list[dict[str, Any]]:
    """The rows of the ``--from-trials`` CSV files, concatenated. A file that is missing or unreadable, holds no
    rows or lacks one of ``columns`` is refused (:func:`usage_error`), before anything is written."""
    return [row for path in args.from_trials
            for row in _checked_rows(args, "--from-trials", path, columns,
                                     "pass a *_trials.csv of this example's sweep (one row per trial)")]


def _checked_rows(args: argparse.Namespace, flag: str, path: str | Path, columns: Sequence[str],
                  advice: str) -> list[dict[str, Any]]:
    """:func:`read_csv` of ``path``, refused unless it has rows and ``columns``; ``advice`` ends the message."""
    try:
        found, rows = _read(path)
    except FileNotFoundError:
        usage_error(args, f"{flag}: there is no file {path}")
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        usage_error(args, f"{flag}: cannot read {path} as a CSV ({type(error).__name__}: {error})")
    if not rows:
        what = f"holds a header ({', '.join(found)}) and no rows" if found else "is empty (no header, no rows)"
        usage_error(args, f"{flag}: {path} {what}; {advice}")
    missing = [c for c in columns if c not in found]
    if missing:
        usage_error(args, f"{flag}: {path} lacks the column{'s' * (len(missing) > 1)} {', '.join(missing)}: "
                          f"expected {', '.join(columns)}, found {', '.join(found)}; {advice}")
    return rows


def read_csv(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a CSV written by :func:`write_csv`, numbers parsed (``int`` where integral), ``True``/``False`` as
    booleans, blanks as ``None``."""
    return _read(path)[1]


def _read(path: str | Path) -> tuple[list[str], list[dict[str, Any]]]:
    """The columns of the header (none for an empty file) and the rows of :func:`read_csv`."""
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
        reader = csv.DictReader(handle)
        rows = [{k: value(v) for k, v in row.items()} for row in reader]
        return list(reader.fieldnames or ()), rows


def quiet() -> None:
    """Keep Lightning's per-run banners and data-loader hints off the console."""
    for logger in ("pytorch_lightning", "lightning.pytorch", "lightning_fabric", "lightning.fabric"):
        logging.getLogger(logger).setLevel(logging.WARNING)
    for message in (".*does not have many workers.*", ".*number of training batches.*", ".*LeafSpec.*",
                    ".*log_every_n_steps.*"):
        warnings.filterwarnings("ignore", message=message)
