"""Network support vectors of a Leaky-ReLU-family classifier, as soon as it reaches zero training error.

This module holds the callback's Lightning hooks and their orchestration. The callback owns three parts, each with
explicit arguments and return values: its :class:`~lightning_nsv.scope.Scope` (what is analysed, chosen once by
:func:`~lightning_nsv.callbacks.nsv_scope.choose`), a :class:`~lightning_nsv.callbacks.zero_error.ZeroErrorMonitor`
(the zero-error pass and its checks) and a :class:`~lightning_nsv.callbacks.nsv_outputs.Reporter` (what is said,
saved and logged). Its arguments are checked in :mod:`~lightning_nsv.callbacks.nsv_checks`, and how it reads the data
is in :mod:`~lightning_nsv.callbacks.nsv_data`.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Literal, Sequence

import torch
from torch import Tensor
from torch.utils.data import Dataset

from lightning_nsv.analysis.whole_network_budget import DEFAULT_TIME_BUDGET
from lightning_nsv.callbacks.dashboard import HEADLINE, log_scalars, nsv_charts
from lightning_nsv.callbacks.nsv_checks import WarnOnce, check_arguments, check_head_fits_classes, first_non_finite_parameter
from lightning_nsv.callbacks.nsv_data import (distributed, say_no_training_batches, skips_epoch, train_dataset,
                                              trains_on_part, val_dataset)
from lightning_nsv.callbacks.nsv_outputs import Reporter, register_nsv_hparams
from lightning_nsv.callbacks.nsv_scope import check_cost, choose, embed_all, patterns_changed
from lightning_nsv.callbacks.sinks import check_writable_folder
from lightning_nsv.callbacks.zero_error import ZeroErrorMonitor
from lightning_nsv.compat import Callback, check_same_package, pl, rank_zero_info, rank_zero_warn
from lightning_nsv.errors import NonFiniteError
from lightning_nsv.kernel.gram_cache import InputGramCache
from lightning_nsv.kernel.sharded import ColumnSharing
from lightning_nsv.models.layers import eval_mode
from lightning_nsv.scope import AnalysisOptions, Scope, ScopeRequest, find_head

__all__ = ["NetworkSupportVectors"]


class NetworkSupportVectors(Callback):
    """Fits the max-margin classifier in path space once the network reaches zero training error.

    At the end of every ``every_n_epochs``-th training epoch the callback checks Assumption 1 of Snyder &
    Vishwanath (``y·N(x) > 0`` for every training sample, weights frozen, in float64) on the whole
    training set. The check is cheap while the network is far from zero error: samples misclassified at the
    last check and a random probe of ``probe_size`` samples are tried first, and the full pass stops at the
    first misclassified batch. At the first zero-error epoch the activation patterns are frozen, the path
    kernel is computed, the max-margin SVM is fitted (exactly, without intercept, or scikit-learn's ``SVC``
    with ``intercept=True``), results are logged and saved, and training stops if ``stop_on_zero_error``.

    What is analysed (``scope``): by default the whole module (its ``forward`` on the raw inputs), traced into the
    pair network of DESIGN.md §2c (:func:`~lightning_nsv.analysis.whole_network_support_vectors`: convolutions,
    pooling, BatchNorm in eval mode, residual sums, code in ``forward``); a module that is a plain Linear/Leaky-ReLU
    chain goes the head's way (the same kernel, with its fast path, DDP sharding and Gram cache). With
    ``scope="head"`` (or ``path_module``/``embedding``), the head that :func:`~lightning_nsv.extract.find_path_part`
    finds: the module's ``nn.Sequential`` of Linear and ReLU/LeakyReLU layers after an optional trunk ending with
    ``nn.Flatten``, the trunk's output being a fixed embedding (paper 000's CNN + FC protocol); the module's output
    must be that head's output, checked on the first batch and at every analysis on the ``HEAD_CHECK_SAMPLES``
    training samples nearest the decision boundary. The report, the TensorBoard text and the result file say which
    ("path kernel of the whole network: 6 maps, 5 gate layers, 2 max-pools, 864 gates" or "head only: …; trunk …
    is a fixed embedding"). A training set of one class is said and not analysed. Batches must be
    ``(inputs, labels)`` (labels of shape ``(n,)`` or ``(n, 1)``) with labels 0/1 or ±1 for a network with one
    output (its logit), or class labels ``0..K-1`` for K >= 2 outputs (the class scores): then zero
    training error is ``N_y(x) − max_{k≠y} N_k(x) > 0`` and the reference is the multi-class max-margin
    classifier of DESIGN §2b (:func:`~lightning_nsv.analysis.multiclass_support_vectors`), with per-class metrics
    (``n_support_class<k>``) and a support-vector grid grouped by class.

    A non-finite output (a diverged network, NaN/inf in the data) counts as a training error and is named in a
    warning (the parameter or the first sample index); no analysis runs and no file is written for it. Under
    DDP each rank checks its share of the training set, the decision is reduced across ranks, rank 0 runs the
    analysis and broadcasts the numbers, and every rank logs them; with kernel columns (the whole network, or a
    binary head) every rank computes its shard of the rows of each column block the solver asks for.

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
        image_shape: ``(C, H, W)`` or ``(H, W)`` of inputs given flat (e.g. ``(1, 8, 8)`` for 64 features), so that
            the support vectors are drawn as images; default: the data module's ``image_shape`` (or ``input_shape``).
            Without either, flat inputs get no image grid and the callback says so once.
        seed: Seed of the random probe.
        multiclass: For heads with K >= 2 outputs: ``"exact"``, the multi-class max-margin problem through the
            origin over (sample, class) pairs, or ``"ovr"``, K one-vs-rest problems on one kernel.
        scope: ``"auto"``: the whole module, unless ``path_module``/``embedding`` name a head, ``intercept=True``
            or ``multiclass="ovr"`` ask for the head's analysis, or the module is not piecewise linear (an info line
            says so, and the head is analysed where there is one); ``"whole"``: the whole module, refused with the
            operation named (and the choices) where it is not piecewise linear; ``"head"``: the head only;
            ``"from:NAME"``: everything from the input of submodule ``NAME`` on, analysed in path space on the
            float64 outputs of the part before it (a fixed embedding); refused where a skip connection crosses it.
        time_budget: Seconds (default an hour) a whole-network analysis may take: before training, its cost is
            estimated (the pair network's rate on a few training inputs; said when above 10 s) and the fit refused
            above it (``TimeBudgetError``, saying what fits); ``None`` or ``inf``: no limit.
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
        UnsupportedNetworkError: At ``setup`` when the module has no supported path part (``scope="head"``).
        NotPiecewiseLinearError: With ``scope="whole"``, once the first training samples are there (at ``setup`` for
            a data module's), when the module holds an operation outside DESIGN.md §2c's table; with ``"auto"``
            where it has no head either (``NoAnalysableScopeError``, both).
        LightningPackageMismatch: At ``setup`` when the Trainer comes from the other Lightning package.

    Logged metrics (``nsv/`` prefix, at each analysis, plus ``nsv/zero_error_epoch``, the first such epoch, and
    ``nsv/zero_error_reached`` = 1), to ``callback_metrics`` and once to the loggers, TensorBoard's against the
    epoch (repeated analyses draw curves; :mod:`~lightning_nsv.callbacks.dashboard`), the others' at the global step:
        ``n_support``, ``support_fraction`` (s/m), ``svm_margin`` (1/||v||), ``network_margin``
        (min y N(x) / ||w̄||), ``margin_ratio``, ``cosine_wbar_v``, ``kkt_residual``, ``svm_margin_violations``,
        ``svm_alpha_at_bound``, ``unique_patterns_train``, ``unique_patterns_val``, ``val_agreement``,
        ``val_errors_network``, ``val_errors_svm``, ``val_errors_both``, ``compression_bound``,
        ``path_positive_mass_fraction``, ``path_positive_count_fraction``, ``path_negative_count``,
        ``path_zero_count``; from the second analysis on (``stop_on_zero_error=False``),
        ``support_jaccard_previous`` (overlap with the last support set), ``patterns_changed`` (training samples
        whose activation pattern changed since the last analysis) and the figure ``nsv/max_margin_approach``
        (cosine and margin ratio against log epoch). For K-class heads also ``n_support_class<k>``.
        TensorBoard: Custom Scalars groups the headline numbers, HParams lists them first (hyperparameters: see
        :func:`~lightning_nsv.callbacks.dashboard.select_hparams`), the report goes to the Text tab (``nsv/report``). Figures (TensorBoard, a logger with ``log_image``, else PNG files under
        ``<save_dir>/figures``): ``nsv/summary`` (the card of :func:`~lightning_nsv.plotting.plot_summary_card`:
        the headline numbers, the bound marked vacuous above 1), ``nsv/support_vectors`` (image data),
        ``nsv/log10_alpha`` (histogram of log10 α), ``nsv/alpha_histogram``, ``nsv/decision_boundaries`` (2-D
        inputs: network and SVM side by side), ``nsv/path_weights`` (networks of at most 400 weights, coloured by
        sign); these two for a head only. The whole network adds ``scope_maps``, ``scope_gate_layers``,
        ``scope_max_pools`` and ``scope_gates``.
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
        scope: str = "auto",
        image_shape: Sequence[int] | None = None,
        time_budget: float | None = DEFAULT_TIME_BUDGET,
    ) -> None:
        check_arguments(every_n_epochs=every_n_epochs, probe_size=probe_size, stop_on_zero_error=stop_on_zero_error,
                        intercept=intercept, C=C, delta=delta, kernel=kernel, max_dense_bytes=max_dense_bytes,
                        path_module=path_module, embedding=embedding, batch_size=batch_size, save_dir=save_dir,
                        max_images=max_images, seed=seed, multiclass=multiclass, solver=solver, scope=scope,
                        image_shape=image_shape, time_budget=time_budget)
        self.scope, self.image_shape = scope, None if image_shape is None else tuple(int(n) for n in image_shape)
        self.multiclass, self.solver, self.kernel, self.time_budget = multiclass, solver, kernel, time_budget
        self.max_dense_bytes, self.every_n_epochs, self.probe_size = max_dense_bytes, every_n_epochs, probe_size
        self.stop_on_zero_error, self.intercept = stop_on_zero_error, intercept
        self.C, self.delta = C, delta
        self.path_module, self.embedding = path_module, embedding
        self.batch_size, self.save_dir, self.max_images, self.seed = batch_size, save_dir, max_images, seed
        self.zero_error_epoch: int | None = None
        self.metrics: dict[str, float] = {}
        self.analysis: Any = None
        self.result_path: Path | None = None  # the .pt of the last analysis (rank 0)
        self.history: list[dict[str, float]] = []
        self._previous_support: list[int] = []
        self._previous_patterns: Tensor | None = None
        self._epoch: int | None = None
        self._train_started = False
        self._scope: Scope | None = None  # what is analysed, chosen once on the first training samples
        self._warn = WarnOnce()
        self._monitor = ZeroErrorMonitor(batch_size, probe_size, seed, self._warn)
        self._reporter = Reporter(save_dir, max_images, self.image_shape)
        # rows of X Xᵀ of the last support, reused by a repeated analysis (8·m·s bytes; not checkpointed)
        self._gram_cache = InputGramCache()

    @property
    def options(self) -> AnalysisOptions:
        """How the max-margin classifier is fitted, from the callback's arguments."""
        return AnalysisOptions(intercept=self.intercept, C=self.C, delta=self.delta, kernel=self.kernel,
                               max_dense_bytes=self.max_dense_bytes, multiclass=self.multiclass, solver=self.solver,
                               time_budget=self.time_budget)

    @property
    def request(self) -> ScopeRequest:
        """What the arguments ask to analyse."""
        return ScopeRequest(self.scope, self.path_module, self.embedding)

    @property
    def state_key(self) -> str:
        return self._generate_state_key(intercept=self.intercept, path_module=self.path_module)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        check_same_package(trainer, self)
        self._train_started, self._scope = False, None
        self._monitor.reset()
        if self.save_dir is not None:
            check_writable_folder(self.save_dir, f"NetworkSupportVectors: `save_dir={str(self.save_dir)!r}`")
        if self.request.names_head:
            find_head(pl_module, self.request)  # refused here, before any data, where it is not there
        datamodule = trainer.datamodule
        self._settle_scope(trainer, pl_module, getattr(datamodule, "train_dataset", None) if datamodule else None)

    def _settle_scope(self, trainer: pl.Trainer, pl_module: pl.LightningModule, dataset: Dataset | None) -> None:
        """Decide the scope on the first training samples, once (at setup where the data module holds them, else at
        the start of training or of the analysis), and check the analysed part's outputs against the classes."""
        if self._scope is not None or dataset is None or not len(dataset):
            return
        self._scope = choose(pl_module, dataset, self.request, self.options)
        check_head_fits_classes(self._scope, trainer.datamodule)
        if self._scope.num_outputs > 1 and self.intercept:
            raise ValueError(
                f"{self._scope.name} has {self._scope.num_outputs} outputs: the multi-class analysis is the max-margin "
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
        dataset = train_dataset(trainer)
        if len(dataset) == 0:
            raise ValueError(
                "NetworkSupportVectors: the training set is empty, so there is nothing to analyse; check the data "
                "module's `m`, split and files"
            )
        if trains_on_part(trainer):
            rank_zero_warn(
                f"NetworkSupportVectors: `limit_train_batches={trainer.limit_train_batches}` trains on part of the training set, but zero "
                f"training error is checked and the SVM fitted on all {len(dataset)} training samples. Pass a "
                "data module with `m` set to the samples you train on to analyse just those."
            )
        self._settle_scope(trainer, pl_module, dataset)
        check_cost(trainer, self._scope, pl_module, dataset, len(val_dataset(trainer) or ()), self.time_budget,
                   lambda text: self._reporter.say(trainer, text))

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._train_started and trainer.limit_train_batches != 0 and trainer.num_training_batches == 0:
            say_no_training_batches(trainer)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if trainer.global_step == 0 and batch_idx == 0:
            self._settle_scope(trainer, pl_module, train_dataset(trainer))  # fast_dev_run: not at on_train_start
            self._monitor.check_first_batch(self._scope, pl_module, batch)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._should_skip(trainer):
            return
        self._run_check(trainer, pl_module)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.zero_error_epoch is not None or trainer.fast_dev_run or self._monitor.single_class is not None:
            return  # analysed, skipped, or a training set of one class (said)
        dataset = train_dataset(trainer)
        wrong = self._monitor.count_errors(self._scope, trainer, dataset, pl_module)
        epochs = trainer.current_epoch
        if wrong == 0 and not self._monitor.diverged:
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
                      self._monitor.diverged else self._monitor.duplicates_said(self._scope, dataset) or "Train longer (resume from the last "
                      "checkpoint with a larger max_epochs), raise the learning rate or widen the network.")
            rank_zero_warn(
                f"NetworkSupportVectors: zero training error was not reached within max_epochs={trainer.max_epochs} "
                f"({wrong} of {len(dataset)} training samples misclassified at the end), so there are no network "
                f"support vectors. {advice}"
            )
            log_scalars(trainer, {"nsv/zero_error_reached": 0.0}, max(epochs - 1, 0))  # the last epoch, on rank 0
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
            "hard": list(self._monitor.hard),
            "previous_support": list(self._previous_support),
            "previous_patterns": self._previous_patterns,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.zero_error_epoch = state_dict.get("zero_error_epoch")
        self.metrics = dict(state_dict.get("metrics", {}))
        self.history = [dict(h) for h in state_dict.get("history", [])]
        self._monitor.hard = list(state_dict.get("hard", []))
        self._previous_support = list(state_dict.get("previous_support", []))
        self._previous_patterns = state_dict.get("previous_patterns")

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
        if not reached and self._monitor.single_class is None:
            dataset = train_dataset(trainer)
            wrong = self._monitor.count_errors(self._scope, trainer, dataset, pl_module)
            rank_zero_warn(
                f"NetworkSupportVectors: the checkpoint's network misclassifies {wrong} of {len(dataset)} training "
                "samples, so there are no network support vectors; "
                + (self._monitor.duplicates_said(self._scope, dataset) or "analyse a checkpoint taken at zero training error")
            )
        return reached

    def dashboard_charts(self) -> tuple[str, dict[str, list[Any]]]:
        """The "support vectors" category of the custom-scalars layout."""
        per_class = self._scope is not None and self._scope.num_outputs > 1
        return nsv_charts("nsv/", per_class=per_class, repeated=not self.stop_on_zero_error)

    def dashboard_headline(self) -> list[str]:
        """The tags the HParams table shows as its first metric columns."""
        return [f"nsv/{key}" for key in HEADLINE]

    def _should_skip(self, trainer: pl.Trainer) -> bool:
        return skips_epoch(trainer, self.every_n_epochs, analysed=self.zero_error_epoch is not None
                           and self.stop_on_zero_error)

    def _current_epoch(self, trainer: pl.Trainer) -> int:
        return trainer.current_epoch if self._epoch is None else self._epoch

    def _run_check(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> bool:
        dataset = train_dataset(trainer)
        self._settle_scope(trainer, pl_module, dataset)
        non_finite, frozen = first_non_finite_parameter(pl_module), None
        if non_finite is None:
            try:
                frozen = self._scope.freeze()  # the analysed function with the current weights (traced once)
            except NonFiniteError as err:
                non_finite = f"the float64 forward of the first training samples is not finite ({err})"
        if non_finite is not None:
            self._monitor.warn_diverged(non_finite, dataset)
            clean = False
        else:
            with eval_mode(pl_module), torch.no_grad():
                clean = self._monitor.zero_error_here(self._scope, trainer, dataset, frozen, pl_module,
                                                      self._current_epoch(trainer))
        reached = trainer.strategy.reduce_boolean_decision(clean, all=True)
        if not reached or not self._monitor.trustworthy(self._scope, trainer):
            return False
        metrics = None
        directory = self._reporter.output_dir(trainer)  # Trainer.log_dir is a collective: every rank asks for it
        share = distributed(trainer) and self._scope.shares_columns(self.options)
        if trainer.is_global_zero:
            with ColumnSharing() if share else contextlib.nullcontext() as sharing:
                metrics = self._analyse(trainer, pl_module, dataset, frozen, directory, sharing)
        elif share:  # the other ranks compute their shard of every kernel column block rank 0 asks for
            self._scope.serve(frozen, embed_all(self._scope, dataset, pl_module, self.batch_size)[0])
        metrics = trainer.strategy.broadcast(metrics, src=0)
        if self.zero_error_epoch is None:
            self.zero_error_epoch = self._current_epoch(trainer)
        self._record(metrics, trainer)
        self._reporter.publish(trainer, pl_module, metrics, self.zero_error_epoch, self._current_epoch(trainer))
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

    def _analyse(self, trainer, pl_module, dataset, frozen, directory: Path,
                 sharing: ColumnSharing | None = None) -> dict[str, float]:
        """Rank 0's analysis: the embedded data (kept by the zero-error pass, with the whole network's gates), the
        max-margin fit, the result file, the report and the figures."""
        scope, options, epoch = self._scope, self.options, self._current_epoch(trainer)
        kept = self._monitor.take_kept()
        if kept:
            x_train, y_train = torch.cat([b[0] for b in kept]), torch.cat([b[1] for b in kept])
            gates = scope.join_gates([b[2] for b in kept])
        else:
            (x_train, y_train), gates = embed_all(scope, dataset, pl_module, self.batch_size), None
        val = val_dataset(trainer)
        x_val, y_val = (embed_all(scope, val, pl_module, self.batch_size) if val is not None and len(val)
                        else (None, None))
        if x_val is not None and not self._monitor.usable_validation(scope, x_val, y_val, x_train.shape[1:]):
            x_val = y_val = None

        def fit(say, progress: bool):
            return scope.analyse(frozen, x_train, y_train, x_val, y_val, options, sharing,
                                 initial=self._previous_support or None, gates=gates, say=say, progress=progress,
                                 cache=None if self.stop_on_zero_error else self._gram_cache)  # kept for the next

        self.analysis = analysis = self._reporter.fit_with_progress(trainer, scope.fitting_text(options), len(y_train),
                                                                    epoch, fit, scope)
        self.result_path, sink = self._reporter.save_and_report(trainer, pl_module, directory, scope, analysis, frozen,
                                                                x_train, y_train, options, epoch)
        metrics = analysis.to_metrics()
        if not self.history:  # one HParams session per run: the first analysis registers the metrics
            register_nsv_hparams(trainer, pl_module, metrics)
        packed = scope.patterns(frozen, x_train, gates)  # the pass's gates: no second float64 forward
        changed = patterns_changed(self._previous_patterns, packed)
        self._previous_patterns = packed if packed is not None else self._previous_patterns
        if changed is not None:
            metrics["patterns_changed"] = float(changed)
        self._reporter.log_figures(trainer, dataset, scope, frozen, x_train.cpu(), y_train, analysis, metrics, epoch,
                                   sink, self.history)
        return {**metrics, "_support": analysis.svm.support_.tolist()}

