"""The zero-error monitor of :class:`~lightning_nsv.callbacks.NetworkSupportVectors`: whether every training sample has
``y·N(x) > 0`` (Assumption 1 of Snyder & Vishwanath, float64, weights frozen), cheaply while the network is far from
it, with non-finite values named, the module's output checked against the analysed part, and the verdict reduced over
the DDP ranks."""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor
from torch.utils.data import Dataset

from lightning_nsv.analysis.binary import signed_labels
from lightning_nsv.analysis.checks import conflicting_duplicates, one_class_message
from lightning_nsv.callbacks.nsv_checks import (DIVERGED, HEAD_CHECK_SAMPLES, first_non_finite_parameter,
                                                first_non_finite_row, first_non_finite_sample, sum_over_ranks)
from lightning_nsv.callbacks.nsv_data import gather, module_analysis_device, split_batch
from lightning_nsv.compat import pl
from lightning_nsv.models.layers import eval_mode
from lightning_nsv.scope import Scope, module_inputs
from lightning_nsv.solver.multiclass import class_labels, pair_margins

__all__ = ["ZeroErrorMonitor", "labels_of", "margins_of", "shard"]


def labels_of(scope: Scope, y: Tensor) -> Tensor:
    """Binary labels as ±1 (float64), class labels as int64 in ``[0, K)``; refuses anything else."""
    if scope.num_outputs == 1:
        return signed_labels(y)
    return torch.from_numpy(class_labels(y, scope.num_outputs))


def margins_of(scope: Scope, outputs: Tensor, y: Tensor) -> Tensor:
    """``y·N(x)`` (binary) or ``min_k N_y(x) − N_k(x)`` (multi-class); NaN where outputs are not finite."""
    labels = labels_of(scope, y)
    if scope.num_outputs == 1:
        return labels * outputs
    margins = torch.from_numpy(pair_margins(outputs, labels.numpy())).min(1).values
    return torch.where(torch.isfinite(outputs).all(1), margins, torch.nan)


def shard(trainer: pl.Trainer, n: int) -> list[int]:
    """The training indices this rank checks: every ``world_size``-th one."""
    return list(range(trainer.global_rank, n, trainer.world_size))


class ZeroErrorMonitor:
    """The zero-error pass over the training set, batch by batch of ``batch_size``: the samples misclassified at the
    last pass and a random probe of ``probe_size`` (seeded by ``seed`` and the epoch) first, the full pass stopping at
    the first misclassified batch. ``warn`` says a warning once.

    What a pass leaves: ``hard`` (the misclassified samples, tried first next time), ``kept`` (the embedded batches
    of a clean pass and their gates, for the analysis on one rank), ``mismatch`` (the analysed part's output against
    the module's on the samples nearest the boundary), ``label_range``; ``diverged`` once a non-finite value was seen,
    ``single_class`` when the training set has one class.
    """

    def __init__(self, batch_size: int, probe_size: int, seed: int, warn: Callable[[str], None]) -> None:
        self.batch_size, self.probe_size, self.seed, self.warn = batch_size, probe_size, seed, warn
        self.hard: list[int] = []
        self.kept: list[tuple[Tensor, Tensor, Any]] = []
        self.diverged = False
        self.mismatch: str | None = None  # until the ranks agree on it
        self.label_range: tuple[Any, Any] = (None, None)  # this rank's smallest and largest label at zero error
        self.single_class: Any = None

    def reset(self) -> None:
        """A new fit: what the last one said about its data does not hold."""
        self.single_class = None

    def check_first_batch(self, scope: Scope, module: torch.nn.Module, batch: Any) -> None:
        """The labels, finite weights and inputs, and the analysed part's output against the module's."""
        x, y = split_batch(batch)
        labels_of(scope, y)
        non_finite = first_non_finite_parameter(module)
        if non_finite is not None:
            raise ValueError(f"NetworkSupportVectors: {non_finite} before training: {DIVERGED}")
        row = first_non_finite_row(x)
        if row is not None:
            raise ValueError(
                f"NetworkSupportVectors: the first training batch holds NaN/inf inputs (row {row} of the "
                "batch); clean the data (e.g. torch.nan_to_num or drop those samples) before training"
            )
        mismatch = scope.output_mismatch(module, x[:8], "the first training batch", warn=self.warn)
        if mismatch is not None:
            raise ValueError(mismatch)

    def trustworthy(self, scope: Scope, trainer: pl.Trainer) -> bool:
        """After a zero-error pass on every rank: refuse a module whose output is not its head's (every analysis),
        and say that a training set of one class is not analysed. Collective: every rank takes part."""
        mismatch, self.mismatch = self.mismatch, None
        if not trainer.strategy.reduce_boolean_decision(mismatch is None, all=True):
            raise ValueError(mismatch or "NetworkSupportVectors: on another rank the module's output is not its "
                             "path part's (see that rank's error)")
        low, high = self.label_range
        first = trainer.strategy.broadcast(low, src=0)
        if not trainer.strategy.reduce_boolean_decision(low is None or low == high == first, all=True):
            return True
        self.single_class = first
        self.warn(
            f"NetworkSupportVectors: {one_class_message(first, scope.num_outputs)}, so the support-vector "
            "analysis does not run and no file is written. Check the data module's labels, split or filtering."
        )
        return False

    def zero_error_here(self, scope: Scope, trainer: pl.Trainer, dataset: Dataset, frozen: Any,
                        module: torch.nn.Module, epoch: int) -> bool:
        """Whether every training sample of this rank's shard has ``y·N(x) > 0``."""
        indices = shard(trainer, len(dataset))
        generator = torch.Generator().manual_seed(self.seed + epoch)
        probe = [indices[i] for i in torch.randperm(len(indices), generator=generator)[: self.probe_size].tolist()]
        for tried in (self.hard, probe):
            wrong = self.errors(scope, dataset, tried, frozen, module) if tried else []
            if wrong:
                self.hard = wrong
                return False
        self.kept, passed = [], []
        wrong = self.errors(scope, dataset, indices, frozen, module, keep=self.kept if trainer.world_size == 1 else None,
                            margins=passed)
        if wrong:
            self.hard, self.kept = wrong, []
            return False
        margins, labels = (torch.cat(parts) for parts in zip(*passed)) if passed else (torch.zeros(0),) * 2
        self.label_range = (labels.min().item(), labels.max().item()) if len(labels) else (None, None)
        # the module against the analysed part on the samples nearest the boundary, where a difference flips a sign
        nearest = [indices[i] for i in torch.argsort(margins)[:HEAD_CHECK_SAMPLES].tolist()]
        if nearest:
            self.mismatch = scope.output_mismatch(
                module, gather(dataset, nearest)[0], f"the {len(nearest)} training samples nearest its decision "
                f"boundary at epoch {epoch}", nearest, float(margins.abs().max()), warn=self.warn)
        return True

    def take_kept(self) -> list[tuple[Tensor, Tensor, Any]]:
        kept, self.kept = self.kept, []
        return kept

    def errors(self, scope: Scope, dataset: Dataset, indices: list[int], frozen: Any, module: torch.nn.Module,
               stop_early: bool = True, keep: list | None = None, margins: list | None = None) -> list[int]:
        """Indices whose ``y·N(x) > 0`` fails (NaN counts as failing); ``keep`` collects the embedded batches and
        their gates, ``margins`` each batch's margins and labels."""
        wrong, device = [], module_analysis_device(module)
        on_device = frozen.to(device)
        for start in range(0, len(indices), self.batch_size):
            chunk = indices[start:start + self.batch_size]
            x, y = gather(dataset, chunk)
            embedded = scope.embed(module_inputs(module, x)).to(device)
            outputs, gates = scope.outputs(on_device, embedded, keep_gates=keep is not None)
            outputs = outputs.cpu()
            if keep is not None:
                keep.append((embedded, y, gates))
            try:
                margin = margins_of(scope, outputs, y)
            except ValueError as err:  # labels are checked in the first training batch only, by the callback
                raise ValueError(f"NetworkSupportVectors: training samples {chunk[0]}..{chunk[-1]} (of the "
                                 f"callback's pass in the dataset's order): {err}") from None
            if margins is not None:
                margins.append((margin, labels_of(scope, y)))
            bad = ~(margin > 0)
            if not torch.isfinite(outputs).all():
                self._explain_non_finite(x, outputs, chunk, module)
            wrong += [chunk[i] for i in torch.nonzero(bad).flatten().tolist()]
            if wrong and stop_early:
                break
        return wrong

    def _explain_non_finite(self, x: Tensor, outputs: Tensor, chunk: list[int], module: torch.nn.Module) -> None:
        row = first_non_finite_row(outputs)
        parameter = first_non_finite_parameter(module)
        if parameter is not None:
            self.warn_diverged(parameter)
            return
        if not torch.isfinite(x[row]).all():
            cause = (f"training sample {chunk[row]} holds NaN/inf inputs; clean the data (drop or repair that "
                     "sample) — it counts as misclassified, so zero training error cannot be reached")
        else:
            cause = (f"the network's output is {outputs[row].tolist()} on training sample {chunk[row]} although its "
                     f"inputs and weights are finite: the trunk or head overflowed ({DIVERGED})")
        self.diverged = True
        self.warn(f"NetworkSupportVectors: {cause}")

    def warn_diverged(self, parameter: str, dataset: Dataset | None = None) -> None:
        self.diverged = True
        sample = first_non_finite_sample(dataset)
        data = "" if sample is None else f" Training sample {sample} holds NaN/inf inputs: clean the data first."
        self.warn(f"NetworkSupportVectors: {parameter}: {DIVERGED}.{data} Zero training error cannot hold, so "
                  "no analysis runs and no file is written.")

    def count_errors(self, scope: Scope, trainer: pl.Trainer, dataset: Dataset, module: torch.nn.Module) -> int:
        """Misclassified training samples, each rank counting its shard, summed over the ranks."""
        with eval_mode(module), torch.no_grad():
            wrong = self.errors(scope, dataset, shard(trainer, len(dataset)), scope.freeze(), module,
                                stop_early=False)
        return sum_over_ranks(len(wrong))

    def duplicates_said(self, scope: Scope, dataset: Dataset) -> str | None:
        """Training samples with the same input and different labels, named, when there are any (no classifier
        separates them, whatever the training)."""
        n, size = len(dataset), self.batch_size
        batches = ((x, labels_of(scope, y)) for x, y in
                   (gather(dataset, list(range(i, min(i + size, n)))) for i in range(0, n, size)))
        pairs = conflicting_duplicates(batches)
        if not pairs:
            return None
        named = ", ".join(f"{i} and {j}" for i, j in pairs)
        return (f"Training samples {named}{' (and more)' if len(pairs) == 5 else ''} have the same input and different "
                "labels: no classifier separates them, so zero training error cannot be reached however long the "
                "network trains. Remove or relabel the duplicates.")

    def usable_validation(self, scope: Scope, x_val: Tensor, y_val: Tensor, shape: tuple[int, ...]) -> bool:
        """Whether the validation samples can be compared (before the analysis, which would otherwise fail at its end);
        else a warning names the problem and the analysis runs without them."""
        problem = None
        if tuple(x_val.shape[1:]) != tuple(shape):
            problem = (f"embed to {x_val.shape[1]} features, the training samples to {shape[0]}" if len(shape) == 1
                       else f"have inputs of shape {tuple(x_val.shape[1:])}, the training samples {tuple(shape)}")
        elif (row := first_non_finite_row(x_val)) is not None:
            problem = f"hold NaN/inf inputs (validation sample {row})"
        else:
            try:
                labels_of(scope, y_val)
            except ValueError as err:
                problem = f"have labels the head cannot read ({err})"
        if problem is None:
            return True
        self.warn(f"NetworkSupportVectors: the validation samples {problem}, so the analysis runs without "
                  "them (no `nsv/val_*` metrics); fix the validation data or leave out the validation loader.")
        return False
