"""``lightning-nsv compare`` refuses by name: folders given for result files, ``--images`` below 0, an ``--out``
that is a file; a folder with one result file stands for it."""
from __future__ import annotations

import pytest

from lightning_nsv.compare.cli import main
from tests.compare.test_compare import _digits_runs


def test_folders_with_one_result_file_stand_for_it(tmp_path, capsys):
    paths, _ = _digits_runs(tmp_path, [[0, 1], [1, 2]])
    comparison = main([str(tmp_path / "run0"), str(tmp_path / "run1")])
    assert comparison.paths == tuple(map(str, paths))
    assert f"{tmp_path / 'run0'} is a folder: comparing {paths[0]}" in capsys.readouterr().err


def test_folders_with_several_or_no_result_files_are_listed(tmp_path):
    paths, _ = _digits_runs(tmp_path / "runs", [[0, 1], [1, 2]])
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match=r"^lightning-nsv compare: error: .*runs is a folder holding 2 result "
                                         r"files \(.*run0/support_vectors_epoch1\.pt, .*run1/support_vectors_epoch2"
                                         r"\.pt\); pass the ones to compare") as error:
        main([str(tmp_path / "runs"), str(paths[0])])
    assert "no support-vector result at" not in str(error.value.code)
    with pytest.raises(SystemExit, match=r"error: .*empty is a folder without result files \(\*\.pt"):
        main([str(paths[0]), str(tmp_path / "empty")])


def test_negative_images_is_a_usage_error(tmp_path, capsys):
    paths, _ = _digits_runs(tmp_path, [[0, 1], [1, 2]])
    with pytest.raises(SystemExit) as error:
        main([*map(str, paths), "--images", "-3", "--out", str(tmp_path / "cmp")])
    assert error.value.code == 2 and "--images must be 0 (no image grid) or more, got -3" in capsys.readouterr().err
    assert not (tmp_path / "cmp").exists()


def test_out_that_is_a_file_or_under_one_is_refused(tmp_path):
    paths, _ = _digits_runs(tmp_path, [[0, 1], [1, 2]])
    taken = tmp_path / "taken"
    taken.write_text("keep")
    with pytest.raises(SystemExit, match=r"^lightning-nsv compare: error: --out .*taken is a file, not a folder"):
        main([*map(str, paths), "--out", str(taken)])
    with pytest.raises(SystemExit, match=r"^lightning-nsv compare: error: cannot write the comparison under --out "
                                         r".*taken/sub: "):
        main([*map(str, paths), "--out", str(taken / "sub")])
    assert taken.read_text() == "keep"
