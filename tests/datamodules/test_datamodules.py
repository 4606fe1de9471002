"""Data modules against values computed independently from their sources."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits, make_blobs, make_circles, make_moons
from torch.utils.data import TensorDataset
from torchvision.datasets import CIFAR10

from lightning_nsv.compat import pl, submodule
from lightning_nsv.datamodules import (
    CIFAR10_CLASSES,
    TOY_SETS,
    BinaryMNISTDataModule,
    CIFAR10FrogsShipsDataModule,
    ClassificationDataModule,
    DigitsDataModule,
    QuadrantDataModule,
    Toy2DDataModule,
)
from lightning_nsv.datamodules.base import EpochBatchSampler
from tests.fake_datasets import rewrite_cifar10_batch, truncate, write_fake_cifar10, write_fake_mnist, write_idx

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


def test_m_larger_than_pool(mnist):
    with pytest.raises(ValueError, match=r"training pool size 1438 left after holding out val_fraction=0.2, got "
                                         r"5000; lower `m`, or pass m=None"):
        DigitsDataModule(m=5000).setup("fit")
    with pytest.raises(ValueError, match=r"training pool size 50, got 51; lower `m`"):
        BinaryMNISTDataModule(root=str(mnist[0]), m=51).setup("fit")


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
        (lambda: DigitsDataModule(seed=-1), "`seed` must be a non-negative integer, got -1"),
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


def test_literal_choices_match_the_tables():
    import typing

    from lightning_nsv.datamodules.base import TASKS

    assert typing.get_args(typing.get_type_hints(Toy2DDataModule.__init__)["name"]) == tuple(TOY_SETS)
    assert TASKS == ("binary", "multiclass")


@pytest.mark.parametrize("name", ["train-images-idx3-ubyte", "t10k-labels-idx1-ubyte"])
def test_truncated_mnist_file_is_named(tmp_path, name):
    write_fake_mnist(tmp_path, 12, 6)
    path = tmp_path / "MNIST" / "raw" / name
    size = truncate(path, 0.8)
    dm = BinaryMNISTDataModule(root=str(tmp_path))
    dm.prepare_data()  # the files exist
    with pytest.raises(ValueError, match=rf"(?s)cannot read the {'training' if 'train' in name else 'test'} files.*"
                                         rf"{name}: {size:,} bytes, its header announces.*download=True"):
        dm.setup("fit")


def test_mnist_file_with_a_wrong_header_is_named(tmp_path):
    write_fake_mnist(tmp_path, 12, 6)
    path = tmp_path / "MNIST" / "raw" / "train-labels-idx1-ubyte"
    path.write_bytes(b"<html>404</html>")
    with pytest.raises(ValueError, match=r"(?s)train-labels-idx1-ubyte: magic number 0x3c68746d, not that of an IDX"):
        BinaryMNISTDataModule(root=str(tmp_path)).setup("fit")


@pytest.mark.parametrize("name", ["data_batch_3", "test_batch", "batches.meta"])
def test_corrupt_cifar_batch_is_named(tmp_path, name):
    write_fake_cifar10(tmp_path, 20, 10)
    truncate(tmp_path / "cifar-10-batches-py" / name, 0.5)
    with pytest.raises(ValueError, match=rf"(?s)cannot read the .* files \(UnpicklingError.*"
                                         rf"cifar-10-batches-py/{name}: cannot be unpickled.*download it again"):
        CIFAR10FrogsShipsDataModule(root=str(tmp_path)).setup("fit")


def test_missing_files_list_the_expected_layout(tmp_path):
    write_fake_mnist(tmp_path, 5, 5)
    (tmp_path / "MNIST" / "raw" / "t10k-images-idx3-ubyte").unlink()
    with pytest.raises(FileNotFoundError) as info:
        BinaryMNISTDataModule(root=str(tmp_path)).setup("fit")
    message = str(info.value)
    assert "found no MNIST/raw/t10k-images-idx3-ubyte" in message and "download=True" in message
    assert all(str(tmp_path / name) in message for name in BinaryMNISTDataModule.files)


def test_epoch_batches_depend_on_seed_and_epoch_only():
    def order(seed, epoch):
        sampler = EpochBatchSampler(range(103), batch_size=10, seed=seed)
        sampler.set_epoch(epoch)
        return torch.cat(list(sampler))

    assert sorted(order(0, 0).tolist()) == list(range(103))
    assert torch.equal(order(0, 3), order(0, 3))
    assert not torch.equal(order(0, 3), order(0, 4)) and not torch.equal(order(0, 3), order(1, 3))
    assert not torch.equal(order(1, 0), order(0, 1))  # not seed + epoch
    assert [len(b) for b in EpochBatchSampler(range(103), batch_size=10)] == [10] * 10 + [3]
    assert len(EpochBatchSampler(range(103), batch_size=10)) == 11


def test_epoch_batches_shard_like_distributed_sampler():
    from torch.utils.data import DistributedSampler

    shards = [EpochBatchSampler(range(11), batch_size=2, seed=5, num_replicas=3, rank=r) for r in range(3)]
    for sampler in shards:
        sampler.set_epoch(2)
    batches = [list(sampler) for sampler in shards]
    assert [len(b) for b in batches] == [2, 2, 2] == [len(s) for s in shards]  # 4 indices each: 11 padded to 12
    seen = torch.cat([torch.cat(b) for b in batches])
    assert len(seen) == 12 and set(seen.tolist()) == set(range(11))
    for rank in range(3):
        in_order = torch.cat(list(EpochBatchSampler(range(11), 2, shuffle=False, num_replicas=3, rank=rank)))
        assert in_order.tolist() == list(DistributedSampler(range(11), num_replicas=3, rank=rank, shuffle=False))


def test_loaders_slice_batches_from_the_tensors():
    dm = _ready(QuadrantDataModule(n_samples=250, batch_size=32, seed=4))
    loader = dm.train_dataloader()
    assert loader.dataset is dm.train_dataset and isinstance(loader.dataset, TensorDataset)
    x_all, y_all = _xy(dm.train_dataset)
    first = list(loader)
    order = torch.cat([b for b in loader.sampler])
    assert torch.equal(torch.cat([x for x, _ in first]), x_all[order])
    loader.sampler.set_epoch(1)
    assert not torch.equal(torch.cat([y for _, y in loader]), torch.cat([y for _, y in first]))
    workers = DigitsDataModule(m=200, batch_size=64, num_workers=2)
    workers.setup("fit")
    batches = list(workers.train_dataloader())
    assert [len(y) for _, y in batches] == [64, 64, 64, 8]
    assert torch.equal(torch.cat([x for x, _ in batches]).sort(0).values, _xy(workers.train_dataset)[0].sort(0).values)


def test_batch_sliced_dataset_equals_advanced_indexing():
    from lightning_nsv.datamodules.base import BatchSlicedTensorDataset

    x, y = torch.randn(30, 1, 2, 3), torch.arange(30)
    ds = BatchSlicedTensorDataset(x, y)
    idx = torch.tensor([5, 0, 29, 5])
    xb, yb = ds[idx]
    assert torch.equal(xb, x[idx]) and torch.equal(yb, y[idx]) and xb.is_contiguous()
    assert all(torch.equal(a, b) for a, b in zip(ds[3], (x[3], y[3])))  # other indices: TensorDataset's
    assert torch.equal(ds[[1, 2]][0], x[[1, 2]]) and len(ds[1:4][1]) == 3
    assert isinstance(_ready(QuadrantDataModule(n_samples=50, seed=1)).train_dataset, BatchSlicedTensorDataset)


@pytest.mark.parametrize("name, array, reason", [
    ("train-labels-idx1-ubyte", np.r_[np.zeros(11), 12], "labels up to 12, outside 0..9"),
    ("t10k-images-idx3-ubyte", np.zeros((6, 8, 8)), "images of 8x8 pixels, not 28x28"),
])
def test_mnist_file_of_another_data_set_is_named(tmp_path, name, array, reason):
    """Well-formed IDX files that torchvision reads without a word: a label 12, images of 8x8 pixels."""
    write_fake_mnist(tmp_path, 12, 6)
    write_idx(tmp_path / "MNIST" / "raw" / name, array)
    with pytest.raises(ValueError, match=rf"(?s)cannot read the .* files.*MNIST/raw/{name}: {reason}.*download it"):
        BinaryMNISTDataModule(root=str(tmp_path)).setup("fit")


def test_mnist_images_and_labels_of_different_counts_are_refused(tmp_path):
    """torchvision pairs 12 images with 10 labels silently; the samples would be cut or mislabelled."""
    write_fake_mnist(tmp_path, 12, 6)
    write_idx(tmp_path / "MNIST" / "raw" / "train-labels-idx1-ubyte", np.zeros(10))
    with pytest.raises(ValueError, match=r"(?s)cannot read the training files \(ValueError: 12 images but 10 labels\)"
                                         r".*train-images-idx3-ubyte.*train-labels-idx1-ubyte"):
        BinaryMNISTDataModule(root=str(tmp_path)).setup("fit")


@pytest.mark.parametrize("change, reason", [
    (lambda batch: batch["labels"].__setitem__(0, -1), r"1 labels outside 0..9 \(the first: -1\)"),  # read as a truck
    (lambda batch: batch["labels"].__setitem__(1, 10), r"1 labels outside 0..9 \(the first: 10\)"),
    (lambda batch: batch["labels"].pop(), "4 images but 3 labels"),
    (lambda batch: batch.__setitem__("data", batch["data"][:, :3000]), r"data of shape \(4, 3000\), not \(n, 3072\)"),
])
def test_cifar_batch_with_bad_labels_or_rows_is_named(tmp_path, change, reason):
    write_fake_cifar10(tmp_path, 20, 10)
    rewrite_cifar10_batch(tmp_path, "data_batch_2", change)
    with pytest.raises(ValueError, match=rf"(?s)cannot read the training files.*data_batch_2: {reason}.*download it"):
        CIFAR10FrogsShipsDataModule(root=str(tmp_path), task="multiclass", classes=list(CIFAR10_CLASSES)).setup("fit")


def test_training_indices_travel_in_the_state_and_are_compared():
    trained = _ready(DigitsDataModule(m=50, seed=0))
    assert torch.equal(trained.state_dict()["train_indices"], trained.train_indices)
    assert DigitsDataModule().state_dict() == {}  # nothing to record before setup
    same = _ready(DigitsDataModule(m=50, seed=0))
    same.load_state_dict(trained.state_dict())
    other = _ready(DigitsDataModule(m=50, seed=1))
    with pytest.raises(ValueError, match=r"DigitsDataModule: the training subset is not the one the checkpoint records "
                                         r"\(50 samples here, 50 there; the first difference is at position \d+\).*"
                                         "Pass the arguments the checkpoint was trained with"):
        other.load_state_dict(trained.state_dict())
    later = DigitsDataModule(m=40, seed=0)
    later.load_state_dict(trained.state_dict())  # not set up yet: compared at setup
    with pytest.raises(ValueError, match=r"\(40 samples here, 50 there; "):
        later.setup("fit")


def test_validating_on_other_data_is_allowed():
    """Only a resumed fit (and `lightning-nsv analyze`, which asks) must train on the checkpoint's subset."""
    from types import SimpleNamespace

    trained = _ready(DigitsDataModule(m=50, seed=0))
    other = _ready(DigitsDataModule(m=50, seed=1))
    other.trainer = SimpleNamespace(state=SimpleNamespace(fn="validate"))
    other.load_state_dict(trained.state_dict())
    with pytest.raises(ValueError, match="the training subset is not the one the checkpoint records"):
        other.check_training_indices()


def test_the_official_gz_files_are_read_as_they_are(mnist, tmp_path):
    """MNIST's download comes as train-images-idx3-ubyte.gz, ...: torchvision 0.29 reads them only unpacked."""
    import gzip

    root, written = mnist
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in BinaryMNISTDataModule.files:
        (raw / (Path(name).name + ".gz")).write_bytes(gzip.compress((root / name).read_bytes()))
    packed, unpacked = (_ready(BinaryMNISTDataModule(root=str(where), m=30, seed=1)) for where in (tmp_path, root))
    for split in ("train_dataset", "val_dataset"):
        for a, b in zip(getattr(packed, split).tensors, getattr(unpacked, split).tensors):
            assert torch.equal(a, b)
    assert not list(raw.glob("*-ubyte"))  # nothing unpacked beside them
    (raw / "t10k-labels-idx1-ubyte.gz").write_bytes(b"<html>404</html>")
    with pytest.raises(ValueError, match=r"(?s)cannot read the test files.*t10k-labels-idx1-ubyte: read from "
                                         r"t10k-labels-idx1-ubyte.gz, which is no whole gzip file.*--data.download true"):
        BinaryMNISTDataModule(root=str(tmp_path)).setup("fit")


def test_a_missing_file_names_the_download_argument_in_python_and_on_the_command_line(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"(?s)\(or the same names with .gz.*Pass `download=True` \(on the "
                                                r"command line `--data.download true`\) on a machine with internet"):
        BinaryMNISTDataModule(root=str(tmp_path)).setup("fit")
