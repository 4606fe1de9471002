"""The checks of :class:`~lightning_nsv.callbacks.NetworkSupportVectors`: its arguments, the zero-error pass (labels,
margins, non-finite values named), the module's output against its head (TF32 allowed for), duplicates with different
labels, and whether an analysis is trustworthy (one class, a head that is not the output)."""
from __future__ import annotations

import math
import numbers
import os
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset
from torchmetrics.aggregation import SumMetric

from lightning_nsv.callbacks.nsv_data import _analysis_device, _gather, _split_batch
from lightning_nsv.scope.outputs import module_inputs
from lightning_nsv.compat import pl, rank_zero_warn
from lightning_nsv.models.layers import eval_mode
from lightning_nsv.analysis.binary import signed_labels
from lightning_nsv.analysis.whole_network_budget import check_time_budget
from lightning_nsv.analysis.checks import conflicting_duplicates, one_class_message
from lightning_nsv.analysis.multiclass import METHODS as MULTICLASS_METHODS
from lightning_nsv.solver.multiclass import class_labels, pair_margins
from lightning_nsv.solver.options import SolverOptions, check_choice
from lightning_nsv.scope import AnalysisOptions, Scope, ScopeRequest, check_request


def _check_arguments(*, every_n_epochs: Any, probe_size: Any, stop_on_zero_error: Any, intercept: Any, C: Any,
                     delta: Any, kernel: Any, max_dense_bytes: Any, path_module: Any, embedding: Any, batch_size: Any,
                     save_dir: Any, max_images: Any, seed: Any, multiclass: Any, solver: Any,
                     scope: Any = "auto", image_shape: Any = None, time_budget: Any = None) -> None:
    """Refuse the callback's arguments of the wrong type or out of range, naming the argument and a valid value."""
    for name, value, low in (("every_n_epochs", every_n_epochs, 1), ("batch_size", batch_size, 1),
                             ("max_dense_bytes", max_dense_bytes, 1), ("probe_size", probe_size, 0),
                             ("max_images", max_images, 0), ("seed", seed, None)):
        _check_integer(name, value, low)
    for name, value in (("stop_on_zero_error", stop_on_zero_error), ("intercept", intercept)):
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"`{name}` must be True or False, got {value!r} ({type(value).__name__}); a string "
                            "such as 'false' would count as True")
    for name, value in (("C", C), ("delta", delta)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"`{name}` must be a real number, got {value!r} ({type(value).__name__})")
    if not 0 < C < math.inf:
        raise ValueError(f"`C` must be positive and finite, got {C}; the intercept protocol's default is 1e7")
    if not 0 < delta < 1:
        raise ValueError(f"`delta` must be in (0, 1), got {delta}; e.g. delta=0.05 for a 95% bound")
    for name, value in (("path_module", path_module), ("embedding", embedding)):
        if value is not None and (not isinstance(value, str) or not value):
            raise TypeError(f"`{name}` must be the dotted name of a submodule (e.g. 'head' or 'net.trunk') or None, "
                            f"got {value!r}")
    if save_dir is not None and not isinstance(save_dir, (str, os.PathLike)):
        raise TypeError(f"`save_dir` must be a path (str or os.PathLike) or None, got {save_dir!r}")
    if image_shape is not None and (isinstance(image_shape, (str, bytes)) or not hasattr(image_shape, "__len__")
                                    or len(image_shape) not in (2, 3)
                                    or not all(isinstance(n, numbers.Integral) and not isinstance(n, bool) and n > 0
                                               for n in image_shape)):
        raise ValueError(f"`image_shape` must be (C, H, W) or (H, W) of positive integers, e.g. (1, 8, 8), or None; "
                         f"got {image_shape!r}")
    check_time_budget(time_budget)  # as whole_network_support_vectors checks it (inf: no limit, as None)
    SolverOptions(kernel=kernel, solver=solver)  # refuses an unknown kernel or solver, as the analysis would
    check_choice("multiclass", multiclass, MULTICLASS_METHODS, "'exact' solves the K-class problem, 'ovr' K "
                 "binary ones")
    check_request(ScopeRequest(scope, path_module, embedding), AnalysisOptions(intercept=intercept,
                                                                                multiclass=multiclass))


def _check_integer(name: str, value: Any, low: int | None) -> None:
    """Refuse a non-integer (a bool, a float such as 1.5, a string) or one below ``low``, as Lightning's own callbacks do."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"`{name}` must be an integer, got {value!r} ({type(value).__name__}); pass e.g. {name}="
                        f"{max(low or 0, 1)}")
    if low is not None and value < low:
        kind = "a positive integer" if low == 1 else f"an integer >= {low}"
        raise ValueError(f"`{name}` must be {kind}, got {value}")


def _check_head_fits_classes(path: Scope, datamodule) -> None:
    """A data module that states ``num_classes`` must match the head: one output for 2 classes, else one per class
    (a 10-class checkpoint analysed with a binary data module would read 0/1 labels as two of ten classes)."""
    classes = getattr(datamodule, "num_classes", None)
    if not isinstance(classes, int) or isinstance(classes, bool):
        return
    outputs = path.num_outputs
    if (outputs == 1 and classes != 2) or (outputs > 1 and outputs != classes):
        task = f" (task={datamodule.task!r})" if isinstance(getattr(datamodule, "task", None), str) else ""
        raise ValueError(
            f"NetworkSupportVectors: {path.subject} has {outputs} output{'s' * (outputs > 1)}, but the data "
            f"module {type(datamodule).__name__}{task} has {classes} classes: a binary head needs 2 classes, a K-class "
            "head K. `lightning-nsv analyze` rebuilds the model from the checkpoint's hyperparameters: give it the config the "
            "checkpoint was trained with."
        )


#: Training samples nearest the decision boundary on which every analysis checks the module's output against its head.
HEAD_CHECK_SAMPLES = 64


_DIVERGED = ("the network has diverged (lower the learning rate, clip gradients or check the loss), or the data hold "
             "NaN/inf")


def _sum_over_ranks(count: int) -> int:
    """A count summed over the DDP ranks (each checks its shard), through torchmetrics' synchronised sum."""
    total = SumMetric()
    total.update(float(count))
    return int(total.compute())


def _first_non_finite_parameter(module: torch.nn.Module) -> str | None:
    for name, parameter in module.named_parameters():
        finite = torch.isfinite(parameter)
        if not finite.all():
            kind = "NaN" if torch.isnan(parameter).any() else "inf"
            return f"parameter {name} holds {kind} ({int((~finite).sum())} of {parameter.numel()} entries)"
    return None


def _first_non_finite_sample(dataset: Dataset | None) -> int | None:
    """Index of the first training sample with NaN/inf inputs, for in-memory (TensorDataset-like) data."""
    tensors = getattr(dataset, "tensors", None)
    if not tensors or not tensors[0].is_floating_point():
        return None
    return _first_non_finite_row(tensors[0])


def _first_non_finite_row(values: Tensor) -> int | None:
    """Index of the first sample (row) of ``values`` with a NaN/inf entry."""
    bad = (~torch.isfinite(values.reshape(len(values), -1))).any(1).nonzero()
    return int(bad[0]) if len(bad) else None


class ZeroErrorChecks:
    """The zero-error pass and the checks around it, a part of :class:`NetworkSupportVectors` (which holds the state
    they read and write: ``_scope``, ``batch_size``, ``probe_size``, ``seed``, ``_hard``, ``_kept``, ``_diverged``,
    ``_mismatch``, ``_label_range``, ``_single_class``, ``_warned``, and ``_current_epoch``)."""

    def _labels(self, y: Tensor) -> Tensor:
        """Binary labels as ±1 (float64), class labels as int64 in ``[0, K)``; refuses anything else."""
        if self._scope.num_outputs == 1:
            return signed_labels(y)
        return torch.from_numpy(class_labels(y, self._scope.num_outputs))

    def _margins(self, outputs: Tensor, y: Tensor) -> Tensor:
        """``y·N(x)`` (binary) or ``min_k N_y(x) − N_k(x)`` (multi-class); NaN where outputs are not finite."""
        labels = self._labels(y)
        if self._scope.num_outputs == 1:
            return labels * outputs
        margins = torch.from_numpy(pair_margins(outputs, labels.numpy())).min(1).values
        return torch.where(torch.isfinite(outputs).all(1), margins, torch.nan)

    def _check_head_is_output(self, pl_module: pl.LightningModule, batch: Any) -> None:
        x, y = _split_batch(batch)
        self._labels(y)
        non_finite = _first_non_finite_parameter(pl_module)
        if non_finite is not None:
            raise ValueError(f"NetworkSupportVectors: {non_finite} before training: {_DIVERGED}")
        row = _first_non_finite_row(x)
        if row is not None:
            raise ValueError(
                f"NetworkSupportVectors: the first training batch holds NaN/inf inputs (row {row} of the "
                "batch); clean the data (e.g. torch.nan_to_num or drop those samples) before training"
            )
        mismatch = self._scope.output_mismatch(pl_module, x[:8], "the first training batch", warn=self._warn_once)
        if mismatch is not None:
            raise ValueError(mismatch)

    def _trustworthy(self, trainer: pl.Trainer) -> bool:
        """After a zero-error pass on every rank: refuse a module whose output is not its head's (every analysis),
        and say that a training set of one class is not analysed. Collective: every rank takes part."""
        mismatch, self._mismatch = self._mismatch, None
        if not trainer.strategy.reduce_boolean_decision(mismatch is None, all=True):
            raise ValueError(mismatch or "NetworkSupportVectors: on another rank the module's output is not its "
                             "path part's (see that rank's error)")
        low, high = self._label_range
        first = trainer.strategy.broadcast(low, src=0)
        if not trainer.strategy.reduce_boolean_decision(low is None or low == high == first, all=True):
            return True
        self._single_class = first
        self._warn_once(
            f"NetworkSupportVectors: {one_class_message(first, self._scope.num_outputs)}, so the support-vector "
            "analysis does not run and no file is written. Check the data module's labels, split or filtering."
        )
        return False

    @staticmethod
    def _shard(trainer: pl.Trainer, n: int) -> list[int]:
        """The training indices this rank checks: every ``world_size``-th one."""
        return list(range(trainer.global_rank, n, trainer.world_size))

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            rank_zero_warn(message)

    def _zero_error_here(self, trainer: pl.Trainer, dataset: Dataset, net, pl_module) -> bool:
        """Whether every training sample of this rank's shard has ``y·N(x) > 0``."""
        shard = self._shard(trainer, len(dataset))
        generator = torch.Generator().manual_seed(self.seed + self._current_epoch(trainer))
        probe = [shard[i] for i in torch.randperm(len(shard), generator=generator)[: self.probe_size].tolist()]
        for indices in (self._hard, probe):
            wrong = self._errors(dataset, indices, net, pl_module) if indices else []
            if wrong:
                self._hard = wrong
                return False
        self._kept, passed = [], []
        wrong = self._errors(dataset, shard, net, pl_module, keep=self._kept if trainer.world_size == 1 else None,
                             margins=passed)
        if wrong:
            self._hard, self._kept = wrong, []
            return False
        margins, labels = (torch.cat(parts) for parts in zip(*passed)) if passed else (torch.zeros(0),) * 2
        self._label_range = (labels.min().item(), labels.max().item()) if len(labels) else (None, None)
        # the module against its head on the samples nearest the boundary, where a difference flips a sign
        nearest = [shard[i] for i in torch.argsort(margins)[:HEAD_CHECK_SAMPLES].tolist()]
        if nearest:  # the whole network's function is the module's: no mismatch there
            self._mismatch = self._scope.output_mismatch(
                pl_module, _gather(dataset, nearest)[0], f"the {len(nearest)} training samples nearest its decision "
                f"boundary at epoch {self._current_epoch(trainer)}", nearest, float(margins.abs().max()),
                warn=self._warn_once)
        return True

    def _errors(self, dataset: Dataset, indices: list[int], net, pl_module, stop_early: bool = True,
                keep: list | None = None, margins: list | None = None) -> list[int]:
        """Indices whose ``y·N(x) > 0`` fails (NaN counts as failing); ``keep`` collects the embedded batches,
        ``margins`` each batch's margins and labels."""
        wrong, device = [], _analysis_device(pl_module)
        on_device = net.to(device)
        for start in range(0, len(indices), self.batch_size):
            chunk = indices[start:start + self.batch_size]
            x, y = _gather(dataset, chunk)
            embedded = self._scope.embed(module_inputs(pl_module, x)).to(device)
            outputs, gates = self._scope.outputs(on_device, embedded, keep_gates=keep is not None)
            outputs = outputs.cpu()
            if keep is not None:
                keep.append((embedded, y, gates))
            try:
                margin = self._margins(outputs, y)
            except ValueError as err:  # labels are checked in the first training batch only, by the callback
                raise ValueError(f"NetworkSupportVectors: training samples {chunk[0]}..{chunk[-1]} (of the "
                                 f"callback's pass in the dataset's order): {err}") from None
            if margins is not None:
                margins.append((margin, self._labels(y)))
            bad = ~(margin > 0)
            if not torch.isfinite(outputs).all():
                self._explain_non_finite(x, outputs, chunk, pl_module)
            wrong += [chunk[i] for i in torch.nonzero(bad).flatten().tolist()]
            if wrong and stop_early:
                break
        return wrong

    def _explain_non_finite(self, x: Tensor, outputs: Tensor, chunk: list[int], pl_module) -> None:
        row = _first_non_finite_row(outputs)
        parameter = _first_non_finite_parameter(pl_module)
        if parameter is not None:
            self._warn_diverged(parameter)
            return
        if not torch.isfinite(x[row]).all():
            cause = (f"training sample {chunk[row]} holds NaN/inf inputs; clean the data (drop or repair that "
                     "sample) — it counts as misclassified, so zero training error cannot be reached")
        else:
            cause = (f"the network's output is {outputs[row].tolist()} on training sample {chunk[row]} although its "
                     f"inputs and weights are finite: the trunk or head overflowed ({_DIVERGED})")
        self._diverged = True
        self._warn_once(f"NetworkSupportVectors: {cause}")

    def _warn_diverged(self, parameter: str, dataset: Dataset | None = None) -> None:
        self._diverged = True
        sample = _first_non_finite_sample(dataset)
        data = "" if sample is None else f" Training sample {sample} holds NaN/inf inputs: clean the data first."
        self._warn_once(f"NetworkSupportVectors: {parameter}: {_DIVERGED}.{data} Zero training error cannot hold, so "
                        "no analysis runs and no file is written.")

    def _count_errors(self, trainer: pl.Trainer, dataset: Dataset, pl_module) -> int:
        """Misclassified training samples, each rank counting its shard, summed over the ranks."""
        with eval_mode(pl_module), torch.no_grad():
            wrong = self._errors(dataset, self._shard(trainer, len(dataset)), self._scope.freeze(), pl_module,
                                 stop_early=False)
        return _sum_over_ranks(len(wrong))

    def _duplicates_said(self, dataset: Dataset) -> str | None:
        """Training samples with the same input and different labels, named, when there are any (no classifier
        separates them, whatever the training)."""
        n, size = len(dataset), self.batch_size
        batches = ((x, self._labels(y)) for x, y in
                   (_gather(dataset, list(range(i, min(i + size, n)))) for i in range(0, n, size)))
        pairs = conflicting_duplicates(batches)
        if not pairs:
            return None
        named = ", ".join(f"{i} and {j}" for i, j in pairs)
        return (f"Training samples {named}{' (and more)' if len(pairs) == 5 else ''} have the same input and different "
                "labels: no classifier separates them, so zero training error cannot be reached however long the "
                "network trains. Remove or relabel the duplicates.")

    def _usable_validation(self, x_val: Tensor, y_val: Tensor, shape: tuple[int, ...]) -> bool:
        """Whether the validation samples can be compared (before the analysis, which would otherwise fail at its end);
        else a warning names the problem and the analysis runs without them."""
        problem = None
        if tuple(x_val.shape[1:]) != tuple(shape):
            problem = (f"embed to {x_val.shape[1]} features, the training samples to {shape[0]}" if len(shape) == 1
                       else f"have inputs of shape {tuple(x_val.shape[1:])}, the training samples {tuple(shape)}")
        elif (row := _first_non_finite_row(x_val)) is not None:
            problem = f"hold NaN/inf inputs (validation sample {row})"
        else:
            try:
                self._labels(y_val)
            except ValueError as err:
                problem = f"have labels the head cannot read ({err})"
        if problem is None:
            return True
        self._warn_once(f"NetworkSupportVectors: the validation samples {problem}, so the analysis runs without "
                        "them (no `nsv/val_*` metrics); fix the validation data or leave out the validation loader.")
        return False
