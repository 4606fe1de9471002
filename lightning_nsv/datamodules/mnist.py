"""MNIST read by torchvision from a local root (or, for the official ``.gz`` files, read here)."""
from __future__ import annotations

import gzip
import math
import struct
import zlib
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import Tensor
from torchvision.datasets import MNIST

from lightning_nsv.datamodules.base import TASKS, TorchvisionDataModule, five_or_more


class BinaryMNISTDataModule(TorchvisionDataModule):
    """MNIST through ``torchvision.datasets.MNIST``; the held-out set is the official test set.

    Binary task: digits 0-4 -> 0, 5-9 -> 1; ``task="multiclass"``: the digit. ``x`` is (1, 28, 28) in
    [0, 1]. torchvision 0.29 reads the uncompressed IDX files under ``root/MNIST/raw`` (see :attr:`files`); where
    only the official ``.gz`` files are there (``train-images-idx3-ubyte.gz``, ...), they are read as they are.

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

    _layout_note = "\n(or the same names with .gz, as the official files come: they are read as they are)"

    def _torchvision(self, train: bool, download: bool = False) -> MNIST | SimpleNamespace:
        """torchvision's MNIST, or for ``.gz`` files (which torchvision reads only after unpacking them) their
        images and labels as ``data`` and ``targets``."""
        if download or all((self.root / name).is_file() for name in self._split_files(train)):
            return MNIST(self.root, train=train, download=download)
        images, labels = (idx_tensor(self._file_bytes(self.root / name)) for name in self._split_files(train))
        return SimpleNamespace(data=images, targets=labels.long())

    def _has_file(self, name: str) -> bool:
        return any(path.is_file() for path in _forms(self.root / name))

    @staticmethod
    def _file_bytes(path: Path) -> bytes:
        """The bytes of the IDX file ``path``, or of ``path.gz`` unpacked in memory."""
        if path.is_file():
            return path.read_bytes()
        packed = _forms(path)[1]
        try:
            return gzip.decompress(packed.read_bytes())
        except (OSError, EOFError, zlib.error) as err:
            raise ValueError(f"read from {packed.name}, which is no whole gzip file ({type(err).__name__}: {err})") \
                from None

    def _split_files(self, train: bool) -> tuple[str, ...]:
        return self.files[:2] if train else self.files[2:]

    def _file_problem(self, path: Path) -> str | None:
        try:
            data = self._file_bytes(path)
        except ValueError as err:
            return str(err)
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


def _forms(path: Path) -> tuple[Path, Path]:
    """An IDX file as torchvision reads it and as the official download comes, ``<name>.gz``."""
    return path, path.with_name(path.name + ".gz")


def idx_tensor(data: bytes) -> Tensor:
    """The uint8 tensor of the bytes of an IDX file (refused with :func:`idx_file_problem`'s reason)."""
    problem = idx_file_problem(data)
    if problem is not None:
        raise ValueError(problem)
    ndim = data[3]
    sizes = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    return torch.frombuffer(bytearray(data[4 + 4 * ndim:]), dtype=torch.uint8).reshape(sizes)
