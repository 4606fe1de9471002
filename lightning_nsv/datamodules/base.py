"""The logic every data module of the package shares: split, training subset, label corruption, loaders."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset
from torchvision.datasets import VisionDataset

from lightning_nsv.compat import pl

TASKS = ("binary", "multiclass")


class ClassificationDataModule(pl.LightningDataModule):
    """In-memory classification data with a seeded training subset of size ``m``.

    A subclass only loads its source data (:meth:`_load`) and, where needed, maps the source labels
    (:meth:`_relabel`); this class does the rest, all from one ``torch.Generator`` seeded with ``seed``,
    used in this order: (1) where the source has no official test set, split it once into a held-out set
    of ``round(val_fraction * n)`` samples and a training pool; (2) draw the training subset of size ``m``
    from the pool (subsets of one seed are nested in ``m``); (3) corrupt the labels of that subset only.

    Each dataset yields ``(x, y)``: ``x`` a float32 tensor of shape :attr:`input_shape`, ``y`` an int64
    scalar in ``0..num_classes-1``. Everything is held in memory as tensors (``dataset.tensors``).

    Attributes set by :meth:`setup`:
        train_dataset: the training subset, labels corrupted as asked.
        val_dataset: the held-out set (the official test set where the source has one).
        test_dataset: the same object as ``val_dataset``.
        train_indices: LongTensor, the training subset's indices in the full source training data, in
            the order of ``train_dataset``.

    Args:
        m: Training subset size, a seeded random subset of the training pool; None takes the whole pool.
        val_fraction: Fraction of the data held out for validation, for sources without an official test
            set (digits, toy and quadrant data); ignored where the official test set is the held-out set.
        seed: Seed of the split, the subset, the label corruption, the data of synthetic sources and the
            order of the training batches.
        random_labels: Replace every training label by a uniformly random label.
        label_noise: Fraction of training labels changed to another, uniformly random label.
        batch_size: Samples per batch of every loader.
        num_workers: Worker processes of every loader.
        task: ``"binary"``, or ``"multiclass"`` where the module supports it (see ``tasks``).

    Raises:
        ValueError: On an argument out of its range; :meth:`setup` raises on ``m`` larger than the pool.
    """

    tasks: tuple[str, ...] = ("binary",)
    is_image: bool = False
    input_shape: tuple[int, ...] = ()
    max_value: float = 1.0
    num_multiclass: int = 2

    def __init__(
        self,
        m: int | None = None,
        val_fraction: float = 0.2,
        seed: int = 0,
        random_labels: bool = False,
        label_noise: float = 0.0,
        batch_size: int = 100,
        num_workers: int = 0,
        task: str = "binary",
    ) -> None:
        super().__init__()
        if m is not None and m < 1:
            raise ValueError(f"`m` must be a positive integer or None (all of the training pool), got {m}")
        if not 0 <= val_fraction < 1:
            raise ValueError(f"`val_fraction` must be in [0, 1), got {val_fraction}")
        if not 0 <= label_noise <= 1:
            raise ValueError(f"`label_noise` must be in [0, 1], got {label_noise}")
        if random_labels and label_noise > 0:
            raise ValueError(
                f"`random_labels=True` replaces every training label, so `label_noise` must be 0, got {label_noise}"
            )
        if batch_size < 1:
            raise ValueError(f"`batch_size` must be a positive integer, got {batch_size}")
        if num_workers < 0:
            raise ValueError(f"`num_workers` must be a non-negative integer, got {num_workers}")
        if task not in self.tasks:
            raise ValueError(f"`task` of {type(self).__name__} can be {', '.join(self.tasks)}, got {task!r}")
        self.save_hyperparameters()
        self.m, self.val_fraction, self.seed = m, val_fraction, seed
        self.random_labels, self.label_noise = random_labels, label_noise
        self.batch_size, self.num_workers, self.task = batch_size, num_workers, task
        self.num_classes = 2 if task == "binary" else self.num_multiclass
        self.train_dataset: TensorDataset | None = None
        self.val_dataset: TensorDataset | None = None
        self.test_dataset: TensorDataset | None = None
        self.train_indices: Tensor | None = None

    def _load(self) -> tuple[Tensor, Tensor, tuple[Tensor, Tensor] | None]:
        """Source training inputs (any dtype, ``max_value`` scales them to [0, 1]), their source labels and the
        official test set, or None to split off ``val_fraction`` of the training data."""
        raise NotImplementedError

    def _relabel(self, y: Tensor) -> Tensor:
        """Task labels from source labels; -1 drops a sample."""
        return y

    def setup(self, stage: str | None = None) -> None:
        if self.train_dataset is not None:
            return
        x, y, test = self._load()
        y = self._relabel(y)
        source = (y >= 0).nonzero().squeeze(1)
        g = torch.Generator().manual_seed(self.seed)
        if test is None:
            perm = source[torch.randperm(len(source), generator=g)]
            n_val = round(self.val_fraction * len(source))
            pool, held = perm[n_val:], perm[:n_val].sort().values
            self.val_dataset = self._dataset(x, y, held)
        else:
            x_test, y_test = test[0], self._relabel(test[1])
            pool = source
            self.val_dataset = self._dataset(x_test, y_test, (y_test >= 0).nonzero().squeeze(1))
        if self.m is not None and self.m > len(pool):
            raise ValueError(f"`m` must be at most the training pool size {len(pool)}, got {self.m}")
        self.train_indices = pool[torch.randperm(len(pool), generator=g)[: self.m]].sort().values
        self.train_dataset = self._dataset(x, self._corrupt(y, self.train_indices, g), self.train_indices)
        self.test_dataset = self.val_dataset

    def _dataset(self, x: Tensor, y: Tensor, index: Tensor) -> TensorDataset:
        return TensorDataset(x[index].to(torch.float32) / self.max_value, y[index].to(torch.int64))

    def _corrupt(self, y: Tensor, index: Tensor, g: torch.Generator) -> Tensor:
        """Copy of ``y`` with the labels at ``index`` randomised or flipped as asked."""
        y, k = y.clone(), self.num_classes
        if self.random_labels:
            y[index] = torch.randint(k, index.shape, generator=g, dtype=y.dtype)
            return y
        flip = index[torch.randperm(len(index), generator=g)[: round(self.label_noise * len(index))]]
        y[flip] = (y[flip] + torch.randint(1, k, flip.shape, generator=g, dtype=y.dtype)) % k
        return y

    def _loader(self, dataset: TensorDataset | None, shuffle: bool = False) -> DataLoader:
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__}.setup() must run before its data loaders are asked for")
        generator = torch.Generator().manual_seed(self.seed) if shuffle else None
        return DataLoader(
            dataset, batch_size=self.batch_size, shuffle=shuffle, generator=generator,
            num_workers=self.num_workers, drop_last=False,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_dataset, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_dataset)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_dataset)


class TorchvisionDataModule(ClassificationDataModule):
    """A :class:`ClassificationDataModule` read by a torchvision dataset class from files under ``root``.

    The held-out set is the official test set. Subclasses name their files (:attr:`files`, relative to
    ``root``), build the torchvision dataset (:meth:`_torchvision`) and turn it into tensors
    (:meth:`_tensors`).

    Args:
        root: Directory that holds (or, with ``download=True``, receives) the data set.
        download: Let :meth:`prepare_data` download missing files (needs internet).
        **kwargs: Arguments of :class:`ClassificationDataModule`.

    Raises:
        FileNotFoundError: From :meth:`prepare_data` and :meth:`setup` when files are missing and
            ``download`` is False; the message lists the expected layout.
    """

    is_image = True
    max_value = 255.0
    files: tuple[str, ...] = ()

    def __init__(self, root: str, download: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.root, self.download = Path(root), download

    def _torchvision(self, train: bool, download: bool = False) -> VisionDataset:
        raise NotImplementedError

    def _tensors(self, dataset: VisionDataset) -> tuple[Tensor, Tensor]:
        """Inputs as ``(n, *input_shape)`` and labels of a loaded torchvision dataset."""
        raise NotImplementedError

    def prepare_data(self) -> None:
        if self.download:
            for train in (True, False):
                self._torchvision(train, download=True)
        self._check_files()

    def _check_files(self) -> None:
        missing = [name for name in self.files if not (self.root / name).is_file()]
        if missing:
            expected = "\n".join(f"  {self.root / name}" for name in self.files)
            raise FileNotFoundError(
                f"{type(self).__name__} found no {', '.join(missing)} under {self.root}. Expected the layout\n"
                f"{expected}\nPass `download=True` on a machine with internet access to fetch them into `root`."
            )

    def _load(self) -> tuple[Tensor, Tensor, tuple[Tensor, Tensor] | None]:
        self._check_files()
        return *self._tensors(self._torchvision(True)), self._tensors(self._torchvision(False))


def five_or_more(y: Tensor, task: str) -> Tensor:
    """Digit labels for ``task``: 0-4 -> 0 and 5-9 -> 1 for binary, the digit itself for multiclass."""
    return (y >= 5).long() if task == "binary" else y.long()
