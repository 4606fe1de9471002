"""Small MNIST and CIFAR-10 files in the on-disk formats torchvision 0.29 reads, for tests without internet."""
from __future__ import annotations

import pickle
import struct
from pathlib import Path
from typing import Any, Callable

import numpy as np

CIFAR10_LABEL_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def write_idx(path: Path, array: np.ndarray) -> None:
    """IDX file: big-endian magic ``0x0000 08 <ndim>`` (08 = unsigned byte), big-endian int32 dims, data."""
    header = struct.pack(">I", 0x0800 + array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def write_fake_mnist(root: str | Path, n_train: int, n_test: int, seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Write random MNIST-format files to ``root/MNIST/raw``, uncompressed, as torchvision reads them.

    Args:
        root: The ``root`` to give ``torchvision.datasets.MNIST``.
        n_train: Training samples.
        n_test: Test samples.
        seed: Seed of the pixels and labels.

    Returns:
        ``{"train": (images, labels), "test": (images, labels)}``: uint8 arrays (n, 28, 28) and (n,).
    """
    rng = np.random.default_rng(seed)
    raw = Path(root) / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    written = {}
    for split, prefix, n in (("train", "train", n_train), ("test", "t10k", n_test)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        write_idx(raw / f"{prefix}-images-idx3-ubyte", images)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels)
        written[split] = images, labels
    return written


def write_fake_cifar10(root: str | Path, n_train: int, n_test: int, seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Write random CIFAR-10 python batches to ``root/cifar-10-batches-py``.

    The training samples are spread over ``data_batch_1`` .. ``data_batch_5``. Each batch is a pickled dict
    with ``data``, uint8 (n, 3072) rows of red, green, blue planes of 32x32, and ``labels``, a list of ints;
    ``batches.meta`` holds ``label_names``. The keys are ``str``: the official Python 2 pickles store byte
    strings, which torchvision unpickles with ``encoding="latin1"`` as ``str``, the objects written here.
    Their md5 sums differ from the official files', which torchvision's ``CIFAR10`` checks.

    Args:
        root: The ``root`` to give ``torchvision.datasets.CIFAR10``.
        n_train: Training samples.
        n_test: Test samples.
        seed: Seed of the pixels and labels.

    Returns:
        ``{"train": (images, labels), "test": (images, labels)}``: uint8 arrays (n, 3, 32, 32) and (n,).
    """
    rng = np.random.default_rng(seed)
    folder = Path(root) / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for split, n in (("train", n_train), ("test", n_test)):
        images = rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)
        labels = rng.integers(0, 10, n)
        written[split] = images, labels
    names = [f"data_batch_{i}" for i in range(1, 6)]
    parts = np.array_split(np.arange(n_train), 5)
    for name, part, split in [*zip(names, parts, ["train"] * 5), ("test_batch", np.arange(n_test), "test")]:
        images, labels = written[split]
        batch = {"batch_label": name, "data": images[part].reshape(len(part), 3072), "labels": labels[part].tolist()}
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    meta = {"label_names": CIFAR10_LABEL_NAMES, "num_cases_per_batch": n_train // 5, "num_vis": 3072}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))
    return written


def rewrite_cifar10_batch(root: str | Path, name: str, change: Callable[[dict[str, Any]], Any]) -> None:
    """Unpickle ``root/cifar-10-batches-py/<name>``, apply ``change`` to the dict in place, pickle it back."""
    path = Path(root) / "cifar-10-batches-py" / name
    batch = pickle.loads(path.read_bytes())
    change(batch)
    path.write_bytes(pickle.dumps(batch, protocol=2))


def truncate(path: str | Path, fraction: float) -> int:
    """Cut the file at ``path`` to ``fraction`` of its bytes (a download or copy that stopped early); the new size."""
    path = Path(path)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)])
    return int(len(data) * fraction)
