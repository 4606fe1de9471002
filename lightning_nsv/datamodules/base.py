"""The logic every data module of the package shares: split, training subset, label corruption, loaders."""
from __future__ import annotations

import math
import os
import pickle
import struct
from pathlib import Path
from typing import Any, Iterator, Literal, Sized, get_args

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from torchvision.datasets import VisionDataset

from lightning_nsv.compat import pl
from lightning_nsv.validate import check_count, check_flag, check_real

Task = Literal["binary", "multiclass"]
TASKS: tuple[str, ...] = get_args(Task)


class ClassificationDataModule(pl.LightningDataModule):
    """In-memory classification data with a seeded training subset of size ``m``.

    A subclass only loads its source data (:meth:`_load`) and, where needed, maps the source labels
    (:meth:`_relabel`); this class does the rest, all from one ``torch.Generator`` seeded with ``seed``,
    used in this order: (1) where the source has no official test set, split it once into a held-out set
    of ``round(val_fraction * n)`` samples and a training pool; (2) draw the training subset of size ``m``
    from the pool (subsets of one seed are nested in ``m``); (3) corrupt the labels of that subset only.

    Each dataset yields ``(x, y)``: ``x`` a float32 tensor of shape :attr:`input_shape`, ``y`` an int64
    scalar in ``0..num_classes-1``. Everything is held in memory as tensors (``dataset.tensors``).

    The loaders yield ``[x, y]`` batches sliced from those tensors (``DataLoader(dataset, batch_size=None,
    sampler=EpochBatchSampler(...))``, no per-sample collation, each batch one ``index_select`` per tensor:
    :class:`BatchSlicedTensorDataset`); ``loader.dataset`` is the dataset, a ``TensorDataset``.
    The training order of epoch e depends on ``(seed, e)`` only, so a resumed fit repeats the batches of an
    uninterrupted one. Under a distributed strategy every rank takes its share of each batch order itself
    (as ``DistributedSampler`` does); the last batch of a rank may be shorter.

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
        batch_size: Samples per batch of every loader (per rank in distributed runs).
        num_workers: Worker processes of every loader (0: batches are sliced in the main process, usually
            the fastest for in-memory data).
        task: ``"binary"``, or ``"multiclass"`` where the module supports it (see ``tasks``).

    Raises:
        TypeError: On an argument of the wrong type (a bool or float for an integer, a string for a number).
        ValueError: On an argument out of its range, NaN or infinite; :meth:`setup` raises on ``m`` larger than
            the pool, or on a pool left empty by ``val_fraction``.
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
        task: Task = "binary",
    ) -> None:
        super().__init__()
        m = check_count("m", m, 1, 500, none="all of the training pool")
        val_fraction = check_real("val_fraction", val_fraction, 0.2, high=1.0, closed=False)
        # numpy's SeedSequence, which orders the batches, takes no negative seed, torch.Generator none >= 2**64
        seed = check_count("seed", seed, 0, 0, high=2**64 - 1)
        random_labels = check_flag("random_labels", random_labels)
        label_noise = check_real("label_noise", label_noise, 0.1, high=1.0)
        if random_labels and label_noise > 0:
            raise ValueError(
                f"`random_labels=True` replaces every training label, so `label_noise` must be 0, got {label_noise}"
            )
        batch_size = check_count("batch_size", batch_size, 1, 100)
        num_workers = check_count("num_workers", num_workers, 0, 0)
        if task not in self.tasks:
            raise ValueError(f"`task` of {type(self).__name__} can be {', '.join(self.tasks)}, got {task!r}")
        self.save_hyperparameters()
        # numpy scalars and paths (accepted above) as plain values: a checkpoint must load with weights_only
        for hparams in (self.hparams, self._hparams_initial):
            hparams.update({key: value.item() if isinstance(value, np.generic) else os.fspath(value)
                            for key, value in hparams.items() if isinstance(value, (np.generic, os.PathLike))})
        self.m, self.val_fraction, self.seed = m, val_fraction, seed
        self.random_labels, self.label_noise = random_labels, label_noise
        self.batch_size, self.num_workers, self.task = batch_size, num_workers, task
        self.num_classes = 2 if task == "binary" else self.num_multiclass
        self.train_dataset: TensorDataset | None = None
        self.val_dataset: TensorDataset | None = None
        self.test_dataset: TensorDataset | None = None
        self.train_indices: Tensor | None = None
        self._recorded_train_indices: Tensor | None = None

    def state_dict(self) -> dict[str, Any]:
        """The training indices once set up: a checkpoint records which samples the network was trained on."""
        return {} if self.train_indices is None else {"train_indices": self.train_indices.clone()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep a checkpoint's training indices. A resumed fit (or a module without a Trainer) must have the same:
        checked now or at :meth:`setup`; validate and test may use other data (``lightning-nsv analyze`` checks
        with :meth:`check_training_indices`)."""
        self._recorded_train_indices = state_dict.get("train_indices")
        if self._fitting():
            self.check_training_indices()

    def _fitting(self) -> bool:
        return self.trainer is None or self.trainer.state.fn == "fit"

    def check_training_indices(self) -> None:
        """Raise if the training subset differs from the one recorded by :meth:`load_state_dict` (a checkpoint's).

        Raises:
            ValueError: With both sizes and the first position that differs.
        """
        recorded, current = self._recorded_train_indices, self.train_indices
        if recorded is None or current is None or torch.equal(recorded, current):
            return
        shared = min(len(recorded), len(current))
        unequal = (recorded[:shared] != current[:shared]).nonzero()
        first = f"; the first difference is at position {int(unequal[0])}" if len(unequal) else ""
        raise ValueError(
            f"{type(self).__name__}: the training subset is not the one the checkpoint records ({len(current)} "
            f"samples here, {len(recorded)} there{first}): the data module's arguments (seed, m, val_fraction, ...) "
            "or its data differ from training. Pass the arguments the checkpoint was trained with (its run's "
            "config.yaml), and the same data"
        )

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
        if not len(pool):
            why = (f"val_fraction={self.val_fraction} holds out {n_val} of its {len(source)} samples, leaving 0 "
                   "for training; lower `val_fraction`, e.g. val_fraction=0.2" if test is None
                   else "its training data holds no sample of the task's classes")
            raise ValueError(f"{type(self).__name__} has no training samples: {why}")
        if self.m is not None and self.m > len(pool):
            held_out = "" if test is not None else f" left after holding out val_fraction={self.val_fraction}"
            raise ValueError(
                f"`m` must be at most the training pool size {len(pool)}{held_out}, got {self.m}; lower `m`, or "
                "pass m=None to train on the whole pool"
            )
        self.train_indices = pool[torch.randperm(len(pool), generator=g)[: self.m]].sort().values
        self.train_dataset = self._dataset(x, self._corrupt(y, self.train_indices, g), self.train_indices)
        self.test_dataset = self.val_dataset
        if self._fitting():
            self.check_training_indices()

    def _dataset(self, x: Tensor, y: Tensor, index: Tensor) -> TensorDataset:
        return BatchSlicedTensorDataset(x[index].to(torch.float32) / self.max_value, y[index].to(torch.int64))

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
        shards = getattr(self.trainer, "distributed_sampler_kwargs", None) or {}
        batches = EpochBatchSampler(dataset, self.batch_size, shuffle=shuffle, seed=self.seed,
                                    num_replicas=shards.get("num_replicas", 1), rank=shards.get("rank", 0))
        if self.trainer is not None:
            # a resumed fit draws its first batch before it calls set_epoch: start at the epoch it runs next
            batches.set_epoch(_next_epoch(self.trainer))
        # batch_size=None: each index batch is one `dataset[indices]` slice, no per-sample collation;
        # the own generator keeps the loader from drawing its base seed from the global RNG
        return DataLoader(dataset, batch_size=None, sampler=batches, num_workers=self.num_workers,
                          generator=torch.Generator())

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_dataset, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_dataset)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_dataset)


class BatchSlicedTensorDataset(TensorDataset):
    """A ``TensorDataset`` whose item at a 1-D LongTensor of indices is the batch ``tuple(t.index_select(0,
    indices) for t in tensors)``: the values of ``t[indices]``, in about half the time (a batch of 100 MNIST
    images: about 25 µs against 55 µs). Any other index is ``TensorDataset``'s."""

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, Tensor) and index.dim() == 1 and index.dtype == torch.int64:
            return tuple(tensor.index_select(0, index) for tensor in self.tensors)
        return super().__getitem__(index)


def _next_epoch(trainer: Any) -> int:
    """The epoch that the fit loop runs next: epochs started so far (an epoch whose checkpoint was written at
    its validation end, before it counted as completed, is not run again)."""
    progress = getattr(getattr(getattr(trainer, "fit_loop", None), "epoch_progress", None), "current", None)
    return int(progress.started) if progress is not None else int(trainer.current_epoch)


class EpochBatchSampler(DistributedSampler):
    """Index batches (LongTensors) of a map-style dataset, in an order fixed by ``(seed, epoch)``.

    With ``shuffle`` the order of epoch e is a permutation drawn from a generator seeded with
    ``SeedSequence([seed, e])``, so a run resumed from a checkpoint at epoch k sees the batches of an
    uninterrupted run (the Trainer calls :meth:`set_epoch` before every epoch, and the data module sets the
    restored epoch when it builds the loader); without ``shuffle`` the order is the dataset's. Each of ``num_replicas`` ranks takes every ``num_replicas``-th index of the
    order, padded with its first indices to a multiple of ``num_replicas`` (as ``DistributedSampler`` does,
    whose subclass this is so that the Trainer does not wrap it in another), then cuts its share into
    batches of ``batch_size``, the last one shorter.

    Used as ``DataLoader(dataset, batch_size=None, sampler=EpochBatchSampler(...))``: a dataset that takes a
    list of indices, like ``TensorDataset``, then returns whole batches by slicing its tensors.

    Args:
        dataset: The dataset; only its length is read.
        batch_size: Indices per batch.
        shuffle: Permute the order every epoch.
        seed: Seed of the permutations.
        num_replicas: Ranks that share the data.
        rank: This rank, in ``0..num_replicas-1``.

    Example::

        >>> sampler = EpochBatchSampler(range(5), batch_size=2, shuffle=False)
        >>> [b.tolist() for b in sampler]
        [[0, 1], [2, 3], [4]]
    """

    def __init__(self, dataset: Sized, batch_size: int, shuffle: bool = True, seed: int = 0, num_replicas: int = 1,
                 rank: int = 0) -> None:
        batch_size = check_count("batch_size", batch_size, 1, 100)
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)
        self.batch_size = batch_size

    def __iter__(self) -> Iterator[Tensor]:
        n = len(self.dataset)
        if self.shuffle:
            state = np.random.SeedSequence([self.seed, self.epoch]).generate_state(2, np.uint32)
            order = torch.randperm(n, generator=torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1])))
        else:
            order = torch.arange(n)
        if self.total_size > n:
            order = torch.cat([order, order[: self.total_size - n]])
        return iter(order[self.rank : self.total_size : self.num_replicas].split(self.batch_size))

    def __len__(self) -> int:
        return math.ceil(self.num_samples / self.batch_size)


# how to let a data module download, in Python and on the command line
DOWNLOAD = "`download=True` (on the command line `--data.download true`)"


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
        TypeError: On a ``root`` that is no path (str or os.PathLike) or a ``download`` that is no bool.
        FileNotFoundError: From :meth:`prepare_data` and :meth:`setup` when files are missing and
            ``download`` is False; the message lists the expected layout.
    """

    is_image = True
    max_value = 255.0
    source_classes = 10
    files: tuple[str, ...] = ()
    _layout_note = ""  # what else the layout may hold, said when files are missing

    def __init__(self, root: str, download: bool = False, **kwargs: Any) -> None:
        if not isinstance(root, (str, os.PathLike)):
            raise TypeError(f"`root` must be a directory path (str or os.PathLike), got {root!r} "
                            f"({type(root).__name__}); e.g. root='data'")
        download = check_flag("download", download)
        super().__init__(**kwargs)
        self.root, self.download = Path(root), download

    def _torchvision(self, train: bool, download: bool = False) -> VisionDataset:
        raise NotImplementedError

    def _split_files(self, train: bool) -> tuple[str, ...]:
        """The files of :attr:`files` that the training (or the test) split reads."""
        raise NotImplementedError

    def _file_problem(self, path: Path) -> str | None:
        """What is wrong with one data file, or None if it looks readable."""
        return None

    def _read(self, train: bool) -> tuple[Tensor, Tensor]:
        """Inputs and source labels of a split; files that cannot be read, or disagree, are named, with what to do."""
        try:
            x, y = self._tensors(self._torchvision(train))
            self._check_source(x, y)
            return x, y
        except (RuntimeError, ValueError, AssertionError, EOFError, pickle.UnpicklingError, KeyError, IndexError,
                TypeError, struct.error) as err:
            names = self._split_files(train)
            problems = {name: self._file_problem(self.root / name) for name in names}
            bad = [f"  {self.root / name}: {problem}" for name, problem in problems.items() if problem]
            found = ("\n".join(bad) if bad else
                     "one of\n" + "\n".join(f"  {self.root / name}" for name in names))
            raise ValueError(
                f"{type(self).__name__} cannot read the {'training' if train else 'test'} files "
                f"({type(err).__name__}: {err}); corrupt or truncated (an interrupted download or copy?):\n{found}\n"
                f"Delete the file and download it again with {DOWNLOAD} on a machine with internet access, which "
                "checks the archive's md5 sum, or copy it anew."
            ) from err

    def _check_source(self, x: Tensor, y: Tensor) -> None:
        """Refuse source data whose counts, image shape or labels do not fit (a file of another data set, or
        one damaged without breaking its format: torchvision reads such files without a word)."""
        if len(x) != len(y):
            raise ValueError(f"{len(x)} images but {len(y)} labels")
        if tuple(x.shape[1:]) != self.input_shape:
            raise ValueError(f"images of shape {tuple(x.shape[1:])}, expected {self.input_shape}")
        outside = (y < 0) | (y >= self.source_classes)
        if outside.any():
            raise ValueError(f"{int(outside.sum())} labels outside 0..{self.source_classes - 1} "
                             f"(the first: {int(y[outside][0])})")

    def _tensors(self, dataset: VisionDataset) -> tuple[Tensor, Tensor]:
        """Inputs as ``(n, *input_shape)`` and labels of a loaded torchvision dataset."""
        raise NotImplementedError

    def prepare_data(self) -> None:
        if self.download:
            for train in (True, False):
                self._torchvision(train, download=True)
        self._check_files()

    def _has_file(self, name: str) -> bool:
        """Whether the data file ``name`` of :attr:`files` is there to be read."""
        return (self.root / name).is_file()

    def _check_files(self) -> None:
        missing = [name for name in self.files if not self._has_file(name)]
        if missing:
            expected = "\n".join(f"  {self.root / name}" for name in self.files)
            raise FileNotFoundError(
                f"{type(self).__name__} found no {', '.join(missing)} under {self.root}. Expected the layout\n"
                f"{expected}{self._layout_note}\nPass {DOWNLOAD} on a machine with internet access to fetch them into "
                "`root`."
            )

    def _load(self) -> tuple[Tensor, Tensor, tuple[Tensor, Tensor] | None]:
        self._check_files()
        return *self._read(True), self._read(False)


def five_or_more(y: Tensor, task: str) -> Tensor:
    """Digit labels for ``task``: 0-4 -> 0 and 5-9 -> 1 for binary, the digit itself for multiclass."""
    return (y >= 5).long() if task == "binary" else y.long()
