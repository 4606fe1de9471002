"""Figure 2 of Snyder & Vishwanath: s/m against the width of a ReLU MLP with 3 hidden layers (no biases).

    python examples/sv_vs_width.py             # bundled digits, all 1438 training samples, widths 16 ... 256
    python examples/sv_vs_width.py --data mnist --data-root data --m 20000 --widths 8 16 32 64 128
"""
from __future__ import annotations

from functools import partial

from lightning_nsv.experiments import example_parser, mlp_point, parse, report_sweep

NAME = "sv_vs_width"
TABLE = {"width": "width Ω", "reached": "trials at zero error", "zero_error_epoch": "epochs", "n_support": "s",
         "support_fraction": "s/m", "val_agreement": "val agreement"}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = example_parser(NAME, __doc__, max_epochs=400)
    parser.add_argument("--widths", type=int, nargs="+", default=[16, 32, 64, 128, 256], help="hidden widths")
    args = parse(parser, argv)
    if args.quick:
        args.widths, args.m = [16, 32], args.m or 60
    return report_sweep(args, NAME, "width", args.widths, partial(mlp_point, args), TABLE,
                        series={"support_fraction": "s/m"}, xlabel="hidden width Ω", ylabel="support vectors s / m",
                        logx=True, title=f"{args.data}: {args.depth} hidden layers")


if __name__ == "__main__":
    main()
