"""Checks of the whole-network support-vector analysis (:mod:`lightning_nsv.analysis.whole_network`): arguments,
finite weights and inputs, input shapes that the module takes, and zero training error (Assumption 1) with a
message that says why it fails."""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from torch import Tensor, nn

from lightning_nsv.errors import NonFiniteError, check_has_data
from lightning_nsv.analysis.checks import check_finite_samples as _check_finite_samples, check_samples, \
    check_two_classes
from lightning_nsv.models.layers import eval_mode
from lightning_nsv.solver.multiclass import pair_margins
from lightning_nsv.solver.options import SOLVERS
from lightning_nsv.solver.result import NotSeparableError
from lightning_nsv.validate import check_choice, check_probability

__all__ = ["check_arguments", "check_input_shape", "check_scope_name", "check_zero_error"]


def _check_finite_module(module: nn.Module) -> None:
    check_has_data([*module.named_parameters(), *module.named_buffers()], f"the module ({type(module).__name__})")
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


def _first_layer_input(module: nn.Module) -> tuple[str, Callable[[Tensor], bool]] | None:
    """What the first layer of an ``nn.Sequential`` (a Linear or a convolution) takes per sample, as text, and a
    test of a batch of inputs against it; ``None`` for other modules."""
    first = module
    while isinstance(first, nn.Sequential) and len(first):
        first = first[0]
    if first is module:
        return None
    name = f"the module's first layer ({type(first).__name__}) takes"
    if isinstance(first, nn.Linear) and first.in_features:
        return f"{name} (..., {first.in_features})", lambda x: x.shape[-1] == first.in_features
    if isinstance(first, (nn.Conv1d, nn.Conv2d, nn.Conv3d)) and first.in_channels:
        spatial = ("L",) if isinstance(first, nn.Conv1d) else ("D", "H", "W")[-len(first.kernel_size):]
        return (f"{name} ({first.in_channels}, {', '.join(spatial)})",
                lambda x: x.dim() == 2 + len(spatial) and x.shape[1] == first.in_channels)
    return None


def check_input_shape(module: nn.Module, x_train: Tensor, x_val: Tensor | None = None) -> None:
    """Refuse, before any tracing, training inputs the module does not take (against the first layer of an
    ``nn.Sequential``, then by one forward of two samples in eval mode) and validation inputs of another
    per-sample shape."""
    shape = tuple(x_train.shape)

    def refuse(why: str) -> ValueError:
        return ValueError(f"x_train of shape {shape}: {why}; pass the inputs in the module's input shape, "
                          "(n, *input_shape) (images stay (n, C, H, W))")

    if x_train.dim() < 2:
        raise refuse("the inputs need a batch axis and a per-sample shape")
    first = _first_layer_input(module)
    if first is not None and not first[1](x_train):
        raise refuse(f"inputs of shape {shape[1:]} per sample, but {first[0]}")
    param = next(iter(module.parameters()), x_train)
    sample = x_train[:2].to(param.device, param.dtype if param.is_floating_point() else torch.float32)
    try:
        with eval_mode(module), torch.no_grad():
            out = module(sample)
    except Exception as err:
        raise refuse(f"{type(module).__name__} does not run on inputs of shape {shape[1:]} per sample "
                     f"({type(err).__name__}: {(str(err).splitlines() or [''])[0]})") from err
    if isinstance(out, Tensor) and (out.dim() == 0 or len(out) != len(sample)):
        raise refuse(f"{type(module).__name__} returns shape {tuple(out.shape)} for {len(sample)} samples of shape "
                     f"{shape[1:]}, not one output per sample")
    if x_val is not None and tuple(x_val.shape[1:]) != shape[1:]:
        raise ValueError(f"x_val of shape {tuple(x_val.shape)}: inputs of shape {tuple(x_val.shape[1:])} per sample, "
                         f"x_train's are {shape[1:]}")


def check_scope_name(scope_name: object) -> None:
    """Refuse a ``scope_name`` that is no non-empty string (``None`` gave "path kernel of the None: …")."""
    if not isinstance(scope_name, str) or not scope_name.strip():
        raise ValueError("`scope_name` must be a non-empty string that says what the module is, for the report's "
                         "first line \"path kernel of the <scope_name>: …\" (e.g. \"whole network\", the default, "
                         f"or \"layers after the trunk `features`\"), got {scope_name!r}")


def check_arguments(module, x_train, y_train, x_val, y_val, solver: str, delta: float) -> None:
    check_choice("solver", solver, SOLVERS)
    check_probability("delta", delta)
    check_samples(x_train, x_val, y_val)
    m = len(x_train)
    if len(y_train) != m:
        raise ValueError(f"x_train has {m} samples and y_train {len(y_train)}")
    _check_finite_module(module)
    check_has_data([("x_train", x_train)] + ([] if x_val is None else [("x_val", x_val)]), "the data",
                   "pass the inputs themselves, on the CPU or a GPU")
    _check_finite_samples(x_train.reshape(m, -1), "training inputs")
    check_input_shape(module, x_train, x_val)


def check_zero_error(x: Tensor, y: Tensor, outputs: Tensor, binary: bool) -> np.ndarray:
    """Margins of the network (binary: ``y·N``, ``(m,)``; K-class: :func:`~lightning_nsv.solver.pair_margins`);
    refuses a training set of one class (``m = 1`` included), and unless every margin is positive (Assumption 1)."""
    check_two_classes(y, 1 if binary else outputs.shape[1])
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
