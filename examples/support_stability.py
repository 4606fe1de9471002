"""Are the network support vectors the same from one initialisation to the next? (issue 33)

Trains ``--trials`` seeds (default 3) of one ReLU MLP on the same training samples (``--data-seed`` fixes the split
and the subset; the seed changes the initialisation and the batch order), each to its first zero-error epoch with
:class:`~lightning_nsv.callbacks.NetworkSupportVectors`, and compares the saved result files with
:func:`lightning_nsv.compare.compare_support_sets` (what ``lightning-nsv compare`` does): s and s/m per run, the
pairwise Jaccard overlap of the support sets, the core (support vectors in every run) and how many runs share each
support vector.

    python examples/support_stability.py                        # digits, 3×16 ReLU MLP, m = 1438, seeds 0, 1, 2
    python examples/support_stability.py --results examples/results
    python examples/support_stability.py --data mnist --data-root data --m 2000 --trials 5

Writes under ``--results`` (default ``--out``): ``support_stability.csv`` (one row per run: s, s/m, its support
vectors in the core and in no other run, its row of the Jaccard matrix), ``support_stability_samples.csv`` (per
training sample: in how many runs, and which, it is a support vector), ``support_stability.md`` (the report),
``support_stability.png``/``.pdf`` (Jaccard heat map; samples by the number of runs that share them) and
``support_stability_frequent.png``/``.pdf`` (the most frequent support vectors as images). Each run's TensorBoard
logs and result files are under ``--out/tensorboard/seed=<k>/`` (compare them again with
``lightning-nsv compare --out DIR <out>/tensorboard/seed=*/nsv/*.pt``).
"""
from __future__ import annotations

import time
from pathlib import Path

from lightning_nsv.compare import SupportSetComparison, compare_support_sets, write_comparison
from lightning_nsv.experiments import callback_kwargs, example_parser, mlp_point, parse, run_trial, seeds

NAME = "support_stability"


def main(argv: list[str] | None = None) -> SupportSetComparison:
    parser = example_parser(NAME, __doc__, from_trials=False, max_epochs=400)
    parser.add_argument("--results", default=None, help="directory of the tables and figures (default: --out)")
    parser.add_argument("--images", type=int, default=16, help="most frequent support vectors drawn as images")
    args = parse(parser, argv)
    if args.quick:  # parse() keeps one trial for --quick; a comparison needs two
        args.trials, args.m = 2, args.m or 100
    if args.trials < 2:
        parser.error(f"--trials must be at least 2 to compare support sets, got {args.trials}")
    start = time.perf_counter()
    paths, names, datamodule = [], [], None
    for seed in seeds(args):
        make, datamodule = mlp_point(args, {}, seed)
        trial = run_trial(make, datamodule, seed=seed, params={}, out=args.out, max_epochs=args.max_epochs,
                          callback_kwargs=callback_kwargs(args))
        print(trial.describe().removeprefix(", "), flush=True)  # no swept parameter to name
        if trial.reached:
            stem = f"support_vectors_epoch{trial.zero_error_epoch}"
            paths.append(Path(args.out) / "tensorboard" / f"seed={seed}" / "nsv" / f"{stem}.pt")
            names.append(f"seed {seed}")
    if len(paths) < 2:
        raise SystemExit(f"{NAME}: only {len(paths)} of {args.trials} runs reached zero training error within "
                         f"--max-epochs {args.max_epochs}; raise --max-epochs or --lr to compare support sets")
    comparison = compare_support_sets(paths, names=names)
    results = Path(args.results or args.out)
    written, note = write_comparison(comparison, results, NAME, images=args.images, datamodule=datamodule,
                                     formats=args.format, dpi=args.dpi)
    print("\n" + comparison.report())
    if note:
        print(note)
    print(f"\n{NAME}: {len(paths)} runs compared in {time.perf_counter() - start:.0f} s; wrote "
          + ", ".join(str(p) for p in written), flush=True)
    return comparison


if __name__ == "__main__":
    main()
