"""Data modules against values computed independently from their sources."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits, make_blobs, make_circles, make_moons
from torchvision.datasets import CIFAR10

from lightning_nsv.compat import pl, submodule
from lightning_nsv.datamodules import (
    TOY_SETS,
    BinaryMNISTDataModule,
    CIFAR10FrogsShipsDataModule,
    ClassificationDataModule,
    DigitsDataModule,
    QuadrantDataModule,
    Toy2DDataModule,
)
from tests.fake_datasets import write_fake_cifar10, write_fake_mnist

DIGITS = load_digits()


def _ready(dm: ClassificationDataModule) -> ClassificationDataModule:
    dm.prepare_data()
    dm.setup("fit")
    return dm


def _xy(dataset) -> tuple[torch.Tensor, torch.Tensor]:
    return dataset.tensors


@pytest.fixture(scope="module")
def mnist(tmp_path_factory):
    root = tmp_path_factory.mktemp("mnist")
    return root, write_fake_mnist(root, n_train=50, n_test=20, seed=0)


@pytest.fixture(scope="module")
def cifar(tmp_path_factory):
    root = tmp_path_factory.mktemp("cifar")
    return root, write_fake_cifar10(root, n_train=60, n_test=30, seed=0)


def _check_items(dm: ClassificationDataModule) -> None:
    for dataset in (dm.train_dataset, dm.val_dataset):
        x, y = dataset[0]
        assert x.dtype == torch.float32 and tuple(x.shape) == dm.input_shape
        assert y.dtype == torch.int64 and y.shape == ()
        assert set(_xy(dataset)[1].tolist()) <= set(range(dm.num_classes))
    assert dm.test_dataset is dm.val_dataset
    assert dm.train_indices.dtype == torch.int64 and len(dm.train_indices) == len(dm.train_dataset)


def test_digits_binary_matches_load_digits():
    dm = _ready(DigitsDataModule())
    _check_items(dm)
    assert dm.is_image and dm.num_classes == 2 and dm.input_shape == (1, 8, 8)
    assert (len(dm.train_dataset), len(dm.val_dataset)) == (1438, 359)
    idx = dm.train_indices.numpy()
    x, y = _xy(dm.train_dataset)
    np.testing.assert_array_equal(x.squeeze(1).numpy(), (DIGITS.images[idx] / 16).astype(np.float32))
    np.testing.assert_array_equal(y.numpy(), DIGITS.target[idx] >= 5)
    counts = torch.bincount(y, minlength=2) + torch.bincount(_xy(dm.val_dataset)[1], minlength=2)
    assert counts.tolist() == np.bincount(DIGITS.target >= 5).tolist() == [901, 896]
    assert x.min() == 0 and x.max() == 1


def test_digits_multiclass():
    dm = _ready(DigitsDataModule(task="multiclass", m=300))
    _check_items(dm)
    assert dm.num_classes == 10
    np.testing.assert_array_equal(_xy(dm.train_dataset)[1].numpy(), DIGITS.target[dm.train_indices.numpy()])


def test_subset_reproducible_nested_and_disjoint_from_validation():
    full, a, b, other = (_ready(DigitsDataModule(m=m, seed=s)) for m, s in ((None, 0), (200, 0), (200, 0), (200, 1)))
    assert len(a.train_dataset) == 200 and len(full.train_indices.unique()) == 1438
    assert torch.equal(a.train_indices, b.train_indices)
    assert not torch.equal(a.train_indices, other.train_indices)
    assert set(a.train_indices.tolist()) <= set(full.train_indices.tolist())
    assert torch.equal(_xy(a.val_dataset)[0], _xy(full.val_dataset)[0])
    rows = [row.numpy().tobytes() for part in (full.train_dataset, full.val_dataset) for row in _xy(part)[0]]
    assert sorted(rows) == sorted(image.tobytes() for image in (DIGITS.images[:, None] / 16).astype(np.float32))


def test_m_larger_than_pool():
    with pytest.raises(ValueError, match="training pool size 1438, got 5000"):
        DigitsDataModule(m=5000).setup("fit")


def test_random_labels_touch_only_the_training_subset():
    clean, noisy = (_ready(DigitsDataModule(m=400, seed=3, random_labels=r)) for r in (False, True))
    assert torch.equal(clean.train_indices, noisy.train_indices)
    assert torch.equal(_xy(clean.train_dataset)[0], _xy(noisy.train_dataset)[0])
    assert all(torch.equal(u, v) for u, v in zip(_xy(clean.val_dataset), _xy(noisy.val_dataset)))
    y, y_random = _xy(clean.train_dataset)[1], _xy(noisy.train_dataset)[1]
    assert 0.35 < (y != y_random).float().mean() < 0.65
    again = _ready(DigitsDataModule(m=400, seed=3, random_labels=True))
    assert torch.equal(_xy(again.train_dataset)[1], y_random)


@pytest.mark.parametrize("task", ["binary", "multiclass"])
def test_label_noise_flips_the_asked_fraction(task):
    dm = _ready(DigitsDataModule(m=500, label_noise=0.1, task=task))
    truth = torch.from_numpy(DIGITS.target[dm.train_indices.numpy()])
    truth = (truth >= 5).long() if task == "binary" else truth
    assert (_xy(dm.train_dataset)[1] != truth).sum() == 50
    val_truth = _ready(DigitsDataModule(m=500, task=task)).val_dataset
    assert torch.equal(_xy(dm.val_dataset)[1], _xy(val_truth)[1])


@pytest.mark.parametrize("name", sorted(TOY_SETS))
def test_toy_sets(name):
    dm = _ready(Toy2DDataModule(name=name, n_samples=301, noise=0.0, seed=5))
    _check_items(dm)
    assert not dm.is_image and dm.input_shape == (2,)
    assert (len(dm.train_dataset), len(dm.val_dataset)) == (241, 60)
    (x, y), (x_val, y_val) = _xy(dm.train_dataset), _xy(dm.val_dataset)
    assert sorted((torch.bincount(y) + torch.bincount(y_val)).tolist()) == [150, 151]
    if name == "xor":
        assert torch.equal(y, (x[:, 0] * x[:, 1] > 0).long())
    if name == "spirals":
        assert x.norm(dim=1).max() <= 1 + 1e-6
    again, other = (_ready(Toy2DDataModule(name=name, n_samples=301, noise=0.0, seed=s)) for s in (5, 6))
    assert torch.equal(_xy(again.train_dataset)[0], x)
    assert not torch.equal(_xy(other.train_dataset)[0], x)


@pytest.mark.parametrize(
    "name, make",
    [
        ("moons", lambda rng: make_moons(200, noise=0.2, random_state=rng)),
        ("circles", lambda rng: make_circles(200, noise=0.2, factor=0.5, random_state=rng)),
        ("blobs", lambda rng: make_blobs(200, centers=[(-1, -1), (1, 1)], cluster_std=0.2, random_state=rng)),
    ],
)
def test_toy_sets_equal_scikit_learn(name, make):
    dm = _ready(Toy2DDataModule(name=name, n_samples=200, noise=0.2, seed=7, m=100))
    x, y = make(np.random.RandomState(7))
    idx = dm.train_indices.numpy()
    np.testing.assert_array_equal(_xy(dm.train_dataset)[0].numpy(), x[idx].astype(np.float32))
    np.testing.assert_array_equal(_xy(dm.train_dataset)[1].numpy(), y[idx])


@pytest.mark.parametrize("dim", [1, 2, 5])
def test_quadrant_orthants(dim):
    dm = _ready(QuadrantDataModule(n_samples=101, dim=dim, seed=2))
    _check_items(dm)
    assert dm.input_shape == (dim,) and not dm.is_image
    for x, y in (_xy(dm.train_dataset), _xy(dm.val_dataset)):
        assert ((2 * y - 1)[:, None] * x > 0).all()
    counts = torch.bincount(_xy(dm.train_dataset)[1]) + torch.bincount(_xy(dm.val_dataset)[1])
    assert counts.tolist() == [51, 50]


def test_mnist_loads_the_written_idx_files(mnist):
    root, written = mnist
    dm = _ready(BinaryMNISTDataModule(root=str(root), m=30, seed=1))
    _check_items(dm)
    assert dm.is_image and dm.input_shape == (1, 28, 28)
    (images, labels), (test_images, test_labels) = written["train"], written["test"]
    idx = dm.train_indices.numpy()
    x, y = _xy(dm.train_dataset)
    assert len(y) == 30 and len(set(idx.tolist())) == 30
    np.testing.assert_array_equal((x.squeeze(1) * 255).round().numpy(), images[idx])
    np.testing.assert_array_equal(y.numpy(), labels[idx] >= 5)
    x_test, y_test = _xy(dm.test_dataset)
    np.testing.assert_array_equal((x_test.squeeze(1) * 255).round().numpy(), test_images)
    np.testing.assert_array_equal(y_test.numpy(), test_labels >= 5)
    multi = _ready(BinaryMNISTDataModule(root=str(root), download=True, task="multiclass"))
    assert multi.num_classes == 10 and len(multi.train_dataset) == 50
    np.testing.assert_array_equal(_xy(multi.train_dataset)[1].numpy(), labels)


def test_mnist_missing_or_malformed_root(tmp_path):
    write_fake_mnist(tmp_path / "flat", 5, 5)
    (tmp_path / "flat" / "MNIST").rename(tmp_path / "flat" / "mnist")
    for root in (tmp_path / "missing", tmp_path / "flat"):
        dm = BinaryMNISTDataModule(root=str(root))
        for step in (dm.prepare_data, dm.setup):
            with pytest.raises(FileNotFoundError, match=r"(?s)MNIST/raw/train-images-idx3-ubyte.*download=True"):
                step()


def test_cifar_loads_the_written_batches(cifar):
    root, written = cifar
    (images, labels), (test_images, test_labels) = written["train"], written["test"]
    dm = _ready(CIFAR10FrogsShipsDataModule(root=str(root)))
    _check_items(dm)
    assert dm.is_image and dm.input_shape == (3, 32, 32)
    idx = dm.train_indices.numpy()
    np.testing.assert_array_equal(idx, np.flatnonzero(np.isin(labels, [6, 8])))
    x, y = _xy(dm.train_dataset)
    np.testing.assert_array_equal((x * 255).round().numpy(), images[idx])
    np.testing.assert_array_equal(y.numpy(), labels[idx] == 8)
    frog_ship = np.isin(test_labels, [6, 8])
    np.testing.assert_array_equal((_xy(dm.test_dataset)[0] * 255).round().numpy(), test_images[frog_ship])
    assert _xy(dm.test_dataset)[1].tolist() == (test_labels[frog_ship] == 8).tolist()


def test_cifar_multiclass_order_and_normalisation(cifar):
    root, written = cifar
    classes = ["truck", "cat", "airplane"]
    dm = _ready(CIFAR10FrogsShipsDataModule(root=str(root), classes=classes, task="multiclass", normalize=True))
    labels = written["train"][1][dm.train_indices.numpy()]
    assert dm.num_classes == 3
    assert _xy(dm.train_dataset)[1].tolist() == [[9, 3, 0].index(label) for label in labels]
    x = _xy(dm.train_dataset)[0]
    torch.testing.assert_close(x.mean((0, 2, 3)), torch.zeros(3), atol=1e-5, rtol=0)
    torch.testing.assert_close(x.std((0, 2, 3)), torch.ones(3), atol=1e-5, rtol=0)
    raw = torch.from_numpy(written["test"][0][np.isin(written["test"][1], [9, 3, 0])]).float() / 255
    expected = (raw - dm.channel_mean[:, None, None]) / dm.channel_std[:, None, None]
    torch.testing.assert_close(_xy(dm.val_dataset)[0], expected)


def test_cifar_checksums_and_malformed_root(cifar, tmp_path):
    root, _ = cifar
    with pytest.raises(RuntimeError, match="corrupted"):
        CIFAR10(root)
    write_fake_cifar10(tmp_path, 10, 5)
    (tmp_path / "cifar-10-batches-py" / "test_batch").unlink()
    dm = CIFAR10FrogsShipsDataModule(root=str(tmp_path))
    for step in (dm.prepare_data, dm.setup):
        with pytest.raises(FileNotFoundError, match=r"(?s)no cifar-10-batches-py/test_batch.*data_batch_5.*batches.meta.*download=True"):
            step()


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: DigitsDataModule(val_fraction=1.0), r"`val_fraction` must be in \[0, 1\), got 1.0"),
        (lambda: DigitsDataModule(m=0), "`m` must be a positive integer or None"),
        (lambda: DigitsDataModule(label_noise=1.5), r"`label_noise` must be in \[0, 1\], got 1.5"),
        (lambda: DigitsDataModule(random_labels=True, label_noise=0.1), "`label_noise` must be 0, got 0.1"),
        (lambda: DigitsDataModule(batch_size=0), "`batch_size` must be a positive integer, got 0"),
        (lambda: DigitsDataModule(num_workers=-1), "`num_workers` must be a non-negative integer, got -1"),
        (lambda: DigitsDataModule(task="regression"), "can be binary, multiclass, got 'regression'"),
        (lambda: Toy2DDataModule(task="multiclass"), "`task` of Toy2DDataModule can be binary, got 'multiclass'"),
        (lambda: Toy2DDataModule(name="swiss"), "`name` can be blobs, moons, circles, xor, spirals, got 'swiss'"),
        (lambda: Toy2DDataModule(n_samples=1), "`n_samples` must be at least 2, got 1"),
        (lambda: Toy2DDataModule(noise=-0.1), "`noise` must be non-negative, got -0.1"),
        (lambda: QuadrantDataModule(dim=0), "`dim` must be a positive integer, got 0"),
        (lambda: CIFAR10FrogsShipsDataModule("r", classes=("frog", "toad")), "distinct names among .*got \\('frog', 'toad'\\)"),
        (lambda: CIFAR10FrogsShipsDataModule("r", classes=("frog", "frog")), "distinct names"),
        (lambda: CIFAR10FrogsShipsDataModule("r", classes=("cat", "dog", "frog")), "exactly 2 .* got 3 for task='binary'"),
        (lambda: CIFAR10FrogsShipsDataModule("r", classes=("cat",), task="multiclass"), "at least 2 .* got 1"),
    ],
)
def test_argument_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_train_loader_is_seeded_and_keeps_the_last_batch():
    dm = _ready(QuadrantDataModule(n_samples=125, batch_size=32, seed=4))
    first, second = ([y for _, y in dm.train_dataloader()] for _ in range(2))
    assert [len(y) for y in first] == [32, 32, 32, 4]
    assert all(torch.equal(u, v) for u, v in zip(first, second))
    assert not torch.equal(torch.cat(first), _xy(dm.train_dataset)[1])
    assert torch.equal(torch.cat([y for _, y in dm.val_dataloader()]), _xy(dm.val_dataset)[1])


class _Linear(pl.LightningModule):
    def __init__(self, features: int = 64) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(features, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.binary_cross_entropy_with_logits(self.layer(x.flatten(1)).squeeze(1), y.float())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_lightning_cli_and_trainer():
    LightningCLI = submodule("cli").LightningCLI

    args = ["--data=CIFAR10FrogsShipsDataModule", "--data.root=data", "--data.classes=[cat,dog]", "--data.m=7"]
    cli = LightningCLI(_Linear, ClassificationDataModule, subclass_mode_data=True, run=False, args=args,
                       seed_everything_default=False)
    assert cli.datamodule.classes == ("cat", "dog") and cli.datamodule.m == 7
    assert cli.datamodule.hparams["classes"] == ["cat", "dog"] and cli.datamodule.hparams["seed"] == 0
    trainer = pl.Trainer(fast_dev_run=2, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(_Linear(), datamodule=DigitsDataModule(m=64, batch_size=16))
