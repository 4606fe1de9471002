"""The checks of :class:`~lightning_nsv.callbacks.NetworkSupportVectors`: its arguments, the zero-error pass (labels,
margins, non-finite values named), the module's output against its head (TF32 allowed for), duplicates with different
labels, and whether an analysis is trustworthy (one class, a head that is not the output)."""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset
from torchmetrics.aggregation import SumMetric

from lightning_nsv.compat import rank_zero_warn
from lightning_nsv.analysis.multiclass import METHODS as MULTICLASS_METHODS
from lightning_nsv.solver.options import SolverOptions
from lightning_nsv.scope import AnalysisOptions, Scope, ScopeRequest, check_request
from lightning_nsv.validate import (check_choice, check_dotted_name, check_flag, check_integer, check_path,
                                    check_probability, check_real_type, check_shape, check_time_budget)


def check_arguments(*, every_n_epochs: Any, probe_size: Any, stop_on_zero_error: Any, intercept: Any, C: Any,
                     delta: Any, kernel: Any, max_dense_bytes: Any, path_module: Any, embedding: Any, batch_size: Any,
                     save_dir: Any, max_images: Any, seed: Any, multiclass: Any, solver: Any,
                     scope: Any = "auto", image_shape: Any = None, time_budget: Any = None) -> None:
    """Refuse the callback's arguments of the wrong type or out of range, naming the argument and a valid value."""
    for name, value, low in (("every_n_epochs", every_n_epochs, 1), ("batch_size", batch_size, 1),
                             ("max_dense_bytes", max_dense_bytes, 1), ("probe_size", probe_size, 0),
                             ("max_images", max_images, 0), ("seed", seed, None)):
        check_integer(name, value, low)
    for name, value in (("stop_on_zero_error", stop_on_zero_error), ("intercept", intercept)):
        check_flag(name, value, "; a string such as 'false' would count as True")
    for name, value in (("C", C), ("delta", delta)):
        check_real_type(name, value)
    if not 0 < C < math.inf:
        raise ValueError(f"`C` must be positive and finite, got {C}; the intercept protocol's default is 1e7")
    check_probability("delta", delta, "; e.g. delta=0.05 for a 95% bound")
    for name, value in (("path_module", path_module), ("embedding", embedding)):
        check_dotted_name(name, value)
    check_path("save_dir", save_dir)
    check_shape("image_shape", image_shape)
    check_time_budget(time_budget)  # as whole_network_support_vectors checks it (inf: no limit, as None)
    SolverOptions(kernel=kernel, solver=solver)  # refuses an unknown kernel or solver, as the analysis would
    check_choice("multiclass", multiclass, MULTICLASS_METHODS, "'exact' solves the K-class problem, 'ovr' K "
                 "binary ones")
    check_request(ScopeRequest(scope, path_module, embedding), AnalysisOptions(intercept=intercept,
                                                                                multiclass=multiclass))


def check_head_fits_classes(path: Scope, datamodule) -> None:
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


DIVERGED = ("the network has diverged (lower the learning rate, clip gradients or check the loss), or the data hold "
             "NaN/inf")


def sum_over_ranks(count: int) -> int:
    """A count summed over the DDP ranks (each checks its shard), through torchmetrics' synchronised sum."""
    total = SumMetric()
    total.update(float(count))
    return int(total.compute())


def first_non_finite_parameter(module: torch.nn.Module) -> str | None:
    for name, parameter in module.named_parameters():
        finite = torch.isfinite(parameter)
        if not finite.all():
            kind = "NaN" if torch.isnan(parameter).any() else "inf"
            return f"parameter {name} holds {kind} ({int((~finite).sum())} of {parameter.numel()} entries)"
    return None


def first_non_finite_sample(dataset: Dataset | None) -> int | None:
    """Index of the first training sample with NaN/inf inputs, for in-memory (TensorDataset-like) data."""
    tensors = getattr(dataset, "tensors", None)
    if not tensors or not tensors[0].is_floating_point():
        return None
    return first_non_finite_row(tensors[0])


def first_non_finite_row(values: Tensor) -> int | None:
    """Index of the first sample (row) of ``values`` with a NaN/inf entry."""
    bad = (~torch.isfinite(values.reshape(len(values), -1))).any(1).nonzero()
    return int(bad[0]) if len(bad) else None


class WarnOnce:
    """A rank-zero warning said once per message (the callback's warnings, over its analyses)."""

    def __init__(self) -> None:
        self.said: set[str] = set()

    def __call__(self, message: str) -> None:
        if message not in self.said:
            self.said.add(message)
            rank_zero_warn(message)
