"""MNIST read by torchvision from a local root."""
from __future__ import annotations

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

    def _tensors(self, dataset: MNIST) -> tuple[Tensor, Tensor]:
        return dataset.data.unsqueeze(1), dataset.targets

    def _relabel(self, y: Tensor) -> Tensor:
        return five_or_more(y, self.task)
