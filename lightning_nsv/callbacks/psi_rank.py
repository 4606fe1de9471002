"""Rank of Ψ, the skip units' outputs on the training set, during training."""
from __future__ import annotations

from typing import Any, Literal

import torch
from torch.utils.data import DataLoader

from lightning_nsv.analysis import psi_spectrum_streaming, spectrum_summary
from lightning_nsv.analysis.psi import SMALL_SIDE, SPECTRA, check_streaming_memory
from lightning_nsv.callbacks.dashboard import (PSI_LOG_SCALE, hparams_metrics, log_scalars, psi_charts,
                                              register_hparams, with_log10, write_layout)
from lightning_nsv.callbacks.sinks import FigureSink, log_directory
from lightning_nsv.compat import Callback, pl, rank_zero_info, rank_zero_warn
from lightning_nsv.errors import NonFiniteError
from lightning_nsv.models.skip import SkipNetwork
from lightning_nsv.validate import check_choice, check_flag, check_integer


def _require_skip_network(callback: Callback, pl_module: pl.LightningModule) -> None:
    if not isinstance(pl_module, SkipNetwork):
        raise TypeError(
            f"{type(callback).__name__} works on a lightning_nsv.models.skip.SkipNetwork (it reads Ψ, the outputs of "
            f"the skip units), got {type(pl_module).__name__}; wrap your network: "
            "SkipNetwork(net, num_skip_units=..., mode=...)"
        )


def training_loader(callback: Callback, trainer: pl.Trainer, batch_size: int) -> DataLoader:
    """A non-shuffled loader over the whole training set (all ranks' samples): the datamodule's
    ``train_dataset``, else the dataset of the training DataLoader (outside ``fit`` only the former exists)."""
    dataset = getattr(trainer.datamodule, "train_dataset", None) if trainer.datamodule is not None else None
    if dataset is None:
        loader = trainer.train_dataloader
        if not isinstance(loader, DataLoader):
            raise RuntimeError(
                f"{type(callback).__name__} needs the training set as one DataLoader (or a datamodule with a "
                f"`train_dataset`), got {type(loader).__name__}"
            )
        dataset = loader.dataset
    # an own generator: iterating a DataLoader would otherwise draw from the global RNG of training
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, generator=torch.Generator())


class SkipNetworkMonitor(Callback):
    """The Lightning shell both monitors share: the schedule, the rank-0 computation and its broadcast, the
    logging of the same keys on every rank, figures to TensorBoard and checkpoint state. Subclasses
    implement :meth:`_compute` (rank 0 only) and name the results that have a figure in ``_figures``."""

    _figures: tuple[str, ...] = ()
    _headline: tuple[str, ...] = ()

    def __init__(self, every_n_epochs: int, batch_size: int, max_memory_bytes: int, log_figure: bool,
                 prefix: str) -> None:
        for name, value in (("every_n_epochs", every_n_epochs), ("batch_size", batch_size),
                            ("max_memory_bytes", max_memory_bytes)):
            check_integer(name, value, 1)  # numpy integers pass, bools do not
        check_flag("log_figure", log_figure, "; a string such as 'no' would count as True")
        if not isinstance(prefix, str):
            raise TypeError(f"`prefix` must be a string, the start of the logged keys (e.g. 'psi/'), got {prefix!r}")
        self.every_n_epochs, self.batch_size, self.max_memory_bytes = (int(every_n_epochs), int(batch_size),
                                                                       int(max_memory_bytes))
        self.log_figure, self.prefix = bool(log_figure), prefix
        self.last_epoch: int | None = None
        self._epoch: int | None = None  # the checkpoint's epoch during analyze_now
        self.last_metrics: dict[str, float] = {}
        self.failed_epoch: int | None = None  # the last epoch whose analysis met non-finite values

    @property
    def state_key(self) -> str:
        return self._generate_state_key(every_n_epochs=self.every_n_epochs, prefix=self.prefix)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        _require_skip_network(self, pl_module)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.fast_dev_run or (trainer.current_epoch + 1) % self.every_n_epochs:
            return
        self._run(trainer, pl_module)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        lines = self._summary() if self.last_metrics else []
        if self.failed_epoch is not None and (self.last_epoch is None or self.failed_epoch > self.last_epoch):
            above = f"; the result above is epoch {self.last_epoch}'s" if self.last_metrics else ""
            lines.append(f"the last analysis, at epoch {self.failed_epoch}, had no result: non-finite values "
                         f"(a diverged network?){above}")
        if lines:
            rank_zero_info("\n".join(f"{type(self).__name__}: {line}" for line in lines))

    def _compute(self, trainer: pl.Trainer, pl_module: SkipNetwork) -> dict[str, Any]:
        raise NotImplementedError

    def _summary(self) -> list[str]:
        """Lines of the end-of-fit summary, from :attr:`last_metrics` (so also after a resume)."""
        raise NotImplementedError

    def analyze_now(self, trainer: pl.Trainer, pl_module: SkipNetwork, epoch: int) -> None:
        """Run once outside the schedule (``lightning-nsv analyze``), with the checks of the start of training
        first; ``epoch`` is the checkpoint's."""
        self.on_train_start(trainer, pl_module)
        self._epoch = epoch
        try:
            self._run(trainer, pl_module)
        finally:
            self._epoch = None

    def _run(self, trainer: pl.Trainer, pl_module: SkipNetwork) -> None:
        directory = log_directory(trainer) / "figures"  # a collective: every rank asks
        results, failure, error = None, None, None
        if trainer.is_global_zero:
            try:
                results = self._compute(trainer, pl_module)
            except NonFiniteError as caught:
                failure = str(caught)
            except Exception as caught:  # the other ranks wait at the broadcast: they raise too, not hang
                if trainer.world_size == 1:
                    raise
                error = caught
                failure = f"{type(caught).__name__}: {caught}"
        metrics = None if results is None else {k: v for r in results.values() for k, v in r.to_metrics().items()}
        metrics, failure, fatal = trainer.strategy.broadcast((metrics, failure, error is not None), src=0)
        if fatal:
            if error is not None:
                raise error
            raise RuntimeError(f"{type(self).__name__} failed on rank 0: {failure}")
        if failure is not None:  # a diverged network: no analysis now, training goes on; warned once per such run
            if self.failed_epoch is None or (self.last_epoch is not None and self.last_epoch > self.failed_epoch):
                rank_zero_warn(f"{type(self).__name__}: no analysis at epoch {trainer.current_epoch} (nor at the next "
                               f"ones while this lasts): {failure}")
            self.failed_epoch = trainer.current_epoch
            return
        self._publish(trainer, pl_module, results, metrics, directory)

    def _publish(self, trainer: pl.Trainer, pl_module: SkipNetwork, results: dict[str, Any] | None,
                 metrics: dict[str, float], directory: Any) -> None:
        """The numbers to ``callback_metrics`` on every rank and, on rank 0, to the loggers against the epoch, the
        custom-scalars layout and the HParams session (once per run), the figures and the verdicts in the Text tab
        (``<prefix>report``)."""
        epoch = trainer.current_epoch if self._epoch is None else self._epoch
        logged = {self.prefix + key: value for key, value in self._logged(metrics).items()}
        for key, value in logged.items():
            pl_module.log(key, value, on_step=False, on_epoch=True, logger=False)
        self.last_epoch, self.last_metrics = epoch, dict(metrics)
        if results is None:  # the other ranks: rank 0 writes
            return
        write_layout(trainer)
        log_scalars(trainer, logged, epoch)
        register_hparams(trainer, {"model": pl_module, "data": trainer.datamodule}, hparams_metrics(trainer, logged))
        sink = FigureSink(trainer.loggers, directory, type(self).__name__)
        if self.log_figure:
            for name in self._figures:
                if name in results:
                    sink.figure(self.prefix + name, results[name].plot()[0], trainer.global_step)
        lines = "  \n".join(self._summary())
        sink.text(self.prefix + "report", f"**{type(self).__name__} at epoch {epoch}**  \n{lines}", trainer.global_step)

    def _logged(self, metrics: dict[str, float]) -> dict[str, float]:
        """The metrics that go to the loggers (all of them here)."""
        return metrics

    def dashboard_charts(self) -> tuple[str, dict[str, list[Any]]]:
        """This monitor's category of the custom-scalars layout
        (:func:`~lightning_nsv.callbacks.dashboard.write_layout`)."""
        raise NotImplementedError

    def dashboard_headline(self) -> list[str]:
        """The tags of this monitor that the HParams table shows among its first metric columns."""
        return [self.prefix + key for key in self._headline]

    def state_dict(self) -> dict[str, Any]:
        return {"last_epoch": self.last_epoch, "last_metrics": dict(self.last_metrics),
                "failed_epoch": self.failed_epoch}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.last_epoch = state_dict.get("last_epoch", self.last_epoch)
        self.last_metrics = dict(state_dict.get("last_metrics", self.last_metrics))
        self.failed_epoch = state_dict.get("failed_epoch", self.failed_epoch)


FAST_RETRY_AFTER = 10  # analyses that take the SVD directly after the fast route fell back to it


class PsiRankMonitor(SkipNetworkMonitor):
    """Logs the numerical rank and spectrum of Ψ (N×M) of a :class:`~lightning_nsv.models.skip.SkipNetwork`.

    Every ``every_n_epochs`` training epochs, Ψ is computed over the whole training set (a non-shuffled
    pass over ``trainer.train_dataloader.dataset``, float64 copy of the hidden layers in eval mode) and
    its rank, with the tolerance ``σ_max · max(N, M) · eps`` of DESIGN §3, is compared with N: rank N is the
    condition of Lemma 3.2 / Theorem 3.4. Rank 0 computes, the numbers are broadcast, every rank logs the
    same keys. Skipped during sanity checking and ``fast_dev_run``.

    Memory: Ψ takes ``8·N·M`` bytes. Up to ``max_memory_bytes`` Ψ is assembled and σ_min, σ_max and the rank
    come from :func:`~lightning_nsv.analysis.psi_spectrum`: by default (``spectrum="fast"``) without a full SVD
    (Gram matrix, Cholesky, block Krylov with triangular solves, Rayleigh–Ritz with Ψ itself and residual
    certificates; a pivoted Cholesky and a probabilistic bound on the remainder when Ψ is rank-deficient; the full
    SVD whenever a certificate fails; the figure shows the largest and smallest singular values it has), with
    ``spectrum="full"`` by a full SVD (all singular values); timings in ``benchmarks/results/psi_rank.md``.
    Above the limit, Ψ is never held: the R factor of a QR factorisation of Ψ (M×M, when M <= N,
    updated over batches of rows in one pass over the data) or of Ψᵀ (N×N, when M > N, updated over column
    chunks of Ψ, one pass per chunk) is accumulated in float64 and its singular values, which are Ψ's,
    are taken; only ``min(N, M)²`` float64 plus a buffer of rows that fills the rest of the limit are held.
    Unlike the Gram matrix ΨᵀΨ, R does not square the condition number, so this route keeps the SVD's
    accuracy and tolerance (see :func:`~lightning_nsv.analysis.psi_spectrum_streaming`). If the limit is below
    ``16·min(N, M)²`` bytes too, training stops at its start with an error that says so.

    **Logged metrics** (``prefix`` defaults to ``"psi/"``), at the end of a training epoch, to ``callback_metrics``
    (``pl_module.log(..., logger=False)``) and to the loggers once, TensorBoard's against the epoch
    (:func:`~lightning_nsv.callbacks.dashboard.log_scalars`; the "Ψ" category of its Custom Scalars tab draws the
    rank against N):

    - ``psi/rank``: numerical rank of Ψ.
    - ``psi/sigma_min``: smallest of the min(N, M) singular values.
    - ``psi/sigma_max``: largest singular value.
    - ``psi/condition_number``: ``sigma_max / sigma_min`` (inf when ``sigma_min`` is 0).
    - ``psi/num_samples``: N.
    - ``psi/num_units``: M.
    - ``psi/full_rank``: 1.0 if rank = N, else 0.0.
    - ``psi/log10_sigma_min``, ``psi/log10_condition_number``: their log10, where finite and positive (the Custom
      Scalars tab draws these: σ_min spans 1e-15 to 1e2).

    Figure (TensorBoard, an image-logging logger, or PNG files under ``<log_dir>/figures``): ``psi/spectrum``,
    the singular values on a log scale with the tolerance.

    At each analysis that line goes to TensorBoard's Text tab (``psi/report``; a ``.md`` file for other loggers), and
    at the end of fit, rank zero prints it (``rank_zero_info``), e.g. ``PsiRankMonitor: Ψ: N=400,
    M=464, rank 347 < N (σ_min 3.1e-15, cond 2.4e+18): the no-bad-valley condition does not hold``.

    A Ψ with NaN or inf (a diverged network) has no spectrum: that analysis logs nothing, a warning (once until
    an analysis succeeds again) names the rows, training goes on, ``failed_epoch`` records the epoch and the
    end-of-fit summary says so. Under DDP an error on rank 0, which computes, is raised on every rank (the others
    would wait for its broadcast).

    Args:
        every_n_epochs: Run after every n-th training epoch.
        batch_size: Samples per forward pass when computing Ψ.
        max_memory_bytes: Largest Ψ (``8·N·M`` bytes) to assemble; above it the streaming QR route is taken.
        log_figure: Send the spectrum figure to the loggers (or files).
        prefix: Prefix of the logged keys and the figure tag.
        spectrum: ``"fast"`` (default: σ_min, σ_max and the rank without a full SVD, certified, SVD fallback;
            after a fallback the next :data:`FAST_RETRY_AFTER` analyses take the SVD directly, since an
            uncertifiable Ψ costs the fast route more than the SVD) or ``"full"`` (all singular values, a full SVD).

    Raises:
        ValueError: On a non-positive ``every_n_epochs``, ``batch_size`` or ``max_memory_bytes``, an unknown
            ``spectrum``; from
            ``on_train_start`` when even the streaming route does not fit ``max_memory_bytes``.
        TypeError: On a non-integer ``every_n_epochs``, ``batch_size`` or ``max_memory_bytes`` (a bool included), a
            ``log_figure`` that is not a bool, a ``prefix`` that is not a string; from ``setup`` when the
            LightningModule is not a ``SkipNetwork``.

    Example::

        >>> monitor = PsiRankMonitor(every_n_epochs=5)
        >>> trainer = pl.Trainer(callbacks=[monitor], max_epochs=20)  # doctest: +SKIP
        >>> trainer.fit(SkipNetwork.mlp(64, [128] * 6, 10, num_skip_units=500), datamodule=dm)  # doctest: +SKIP
    """

    _figures = ("spectrum",)
    _headline = ("rank", "full_rank", "sigma_min")

    def __init__(
        self,
        every_n_epochs: int = 1,
        batch_size: int = 1024,
        max_memory_bytes: int = 2**30,
        log_figure: bool = True,
        prefix: str = "psi/",
        spectrum: Literal["full", "fast"] = "fast",
    ) -> None:
        super().__init__(every_n_epochs, batch_size, max_memory_bytes, log_figure, prefix)
        check_choice("spectrum", spectrum, SPECTRA)
        self.spectrum = spectrum
        self._svd_until = 0  # after a fallback of the fast route, the SVD directly up to this analysis
        self._analyses = 0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # on every rank, so that all of them stop rather than wait for rank 0 at the broadcast
        n = len(training_loader(self, trainer, self.batch_size).dataset)
        check_streaming_memory(n, pl_module.num_units, self.max_memory_bytes)

    def _compute(self, trainer: pl.Trainer, pl_module: SkipNetwork) -> dict[str, Any]:
        loader = training_loader(self, trainer, self.batch_size)
        n, m = len(loader.dataset), pl_module.num_units
        self._analyses += 1
        route = "full" if self.spectrum == "fast" and self._analyses <= self._svd_until else self.spectrum
        spectrum = psi_spectrum_streaming(lambda cols: pl_module.iter_psi(loader, cols), n, m,
                                          self.max_memory_bytes, route)
        if route == "fast" and spectrum.method == "svd" and min(n, m) > SMALL_SIDE:
            # a Ψ the fast route cannot certify (rank-deficient or nearly so) costs it more than the SVD it ends
            # with; such a Ψ usually stays so for a while: the SVD directly for the next analyses, then retry
            self._svd_until = self._analyses + FAST_RETRY_AFTER
            rank_zero_info(f"{type(self).__name__}: the fast route could not certify σ_min and the rank of this "
                           f"Ψ (N={n}, M={m}) and fell back to the full SVD; the next {FAST_RETRY_AFTER} analyses "
                           "take the SVD directly, then the fast route is tried again")
        return {"spectrum": spectrum}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "analyses": self._analyses, "svd_until": self._svd_until}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._analyses = int(state_dict.get("analyses", self._analyses))
        self._svd_until = int(state_dict.get("svd_until", self._svd_until))

    def _summary(self) -> list[str]:
        return [spectrum_summary(self.last_metrics)]

    def _logged(self, metrics: dict[str, float]) -> dict[str, float]:
        """All metrics, and σ_min and the condition number also as log10 (they span decades)."""
        return with_log10(metrics, PSI_LOG_SCALE)

    def dashboard_charts(self) -> tuple[str, dict[str, list[Any]]]:
        return psi_charts(self.prefix)
