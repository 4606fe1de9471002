"""Table 6 of Snyder & Vishwanath: the number of distinct activation patterns (all hidden ReLU slopes of a sample)
on the training and the test set, as the number m of training samples grows (ReLU MLP, 3 hidden layers, no
biases; counted at the first zero-error epoch). The paper used width 10 on MNIST; on the 1438 digits a width-10
ReLU network often stalls short of zero training error, so the default is the width 16 of ``sv_vs_m.py``, whose
trials (same seeds, same settings) this example can reuse with ``--from-trials``.

    python examples/unique_patterns.py         # bundled digits (359 test samples), m = 100 ... 1438
    python examples/unique_patterns.py --from-trials runs/sv_vs_m/sv_vs_m_trials.csv        # no retraining
    python examples/unique_patterns.py --data mnist --data-root data --width 10 --m-values 1000 2000 5000 10000 20000
"""
from __future__ import annotations

from functools import partial

from sv_vs_m import parse_m_sweep

from lightning_nsv.experiments import mlp_point, sweep_and_report
from lightning_nsv.plotting import plot_unique_patterns

NAME = "unique_patterns"
TABLE = {"m": "m", "reached": "trials at zero error", "unique_patterns_train": "patterns (train)",
         "unique_patterns_val": "patterns (test)", "n_val": "test samples", "n_support": "s"}


def _test_size(summary: list[dict]) -> int | None:
    sizes = [row["n_val"] for row in summary if row.get("reached")]
    return int(sizes[0]) if sizes else None


def main(argv: list[str] | None = None) -> list[dict]:
    args, values = parse_m_sweep(NAME, __doc__, argv)
    return sweep_and_report(
        args, NAME, [{"m": m} for m in values], partial(mlp_point, args),
        lambda summary: plot_unique_patterns(summary, n_test=_test_size(summary))[0], TABLE,
    )


if __name__ == "__main__":
    main()
