"""PsiRankMonitor and LossValleyMonitor in a Trainer: logged keys and values, figures, skipping, state, errors."""
import dataclasses
import pathlib
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_nsv.analysis import psi_spectrum
from lightning_nsv.callbacks.loss_valley import LossValleyMonitor
from lightning_nsv.callbacks.psi_rank import PsiRankMonitor
from lightning_nsv.compat import pl
from lightning_nsv.models.skip import SkipNetwork

PSI_KEYS = {f"psi/{k}" for k in ("rank", "sigma_min", "sigma_max", "condition_number", "num_samples", "num_units",
                                 "full_rank")}
VALLEY_KEYS = {f"valley/{k}" for k in (
    "mean_loss", "max_loss", "lemma21_threshold", "num_losses_ge_log2", "lemma21_certified", "per_sample_certified",
    "escape_start_loss", "escape_target_loss", "escape_max_loss", "escape_residual", "escape_applies",
    "escape_in_sublevel_set", "escape_convexity_gap", "escape_target_norm", "surface_center_loss",
    "surface_min_loss", "surface_max_loss", "assumption31_analytic_increasing", "assumption31_skip_activation",
    "assumption31_m_ge_n", "assumption31_num_duplicates", "assumption31_satisfied", "cross_entropy_model")}


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


def test_psi_rank_monitor_takes_the_svd_for_a_while_after_the_fast_route_fell_back(monkeypatch):
    import lightning_nsv.callbacks.psi_rank as module

    routes, fallback_epochs = [], {0, 12}

    def streaming(psi_blocks, n, m, max_memory_bytes, spectrum):
        routes.append(spectrum)
        result = psi_spectrum(torch.eye(n, m), "full")
        # the fast route "fails to certify" in the analyses of `fallback_epochs` and answers by the SVD
        method = "svd" if spectrum == "full" or len(routes) - 1 in fallback_epochs else "gram"
        return dataclasses.replace(result, method=method)

    monkeypatch.setattr(module, "psi_spectrum_streaming", streaming)
    monkeypatch.setattr(module, "SMALL_SIDE", 0)
    monkeypatch.setattr(module, "FAST_RETRY_AFTER", 3)
    _fit(_model(), [PsiRankMonitor(log_figure=False)], max_epochs=14)
    # fallback at analysis 0 -> SVD for 1-3, fast again at 4 .. 11; fallback at 12 -> SVD at 13
    assert routes == ["fast", "full", "full", "full"] + ["fast"] * 9 + ["full"]
    monitor = PsiRankMonitor(spectrum="full", log_figure=False)  # asked for: always the SVD, nothing to switch
    _fit(_model(), [monitor], max_epochs=2)
    assert routes[-2:] == ["full", "full"] and monitor.state_dict()["svd_until"] == 0


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
    with pytest.raises(ValueError, match="`spectrum` can be fast, full, got 'svd'"):
        PsiRankMonitor(spectrum="svd")
    with pytest.raises(ValueError, match="`other_loss` can be warn, error, got 'ignore'"):
        LossValleyMonitor(other_loss="ignore")
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
    assert set(valley.state_dict()) == {"last_epoch", "last_metrics", "failed_epoch", "warned_escape"}
    quick_psi, quick_valley = PsiRankMonitor(), LossValleyMonitor()
    trainer, _, _ = _fit(_model(), [quick_psi, quick_valley], fast_dev_run=True)
    assert quick_psi.last_epoch is None and quick_valley.last_epoch is None
    assert not any(k.startswith(("psi/", "valley/")) for k in trainer.callback_metrics)


@pytest.mark.filterwarnings("ignore:LossValleyMonitor.:UserWarning")
def test_skip_networks_example_quick(tmp_path):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "skip_networks.py"
    spec = importlib.util.spec_from_file_location("skip_networks_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    # 0: leave torch threads alone; the full_rank case is tests/cli/test_skip_demo.py's
    rows = example.main(["--quick", "--cases", "deep", "--threads", "0", "--out", str(tmp_path)])
    assert [r["mode"] for r in rows] == ["original", "skip_rand", "skip_sgd"]
    assert rows[1]["train_acc"] == 1.0 and rows[0]["train_acc"] < 0.5  # convex skip_rand fits, the deep net not
    assert (tmp_path / "skip_networks.csv").read_text().startswith("case,mode,optimizer,epochs,N,M,")
    assert (tmp_path / "skip_networks.png").stat().st_size > 0
    for run in ("deep-original", "deep-skip_rand", "deep-skip_sgd", "summary"):
        assert list((tmp_path / "tensorboard" / run).glob("events.out.tfevents.*"))


def test_fit_end_summaries(monkeypatch):
    lines = []
    monkeypatch.setattr("lightning_nsv.callbacks.psi_rank.rank_zero_info", lines.append)
    psi, valley = PsiRankMonitor(log_figure=False), LossValleyMonitor(surface_points=0, log_figure=False)
    with pytest.warns(UserWarning):  # M = 8 < N and ReLU
        _fit(_model("relu", skip=0, mode="original"), [psi, valley])
    psi_line, valley_lines = lines[0], lines[1].splitlines()
    assert re.fullmatch(r"PsiRankMonitor: Ψ: N=20, M=8, rank \d < N \(σ_min \S+, cond \S+\): the no-bad-valley "
                        r"condition does not hold", psi_line)
    assert valley_lines[0].startswith("LossValleyMonitor: Lemma 2.1: mean cross-entropy ")
    assert "vs log(2)/N = 0.0347 (N=20): not certified" in valley_lines[0]
    assert valley_lines[1].startswith("LossValleyMonitor: escape path (Theorem 3.4): does not apply, Ψ V* = Y t* has "
                                      "relative residual")
    assert valley_lines[2] == ("LossValleyMonitor: Assumption 3.1: does not hold (analytic increasing activations, "
                               "sigmoid-like or softplus skip units, M >= N): Theorem 3.4 does not apply")
    lines.clear()
    _fit(_model(), [PsiRankMonitor(log_figure=False), LossValleyMonitor(surface_points=0, log_figure=False)])
    assert lines[0].endswith("rank 20 = N (" + lines[0].split("rank 20 = N (")[1]) and "condition holds" in lines[0]
    assert "escape path (Theorem 3.4): applies" in lines[1] and lines[1].endswith("Assumption 3.1: satisfied")
    lines.clear()
    _fit(_model(), [PsiRankMonitor()], fast_dev_run=True)
    assert lines == []  # nothing computed, nothing to say


class _SquaredErrorSkip(SkipNetwork):
    """A user's skip network trained with the squared error on one-hot targets."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_fn = nn.MSELoss()

    def training_step(self, batch, batch_idx):
        return self.loss_fn(self(batch[0]), F.one_hot(batch[1], self.num_classes).float())


class _StepOverride(SkipNetwork):
    def training_step(self, batch, batch_idx):
        return F.multi_margin_loss(self(batch[0]), batch[1])


def test_loss_valley_monitor_other_loss(monkeypatch):
    from lightning_nsv.callbacks.loss_valley import declared_loss

    lines = []
    monkeypatch.setattr("lightning_nsv.callbacks.psi_rank.rank_zero_info", lines.append)
    model = _SquaredErrorSkip.mlp(16, [8, 8, 8], 3, "softplus", num_skip_units=16, skip_seed=0, lr=0.05)
    assert declared_loss(model) == "loss_fn = MSELoss" and declared_loss(_model()) is None
    assert declared_loss(_StepOverride.mlp(16, [8], 3, num_skip_units=0, mode="original")) == (
        "_StepOverride overrides training_step and declares no loss")
    monitor = LossValleyMonitor(surface_points=0, log_figure=False)
    with pytest.warns(UserWarning, match=r"LossValleyMonitor: the certificates of Nguyen et al. \(2019\) are about "
                                         r"the mean cross-entropy, but the model trains with another loss "
                                         r"\(loss_fn = MSELoss\)"):
        _fit(model, [monitor])
    assert monitor.last_metrics["cross_entropy_model"] == 0.0
    assert lines[0].splitlines()[0] == (
        "LossValleyMonitor: the model trains with another loss (loss_fn = MSELoss): the verdicts below are about the "
        "cross-entropy of its outputs, not its training objective")
    with pytest.raises(ValueError, match=r"trains with another loss \(loss_fn = MSELoss\).*; pass other_loss='warn'"):
        _fit(model, [LossValleyMonitor(other_loss="error")])


def _seeded_fit(max_epochs, ckpt_path=None, save_to=None):
    pl.seed_everything(0, verbose=False)
    psi, valley = PsiRankMonitor(log_figure=False), LossValleyMonitor(surface_points=3, path_points=5, log_figure=False)
    x, y = _data()
    trainer = pl.Trainer(max_epochs=max_epochs, logger=False, callbacks=[psi, valley], enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, deterministic=True)
    trainer.fit(_model(), DataLoader(TensorDataset(x, y), batch_size=10, shuffle=False), ckpt_path=ckpt_path)
    if save_to is not None:
        trainer.save_checkpoint(save_to)
    return trainer, psi, valley


def test_resume_from_checkpoint_matches_an_uninterrupted_run(tmp_path):
    path = tmp_path / "epoch2.ckpt"
    _, psi2, valley2 = _seeded_fit(2, save_to=path)
    states = torch.load(path, weights_only=True)["callbacks"]  # plain values only
    assert states[psi2.state_key] == psi2.state_dict() and states[valley2.state_key] == valley2.state_dict()
    _, psi_loaded, valley_loaded = _seeded_fit(2, ckpt_path=path)  # nothing left to train: state as loaded
    assert psi_loaded.last_epoch == 1 and psi_loaded.last_metrics == psi2.last_metrics
    assert valley_loaded.last_metrics == valley2.last_metrics
    resumed, psi_resumed, valley_resumed = _seeded_fit(4, ckpt_path=path)
    straight, psi_straight, valley_straight = _seeded_fit(4)
    assert psi_resumed.last_epoch == psi_straight.last_epoch == 3
    assert psi_resumed.last_metrics == pytest.approx(psi_straight.last_metrics, rel=1e-12)
    assert valley_resumed.last_metrics == pytest.approx(valley_straight.last_metrics, rel=1e-12)
    keys = [k for k in straight.callback_metrics if k.startswith(("psi/", "valley/", "train_"))]
    assert {k: float(resumed.callback_metrics[k]) for k in keys} == pytest.approx(
        {k: float(straight.callback_metrics[k]) for k in keys}, rel=1e-6)


class _Diverge(pl.Callback):
    """Puts NaN into every weight at the end of the given epochs (before the monitors, which come after it)."""

    def __init__(self, epochs, only=None):
        self.epochs, self.only = set(epochs), only

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch in self.epochs:
            with torch.no_grad():
                for name, p in pl_module.named_parameters():
                    if self.only is None or name.startswith(self.only):
                        p.fill_(float("nan"))


@pytest.mark.parametrize("monitor_type", [PsiRankMonitor, LossValleyMonitor])
def test_a_diverged_network_is_warned_of_once_and_training_goes_on(monitor_type, monkeypatch):
    lines = []
    monkeypatch.setattr("lightning_nsv.callbacks.psi_rank.rank_zero_info", lines.append)
    monitor = monitor_type(log_figure=False)
    with pytest.warns(UserWarning) as record:
        trainer, *_ = _fit(_model(), [_Diverge({1}), monitor], max_epochs=4)
    texts = [str(w.message) for w in record if "no analysis" in str(w.message)]
    assert len(texts) == 1 and f"{monitor_type.__name__}: no analysis at epoch 1 (nor at the next ones" in texts[0]
    assert "`psi` has non-finite values (NaN or inf) in 20 of its 20 rows" in texts[0]
    assert trainer.current_epoch == 4 and monitor.last_epoch == 0 and monitor.failed_epoch == 3
    assert monitor.state_dict()["failed_epoch"] == 3
    assert lines[-1].splitlines()[-1] == (f"{monitor_type.__name__}: the last analysis, at epoch 3, had no result: "
                                          "non-finite values (a diverged network?); the result above is epoch 0's")


def test_loss_valley_monitor_names_diverged_output_weights():
    monitor = LossValleyMonitor(log_figure=False)
    model = _model()  # its output layer V is `head`
    with pytest.warns(UserWarning, match=r"the outputs Ψ V \+ b are not finite while Ψ is: the output weights have "
                                         r"diverged"):
        _fit(model, [_Diverge({0}, only="head"), monitor], max_epochs=1)
    assert monitor.last_epoch is None and monitor.failed_epoch == 0


class _Strategy:
    def __init__(self, answer):
        self.answer, self.sent = answer, []

    def broadcast(self, value, src=0):
        self.sent.append(value)
        return value if self.answer is None else self.answer


class _Trainer:
    def __init__(self, zero, answer=None):
        self.is_global_zero, self.world_size, self.current_epoch = zero, 2, 0
        self.strategy, self.loggers, self.log_dir = _Strategy(answer), [], None


def test_an_error_on_rank_0_reaches_every_rank_instead_of_hanging_them(monkeypatch):
    import lightning_nsv.callbacks.psi_rank as module

    monkeypatch.setattr(module, "log_directory", lambda trainer: pathlib.Path("."))
    monitor = PsiRankMonitor(log_figure=False)
    monkeypatch.setattr(monitor, "_compute", lambda trainer, pl_module: (_ for _ in ()).throw(MemoryError("no room")))
    root = _Trainer(zero=True)
    with pytest.raises(MemoryError, match="no room"):
        monitor._run(root, None)
    assert root.strategy.sent == [(None, "MemoryError: no room", True)]  # told the others before raising
    other = _Trainer(zero=False, answer=root.strategy.sent[0])
    with pytest.raises(RuntimeError, match="PsiRankMonitor failed on rank 0: MemoryError: no room"):
        monitor._run(other, None)
    assert other.strategy.sent == [(None, None, False)]
