"""ResNetClassifier: shapes, refused arguments, a checkpoint round trip, its whole network against the path kernel's
scope, and the digits config trained through the CLI to zero training error."""
from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
import yaml

from lightning_nsv.cli import main
from lightning_nsv.compat import Callback, pl
from lightning_nsv.datamodules import DigitsDataModule
from lightning_nsv.models import ResNetClassifier, SmallResNet
from lightning_nsv.models.layers import eval_mode
from tests.analysis.test_whole_network import two_classes

CONFIGS = Path(__file__).resolve().parents[2] / "examples" / "configs"
QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
             enable_checkpointing=False, accelerator="cpu", devices=1)


class StopAtZeroTrainingError(Callback):
    """Counts the training errors of the frozen network in eval mode (BatchNorm's running statistics) after each
    epoch, and stops training at the first epoch with none. ``runs`` holds each instance's counts."""

    runs: list[list[int]] = []

    def __init__(self) -> None:
        self.errors: list[int] = []
        self.runs.append(self.errors)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        dataset = trainer.datamodule.train_dataset
        x = torch.stack([dataset[i][0] for i in range(len(dataset))])
        y = torch.tensor([int(dataset[i][1]) for i in range(len(dataset))])
        with eval_mode(pl_module), torch.no_grad():
            self.errors.append(int(((pl_module(x) > 0).long() != y).sum()))
        if self.errors[-1] == 0:
            trainer.should_stop = True


@pytest.mark.parametrize("channels, size, classes, shape", [(1, 8, 1, (3,)), (3, 32, 1, (3,)), (1, 8, 10, (3, 10)),
                                                            (3, 17, 2, (3, 2))])
def test_shapes_on_digits_and_cifar(channels, size, classes, shape):
    model = ResNetClassifier(in_channels=channels, num_classes=classes, width=4, blocks=[1, 2])
    assert model(torch.zeros(3, channels, size, size)).shape == shape
    assert model(torch.zeros(1, channels, size, size)).shape == (1, *shape[1:])  # a batch of one keeps its dim
    assert isinstance(model.net, SmallResNet) and model.num_outputs == classes
    assert sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules()) == 1 + 2 * 3


@pytest.mark.parametrize("kwargs, match", [
    (dict(width=0), "sizes must be positive"), (dict(num_classes=0), "sizes must be positive"),
    (dict(in_channels=0), "sizes must be positive"), (dict(blocks=[]), "blocks non-negative"),
    (dict(blocks=[1, -1]), "blocks non-negative"), (dict(optimizer="rmsprop"), "`optimizer` can be sgd, adam"),
    (dict(lr=0.0), "`lr` must be positive"),
])
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ResNetClassifier(**kwargs)


def test_hparams_rebuild_the_module_and_the_optimizer_reads_them(tmp_path):
    model = ResNetClassifier(in_channels=1, width=4, blocks=(2,), optimizer="adam", lr=0.003, weight_decay=1e-4)
    assert dict(model.hparams) == dict(in_channels=1, num_classes=1, width=4, blocks=[2], beta=0.0, gamma=1.0,
                                       optimizer="adam", lr=0.003, momentum=0.9, weight_decay=1e-4)
    optimizer = model.configure_optimizers()
    assert isinstance(optimizer, torch.optim.Adam) and optimizer.defaults["lr"] == 0.003
    assert {id(p) for g in optimizer.param_groups for p in g["params"]} == {id(p) for p in model.net.parameters()}
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0, default_root_dir=tmp_path,
                         **{**QUIET, "enable_checkpointing": True})
    trainer.fit(model, datamodule=DigitsDataModule(m=40, batch_size=20, seed=0))
    (checkpoint,) = tmp_path.rglob("*.ckpt")
    loaded = ResNetClassifier.load_from_checkpoint(checkpoint)
    x = torch.randn(5, 1, 8, 8)
    with eval_mode(model), eval_mode(loaded), torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x))


def test_k_class_network_trains_with_cross_entropy(tmp_path):
    pl.seed_everything(0, verbose=False)
    model = ResNetClassifier(in_channels=1, num_classes=10, width=4, blocks=[1])
    x, y = torch.randn(8, 1, 8, 8), torch.arange(8)
    logits = model(x)
    torch.testing.assert_close(model._loss(logits, y), torch.nn.functional.cross_entropy(logits, y))
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0, default_root_dir=tmp_path, **QUIET)
    trainer.fit(model, datamodule=DigitsDataModule(m=60, batch_size=20, seed=0, task="multiclass"))
    assert trainer.global_step == 2


def test_whole_network_analysis_reads_every_gate_of_the_resnet():
    from lightning_nsv.analysis import whole_network_support_vectors

    torch.manual_seed(0)
    model = ResNetClassifier(in_channels=1, width=2, blocks=[1, 1]).double()
    x = torch.randn(30, 1, 8, 8, dtype=torch.float64)
    two_classes(model, x)  # the analysis refuses one class
    with torch.no_grad(), eval_mode(model):
        y = (model(x) > 0).long()  # labels the network fits: Assumption 1 holds
    result = whole_network_support_vectors(model, x, y)
    counts = result.scope_counts
    # gates: stem 2·64, two blocks of 2 activations per stage (2·64·2 + 2·16·2), one 2x2 max-pool on 2·8·8
    assert counts.gates == 2 * 64 + 2 * 64 * 2 + 2 * 16 * 2 + 2 * 16 and counts.max_pools == 1
    assert counts.gate_layers == 5 and result.n_hidden == counts.gates
    assert 1 <= result.n_support <= 30 and 0 < result.margin_ratio <= 1 + 1e-9


def test_digits_config_trains_to_zero_training_error_through_the_cli(tmp_path):
    config = CONFIGS / "digits_resnet.yaml"
    stopper = f"{__name__}.{StopAtZeroTrainingError.__name__}"
    main(["fit", f"--config={config}", f"--trainer.default_root_dir={tmp_path}", "--trainer.max_epochs=15",
          "--trainer.logger=false", "--trainer.enable_progress_bar=false",
          f"--trainer.callbacks={stopper}"])  # in place of the config's analysis: the training alone
    errors = StopAtZeroTrainingError.runs[-1]
    assert errors[-1] == 0 and len(errors) < 15, errors  # the config's network and data, within 15 epochs
    (version_config,) = tmp_path.rglob("config.yaml")
    saved = yaml.safe_load(version_config.read_text())
    assert saved["model"]["class_path"] == "lightning_nsv.models.resnet.ResNetClassifier"
    assert saved["trainer"]["max_epochs"] == 15


@pytest.mark.parametrize("name", ["digits_resnet.yaml", "cifar_frogs_ships_resnet.yaml"])
def test_configs_parse_with_the_short_class_name(name, tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        main(["fit", f"--config={CONFIGS / name}", "--model=ResNetClassifier",
              f"--trainer.default_root_dir={tmp_path}", "--print_config"])
    assert done.value.code in (0, None)
    config = yaml.safe_load(capsys.readouterr().out)
    assert config["model"]["class_path"] == "lightning_nsv.models.ResNetClassifier"  # the short name, resolved
    assert config["model"]["init_args"]["in_channels"] == (1 if name.startswith("digits") else 3)
    data = "DigitsDataModule" if name.startswith("digits") else "CIFAR10FrogsShipsDataModule"
    assert config["data"]["class_path"].endswith(data)


def test_every_argument_has_help():
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_class_arguments(ResNetClassifier, "obj")
    helps = {a.dest.split(".", 1)[1]: a.help for a in parser._actions if a.dest.startswith("obj.")}
    names = [p for p in inspect.signature(ResNetClassifier.__init__).parameters if p != "self"]
    assert names and not [name for name in names if not helps.get(name)]
