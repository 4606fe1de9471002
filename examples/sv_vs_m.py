"""Figure 1 of Snyder & Vishwanath: the fraction s/m of training samples that are network support vectors, against
the number m of training samples (ReLU MLP, 3 hidden layers of width 16, no biases, retrained from scratch for each m).

    python examples/sv_vs_m.py                 # bundled digits (0-4 vs 5-9), m = 100 ... 1438, 3 trials each
    python examples/sv_vs_m.py --data mnist --data-root data --m-values 1000 2000 5000 10000 20000

Its ``sv_vs_m_trials.csv`` also feeds ``unique_patterns.py --from-trials`` (Table 6) without retraining.
"""
from __future__ import annotations

import argparse
from functools import partial

from lightning_nsv.experiments import example_parser, mlp_point, parse, report_sweep

NAME = "sv_vs_m"
M_VALUES = {"digits": [100, 200, 400, 800, 1438], "mnist": [1000, 2000, 5000, 10000, 20000]}
TABLE = {"m": "m", "reached": "trials at zero error", "zero_error_epoch": "epochs", "n_support": "s",
         "support_fraction": "s/m", "val_agreement": "val agreement"}


def parse_m_sweep(name: str, doc: str, argv: list[str] | None) -> tuple[argparse.Namespace, list[int]]:
    """The flags and the m values of an m sweep (shared with ``unique_patterns.py``)."""
    parser = example_parser(name, doc, max_epochs=400)
    parser.add_argument("--m-values", type=int, nargs="+", help="training set sizes (default per data set)")
    args = parse(parser, argv)
    return args, args.m_values or ([30, 60] if args.quick else M_VALUES[args.data])


def main(argv: list[str] | None = None) -> list[dict]:
    args, values = parse_m_sweep(NAME, __doc__, argv)
    return report_sweep(args, NAME, "m", values, partial(mlp_point, args), TABLE, series={"support_fraction": "s/m"},
                        xlabel="training samples m", ylabel="support vectors s / m", logx=True,
                        title=f"{args.data}: {args.depth}×{args.width} MLP")


if __name__ == "__main__":
    main()
