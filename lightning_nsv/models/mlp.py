"""Leaky-ReLU-family MLP: binary (one logit, the logistic loss) or K-class (K scores, cross-entropy)."""
from __future__ import annotations

from typing import Any, Literal, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_nsv.compat import pl
from lightning_nsv.models.layers import PlainHookAttributes, mlp_sequential
from lightning_nsv.models.metrics import StageMetrics, check_labels, check_outputs
from lightning_nsv.validate import check_choice

OPTIMIZERS = ("sgd", "adam")
STAGES = ("train", "val", "test")


class LeakyReLUMLP(PlainHookAttributes, pl.LightningModule):
    """``f → Ω_1 → … → Ω_d → 1`` (or ``→ K``) with ``rho(z) = gamma·z (z >= 0), beta·z (z < 0)``.

    The network is ``self.net``, an ``nn.Sequential(Flatten, Linear, act, …, Linear)``: the path part that
    :class:`~lightning_nsv.callbacks.NetworkSupportVectors` reads. Labels are integers 0/1 (checked in
    every batch, one min/max; ±1 labels are refused with the mapping to use); the loss is the logistic
    loss ``log(1 + exp(−y·N(x)))`` with ``y = ±1``, i.e. binary cross-entropy on the logit.

    The optimizer is set by this module's own arguments (``optimizer``, ``lr``, ``momentum``,
    ``weight_decay``), on the command line ``--model.optimizer adam --model.lr 0.01``. LightningCLI's own
    ``--optimizer``/``--lr_scheduler`` options, when given, replace :meth:`configure_optimizers` and these
    arguments are then ignored.

    Args:
        in_features: Input size ``f`` (images are flattened; digits: 64, MNIST: 784).
        widths: Hidden widths ``Ω_1, …, Ω_d``.
        beta: Slope of the activation for negative inputs (ReLU: 0, Leaky-ReLU: 0.01 or 0.1, absolute value: -1).
        gamma: Slope of the activation for non-negative inputs (1 for ReLU and Leaky-ReLU).
        bias: Whether the Linear layers have biases.
        optimizer: ``"sgd"`` (with ``momentum``) or ``"adam"``.
        lr: Learning rate.
        momentum: SGD momentum (ignored by Adam).
        weight_decay: L2 penalty of the optimizer.
        num_classes: Outputs, as in ConvFCNet: 1 for the binary logit (labels 0/1, the logistic loss), K >= 2 for
            K class scores (labels 0..K-1, cross-entropy), read by the multi-class support-vector analysis.
        init_std: If given, weights are drawn from ``N(0, init_std²)`` and biases start at 0; otherwise
            PyTorch's default initialisation.
        manual_optimization: Opt-in: ``training_step`` runs forward, ``zero_grad``, backward and the optimizer
            step itself (Lightning's manual optimisation) instead of the Trainer's closure, about 0.1 ms less
            per step; the weights are the automatic run's, bit for bit. Lightning then refuses
            ``gradient_clip_val`` and ``accumulate_grad_batches``, does not call ``on_before_zero_grad``, and
            counts ``global_step`` in another checkpointed counter (a run resumes only with the setting it was
            saved with); LR schedulers are refused.

    Raises:
        ValueError: On an unknown optimizer, a non-positive ``lr`` or ``init_std``; in any batch, on labels
            that are not integers 0/1 (0..K-1), and on outputs whose shape does not fit ``num_classes``; with ``manual_optimization``, at the start of
            training when LR schedulers are configured, and when resuming a checkpoint saved with the other
            setting.

    Logged metrics (epoch aggregates through torchmetrics, synced across ranks):
        ``train_loss``, ``train_error_running``: mean loss and error over the epoch's batches, each taken with
        the weights of its step, so ``train_error_running`` can stay above 0 in the epoch at whose end the
        frozen weights classify every training sample correctly (what
        :class:`~lightning_nsv.callbacks.NetworkSupportVectors` checks). ``val_loss``, ``val_error``,
        ``test_loss``, ``test_error``: exact for the weights at the end of the epoch.

    Example::

        >>> model = LeakyReLUMLP(in_features=64, widths=[16, 16], beta=0.1)
        >>> model(torch.zeros(5, 1, 8, 8)).shape
        torch.Size([5])
    """

    def __init__(
        self,
        in_features: int = 64,
        widths: Sequence[int] = (64, 64),
        beta: float = 0.1,
        gamma: float = 1.0,
        bias: bool = True,
        optimizer: Literal["sgd", "adam"] = "sgd",
        lr: float = 0.05,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        init_std: float | None = None,
        num_classes: int = 1,
        manual_optimization: bool = False,
    ) -> None:
        super().__init__()
        check_choice("optimizer", optimizer, OPTIMIZERS)
        if lr <= 0:
            raise ValueError(f"`lr` must be positive, got {lr}")
        if init_std is not None and init_std <= 0:
            raise ValueError(f"`init_std` must be positive or None, got {init_std}")
        if num_classes < 1:
            raise ValueError(f"`num_classes` must be a positive integer, got {num_classes}")
        # manual_optimization is saved only when set: subclasses without the argument (ConvFCNet) are rebuilt
        # from their hparams, and a checkpoint without it was saved under automatic optimisation
        self.save_hyperparameters(ignore=[] if manual_optimization else ["manual_optimization"])
        self.net = mlp_sequential(in_features, list(widths), num_classes, "leaky_relu", beta, gamma, bias)
        if init_std is not None:
            for layer in self.net:
                if isinstance(layer, torch.nn.Linear):
                    torch.nn.init.normal_(layer.weight, std=init_std)
                    if layer.bias is not None:
                        torch.nn.init.zeros_(layer.bias)
        self._build_metrics(num_classes)
        self.automatic_optimization = not manual_optimization

    def _build_metrics(self, num_outputs: int) -> None:
        self.num_outputs = num_outputs
        for stage in STAGES:  # train_metrics, val_metrics, test_metrics
            setattr(self, f"{stage}_metrics", StageMetrics(num_outputs))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x).squeeze(-1)

    def _loss(self, logits: Tensor, y: Tensor) -> Tensor:
        if self.num_outputs == 1:
            return F.binary_cross_entropy_with_logits(logits, y.to(logits.dtype))
        return F.cross_entropy(logits, y.long())

    def _step(self, batch: Any, batch_idx: int, stage: str) -> Tensor:
        x, y = batch[0], batch[1]
        metrics = getattr(self, f"{stage}_metrics")
        check_labels(y, self.num_outputs, type(self).__name__, {"train": "training"}.get(stage, stage), batch_idx)
        if batch_idx == 0:
            metrics.new_epoch()
            # metric objects, logged once per epoch: computed and reset by Lightning at the epoch's end
            error_key = "train_error_running" if stage == "train" else f"{stage}_error"
            self.log(f"{stage}_loss", metrics.loss, on_step=False, on_epoch=True, prog_bar=stage == "train")
            self.log(error_key, metrics.error, on_step=False, on_epoch=True, prog_bar=stage != "test")
        logits = self(x)
        check_outputs(logits, self.num_outputs, type(self).__name__, len(y))
        loss = self._loss(logits, y)
        metrics.record(batch_idx, loss, logits, y)
        return loss

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        if self.automatic_optimization:
            return self._step(batch, batch_idx, "train")
        # the automatic closure's order: forward, zero_grad, backward, step
        optimizer = self.optimizers()
        loss = self._step(batch, batch_idx, "train")
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return loss.detach()

    def on_train_start(self) -> None:
        if not self.automatic_optimization and self.trainer.lr_scheduler_configs:
            raise ValueError(
                f"{type(self).__name__}(manual_optimization=True) does not step LR schedulers, but "
                f"{len(self.trainer.lr_scheduler_configs)} are configured; drop the scheduler or use "
                "manual_optimization=False"
            )

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        trainer = self._trainer
        if trainer is None or trainer.state.fn != "fit":  # load_from_checkpoint, validate, test: any setting
            return
        saved = bool(checkpoint.get("hyper_parameters", {}).get("manual_optimization", False))
        if saved == self.automatic_optimization:  # saved manual != running manual
            raise ValueError(
                f"the checkpoint was saved with manual_optimization={saved}, this {type(self).__name__} has "
                f"manual_optimization={not saved}: Lightning counts global_step apart in the two modes, so resume "
                f"with manual_optimization={saved}"
            )

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._step(batch, batch_idx, "val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._step(batch, batch_idx, "test")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        hp = self.hparams
        if hp.optimizer == "adam":
            return torch.optim.Adam(self.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
        return torch.optim.SGD(self.parameters(), lr=hp.lr, momentum=hp.momentum, weight_decay=hp.weight_decay)
