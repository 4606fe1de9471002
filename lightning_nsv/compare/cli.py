"""``lightning-nsv compare``: the command line of :mod:`lightning_nsv.compare`."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn, Sequence

from lightning_nsv.compare.outputs import write_comparison
from lightning_nsv.compare.support_sets import IMAGE_COUNT, LOADER_ARGS, SupportSetComparison, compare_support_sets


def main(argv: Sequence[str] | None = None) -> SupportSetComparison:
    """``lightning-nsv compare ART.pt ART.pt ... [--out DIR]``: print the comparison; with ``--out`` write its
    CSVs, report and figures there. A refusal (files of different training sets, a missing file, a folder that
    holds no or several result files, an ``--out`` that is a file) exits with status 1 and its message; a
    folder that holds one result file stands for it."""
    parser = argparse.ArgumentParser(
        prog="lightning-nsv compare",
        description="Compare the support sets of several result files (support_vectors_epoch<E>.pt) of one "
                    "training set: s per run, pairwise Jaccard, the core, and how many runs share each sample.")
    parser.add_argument("results", nargs="+", metavar="ART",
                        help="result files (.pt, .json or their stem), or a folder holding one")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="write compare.csv, compare_samples.csv, compare.md and the figures here")
    parser.add_argument("--names", nargs="+", default=None, help="a short name per run (default: run 1, run 2, …)")
    parser.add_argument("--images", type=int, default=IMAGE_COUNT,
                        help="most frequent support vectors to draw as images (0: none)")
    parser.add_argument("--ignore-data-arg", action="append", default=list(LOADER_ARGS), metavar="NAME",
                        help="a data-module argument that may differ between the runs (repeatable; "
                             f"always: {', '.join(LOADER_ARGS)})")
    parser.add_argument("--format", default="png", metavar="LIST", help="figure formats, comma-separated (png,pdf,svg)")
    args = parser.parse_args(argv)
    formats = tuple(dict.fromkeys(part.strip().lower().lstrip(".") for part in args.format.split(",") if part.strip()))
    if not formats or set(formats) - {"png", "pdf", "svg"}:
        parser.error(f"--format can be png, pdf, svg (comma-separated), got {args.format!r}")
    if args.images < 0:
        parser.error(f"--images must be 0 (no image grid) or more, got {args.images}")
    if args.out is not None and Path(args.out).exists() and not Path(args.out).is_dir():
        _refuse(f"--out {args.out} is a file, not a folder; pass a folder (it is made if missing)")
    try:
        comparison = compare_support_sets([_result_file(path) for path in args.results], names=args.names,
                                          ignore_data_args=args.ignore_data_arg)
    except (OSError, ValueError) as error:
        _refuse(error)
    print(comparison.report(), flush=True)
    if args.out is not None:
        try:
            written, note = write_comparison(comparison, args.out, images=args.images, formats=formats)
        except OSError as error:
            _refuse(f"cannot write the comparison under --out {args.out}: {error}")
        if note:
            print(note)
        print("wrote " + ", ".join(str(path) for path in written), flush=True)
    else:
        print("(pass --out DIR to write the CSVs, the report and the figures)", file=sys.stderr)
    return comparison


def _refuse(message: object) -> NoReturn:
    raise SystemExit(f"lightning-nsv compare: error: {message}")


def _result_file(path: str) -> str:
    """``path``, or for a folder the one result ``.pt`` under it (backups and temporary files left out); a folder
    with none or several is refused with the files it holds."""
    folder = Path(path)
    if not folder.is_dir():
        return path
    found = sorted(str(p) for p in folder.rglob("*.pt") if not p.name.startswith("."))
    if len(found) == 1:
        print(f"{path} is a folder: comparing {found[0]}", file=sys.stderr)
        return found[0]
    if not found:
        _refuse(f"{path} is a folder without result files (*.pt, e.g. <log_dir>/nsv/support_vectors_epoch<E>.pt); "
                "pass the result files themselves")
    shown = ", ".join(found[:10]) + (f", … ({len(found)} in all)" if len(found) > 10 else "")
    _refuse(f"{path} is a folder holding {len(found)} result files ({shown}); pass the ones to compare")
