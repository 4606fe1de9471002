"""What the support-vector callback says and draws for a user's flat inputs: the saved result's path, and the image
grid of the support vectors (reshaped by ``image_shape``) or one line saying why there is none."""
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import DataLoader, TensorDataset

from lightning_nsv.callbacks import NetworkSupportVectors
from lightning_nsv.compat import pl
from lightning_nsv.datamodules import DigitsDataModule
from tests.callbacks.test_nsv_callback import UserClassifier, trainer


class FlatDigits(pl.LightningDataModule):
    """The digits as 64 flat features, as a user's own data module might give them."""

    def __init__(self, image_shape=None):
        super().__init__()
        digits = DigitsDataModule(m=300, seed=0, batch_size=50)
        digits.setup("fit")
        x, y = digits.train_dataset.tensors
        self.dataset = TensorDataset(x.reshape(len(x), -1), y)
        if image_shape is not None:
            self.image_shape = image_shape

    def train_dataloader(self):
        return DataLoader(self.dataset, batch_size=50, shuffle=True)


def fit(tmp_path, data, **callback_args):
    pl.seed_everything(0)
    callback = NetworkSupportVectors(probe_size=64, **callback_args)
    run = trainer(tmp_path, callback)
    run.fit(UserClassifier(), datamodule=data)
    assert callback.analysis is not None
    return run, callback


def images(run) -> list[str]:
    return EventAccumulator(str(Path(run.logger.log_dir))).Reload().Tags()["images"]


@pytest.fixture
def said(monkeypatch):
    """What the callback says (its info lines), whatever the logging configuration a test before left."""
    import lightning_nsv.callbacks.nsv_outputs as outputs

    lines: list[str] = []
    monkeypatch.setattr(outputs, "rank_zero_info", lambda text, *args, **kwargs: lines.append(str(text)))
    return lines


@pytest.mark.parametrize("where", ["callback", "datamodule"])
def test_flat_inputs_are_drawn_with_the_image_shape(tmp_path, said, where):
    if where == "callback":
        run, callback = fit(tmp_path, FlatDigits(), image_shape=(8, 8))
    else:
        run, callback = fit(tmp_path, FlatDigits(image_shape=(1, 8, 8)))
    assert "nsv/support_vectors" in images(run)
    assert said and not [line for line in said if "no support-vector image grid" in line]


def test_flat_inputs_without_a_shape_say_why_there_is_no_grid_and_the_result_path_is_said(tmp_path, said):
    run, callback = fit(tmp_path, FlatDigits())
    assert "nsv/support_vectors" not in images(run)
    text = "\n".join(said)
    assert text.count("no support-vector image grid: inputs of shape (64,) are not images") == 1
    assert "image_shape=(C, H, W)" in text
    assert callback.result_path is not None and callback.result_path.is_file()
    assert callback.result_path.suffix == ".pt" and callback.result_path.with_suffix(".json").is_file()
    assert f"saved {callback.result_path}" in text


def test_an_image_shape_that_does_not_fit_the_inputs_is_said(tmp_path, said):
    run, _ = fit(tmp_path, FlatDigits(), image_shape=(1, 7, 7))
    assert "nsv/support_vectors" not in images(run)
    assert "image_shape=(1, 7, 7) holds 49 values, a sample 64" in "\n".join(said)


@pytest.mark.parametrize("bad", [(8,), (1, 8, 8, 1), "8x8", (0, 8), (8.0, 8), (True, 8)])
def test_bad_image_shapes_are_refused(bad):
    with pytest.raises(ValueError, match="image_shape"):
        NetworkSupportVectors(image_shape=bad)
