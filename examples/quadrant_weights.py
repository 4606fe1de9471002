"""Figures 8-9 of Snyder & Vishwanath: on quadrant data (label +1 in the positive quadrant, -1 in the negative one,
so every y·x is positive) the max-margin assumption implies that every path weight w̄_p is positive. A 2-4-4-1
Leaky-ReLU (0.1) network without biases, small initialisation, full-batch gradient descent; the signs of w̄ are
summed over all paths without materialising them, after the last step.

The paper used a truncated normal initialisation of standard deviation 0.025, learning rate 0.005 and 15,000
steps; here the initialisation is normal (std ``--init-std``) and the default learning rate is larger so that
2,000 steps suffice. Larger initialisations leave a few small wrong-signed paths (compare ``--init-stds``).

    python examples/quadrant_weights.py                           # 2-4-4-1, init std 0.025 and 0.1, 3 trials
    python examples/quadrant_weights.py --lr 0.005 --max-epochs 15000 --init-stds 0.025  # the paper's recipe
"""
from __future__ import annotations

from lightning_nsv.experiments import (
    Trial,
    example_parser,
    make_datamodule,
    make_model,
    parse,
    sweep_and_report,
)
from lightning_nsv.extract import find_path_part
from lightning_nsv.plotting import data_extent, decision_grid, plot_decision_boundaries, plot_path_weights

NAME = "quadrant_weights"
TABLE = {"init_std": "init std", "reached": "trials at zero error", "path_positive_count_fraction": "paths w̄ > 0",
         "path_positive_mass_fraction": "path mass w̄ > 0", "n_support": "s", "margin_ratio": "margin ratio",
         "cosine_wbar_v": "cos(w̄, v)"}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = example_parser(NAME, __doc__, from_trials=False, data=("quadrant",), max_epochs=2000, beta=0.1,
                            bias=False, lr=0.2, momentum=0.0, batch_size=250)
    parser.add_argument("--widths", type=int, nargs="+", default=[4, 4], help="hidden widths")
    parser.add_argument("--init-stds", type=float, nargs="+", default=[0.025, 0.1], help="initial weight std")
    parser.add_argument("--n-samples", type=int, default=250, help="samples (20%% held out); batch = all")
    args = parse(parser, argv)
    if args.quick:
        args.init_stds, args.max_epochs, args.n_samples = [0.1], 150, 60
    shown: dict[str, tuple] = {}

    def build(point: dict, seed: int):
        datamodule = make_datamodule("quadrant", n_samples=args.n_samples, seed=args.data_seed,
                                     batch_size=max(args.batch_size, args.n_samples))
        return (lambda: make_model("mlp", datamodule, widths=args.widths, beta=args.beta, bias=args.bias,
                                   init_std=point["init_std"], optimizer=args.optimizer, lr=args.lr,
                                   momentum=args.momentum)), datamodule

    def on_trial(trial: Trial) -> None:
        if trial.reached and "weights" not in shown:
            net = find_path_part(trial.model).path_network()
            x, y = trial.datamodule.train_dataset.tensors
            svm = trial.analysis.svm
            grid = decision_grid(net, x[svm.support_], y[svm.support_], svm.alpha_[svm.support_], svm.intercept_,
                                 extent=data_extent(x), resolution=120)
            shown["weights"] = plot_path_weights(net, trial.analysis.signs)[0]
            shown["_boundary"] = plot_decision_boundaries(grid, x, y, svm.support_)[0]

    def figure(summary: list[dict]):
        return {"" if key == "weights" else key: fig for key, fig in shown.items()}

    return sweep_and_report(args, NAME, [{"init_std": s} for s in args.init_stds], build, figure, TABLE,
                            max_epochs=args.max_epochs, check_every=args.max_epochs, val_every=args.max_epochs,
                            on_trial=on_trial)


if __name__ == "__main__":
    main()
