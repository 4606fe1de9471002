"""Checks of the whole-network support-vector analysis (:mod:`lightning_nsv.analysis.whole_network`): arguments,
finite weights and inputs, and zero training error (Assumption 1) with a message that says why it fails."""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from lightning_nsv.errors import NonFiniteError
from lightning_nsv.max_margin import NotSeparableError
from lightning_nsv.multiclass import pair_margins
from lightning_nsv.support_vectors import SOLVERS, _check_finite_samples, check_samples

__all__ = ["check_arguments", "check_zero_error"]


def _check_finite_module(module: nn.Module) -> None:
    for kind, named in (("parameter", module.named_parameters()), ("buffer", module.named_buffers())):
        for name, t in named:
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                what = "NaN" if bool(torch.isnan(t).any()) else "inf"
                raise NonFiniteError(f"{kind} {name} holds {what}: the network has diverged (lower the learning rate "
                                     "or clip gradients); no support-vector analysis of non-finite weights")


def _not_separable(x: Tensor, labels: Tensor, wrong: Tensor, on_boundary: Tensor, requirement: str) -> str:
    """Why Assumption 1 fails: the count, the first indices, and a pair of equal inputs with different labels."""
    first = torch.nonzero(wrong).reshape(-1)[:10].tolist()
    message = (f"the network misclassifies {int(wrong.sum())} of {len(labels)} training samples (first: "
               f"{', '.join(map(str, first))}{', …' if int(wrong.sum()) > len(first) else ''}; "
               f"{int((wrong & on_boundary).sum())} of them on the boundary, e.g. all units of a layer inactive): the "
               f"support-vector analysis needs {requirement} on every training sample (Assumption 1); a tie counts as "
               "an error")
    _, inverse = torch.unique(x.reshape(len(x), -1).cpu(), dim=0, return_inverse=True)
    seen: dict[int, tuple[int, float]] = {}
    for i, (group, label) in enumerate(zip(inverse.tolist(), labels.tolist())):
        other = seen.setdefault(group, (i, label))
        if other[1] != label:
            return (f"samples {other[0]} and {i} have the same input and different labels: no classifier separates "
                    f"them, the data are not separable (remove or relabel the duplicates); {message}")
    return message


def check_arguments(module, x_train, y_train, x_val, y_val, solver: str, delta: float) -> None:
    if solver not in SOLVERS:
        raise ValueError(f"`solver` can be {', '.join(SOLVERS)}, got {solver!r}")
    if not 0 < delta < 1:
        raise ValueError(f"`delta` must be in (0, 1), got {delta}")
    check_samples(x_train, x_val)
    if y_val is not None and x_val is None:
        raise ValueError("y_val without x_val: pass the validation inputs too")
    m = len(x_train)
    if len(y_train) != m:
        raise ValueError(f"x_train has {m} samples and y_train {len(y_train)}")
    _check_finite_module(module)
    _check_finite_samples(x_train.reshape(m, -1), "training inputs")
    if x_val is not None:
        _check_finite_samples(x_val.reshape(len(x_val), -1), "validation inputs")
        if y_val is not None and len(y_val) != len(x_val):
            raise ValueError(f"x_val has {len(x_val)} samples and y_val {len(y_val)}")


def check_zero_error(x: Tensor, y: Tensor, outputs: Tensor, binary: bool) -> np.ndarray:
    """Margins of the network (binary: ``y·N``, ``(m,)``; K-class: :func:`~lightning_nsv.multiclass.pair_margins`);
    refuses unless every one is positive (Assumption 1)."""
    if binary:
        margins = (y * outputs[:, 0]).numpy()
        wrong, boundary, requirement = margins <= 0, margins == 0, "y·N(x) > 0"
    else:
        margins = pair_margins(outputs, y.numpy())
        wrong, boundary = margins.min(1) <= 0, margins.min(1) == 0
        requirement = "N_y(x) − N_k(x) > 0 for every k ≠ y"
    if wrong.any():
        raise NotSeparableError(_not_separable(x, y, torch.from_numpy(wrong), torch.from_numpy(boundary), requirement))
    return margins
