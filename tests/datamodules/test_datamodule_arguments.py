"""Every public data module refuses a bad argument when it is constructed, naming it with an example of a valid value,
and refuses at setup a ``val_fraction`` that leaves no training samples."""
from __future__ import annotations

import io
import re
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_nsv.datamodules import (TOY_SETS, BinaryMNISTDataModule, CIFAR10FrogsShipsDataModule,
                                       ClassificationDataModule, DigitsDataModule, QuadrantDataModule, Toy2DDataModule,
                                       TorchvisionDataModule)
from lightning_nsv.datamodules.base import EpochBatchSampler
from tests.fake_datasets import write_fake_cifar10, write_fake_mnist

# every class exported by lightning_nsv.datamodules, built without data files (none are read at construction)
MODULES = {
    "ClassificationDataModule": ClassificationDataModule,
    "DigitsDataModule": DigitsDataModule,
    "Toy2DDataModule": Toy2DDataModule,
    "QuadrantDataModule": QuadrantDataModule,
    "TorchvisionDataModule": partial(TorchvisionDataModule, "data"),
    "BinaryMNISTDataModule": partial(BinaryMNISTDataModule, "data"),
    "CIFAR10FrogsShipsDataModule": partial(CIFAR10FrogsShipsDataModule, "data"),
}
# (argument, what its message says, a valid example the message gives)
COUNTS = [("m", "a positive integer or None", "m=500"), ("seed", "a non-negative integer", "seed=0"),
          ("batch_size", "a positive integer", "batch_size=100"), ("num_workers", "a non-negative integer",
                                                                    "num_workers=0")]
REALS = [("val_fraction", r"in \[0, 1\)", "val_fraction=0.2"), ("label_noise", r"in \[0, 1\]", "label_noise=0.1")]


@pytest.mark.parametrize("module", MODULES)
@pytest.mark.parametrize("name, kind, example", COUNTS)
@pytest.mark.parametrize("bad", [2.5, "3", True, np.bool_(True), None, torch.tensor(3)], ids=repr)
def test_integer_argument_of_wrong_type_is_a_type_error(module, name, kind, example, bad):
    if name == "m" and bad is None:  # the documented default: the whole training pool
        assert MODULES[module](m=None).m is None
        return
    with pytest.raises(TypeError, match=rf"^`{name}` must be {kind}.*, got .*\({type(bad).__name__}\); e\.g\. {example}$"):
        MODULES[module](**{name: bad})


@pytest.mark.parametrize("module", MODULES)
@pytest.mark.parametrize("name, kind, example, bad", [("m", "a positive integer or None", "m=500", 0),
                                                      ("seed", "a non-negative integer", "seed=0", -1),
                                                      ("batch_size", "a positive integer", "batch_size=100", 0),
                                                      ("num_workers", "a non-negative integer", "num_workers=0", -1)])
def test_integer_argument_out_of_range_is_a_value_error(module, name, kind, example, bad):
    with pytest.raises(ValueError, match=rf"^`{name}` must be {kind}.*, got {bad}; e\.g\. {example}$"):
        MODULES[module](**{name: np.int64(bad)})


@pytest.mark.parametrize("module", MODULES)
@pytest.mark.parametrize("name, span, example", REALS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), -0.1, 1.5, 10**400])
def test_fraction_non_finite_or_out_of_range_is_a_value_error(module, name, span, example, bad):
    with pytest.raises(ValueError, match=rf"^`{name}` must be {span}, got .*; e\.g\. {example}$"):
        MODULES[module](**{name: bad})


@pytest.mark.parametrize("module", MODULES)
@pytest.mark.parametrize("name, span, example", REALS)
@pytest.mark.parametrize("bad", ["0.2", True, None, torch.tensor(0.2)], ids=repr)
def test_fraction_of_wrong_type_is_a_type_error(module, name, span, example, bad):
    with pytest.raises(TypeError, match=rf"^`{name}` must be a real number, got .*; e\.g\. {example}$"):
        MODULES[module](**{name: bad})


@pytest.mark.parametrize("toy", TOY_SETS)
@pytest.mark.parametrize("noise, span", [(float("nan"), "finite and non-negative"),
                                         (float("inf"), "finite and non-negative"), (-1.0, "non-negative")])
def test_toy_noise_must_be_finite_and_non_negative(toy, noise, span):
    with pytest.raises(ValueError, match=rf"^`noise` must be {span}, got {noise}; e\.g\. noise=0\.1$"):
        Toy2DDataModule(name=toy, noise=noise)


@pytest.mark.parametrize("bad", ["0.1", None, True])
def test_toy_noise_of_wrong_type_is_a_type_error(bad):
    with pytest.raises(TypeError, match=r"^`noise` must be a real number"):
        Toy2DDataModule(noise=bad)


@pytest.mark.parametrize("make, name, bad, error, message", [
    (Toy2DDataModule, "n_samples", "10", TypeError, "an integer of at least 2, got '10' (str); e.g. n_samples=1000"),
    (Toy2DDataModule, "n_samples", 10.5, TypeError, "an integer of at least 2, got 10.5 (float)"),
    (Toy2DDataModule, "n_samples", 1, ValueError, "at least 2, got 1; e.g. n_samples=1000"),
    (QuadrantDataModule, "n_samples", True, TypeError, "an integer of at least 2, got True (bool)"),
    (QuadrantDataModule, "dim", 2.5, TypeError, "a positive integer, got 2.5 (float); e.g. dim=2"),
    (QuadrantDataModule, "dim", 0, ValueError, "a positive integer, got 0; e.g. dim=2"),
])
def test_synthetic_sizes(make, name, bad, error, message):
    with pytest.raises(error, match=f"^`{name}` must be " + re.escape(message)):
        make(**{name: bad})


@pytest.mark.parametrize("make, high", [(DigitsDataModule, 2**64 - 1), (Toy2DDataModule, 2**32 - 1)])
def test_seed_beyond_the_generators_range_is_a_value_error(make, high):
    with pytest.raises(ValueError, match=rf"^`seed` must be at most {high}, got {high + 1}; e\.g\. seed=0$"):
        make(seed=high + 1)


@pytest.mark.parametrize("make", [BinaryMNISTDataModule, CIFAR10FrogsShipsDataModule, TorchvisionDataModule])
@pytest.mark.parametrize("root", [None, 3, b"data"], ids=repr)
def test_root_that_is_no_path_is_a_type_error(make, root):
    with pytest.raises(TypeError, match=r"^`root` must be a directory path \(str or os\.PathLike\), got .*; "
                                        r"e\.g\. root='data'$"):
        make(root)


@pytest.mark.parametrize("make, name", [(DigitsDataModule, "random_labels"),
                                        (partial(BinaryMNISTDataModule, "data"), "download"),
                                        (partial(CIFAR10FrogsShipsDataModule, "data"), "normalize")])
def test_flag_given_as_a_string_is_a_type_error(make, name):
    with pytest.raises(TypeError, match=rf"^`{name}` must be True or False, got 'false' \(str\)"):
        make(**{name: "false"})


def test_cifar_classes_as_one_string_is_a_type_error():
    with pytest.raises(TypeError, match=r"^`classes` must be a sequence of CIFAR-10 class names, got 'frog'"):
        CIFAR10FrogsShipsDataModule("data", classes="frog")


def test_epoch_batch_sampler_refuses_a_float_batch_size():
    with pytest.raises(TypeError, match=r"^`batch_size` must be a positive integer, got 2\.5"):
        EpochBatchSampler(range(5), batch_size=2.5)


@pytest.mark.parametrize("make, message", [
    (partial(DigitsDataModule, val_fraction=0.9999), "DigitsDataModule has no training samples: "
     "val_fraction=0.9999 holds out 1797 of its 1797 samples, leaving 0 for training; lower `val_fraction`"),
    (partial(Toy2DDataModule, n_samples=2, val_fraction=0.9), "Toy2DDataModule has no training samples: "
     "val_fraction=0.9 holds out 2 of its 2 samples"),
    (partial(QuadrantDataModule, n_samples=3, val_fraction=0.9), "val_fraction=0.9 holds out 3 of its 3 samples"),
])
def test_val_fraction_that_leaves_no_training_sample_is_refused_at_setup(make, message):
    dm = make()
    with pytest.raises(ValueError, match=re.escape(message)):
        dm.setup("fit")


def _weights_only_roundtrip(hparams) -> dict:
    """The hyperparameters as a checkpoint holds them, loaded as Lightning loads a checkpoint (weights_only)."""
    buffer = io.BytesIO()
    torch.save(dict(hparams), buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_valid_arguments_with_numpy_values_construct_and_set_up(tmp_path):
    write_fake_mnist(tmp_path / "mnist", n_train=30, n_test=10)
    write_fake_cifar10(tmp_path / "cifar", n_train=40, n_test=20)
    common = dict(m=np.int64(8), seed=np.int32(1), batch_size=np.int64(3), num_workers=np.int8(0),
                  val_fraction=np.float32(0.25), label_noise=np.float64(0.0), random_labels=np.bool_(False))
    modules = [
        DigitsDataModule(**common, task="multiclass"),
        Toy2DDataModule("xor", n_samples=np.int64(40), noise=np.float64(0.2), **common),
        QuadrantDataModule(n_samples=np.uint16(20), dim=np.int64(3), **common),
        BinaryMNISTDataModule(tmp_path / "mnist", **common),
        CIFAR10FrogsShipsDataModule(str(tmp_path / "cifar"), m=None, seed=0, val_fraction=0),
        Toy2DDataModule(n_samples=2, val_fraction=0.25, m=None),  # round(0.5) = 0 held out
    ]
    for dm in modules:
        dm.setup("fit")
        x, y = next(iter(dm.train_dataloader()))
        assert torch.isfinite(x).all() and len(y) == min(dm.batch_size, len(dm.train_dataset))
        assert all(type(value) in (int, float, bool, str, tuple, type(None)) for value in dm.hparams.values())
        assert _weights_only_roundtrip(dm.hparams) == dict(dm.hparams)
    assert [len(dm.train_dataset) for dm in modules[:4]] == [8] * 4
    assert modules[3].root == tmp_path / "mnist" and modules[3].hparams["root"] == str(tmp_path / "mnist")
    assert modules[2].input_shape == (3,) and isinstance(modules[1].seed, int)
