"""Result files: atomic writes that survive a SIGKILL, pairs that belong together, loading and reproducing."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from lightning_nsv.artifacts import FORMAT_VERSION, ArtifactMismatchError, load_support_vectors, save_support_vectors
from lightning_nsv.atomic import torch_save, write_text
from lightning_nsv.kernel import PathNetwork
from tests.timeouts import timeout_for

KILLED_WRITER = textwrap.dedent("""
    import sys, torch
    from lightning_nsv.atomic import torch_save
    target = sys.argv[1]
    big = {"weights": torch.randn(64_000_000, dtype=torch.float32)}  # 256 MB: the write takes a while
    print("writing", flush=True)
    while True:
        torch_save(big, target)
""")


def test_a_process_killed_while_saving_leaves_the_previous_file_intact(tmp_path):
    target = tmp_path / "support_vectors_epoch3.pt"
    torch_save({"support": torch.arange(5)}, target)
    before = target.read_bytes()
    writer = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(target)], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "writing"
        deadline = time.monotonic() + timeout_for(1)  # the write begins at once on a quiet machine
        while not list(tmp_path.glob(".support_vectors_epoch3.pt.*.tmp")):  # the write has begun
            assert time.monotonic() < deadline and writer.poll() is None
            time.sleep(0.01)
        time.sleep(0.05)
        writer.send_signal(signal.SIGKILL)
    finally:
        writer.kill()
        writer.wait()
    # the previous result is whole (or the whole new one replaced it, never a part of it)
    assert target.read_bytes() == before or target.stat().st_size > 200_000_000
    loaded = torch.load(target, weights_only=True)
    assert "support" in loaded or loaded["weights"].numel() == 64_000_000


def test_a_failed_write_keeps_the_previous_text(tmp_path):
    target = tmp_path / "summary.json"
    write_text(target, '{"n_support": 3}')

    class Unserialisable:
        pass

    with pytest.raises(TypeError):
        from lightning_nsv.atomic import atomic_write

        atomic_write(target, lambda handle: handle.write(json.dumps({"x": Unserialisable()})), binary=False)
    assert json.loads(target.read_text()) == {"n_support": 3}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # no temporary file left behind


def _payload():
    net = PathNetwork.from_tensors([torch.randn(3, 2), torch.randn(1, 3)], None, [0.0], [1.0])
    return {
        "support": torch.tensor([0, 2]), "alpha": torch.tensor([0.5, 0.0, 0.25], dtype=torch.float64),
        "intercept": 0.0, "labels": torch.tensor([1.0, -1.0, 1.0], dtype=torch.float64),
        "network": {"weights": list(net.weights), "biases": None, "betas": [0.0], "gammas": [1.0]},
        "path_part": "Net.model", "path_module": None, "embedding": None, "module_class": None,
        "module_hparams": None, "module_state": {}, "data_class": None, "data_hparams": None,
        "train_indices": torch.tensor([4, 7, 9]), "epoch": 3, "global_step": 30,
        "solver": {"intercept": False, "C": 1e7, "kernel": "auto", "max_dense_bytes": 1 << 30},
        "metrics": {"n_support": 2.0, "kkt_residual": float("nan")},
    }


def test_saved_pair_loads_with_weights_only_and_shares_one_id(tmp_path):
    pt = save_support_vectors(tmp_path, "support_vectors_epoch3", _payload(), report="two support vectors")
    summary = json.loads(pt.with_suffix(".json").read_text())
    artifact = load_support_vectors(pt)
    assert summary["id"] == artifact.id and len(artifact.id) == 32
    assert summary["support"] == [0, 2] and summary["alpha_support"] == [0.5, 0.25]
    assert summary["metrics"]["kkt_residual"] == "nan"  # valid JSON, not a bare NaN
    assert artifact.network.hidden_widths == (3,) and artifact.epoch == 3 and artifact.m == 3
    assert load_support_vectors(tmp_path / "support_vectors_epoch3").id == artifact.id  # the stem works too


def test_a_pair_from_two_runs_is_refused(tmp_path):
    first = save_support_vectors(tmp_path / "a", "support_vectors_epoch3", _payload())
    second = save_support_vectors(tmp_path / "b", "support_vectors_epoch3", _payload())
    os.replace(second.with_suffix(".json"), first.with_suffix(".json"))
    with pytest.raises(ArtifactMismatchError, match=r"support_vectors_epoch3.json describes the result \w+…, but "
                                                    r".*support_vectors_epoch3.pt holds the result \w+…: the two "
                                                    "files come from two saves"):
        load_support_vectors(first)


def test_files_that_are_not_results_are_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="no support-vector result at"):
        load_support_vectors(tmp_path / "missing.pt")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(ArtifactMismatchError, match=f"is not a support-vector result of format 2–{FORMAT_VERSION}"):
        load_support_vectors(tmp_path / "other.pt")
