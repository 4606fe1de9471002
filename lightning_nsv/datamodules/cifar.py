"""CIFAR-10 read by torchvision from a local root."""
from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, Literal, Sequence, get_args

import numpy as np
import torch
from torch import Tensor
from torchvision.datasets import CIFAR10

from lightning_nsv.datamodules.base import TASKS, TorchvisionDataModule
from lightning_nsv.validate import check_flag

CIFAR10Class = Literal["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
CIFAR10_CLASSES: tuple[str, ...] = get_args(CIFAR10Class)


class _CIFAR10Files(CIFAR10):
    """torchvision's ``CIFAR10`` that checks that its files exist instead of their md5 sums.

    torchvision compares every batch file and ``batches.meta`` with the md5 sum of the official release,
    so any other copy (the small files the tests write, a re-pickled or trimmed copy) fails as "not found
    or corrupted". A download is still verified: ``download`` checks the archive's md5 before extracting.
    """

    train_list = [[name, None] for name, _ in CIFAR10.train_list]
    test_list = [[name, None] for name, _ in CIFAR10.test_list]
    meta = {**CIFAR10.meta, "md5": None}


class CIFAR10FrogsShipsDataModule(TorchvisionDataModule):
    """CIFAR-10 classes through torchvision's ``CIFAR10``; the held-out set is the official test set.

    Label k is ``classes[k]``: with the default, frog -> 0 and ship -> 1 (the paper's frogs vs ships).
    ``task="binary"`` needs exactly two classes, ``task="multiclass"`` takes two or more; samples of
    other classes are dropped. ``x`` is (3, 32, 32) in [0, 1], or, with ``normalize=True``, standardised
    per channel with the mean and standard deviation of the training subset (``channel_mean``,
    ``channel_std``), applied to the held-out set too.

    Args:
        root: Directory that holds ``cifar-10-batches-py``.
        download: Let :meth:`prepare_data` download CIFAR-10 into ``root`` (needs internet).
        classes: CIFAR-10 class names, in label order.
        normalize: Standardise each channel with training-subset statistics.
        **kwargs: Arguments of :class:`~lightning_nsv.datamodules.base.ClassificationDataModule`.

    Raises:
        TypeError: On ``classes`` that is not a sequence of names (a bare string), a ``root`` that is no path.
        ValueError: On an unknown or repeated class name, or a class count that does not fit ``task``.
        FileNotFoundError: From :meth:`prepare_data` or :meth:`setup` when a file is missing and
            ``download`` is False.

    Example::

        dm = CIFAR10FrogsShipsDataModule("data", classes=("cat", "dog"), normalize=True)
    """

    tasks = TASKS
    input_shape = (3, 32, 32)
    files = tuple(
        f"{CIFAR10.base_folder}/{name}"
        for name, _ in CIFAR10.train_list + CIFAR10.test_list + [[CIFAR10.meta["filename"], None]]
    )

    def __init__(
        self,
        root: str,
        download: bool = False,
        classes: Sequence[CIFAR10Class] = ("frog", "ship"),
        normalize: bool = False,
        **kwargs: Any,
    ) -> None:
        normalize = check_flag("normalize", normalize)
        super().__init__(root, download, **kwargs)
        if isinstance(classes, (str, bytes)) or not hasattr(classes, "__iter__"):
            raise TypeError(f"`classes` must be a sequence of CIFAR-10 class names, got {classes!r}; "
                            "e.g. classes=('frog', 'ship')")
        classes = tuple(classes)
        unknown = [name for name in classes if name not in CIFAR10_CLASSES]
        if unknown or len(set(classes)) < len(classes):
            raise ValueError(
                f"`classes` must be distinct names among {', '.join(CIFAR10_CLASSES)}, got {classes}"
            )
        if len(classes) < 2 or (self.task == "binary" and len(classes) != 2):
            raise ValueError(
                f"`classes` must have exactly 2 names for task='binary' and at least 2 for task='multiclass', "
                f"got {len(classes)} for task={self.task!r}"
            )
        self.classes, self.normalize = classes, normalize
        self.num_classes = len(classes)
        self.channel_mean: Tensor | None = None
        self.channel_std: Tensor | None = None

    def _torchvision(self, train: bool, download: bool = False) -> CIFAR10:
        return _CIFAR10Files(self.root, train=train, download=download)

    def _split_files(self, train: bool) -> tuple[str, ...]:
        return self.files[:5] + self.files[-1:] if train else self.files[5:]

    def _file_problem(self, path: Path) -> str | None:
        try:
            with path.open("rb") as f:
                entry = pickle.load(f, encoding="latin1")
        except Exception as err:  # any unpickling failure is the answer
            return f"cannot be unpickled ({type(err).__name__}: {err})"
        keys = ("label_names",) if path.name == CIFAR10.meta["filename"] else ("data", "labels")
        missing = [key for key in keys if not isinstance(entry, dict) or key not in entry]
        if missing:
            return f"has no {', '.join(missing)}"
        if keys == ("label_names",):
            return None
        rows, labels = np.asarray(entry["data"]), np.asarray(entry["labels"])
        if rows.ndim != 2 or rows.shape[1] != 3 * 32 * 32:
            return f"data of shape {rows.shape}, not (n, 3072)"
        if len(labels) != len(rows):
            return f"{len(rows)} images but {len(labels)} labels"
        outside = labels[(labels < 0) | (labels >= len(CIFAR10_CLASSES))]
        return f"{len(outside)} labels outside 0..9 (the first: {outside[0]})" if len(outside) else None

    def _tensors(self, dataset: CIFAR10) -> tuple[Tensor, Tensor]:
        if tuple(dataset.classes) != CIFAR10_CLASSES:
            raise ValueError(
                f"{self.root / self.files[-1]} must name the classes {CIFAR10_CLASSES}, got {dataset.classes}"
            )
        return torch.from_numpy(dataset.data).permute(0, 3, 1, 2), torch.tensor(dataset.targets)

    def _relabel(self, y: Tensor) -> Tensor:
        table = torch.full((len(CIFAR10_CLASSES),), -1, dtype=torch.int64)
        table[[CIFAR10_CLASSES.index(name) for name in self.classes]] = torch.arange(len(self.classes))
        return table[y]

    def setup(self, stage: str | None = None) -> None:
        if self.train_dataset is not None:
            return
        super().setup(stage)
        if self.normalize:
            x = self.train_dataset.tensors[0]
            self.channel_mean, self.channel_std = x.mean((0, 2, 3)), x.std((0, 2, 3)).clamp_min(1e-6)
            for dataset in (self.train_dataset, self.val_dataset):
                dataset.tensors[0].sub_(self.channel_mean[:, None, None]).div_(self.channel_std[:, None, None])
