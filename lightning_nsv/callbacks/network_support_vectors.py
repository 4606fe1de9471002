"""Network support vectors of a Leaky-ReLU-family classifier, as soon as it reaches zero training error."""
from __future__ import annotations

import contextlib
import math
import numbers
import os
import time
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset
from torchmetrics.aggregation import SumMetric

from lightning_nsv.artifacts import class_path, network_outputs, plain, save_support_vectors
from lightning_nsv.callbacks.sinks import FigureSink, log_directory
from lightning_nsv.compat import Callback, check_same_package, pl, rank_zero_info, rank_zero_warn
from lightning_nsv.extract import PathPart, find_path_part
from lightning_nsv.max_margin import solver_progress
from lightning_nsv.models.layers import eval_mode
from lightning_nsv.multiclass import METHODS as MULTICLASS_METHODS
from lightning_nsv.multiclass import class_labels, multiclass_support_vectors, pair_margins
from lightning_nsv.path_space import InputGramCache, forward_with_slopes
from lightning_nsv.solver.options import SolverOptions, check_choice
from lightning_nsv.support_vectors import (
    SupportVectorAnalysis,
    analysis_device,
    conflicting_duplicates,
    network_support_vectors,
    serve_kernel_columns,
    signed_labels,
    uses_dense_kernel,
)
from lightning_nsv.sharded import ColumnSharing

__all__ = ["NetworkSupportVectors"]


def _seconds(elapsed: float) -> str:
    return f"{elapsed:.1f} s" if elapsed >= 1 else f"{elapsed * 1000:.0f} ms"


def _check_head_fits_classes(path: PathPart, datamodule) -> None:
    """A data module that states ``num_classes`` must match the head: one output for 2 classes, else one per class
    (a 10-class checkpoint analysed with a binary data module would read 0/1 labels as two of ten classes)."""
    classes = getattr(datamodule, "num_classes", None)
    if not isinstance(classes, int) or isinstance(classes, bool):
        return
    outputs = path.num_outputs
    if (outputs == 1 and classes != 2) or (outputs > 1 and outputs != classes):
        task = f" (task={datamodule.task!r})" if isinstance(getattr(datamodule, "task", None), str) else ""
        raise ValueError(
            f"NetworkSupportVectors: the head {path.name} has {outputs} output{'s' * (outputs > 1)}, but the data "
            f"module {type(datamodule).__name__}{task} has {classes} classes: a binary head needs 2 classes, a K-class "
            "head K. `lightning-nsv analyze` rebuilds the model from the checkpoint's hyperparameters: give it the config the "
            "checkpoint was trained with."
        )


def _check_integer(name: str, value: Any, low: int | None) -> None:
    """Refuse a non-integer (a bool, a float such as 1.5, a string) or one below ``low``, as Lightning's own callbacks do."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"`{name}` must be an integer, got {value!r} ({type(value).__name__}); pass e.g. {name}="
                        f"{max(low or 0, 1)}")
    if low is not None and value < low:
        kind = "a positive integer" if low == 1 else f"an integer >= {low}"
        raise ValueError(f"`{name}` must be {kind}, got {value}")


def _split_batch(batch: Any) -> tuple[Tensor, Tensor]:
    if isinstance(batch, (tuple, list)) and len(batch) >= 2:
        return batch[0], _label_vector(batch[1])
    raise TypeError(
        f"batches must be (inputs, labels) tuples for the support-vector analysis, got {type(batch).__name__}"
    )


class NetworkSupportVectors(Callback):
    """Fits the max-margin classifier in path space once the network reaches zero training error.

    At the end of every ``every_n_epochs``-th training epoch the callback checks Assumption 1 of Snyder &
    Vishwanath (``y·N(x) > 0`` for every training sample, weights frozen, in float64) on the whole
    training set. The check is cheap while the network is far from zero error: samples misclassified at the
    last check and a random probe of ``probe_size`` samples are tried first, and the full pass stops at the
    first misclassified batch. At the first zero-error epoch the activation patterns are frozen, the path
    kernel is computed, the max-margin SVM is fitted (exactly, without intercept, or scikit-learn's ``SVC``
    with ``intercept=True``), results are logged and saved, and training stops if ``stop_on_zero_error``.

    The network is found with :func:`~lightning_nsv.extract.find_path_part`: the module's ``nn.Sequential``
    of Linear and ReLU/LeakyReLU layers (after an optional trunk ending with ``nn.Flatten``), or the
    submodules named by ``path_module``/``embedding``. The module's output must be that head's output; this is
    checked on the first batch and at every analysis, on the ``HEAD_CHECK_SAMPLES`` training samples nearest the
    decision boundary. A training set of one class is said and not analysed. Batches must be ``(inputs, labels)``
    (labels of shape ``(n,)`` or ``(n, 1)``) with labels 0/1 or ±1 for a head with one
    output (its logit), or class labels ``0..K-1`` for a head with K >= 2 outputs (the class scores): then zero
    training error is ``N_y(x) − max_{k≠y} N_k(x) > 0`` and the reference is the multi-class max-margin
    classifier of DESIGN §2b (:func:`~lightning_nsv.multiclass.multiclass_support_vectors`), with per-class metrics
    (``n_support_class<k>``) and a support-vector grid grouped by class.

    A non-finite output (a diverged network, NaN/inf in the data) counts as a training error and is named in a
    warning (the parameter or the first sample index); no analysis runs and no file is written for it. Under
    DDP each rank checks its share of the training set, the decision is reduced across ranks, rank 0 runs the
    analysis and broadcasts the numbers, and every rank logs them; with kernel columns (binary head) every rank
    computes its shard of the rows of each column block the solver asks for (:mod:`lightning_nsv.sharded`).

    Cost: by default only the ``m×s'`` float64 kernel columns of the ``s'`` samples that enter the solver's free
    set; ``kernel="dense"`` (and the intercept protocol) the whole ``m×m`` kernel, ``8·m²`` bytes (m = 20,000:
    3.2 GB). A repeated analysis (``stop_on_zero_error=False``) starts from the previous support set, and the
    callback then keeps the rows of ``X Xᵀ`` of the last support between analyses (``8·m·s`` bytes, up to ``8·m·s'``
    more during one); a single analysis keeps none.

    Args:
        every_n_epochs: Check zero training error every this many epochs, and at the last epoch of
            ``max_epochs``.
        probe_size: Random training samples tried before a full pass.
        stop_on_zero_error: Stop training once the analysis ran. With ``False`` training goes on and the
            analysis is repeated every ``every_n_epochs`` epochs while the training error stays zero, so that
            TensorBoard shows how the network approaches (or not) the max-margin classifier.
        intercept: Fit the SVM with an intercept (the paper's ``SVC`` protocol) instead of through the origin.
        C: Penalty of the intercept protocol on the kernel normalised by its mean diagonal.
        delta: Confidence of the compression bound.
        kernel: ``"dense"`` path kernel, ``"columns"`` computed on demand for candidate support vectors
            only, or ``"auto"``: columns through the origin, the dense kernel for ``intercept=True`` (which
            needs it) up to ``max_dense_bytes``.
        max_dense_bytes: Largest dense kernel ``"auto"`` builds (default 4 GiB, m ≈ 23,000).
        path_module: Dotted name of the ``nn.Sequential`` head, when the module has several.
        embedding: Dotted name of a trunk applied before the head.
        batch_size: Batch size of the callback's own passes over the data.
        save_dir: Where results go; default ``<log_dir>/nsv``.
        max_images: Support vectors shown in the image grid (the largest α first).
        seed: Seed of the random probe.
        multiclass: For heads with K >= 2 outputs: ``"exact"``, the multi-class max-margin problem through the
            origin over (sample, class) pairs, or ``"ovr"``, K one-vs-rest problems on one kernel.
        solver: Where the binary head's active-set solver keeps its kernel columns and Cholesky factor:
            ``"torch"`` on the analysis device, ``"numpy"`` on the CPU, ``"auto"`` torch on a GPU and numpy on the
            CPU (less CPU time there). The analysis device is the module's for CUDA (the zero-error pass, the kernel
            columns and the kept input-Gram rows of a repeated analysis, ``8·m·s`` bytes, live there; float64),
            else the CPU (MPS and other devices without float64); multi-class heads solve on the CPU.

    Raises:
        TypeError: On arguments of the wrong type (``every_n_epochs=1.5``, ``intercept="no"``).
        ValueError: On arguments out of range; on the first batch when inputs or weights are not finite, or
            the module's output is not the head's (and at every analysis); at the start of training when the training
            set is empty.
        UnsupportedNetworkError: At ``setup`` when the module has no supported path part.
        LightningPackageMismatch: At ``setup`` when the Trainer comes from the other Lightning package.

    Logged metrics (``nsv/`` prefix, at each analysis, plus ``nsv/zero_error_epoch``, the first such epoch, and
    ``nsv/zero_error_reached`` = 1):
        ``n_support``, ``support_fraction`` (s/m), ``svm_margin`` (1/||v||), ``network_margin``
        (min y N(x) / ||w̄||), ``margin_ratio``, ``cosine_wbar_v``, ``kkt_residual``, ``svm_margin_violations``,
        ``svm_alpha_at_bound``, ``unique_patterns_train``, ``unique_patterns_val``, ``val_agreement``,
        ``val_errors_network``, ``val_errors_svm``, ``val_errors_both``, ``compression_bound``,
        ``path_positive_mass_fraction``, ``path_positive_count_fraction``, ``path_negative_count``,
        ``path_zero_count``; from the second analysis on (``stop_on_zero_error=False``),
        ``support_jaccard_previous`` (overlap with the last support set), ``patterns_changed`` (training samples
        whose activation pattern changed since the last analysis) and the figure ``nsv/max_margin_approach``
        (cosine and margin ratio against log epoch). For K-class heads also ``n_support_class<k>``. The same metrics are registered in TensorBoard's HParams tab, and the report goes to its
        Text tab (``nsv/report``). Figures (TensorBoard, a logger with ``log_image``, else PNG files under
        ``<save_dir>/figures``): ``nsv/support_vectors`` (image data), ``nsv/log10_alpha`` (histogram of log10 α),
        ``nsv/alpha_histogram``, ``nsv/decision_boundaries`` (2-D inputs: network and SVM side by side),
        ``nsv/path_weights`` (networks of at most 400 weights, coloured by sign).
        When a fit ends at ``max_epochs`` without zero training error, ``nsv/zero_error_reached`` = 0 is written
        and a warning gives the number of training samples still misclassified; a fit stopped earlier says
        "not reached yet" and writes no verdict.

    Files: ``<save_dir>/support_vectors_epoch<E>.pt`` and ``.json`` (see :mod:`lightning_nsv.artifacts`;
    :func:`~lightning_nsv.artifacts.load_support_vectors` reads them and
    :func:`~lightning_nsv.artifacts.reproduce` recomputes them).

    Example::

        >>> from lightning_nsv.callbacks import NetworkSupportVectors
        >>> callback = NetworkSupportVectors(every_n_epochs=5, intercept=False)
    """

    def __init__(
        self,
        every_n_epochs: int = 1,
        probe_size: int = 512,
        stop_on_zero_error: bool = True,
        intercept: bool = False,
        C: float = 1e7,
        delta: float = 0.05,
        kernel: Literal["auto", "dense", "columns"] = "auto",
        max_dense_bytes: int = 4 << 30,
        path_module: str | None = None,
        embedding: str | None = None,
        batch_size: int = 1024,
        save_dir: str | None = None,
        max_images: int = 16,
        seed: int = 0,
        multiclass: Literal["exact", "ovr"] = "exact",
        solver: Literal["auto", "numpy", "torch"] = "auto",
    ) -> None:
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
        SolverOptions(kernel=kernel, solver=solver)  # refuses an unknown kernel or solver, as the analysis would
        check_choice("multiclass", multiclass, MULTICLASS_METHODS, "'exact' solves the K-class problem, 'ovr' K "
                     "binary ones")
        self.multiclass = multiclass
        self.solver = solver
        self.kernel = kernel
        self.max_dense_bytes = max_dense_bytes
        self.every_n_epochs = every_n_epochs
        self.probe_size = probe_size
        self.stop_on_zero_error = stop_on_zero_error
        self.intercept = intercept
        self.C = C
        self.delta = delta
        self.path_module = path_module
        self.embedding = embedding
        self.batch_size = batch_size
        self.save_dir = save_dir
        self.max_images = max_images
        self.seed = seed
        self.zero_error_epoch: int | None = None
        self.metrics: dict[str, float] = {}
        self.analysis: SupportVectorAnalysis | None = None
        self.history: list[dict[str, float]] = []
        self._hard: list[int] = []
        self._previous_support: list[int] = []
        self._path: PathPart | None = None
        self._kept: list[tuple[Tensor, Tensor]] = []
        self._warned: set[str] = set()
        self._diverged = False
        self._epoch: int | None = None
        self._previous_patterns: Tensor | None = None
        self._mismatch: str | None = None  # the zero-error pass's head check, until the ranks agree on it
        self._label_range: tuple[Any, Any] = (None, None)  # this rank's smallest and largest label at zero error
        self._single_class: Any = None  # the one class of a training set that has only one
        self._train_started = False
        # rows of X Xᵀ of the last support, reused by a repeated analysis (8·m·s bytes; not checkpointed)
        self._gram_cache = InputGramCache()

    @property
    def state_key(self) -> str:
        return self._generate_state_key(intercept=self.intercept, path_module=self.path_module)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        check_same_package(trainer, self)
        self._train_started, self._single_class = False, None
        if self.save_dir is not None and Path(self.save_dir).exists() and not Path(self.save_dir).is_dir():
            raise NotADirectoryError(f"NetworkSupportVectors: `save_dir={str(self.save_dir)!r}` is an existing file, so "
                                     "no result could be saved there after training; name a directory (or None for "
                                     "<log_dir>/nsv)")
        self._path = find_path_part(pl_module, self.path_module, self.embedding)
        _check_head_fits_classes(self._path, trainer.datamodule)
        if self._path.num_outputs > 1 and self.intercept:
            raise ValueError(
                f"{self._path.name} has {self._path.num_outputs} outputs: the multi-class analysis is the max-margin "
                "problem through the origin; `intercept=True` is for binary heads only"
            )

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._train_started = True
        if trainer.fast_dev_run:
            rank_zero_info("NetworkSupportVectors: fast_dev_run, so the support-vector analysis is skipped")
            return
        if self.zero_error_epoch is not None and self.stop_on_zero_error:
            # resumed from a checkpoint saved after the analysis: the run had already stopped there
            rank_zero_info(
                f"NetworkSupportVectors: the checkpoint was saved after zero training error at epoch "
                f"{self.zero_error_epoch} and its analysis (`stop_on_zero_error=True`), so training stops at once. "
                "The analysis' numbers are restored in `metrics`; `lightning-nsv analyze --ckpt_path` runs it again "
                "from the checkpoint. Pass `stop_on_zero_error=False` to train on."
            )
            trainer.should_stop = True
            return
        dataset = self._train_dataset(trainer)
        if len(dataset) == 0:
            raise ValueError(
                "NetworkSupportVectors: the training set is empty, so there is nothing to analyse; check the data "
                "module's `m`, split and files"
            )
        if _trains_on_part(trainer):
            rank_zero_warn(
                f"NetworkSupportVectors: `limit_train_batches={trainer.limit_train_batches}` trains on part of the training set, but zero "
                f"training error is checked and the SVM fitted on all {len(dataset)} training samples. Pass a "
                "data module with `m` set to the samples you train on to analyse just those."
            )

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._train_started and trainer.limit_train_batches != 0 and trainer.num_training_batches == 0:
            self._say_no_training_batches(trainer)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if trainer.global_step == 0 and batch_idx == 0:
            self._check_head_is_output(pl_module, batch)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._should_skip(trainer):
            return
        self._run_check(trainer, pl_module)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.zero_error_epoch is not None or trainer.fast_dev_run or self._single_class is not None:
            return  # analysed, skipped, or a training set of one class (said)
        dataset = self._train_dataset(trainer)
        wrong = self._count_errors(trainer, dataset, pl_module)
        epochs = trainer.current_epoch
        if wrong == 0 and not self._diverged:
            rank_zero_warn(
                f"NetworkSupportVectors: the network has zero training error now that training stopped after "
                f"{epochs} epochs, but not at an epoch it was checked at (every_n_epochs={self.every_n_epochs}; "
                "training stopped by max_steps, max_time or another callback), so it was not analysed. Run "
                "`lightning-nsv analyze --ckpt_path` on the last checkpoint, or resume from it with `max_epochs` "
                "one higher."
            )
            return
        if trainer.max_epochs is not None and 0 <= trainer.max_epochs <= epochs and not trainer.interrupted:
            advice = ("The network produced non-finite values (see the warning above): fix that first." if
                      self._diverged else self._duplicates_said(dataset) or "Train longer (resume from the last "
                      "checkpoint with a larger max_epochs), raise the learning rate or widen the network.")
            rank_zero_warn(
                f"NetworkSupportVectors: zero training error was not reached within max_epochs={trainer.max_epochs} "
                f"({wrong} of {len(dataset)} training samples misclassified at the end), so there are no network "
                f"support vectors. {advice}"
            )
            if trainer.is_global_zero:
                for logger in trainer.loggers:
                    logger.log_metrics({"nsv/zero_error_reached": 0.0}, step=trainer.global_step)
        else:
            rank_zero_info(
                f"NetworkSupportVectors: zero training error not reached yet when training stopped after {epochs} "
                f"epochs ({wrong} of {len(dataset)} training samples misclassified); resume from the checkpoint to "
                "go on."
            )

    def state_dict(self) -> dict[str, Any]:
        return {
            "zero_error_epoch": self.zero_error_epoch,
            "metrics": dict(self.metrics),
            "history": [dict(h) for h in self.history],
            "hard": list(self._hard),
            "previous_support": list(self._previous_support),
            "previous_patterns": self._previous_patterns,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.zero_error_epoch = state_dict.get("zero_error_epoch")
        self.metrics = dict(state_dict.get("metrics", {}))
        self.history = [dict(h) for h in state_dict.get("history", [])]
        self._hard = list(state_dict.get("hard", []))
        self._previous_support = list(state_dict.get("previous_support", []))
        self._previous_patterns = state_dict.get("previous_patterns")

    def _should_skip(self, trainer: pl.Trainer) -> bool:
        return (
            trainer.sanity_checking
            or bool(trainer.fast_dev_run)
            or (self.zero_error_epoch is not None and self.stop_on_zero_error)
            or ((trainer.current_epoch + 1) % self.every_n_epochs != 0
                and trainer.current_epoch + 1 != trainer.max_epochs)
        )

    def _labels(self, y: Tensor) -> Tensor:
        """Binary labels as ±1 (float64), class labels as int64 in ``[0, K)``; refuses anything else."""
        if self._path.num_outputs == 1:
            return signed_labels(y)
        return torch.from_numpy(class_labels(y, self._path.num_outputs))

    def _margins(self, outputs: Tensor, y: Tensor) -> Tensor:
        """``y·N(x)`` (binary) or ``min_k N_y(x) − N_k(x)`` (multi-class); NaN where outputs are not finite."""
        labels = self._labels(y)
        if self._path.num_outputs == 1:
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
        mismatch = self._module_mismatch(pl_module, x[:8], "the first training batch")
        if mismatch is not None:
            raise ValueError(mismatch)

    def _module_mismatch(self, pl_module: pl.LightningModule, x: Tensor, where: str,
                         indices: list[int] | None = None, scale: float = 0.0) -> str | None:
        """Why the module's output on ``x`` is not what the analysis evaluates (its head), or ``None`` when it is.
        ``scale``: the size of the head's outputs over the training set (samples near the boundary have small outputs
        but the rounding of the sums that make them)."""
        with eval_mode(pl_module), torch.no_grad():
            x = x.to(pl_module.device)
            output = pl_module(x).reshape(len(x), -1)
            head = _head_forward(self._path, x).reshape(len(x), -1)
        module = type(pl_module).__name__
        if output.shape[1] != head.shape[1]:
            return (f"the output of {module} has {output.shape[1]} values per sample, but its path part "
                    f"{self._path.name} has {head.shape[1]}; the module must return the head's output unchanged")
        precision = output.dtype if output.is_floating_point() else torch.float32
        if precision not in (torch.float32, torch.float64):
            self._warn_once(
                f"NetworkSupportVectors: {module} computes in {precision}; the analysis evaluates "
                "its head in float64 from these rounded weights, so its own outputs may differ in sign on samples "
                "within rounding of the decision boundary. Train with precision='32-true' for an exact match."
            )
        eps = torch.finfo(precision).eps
        rtol = max(1e-4, 64 * eps)
        if precision == torch.float32 and _reduced_float32_matmuls(output.device):
            rtol = TF32_RTOL  # set_float32_matmul_precision("high"/"medium"): float32 products in TF32
        output = output.cpu().double()
        scale = max(scale, float(head.abs().max()) if len(head) else 1.0)
        far = ~torch.isclose(output, head, rtol=rtol, atol=max(1e-5, rtol * scale)).all(1)
        if not bool(far.any()):
            return None
        row = int(far.nonzero()[0, 0])
        sample = f"training sample {indices[row]}" if indices is not None else f"row {row} of {where}"
        return (
            f"NetworkSupportVectors: the output of {module} is not the output of its path part {self._path.name} "
            f"({_values(output[row])} against {_values(head[row])} on {sample}, checked on {where}), so an analysis of "
            "that head would not describe the module (it could report zero training error the module does not have). "
            "Choices: make `forward` return the path part's output unchanged (no sigmoid, no extra layers, no "
            "parameter added or multiplied outside it); name the parts with `path_module=`/`embedding=`; analysing "
            "the whole network is a coming feature."
        )

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
            f"NetworkSupportVectors: every training label is {_class_name(first, self._path.num_outputs)}: with one "
            "class, zero training error only asks the network to give every sample that class, and the max-margin "
            "classifier through the origin of one class has no second class to separate it from (its margin and "
            "support vectors describe no decision boundary), so the support-vector analysis does not run and no "
            "file is written. Check the data module's labels, split or filtering."
        )
        return False

    def _say_no_training_batches(self, trainer: pl.Trainer) -> None:
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

    def _train_dataset(self, trainer: pl.Trainer) -> Dataset:
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
        return dataset

    def _val_dataset(self, trainer: pl.Trainer) -> Dataset | None:
        datamodule = trainer.datamodule
        dataset = getattr(datamodule, "val_dataset", None) if datamodule is not None else None
        if dataset is None:
            loaders = trainer.val_dataloaders
            if isinstance(loaders, DataLoader):
                dataset = loaders.dataset
        return dataset

    @staticmethod
    def _shard(trainer: pl.Trainer, n: int) -> list[int]:
        """The training indices this rank checks: every ``world_size``-th one."""
        return list(range(trainer.global_rank, n, trainer.world_size))

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            rank_zero_warn(message)

    def analyze_now(self, trainer: pl.Trainer, pl_module: pl.LightningModule, epoch: int) -> bool:
        """Check zero training error and, where it holds, run the analysis once (``lightning-nsv analyze``).

        ``epoch`` names the files and the logs (the checkpoint's epoch). Returns whether zero error holds. The
        analysis stands alone: the history, previous support and patterns that the checkpoint restored (those of
        the fit's own analyses, of this very network when it was saved after one) are not compared with it.
        """
        self.history, self._previous_support, self._previous_patterns = [], [], None
        self._epoch = epoch
        try:
            reached = self._run_check(trainer, pl_module)
        finally:
            self._epoch = None
        if not reached and self._single_class is None:
            dataset = self._train_dataset(trainer)
            wrong = self._count_errors(trainer, dataset, pl_module)
            rank_zero_warn(
                f"NetworkSupportVectors: the checkpoint's network misclassifies {wrong} of {len(dataset)} training "
                "samples, so there are no network support vectors; "
                + (self._duplicates_said(dataset) or "analyse a checkpoint taken at zero training error")
            )
        return reached

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

    def _count_errors(self, trainer: pl.Trainer, dataset: Dataset, pl_module) -> int:
        """Misclassified training samples, each rank counting its shard, summed over the ranks."""
        with eval_mode(pl_module), torch.no_grad():
            wrong = self._errors(dataset, self._shard(trainer, len(dataset)), self._path.path_network(), pl_module,
                                 stop_early=False)
        return _sum_over_ranks(len(wrong))

    def _current_epoch(self, trainer: pl.Trainer) -> int:
        return trainer.current_epoch if self._epoch is None else self._epoch

    def _run_check(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> bool:
        dataset = self._train_dataset(trainer)
        net = self._path.path_network()
        non_finite = _first_non_finite_parameter(pl_module)
        if non_finite is not None:
            self._warn_diverged(non_finite, dataset)
            clean = False
        else:
            with eval_mode(pl_module), torch.no_grad():
                clean = self._zero_error_here(trainer, dataset, net, pl_module)
        reached = trainer.strategy.reduce_boolean_decision(clean, all=True)
        if not reached or not self._trustworthy(trainer):
            return False
        metrics = None
        directory = self._output_dir(trainer)  # Trainer.log_dir is a collective: every rank asks for it
        share = self._shares_columns(trainer, net)
        if trainer.is_global_zero:
            with ColumnSharing() if share else contextlib.nullcontext() as sharing:
                metrics = self._analyse(trainer, pl_module, dataset, net, directory, sharing)
        elif share:  # the other ranks compute their shard of every kernel column block rank 0 asks for
            serve_kernel_columns(net, self._embed_all(dataset, pl_module)[0])
        metrics = trainer.strategy.broadcast(metrics, src=0)
        if self.zero_error_epoch is None:
            self.zero_error_epoch = self._current_epoch(trainer)
        self._record(metrics, trainer)
        for key, value in metrics.items():
            pl_module.log(f"nsv/{key}", value, on_step=False, on_epoch=True)
        pl_module.log("nsv/zero_error_epoch", float(self.zero_error_epoch), on_step=False, on_epoch=True)
        pl_module.log("nsv/zero_error_reached", 1.0, on_step=False, on_epoch=True)
        if self.stop_on_zero_error:
            trainer.should_stop = True
        return True

    def _record(self, metrics: dict[str, float], trainer: pl.Trainer) -> None:
        support = metrics.pop("_support", None)
        if support is not None:
            previous = set(self._previous_support)
            if previous:
                metrics["support_jaccard_previous"] = len(previous & set(support)) / len(previous | set(support))
            self._previous_support = list(support)
        self.metrics = metrics
        self.history.append({"epoch": float(self._current_epoch(trainer)), **metrics})

    def _errors(self, dataset: Dataset, indices: list[int], net, pl_module, stop_early: bool = True,
                keep: list | None = None, margins: list | None = None) -> list[int]:
        """Indices whose ``y·N(x) > 0`` fails (NaN counts as failing); ``keep`` collects the embedded batches,
        ``margins`` each batch's margins and labels."""
        wrong, device = [], _analysis_device(pl_module)
        on_device = net.to(device)
        for start in range(0, len(indices), self.batch_size):
            chunk = indices[start:start + self.batch_size]
            x, y = _gather(dataset, chunk)
            embedded = self._path.embed(x.to(pl_module.device)).to(device)
            if keep is not None:
                keep.append((embedded, y))
            outputs = forward_with_slopes(on_device, embedded)[0].cpu()
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
        if nearest:
            self._mismatch = self._module_mismatch(pl_module, _gather(dataset, nearest)[0], "the "
                                                   f"{len(nearest)} training samples nearest its decision boundary "
                                                   f"at epoch {self._current_epoch(trainer)}", nearest,
                                                   float(margins.abs().max()))
        return True

    def _embedded_training_set(self, dataset: Dataset, pl_module) -> tuple[Tensor, Tensor]:
        kept, self._kept = self._kept, []
        if kept:
            return torch.cat([b[0] for b in kept]), torch.cat([b[1] for b in kept])
        return self._embed_all(dataset, pl_module)

    def _say(self, trainer: pl.Trainer, text: str) -> None:
        """Print on lines of its own: through the progress bar where one is shown, else the rank-zero log."""
        bar = trainer.progress_bar_callback
        if bar is not None and getattr(bar, "is_enabled", False) and callable(getattr(bar, "print", None)):
            bar.print(text)
        else:
            rank_zero_info(text)

    def _shares_columns(self, trainer: pl.Trainer, net) -> bool:
        """Under DDP the ranks compute the kernel columns of the binary columns path together."""
        return (trainer.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized()
                and net.num_outputs == 1 and not uses_dense_kernel(self.kernel, self.intercept))

    def _analyse(self, trainer, pl_module, dataset, net, directory: Path,
                 sharing: ColumnSharing | None = None) -> dict[str, float]:
        x_train, y_train = self._embedded_training_set(dataset, pl_module)
        val = self._val_dataset(trainer)
        x_val, y_val = self._embed_all(val, pl_module) if val is not None and len(val) else (None, None)
        if x_val is not None and not self._usable_validation(x_val, y_val, x_train.shape[1]):
            x_val = y_val = None
        m = len(y_train)
        how = "dense path kernel" if uses_dense_kernel(self.kernel, self.intercept) else "path kernel columns of candidate support vectors"
        epoch = self._current_epoch(trainer)
        self._say(trainer, f"NetworkSupportVectors: zero training error at epoch {epoch} on all {m} "
                           f"training samples; computing the {how} for m = {m:,} and the max-margin classifier ...")
        started = time.perf_counter()
        bar = trainer.progress_bar_callback
        progress = _SolverBar(enabled=bar is not None and getattr(bar, "is_enabled", False))
        try:
            with solver_progress(progress):
                analysis = self._fit_max_margin(net, x_train, y_train, x_val, y_val, sharing)
        finally:
            progress.close()
        self.analysis = analysis
        self._say(trainer, f"NetworkSupportVectors: analysis done in {_seconds(time.perf_counter() - started)}\n"
                           + analysis.report())
        step = trainer.global_step
        self._save(trainer, pl_module, directory, analysis, y_train, net, x_train)
        sink = FigureSink(trainer.loggers, directory / "figures", type(self).__name__)
        sink.text("nsv/report", _markdown_report(epoch, analysis), step)
        metrics = analysis.to_metrics()
        if not self.history:  # one HParams session per run: the first analysis registers the metrics
            _register_hparams(trainer, pl_module, metrics)
        changed = self._patterns_changed(net, x_train)
        x_train = x_train.cpu()
        if changed is not None:
            metrics["patterns_changed"] = float(changed)
        if self.history:
            from lightning_nsv.plotting import plot_max_margin_approach

            series = [*self.history, {"epoch": float(epoch), **metrics}]
            sink.figure("nsv/max_margin_approach", plot_max_margin_approach(
                [max(h["epoch"], 1.0) for h in series], [h["cosine_wbar_v"] for h in series],
                [h.get("margin_ratio", float("nan")) for h in series])[0], step)
        self._log_figures(trainer, dataset, analysis, sink)
        if net.num_outputs == 1:
            self._log_path_figures(trainer, net, x_train, y_train, analysis, sink)
        return {**metrics, "_support": analysis.svm.support_.tolist()}

    def _usable_validation(self, x_val: Tensor, y_val: Tensor, features: int) -> bool:
        """Whether the validation samples can be compared (before the analysis, which would otherwise fail at its end);
        else a warning names the problem and the analysis runs without them."""
        problem = None
        if x_val.shape[1] != features:
            problem = f"embed to {x_val.shape[1]} features, the training samples to {features}"
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

    def _patterns_changed(self, net, x_train: Tensor) -> int | None:
        """Training samples whose activation pattern changed since the last analysis (None at the first)."""
        slopes = forward_with_slopes(net.to(x_train.device), x_train)[1]
        if not slopes:
            return None
        bits = torch.cat([s == g for s, g in zip(slopes, net.gammas)], dim=1).cpu().numpy()
        packed = torch.from_numpy(np.packbits(bits, axis=1))
        previous, self._previous_patterns = self._previous_patterns, packed
        if previous is None or previous.shape != packed.shape:
            return None
        return int((previous != packed).any(1).sum())

    def _fit_max_margin(self, net, x_train, y_train, x_val, y_val, sharing=None):
        if net.num_outputs == 1:
            return network_support_vectors(
                net, x_train, y_train, x_val, y_val, intercept=self.intercept, C=self.C, delta=self.delta,
                kernel=self.kernel, max_dense_bytes=self.max_dense_bytes,
                initial=self._previous_support or None, sharing=sharing, solver=self.solver,
                cache=None if self.stop_on_zero_error else self._gram_cache,  # rows kept for the next analysis only
            )
        return multiclass_support_vectors(net, x_train, y_train, x_val, y_val, method=self.multiclass,
                                          delta=self.delta, solver=self.solver)  # on the CPU: warns for "torch"

    def _embed_all(self, dataset: Dataset, pl_module) -> tuple[Tensor, Tensor]:
        # an own generator: iterating a DataLoader would otherwise draw from the global RNG of training
        loader = DataLoader(dataset, batch_size=self.batch_size, shuffle=False, generator=torch.Generator())
        with eval_mode(pl_module), torch.no_grad():
            device = _analysis_device(pl_module)
            parts = [(self._path.embed(x.to(pl_module.device)).to(device), y) for x, y in map(_split_batch, loader)]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    def _output_dir(self, trainer: pl.Trainer) -> Path:
        return Path(self.save_dir) if self.save_dir else log_directory(trainer) / "nsv"

    def _save(self, trainer, pl_module, directory: Path, analysis: SupportVectorAnalysis, y_train: Tensor,
              net, x_train: Tensor) -> Path:
        datamodule = trainer.datamodule
        source = getattr(datamodule, "train_indices", None)
        module_hparams = getattr(pl_module, "hparams", None)
        payload = {
            "support": torch.from_numpy(analysis.svm.support_),
            "alpha": torch.from_numpy(analysis.svm.alpha_),
            "intercept": getattr(analysis.svm, "intercept_", 0.0),
            "labels": self._labels(y_train),
            "num_outputs": net.num_outputs,
            "network": {"weights": list(net.weights), "biases": None if net.biases is None else list(net.biases),
                        "betas": list(net.betas), "gammas": list(net.gammas)},
            "path_part": self._path.name,
            "path_module": self.path_module,
            "embedding": self.embedding,
            "module_class": class_path(pl_module),
            "module_hparams": plain(dict(module_hparams)) if module_hparams else None,
            "module_state": {k: v.detach().cpu().clone() for k, v in pl_module.state_dict().items()},
            "data_class": class_path(datamodule),
            "data_hparams": plain(dict(datamodule.hparams)) if getattr(datamodule, "hparams", None) else None,
            "train_indices": None if source is None else torch.as_tensor(source),
            "epoch": self._current_epoch(trainer),
            "global_step": trainer.global_step,
            "solver": {"intercept": self.intercept, "C": self.C, "method": analysis.svm.method,
                       "backend": getattr(analysis, "solver_backend", "numpy"),  # multi-class: the CPU
                       "multiclass": self.multiclass, "kernel": self.kernel, "max_dense_bytes": self.max_dense_bytes,
                       "kernel_scale": getattr(analysis.svm, "kernel_scale", None),
                       "C_effective": getattr(analysis.svm, "C_effective", None),
                       "kkt_residual": analysis.svm.kkt_residual, "iterations": getattr(analysis.svm, "iterations", 0)},
            "metrics": analysis.to_metrics(),
            "outputs": network_outputs(net, x_train),  # reproduce() compares them
        }
        return save_support_vectors(directory, f"support_vectors_epoch{self._current_epoch(trainer)}", payload,
                                    report=analysis.report())

    def _log_figures(self, trainer, dataset, analysis: SupportVectorAnalysis, sink: FigureSink) -> None:
        from lightning_nsv.plotting import alpha_histogram, image_grid, short_number

        support = analysis.svm.support_
        per_sample = analysis.svm.alpha_.reshape(len(analysis.svm.alpha_), -1).sum(1)  # Σ_k α_(i,k) multi-class
        alpha = per_sample[support]
        step = trainer.global_step
        sink.histogram("nsv/log10_alpha", np.log10(alpha[alpha > 0]), step)  # α spans decades: a log axis
        sink.figure("nsv/alpha_histogram", alpha_histogram(alpha)[0], step)
        order = support[alpha.argsort()[::-1][: self.max_images]]
        if not len(order):
            return
        images, labels = _gather(dataset, [int(i) for i in order])
        if images.dim() != 4:
            return
        if analysis.svm.alpha_.ndim > 1:  # grouped by class, the largest α first within each
            grouped = sorted(range(len(order)), key=lambda j: (int(labels[j]), -per_sample[order[j]]))
            order, images, labels = order[grouped], images[grouped], labels[grouped]
        titles = [f"y={int(c)} α={short_number(a)}" for c, a in zip(labels, per_sample[order])]
        figure = image_grid(images, titles, total=len(support), max_images=self.max_images)[0]
        sink.figure("nsv/support_vectors", figure, step)

    def _log_path_figures(self, trainer, net, x_train: Tensor, y_train: Tensor,
                          analysis: SupportVectorAnalysis, sink: FigureSink) -> None:
        """Decision boundaries of network and SVM for 2-D inputs; the signed weights of small networks."""
        from lightning_nsv.plotting import data_extent, decision_grid, plot_decision_boundaries, plot_path_weights

        if x_train.shape[1] == 2:
            svm, sv = analysis.svm, analysis.svm.support_
            grid = decision_grid(net, x_train[sv], y_train[sv], svm.alpha_[sv], svm.intercept_,
                                 extent=data_extent(x_train), resolution=150)
            sink.figure("nsv/decision_boundaries", plot_decision_boundaries(grid, x_train, y_train, sv)[0],
                        trainer.global_step)
        if sum(w.numel() for w in net.weights) <= 400:
            sink.figure("nsv/path_weights", plot_path_weights(net, analysis.signs)[0], trainer.global_step)


#: Relative tolerance of the head check when float32 products on CUDA may run in TF32 (a 10-bit mantissa, machine
#: epsilon 2**-10): far above their rounding, far below what a sigmoid or an extra layer changes.
TF32_RTOL = 2e-2


def _reduced_float32_matmuls(device: torch.device, backends: Any = torch.backends) -> bool:
    """Whether float32 products on ``device`` may run in TF32. Read through the precision API of torch >= 2.9 where
    there is one (reading the legacy flag after a setting through the new API raises), else the legacy flag."""
    if device.type != "cuda":
        return False
    matmul = backends.cuda.matmul
    try:
        precision = getattr(matmul, "fp32_precision", None)
        if precision is None:  # torch < 2.9
            return bool(matmul.allow_tf32)
        if precision == "none":  # inherits the global setting
            precision = backends.fp32_precision
    except RuntimeError:
        return True  # a state torch will not report: allow for it
    return precision not in ("ieee", "none")  # "none" at both levels: the default, IEEE float32


def _analysis_device(pl_module) -> torch.device:
    """Where the float64 analysis runs: the module's device for CUDA, else the CPU (MPS has no float64)."""
    return analysis_device(pl_module.device)


def _gather(dataset: Dataset, indices: list[int]) -> tuple[Tensor, Tensor]:
    """``(inputs, labels)`` of the samples at ``indices``: sliced from in-memory tensors, else item by item."""
    tensors = getattr(dataset, "tensors", None)
    if isinstance(tensors, (tuple, list)) and len(tensors) >= 2:
        index = torch.as_tensor(indices, dtype=torch.long)
        return tensors[0][index], _label_vector(tensors[1][index])
    xs, ys = zip(*[_split_batch(dataset[i]) for i in indices])
    return torch.stack([torch.as_tensor(x) for x in xs]), _label_vector(torch.stack([torch.as_tensor(y) for y in ys]))


#: Training samples nearest the decision boundary on which every analysis checks the module's output against its head.
HEAD_CHECK_SAMPLES = 64


def _values(row: Tensor) -> str:
    return ", ".join(f"{v:.6g}" for v in row[:4].tolist()) + (", ..." if len(row) > 4 else "")


def _class_name(label: Any, num_outputs: int) -> str:
    return f"class {int(label)}" if num_outputs > 1 else ("positive (1)" if label > 0 else "negative (0 or -1)")


def _label_vector(y: Any) -> Any:
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


def _head_forward(path: PathPart, x: Tensor) -> Tensor:
    return forward_with_slopes(path.path_network(), path.embed(x).cpu())[0]


_DIVERGED = ("the network has diverged (lower the learning rate, clip gradients or check the loss), or the data hold "
             "NaN/inf")


class _SolverBar:
    """A tqdm bar over the solver's iterations, shown once the analysis has run for ``after`` seconds and only
    where the Trainer shows a progress bar."""

    def __init__(self, enabled: bool, after: float = 2.0) -> None:
        self.enabled, self.after, self.started, self.bar = enabled, after, time.perf_counter(), None

    def __call__(self, iteration: int, free: int, violation: float) -> None:
        if not self.enabled or time.perf_counter() - self.started < self.after:
            return
        if self.bar is None:
            from tqdm.auto import tqdm

            self.bar = tqdm(desc="max-margin solver", unit=" it", leave=False, dynamic_ncols=True)
        self.bar.update(iteration - self.bar.n)
        self.bar.set_postfix(free=free, violation=f"{violation:.1e}", refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _sum_over_ranks(count: int) -> int:
    """A count summed over the DDP ranks (each checks its shard), through torchmetrics' synchronised sum."""
    total = SumMetric()
    total.update(float(count))
    return int(total.compute())


def _trains_on_part(trainer: pl.Trainer) -> bool:
    limit = trainer.limit_train_batches
    if isinstance(limit, float):
        return limit < 1.0
    try:
        return limit is not None and limit < len(trainer.train_dataloader)
    except TypeError:  # a loader without a length
        return False


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


def _markdown_report(epoch: int, analysis: SupportVectorAnalysis) -> str:
    rows = "\n".join(f"| `nsv/{key}` | {value:.6g} |" for key, value in analysis.to_metrics().items())
    report = analysis.report().replace("\n", "  \n")
    return f"**Network support vectors at epoch {epoch}**  \n{report}\n\n| metric | value |\n|---|---|\n{rows}"


def _register_hparams(trainer: pl.Trainer, pl_module: pl.LightningModule, metrics: dict[str, float]) -> None:
    """Register the analysis metrics in TensorBoard's HParams tab (values are read from the scalars)."""
    writers = [lg.experiment for lg in trainer.loggers
               if callable(getattr(getattr(lg, "experiment", None), "_get_file_writer", None))]
    if not writers:
        return
    from torch.utils.tensorboard.summary import hparams

    params: dict[str, Any] = {}
    for prefix, source in (("model", getattr(pl_module, "hparams", {})),
                           ("data", getattr(trainer.datamodule, "hparams", {}))):
        for key, value in dict(source or {}).items():
            if not str(key).startswith("_"):
                params[f"{prefix}/{key}"] = value if isinstance(value, (bool, int, float, str)) else str(value)
    summaries = hparams(params, {f"nsv/{key}": value for key, value in metrics.items()})
    for writer in writers:
        file_writer = writer._get_file_writer()
        for summary in summaries:
            file_writer.add_summary(summary)
