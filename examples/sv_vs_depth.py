"""Figure 3 of Snyder & Vishwanath: s/m against the depth of a ReLU MLP of width 16 (no biases).

    python examples/sv_vs_depth.py             # bundled digits, all 1438 training samples, depths 1 ... 6
    python examples/sv_vs_depth.py --data mnist --data-root data --m 20000 --depths 1 2 3 4 5 6

Its ``sv_vs_depth_trials.csv`` also feeds ``bound_vs_depth.py --from-trials`` (Figure 5) without retraining.
"""
from __future__ import annotations

from functools import partial

from lightning_nsv.experiments import example_parser, mlp_point, parse, report_sweep

NAME = "sv_vs_depth"
DEPTHS = [1, 2, 3, 4, 5, 6]
TABLE = {"depth": "depth d", "reached": "trials at zero error", "zero_error_epoch": "epochs", "n_support": "s",
         "support_fraction": "s/m", "val_agreement": "val agreement"}


def parser_for(name: str, doc: str):
    """The flags of the depth sweep (shared with ``bound_vs_depth.py``)."""
    parser = example_parser(name, doc, max_epochs=500, lr=0.02)
    parser.add_argument("--depths", type=int, nargs="+", default=DEPTHS, help="numbers of hidden layers")
    return parser


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse(parser_for(NAME, __doc__), argv)
    if args.quick:
        args.depths, args.m = [1, 3], args.m or 60
    return report_sweep(args, NAME, "depth", args.depths, partial(mlp_point, args), TABLE,
                        series={"support_fraction": "s/m"}, xlabel="hidden layers d", ylabel="support vectors s / m",
                        title=f"{args.data}: width {args.width}")


if __name__ == "__main__":
    main()
