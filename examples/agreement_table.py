"""Table II of Snyder & Vishwanath: on validation data, how often a CNN + FC network and the max-margin classifier
in its path space agree, and whether they misclassify the same samples (network only, SVM only, both), for
several FC depths. Same networks as ``cnn_fc_depth.py`` (Figure 4).

    python examples/agreement_table.py         # bundled 8×8 digits, FC depth 1 ... 5
    python examples/agreement_table.py --from-trials runs/cnn_fc_depth/cnn_fc_depth_trials.csv   # no retraining
    python examples/agreement_table.py --data cifar --data-root data --lr 0.005 --fc-depths 3 4 5 6 7 8
"""
from __future__ import annotations

from functools import partial

from cnn_fc_depth import HEAD, parser_for

from lightning_nsv.experiments import cnn_point, parse, sweep_and_report
from lightning_nsv.plotting import agreement_counts, error_bar_caption, plot_agreement

NAME = "agreement_table"
TABLE = {"fc_depth": "FC depth", "reached": "trials at zero error", "val_error_network": "val error network",
         "val_error_svm": "val error SVM", "val_agreement": "agreement", "network_only": "wrong: network only",
         "svm_only": "wrong: SVM only", "val_errors_both": "wrong: both", "n_val": "val samples"}


def figure(summary: list[dict]):
    for row in summary:
        row.update({k: v for k, v in agreement_counts(row).items() if k in ("network_only", "svm_only")})
    caption = error_bar_caption(summary, "fc_depth").replace("mean ± 1 sd", "bars: mean")
    return plot_agreement([row["fc_depth"] for row in summary], [agreement_counts(row) for row in summary],
                          caption=caption)[0]


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse(parser_for(NAME, __doc__), argv)
    if args.quick:
        args.fc_depths, args.m, args.width = [1, 2], args.m or 60, 16
    return sweep_and_report(args, NAME, [{"fc_depth": d} for d in args.fc_depths], partial(cnn_point, args),
                            figure, TABLE, callback_options=HEAD)


if __name__ == "__main__":
    main()
