"""What an analysis refuses before it starts, with the fix in the message: empty or non-finite inputs, weights or
outputs, a network that misclassifies a training sample, conflicting duplicates, arrays that do not fit in memory."""
from __future__ import annotations

import hashlib
from typing import Any, Iterable

import numpy as np
import torch
from torch import Tensor

from lightning_nsv.errors import NonFiniteError
from lightning_nsv.kernel.network import PathNetwork
from lightning_nsv.memory import check_memory

__all__ = ["check_analysis_memory", "check_finite_network", "check_finite_samples",
           "check_finite_weights", "check_samples", "check_two_classes", "class_name",
           "conflicting_duplicates", "misclassified_message", "one_class_message"]


def check_samples(x_train: Tensor, x_val: Tensor | None = None, y_val=None) -> None:
    """Refuse an empty training set, an empty validation set passed instead of ``None``, validation labels without
    validation inputs or of another length, and validation inputs that are not finite."""
    if not len(x_train):
        raise ValueError("x_train holds no samples: the analysis needs the training set the network reached zero "
                         "training error on")
    if x_val is None:
        if y_val is not None:
            raise ValueError("y_val without x_val: pass the validation inputs too")
        return
    if not len(x_val):
        raise ValueError("x_val holds no samples: pass x_val=None (and y_val=None) to analyse without validation")
    if y_val is not None and len(y_val) != len(x_val):
        raise ValueError(f"x_val has {len(x_val)} samples and y_val {len(y_val)}")
    if x_val.is_floating_point():
        check_finite_samples(x_val.reshape(len(x_val), -1), "validation inputs")


def class_name(label: Any, num_outputs: int) -> str:
    """A label as a reader names it: ``class 2`` (K outputs), ``positive (1)`` or ``negative (0 or -1)`` (one)."""
    return f"class {int(label)}" if num_outputs > 1 else ("positive (1)" if label > 0 else "negative (0 or -1)")


def one_class_message(label: Any, num_outputs: int) -> str:
    """Why a training set of one class (``label``) is not analysed: what zero error and the max margin then mean."""
    return (f"every training label is {class_name(label, num_outputs)}: with one class, zero training error only asks "
            "the network to give every sample that class, and the max-margin classifier through the origin of one "
            "class has no second class to separate it from (its margin and support vectors describe no decision "
            "boundary)")


def check_two_classes(y: Tensor | np.ndarray, num_outputs: int) -> None:
    """Refuse training labels (±1 for one output, class indices for ``num_outputs`` ≥ 2) of one class, ``m = 1``
    included, as :class:`~lightning_nsv.callbacks.NetworkSupportVectors` does."""
    values = np.unique(y.detach().cpu().numpy() if isinstance(y, Tensor) else np.asarray(y))
    if len(values) > 1:
        return
    m = len(y)
    sample = "x_train holds one sample (m = 1), so " if m == 1 else ""
    raise ValueError(f"{sample}{one_class_message(values[0], num_outputs)}; the support-vector analysis needs "
                     "training samples of at least two classes (check the labels, the split or the filtering)")


def check_finite_network(net: PathNetwork) -> None:
    """Refuse weights or biases that hold NaN or inf, naming the first such tensor."""
    for name, tensors in (("weights", net.weights), ("biases", net.biases or ())):
        for k, t in enumerate(tensors):
            check_finite_weights(t, f"{name}[{k}]")


def check_finite_weights(t: Tensor, label: str) -> None:
    """Refuse a weight tensor ``t`` (named ``label`` in the message) that holds NaN or inf: a diverged network."""
    if not bool(torch.isfinite(t).all()):
        kind = "NaN" if bool(torch.isnan(t).any()) else "inf"
        raise NonFiniteError(f"{label} holds {kind}: the network has diverged (lower the learning rate or clip "
                             "gradients); no support-vector analysis of non-finite weights")


def check_finite_samples(values: Tensor, what: str) -> None:
    """Refuse rows of ``values`` (2-d: one per sample) that hold NaN or inf, naming the first and the count."""
    if values.numel() and bool(torch.isfinite(values.sum()).item()):
        return  # a finite sum has no NaN or inf among its terms (one pass; overflow falls through to the full check)
    finite = torch.isfinite(values).all(1)
    if not bool(finite.all()):
        first = int(torch.nonzero(~finite)[0, 0])
        cause = ("the data hold NaN or inf" if what.endswith("inputs")
                 else "the network overflows on it (has it diverged?) or the data hold NaN or inf")
        raise NonFiniteError(f"{what} are not finite at sample {first} ({int((~finite).sum())} samples in all): "
                             f"{cause}")


def misclassified_message(x: Tensor, y: Tensor, outputs: Tensor, errors: int) -> str:
    """Why a binary analysis refuses a network with ``errors`` training errors, naming duplicates that conflict."""
    on_boundary = int((outputs == 0).sum())
    message = (f"the network misclassifies {errors} of {len(y)} training samples ({on_boundary} of them with "
               "N(x) = 0, e.g. all units of a layer inactive): the support-vector analysis needs y·N(x) > 0 on "
               "every training sample (Assumption 1)")
    pairs = conflicting_duplicates([(x, y)], limit=1)
    if pairs:
        i, j = pairs[0]
        return (f"samples {i} and {j} have the same input and opposite labels: no classifier separates "
                f"them, the data are not separable (remove or relabel the duplicates); {message}")
    return message


def conflicting_duplicates(batches: Iterable[tuple[Tensor, Tensor]], limit: int = 5) -> list[tuple[int, int]]:
    """The first ``limit`` pairs ``(i, j)``, ``i < j``, of samples with the same input and different labels, numbered
    in the order of ``batches`` (``(inputs, labels)``). Cost: one pass, each input row hashed once (16 bytes kept
    per distinct row)."""
    first: dict[bytes, tuple[int, float]] = {}
    pairs: list[tuple[int, int]] = []
    start = 0
    for x, y in batches:
        rows = (x.detach().reshape(len(x), -1).cpu() + 0.0).contiguous().numpy()  # + 0.0: -0.0 is 0.0
        for i, (row, label) in enumerate(zip(rows, y.reshape(-1).tolist()), start=start):
            seen = first.setdefault(hashlib.blake2b(row.tobytes(), digest_size=16).digest(), (i, label))
            if seen[1] != label and len(pairs) < limit:
                pairs.append((seen[0], i))
        start += len(rows)
    return pairs


def check_dense_fits(nbytes: int, m: int, limit: int | None, intercept: bool,
                      device: torch.device = torch.device("cpu")) -> None:
    """Refuse a dense ``m×m`` kernel of ``nbytes`` above ``limit`` or the memory available."""
    fix = ("use kernel='columns' (the problem through the origin)" if not intercept
           else "the intercept protocol needs the dense kernel; use intercept=False with kernel='columns'")
    check_memory(nbytes, f"the dense kernel needs {nbytes / 1e9:.1f} GB for m={m:,}", fix, device, limit=limit,
                 limit_name="max_dense_bytes")


def check_analysis_memory(net: PathNetwork, m: int, n_val: int = 0, columns: int = 0,
                          device: torch.device = torch.device("cpu")) -> None:
    """Refuse an analysis whose per-sample arrays do not fit, before any of them is allocated: the activation slopes
    of all ``m`` training and ``n_val`` validation samples (one float per hidden unit, plus the widest layer's
    pre-activations during the forward pass), their 0/1 patterns (float32) and a first block of ``columns`` kernel
    columns (``m`` floats each)."""
    units, widest = sum(net.hidden_widths), max(net.hidden_widths, default=0)
    item = torch.finfo(net.dtype).bits // 8
    slopes = (m + n_val) * units * item
    transient = 2 * max(m, n_val) * widest * item
    patterns = m * units * 4
    block = m * columns * item
    total = slopes + transient + patterns + block
    what = (f"the support-vector analysis needs about {total / 1e9:.1f} GB for m={m:,} training"
            + (f" and {n_val:,} validation" if n_val else "") + f" samples: the activation slopes of every sample "
            f"({units:,} hidden units, {slopes / 1e9:.1f} GB, and {transient / 1e9:.1f} GB during the forward pass), "
            f"their activation patterns ({patterns / 1e9:.1f} GB)"
            + (f" and a first block of {columns:,} kernel columns ({block / 1e9:.1f} GB)" if columns else ""))
    check_memory(total, what, "analyse fewer samples (a data module with a smaller `m`, fewer validation samples) "
                 "or a narrower network", device)
