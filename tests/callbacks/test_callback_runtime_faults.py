"""Faults of NetworkSupportVectors at run time: precision plugins that change the module's dtype, an output folder
that cannot be made, a forward that returns more than logits, a training set without a length."""
import os
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from lightning_nsv.callbacks import NetworkSupportVectors
from lightning_nsv.compat import pl
from tests.callbacks.test_callback_bad_input import Classifier, _data, _fit, _no_results


@pytest.mark.filterwarnings("ignore:.*computes in torch.bfloat16:UserWarning")
@pytest.mark.parametrize("precision", ["64-true", "bf16-true"])
def test_precisions_that_change_the_modules_dtype_are_analysed(tmp_path, precision):
    """Lightning feeds the module inputs in its dtype; the callback's own forwards must too."""
    pl.seed_everything(0)
    x, y = _data()
    _, callback = _fit(tmp_path, Classifier(lr=0.5), x, y, max_epochs=60, precision=precision)
    assert callback.zero_error_epoch is not None and callback.analysis.m == len(x)
    assert callback.result_path is not None and callback.result_path.exists()


def _refused_before_training(tmp_path, save_dir, error, match):
    model = Classifier()
    before = [p.clone() for p in model.parameters()]
    with pytest.raises(error, match=match):
        _fit(tmp_path, model, *_data(), callback=NetworkSupportVectors(save_dir=str(save_dir)))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # refused before any step


def test_a_save_dir_that_is_a_file_is_refused_before_training(tmp_path):
    path = tmp_path / "results"
    path.write_text("not a directory")
    _refused_before_training(tmp_path, path, NotADirectoryError, r"`save_dir='.*results'` is an existing file, so no "
                                                                 r"result could be saved there after training; name a "
                                                                 r"directory")
    assert path.read_text() == "not a directory" and _no_results(tmp_path)


def test_a_save_dir_under_a_file_is_refused_before_training(tmp_path):
    blocker = tmp_path / "results"
    blocker.write_text("a file")
    _refused_before_training(tmp_path, blocker / "nsv", NotADirectoryError,
                             r"`save_dir='.*results/nsv'` lies under the existing file .*results, so no result could "
                             r"be saved there after training")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc, where no folder can be made")
def test_a_save_dir_that_cannot_be_created_is_refused_before_training(tmp_path):
    _refused_before_training(tmp_path, "/proc/nsv_results", PermissionError,
                             r"`save_dir='/proc/nsv_results'` cannot be created: /proc takes no new folder .*name a "
                             r"writable directory")


class TupleOutput(Classifier):
    def forward(self, x):
        return super().forward(x), x


def test_a_forward_that_returns_a_tuple_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"TupleOutput.forward returns a tuple, not one tensor of logits.*return the "
                                         r"logits alone from forward"):
        _fit(tmp_path, TupleOutput(), *_data())
    assert _no_results(tmp_path)


class Batches(IterableDataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __iter__(self):
        for start in range(0, len(self.x), 16):
            yield self.x[start:start + 16], self.y[start:start + 16]


def test_an_iterable_training_set_is_refused_with_what_is_needed(tmp_path):
    x, y = _data()
    trainer = pl.Trainer(max_epochs=2, callbacks=[NetworkSupportVectors(save_dir=str(tmp_path / "nsv"))],
                         logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, default_root_dir=tmp_path, accelerator="cpu")
    with warnings.catch_warnings(), pytest.raises(TypeError, match=r"needs a training set it can index and count "
                                                                   r"\(a map-style Dataset with `__len__`.*got Batches"):
        warnings.filterwarnings("ignore", message=".*(workers|log_every_n_steps|LeafSpec|val_dataloader).*")
        trainer.fit(Classifier(), DataLoader(Batches(x, y), batch_size=None))
    assert _no_results(tmp_path)
