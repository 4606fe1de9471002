"""Bad input and faults at the callback: each gets a message that names the problem and the fix, and leaves no
result file or half-written log behind."""
import logging
import re
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_nsv.callbacks import NetworkSupportVectors
from lightning_nsv.compat import PACKAGE, LightningPackageMismatch, pl
from lightning_nsv.extract import UnsupportedNetworkError


class Classifier(pl.LightningModule):
    """A user's module: an nn.Sequential head; ``clean_inputs`` repairs NaN inputs inside the training step."""

    def __init__(self, clean_inputs=False, lr=0.1, sequential=True):
        super().__init__()
        layers = [nn.Flatten(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1)]
        if sequential:
            self.model = nn.Sequential(*layers)
        else:
            self.flatten, self.hidden, self.act, self.out = layers
        self.clean_inputs, self.lr = clean_inputs, lr

    def forward(self, x):
        if hasattr(self, "model"):
            return self.model(x)[:, 0]
        return self.out(self.act(self.hidden(self.flatten(x))))[:, 0]

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.clean_inputs:
            x = torch.nan_to_num(x)
        return F.binary_cross_entropy_with_logits(self(x), y.float())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def _data(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 4, 4, generator=g)
    return x, (x.flatten(1)[:, 0] > 0).long()


def _fit(tmp_path, model, x, y, callback=None, max_epochs=2, logger=False, batch_size=16, **kwargs):
    callback = callback or NetworkSupportVectors(save_dir=str(tmp_path / "nsv"))
    trainer = pl.Trainer(max_epochs=max_epochs, callbacks=[callback], logger=logger, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path,
                         accelerator="cpu", **kwargs)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(workers|log_every_n_steps|LeafSpec|val_dataloader).*")
        trainer.fit(model, DataLoader(TensorDataset(x, y), batch_size=batch_size))
    return trainer, callback


def _no_results(tmp_path):
    return not list(tmp_path.rglob("*.pt")) and not list(tmp_path.rglob("*.json")) and not list(
        tmp_path.rglob("*.tmp"))


def test_nan_in_the_first_batch_is_named(tmp_path):
    x, y = _data()
    x[3, 0, 1, 2] = float("nan")
    with pytest.raises(ValueError, match=r"first training batch holds NaN/inf inputs \(row 3 of the batch\); clean"):
        _fit(tmp_path, Classifier(), x, y)
    assert _no_results(tmp_path)


@pytest.mark.filterwarnings("ignore:NetworkSupportVectors. zero training error was not reached:UserWarning")
@pytest.mark.filterwarnings("ignore:NetworkSupportVectors. parameter .* holds NaN:UserWarning")
def test_nan_deep_in_the_training_set_is_named_and_counts_as_an_error(tmp_path):
    x, y = _data()
    x[45, 0, 0, 0] = float("inf")
    with pytest.warns(UserWarning, match=r"training sample 45 holds NaN/inf inputs; clean the data"):
        _, callback = _fit(tmp_path, Classifier(clean_inputs=True), x, y, max_epochs=30)
    assert callback.zero_error_epoch is None and _no_results(tmp_path)


def test_a_nan_weight_before_training_is_named(tmp_path):
    x, y = _data()
    model = Classifier()
    with torch.no_grad():
        model.model[1].weight[2, 3] = float("nan")
    with pytest.raises(ValueError, match=r"parameter model.1.weight holds NaN \(1 of 256 entries\) before training: "
                                         r"the network has diverged \(lower the learning rate"):
        _fit(tmp_path, model, x, y)
    assert _no_results(tmp_path)


def test_a_diverged_network_is_not_reported_at_zero_error(tmp_path):
    x, y = _data()
    with pytest.warns(UserWarning) as record:
        _, callback = _fit(tmp_path, Classifier(lr=1e30), x * 1e10, y, max_epochs=3)
    messages = [str(w.message) for w in record]
    assert any(re.search(r"parameter model\.\d\.(weight|bias) holds (NaN|inf).*diverged", m) for m in messages), messages
    assert any("non-finite values (see the warning above): fix that first" in m for m in messages), messages
    assert callback.zero_error_epoch is None and callback.metrics == {} and _no_results(tmp_path)


@pytest.mark.filterwarnings("ignore:Total length of `(DataLoader|CombinedLoader)` across ranks is zero")
def test_an_empty_training_set_is_refused(tmp_path):
    x, y = torch.zeros(0, 1, 4, 4), torch.zeros(0, dtype=torch.long)
    callback = NetworkSupportVectors(save_dir=str(tmp_path / "nsv"))
    trainer = pl.Trainer(max_epochs=1, callbacks=[callback], logger=False, enable_progress_bar=False,
                         enable_checkpointing=False, default_root_dir=tmp_path)
    with pytest.warns(UserWarning, match=r"the training dataloader of the DataLoader passed to `fit` has no "
                                         r"batches \(0 samples\), so Lightning did not train.*no support-vector "
                                         r"analysis ran and no file was written"):
        trainer.fit(Classifier(), DataLoader(TensorDataset(x, y), batch_size=4))
    assert callback.zero_error_epoch is None and _no_results(tmp_path)
    with pytest.raises(ValueError, match="the training set is empty, so there is nothing to analyse"):
        callback.on_train_start(_FakeTrainer(TensorDataset(x, y)), Classifier())


class _FakeTrainer:
    fast_dev_run = False
    limit_train_batches = 1.0

    def __init__(self, dataset):
        self.datamodule, self.train_dataloader = None, DataLoader(dataset)


@pytest.mark.filterwarnings("ignore:NetworkSupportVectors. zero training error was not reached:UserWarning")
def test_part_of_the_training_set_is_said(tmp_path):
    x, y = _data()
    with pytest.warns(UserWarning, match=r"`limit_train_batches=0.25` trains on part of the training set, but zero "
                                         r"training error is checked and the SVM fitted on all 64 training samples"):
        _fit(tmp_path, Classifier(), x, y, max_epochs=1, limit_train_batches=0.25)


def test_fast_dev_run_skips_the_analysis_and_says_so(tmp_path, caplog):
    x, y = _data()
    with caplog.at_level(logging.INFO, logger=f"{PACKAGE}.utilities.rank_zero"):
        logging.getLogger(f"{PACKAGE}.utilities.rank_zero").addHandler(caplog.handler)
        _fit(tmp_path, Classifier(), x, y, fast_dev_run=True)
    assert "fast_dev_run, so the support-vector analysis is skipped" in caplog.text
    assert _no_results(tmp_path)


@pytest.mark.parametrize("labels, message", [
    (lambda y: y.float() / 2, r"binary labels must be 0/1 or -1/\+1, got values \[0.0, 0.5\]"),
    (lambda y: y * 3, r"binary labels must be 0/1 or -1/\+1, got values \[0, 3\]"),
])
def test_labels_that_are_not_binary_are_refused_at_the_first_batch(tmp_path, labels, message):
    x, y = _data()
    with pytest.raises(ValueError, match=message):
        _fit(tmp_path, Classifier(), x, labels(y))
    assert _no_results(tmp_path)


def test_batches_that_are_not_pairs_are_refused(tmp_path):
    class Unlabelled(Classifier):
        def training_step(self, batch, batch_idx):
            return self(batch[0] if isinstance(batch, (list, tuple)) else batch).sum()

    callback = NetworkSupportVectors(save_dir=str(tmp_path / "nsv"))
    trainer = pl.Trainer(max_epochs=1, callbacks=[callback], logger=False, enable_progress_bar=False,
                         enable_checkpointing=False, default_root_dir=tmp_path)
    with pytest.raises(TypeError, match=r"batches must be \(inputs, labels\) tuples .* got Tensor"):
        trainer.fit(Unlabelled(), DataLoader(_data()[0], batch_size=8))


def test_a_module_without_a_sequential_has_no_head_and_is_analysed_whole(tmp_path):
    x, y = _data()
    with pytest.raises(UnsupportedNetworkError, match=r"Classifier: could not tell which nn.Sequential holds the "
                                                      r"classifier \(found: none\)\. Pass `path_module`"):
        _fit(tmp_path, Classifier(sequential=False), x, y, callback=NetworkSupportVectors(scope="head"))
    _, callback = _fit(tmp_path, Classifier(sequential=False, lr=0.5), x, y, max_epochs=60)
    assert callback.analysis.scope == "whole network: 2 maps, 1 gate layer, 0 max-pools, 16 gates"


def test_a_missing_path_module_is_named(tmp_path):
    x, y = _data()
    with pytest.raises(UnsupportedNetworkError, match=r"Classifier has no submodule 'head' for `path_module`"):
        _fit(tmp_path, Classifier(), x, y, callback=NetworkSupportVectors(path_module="head"))


def test_a_trainer_of_the_other_lightning_package_is_refused_with_the_fix():
    other = "lightning.pytorch" if PACKAGE == "pytorch_lightning" else "pytorch_lightning"
    other_pl = pytest.importorskip(other)
    trainer = other_pl.Trainer(logger=False, enable_progress_bar=False, enable_checkpointing=False)
    with pytest.raises(LightningPackageMismatch, match=rf"NetworkSupportVectors is built on {PACKAGE}, but the "
                                                        rf"Trainer comes from {other}.*LIGHTNING_NSV_PACKAGE="):
        NetworkSupportVectors().setup(trainer, Classifier(), "fit")


@pytest.mark.parametrize("value", [0, -1])
def test_max_dense_bytes_must_be_positive(value):
    with pytest.raises(ValueError, match=f"`max_dense_bytes` must be a positive integer, got {value}"):
        NetworkSupportVectors(max_dense_bytes=value)


class Planar(Classifier):
    """A 2-8-1 ReLU classifier of 2-D points: its analysis has every figure (boundaries, path weights)."""

    def __init__(self):
        super().__init__(lr=0.5)
        self.model = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 1))


def _planar_data():
    x = torch.randn(40, 2, generator=torch.Generator().manual_seed(1))
    return x, (x[:, 0] + 0.3 * x[:, 1] > 0).long()


def test_without_a_logger_figures_and_results_go_to_files(tmp_path, caplog):
    pl.seed_everything(0)
    x, y = _planar_data()
    callback = NetworkSupportVectors(save_dir=str(tmp_path / "nsv"))
    with caplog.at_level(logging.INFO, logger=f"{PACKAGE}.utilities.rank_zero"):
        logging.getLogger(f"{PACKAGE}.utilities.rank_zero").addHandler(caplog.handler)
        _fit(tmp_path, Planar(), x, y, callback=callback, max_epochs=300, batch_size=40)
    assert callback.zero_error_epoch is not None
    figures = {p.name.split("_step")[0] for p in (tmp_path / "nsv" / "figures").glob("*.png")}
    assert {"nsv_decision_boundaries", "nsv_path_weights", "nsv_alpha_histogram"} <= figures
    assert list((tmp_path / "nsv" / "figures").glob("nsv_report_step*.md"))
    assert f"figures and reports go to {tmp_path / 'nsv' / 'figures'} (no logger is attached)" in caplog.text


def test_a_csv_logger_gets_figures_as_files(tmp_path):
    pl.seed_everything(0)
    x, y = _planar_data()
    logger = pl.loggers.CSVLogger(tmp_path, name="csv")
    callback = NetworkSupportVectors()
    _fit(tmp_path, Planar(), x, y, callback=callback, max_epochs=300, batch_size=40, logger=logger)
    assert callback.zero_error_epoch is not None
    run = Path(logger.log_dir)
    assert list((run / "nsv" / "figures").glob("nsv_decision_boundaries_step*.png"))
    assert "nsv/n_support" in (run / "metrics.csv").read_text()


@pytest.mark.filterwarnings("ignore:NetworkSupportVectors. zero training error was not reached:UserWarning")
def test_an_integer_batch_limit_below_the_loader_length_is_said(tmp_path):
    x, y = _data()
    with pytest.warns(UserWarning, match=r"`limit_train_batches=2` trains on part of the training set"):
        _fit(tmp_path, Classifier(), x, y, max_epochs=1, limit_train_batches=2)


@pytest.mark.parametrize("kwargs, message", [
    ({"every_n_epochs": 1.5}, r"`every_n_epochs` must be an integer, got 1.5 \(float\); pass e.g. every_n_epochs=1"),
    ({"every_n_epochs": "2"}, r"`every_n_epochs` must be an integer, got '2' \(str\)"),
    ({"every_n_epochs": True}, r"`every_n_epochs` must be an integer, got True \(bool\)"),
    ({"probe_size": 2.5}, r"`probe_size` must be an integer, got 2.5"),
    ({"batch_size": "64"}, r"`batch_size` must be an integer, got '64'"),
    ({"seed": None}, r"`seed` must be an integer, got None"),
    ({"intercept": "no"}, r"`intercept` must be True or False, got 'no' \(str\); a string such as 'false' would count"),
    ({"stop_on_zero_error": 0}, r"`stop_on_zero_error` must be True or False, got 0 \(int\)"),
    ({"C": "1e7"}, r"`C` must be a real number, got '1e7' \(str\)"),
    ({"path_module": 3}, r"`path_module` must be the dotted name of a submodule .* got 3"),
    ({"embedding": nn.Flatten()}, r"`embedding` must be the dotted name of a submodule .* got Flatten\(.*\)"),
    ({"save_dir": 5}, r"`save_dir` must be a path \(str or os.PathLike\) or None, got 5"),
])
def test_arguments_of_the_wrong_type_are_refused_at_construction(kwargs, message):
    with pytest.raises(TypeError, match=message):
        NetworkSupportVectors(**kwargs)


class Shifted(Classifier):
    """Adds a learnable scalar outside the path part: 0 at step 0 (the first-batch check passes), not later."""

    def __init__(self):
        super().__init__(lr=0.5)
        self.shift = nn.Parameter(torch.zeros(()))

    def forward(self, x):
        return self.model(x)[:, 0] + self.shift

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.binary_cross_entropy_with_logits(self(x), y.float()) + (self.shift - 2.0) ** 2


def test_a_module_whose_output_leaves_its_head_is_refused_at_every_analysis(tmp_path):
    pl.seed_everything(0)
    x, y = _data()
    with pytest.raises(ValueError, match=r"the output of Shifted is not the output of its path part Shifted.model "
                                         r"\(.* on training sample \d+, checked on the 64 training samples nearest its "
                                         r"decision boundary at epoch \d+\).*Choices: make `forward` return the path "
                                         r"part's output unchanged.*`path_module=`/`embedding=`.*whole network"):
        _fit(tmp_path, Shifted(), x, y, max_epochs=200, batch_size=64)
    assert _no_results(tmp_path)


def test_every_training_label_of_one_class_is_said_and_not_analysed(tmp_path):
    x, _ = _data()
    with pytest.warns(UserWarning, match=r"every training label is negative \(0 or -1\): with one class.*does not "
                                         r"run and no file is written") as record:
        _, callback = _fit(tmp_path, Classifier(), x, torch.zeros(len(x), dtype=torch.long), max_epochs=3)
    assert not any("zero training error was not reached" in str(w.message) for w in record)
    assert callback.analysis is None and callback.metrics == {} and _no_results(tmp_path)


def test_identical_inputs_with_different_labels_are_named_not_advised_to_train_longer(tmp_path):
    x, y = _data()
    x[40], y[40] = x[7], 1 - y[7]
    with pytest.warns(UserWarning, match=r"zero training error was not reached.*Training samples 7 and 40 have the "
                                         r"same input and different labels: no classifier separates them") as record:
        _fit(tmp_path, Classifier(), x, y, max_epochs=3)
    assert not any("Train longer" in str(w.message) for w in record)
    assert _no_results(tmp_path)
