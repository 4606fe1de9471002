"""The skip-network demo's case where the theory holds (issue 33): rank Ψ = N and the escape-path certificate
certifies no bad valley, in ``examples/skip_networks.py --cases full_rank`` and in
``examples/configs/skip_digits_full_rank.yaml``; and the deep case beside it, where rank Ψ < N.

The full-size cases with few epochs: Ψ of the shallow network has rank N from its initialisation on (σ_min
about 2.5e-5 against a rank tolerance near 6e-12), so a few epochs show the same verdicts as 200.
"""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_nsv.analysis import escape_path, psi_spectrum
from lightning_nsv.cli import main as cli_main
from lightning_nsv.experiments import read_csv
from lightning_nsv.models.skip import SkipNetwork

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "configs" / "skip_digits_full_rank.yaml"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("skip_networks_example", ROOT / "examples" / "skip_networks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tolerance(n: int, m: int, sigma_max: float) -> float:
    """The monitors' rank tolerance, DESIGN §3."""
    return sigma_max * max(n, m) * torch.finfo(torch.float64).eps


@pytest.mark.filterwarnings("ignore:LossValleyMonitor.:UserWarning")
def test_full_rank_case_of_the_example_certifies_no_bad_valley(example, tmp_path):
    # the default full_rank sizes (N = 150, 2x128 sigmoid, 128 skip units), 3 epochs instead of 200
    rows = example.main(["--cases", "full_rank", "--epochs", "3", "--check-every", "3", "--surface-points", "0",
                         "--threads", "0", "--out", str(tmp_path)])
    assert [(r["case"], r["mode"]) for r in rows] == [("full_rank", m) for m in ("original", "skip_rand", "skip_sgd")]
    original, *skips = rows
    for row in skips:
        assert (row["N"], row["M"]) == (150, 256)
        assert row["psi_rank"] == row["N"] and row["psi_full_rank"] == 1, row
        assert row["psi_sigma_min"] > 1e3 * _tolerance(row["N"], row["M"], row["psi_sigma_max"]), row
        assert row["escape_applies"] == 1 and row["escape_in_sublevel_set"] == 1 and row["assumption31"] == 1, row
        assert row["escape_residual"] < 1e-8, row
        assert row["escape_target_loss"] == pytest.approx(math.log(2) / row["N"] / 2, rel=1e-6)  # ε/2, ε = log(2)/N
        assert row["escape_max_loss"] <= max(row["escape_start_loss"], row["escape_target_loss"]) * (1 + 1e-9)
        assert row["escape_verdict"] == "holds: no bad valley"
        assert row["escape_target_norm"] < 1e7  # far from the deep case's 1e11: Ψ is well away from singular
    assert skips[0]["train_acc"] == 1.0  # the convex skip_rand problem fits the training set (3 L-BFGS steps)
    # the same network without its skip units: M = 128 < N, so rank Ψ < N and the certificate does not apply
    assert original["M"] == 128 and original["psi_rank"] == 128 and original["escape_applies"] == 0
    assert original["escape_verdict"] == "does not apply"
    csv = read_csv(tmp_path / "skip_networks.csv")
    assert [r["case"] for r in csv] == ["full_rank"] * 3 and "escape_target_norm" in csv[0]
    assert (tmp_path / "skip_networks.png").stat().st_size > 0
    for run in ("full_rank-original", "full_rank-skip_rand", "full_rank-skip_sgd", "summary"):
        assert list((tmp_path / "tensorboard" / run).glob("events.out.tfevents.*")), run


def test_full_rank_config_certifies_no_bad_valley(tmp_path):
    config = yaml.safe_load(CONFIG.read_text())
    assert config["model"]["init_args"]["net"]["widths"] == [128, 128] and config["data"]["init_args"]["m"] == 150
    config["trainer"].update(max_epochs=4, default_root_dir=str(tmp_path), enable_progress_bar=False)
    config["trainer"]["logger"]["init_args"]["save_dir"] = str(tmp_path)
    for callback in config["trainer"]["callbacks"]:
        callback["init_args"]["every_n_epochs"] = 2
    config["trainer"]["callbacks"][1]["init_args"]["surface_points"] = 0
    short = tmp_path / "skip_full_rank.yaml"
    short.write_text(yaml.safe_dump(config))
    cli_main(["fit", "--config", str(short)])
    version = next((tmp_path / "tensorboard").glob("version_*"))
    events = EventAccumulator(str(version)).Reload()

    def last(tag: str) -> float:
        return events.Scalars(tag)[-1].value

    n, m = last("psi/num_samples"), last("psi/num_units")
    assert (n, m) == (150, 256)
    assert last("psi/rank") == n and last("psi/full_rank") == 1.0
    assert last("psi/sigma_min") > 1e3 * _tolerance(int(n), int(m), last("psi/sigma_max"))
    assert last("valley/escape_applies") == 1.0 and last("valley/escape_in_sublevel_set") == 1.0
    assert last("valley/assumption31_satisfied") == 1.0
    assert last("valley/escape_target_loss") == pytest.approx(math.log(2) / n / 2, rel=1e-5)
    assert last("valley/escape_max_loss") <= max(last("valley/escape_start_loss"),
                                                 last("valley/escape_target_loss")) * (1 + 1e-6)


def test_deep_case_is_rank_deficient_at_initialisation():
    """The deep case beside it (8x64 sigmoid, N = 400, N skip units; skip_rand keeps these weights): M >= N but
    rank Ψ < N, and V* from the least-squares solve has a large residual and an enormous norm."""
    from lightning_nsv.experiments import make_datamodule

    dm = make_datamodule("digits", m=400, seed=0, batch_size=50, task="multiclass")
    dm.setup("fit")
    x, y = dm.train_dataset.tensors
    model = SkipNetwork.mlp(64, [64] * 8, 10, "sigmoid", num_skip_units=400, mode="skip_rand", skip_seed=0)
    psi = model.psi(x)
    spectrum = psi_spectrum(psi, "full")
    assert psi.shape == (400, 464) and spectrum.rank < 400
    path = escape_path(psi, model.output_weights()[0], y, math.log(2) / 400)
    assert not path.applies and path.residual > 1e-2 and path.target_norm > 1e9
