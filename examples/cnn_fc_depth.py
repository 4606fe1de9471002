"""Figure 4 of Snyder & Vishwanath: support vectors of a CNN + FC network against the number of fully connected
layers ("FC depth") after the convolutional trunk (3 conv layers of 64 3×3 filters with 2×2 max-pooling between
them; FC width 64; Leaky-ReLU 0.1; biases). The flattened trunk output is the input of path space (the callback's
``scope="head"``; its default analyses the whole CNN).

    python examples/cnn_fc_depth.py            # bundled 8×8 digits, FC depth 1 ... 5
    python examples/cnn_fc_depth.py --data cifar --data-root data --lr 0.005 --fc-depths 3 4 5 6 7 8

Its ``cnn_fc_depth_trials.csv`` also feeds ``agreement_table.py --from-trials`` (Table II) without retraining.
"""
from __future__ import annotations

from functools import partial

from lightning_nsv.experiments import cnn_point, example_parser, parse, report_sweep

NAME = "cnn_fc_depth"
HEAD = {"scope": "head"}  # the paper's protocol: the FC head after the trunk as a fixed embedding
CNN_DEFAULTS = dict(data=("digits", "mnist", "cifar"), max_epochs=400, width=64, beta=0.1, bias=True, lr=0.01)
TABLE = {"fc_depth": "FC depth", "reached": "trials at zero error", "zero_error_epoch": "epochs",
         "n_support": "s", "support_fraction": "s/m", "val_error_network": "val error",
         "val_agreement": "val agreement"}


def parser_for(name: str, doc: str):
    """The flags of the FC-depth sweep (shared with ``agreement_table.py``)."""
    parser = example_parser(name, doc, **CNN_DEFAULTS)
    parser.add_argument("--fc-depths", type=int, nargs="+", default=[1, 2, 3, 4, 5], help="FC depths")
    return parser


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse(parser_for(NAME, __doc__), argv)
    if args.quick:
        args.fc_depths, args.m, args.width = [1, 2], args.m or 60, 16
    return report_sweep(args, NAME, "fc_depth", args.fc_depths, partial(cnn_point, args), TABLE,
                        series={"n_support": "s"}, xlabel="FC depth", ylabel="support vectors s",
                        title=f"{args.data}: CNN + FC (width {args.width})", callback_options=HEAD)


if __name__ == "__main__":
    main()
