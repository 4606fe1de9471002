"""Epoch aggregates of a stage (train, val or test) through torchmetrics, at the cost of a list append per step."""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch import Tensor, nn
from torchmetrics import MeanMetric, Metric
from torchmetrics.classification import BinaryAccuracy, MulticlassAccuracy
from torchmetrics.utilities import dim_zero_cat

__all__ = ["EpochMetric", "StageMetrics", "check_labels", "check_outputs"]


class EpochMetric(Metric):
    """``metric`` computed once on all the inputs of an epoch.

    :meth:`update` only keeps its inputs in list states; :meth:`compute` concatenates them over the batches
    and, in distributed runs, over the ranks (``dist_reduce_fx="cat"``), and gives them to ``metric`` in one
    update. The value is the torchmetrics value of the whole epoch. Memory: every input of the epoch (for
    accuracy, two integers per sample).

    The per-step path is :meth:`append`: a plain list append (about 1 µs, against about 15 µs for a call of a
    torchmetrics ``update``, whose wrapper sets attributes through ``nn.Module.__setattr__``). The appended
    inputs are concatenated and handed to :meth:`update` in one call when the metric is next computed or
    synced (and dropped by :meth:`reset`), so they reach the list states before any gathering across ranks and
    the value is the one of per-step updates.

    Args:
        metric: The metric to compute, built with ``sync_on_compute=False`` (it sees gathered inputs).
        num_inputs: Positional arguments of ``metric.update``.
    """

    full_state_update = False

    def __init__(self, metric: Metric, num_inputs: int = 2) -> None:
        super().__init__()
        if metric.sync_on_compute:
            raise ValueError(
                f"the wrapped {type(metric).__name__} must be built with sync_on_compute=False: EpochMetric gathers "
                "its inputs across ranks itself"
            )
        self.metric, self.num_inputs = metric, num_inputs
        self._pending: list[tuple[Tensor | float, ...]] = []
        for i in range(num_inputs):
            self.add_state(f"input_{i}", default=[], dist_reduce_fx="cat")

    def update(self, *inputs: Tensor) -> None:
        for i, value in enumerate(inputs):
            getattr(self, f"input_{i}").append(value)

    def append(self, *inputs: Tensor | float) -> None:
        """Record one step's inputs (tensors, or Python numbers for one value each) without a torchmetrics
        update; they count from the next :meth:`compute` or :meth:`sync` on, as if passed to :meth:`update`."""
        self._pending.append(inputs)

    def _flush(self) -> None:
        pending = self._pending
        if not pending:
            return
        columns = list(zip(*pending))
        pending.clear()
        tensors = [c for c in columns[0] if isinstance(c, Tensor)]
        like = tensors[0] if tensors else torch.empty(0, device=self.device)
        self.update(*(_concatenate(column, like) for column in columns))

    def _wrap_compute(self, compute: Callable) -> Callable:
        wrapped = super()._wrap_compute(compute)

        @functools.wraps(wrapped)
        def flushed(*args: Any, **kwargs: Any) -> Any:
            self._flush()
            return wrapped(*args, **kwargs)

        return flushed

    def sync(self, *args: Any, **kwargs: Any) -> None:
        self._flush()
        super().sync(*args, **kwargs)

    def reset(self) -> None:
        self._pending.clear()
        super().reset()

    def compute(self) -> Tensor:
        inputs = [getattr(self, f"input_{i}") for i in range(self.num_inputs)]
        if isinstance(inputs[0], list) and not inputs[0]:
            return torch.tensor(float("nan"), device=self.device)
        self.metric.reset()
        self.metric.update(*(dim_zero_cat(value) for value in inputs))
        return self.metric.compute()


def _concatenate(column: tuple[Tensor | float, ...], like: Tensor) -> Tensor:
    """One tensor from the values of one input over the appended steps; numbers take ``like``'s dtype."""
    if isinstance(column[0], Tensor):
        return torch.cat([value.reshape(-1) if value.dim() == 0 else value for value in column])
    return torch.tensor(column, dtype=like.dtype if like.is_floating_point() else torch.get_default_dtype(),
                        device=like.device)


class StageMetrics(nn.Module):
    """Mean loss, accuracy and error (``1 - accuracy``) of one stage over an epoch.

    :attr:`loss` is a ``MeanMetric`` weighted by batch size, :attr:`accuracy` a ``BinaryAccuracy`` (one logit,
    predicted class ``logit >= 0``) or a ``MulticlassAccuracy(average="micro")`` (K >= 2 outputs, argmax), each
    inside an :class:`EpochMetric`; :attr:`error` is torchmetrics' ``1 - accuracy``. Log them as metric objects
    (``self.log(name, stage_metrics.error)``): they are gathered across ranks when computed, at the end of the
    epoch, and Lightning resets them after. One record per batch: an optimizer that evaluates its closure
    several times per batch (L-BFGS) contributes the first evaluation, before its step.

    Args:
        num_outputs: 1 for a binary logit, K >= 2 for K classes.
    """

    def __init__(self, num_outputs: int) -> None:
        super().__init__()
        self.num_outputs = num_outputs
        accuracy = (BinaryAccuracy(validate_args=False, sync_on_compute=False) if num_outputs == 1 else
                    MulticlassAccuracy(num_outputs, average="micro", validate_args=False, sync_on_compute=False))
        # not nan_strategy="disable": torchmetrics 1.9 then drops the weights
        self.loss = EpochMetric(MeanMetric(sync_on_compute=False))
        self.accuracy = EpochMetric(accuracy)
        self.error: Metric = 1 - self.accuracy
        self._last_batch: int | None = None

    def predict(self, logits: Tensor) -> Tensor:
        """Predicted classes: ``logit >= 0`` (sign(0) = +1) for one output, the argmax for K."""
        return (logits >= 0).long() if self.num_outputs == 1 else logits.argmax(-1)

    def record(self, batch_idx: int, loss: Tensor, logits: Tensor, target: Tensor) -> None:
        if batch_idx == self._last_batch:
            return
        object.__setattr__(self, "_last_batch", batch_idx)  # a plain int: skip nn.Module's slower __setattr__
        self.loss.append(loss.detach(), len(target))
        self.accuracy.append(self.predict(logits.detach()), target.detach().long())

    def new_epoch(self) -> None:
        object.__setattr__(self, "_last_batch", None)


def check_labels(y: Tensor, num_outputs: int, owner: str, stage: str, batch_idx: int = 0) -> None:
    """Raise ``ValueError`` unless ``y`` holds integer class labels, one per sample, for ``num_outputs`` outputs: 0/1
    for one logit, ``0..K-1`` for K >= 2 outputs. Cheap enough for every batch: one min/max of the labels."""
    where = f"{stage} batch {batch_idx}"
    if y.is_floating_point() or y.is_complex():
        raise ValueError(
            f"{owner} needs integer class labels, got {y.dtype} labels in {where}; convert them "
            "with `y.long()` (hard labels only: the analyses read classes, not probabilities)"
        )
    if y.dim() != 1:
        raise ValueError(
            f"{owner} needs one class label per sample, a tensor of shape (n,), got labels of shape {tuple(y.shape)} "
            f"in {where}; give class indices (`y.argmax(1)` of one-hot labels, `y.reshape(-1)` of (n, 1))"
        )
    if y.numel() == 0 or y.dtype == torch.bool:
        return
    k = 2 if num_outputs == 1 else num_outputs
    low, high = (int(v) for v in torch.aminmax(y))
    if 0 <= low and high < k:
        return
    values = y.unique().tolist()
    if num_outputs == 1 and set(values) <= {-1, 1}:
        raise ValueError(
            f"{owner} trains one logit on labels 0/1, got labels -1/+1 in {where} (the logistic "
            "loss with target -1 is not the loss of -1/+1 labels); map them with `(y + 1) // 2` (-1 -> 0, +1 -> 1)"
        )
    if num_outputs == 1:
        raise ValueError(
            f"{owner} trains one logit on labels 0/1 (num_classes=1), got labels {values[:10]} in {where}; for K "
            "classes use K outputs (LeakyReLUMLP/ConvFCNet(num_classes=K), SkipNetwork)"
        )
    bad = low if low < 0 else high
    raise ValueError(
        f"{owner} has {k} outputs (num_classes={k}), so labels must be in 0..{k - 1}, got label {bad} (labels in "
        f"{low}..{high}) in {where}; set num_classes to the number of classes or relabel to 0..{k - 1}"
    )


def check_outputs(logits: Tensor, num_outputs: int, owner: str, samples: int) -> None:
    """Raise ``ValueError`` unless ``logits`` has the shape ``num_outputs`` declares: ``(n,)`` for one logit,
    ``(n, K)`` for K classes (a head replaced after construction, a ``num_classes`` that does not fit it)."""
    expected = (samples,) if num_outputs == 1 else (samples, num_outputs)
    if tuple(logits.shape) == expected:
        return
    head = logits.shape[-1] if logits.dim() > 1 else 1
    raise ValueError(
        f"{owner} declares num_classes={num_outputs} (outputs of shape {expected} for a batch of {samples}), but its "
        f"network gives outputs of shape {tuple(logits.shape)}; build it with num_classes={head} (1: one logit for "
        f"two classes, K >= 2: one score per class) or give its last Linear layer {num_outputs} outputs"
    )
