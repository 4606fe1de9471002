"""The examples refuse what they cannot use, as argparse refuses a flag, before anything under ``--out`` is
written: ``--from-trials`` CSVs that are missing, empty or of another sweep, an empty ``--replot`` CSV,
``--threads 0``."""
from __future__ import annotations

import argparse

import pytest

from lightning_nsv.experiments import example_parser, parse, read_trials, usage_error, write_csv
from tests.cli.test_examples import examples  # noqa: F401  (a fixture: imports the example scripts)

WIDTH_TRIALS = [{"width": 16, "seed": 0, "zero_error": 1, "n_support": 10}]


def _earlier_results(out):
    """An earlier run's files under ``out``, which a refusal must leave as they are."""
    files = {out / name: f"earlier {name}" for name in ("sv_vs_m.csv", "sv_vs_m_trials.csv", "sv_vs_m.png")}
    for path, text in files.items():
        path.write_text(text)
    return files


def _refused(capsys, run) -> str:
    with pytest.raises(SystemExit) as exit_:
        run()
    assert exit_.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("content, said", [("", "is empty (no header, no rows)"),
                                           ("m,seed,zero_error\n", "holds a header (m, seed, zero_error) and no rows")])
def test_from_trials_without_rows_is_refused_before_writing(examples, tmp_path, capsys, content, said):
    trials = tmp_path / "empty_trials.csv"
    trials.write_text(content)
    out = tmp_path / "out"
    out.mkdir()
    files = _earlier_results(out)
    err = _refused(capsys, lambda: examples("sv_vs_m").main(["--from-trials", str(trials), "--out", str(out)]))
    assert f"error: --from-trials: {trials} {said}" in err and "usage:" in err
    assert {path: path.read_text() for path in files} == files
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in files)  # no tensorboard/, no PDF


def test_from_trials_of_another_sweep_names_the_missing_columns(examples, tmp_path, capsys):
    trials = write_csv(WIDTH_TRIALS, tmp_path / "sv_vs_width_trials.csv")
    out = tmp_path / "out"
    out.mkdir()
    files = _earlier_results(out)
    err = _refused(capsys, lambda: examples("sv_vs_m").main(["--from-trials", str(trials), "--out", str(out)]))
    assert f"{trials} lacks the column m: expected m, zero_error, found width, seed, zero_error, n_support" in err
    assert {path: path.read_text() for path in files} == files
    err = _refused(capsys, lambda: examples("bound_vs_depth").main(
        ["--from-trials", str(trials), "--out", str(tmp_path / "bound")]))
    assert "lacks the columns depth, m: expected depth, m, zero_error" in err
    assert not (tmp_path / "bound" / "bound_vs_depth.csv").exists()


def test_from_trials_summary_csv_or_missing_file_is_refused(examples, tmp_path, capsys):
    summary = write_csv([{"m": 100, "trials": 3, "reached": 3}], tmp_path / "sv_vs_m.csv")
    err = _refused(capsys, lambda: examples("unique_patterns").main(
        ["--from-trials", str(summary), "--out", str(tmp_path / "o")]))
    assert "lacks the column zero_error: expected m, zero_error, found m, trials, reached" in err
    missing = tmp_path / "missing_trials.csv"
    err = _refused(capsys, lambda: examples("sv_vs_m").main(["--from-trials", str(missing), "--out", str(tmp_path)]))
    assert f"--from-trials: there is no file {missing}" in err


def test_replot_of_a_csv_without_rows_is_refused(examples, tmp_path, capsys):
    (tmp_path / "sv_vs_m.csv").write_text("m,trials,reached\n")
    err = _refused(capsys, lambda: examples("sv_vs_m").main(["--replot", "--out", str(tmp_path)]))
    assert f"--replot: {tmp_path / 'sv_vs_m.csv'} holds a header (m, trials, reached) and no rows" in err
    assert not (tmp_path / "sv_vs_m.png").exists()
    write_csv([{"width": 16, "trials": 1, "reached": 1}], tmp_path / "sv_vs_m.csv")
    err = _refused(capsys, lambda: examples("sv_vs_m").main(["--replot", "--out", str(tmp_path)]))
    assert "lacks the column m: expected m, found width, trials, reached" in err


@pytest.mark.parametrize("threads", ["0", "-2"])
def test_threads_must_be_positive(tmp_path, capsys, threads):
    err = _refused(capsys, lambda: parse(example_parser("x", "doc"), ["--threads", threads, "--out", str(tmp_path)]))
    assert f"--threads must be a positive integer, got {threads}" in err


def test_read_trials_without_the_parser_exits_with_the_message(tmp_path):
    (tmp_path / "t.csv").write_text("")
    args = argparse.Namespace(from_trials=[str(tmp_path / "t.csv")])
    with pytest.raises(SystemExit, match=r"^error: --from-trials: .*t\.csv is empty"):
        read_trials(args, ["m"])
    with pytest.raises(SystemExit, match="^error: plain"):
        usage_error(argparse.Namespace(), "plain")
