"""Figure 7 of Snyder & Vishwanath: decision boundaries of a network and of the max-margin classifier in its path
space, side by side over a grid, on 2-D toy data (9 hidden layers of widths 4, 6, 8, 10, 12, 14, 16, 20, 30;
Leaky-ReLU 0.1 with biases, as a bias-free network's boundaries are rays through the origin). The classifier is
evaluated through the path kernel between grid points and the support vectors only.

    python examples/decision_boundaries.py                        # moons, circles, xor; 3 trials each
    python examples/decision_boundaries.py --sets spirals --n-samples 600 --max-epochs 1000
"""
from __future__ import annotations

from lightning_nsv.datamodules import TOY_SETS
from lightning_nsv.experiments import (
    SUMMARY_METRICS,
    Trial,
    example_parser,
    make_datamodule,
    make_model,
    parse,
    sweep_and_report,
)
from lightning_nsv.extract import find_path_part
from lightning_nsv.plotting import data_extent, decision_grid, plot_decision_boundaries, plt

NAME = "decision_boundaries"
NOISE = {"blobs": 0.5, "moons": 0.1, "circles": 0.05, "xor": 0.0, "spirals": 0.02}
TABLE = {"set": "data set", "reached": "trials at zero error", "zero_error_epoch": "epochs", "n_support": "s",
         "support_fraction": "s/m", "grid_agreement": "agreement on grid", "val_agreement": "val agreement",
         "val_error_network": "val error network", "val_error_svm": "val error SVM"}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = example_parser(NAME, __doc__, from_trials=False, data=("toy",), max_epochs=600, beta=0.1, bias=True,
                            optimizer="adam", lr=0.005, batch_size=50)
    parser.add_argument("--sets", nargs="+", choices=list(TOY_SETS), default=["moons", "circles", "xor"])
    parser.add_argument("--widths", type=int, nargs="+", default=[4, 6, 8, 10, 12, 14, 16, 20, 30])
    parser.add_argument("--n-samples", type=int, default=300, help="samples per set (20%% held out)")
    parser.add_argument("--resolution", type=int, default=150, help="grid points per axis")
    args = parse(parser, argv)
    if args.quick:
        # 60 moons samples did not reach zero error in 100 epochs of the 9-layer net; 120 do within 200
        args.sets, args.n_samples, args.resolution, args.max_epochs = ["blobs", "moons"], 120, 40, 200
    shown: dict[str, tuple] = {}

    def build(point: dict, seed: int):
        datamodule = make_datamodule("toy", name=point["set"], n_samples=args.n_samples, noise=NOISE[point["set"]],
                                     seed=args.data_seed, batch_size=args.batch_size)
        return (lambda: make_model("mlp", datamodule, widths=args.widths, beta=args.beta, bias=args.bias,
                                   optimizer=args.optimizer, lr=args.lr, momentum=args.momentum)), datamodule

    def on_trial(trial: Trial) -> None:
        if not trial.reached:
            return
        x, y = trial.datamodule.train_dataset.tensors
        svm = trial.analysis.svm
        extent = data_extent(x)
        grid = decision_grid(find_path_part(trial.model).path_network(), x[svm.support_], y[svm.support_],
                             svm.alpha_[svm.support_], svm.intercept_, extent=extent, resolution=args.resolution)
        trial.metrics["grid_agreement"] = grid.agreement
        shown.setdefault(trial.params["set"], (grid, x, y, svm.support_, trial.seed))

    def figure(summary: list[dict]):
        fig, axes = plt.subplots(len(args.sets), 2, figsize=(7.5, 4.0 * len(args.sets)), squeeze=False)
        for axes_row, name in zip(axes, args.sets):
            if name not in shown:
                for ax in axes_row:
                    ax.axis("off")
                axes_row[0].set_title(f"{name}: no trial reached zero training error", fontsize=9)
                continue
            grid, x, y, support, seed = shown[name]
            plot_decision_boundaries(grid, x, y, support, axes=axes_row,
                                     titles=(f"{name}: network (seed {seed})",
                                             f"max-margin, agreement {100 * grid.agreement:.2f}%"))
        fig.tight_layout()
        return fig

    return sweep_and_report(args, NAME, [{"set": name} for name in args.sets], build, figure, TABLE,
                            metrics=(*SUMMARY_METRICS, "grid_agreement"), on_trial=on_trial)


if __name__ == "__main__":
    main()
