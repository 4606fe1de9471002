"""MNIST read by torchvision from a local root."""
from __future__ import annotations

import math
import struct
from pathlib import Path

from torch import Tensor
from torchvision.datasets import MNIST

from lightning_nsv.datamodules.base import TASKS, TorchvisionDataModule, five_or_more


class BinaryMNISTDataModule(TorchvisionDataModule):
    """MNIST through ``torchvision.datasets.MNIST``; the held-out set is the official test set.

    Binary task: digits 0-4 -> 0, 5-9 -> 1; ``task="multiclass"``: the digit. ``x`` is (1, 28, 28) in
    [0, 1]. torchvision 0.29 reads the uncompressed IDX files under ``root/MNIST/raw`` (see :attr:`files`).

    Args:
        root: Directory that holds ``MNIST/raw``.
        download: Let :meth:`prepare_data` download MNIST into ``root`` (needs internet).
        **kwargs: Arguments of :class:`~lightning_nsv.datamodules.base.ClassificationDataModule`.

    Raises:
        FileNotFoundError: From :meth:`prepare_data` or :meth:`setup` when a file is missing and
            ``download`` is False.

    Example::

        dm = BinaryMNISTDataModule("data", m=20_000)
        dm.prepare_data()
        dm.setup("fit")
    """

    tasks = TASKS
    input_shape = (1, 28, 28)
    num_multiclass = 10
    files = tuple(
        f"MNIST/raw/{split}-{kind}-idx{dims}-ubyte"
        for split in ("train", "t10k")
        for kind, dims in (("images", 3), ("labels", 1))
    )

    def _torchvision(self, train: bool, download: bool = False) -> MNIST:
        return MNIST(self.root, train=train, download=download)

    def _split_files(self, train: bool) -> tuple[str, ...]:
        return self.files[:2] if train else self.files[2:]

    def _file_problem(self, path: Path) -> str | None:
        data = path.read_bytes()
        problem = idx_file_problem(data)
        if problem is not None:
            return problem
        ndim = data[3]
        sizes = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
        if "images" in path.name and sizes[1:] != self.input_shape[1:]:
            return f"images of {'x'.join(map(str, sizes[1:]))} pixels, not {'x'.join(map(str, self.input_shape[1:]))}"
        if "labels" in path.name and ndim == 1 and max(data[8:], default=0) >= self.source_classes:
            return f"labels up to {max(data[8:])}, outside 0..{self.source_classes - 1}"
        return None

    def _tensors(self, dataset: MNIST) -> tuple[Tensor, Tensor]:
        return dataset.data.unsqueeze(1), dataset.targets

    def _relabel(self, y: Tensor) -> Tensor:
        return five_or_more(y, self.task)


def idx_file_problem(data: bytes) -> str | None:
    """What is wrong with the bytes of an uncompressed IDX file of unsigned bytes, or None.

    The format: a big-endian magic number ``0x0000 08 <ndim>``, ``ndim`` big-endian uint32 sizes, then the
    ``prod(sizes)`` bytes of data.
    """
    if len(data) < 4:
        return f"{len(data)} bytes, shorter than the 4-byte IDX magic number"
    magic = int.from_bytes(data[:4], "big")
    ndim = magic & 0xFF
    if magic >> 8 != 0x08 or ndim < 1:
        return f"magic number 0x{magic:08x}, not that of an IDX file of unsigned bytes (0x0000080n)"
    header = 4 + 4 * ndim
    if len(data) < header:
        return f"{len(data)} bytes, shorter than its {header}-byte header"
    expected = header + math.prod(struct.unpack(f">{ndim}I", data[4:header]))
    if len(data) != expected:
        return f"{len(data):,} bytes, its header announces {expected:,}"
    return None
