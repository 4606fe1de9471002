import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lightning_nsv.artifacts import load_support_vectors, reproduce
from tests.timeouts import timeout_for


@pytest.mark.parametrize("kind", ["mlp", "cnn", "cut"])
def test_two_ranks_agree_and_only_rank_zero_fits_the_svm(tmp_path, kind):
    """An MLP: the head's code path; a CNN: the whole network, or from a cut at its second convolution. Either way rank 1 computes its shard of the rows of
    the kernel columns rank 0's solver asks for."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    script = Path(__file__).parents[1] / "ddp_fit.py"
    done = subprocess.run([sys.executable, str(script), str(tmp_path), kind], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout_for(15))
    assert done.returncode == 0, done.stderr[-3000:]
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert rank0["zero_error_epoch"] is not None
    assert rank0["zero_error_epoch"] == rank1["zero_error_epoch"]
    assert rank0["stopped_after"] == rank1["stopped_after"] == rank0["zero_error_epoch"] + 1
    assert rank0["metrics"] == rank1["metrics"] and rank0["metrics"]["n_support"] > 0
    assert rank0["analysed_here"] and not rank1["analysed_here"]
    assert rank0["served"] == [] and len(rank1["served"]) == 1 and rank1["served"][0] > 0  # rank 1's column blocks
    if kind != "mlp":  # the cut: the gates after the first convolution, its max pool
        assert rank0["metrics"]["scope_gates"] == 4 * (64 + 16 + 16 + 4 + 4) + 16 - 4 * (64 + 16) * (kind == "cut")
    assert rank0["val_loss"] == rank1["val_loss"]  # an epoch aggregate synchronised across ranks
    results = list((tmp_path / "nsv").glob("*.pt"))
    assert len(results) == 1
    # one process on the same frozen weights gives the same support set, α and numbers
    artifact = load_support_vectors(results[0])
    assert artifact.scope == {"mlp": "head", "cnn": "whole", "cut": "cut"}[kind]
    single = reproduce(artifact)
    assert torch.equal(torch.from_numpy(single.svm.support_), artifact.support)
    torch.testing.assert_close(torch.from_numpy(single.svm.alpha_), artifact.alpha, rtol=1e-10, atol=0)
    assert rank0["metrics"] == pytest.approx(single.to_metrics(), rel=1e-10)


def _psi_ranks(tmp_path, mode):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    script = Path(__file__).parents[1] / "ddp_psi_fit.py"
    done = subprocess.run([sys.executable, str(script), str(tmp_path), mode], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout_for(12))
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((tmp_path / f"psi_rank{r}.json").read_text()) for r in (0, 1)]


def test_psi_monitor_on_two_ranks_goes_on_past_a_diverged_network(tmp_path):
    rank0, rank1 = _psi_ranks(tmp_path, "diverge")
    seen = f"rank 0: {rank0}, rank 1: {rank1}"  # what each rank wrote, for a failure that does not repeat
    for rank in (rank0, rank1):  # the same state on both: the result of epoch 0, no result at epochs 1 and 2
        assert rank["raised"] is None and rank["epochs"] == 3, seen
        assert rank["last_epoch"] == 0 and rank["failed_epoch"] == 2 and rank["last_metrics"]["rank"] == 40.0, seen
    assert rank0["last_metrics"] == rank1["last_metrics"], seen
    assert len(rank0["warnings"]) == 1 and "no analysis at epoch 1" in rank0["warnings"][0], seen
    assert rank1["warnings"] == [], seen  # rank-zero warning


def test_psi_monitor_error_on_rank_zero_is_raised_on_both_ranks(tmp_path):
    rank0, rank1 = _psi_ranks(tmp_path, "error")
    assert rank0["raised"] == "MemoryError: no room for Ψ"
    assert rank1["raised"] == "RuntimeError: PsiRankMonitor failed on rank 0: MemoryError: no room for Ψ"
