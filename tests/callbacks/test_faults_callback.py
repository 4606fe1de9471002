"""More faults at the callback, its models and the analysis (issue 30, "go wider"): each a message that names the
problem and what to do, no result for a refused case."""
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_nsv.callbacks import NetworkSupportVectors
from lightning_nsv.compat import pl
from lightning_nsv.extract import UnsupportedNetworkError
from tests.callbacks.test_callback_bad_input import Classifier, _data, _fit, _no_results


class ColumnLabels(Classifier):
    """Trains on labels of shape (n, 1), as many users write them for a logit of shape (n, 1)."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.binary_cross_entropy_with_logits(self(x)[:, None], y.float())


def test_labels_of_shape_n_by_1_are_read_as_one_label_per_sample(tmp_path):
    """Labels (n, 1) times outputs (n,) broadcast to (n, n): the network was never found at zero error."""
    pl.seed_everything(0)
    x, y = _data()
    _, callback = _fit(tmp_path, ColumnLabels(lr=0.5), x, y[:, None], max_epochs=60)
    assert callback.zero_error_epoch is not None and callback.analysis.m == len(x)


def test_one_hot_labels_are_refused_with_the_fix(tmp_path):
    x, y = _data()
    with pytest.raises(ValueError, match=r"needs one class label per sample, of shape \(n,\) or \(n, 1\), got labels "
                                         r"of shape \(16, 2\); give class indices \(`y.argmax\(1\)`"):
        _fit(tmp_path, Classifier(), x, F.one_hot(y, 2))
    assert _no_results(tmp_path)


def test_a_single_training_sample_is_said_and_not_analysed(tmp_path):
    x, y = _data()
    with pytest.warns(UserWarning, match=r"every training label is positive \(1\): with one class"):
        _, callback = _fit(tmp_path, Classifier(), x[y == 1][:1], y[y == 1][:1], max_epochs=3)
    assert callback.analysis is None and _no_results(tmp_path)


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors is a no-op:UserWarning")
def test_a_head_with_zero_hidden_units_is_refused(tmp_path):
    model = Classifier()
    model.model = nn.Sequential(nn.Flatten(), nn.Linear(16, 0), nn.ReLU(), nn.Linear(0, 1))
    with pytest.raises(UnsupportedNetworkError, match=r"Classifier.model: layer 1, Linear\(in_features=16, "
                                                      r"out_features=0.*has no outputs: every layer of the path part "
                                                      r"needs at least one unit"):
        _fit(tmp_path, model, *_data(), callback=NetworkSupportVectors(scope="head"))
    assert _no_results(tmp_path)


class Validated(Classifier):
    def validation_step(self, batch, batch_idx):
        pass


def _val_fault(kind):
    xv, yv = _data(32, seed=1)
    if kind == "nan":
        xv[5, 0, 0, 0] = float("nan")
    elif kind == "label":
        yv[3] = 2
    else:
        xv = torch.randn(32, 1, 5, 5)
    return xv, yv


@pytest.mark.parametrize("kind, message", [
    ("nan", r"hold NaN/inf inputs \(validation sample 5\)"),
    ("label", r"have labels the head cannot read \(binary labels must be 0/1 or -1/\+1, got values \[0, 1, 2\]"),
    ("shape", r"embed to 25 features, the training samples to 16"),
])
def test_bad_validation_data_is_named_and_the_analysis_runs_without_it(tmp_path, kind, message):
    """Found only at the end of the analysis before (after the solve): an error that lost it."""
    pl.seed_everything(0)
    x, y = _data()
    callback = NetworkSupportVectors(save_dir=str(tmp_path / "nsv"))
    trainer = pl.Trainer(max_epochs=60, callbacks=[callback], logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path,
                         accelerator="cpu")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(workers|log_every_n_steps).*")
        with pytest.warns(UserWarning, match=rf"the validation samples {message}.*, so the analysis runs without "
                                             r"them \(no `nsv/val_\*` metrics\); fix the validation data"):
            trainer.fit(Validated(lr=0.5), DataLoader(TensorDataset(x, y), batch_size=16),
                        DataLoader(TensorDataset(*_val_fault(kind)), batch_size=16))
    assert callback.zero_error_epoch is not None
    assert "n_support" in callback.metrics and not any(k.startswith("val_") for k in callback.metrics)


def test_every_label_of_one_class_of_a_k_class_head_is_said(tmp_path):
    class Three(Classifier):
        def __init__(self):
            super().__init__()
            self.model = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 3))

        def forward(self, x):
            return self.model(x)

        def training_step(self, batch, batch_idx):
            return F.cross_entropy(self(batch[0]), batch[1])

    x, _ = _data()
    with pytest.warns(UserWarning, match=r"every training label is class 2: with one class"):
        _, callback = _fit(tmp_path, Three(), x, torch.full((len(x),), 2), max_epochs=3)
    assert callback.analysis is None and _no_results(tmp_path)


def test_a_bad_label_deep_in_a_users_training_set_is_placed(tmp_path):
    """The callback reads labels of a user's module in its own pass: a bad one past the first batch is placed."""
    x, y = _data()
    y[50] = 3
    with pytest.raises(ValueError, match=r"training samples 48..63 \(of the callback's pass in the dataset's order\): "
                                         r"binary labels must be 0/1 or -1/\+1, got values \[0, 1, 3\]"):
        _fit(tmp_path, Classifier(), x, y, callback=NetworkSupportVectors(save_dir=str(tmp_path / "nsv"),
                                                                           batch_size=16, probe_size=0))
    assert _no_results(tmp_path)
