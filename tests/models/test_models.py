"""Models under the Trainer: exact resume, epoch metrics against direct counts, label checks, CLI help."""
from __future__ import annotations

import inspect
import typing

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_nsv.callbacks import LossValleyMonitor, NetworkSupportVectors, PsiRankMonitor
from lightning_nsv.compat import Callback, pl
from lightning_nsv.datamodules import (
    BinaryMNISTDataModule,
    CIFAR10FrogsShipsDataModule,
    ClassificationDataModule,
    DigitsDataModule,
    QuadrantDataModule,
    Toy2DDataModule,
)
from lightning_nsv.models import ConvFCNet, LeakyReLUMLP, SkipNetwork
from lightning_nsv.models.metrics import EpochMetric

QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)


def _trainer(tmp_path, max_epochs, **kwargs):
    return pl.Trainer(max_epochs=max_epochs, default_root_dir=tmp_path, accelerator="cpu", devices=1,
                      **{**QUIET, **kwargs})


def _fit_mlp(tmp_path, max_epochs, ckpt_path=None, validate=False):
    pl.seed_everything(0, verbose=False)
    model = LeakyReLUMLP(widths=[16, 16], lr=0.05)
    trainer = _trainer(tmp_path, max_epochs, limit_val_batches=1.0 if validate else 0)
    trainer.fit(model, datamodule=DigitsDataModule(m=120, batch_size=25, seed=3), ckpt_path=ckpt_path)
    return model, trainer


@pytest.mark.filterwarnings("ignore:The dirpath has changed from")
@pytest.mark.parametrize("saved", ["after_fit", "at_validation_end"])
def test_resumed_run_sees_the_batches_of_an_uninterrupted_run(tmp_path, saved):
    validate = saved == "at_validation_end"  # ModelCheckpoint writes before the epoch counts as completed
    straight, _ = _fit_mlp(tmp_path / "straight", 5, validate=validate)
    first, trainer = _fit_mlp(tmp_path / "first", 2, validate=validate)
    path = trainer.checkpoint_callback.best_model_path if validate else tmp_path / "epoch2.ckpt"
    if not validate:
        trainer.save_checkpoint(path)
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["epoch"] == (1 if validate else 2) and "state_dict" in checkpoint
    resumed, trainer = _fit_mlp(tmp_path / "resumed", 5, ckpt_path=str(path), validate=validate)
    assert trainer.current_epoch == 5
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    assert not torch.equal(first.net[1].weight, resumed.net[1].weight)


class _Seen(Callback):
    """What a plain (non-monitoring) callback sees in ``callback_metrics`` at the end of each epoch."""

    def __init__(self) -> None:
        self.epochs: list[dict[str, float]] = []

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.epochs.append({k: float(v) for k, v in trainer.callback_metrics.items()})


def _direct(model, dataset, binary=True):
    x, y = dataset.tensors
    with torch.no_grad():
        logits = model(x)
    if binary:
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, y.float())
        wrong = ((logits >= 0).long() != y).float().mean()
    else:
        loss = torch.nn.functional.cross_entropy(logits, y)
        wrong = (logits.argmax(1) != y).float().mean()
    return float(loss), float(wrong)


def test_mlp_epoch_metrics_equal_direct_counts(tmp_path):
    pl.seed_everything(1, verbose=False)
    dm = DigitsDataModule(m=150, batch_size=40, seed=0)
    model, seen = LeakyReLUMLP(widths=[8], lr=0.05), _Seen()
    trainer = _trainer(tmp_path, 3, callbacks=[seen])
    trainer.fit(model, datamodule=dm)
    assert set(trainer.callback_metrics) == {"train_loss", "train_error_running", "val_loss", "val_error"}
    assert [set(e) >= {"train_loss", "train_error_running"} for e in seen.epochs] == [True] * 3
    loss, error = _direct(model, dm.val_dataset)
    assert float(trainer.callback_metrics["val_error"]) == pytest.approx(error, abs=1e-7)
    assert float(trainer.callback_metrics["val_loss"]) == pytest.approx(loss, rel=1e-5)
    wrong = float(trainer.callback_metrics["train_error_running"]) * 150
    assert wrong == pytest.approx(round(wrong), abs=1e-3)  # a count over the last epoch's 150 samples
    (result,) = trainer.test(model, datamodule=dm, verbose=False)
    assert result["test_error"] == pytest.approx(error, abs=1e-7) and result["test_loss"] == pytest.approx(loss, rel=1e-5)


def test_running_train_metrics_average_the_steps_of_one_epoch(tmp_path):
    x = torch.randn(60, 4)
    y = (x[:, 0] > 0).long()
    model = LeakyReLUMLP(in_features=4, widths=[3], lr=1e-9)  # weights do not move: running == frozen
    trainer = _trainer(tmp_path, 2)
    trainer.fit(model, DataLoader(TensorDataset(x, y), batch_size=16))
    loss, error = _direct(model, TensorDataset(x, y))
    assert float(trainer.callback_metrics["train_error_running"]) == pytest.approx(error, abs=1e-6)
    assert float(trainer.callback_metrics["train_loss"]) == pytest.approx(loss, rel=1e-5)  # weighted by batch size


@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")
def test_conv_fc_and_skip_multiclass_metrics(tmp_path):
    pl.seed_everything(0, verbose=False)
    dm = DigitsDataModule(m=100, batch_size=50, task="multiclass")
    conv = ConvFCNet(in_channels=1, image_size=8, fc_depth=1, fc_width=8, conv_channels=4, num_classes=10)
    skip = SkipNetwork.mlp(64, [16, 16], 10, "tanh", num_skip_units=8)
    for model, error_key in ((conv, "val_error"), (skip, "val_acc")):
        trainer = _trainer(tmp_path, 1)
        trainer.fit(model, datamodule=dm)
        _, error = _direct(model, dm.val_dataset, binary=False)
        expected = error if error_key == "val_error" else 1 - error
        assert float(trainer.callback_metrics[error_key]) == pytest.approx(expected, abs=1e-6)
    assert {"train_loss", "train_acc_running", "val_loss", "val_acc"} == set(trainer.callback_metrics)
    for model in (conv, skip):
        assert not any(isinstance(v, torch.Tensor) and v.dim() == 0 for v in vars(model).values())
        assert isinstance(model.val_metrics.accuracy, EpochMetric)


def _labels_fit(tmp_path, model, x, y):
    trainer = _trainer(tmp_path, 1)
    trainer.fit(model, DataLoader(TensorDataset(x, y), batch_size=8))


@pytest.mark.parametrize("make", [lambda: LeakyReLUMLP(in_features=4, widths=[3]),
                                  lambda: ConvFCNet(in_channels=1, image_size=4, fc_depth=1, fc_width=3,
                                                    conv_channels=2, padding=1)])
@pytest.mark.parametrize("labels, match", [
    (torch.tensor([-1, 1] * 8), r"got labels -1/\+1 in training batch 0 .* map them with `\(y \+ 1\) // 2`"),
    (torch.tensor([0.0, 1.0] * 8), r"needs integer class labels, got torch.float32 labels .* `y.long\(\)`"),
    (torch.tensor([0, 1, 2, 3] * 4), r"one logit on labels 0/1 \(num_classes=1\), got labels \[0, 1, 2, 3\] .*num_classes=K"),
])
def test_binary_models_refuse_bad_labels(tmp_path, make, labels, match):
    model = make()
    shape = (4,) if isinstance(model, LeakyReLUMLP) and not isinstance(model, ConvFCNet) else (1, 4, 4)
    with pytest.raises(ValueError, match=match):
        _labels_fit(tmp_path, model, torch.randn(16, *shape), labels)


def test_multiclass_models_refuse_labels_out_of_range(tmp_path):
    conv = ConvFCNet(in_channels=1, image_size=4, fc_depth=1, fc_width=3, conv_channels=2, num_classes=3)
    with pytest.raises(ValueError, match=r"ConvFCNet has 3 outputs \(num_classes=3\), so labels must be in 0..2, got label 4 \(labels in 0..4\) in training batch 0"):
        _labels_fit(tmp_path, conv, torch.randn(16, 1, 4, 4), torch.arange(16) % 5)
    skip = SkipNetwork.mlp(4, [5], 3, num_skip_units=0)
    with pytest.raises(ValueError, match=r"SkipNetwork has 3 outputs \(num_classes=3\), so labels must be in 0..2, got label -1 \(labels in -1..1\)"):
        _labels_fit(tmp_path, skip, torch.randn(16, 4), torch.tensor([-1, 0, 1, 1] * 4))
    with pytest.raises(ValueError, match="SkipNetwork needs integer class labels, got torch.float64"):
        _labels_fit(tmp_path, skip, torch.randn(16, 4), torch.zeros(16, dtype=torch.float64))


CLASSES = [LeakyReLUMLP, ConvFCNet, SkipNetwork, DigitsDataModule, BinaryMNISTDataModule, CIFAR10FrogsShipsDataModule,
           Toy2DDataModule, QuadrantDataModule, NetworkSupportVectors, PsiRankMonitor, LossValleyMonitor]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_cli_argument_has_help(cls):
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_class_arguments(cls, "obj")
    helps = {a.dest.split(".", 1)[1]: a.help for a in parser._actions if a.dest.startswith("obj.")}
    names = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "kwargs")]
    if issubclass(cls, ClassificationDataModule):
        names += [p for p in inspect.signature(ClassificationDataModule.__init__).parameters if p != "self"]
    missing = [name for name in names if not helps.get(name)]
    assert not missing, f"{cls.__name__}: no help for {missing}"
    assert all("," not in name for name in helps)


def test_choices_are_literals():
    hints = typing.get_type_hints(LeakyReLUMLP.__init__)
    assert typing.get_args(hints["optimizer"]) == ("sgd", "adam")
    assert typing.get_args(typing.get_type_hints(ConvFCNet.__init__)["optimizer"]) == ("sgd", "adam")
    skip = typing.get_type_hints(SkipNetwork.__init__)
    assert typing.get_args(skip["mode"]) == ("original", "skip_sgd", "skip_rand")
    assert typing.get_args(skip["optimizer"]) == ("sgd", "adam", "lbfgs")
    assert typing.get_args(typing.get_type_hints(ClassificationDataModule.__init__)["task"]) == ("binary", "multiclass")


def test_leaky_relu_mlp_with_k_classes_has_k_scores_and_cross_entropy():
    model = LeakyReLUMLP(in_features=64, widths=[8], num_classes=10)
    x, y = torch.randn(6, 1, 8, 8), torch.tensor([0, 3, 9, 2, 2, 7])
    assert model(x).shape == (6, 10) and model.net[-1].out_features == 10
    torch.testing.assert_close(model._loss(model(x), y), torch.nn.functional.cross_entropy(model(x), y))
    assert LeakyReLUMLP(in_features=64, widths=[8]).net[-1].out_features == 1  # binary: one logit
    with pytest.raises(ValueError, match="`num_classes` must be a positive integer, got 0"):
        LeakyReLUMLP(num_classes=0)


@pytest.mark.filterwarnings("ignore:The ``compute`` method of metric EpochMetric was called before the ``update``:UserWarning")
def test_epoch_metric_append_equals_per_step_updates():
    """The per-step fast path (appended inputs, one torchmetrics update at compute) gives the values of
    per-step `update` calls, also after a compute in mid-epoch, and `reset` drops what was appended."""
    from lightning_nsv.models.metrics import StageMetrics

    torch.manual_seed(0)
    steps = [(torch.rand(()), torch.randn(n), torch.randint(0, 2, (n,))) for n in (7, 5, 9)]
    fast, slow = StageMetrics(1), StageMetrics(1)
    for i, (loss, logits, y) in enumerate(steps):
        fast.record(i, loss, logits, y)
        slow.loss.update(loss.reshape(1), loss.new_full((1,), len(y)))
        slow.accuracy.update(slow.predict(logits), y)
        if i == 1:  # a compute in mid-epoch flushes what was appended so far
            assert float(fast.error.compute()) == float(slow.error.compute())
    fast.record(2, *steps[2])  # the same batch again (L-BFGS closure): not counted twice
    assert float(fast.loss.compute()) == float(slow.loss.compute())
    assert float(fast.error.compute()) == float(slow.error.compute())
    assert float(fast.accuracy.compute()) == pytest.approx(1 - float(fast.error.compute()))
    fast.loss.reset()
    fast.accuracy.reset()
    fast.new_epoch()
    fast.record(0, *steps[0])
    fast.accuracy.reset()  # drops the appended inputs too
    assert torch.isnan(fast.accuracy.compute())


def test_hook_bookkeeping_attributes_skip_module_setattr():
    """`_current_fx_name` is set directly (str/None); modules, parameters and other values still register."""
    model = LeakyReLUMLP(in_features=4, widths=[3])
    model._current_fx_name = "training_step"
    assert model._current_fx_name == "training_step" and "_current_fx_name" not in model._modules
    model._current_fx_name = None
    assert model._current_fx_name is None
    model.extra = torch.nn.Linear(2, 2)
    model.scale = torch.nn.Parameter(torch.ones(()))
    assert "extra" in model._modules and "scale" in model._parameters
    from lightning_nsv.models.layers import PlainHookAttributes

    conv = ConvFCNet(in_channels=1, image_size=8, fc_depth=1, fc_width=4, conv_channels=2)
    assert isinstance(model, PlainHookAttributes) and isinstance(conv, PlainHookAttributes)


class _HookCounts(Callback):
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1

    def on_train_batch_end(self, *args, **kwargs) -> None:
        self._count("batch_end")

    def on_before_backward(self, *args, **kwargs) -> None:
        self._count("before_backward")

    def on_after_backward(self, *args, **kwargs) -> None:
        self._count("after_backward")

    def on_before_optimizer_step(self, *args, **kwargs) -> None:
        self._count("before_optimizer_step")


def _fit_opt(tmp_path, manual, max_epochs=2, ckpt_path=None, **kwargs):
    pl.seed_everything(0, verbose=False)
    model = LeakyReLUMLP(widths=[16, 16], lr=0.05, manual_optimization=manual, **kwargs)
    hooks = _HookCounts()
    trainer = _trainer(tmp_path, max_epochs, limit_val_batches=0, callbacks=[hooks])
    trainer.fit(model, datamodule=DigitsDataModule(m=120, batch_size=25, seed=3), ckpt_path=ckpt_path)
    return model, trainer, hooks.counts


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_manual_optimization_gives_the_automatic_weights_bit_for_bit(tmp_path, optimizer):
    auto, auto_trainer, auto_hooks = _fit_opt(tmp_path / "a", False, optimizer=optimizer)
    manual, manual_trainer, manual_hooks = _fit_opt(tmp_path / "m", True, optimizer=optimizer)
    assert not manual.automatic_optimization and auto.automatic_optimization
    assert manual.hparams.manual_optimization and "manual_optimization" not in auto.hparams  # saved when set
    for a, b in zip(auto.state_dict().values(), manual.state_dict().values()):
        assert torch.equal(a, b)
    assert manual_trainer.global_step == auto_trainer.global_step == 2 * 5
    assert manual_hooks == auto_hooks == {k: 10 for k in ("batch_end", "before_backward", "after_backward",
                                                          "before_optimizer_step")}
    for key in ("train_loss", "train_error_running"):
        assert float(manual_trainer.callback_metrics[key]) == float(auto_trainer.callback_metrics[key])


@pytest.mark.filterwarnings("ignore:The dirpath has changed from")
def test_manual_optimization_refuses_schedulers_and_a_switch_on_resume(tmp_path):
    class WithScheduler(LeakyReLUMLP):
        def configure_optimizers(self):
            optimizer = super().configure_optimizers()
            return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, 1)]

    trainer = _trainer(tmp_path, 1, limit_val_batches=0)
    with pytest.raises(ValueError, match="does not step LR schedulers"):
        trainer.fit(WithScheduler(widths=[4], manual_optimization=True), datamodule=DigitsDataModule(m=50))
    _, trainer, _ = _fit_opt(tmp_path / "auto", False, max_epochs=1)
    trainer.save_checkpoint(tmp_path / "auto.ckpt")
    with pytest.raises(ValueError, match="saved with manual_optimization=False"):
        _fit_opt(tmp_path / "resume", True, ckpt_path=tmp_path / "auto.ckpt")
    model = LeakyReLUMLP.load_from_checkpoint(tmp_path / "auto.ckpt", manual_optimization=True)  # no fit: fine
    assert not model.automatic_optimization
    resumed, trainer, _ = _fit_opt(tmp_path / "resume", False, ckpt_path=tmp_path / "auto.ckpt")
    assert trainer.global_step == 10


@pytest.mark.filterwarnings("ignore:The dirpath has changed from")
def test_manual_optimization_resumes_as_the_uninterrupted_run(tmp_path):
    whole, whole_trainer, _ = _fit_opt(tmp_path / "whole", True, max_epochs=2)
    _, first, _ = _fit_opt(tmp_path / "first", True, max_epochs=1)
    first.save_checkpoint(tmp_path / "manual.ckpt")
    resumed, trainer, _ = _fit_opt(tmp_path / "resumed", True, max_epochs=2, ckpt_path=tmp_path / "manual.ckpt")
    assert trainer.global_step == whole_trainer.global_step == 10
    for a, b in zip(whole.state_dict().values(), resumed.state_dict().values()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("make, shape, classes", [
    (lambda: LeakyReLUMLP(in_features=4, widths=[3]), (4,), 2),
    (lambda: ConvFCNet(in_channels=1, image_size=4, fc_depth=1, fc_width=3, conv_channels=2, num_classes=3),
     (1, 4, 4), 3),
    (lambda: SkipNetwork.mlp(4, [5], 3, num_skip_units=0), (4,), 3),
])
def test_a_label_out_of_range_in_a_later_batch_is_named(tmp_path, make, shape, classes):
    y = torch.arange(24) % 2
    y[21] = classes  # batch 2 of 8
    with pytest.raises(ValueError, match=rf"labels must be in 0..{classes - 1}, got label {classes} .*in training "
                                         r"batch 2|got labels \[0, 1, 2\] in training batch 2"):
        _labels_fit(tmp_path, make(), torch.randn(24, *shape), y)


def test_labels_of_shape_n_by_1_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"LeakyReLUMLP needs one class label per sample, a tensor of shape \(n,\), "
                                         r"got labels of shape \(8, 1\) in training batch 0; .*`y.reshape\(-1\)`"):
        _labels_fit(tmp_path, LeakyReLUMLP(in_features=4, widths=[3]), torch.randn(16, 4),
                    (torch.arange(16) % 2)[:, None])


def test_a_head_that_does_not_fit_num_classes_is_named(tmp_path):
    model = LeakyReLUMLP(in_features=4, widths=[3])  # num_classes=1: one logit
    model.net[-1] = torch.nn.Linear(3, 2)  # a head with two outputs
    with pytest.raises(ValueError, match=r"LeakyReLUMLP declares num_classes=1 \(outputs of shape \(8,\) for a batch "
                                         r"of 8\), but its network gives outputs of shape \(8, 2\); build it with "
                                         r"num_classes=2"):
        _labels_fit(tmp_path, model, torch.randn(16, 4), torch.arange(16) % 2)


def test_layers_too_large_for_memory_are_refused_with_their_sizes_and_bytes(monkeypatch):
    import lightning_nsv.memory as memory

    monkeypatch.setattr(memory, "available_memory_bytes", lambda: 24_000_000_000)  # as on the machine
    with pytest.raises(ValueError, match=r"^Linear layers of sizes 64→200000→200000→1 hold 40,013,400,001 parameters, "
                                         r"160,053,600,004 bytes \(160.1 GB\) in torch.float32, more than the 24.0 GB "
                                         r"of memory available; choose narrower layers"):
        LeakyReLUMLP(widths=[200000, 200000])
    monkeypatch.setattr(memory, "available_memory_bytes", lambda: 900_000)
    with pytest.raises(ValueError, match=r"sizes 784→300→10 hold 238,510 parameters, 954,040 bytes"):
        SkipNetwork(net={"in_features": 784, "widths": [300], "out_features": 10, "activation": "sigmoid"})
    monkeypatch.setattr(memory, "available_memory_bytes", lambda: 2_000_000)
    assert LeakyReLUMLP(in_features=784, widths=[300], num_classes=10).net[-1].out_features == 10
