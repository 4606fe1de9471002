import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

from lightning_nsv.analysis import network_support_vectors
from lightning_nsv.artifacts import load_support_vectors, reproduce
from lightning_nsv.callbacks import NetworkSupportVectors
from lightning_nsv.compat import pl
from lightning_nsv.datamodules import DigitsDataModule
from lightning_nsv.extract import UnsupportedNetworkError
from lightning_nsv.kernel import forward_with_slopes
from lightning_nsv.models import LeakyReLUMLP


class UserClassifier(pl.LightningModule):
    """A user's own module: a plain nn.Sequential of Linear and ReLU layers, nothing from this package."""

    def __init__(self, hidden=(32, 32), activation=nn.ReLU, outputs=1, squash=False, rounding=0.0):
        super().__init__()
        self.rounding = rounding
        layers, fan_in = [nn.Flatten()], 64
        for width in hidden:
            layers += [nn.Linear(fan_in, width), activation()]
            fan_in = width
        self.model = nn.Sequential(*layers, nn.Linear(fan_in, outputs))
        self.squash = squash

    def forward(self, x):
        out = self.model(x)[:, 0] * (1 + self.rounding)
        return torch.sigmoid(out) if self.squash else out

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.binary_cross_entropy_with_logits(self.model(x)[:, 0], y.float())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def trainer(tmp_path, callback, max_epochs=60, logger=True, **kwargs):
    return pl.Trainer(
        max_epochs=max_epochs,
        callbacks=[callback],
        logger=pl.loggers.TensorBoardLogger(tmp_path, name="tb", default_hp_metric=False) if logger else False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=kwargs.pop("enable_checkpointing", False),
        default_root_dir=tmp_path,
        accelerator="cpu",
        **kwargs,
    )


def scalars(log_dir: Path) -> dict[str, list[float]]:
    events = EventAccumulator(str(log_dir)).Reload()
    return {tag: [e.value for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """One end-to-end run on a user's own module, shared by the assertions below."""
    tmp_path = tmp_path_factory.mktemp("fit")
    pl.seed_everything(0)
    data = DigitsDataModule(m=300, seed=0, batch_size=50)
    callback = NetworkSupportVectors(probe_size=64)
    run = trainer(tmp_path, callback)
    model = UserClassifier()
    run.fit(model, datamodule=data)
    return run, callback, model, data


def test_reaches_zero_error_and_stops(fitted):
    run, callback, model, data = fitted
    assert callback.zero_error_epoch is not None
    assert run.current_epoch == callback.zero_error_epoch + 1  # stopped at the end of that epoch
    assert len(callback._gram_cache) == 0  # one analysis: no input-Gram rows kept for another
    x, y = data.train_dataset.tensors
    with torch.no_grad():
        assert bool(((2 * y - 1) * model(x).double() > 0).all())


def test_metrics_match_a_direct_analysis(fitted):
    run, callback, model, data = fitted
    x, y = data.train_dataset.tensors
    x_val, y_val = data.val_dataset.tensors
    part_net = callback._scope.freeze()
    direct = network_support_vectors(part_net, x.flatten(1), y, x_val.flatten(1), y_val)
    assert callback.metrics["n_support"] == direct.n_support
    assert callback.metrics["support_fraction"] == pytest.approx(direct.n_support / 300)
    for key in ("svm_margin", "network_margin", "margin_ratio", "cosine_wbar_v", "val_agreement",
                "unique_patterns_train", "unique_patterns_val", "compression_bound"):
        assert callback.metrics[key] == pytest.approx(direct.to_metrics()[key], rel=1e-9), key
    assert callback.metrics["kkt_residual"] < 1e-9
    assert 0 < callback.metrics["margin_ratio"] <= 1


def test_tensorboard_has_metrics_and_figures(fitted):
    run, callback, *_ = fitted
    logged = scalars(Path(run.logger.log_dir))
    for key in ("n_support", "support_fraction", "svm_margin", "margin_ratio", "cosine_wbar_v", "kkt_residual",
                "unique_patterns_train", "unique_patterns_val", "val_agreement", "compression_bound"):
        assert logged[f"nsv/{key}"] == [pytest.approx(callback.metrics[key])], key
    assert logged["nsv/zero_error_epoch"] == [callback.zero_error_epoch]
    events = EventAccumulator(run.logger.log_dir, size_guidance={"images": 0, "histograms": 0}).Reload()
    assert {"nsv/support_vectors", "nsv/alpha_histogram"} <= set(events.Tags()["images"])
    assert "nsv/log10_alpha" in events.Tags()["histograms"]


def test_saved_results_reproduce_the_support_vectors(fitted):
    run, callback, model, data = fitted
    directory = Path(run.logger.log_dir) / "nsv"
    stem = directory / f"support_vectors_epoch{callback.zero_error_epoch}"
    saved = torch.load(stem.with_suffix(".pt"), weights_only=True)
    summary = json.loads(stem.with_suffix(".json").read_text())
    assert summary["id"] == saved["id"] and summary["metrics"]["n_support"] == len(saved["support"])
    assert summary["support"] == saved["support"].tolist() == callback.analysis.svm.support_.tolist()
    assert summary["alpha_support"] == pytest.approx(saved["alpha"][saved["support"]].tolist(), rel=1e-15)
    assert "network support vectors" in summary["report"]
    artifact = load_support_vectors(stem.with_suffix(".json"))
    assert torch.equal(artifact.train_indices, data.train_indices)
    assert artifact.data_class == "lightning_nsv.datamodules.digits.DigitsDataModule"
    assert artifact.data_hparams["m"] == 300 and artifact.epoch == callback.zero_error_epoch
    assert set(artifact.module_state) == set(model.state_dict())
    assert artifact.versions["torch"] == str(torch.__version__)
    # a user's module records no init arguments: reproduce() takes an instance and loads the saved weights
    with pytest.raises(ValueError, match="records no init arguments for .*UserClassifier; pass `module=`"):
        reproduce(artifact)
    again = reproduce(artifact, module=UserClassifier())
    assert torch.equal(torch.from_numpy(again.svm.support_), artifact.support)
    torch.testing.assert_close(torch.from_numpy(again.svm.alpha_), artifact.alpha, rtol=1e-9, atol=0)


def test_never_reaching_zero_error_says_so(tmp_path):
    pl.seed_everything(0)
    data = DigitsDataModule(m=200, seed=0, batch_size=50, random_labels=True)
    callback = NetworkSupportVectors()
    run = trainer(tmp_path, callback, max_epochs=2)
    with pytest.warns(UserWarning, match=r"zero training error was not reached within max_epochs=2 \(\d+ of 200 "
                                         r"training samples misclassified at the end\).*Train longer \(resume"):
        run.fit(LeakyReLUMLP(widths=[8], lr=0.01), datamodule=data)
    assert callback.zero_error_epoch is None and callback.metrics == {}
    assert scalars(Path(run.logger.log_dir))["nsv/zero_error_reached"] == [0.0]
    assert not (Path(run.logger.log_dir) / "nsv").exists()


class StopAfterOneEpoch(pl.Callback):
    def on_train_epoch_end(self, trainer, pl_module):
        trainer.should_stop = True


def test_a_fit_stopped_before_max_epochs_writes_no_final_verdict(tmp_path, caplog):
    data = DigitsDataModule(m=200, seed=0, batch_size=50, random_labels=True)
    callback = NetworkSupportVectors()
    run = trainer(tmp_path, callback, max_epochs=50)
    run.callbacks.append(StopAfterOneEpoch())
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no "not reached" warning
        warnings.filterwarnings("ignore", message=".*(val_dataloader|log_every_n_steps|workers).*")
        run.fit(LeakyReLUMLP(widths=[8], lr=0.01), datamodule=data)
    assert run.current_epoch == 1
    assert "nsv/zero_error_reached" not in scalars(Path(run.logger.log_dir))


def test_check_is_cheap_far_from_zero_error(tmp_path, monkeypatch):
    import lightning_nsv.scope.head as module

    evaluated = []
    original = module.forward_with_slopes
    monkeypatch.setattr(module, "forward_with_slopes", lambda net, x: evaluated.append(len(x)) or original(net, x))
    data = DigitsDataModule(m=1000, seed=0, batch_size=100, random_labels=True)
    callback = NetworkSupportVectors(probe_size=100, batch_size=50)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer(tmp_path, callback, max_epochs=3, logger=False).fit(LeakyReLUMLP(widths=[8]), datamodule=data)
    checks = [n for n in evaluated if n != 8]  # the 8-sample head check at the first batch aside
    assert sum(checks[:-20]) < 3 * 150  # each epoch: one batch of hard samples or probe, not 1000 samples


@pytest.mark.filterwarnings("ignore:NetworkSupportVectors. zero training error was not reached:UserWarning")
def test_head_check_allows_for_tf32_products_on_cuda(tmp_path, monkeypatch):
    import lightning_nsv.scope.head as module

    data = DigitsDataModule(m=50, batch_size=50)
    # outputs off by about TF32's rounding (a 10-bit mantissa); `scope="auto"` would analyse the whole module instead
    tf32_like = UserClassifier(rounding=2e-3)
    with pytest.raises(ValueError, match=r"output of UserClassifier is not the output of its path part"):
        trainer(tmp_path, NetworkSupportVectors(scope="head"), max_epochs=1, logger=False).fit(tf32_like, datamodule=data)
    monkeypatch.setattr(module, "reduced_float32_matmuls", lambda device: True)  # as after
    trainer(tmp_path, NetworkSupportVectors(scope="head"), max_epochs=1, logger=False).fit(  # set_float32_matmul_precision("high")
        UserClassifier(rounding=2e-3), datamodule=data)
    for module_ in (UserClassifier(squash=True), UserClassifier(rounding=5e-2)):  # still too far off
        with pytest.raises(ValueError, match=r"output of UserClassifier is not the output of its path part"):
            trainer(tmp_path, NetworkSupportVectors(scope="head"), max_epochs=1, logger=False).fit(module_, datamodule=data)


def test_tf32_is_read_through_the_new_precision_api():
    from types import SimpleNamespace

    from lightning_nsv.scope.head import reduced_float32_matmuls

    cuda = torch.device("cuda:0")
    assert not reduced_float32_matmuls(torch.device("cpu"))
    assert isinstance(reduced_float32_matmuls(cuda), bool)  # this torch's own state, read without raising
    for matmul, overall, expected in (("none", "none", False), ("ieee", "tf32", False), ("tf32", "none", True),
                                      ("none", "tf32", True)):
        backends = SimpleNamespace(cuda=SimpleNamespace(matmul=SimpleNamespace(fp32_precision=matmul)),
                                   fp32_precision=overall)
        assert reduced_float32_matmuls(cuda, backends) == expected, (matmul, overall)
    for allow in (False, True):  # torch < 2.9: the legacy flag
        legacy = SimpleNamespace(cuda=SimpleNamespace(matmul=SimpleNamespace(allow_tf32=allow)))
        assert reduced_float32_matmuls(cuda, legacy) == allow


def test_rejects_unsupported_modules_with_their_name(tmp_path):
    data = DigitsDataModule(m=50, batch_size=50)
    with pytest.raises(UnsupportedNetworkError, match=r"UserClassifier.model: layer 2, Tanh\(\), is not supported"):
        trainer(tmp_path, NetworkSupportVectors(), max_epochs=1, logger=False).fit(
            UserClassifier(activation=nn.Tanh), datamodule=data)
    data.setup("fit")  # plain loaders below: no `num_classes` to check the head against first
    with pytest.raises(ValueError, match=r"output of UserClassifier has 1 values per sample, but its path part "
                                         r"UserClassifier.model has 3; the module must return the head's output"):
        trainer(tmp_path, NetworkSupportVectors(scope="head"), max_epochs=1, logger=False).fit(  # auto: the whole
            UserClassifier(outputs=3), train_dataloaders=data.train_dataloader())
    with pytest.raises(ValueError, match=r"output of UserClassifier is not the output of its path part"):
        trainer(tmp_path, NetworkSupportVectors(), max_epochs=1, logger=False).fit(
            UserClassifier(squash=True), datamodule=data)
    classes = DigitsDataModule(m=50, batch_size=50, task="multiclass")
    classes.setup("fit")
    with pytest.raises(ValueError, match=r"binary labels must be 0/1 or -1/\+1, got values \[0, 1, 2, 3"):
        trainer(tmp_path, NetworkSupportVectors(), max_epochs=1, logger=False).fit(
            UserClassifier(), train_dataloaders=classes.train_dataloader())


def test_resume_after_the_analysis_does_not_repeat_it(tmp_path):
    pl.seed_everything(0)
    data = DigitsDataModule(m=200, seed=0, batch_size=50)
    first = NetworkSupportVectors()
    run = trainer(tmp_path, first, enable_checkpointing=True)
    run.fit(LeakyReLUMLP(widths=[32, 32], optimizer="adam", lr=0.01), datamodule=data)
    assert first.zero_error_epoch is not None
    checkpoint = run.checkpoint_callback.best_model_path
    stored = torch.load(checkpoint, weights_only=True)
    resumed = NetworkSupportVectors()
    assert stored["callbacks"][resumed.state_key]["zero_error_epoch"] == first.zero_error_epoch
    run2 = trainer(tmp_path, resumed, max_epochs=first.zero_error_epoch + 3)
    run2.fit(LeakyReLUMLP(widths=[32, 32], optimizer="adam", lr=0.01), datamodule=data, ckpt_path=checkpoint)
    assert resumed.zero_error_epoch == first.zero_error_epoch
    assert resumed.metrics == pytest.approx(first.metrics)
    assert resumed.analysis is None  # restored from the checkpoint, not recomputed
    # the run had stopped there: the resumed fit stops at once, with the checkpoint's weights
    assert run2.current_epoch == run.current_epoch and run2.global_step == run.global_step
    for name, value in run2.lightning_module.state_dict().items():
        assert torch.equal(value, stored["state_dict"][name]), name


def test_the_last_epoch_is_checked_whatever_every_n_epochs(fitted, tmp_path):
    """With ``every_n_epochs`` out of step with ``max_epochs`` the last epoch is checked too: a network that reached
    zero error in between is analysed there instead of being reported as never reaching it."""
    reached = fitted[1].zero_error_epoch
    pl.seed_everything(0)
    callback = NetworkSupportVectors(probe_size=64, every_n_epochs=1000)
    run = trainer(tmp_path, callback, max_epochs=reached + 2)
    run.fit(UserClassifier(), datamodule=DigitsDataModule(m=300, seed=0, batch_size=50))
    assert callback.zero_error_epoch == reached + 1 and callback.analysis is not None
    assert scalars(Path(run.logger.log_dir))["nsv/zero_error_reached"] == [1.0]


def test_zero_error_reached_between_checks_is_not_reported_as_never_reached(fitted, tmp_path):
    """Stopped by ``max_steps`` with zero error, between checked epochs: a warning says so and how to analyse
    the network; no "not reached" verdict is logged."""
    reached = fitted[1].zero_error_epoch
    pl.seed_everything(0)
    callback = NetworkSupportVectors(probe_size=64, every_n_epochs=1000)
    run = trainer(tmp_path, callback, max_epochs=1000, max_steps=(reached + 2) * 6)  # 300 samples, batches of 50
    with pytest.warns(UserWarning, match=r"has zero training error now that training stopped after "
                                         rf"{reached + 2} epochs, but not at an epoch it was checked at"):
        run.fit(UserClassifier(), datamodule=DigitsDataModule(m=300, seed=0, batch_size=50))
    assert callback.zero_error_epoch is None
    assert "nsv/zero_error_reached" not in scalars(Path(run.logger.log_dir))


def test_a_head_that_does_not_fit_the_data_modules_classes_is_refused(tmp_path):
    run = trainer(tmp_path, NetworkSupportVectors(), max_epochs=1, logger=False)
    with pytest.raises(ValueError, match=r"LeakyReLUMLP.net has 10 outputs, but the data module DigitsDataModule "
                                         r"\(task='binary'\) has 2 classes"):
        run.fit(LeakyReLUMLP(widths=[8], num_classes=10), datamodule=DigitsDataModule(m=100, seed=0))
    run = trainer(tmp_path, NetworkSupportVectors(), max_epochs=1, logger=False)
    with pytest.raises(ValueError, match=r"has 1 output, but the data module DigitsDataModule "
                                         r"\(task='multiclass'\) has 10 classes"):
        run.fit(LeakyReLUMLP(widths=[8]), datamodule=DigitsDataModule(m=100, seed=0, task="multiclass"))


def test_tracking_after_zero_error_repeats_the_analysis(tmp_path):
    pl.seed_everything(0)
    data = DigitsDataModule(m=200, seed=0, batch_size=50)
    callback = NetworkSupportVectors(stop_on_zero_error=False, every_n_epochs=2)
    run = trainer(tmp_path, callback, max_epochs=32)
    run.fit(LeakyReLUMLP(widths=[32, 32], optimizer="adam", lr=0.01), datamodule=data)
    logged = scalars(Path(run.logger.log_dir))
    ratios = logged["nsv/margin_ratio"]
    assert len(ratios) >= 2
    assert all(0 < r <= 1 for r in ratios)
    assert len(logged["nsv/support_jaccard_previous"]) == len(ratios) - 1  # from the second analysis on
    assert all(0 <= j <= 1 for j in logged["nsv/support_jaccard_previous"])
    assert len(logged["nsv/patterns_changed"]) == len(ratios) - 1
    assert all(0 <= c <= 200 for c in logged["nsv/patterns_changed"])
    images = EventAccumulator(str(run.logger.log_dir)).Reload().Tags()["images"]
    assert "nsv/max_margin_approach" in images
    assert [h["epoch"] for h in callback.history] == [float(e) for e in range(callback.zero_error_epoch, 32, 2)][
        : len(ratios)]
    assert len(list((Path(run.logger.log_dir) / "nsv").glob("*.pt"))) == len(ratios)
    assert sorted(callback._gram_cache.samples.tolist()) == callback.analysis.svm.support_.tolist()


def test_the_torch_solver_gives_the_numpy_analysis(tmp_path):
    """``solver="torch"`` (what an accelerator gets by default), here on the CPU: the same repeated analyses."""
    runs = {}
    for solver in ("numpy", "torch"):
        pl.seed_everything(0)
        callback = NetworkSupportVectors(stop_on_zero_error=False, every_n_epochs=2, solver=solver)
        trainer(tmp_path / solver, callback, max_epochs=32, logger=False).fit(
            LeakyReLUMLP(widths=[32, 32], optimizer="adam", lr=0.01),
            datamodule=DigitsDataModule(m=200, seed=0, batch_size=50))
        runs[solver] = callback
    numpy_run, torch_run = runs["numpy"], runs["torch"]
    for solver, backend in (("numpy", "numpy"), ("torch", "torch (cpu)")):  # the artifacts say where it ran
        saved = sorted((tmp_path / solver).rglob("support_vectors_epoch*.pt"))
        assert saved and all(load_support_vectors(p).solver["backend"] == backend for p in saved)
    assert len(numpy_run.history) >= 2 and len(torch_run.history) == len(numpy_run.history)
    np.testing.assert_array_equal(torch_run.analysis.svm.support_, numpy_run.analysis.svm.support_)
    for a, b in zip(numpy_run.history, torch_run.history):
        assert a.keys() == b.keys()
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-9, abs=1e-12), key


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"every_n_epochs": 0}, "`every_n_epochs` must be a positive integer, got 0"),
        ({"batch_size": -1}, "`batch_size` must be a positive integer, got -1"),
        ({"probe_size": -5}, "`probe_size` must be an integer >= 0, got -5"),
        ({"max_images": -1}, "`max_images` must be an integer >= 0, got -1"),
        ({"C": 0}, "`C` must be positive and finite, got 0"),
        ({"C": float("nan")}, "`C` must be positive and finite, got nan"),
        ({"every_n_epochs": -2}, "`every_n_epochs` must be a positive integer, got -2"),
        ({"delta": 1.0}, r"`delta` must be in \(0, 1\), got 1.0"),
        ({"kernel": "sparse"}, "`kernel` can be auto, dense, columns, got 'sparse'"),
        ({"solver": "gpu"}, "`solver` can be auto, numpy, torch, got 'gpu'"),
    ],
)
def test_argument_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        NetworkSupportVectors(**kwargs)


def test_head_check_uses_the_float64_path_network():
    model = LeakyReLUMLP(widths=[4])
    x = torch.rand(3, 1, 8, 8)
    from lightning_nsv.extract import find_path_part

    part = find_path_part(model)
    out, _ = forward_with_slopes(part.path_network(), part.embed(x))
    torch.testing.assert_close(out, model(x).double(), rtol=1e-5, atol=1e-6)


def test_plain_dataloaders_without_a_datamodule(tmp_path):
    pl.seed_everything(0)
    data = DigitsDataModule(m=150, seed=1)
    data.setup("fit")
    callback = NetworkSupportVectors()
    run = trainer(tmp_path, callback, logger=False)
    run.fit(LeakyReLUMLP(widths=[32, 32], optimizer="adam", lr=0.01),
            train_dataloaders=torch.utils.data.DataLoader(data.train_dataset, batch_size=30, shuffle=True),
            val_dataloaders=torch.utils.data.DataLoader(data.val_dataset, batch_size=100))
    assert callback.zero_error_epoch is not None
    assert callback.analysis.m == 150
    assert callback.analysis.val_agreement is not None
    assert callback.metrics["unique_patterns_val"] > 0


def test_two_dimensional_inputs_get_boundary_and_weight_figures(tmp_path):
    from lightning_nsv.datamodules import QuadrantDataModule

    pl.seed_everything(0)
    callback = NetworkSupportVectors()
    run = trainer(tmp_path, callback, max_epochs=30)
    run.fit(LeakyReLUMLP(in_features=2, widths=[4, 4], optimizer="adam", lr=0.01),
            datamodule=QuadrantDataModule(n_samples=200, seed=0, batch_size=20))
    assert callback.zero_error_epoch is not None
    events = EventAccumulator(run.logger.log_dir, size_guidance={"images": 0}).Reload()
    assert {"nsv/decision_boundaries", "nsv/path_weights"} <= set(events.Tags()["images"])
    assert "nsv/support_vectors" not in events.Tags()["images"]


def test_callback_passes_over_the_data_leave_the_global_rng_alone():
    from lightning_nsv.extract import find_path_part
    from lightning_nsv.callbacks.nsv_scope import embed_all
    from lightning_nsv.scope import HeadScope

    model = LeakyReLUMLP(widths=[4])
    data = DigitsDataModule(m=100)
    data.setup("fit")
    callback = NetworkSupportVectors()
    callback._scope = HeadScope(find_path_part(model))
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    x, y = embed_all(callback._scope, data.train_dataset, model, callback.batch_size)
    assert x.shape == (100, 64) and torch.equal(torch.rand(3), expected)


def _resume_run(tmp_path, stop_at=None):
    """Digits to zero error, either straight or stopped at epoch ``stop_at`` and resumed from its checkpoint."""
    pl.seed_everything(0)
    data, callback = DigitsDataModule(m=300, seed=0, batch_size=50), NetworkSupportVectors()
    model = LeakyReLUMLP(widths=[32, 32], lr=0.05)
    if stop_at is None:
        run = trainer(tmp_path, callback, max_epochs=80, logger=False)
        run.fit(model, datamodule=data)
        return callback
    first = trainer(tmp_path, callback, max_epochs=stop_at, logger=False, enable_checkpointing=True)
    first.fit(model, datamodule=data)
    assert callback.zero_error_epoch is None, "stop before zero error for this test"
    checkpoint = first.checkpoint_callback.best_model_path
    torch.load(checkpoint, weights_only=True)
    pl.seed_everything(123)  # the resumed run must not depend on the global seed
    resumed = NetworkSupportVectors()
    trainer(tmp_path, resumed, max_epochs=80, logger=False).fit(
        LeakyReLUMLP(widths=[32, 32], lr=0.05), datamodule=DigitsDataModule(m=300, seed=0, batch_size=50),
        ckpt_path=checkpoint)
    return resumed


@pytest.mark.filterwarnings("ignore:NetworkSupportVectors. zero training error was not reached:UserWarning")
@pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`, callbacks used to create the checkpoint")
def test_a_resumed_run_ends_as_the_uninterrupted_one(tmp_path):
    straight = _resume_run(tmp_path / "straight")
    resumed = _resume_run(tmp_path / "resumed", stop_at=5)
    assert straight.zero_error_epoch is not None
    assert resumed.zero_error_epoch == straight.zero_error_epoch
    assert resumed.metrics == straight.metrics  # the same logged values, to the last bit
    assert np.array_equal(resumed.analysis.svm.support_, straight.analysis.svm.support_)  # Jaccard 1.0
    assert np.array_equal(resumed.analysis.svm.alpha_, straight.analysis.svm.alpha_)


class UserMulticlass(UserClassifier):
    """A user's 10-class module: the head's K scores, cross-entropy."""

    def __init__(self):
        super().__init__(hidden=(32, 32), outputs=10)

    def forward(self, x):
        return self.model(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.model(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


def test_a_ten_class_head_gets_the_multiclass_analysis(tmp_path):
    pl.seed_everything(0)
    data = DigitsDataModule(m=300, seed=0, batch_size=50, task="multiclass")
    callback = NetworkSupportVectors()
    run = trainer(tmp_path, callback, max_epochs=100)
    model = UserMulticlass()
    run.fit(model, datamodule=data)
    assert callback.zero_error_epoch is not None
    metrics = callback.metrics
    assert sum(metrics[f"n_support_class{k}"] for k in range(10)) == metrics["n_support"] > 0
    assert 0 < metrics["margin_ratio"] <= 1 and metrics["kkt_residual"] < 1e-9
    from lightning_nsv.analysis import multiclass_support_vectors
    from lightning_nsv.extract import find_path_part

    part = find_path_part(model)
    x, y = data.train_dataset.tensors
    xv, yv = data.val_dataset.tensors
    with torch.no_grad():
        direct = multiclass_support_vectors(part.path_network(), part.embed(x), y, part.embed(xv), yv)
    assert metrics == pytest.approx(direct.to_metrics(), rel=1e-9)
    artifact = load_support_vectors(next((Path(run.logger.log_dir) / "nsv").glob("*.pt")))
    assert artifact.alpha.shape == (300, 10) and artifact.network.num_outputs == 10
    assert set(scalars(Path(run.logger.log_dir))) >= {"nsv/n_support_class3", "nsv/cosine_wbar_v"}


def test_the_solver_bar_shows_only_where_the_trainer_shows_one(capsys):
    from lightning_nsv.callbacks.nsv_outputs import SolverBar

    hidden = SolverBar(enabled=False, after=0.0)
    hidden(1, 3, 0.5)
    assert hidden.bar is None
    shown = SolverBar(enabled=True, after=0.0)
    for iteration in (1, 2, 5):
        shown(iteration, 4, 1e-3)
    assert shown.bar is not None and shown.bar.n == 5
    shown.close()
    assert "max-margin solver" in capsys.readouterr().err
