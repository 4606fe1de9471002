"""The training and validation data of :class:`~lightning_nsv.callbacks.NetworkSupportVectors`: which datasets, how
their batches and labels read, and where the float64 analysis runs."""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, IterableDataset

from lightning_nsv.compat import pl, rank_zero_warn
from lightning_nsv.solver.options import analysis_device


def split_batch(batch: Any) -> tuple[Tensor, Tensor]:
    if isinstance(batch, (tuple, list)) and len(batch) >= 2:
        return batch[0], label_vector(batch[1])
    raise TypeError(
        f"batches must be (inputs, labels) tuples for the support-vector analysis, got {type(batch).__name__}"
    )


def label_vector(y: Any) -> Any:
    """Labels of shape ``(n, 1)`` as ``(n,)`` (a label times an output of shape ``(n,)`` would otherwise broadcast to
    ``(n, n)``); other shapes of two or more dimensions (one-hot labels) are refused."""
    if not isinstance(y, Tensor) or y.dim() < 2:
        return y
    if y.dim() == 2 and y.shape[1] == 1:
        return y[:, 0]
    raise ValueError(
        f"NetworkSupportVectors needs one class label per sample, of shape (n,) or (n, 1), got labels of shape "
        f"{tuple(y.shape)}; give class indices (`y.argmax(1)` of one-hot labels)"
    )


def gather(dataset: Dataset, indices: list[int]) -> tuple[Tensor, Tensor]:
    """``(inputs, labels)`` of the samples at ``indices``: sliced from in-memory tensors, else item by item."""
    tensors = getattr(dataset, "tensors", None)
    if isinstance(tensors, (tuple, list)) and len(tensors) >= 2:
        index = torch.as_tensor(indices, dtype=torch.long)
        return tensors[0][index], label_vector(tensors[1][index])
    xs, ys = zip(*[split_batch(dataset[i]) for i in indices])
    return torch.stack([torch.as_tensor(x) for x in xs]), label_vector(torch.stack([torch.as_tensor(y) for y in ys]))


def module_analysis_device(pl_module) -> torch.device:
    """Where the float64 analysis runs: the module's device for CUDA, else the CPU (MPS has no float64)."""
    return analysis_device(pl_module.device)


def trains_on_part(trainer: pl.Trainer) -> bool:
    limit = trainer.limit_train_batches
    if isinstance(limit, float):
        return limit < 1.0
    try:
        return limit is not None and limit < len(trainer.train_dataloader)
    except TypeError:  # a loader without a length
        return False


def train_dataset(trainer: pl.Trainer) -> Dataset:
    datamodule = trainer.datamodule
    dataset = getattr(datamodule, "train_dataset", None) if datamodule is not None else None
    if dataset is None:
        loader = trainer.train_dataloader
        dataset = getattr(loader, "dataset", None)
    if dataset is None:
        raise RuntimeError(
            "NetworkSupportVectors needs the training set: give the datamodule a `train_dataset` attribute "
            "or train with a single DataLoader"
        )
    if not hasattr(dataset, "__len__") or isinstance(dataset, IterableDataset):
        raise TypeError(
            f"NetworkSupportVectors needs a training set it can index and count (a map-style Dataset with `__len__`, "
            f"e.g. a TensorDataset), got {type(dataset).__name__}: zero training error and the support vectors are "
            "properties of a fixed set of samples; give the datamodule a `train_dataset` that is one"
        )
    return dataset


def val_dataset(trainer: pl.Trainer) -> Dataset | None:
    datamodule = trainer.datamodule
    dataset = getattr(datamodule, "val_dataset", None) if datamodule is not None else None
    if dataset is None:
        loaders = trainer.val_dataloaders
        if isinstance(loaders, DataLoader):
            dataset = loaders.dataset
    return dataset


def say_no_training_batches(trainer: pl.Trainer) -> None:
    """Lightning skips training on a loader without batches, before any hook of this callback runs."""
    datamodule = trainer.datamodule
    loader = trainer.train_dataloader
    source = (f"the data module {type(datamodule).__name__}" if datamodule is not None
              else f"the {type(loader).__name__} passed to `fit`")
    dataset = getattr(loader, "dataset", None)
    try:
        size = f"{len(dataset)} samples" if dataset is not None else "no dataset"
    except TypeError:
        size = "a dataset without a length"
    rank_zero_warn(
        f"NetworkSupportVectors: the training dataloader of {source} has no batches ({size}), so Lightning did "
        "not train and there is nothing to analyse: no support-vector analysis ran and no file was written. Check "
        "the data module's `m`, split and files (or `drop_last` with a batch size above the training set's size)."
    )


def skips_epoch(trainer: pl.Trainer, every_n_epochs: int, analysed: bool) -> bool:
    """Whether the epoch that ends is not checked: sanity checks, ``fast_dev_run``, after an analysis that stopped
    training, and between every ``every_n_epochs``-th epoch (the last one of ``max_epochs`` is checked)."""
    return (trainer.sanity_checking or bool(trainer.fast_dev_run) or analysed
            or ((trainer.current_epoch + 1) % every_n_epochs != 0 and trainer.current_epoch + 1 != trainer.max_epochs))


def distributed(trainer: pl.Trainer) -> bool:
    """Whether the ranks of a ``torch.distributed`` group run the fit."""
    return trainer.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized()
