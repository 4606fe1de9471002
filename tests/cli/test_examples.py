"""Every example runs with ``--quick`` and writes its CSV, PNG and TensorBoard logs; the shared runner's helpers."""
from __future__ import annotations

import argparse
import importlib
import math
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_nsv.experiments import markdown_table, read_csv, summarise, write_csv
from tests.timeouts import timeout_for

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NAMES = ["sv_vs_m", "sv_vs_width", "sv_vs_depth", "bound_vs_depth", "cnn_fc_depth", "agreement_table",
         "random_labels", "unique_patterns", "decision_boundaries", "quadrant_weights"]


@pytest.fixture(scope="module")
def examples():
    sys.path.insert(0, str(EXAMPLES))
    yield lambda name: importlib.import_module(name)
    sys.path.remove(str(EXAMPLES))


@pytest.fixture(scope="module")
def cnn_run(examples, tmp_path_factory):
    out = tmp_path_factory.mktemp("cnn_fc_depth")
    return out, examples("cnn_fc_depth").main(["--quick", "--out", str(out)])


def _check_outputs(out: Path, name: str, summary: list[dict]) -> list[dict]:
    for suffix in (".csv", "_trials.csv", ".png", ".pdf"):
        assert (out / f"{name}{suffix}").stat().st_size > 0, f"{name}{suffix} missing"
    assert list((out / "tensorboard" / "summary").glob("events.out.tfevents.*"))
    rows = read_csv(out / f"{name}.csv")
    assert len(rows) == len(summary) >= 1
    return rows


@pytest.mark.parametrize("name", [n for n in NAMES if n != "cnn_fc_depth"])
def test_example_quick(examples, name, tmp_path):
    summary = examples(name).main(["--quick", "--out", str(tmp_path)])
    _check_outputs(tmp_path, name, summary)
    if name in ("decision_boundaries", "quadrant_weights", "sv_vs_m"):
        assert any(row["reached"] for row in summary), f"{name} --quick should reach zero training error"
    if name == "decision_boundaries":  # every set of the quick default, or the figure is half empty
        assert all(row["reached"] for row in summary), summary
    if name == "sv_vs_m":
        _check_summary_events(tmp_path, name)
    if name == "quadrant_weights":
        assert (tmp_path / "quadrant_weights_boundary.png").is_file()
        assert 0.5 < summary[0]["path_positive_mass_fraction"] <= 1


def _check_summary_events(out: Path, name: str) -> None:
    """The summary is figures with error bars and the table, no scalars over the swept parameter."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = (out / "tensorboard" / "summary").glob("events.out.tfevents.*")
    tags = EventAccumulator(str(events)).Reload().Tags()
    assert not tags["scalars"]
    assert {f"{name}/figure", f"{name}/sweep/support_fraction", f"{name}/sweep/n_support"} <= set(tags["images"])


def test_cnn_fc_depth_quick(cnn_run):
    out, summary = cnn_run
    rows = _check_outputs(out, "cnn_fc_depth", summary)
    assert [row["fc_depth"] for row in rows] == [1, 2]
    trials = read_csv(out / "cnn_fc_depth_trials.csv")
    assert all(row["zero_error"] for row in trials), "the quick CNN should reach zero training error"
    assert list((out / "tensorboard").glob("fc_depth=1-seed=0/events.out.tfevents.*"))


def test_agreement_table_reuses_cnn_trials(examples, cnn_run, tmp_path):
    out, _ = cnn_run
    summary = examples("agreement_table").main(
        ["--quick", "--out", str(tmp_path), "--from-trials", str(out / "cnn_fc_depth_trials.csv")])
    rows = _check_outputs(tmp_path, "agreement_table", summary)
    for row in rows:
        assert row["network_only"] + row["val_errors_both"] == pytest.approx(row["val_errors_network"])
        assert row["svm_only"] + row["val_errors_both"] == pytest.approx(row["val_errors_svm"])


def test_bound_vs_depth_reuses_depth_trials(examples, tmp_path):
    trials = [{"depth": d, "seed": s, "m": 100, "zero_error": 1, "n_support": 10 * d + s, "support_fraction": 0.1,
               "compression_bound": 2.0, "val_error_network": 0.1} for d in (1, 2) for s in (0, 1)]
    write_csv(trials, tmp_path / "depth_trials.csv")
    summary = examples("bound_vs_depth").main(
        ["--quick", "--out", str(tmp_path / "out"), "--from-trials", str(tmp_path / "depth_trials.csv")])
    assert [row["ns_over_m"] for row in summary] == [pytest.approx(16 * 10.5 / 100), pytest.approx(32 * 20.5 / 100)]


def test_script_entry_point_parses_flags():
    result = subprocess.run([sys.executable, str(EXAMPLES / "bound_vs_depth.py"), "--help"], capture_output=True,
                            text=True, cwd=EXAMPLES.parent, timeout=timeout_for(7))
    assert result.returncode == 0, result.stderr
    for flag in ("--out", "--trials", "--data-root", "--max-epochs", "--quick", "--from-trials"):
        assert flag in result.stdout


def test_mnist_without_root_is_a_usage_error(examples, tmp_path, capsys):
    with pytest.raises(SystemExit):
        examples("sv_vs_m").main(["--data", "mnist", "--out", str(tmp_path)])
    assert "--data-root" in capsys.readouterr().err


def test_summarise_averages_only_trials_at_zero_error():
    rows = [{"m": 10, "zero_error": 1, "n_support": 2.0}, {"m": 10, "zero_error": 1, "n_support": 4.0},
            {"m": 10, "zero_error": 0}, {"m": 20, "zero_error": 0}]
    summary = summarise(rows, ["m"], ["n_support"])
    assert summary[0] == {"m": 10, "trials": 3, "reached": 2, "n_support": 3.0, "n_support_std": 1.0}
    assert summary[1]["reached"] == 0 and math.isnan(summary[1]["n_support"])
    assert markdown_table(summary, {"m": "m", "n_support": "s"}).splitlines()[2:] == ["| 10 | 3 ± 1 |", "| 20 | — |"]


def test_csv_round_trip(tmp_path):
    rows = [{"a": 1, "b": 0.5, "c": "x"}, {"a": 2, "d": None}]
    assert read_csv(write_csv(rows, tmp_path / "r.csv")) == [{"a": 1, "b": 0.5, "c": "x", "d": None},
                                                             {"a": 2, "b": None, "c": None, "d": None}]


def test_parse_quick_means_one_trial(tmp_path):
    from lightning_nsv.experiments import example_parser, parse

    args = parse(example_parser("x", "doc"), ["--quick", "--trials", "3", "--out", str(tmp_path / "o")])
    assert isinstance(args, argparse.Namespace) and args.trials == 1 and args.batch_size == 20
    assert args.max_epochs == 100 and args.optimizer == "adam"
    assert (tmp_path / "o").is_dir()


def test_read_csv_parses_booleans(tmp_path):
    rows = read_csv(write_csv([{"random_labels": False, "m": 1}, {"random_labels": True, "m": 2}], tmp_path / "b.csv"))
    assert [row["random_labels"] for row in rows] == [False, True]


def test_figure_flags(tmp_path):
    from lightning_nsv.experiments import example_parser, figure_options, parse

    parser = example_parser("x", "doc")
    args = parse(parser, ["--out", str(tmp_path / "o")])
    assert figure_options(args) == {"formats": ("png", "pdf"), "dpi": 200}
    args = parse(parser, ["--out", str(tmp_path / "o"), "--format", "SVG, png", "--dpi", "300"])
    assert figure_options(args) == {"formats": ("svg", "png"), "dpi": 300}
    with pytest.raises(SystemExit):
        parse(parser, ["--out", str(tmp_path / "o"), "--format", "png,jpg"])


@pytest.mark.parametrize("name", ["sv_vs_m", "random_labels", "bound_vs_depth", "agreement_table",
                                  "unique_patterns"])
def test_replot_draws_the_summary_csv_again(examples, name, tmp_path):
    keys = {"random_labels": [{"random_labels": r, "m": m} for r in (False, True) for m in (100, 200)],
            "bound_vs_depth": [{"depth": d} for d in (1, 2)], "agreement_table": [{"fc_depth": d} for d in (1, 2)]}
    metrics = ["support_fraction", "n_support", "compression_bound", "ns_over_m", "val_error_network",
               "unique_patterns_train", "unique_patterns_val", "val_errors_network", "val_errors_svm",
               "val_errors_both", "val_agreement"]
    summary = [{**point, "trials": 3, "reached": 3, "n_val": 359,
                **{metric: 0.5 + k for metric in metrics}, **{f"{metric}_std": 0.1 for metric in metrics}}
               for k, point in enumerate(keys.get(name, [{"m": 100}, {"m": 200}]))]
    write_csv(summary, tmp_path / f"{name}.csv")
    examples(name).main(["--replot", "--out", str(tmp_path), "--format", "png,svg", "--dpi", "150"])
    assert (tmp_path / f"{name}.png").stat().st_size > 0 and (tmp_path / f"{name}.svg").stat().st_size > 0
    assert not (tmp_path / "tensorboard").exists() and not (tmp_path / f"{name}_trials.csv").exists()


def test_replot_without_csv_says_what_it_reads(examples, tmp_path):
    with pytest.raises(FileNotFoundError, match="sv_vs_width.csv"):
        examples("sv_vs_width").main(["--replot", "--out", str(tmp_path)])


def test_screenshot_tool_serves_on_localhost_only():
    sys.path.insert(0, str(EXAMPLES.parent / "tools"))
    try:
        tool = importlib.import_module("tensorboard_screenshots")
    finally:
        sys.path.remove(str(EXAMPLES.parent / "tools"))
    port = tool.free_port()
    command = tool.tensorboard_command("runs", port)
    assert command[command.index("--host") + 1] == "127.0.0.1" and "--bind_all" not in command
    assert command[command.index("--port") + 1] == str(port) and 1024 <= port < 65536
    with pytest.raises(ValueError, match="tabs can be"):
        tool.take_screenshots("runs", "out", tabs=["graphs"])


def test_max_margin_approach_quick(examples, tmp_path):
    """Both tasks train past zero training error, one CSV row per analysis, the figure and the fits."""
    result = examples("max_margin_approach").main(["--quick", "--out", str(tmp_path)])
    columns = {"epoch", "margin_ratio", "cosine_wbar_v", "n_support", "support_jaccard_previous",
               "patterns_changed", "train_loss"}
    for task in ("binary", "multiclass"):
        rows = read_csv(tmp_path / f"max_margin_approach_{task}.csv")
        assert rows, f"--quick {task} should reach zero training error and analyse"
        assert columns <= set(rows[0])
        assert [row["epoch"] for row in rows] == sorted(row["epoch"] for row in rows)
        assert all(0 < row["margin_ratio"] <= 1 + 1e-9 and -1 <= row["cosine_wbar_v"] <= 1 for row in rows)
        assert all(row["train_loss"] is not None and row["train_loss"] >= 0 for row in rows)
        if len(rows) > 1:
            assert rows[1]["patterns_changed"] is not None and 0 <= rows[1]["support_jaccard_previous"] <= 1
    assert len(result["fits"]) == 4 and {row["task"] for row in read_csv(tmp_path / "max_margin_approach_fit.csv")} \
        == {"binary", "multiclass"}
    for suffix in (".png", ".pdf"):
        assert (tmp_path / f"max_margin_approach{suffix}").stat().st_size > 0
    assert list((tmp_path / "tensorboard" / "summary").glob("events.out.tfevents.*"))
    assert list((tmp_path / "tensorboard" / "multiclass").glob("events.out.tfevents.*"))


def test_head_vs_whole_quick(examples, tmp_path):
    rows = examples("head_vs_whole").main(["--quick", "--out", str(tmp_path)])
    for suffix in (".csv", "_overlap.csv", ".md", ".png", ".pdf"):
        assert (tmp_path / f"head_vs_whole{suffix}").stat().st_size > 0, suffix
    assert read_csv(tmp_path / "head_vs_whole.csv") == rows
    assert [(r["network"], r["scope"]) for r in rows] == [("cnn_fc", "head only"), ("cnn_fc", "whole network"),
                                                          ("resnet", "whole network")]
    head, whole, resnet = rows
    assert head["bits_per_sv"] == 3 * 64  # the head's hidden units; the trunk is a fixed embedding
    assert whole["bits_per_sv"] > head["bits_per_sv"] and resnet["bits_per_sv"] > 0  # every gate and max-pool choice
    for row in rows:
        assert row["m"] == 200 and 1 <= row["n_support"] <= 200 and 0 < row["margin_ratio"] <= 1 + 1e-9
    overlap = read_csv(tmp_path / "head_vs_whole_overlap.csv")
    assert [(o["size_first"], o["size_second"]) for o in overlap] == [
        (head["n_support"], whole["n_support"]), (head["n_support"], resnet["n_support"]),
        (whole["n_support"], resnet["n_support"])]
    assert all(0 <= o["shared"] <= min(o["size_first"], o["size_second"]) for o in overlap)


@pytest.mark.parametrize("config", sorted((EXAMPLES / "configs").glob("*.yaml")), ids=lambda path: path.stem)
def test_every_shipped_config_logs_like_the_demo(config):
    """A TensorBoard logger under runs/<config name> without Lightning's hp_metric session: without it the logs went
    to ./lightning_logs, the package warned about its own config and HParams showed only `hp_metric -1`."""
    import yaml

    trainer = yaml.safe_load(config.read_text())["trainer"]
    logger = trainer.get("logger") or {}
    assert logger.get("class_path") == "TensorBoardLogger", f"{config.name}: no TensorBoard logger block"
    assert logger["init_args"] == {"save_dir": f"runs/{config.stem}", "name": "tensorboard",
                                   "default_hp_metric": False}, config.name
    assert trainer["default_root_dir"] == f"runs/{config.stem}", config.name
