"""Support sets of several runs compared (``lightning_nsv.compare``, ``lightning-nsv compare``): against
python sets on synthetic result files, the refusals, multi-class results, the command and its figures."""
from __future__ import annotations

import csv
import itertools
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_nsv.artifacts import ArtifactMismatchError, save_support_vectors
from lightning_nsv.compare import (ImagesUnavailable, IncomparableRunsError, compare_support_sets, support_images,
                                   write_comparison)
from lightning_nsv.kernel import PathNetwork
from tests.timeouts import timeout_for

DIGITS = "lightning_nsv.datamodules.digits.DigitsDataModule"
DIGITS_ARGS = {"m": 60, "val_fraction": 0.2, "seed": 0, "random_labels": False, "label_noise": 0.0,
               "batch_size": 100, "num_workers": 0, "task": "binary"}


def _payload(support, train_indices, labels, *, alpha=None, data_class=DIGITS, data_hparams=None, epoch=5):
    """A result file's payload; ``support`` are positions in ``train_indices`` (binary α > 0 there)."""
    m = len(labels)
    if alpha is None:
        alpha = torch.zeros(m, dtype=torch.float64)
        alpha[torch.as_tensor(support, dtype=torch.int64)] = 1.0
    net = PathNetwork.from_tensors([torch.randn(3, 2, dtype=torch.float64), torch.randn(1, 3, dtype=torch.float64)],
                                   None, [0.0], [1.0])
    return {
        "support": torch.as_tensor(np.asarray(support, dtype=np.int64)), "alpha": alpha, "intercept": 0.0,
        "labels": torch.as_tensor(labels), "network": {"weights": list(net.weights), "biases": None, "betas": [0.0],
                                                        "gammas": [1.0]},
        "path_part": "Net.model", "path_module": None, "embedding": None, "module_class": None,
        "module_hparams": None, "module_state": {}, "data_class": data_class,
        "data_hparams": dict(DIGITS_ARGS if data_hparams is None else data_hparams),
        "train_indices": None if train_indices is None else torch.as_tensor(np.asarray(train_indices)),
        "epoch": epoch, "global_step": 10 * epoch, "solver": {}, "metrics": {},
    }


def _save(directory: Path, payload: dict) -> Path:
    return save_support_vectors(directory, f"support_vectors_epoch{payload['epoch']}", payload)


def _random_runs(tmp_path: Path, k: int, m: int, seed: int):
    """k result files on one training set (dataset indices drawn from 0..3m), each listing the samples in its own
    order, with random support sets; returns the paths and each run's support as a python set of dataset indices."""
    rng = np.random.default_rng(seed)
    indices = np.sort(rng.choice(3 * m, m, replace=False))
    label_of = {int(i): float(rng.choice([-1.0, 1.0])) for i in indices}
    paths, sets = [], []
    for r in range(k):
        order = rng.permutation(m) if r else np.arange(m)
        run_indices = indices[order]
        positions = np.flatnonzero(rng.random(m) < rng.uniform(0.1, 0.6))
        labels = torch.tensor([label_of[int(i)] for i in run_indices], dtype=torch.float64)
        paths.append(_save(tmp_path / f"run{r}", _payload(positions, run_indices, labels, epoch=r + 3)))
        sets.append({int(run_indices[p]) for p in positions})
    return paths, sets, indices


@pytest.mark.parametrize("k, m, seed", [(2, 30, 0), (3, 50, 1), (4, 40, 2), (5, 25, 3)])
def test_comparison_equals_python_sets(tmp_path, k, m, seed):
    paths, sets, indices = _random_runs(tmp_path, k, m, seed)
    comparison = compare_support_sets(paths)
    assert comparison.k == k and comparison.m == m and comparison.epochs == tuple(range(3, k + 3))
    assert comparison.n_support == tuple(len(s) for s in sets)
    assert comparison.support_fraction == tuple(len(s) / m for s in sets)
    assert [set(s.tolist()) for s in comparison.support] == sets
    for r, q in itertools.product(range(k), repeat=2):
        union = sets[r] | sets[q]
        expected = len(sets[r] & sets[q]) / len(union) if union else 1.0
        assert comparison.jaccard[r, q] == pytest.approx(expected, abs=1e-15)
    assert set(comparison.core.tolist()) == set.intersection(*sets)
    assert set(comparison.union.tolist()) == set.union(*sets)
    counts = {int(i): sum(int(i) in s for s in sets) for i in indices}
    assert dict(zip(comparison.train_indices.tolist(), comparison.frequency.tolist())) == counts
    assert comparison.in_runs.tolist() == [sum(c == n for c in counts.values()) for n in range(k + 1)]
    top = comparison.most_frequent(10).tolist()
    assert top == sorted((i for i in counts if counts[i]), key=lambda i: (-counts[i], i))[:10]
    metrics = comparison.to_metrics()
    assert metrics["core_size"] == len(set.intersection(*sets)) and metrics["runs"] == k
    assert metrics["jaccard_1_2"] == pytest.approx(comparison.jaccard[0, 1])
    assert metrics[f"in_runs_{k}"] == metrics["core_size"]
    report = comparison.report()
    every = "both" if k == 2 else f"all {k}"
    assert f"Core (a support vector in {every} runs): {len(set.intersection(*sets))} sample" in report
    assert "another order" in report  # the runs list the samples in other orders: said, and compared by index


def test_written_tables_hold_the_counts(tmp_path):
    paths, sets, indices = _random_runs(tmp_path, 3, 40, 7)
    comparison = compare_support_sets(paths, names=["a", "b", "c"])
    with comparison.to_csv(tmp_path / "runs.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [int(row["n_support"]) for row in rows] == [len(s) for s in sets]
    assert float(rows[0]["jaccard_2"]) == pytest.approx(len(sets[0] & sets[1]) / len(sets[0] | sets[1]))
    assert int(rows[2]["only_this_run"]) == len(sets[2] - sets[0] - sets[1])
    with comparison.samples_to_csv(tmp_path / "samples.csv").open() as handle:
        samples = list(csv.DictReader(handle))
    assert [int(row["dataset_index"]) for row in samples] == indices.tolist()
    for row in samples:
        i = int(row["dataset_index"])
        assert [int(row[f"sv_{n}"]) for n in "abc"] == [int(i in s) for s in sets]
        assert int(row["frequency"]) == sum(int(i in s) for s in sets)


def _digits_runs(tmp_path: Path, supports, **overrides):
    from lightning_nsv.datamodules import DigitsDataModule

    dm = DigitsDataModule(m=60, seed=0)
    dm.setup("fit")
    labels = torch.where(dm.train_dataset.tensors[1] > 0, 1.0, -1.0).to(torch.float64)
    return [_save(tmp_path / f"run{r}", _payload(support, dm.train_indices, labels, epoch=r + 1, **overrides))
            for r, support in enumerate(supports)], dm


def test_refusals_name_both_files_and_the_difference(tmp_path):
    (a, b), dm = _digits_runs(tmp_path, [[0, 1, 2], [1, 2, 3]])
    labels = torch.where(dm.train_dataset.tensors[1] > 0, 1.0, -1.0).to(torch.float64)
    other_indices = dm.train_indices.clone()
    other_indices[5] = 1500 if 1500 not in dm.train_indices else 1501
    cases = {
        "indices": (_payload([0, 1], other_indices, labels), r"training indices differ \(dataset index"),
        "seed": (_payload([0, 1], dm.train_indices, labels, data_hparams={**DIGITS_ARGS, "seed": 1}),
                 "data-module argument seed=0 vs 1"),
        "class": (_payload([0, 1], dm.train_indices, labels, data_class="my.Data"),
                  f"data module {DIGITS} vs my.Data"),
        "m": (_payload([0, 1], dm.train_indices[:50], labels[:50]), "m = 60 vs 50 training samples"),
        "labels": (_payload([0, 1], dm.train_indices, -labels), "training labels differ at 60 samples"),
        "unrecorded": (_payload([0, 1], None, labels), r"training indices recorded in \S*run0/support_vectors_epoch1.pt only"),
    }
    for name, (payload, message) in cases.items():
        other = _save(tmp_path / name, payload)
        with pytest.raises(IncomparableRunsError, match=message) as error:
            compare_support_sets([a, b, other])
        assert str(a) in str(error.value) and str(other) in str(error.value)
    with pytest.raises(ValueError, match=r"at least 2 result files, got 1 \(.*run0"):
        compare_support_sets([a])
    with pytest.raises(ValueError, match=r"at least 2 result files, got 1 \(.*run0"):
        compare_support_sets(str(a))  # one path, not a list of its characters
    with pytest.raises(ValueError, match="at least 2 result files, got 0"):
        compare_support_sets([])
    with pytest.raises(FileNotFoundError, match="no support-vector result at .*nowhere"):
        compare_support_sets([a, tmp_path / "nowhere.pt"])
    with pytest.raises(ValueError, match="are the same result .* pass each run once"):
        compare_support_sets([a, b, a.with_suffix(".json")])
    broken = tmp_path / "broken.pt"
    torch.save({"support": [1]}, broken)
    with pytest.raises(ArtifactMismatchError, match="is not a support-vector result"):
        compare_support_sets([a, broken])
    garbage = tmp_path / "garbage.pt"
    garbage.write_text("not a torch file")
    with pytest.raises(ArtifactMismatchError, match=r"garbage\.pt"):
        compare_support_sets([a, garbage])


def test_loader_arguments_may_differ_and_are_noted(tmp_path):
    mean = {"mean": torch.tensor([0.5, 0.25])}  # a tensor argument, equal in both runs
    (a,), dm = _digits_runs(tmp_path / "a", [[0, 1, 2]], data_hparams={**DIGITS_ARGS, **mean})
    (b,), _ = _digits_runs(tmp_path / "b", [[2, 3]], data_hparams={**DIGITS_ARGS, **mean, "batch_size": 20})
    comparison = compare_support_sets([a, b])
    assert comparison.jaccard[0, 1] == pytest.approx(1 / 4)
    assert comparison.notes == (f"{b} against {a}: data-module argument batch_size=100 vs 20 (allowed: it does not "
                                "change the samples)",)
    assert "data-module argument batch_size=100 vs 20 (allowed" in comparison.report()
    with pytest.raises(IncomparableRunsError, match="batch_size=100 vs 20"):
        compare_support_sets([a, b], ignore_data_args=())


def test_multiclass_results_count_samples_with_any_pair_alpha(tmp_path):
    rng = np.random.default_rng(4)
    m, k = 30, 4
    indices = np.arange(100, 100 + m)
    labels = torch.as_tensor(rng.integers(0, k, m))
    sets, paths = [], []
    for r in range(3):
        alpha = torch.zeros(m, k, dtype=torch.float64)
        for i in rng.choice(m, 12, replace=False):  # one pair each; some on the own class (α stays 0 there)
            cls = int(rng.integers(0, k))
            if cls != int(labels[i]):
                alpha[i, cls] = rng.uniform(0.1, 1.0)
        support = np.flatnonzero((alpha > 0).any(1).numpy())
        sets.append({int(indices[i]) for i in support})
        paths.append(_save(tmp_path / f"mc{r}", _payload(support, indices, labels, alpha=alpha,
                                                          data_hparams={**DIGITS_ARGS, "task": "multiclass"})))
    comparison = compare_support_sets(paths)
    assert [set(s.tolist()) for s in comparison.support] == sets
    assert set(comparison.core.tolist()) == set.intersection(*sets)
    assert comparison.jaccard[0, 2] == pytest.approx(len(sets[0] & sets[2]) / len(sets[0] | sets[2]))
    assert sorted(set(comparison.labels.tolist())) <= list(range(k))
    binary = _save(tmp_path / "binary", _payload([0], indices, torch.ones(m, dtype=torch.float64)))
    with pytest.raises(IncomparableRunsError, match="task='multiclass' vs 'binary'"):
        compare_support_sets([paths[0], binary])


def test_command_prints_the_table_and_writes_csv_report_and_figures(tmp_path, capsys):
    from lightning_nsv.cli import main

    paths, dm = _digits_runs(tmp_path, [[0, 1, 2, 3, 4, 5], [3, 4, 5, 6], [4, 5, 6, 7, 8]])
    out = tmp_path / "cmp"
    main(["compare", *map(str, paths), "--out", str(out), "--images", "6"])
    printed = capsys.readouterr().out
    assert "Support sets of 3 runs on one training set (DigitsDataModule, m = 60" in printed
    assert "| run 1 | " in printed and "| run 1 | 1.000 | 0.429 | 0.222 |" in printed  # |{3,4,5}| / |{0..6}| = 3/7
    assert "Core (a support vector in all 3 runs): 2 samples" in printed
    assert "| 3 | 2 |" in printed and "| 1 | 5 |" in printed  # the frequency histogram: 4, 5 in all; 0,1,2,7,8 in one
    for name in ("compare.csv", "compare_samples.csv", "compare.md", "compare.png", "compare_frequent.png"):
        assert (out / name).stat().st_size > 0, name
    assert "wrote " in printed and "no image grid" not in printed
    x, shown = support_images(compare_support_sets(paths), 3)
    assert x.shape == (3, 1, 8, 8) and shown.tolist() == dm.train_indices[[4, 5, 3]].tolist()
    assert torch.equal(x[0], dm.train_dataset.tensors[0][4])  # the image of the sample, found by dataset index


def test_command_refusal_exits_with_the_message(tmp_path, capsys):
    from lightning_nsv.cli import main

    (a,), dm = _digits_runs(tmp_path / "a", [[0, 1]])
    (b,), _ = _digits_runs(tmp_path / "b", [[1]], data_hparams={**DIGITS_ARGS, "m": 60, "seed": 3})
    with pytest.raises(SystemExit, match=r"lightning-nsv compare: error: .* are not runs on the same training "
                                         r"samples: data-module argument seed=0 vs 3") as error:
        main(["compare", str(a), str(b), "--out", str(tmp_path / "cmp")])
    assert error.value.code != 0 and not (tmp_path / "cmp").exists()
    with pytest.raises(SystemExit, match="at least 2 result files, got 1"):
        main(["compare", str(a)])
    with pytest.raises(SystemExit, match="no support-vector result at"):
        main(["compare", str(a), str(tmp_path / "missing.pt")])
    with pytest.raises(SystemExit):
        main(["compare", str(a), str(a), "--format", "png,gif"])
    assert "--format can be png, pdf, svg" in capsys.readouterr().err


def test_the_console_script_dispatches_compare(tmp_path):
    import subprocess

    paths, _ = _digits_runs(tmp_path, [[0, 1], [1, 2]])
    done = subprocess.run([sys.executable, "-c", "from lightning_nsv.cli import main; main()", "compare",
                           *map(str, paths)], capture_output=True, text=True, timeout=timeout_for(13))
    assert done.returncode == 0, done.stderr
    assert "| run 1 | 1.000 | 0.333 |" in done.stdout and "pass --out DIR" in done.stderr


def test_no_image_grid_for_flat_inputs_or_data_that_cannot_be_rebuilt(tmp_path):
    from lightning_nsv.datamodules import Toy2DDataModule

    toy = Toy2DDataModule(m=20, seed=0)
    toy.setup("fit")
    labels = torch.where(toy.train_dataset.tensors[1] > 0, 1.0, -1.0).to(torch.float64)
    args = dict(toy.hparams)
    paths = [_save(tmp_path / f"toy{r}", _payload(s, toy.train_indices, labels, data_hparams=args,
                                                  data_class="lightning_nsv.datamodules.synthetic.Toy2DDataModule"))
             for r, s in enumerate([[0, 1], [1, 2]])]
    written, note = write_comparison(compare_support_sets(paths), tmp_path / "toy")
    assert note.startswith("no image grid: Toy2DDataModule's inputs are flat ((2,))") and "\n" not in note
    assert {p.name for p in written} == {"compare.csv", "compare_samples.csv", "compare.md", "compare.png"}
    mnist = {"root": str(tmp_path / "no_mnist"), "download": False, **DIGITS_ARGS}
    paths = [_save(tmp_path / f"mnist{r}", _payload(s, torch.arange(60), labels.repeat(3), data_hparams=mnist,
                                                    data_class="lightning_nsv.datamodules.mnist.BinaryMNISTDataModule"))
             for r, s in enumerate([[0, 1], [1, 2]])]
    with pytest.raises(ImagesUnavailable, match=r"^BinaryMNISTDataModule cannot be rebuilt here \(FileNotFoundError"):
        support_images(compare_support_sets(paths))
    unrecorded = [_save(tmp_path / f"none{r}", _payload(s, None, labels, data_class=None)) for r, s in
                  enumerate([[0], [1]])]
    comparison = compare_support_sets(unrecorded)
    assert not comparison.indices_recorded and "positions compared" in comparison.report()
    assert write_comparison(comparison, tmp_path / "none")[1] == (
        "no image grid: the result files record no data module to read the inputs from")


def test_stability_figure_annotates_every_pair():
    from lightning_nsv.plotting import plot_jaccard_matrix, plot_support_stability, plt

    jaccard = np.array([[1.0, 0.29, 0.31], [0.29, 1.0, 0.27], [0.31, 0.27, 1.0]])
    fig, (heat, bars) = plot_support_stability(jaccard, ["run 1", "run 2", "run 3"], [1700, 150, 90, 60],
                                               chance=0.06)
    assert sorted(t.get_text() for t in heat.texts) == sorted(f"{v:.2f}" for v in jaccard.ravel())
    assert "mean 0.29" in heat.get_title() and "0.06" in heat.get_title()
    assert [t.get_text() for t in bars.texts] == ["150", "90", "60"] and "core (in all 3 runs): 60" in bars.get_title()
    plt.close(fig)
    with pytest.raises(ValueError, match="must be 2x2 for 2 names, got shape"):
        plot_jaccard_matrix(jaccard, ["a", "b"])


def test_example_trains_seeds_on_one_training_set_and_compares_them(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    try:
        import support_stability
    finally:
        sys.path.pop(0)
    comparison = support_stability.main(["--quick", "--m", "60", "--out", str(tmp_path), "--format", "png"])
    assert comparison.k == 2 and comparison.m == 60 and comparison.names == ("seed 0", "seed 1")
    assert all(n > 0 for n in comparison.n_support)
    for name in ("support_stability.csv", "support_stability_samples.csv", "support_stability.md",
                 "support_stability.png", "support_stability_frequent.png"):
        assert (tmp_path / name).stat().st_size > 0, name


def test_the_comparison_imports_no_lightning():
    import subprocess

    code = ("import sys, lightning_nsv.analysis; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_for(10),
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr
