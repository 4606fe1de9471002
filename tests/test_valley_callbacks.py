"""PsiRankMonitor and LossValleyMonitor in a Trainer: logged keys and values, figures, skipping, state, errors."""
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_nsv.callbacks.loss_valley import LossValleyMonitor
from lightning_nsv.callbacks.psi_rank import PsiRankMonitor
from lightning_nsv.compat import pl
from lightning_nsv.models.skip import SkipNetwork
from lightning_nsv.valley import psi_spectrum

PSI_KEYS = {f"psi/{k}" for k in ("rank", "sigma_min", "sigma_max", "condition_number", "num_samples", "num_units",
                                 "full_rank")}
VALLEY_KEYS = {f"valley/{k}" for k in (
    "mean_loss", "max_loss", "lemma21_threshold", "num_losses_ge_log2", "lemma21_certified", "per_sample_certified",
    "escape_start_loss", "escape_target_loss", "escape_max_loss", "escape_residual", "escape_applies",
    "escape_in_sublevel_set", "escape_convexity_gap", "escape_target_norm", "surface_center_loss",
    "surface_min_loss", "surface_max_loss", "assumption31_analytic_increasing", "assumption31_skip_activation",
    "assumption31_m_ge_n", "assumption31_num_duplicates", "assumption31_satisfied")}


def _data(n=20):
    g = torch.Generator().manual_seed(0)
    return torch.rand(n, 1, 4, 4, generator=g), torch.randint(3, (n,), generator=g)


def _model(activation="softplus", skip=16, mode="skip_sgd"):
    return SkipNetwork.mlp(16, [8, 8, 8], 3, activation, num_skip_units=skip, mode=mode, skip_seed=0, lr=0.05)


def _fit(model, callbacks, tmp_path=None, max_epochs=1, figures=None, **kwargs):
    x, y = _data()
    logger = pl.loggers.TensorBoardLogger(tmp_path, name="tb") if tmp_path is not None else False
    if figures is not None:
        logger.experiment.add_figure = lambda tag, fig, global_step=None, close=True: figures.append(tag)
    trainer = pl.Trainer(max_epochs=max_epochs, logger=logger, callbacks=callbacks, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, **kwargs)
    trainer.fit(model, DataLoader(TensorDataset(x, y), batch_size=10, shuffle=True))
    return trainer, x, y


def test_psi_rank_monitor_logs_the_spectrum(tmp_path):
    model, figures = _model(), []
    monitor = PsiRankMonitor()
    trainer, x, _ = _fit(model, [monitor], tmp_path, max_epochs=2, figures=figures)
    assert PSI_KEYS <= set(trainer.callback_metrics)
    expected = psi_spectrum(model.psi(x)).to_metrics()
    assert monitor.last_epoch == 1 and monitor.last_metrics == pytest.approx(expected)
    assert float(trainer.callback_metrics["psi/rank"]) == expected["rank"]
    assert (expected["num_samples"], expected["num_units"]) == (20.0, 24.0)
    assert figures == ["psi/spectrum"] * 2


def test_psi_rank_monitor_streams_when_psi_exceeds_the_limit():
    model = _model()
    monitor = PsiRankMonitor(max_memory_bytes=16 * 20 * 20, log_figure=False)  # < 8·N·M: R of Ψᵀ, chunks of 20
    _, x, _ = _fit(model, [monitor])
    assert monitor.last_metrics == pytest.approx(psi_spectrum(model.psi(x)).to_metrics(), rel=1e-8)
    with pytest.raises(ValueError, match=r"even its 20x20 R factor with as many buffered rows .* exceeds "
                                         r"max_memory_bytes=100"):
        _fit(_model(), [PsiRankMonitor(max_memory_bytes=100)])


def test_loss_valley_monitor_certificates(tmp_path):
    model, figures = _model(), []
    monitor = LossValleyMonitor(surface_points=3, path_points=5)
    trainer, x, y = _fit(model, [monitor], tmp_path, figures=figures)
    assert VALLEY_KEYS <= set(trainer.callback_metrics) and set(monitor.last_metrics) == {
        k.removeprefix("valley/") for k in VALLEY_KEYS}
    m = monitor.last_metrics
    with torch.no_grad():
        loss = F.cross_entropy(model(x), y).item()
    assert m["mean_loss"] == pytest.approx(loss, rel=1e-5) and m["escape_start_loss"] == pytest.approx(m["mean_loss"])
    assert m["surface_center_loss"] == pytest.approx(loss, rel=1e-5)
    assert m["lemma21_threshold"] == pytest.approx(0.6931471805599453 / 20)
    assert m["escape_in_sublevel_set"] == 1.0 and m["escape_max_loss"] == pytest.approx(m["mean_loss"])
    assert m["escape_applies"] == 1.0  # this Ψ (20x24) has rank 20
    assert m["escape_target_loss"] == pytest.approx(0.6931471805599453 / 40, rel=1e-6)  # ε/2 with ε = log2/N
    assert m["assumption31_satisfied"] == 1.0 and monitor.checks.reasons == ()
    assert figures == ["valley/escape_path", "valley/loss_surface"]
    assert model.training  # the slice evaluates in eval mode and restores the mode


def test_loss_valley_monitor_reports_failed_assumptions():
    model = _model("relu", skip=0, mode="original")  # ReLU and M = 8 < N = 20: rank Ψ < N
    monitor = LossValleyMonitor(surface_points=0, log_figure=False)
    with pytest.warns(UserWarning) as record:
        trainer, _, _ = _fit(model, [monitor])
    text = "\n".join(str(w.message) for w in record)
    assert "LossValleyMonitor: Assumption 3.1 of Nguyen et al. (2019) does not hold for this SkipNetwork (mode " \
           "'original'), so Theorem 3.4 does not apply" in text
    assert "Assumption 3.1.1: relu is not real analytic" in text
    assert "M >= N: only M = 8 skip units for N = 20 training samples" in text
    assert re.search(r"the escape-path certificate does not apply: Ψ V\* = Y t\* has relative residual \S+ "
                     r"\(Ψ is 20x8; it needs rank Ψ = N\)", text)
    m = monitor.last_metrics
    assert m["assumption31_analytic_increasing"] == m["assumption31_m_ge_n"] == m["escape_applies"] == 0.0
    assert "valley/surface_center_loss" not in trainer.callback_metrics


class _Plain(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.layer(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("callback", [PsiRankMonitor, LossValleyMonitor])
def test_callbacks_reject_other_modules(callback):
    expected = (f"{callback.__name__} works on a lightning_nsv.models.skip.SkipNetwork "
                r"\(it reads Ψ, the outputs of the skip units\), got _Plain; wrap your network")
    with pytest.raises(TypeError, match=expected):
        _fit(_Plain(), [callback()])


def test_argument_errors():
    for kwargs, name in (({"every_n_epochs": 0}, "every_n_epochs"), ({"batch_size": -1}, "batch_size"),
                         ({"max_memory_bytes": 0}, "max_memory_bytes")):
        for cls in (PsiRankMonitor, LossValleyMonitor):
            value = list(kwargs.values())[0]
            with pytest.raises(ValueError, match=f"`{name}` must be a positive integer, got {value}"):
                cls(**kwargs)
    with pytest.raises(ValueError, match=r"`eps` must be > 0 \(the loss at V\* is eps/2\) or None for log\(2\)/N"):
        LossValleyMonitor(eps=0)
    with pytest.raises(ValueError, match="`path_points` must be >= 2 \\(both ends of the path\\), got 1"):
        LossValleyMonitor(path_points=1)
    with pytest.raises(ValueError, match="`surface_points` must be 0 \\(no slice\\) or >= 2, got 1"):
        LossValleyMonitor(surface_points=1)
    with pytest.raises(ValueError, match="`surface_span` must be > 0, got -1"):
        LossValleyMonitor(surface_span=-1)
    with pytest.raises(ValueError, match=r"LossValleyMonitor holds Ψ \(20x24, 0.0 MiB in float64\), more than "
                                         r"max_memory_bytes=100; raise the limit or train on fewer samples"):
        _fit(_model(), [LossValleyMonitor(max_memory_bytes=100)])


def test_schedule_fast_dev_run_and_state():
    psi, valley = PsiRankMonitor(every_n_epochs=2), LossValleyMonitor(every_n_epochs=2, surface_points=0)
    trainer, _, _ = _fit(_model(), [psi, valley], max_epochs=3)
    assert psi.last_epoch == valley.last_epoch == 1
    assert psi.state_key != PsiRankMonitor(every_n_epochs=3).state_key
    state = psi.state_dict()
    restored = PsiRankMonitor(every_n_epochs=2)
    restored.load_state_dict(state)
    assert restored.last_epoch == 1 and restored.last_metrics == psi.last_metrics
    restored.load_state_dict({})  # missing keys keep the current values
    assert restored.last_epoch == 1
    assert set(valley.state_dict()) == {"last_epoch", "last_metrics", "warned_escape"}
    quick_psi, quick_valley = PsiRankMonitor(), LossValleyMonitor()
    trainer, _, _ = _fit(_model(), [quick_psi, quick_valley], fast_dev_run=True)
    assert quick_psi.last_epoch is None and quick_valley.last_epoch is None
    assert not any(k.startswith(("psi/", "valley/")) for k in trainer.callback_metrics)


def test_skip_networks_example_quick(tmp_path):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "skip_networks.py"
    spec = importlib.util.spec_from_file_location("skip_networks_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    rows = example.main(["--quick", "--threads", "0", "--out", str(tmp_path)])  # 0: leave torch threads alone
    assert [r["mode"] for r in rows] == ["original", "skip_rand", "skip_sgd"]
    assert rows[1]["train_acc"] == 1.0 and rows[0]["train_acc"] < 0.5  # convex skip_rand fits, the deep net not
    assert (tmp_path / "skip_networks.csv").read_text().startswith("mode,optimizer,epochs,N,M,psi_rank")
    assert (tmp_path / "skip_networks.png").stat().st_size > 0
    for run in ("original", "skip_rand", "skip_sgd", "summary"):
        assert list((tmp_path / "tensorboard" / run).glob("events.out.tfevents.*"))
