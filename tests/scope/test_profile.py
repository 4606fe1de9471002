"""The profile of support vectors along the depth (issue 44): every valid cut analysed as its own CutScope, the
support vectors shared with the next cut, the cost said first, the table, CSV, figure and TensorBoard run, and the
`lightning-nsv profile` command on a checkpoint of `lightning-nsv fit`."""
import csv
import json

import numpy as np
import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

from lightning_nsv.cli import main
from lightning_nsv.scope import AnalysisOptions, ScopeRequest, choose_scope
from lightning_nsv.scope.profile import support_vector_profile
from tests.kernel.test_pair_network import TinyResNet
from tests.analysis.test_whole_network import digits, train_to_zero_error


@pytest.fixture(scope="module")
def trained():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x, y, xv, yv = digits([3, 8], 80, 30)
    net = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(3, 3, 3, padding=1),
                        nn.ReLU(), nn.Flatten(), nn.Linear(48, 8), nn.ReLU(), nn.Linear(8, 1))
    yield train_to_zero_error(net, x, y).eval(), x, y, xv, yv
    torch.set_num_threads(threads)


def test_every_cut_is_its_own_analysis_and_shares_are_counted(trained):
    module, x, y, xv, yv = trained
    said = []
    profile = support_vector_profile(module, x, y, xv, yv, say=said.append)
    assert [r.cut for r in profile.rows] == ["input", "3", "6", "8"]
    assert [r.part for r in profile.rows] == ["whole", "whole", "head", "head"]
    assert all(line.startswith(f"cut {i} ") for i, line in enumerate(said[:4]))  # the costs first, then the fits
    assert "whole-network analysis of m = 80" in said[0] and "the head's kernel" in said[2]
    for row, following in zip(profile.rows, profile.rows[1:] + (None,)):
        scope = choose_scope(module, x, ScopeRequest(f"from:{row.cut}")).scope
        with torch.no_grad():
            alone = scope.analyse(scope.freeze(), scope.embed(x), y, scope.embed(xv), yv, AnalysisOptions())
        np.testing.assert_array_equal(profile.supports[row.cut], alone.svm.support_)
        assert (row.s, row.m, row.bound, row.margin_ratio) == (alone.n_support, 80, alone.bound, alone.margin_ratio)
        assert row.s_over_m == row.s / 80 and row.val_agreement == alone.val_agreement
        expected = None if following is None else len(set(alone.svm.support_) & set(profile.supports[following.cut]))
        assert row.shared_with_next == expected
    assert profile.rows[-1].bits == 0 and profile.rows[0].bits == 3 * 64 + 3 * 16 + 3 * 16 + 8


def test_the_outputs_are_written(trained, tmp_path):
    module, x, y, xv, yv = trained
    profile = support_vector_profile(module, x, y, xv, yv, cuts=["input", "8"], say=None)
    paths = profile.write(tmp_path)
    table = paths["table"].read_text()
    assert "| 0 | `input` | whole |" in table and "| 1 | `8` | head |" in table
    rows = list(csv.DictReader(paths["csv"].open()))
    assert [r["cut"] for r in rows] == ["input", "8"] and int(rows[1]["s"]) == profile.rows[1].s
    assert paths["figure"].stat().st_size > 10_000
    assert json.loads(paths["supports"].read_text()) == {k: v.tolist() for k, v in profile.supports.items()}
    events = EventAccumulator(str(paths["tensorboard"])).Reload()
    assert [e.step for e in events.Scalars("profile/s_over_m")] == [0, 1]
    assert events.Scalars("profile/s")[1].value == profile.rows[1].s


def test_a_crossed_cut_is_refused():
    module = TinyResNet().eval()
    x = torch.randn(6, 1, 8, 8)
    with pytest.raises(ValueError, match="cannot be cut at `conv2`"):
        support_vector_profile(module, x, torch.zeros(6), cuts=["conv2"], say=None)


def test_a_cut_over_the_time_budget_is_left_out_with_a_note(trained):
    module, x, y, _, _ = trained
    profile = support_vector_profile(module, x, y, cuts=["input", "8"], options=AnalysisOptions(time_budget=1e-6),
                                     say=None)
    assert profile.rows[0].note == "left out: over the time budget" and profile.rows[1].s > 0
    assert "left out" in profile.table()


def test_the_profile_command_on_a_checkpoint(tmp_path, capsys):
    config = {
        "seed_everything": 0,
        "model": {"class_path": "lightning_nsv.models.ConvFCNet",
                  "init_args": {"in_channels": 1, "image_size": 8, "fc_depth": 1, "fc_width": 16, "conv_channels": 4,
                                "optimizer": "adam", "lr": 0.01}},
        "data": {"class_path": "lightning_nsv.datamodules.DigitsDataModule",
                 "init_args": {"m": 60, "seed": 0, "batch_size": 20}},
        "trainer": {"max_epochs": 60, "accelerator": "cpu", "devices": 1, "enable_progress_bar": False,
                    "enable_model_summary": False, "default_root_dir": str(tmp_path),
                    "logger": {"class_path": "TensorBoardLogger",
                               "init_args": {"save_dir": str(tmp_path), "name": "tb"}}},
    }
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(config))
    main(["fit", "--config", str(tmp_path / "cfg.yaml")])
    checkpoint = next((tmp_path / "tb").rglob("*.ckpt"))
    capsys.readouterr()
    main(["profile", f"--ckpt_path={checkpoint}", "--cuts", "input,net.9", "--threads", "1"])
    printed = capsys.readouterr().out
    assert "| 0 | `input` | whole |" in printed and "| 1 | `net.9` | head |" in printed
    folder = checkpoint.parent.parent / "profile-epoch59"
    assert {p.name for p in folder.iterdir()} == {"profile.md", "profile.csv", "profile_supports.json", "profile.png",
                                                  "tensorboard"}
    main(["profile", f"--ckpt_path={checkpoint}", "--every_cut", "--out", str(tmp_path / "every")])
    assert "| 11 | `net.11` | head |" in capsys.readouterr().out  # input, net.1, …, net.11: every module's input
    with pytest.raises(SystemExit):
        main(["profile", f"--ckpt_path={checkpoint}", "--cuts", "net.99"])
    assert "no submodule 'net.99'" in capsys.readouterr().err


def test_the_depth_profile_example_quick(tmp_path):
    import importlib
    import sys
    from pathlib import Path

    examples = str(Path(__file__).parents[2] / "examples")
    sys.path.insert(0, examples)
    try:
        profiles = importlib.import_module("depth_profile").main(["--quick", "--out", str(tmp_path)])
    finally:
        sys.path.remove(examples)
    assert [r.cut for r in profiles["resnet"].rows] == ["input", "net.stages", "net.stages.2", "net.fc"]
    assert profiles["cnn_fc"].rows[3].cut == "net.9" and profiles["cnn_fc"].rows[3].part == "head"
    for name in ("depth_profile.md", "depth_profile.png", "depth_profile.pdf", "depth_profile_resnet.csv"):
        assert (tmp_path / name).stat().st_size > 0, name


def test_three_classes_count_the_class_bits():
    from tests.kernel.test_pair_network import randomise_bn
    from tests.analysis.test_whole_network import own_labels, two_classes

    torch.manual_seed(5)
    x = torch.randn(40, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    module = two_classes(randomise_bn(TinyResNet(), seed=4).eval(), x)
    profile = support_vector_profile(module, x, own_labels(module, x), say=None)
    assert [r.cut for r in profile.rows] == ["input", "conv1", "fc"]
    assert [r.bits for r in profile.rows] == [2 * 64 + 2 * 16 + 2 * 16 + 2, 2 * 16 + 2 * 16 + 2, 0 + 2]
    assert all(0 < r.s <= 40 for r in profile.rows)


def test_the_default_cuts_of_an_mlp_skip_the_flattened_input():
    from lightning_nsv.kernel.cut import valid_cuts
    from lightning_nsv.models import LeakyReLUMLP

    module = LeakyReLUMLP(in_features=10, widths=[8, 6])
    assert valid_cuts(module) == ["input", "net.3", "net.5"]  # net.1 reads the input flattened: the same kernel
    assert valid_cuts(module, every=True) == ["input", "net.1", "net.2", "net.3", "net.4", "net.5"]
