"""Figure 10 of Snyder & Vishwanath: s/m with random labels (each training label a fair coin flip, fixed before
training) against the true labels, as m grows (ReLU MLP, 3 hidden layers of width 64, no biases).

    python examples/random_labels.py           # bundled digits, m = 100 ... 800
    python examples/random_labels.py --data mnist --data-root data --m-values 1000 2000 5000 10000
"""
from __future__ import annotations

from functools import partial

from lightning_nsv.experiments import example_parser, mlp_point, parse, sweep_and_report
from lightning_nsv.plotting import CARD_WIDTH, LEGEND_SIZE, error_bar_caption, plot_sweep, plt

NAME = "random_labels"
M_VALUES = {"digits": [100, 200, 400, 800], "mnist": [1000, 2000, 5000, 10000]}
TABLE = {"random_labels": "random labels", "m": "m", "reached": "trials at zero error", "zero_error_epoch": "epochs",
         "n_support": "s", "support_fraction": "s/m", "val_error_network": "val error"}


def figure(summary: list[dict], title: str):
    fig, ax = plt.subplots(figsize=(CARD_WIDTH, 3.4))
    for random, label in ((False, "true labels"), (True, "random labels")):
        rows = [row for row in summary if bool(row["random_labels"]) == random]
        plot_sweep(rows, "m", {"support_fraction": label}, xlabel="training samples m",
                   ylabel="support vectors s / m", logx=True, title=title, ax=ax)
    ax.set_ylim(0, 1)
    ax.legend(fontsize=LEGEND_SIZE, title=error_bar_caption(summary), title_fontsize=LEGEND_SIZE)
    return fig


def main(argv: list[str] | None = None) -> list[dict]:
    parser = example_parser(NAME, __doc__, max_epochs=600, width=64)
    parser.add_argument("--m-values", type=int, nargs="+", help="training set sizes (default per data set)")
    args = parse(parser, argv)
    values = args.m_values or ([40] if args.quick else M_VALUES[args.data])
    grid = [{"random_labels": random, "m": m} for random in (False, True) for m in values]
    return sweep_and_report(args, NAME, grid, partial(mlp_point, args),
                            lambda summary: figure(summary, f"{args.data}: {args.depth}×{args.width} MLP"), TABLE)


if __name__ == "__main__":
    main()
