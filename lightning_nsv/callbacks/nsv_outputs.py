"""The outputs of :class:`~lightning_nsv.callbacks.NetworkSupportVectors`: what it prints around the fit, the saved
artifact, the markdown report (TensorBoard's Text tab), the HParams registration and the figures."""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lightning_nsv.artifacts import class_path, plain, save_support_vectors
from lightning_nsv.callbacks.dashboard import (HEADLINE, hparams_metrics, log_scalars, nsv_charts, register_hparams,
                                               write_layout)
from lightning_nsv.callbacks.nsv_data import _gather
from lightning_nsv.callbacks.sinks import FigureSink, log_directory
from lightning_nsv.compat import pl, rank_zero_info
from lightning_nsv.analysis.binary import SupportVectorAnalysis
from lightning_nsv.kernel.sharded import ColumnSharing
from lightning_nsv.solver import solver_progress


def _seconds(elapsed: float) -> str:
    return f"{elapsed:.1f} s" if elapsed >= 1 else f"{elapsed * 1000:.0f} ms"


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


def _markdown_report(epoch: int, analysis: SupportVectorAnalysis, report: str) -> str:
    rows = "\n".join(f"| `nsv/{key}` | {value:.6g} |" for key, value in analysis.to_metrics().items())
    report = report.replace("\n", "  \n")
    return f"**Network support vectors at epoch {epoch}**  \n{report}\n\n| metric | value |\n|---|---|\n{rows}"


def _register_hparams(trainer: pl.Trainer, pl_module: pl.LightningModule, metrics: dict[str, float]) -> None:
    """The run's HParams session (:func:`~lightning_nsv.callbacks.dashboard.register_hparams`): the headline metrics
    of the Trainer's analysis callbacks first, then the rest of this analysis' (the table reads the scalars)."""
    register_hparams(trainer, {"model": pl_module, "data": trainer.datamodule},
                     hparams_metrics(trainer, [f"nsv/{key}" for key in metrics]))


class AnalysisOutputs:
    """What :class:`NetworkSupportVectors` prints, saves and logs at an analysis, a part of it (which holds the
    settings read here and ``_scope``, ``options``, ``_current_epoch`` and ``history``)."""

    def _fit_with_progress(self, trainer, net, x_train: Tensor, y_train: Tensor, x_val, y_val,
                           sharing: ColumnSharing | None, epoch: int, gates=None) -> SupportVectorAnalysis:
        """The max-margin fit, said before and after, with a solver bar where the Trainer shows a progress bar;
        ``gates``: those of ``x_train`` that the zero-error pass kept (the whole network's)."""
        m, how = len(y_train), self._scope.fitting_text(self.options)
        self._say(trainer, f"NetworkSupportVectors: zero training error at epoch {epoch} on all {m} "
                           f"training samples; computing the {how} for m = {m:,} and the max-margin classifier ...")
        started = time.perf_counter()
        bar = trainer.progress_bar_callback
        progress = _SolverBar(enabled=bar is not None and getattr(bar, "is_enabled", False))
        try:
            with solver_progress(progress):
                analysis = self._scope.analyse(
                    net, x_train, y_train, x_val, y_val, self.options, sharing, initial=self._previous_support or None,
                    cache=None if self.stop_on_zero_error else self._gram_cache,  # rows kept for the next analysis
                    gates=gates, say=lambda text: self._say(trainer, f"NetworkSupportVectors: {text}"),
                    progress=progress.enabled)
        finally:
            progress.close()
        self.analysis = analysis
        self._say(trainer, f"NetworkSupportVectors: analysis done in {_seconds(time.perf_counter() - started)}\n"
                           + self._scope.report(analysis))
        return analysis

    def _save_and_report(self, trainer, pl_module, directory: Path, analysis: SupportVectorAnalysis,
                         y_train: Tensor, net, x_train: Tensor, epoch: int) -> FigureSink:
        """Save the artifact and send the markdown report to the loggers; returns the sink of the figures."""
        self.result_path = self._save(trainer, pl_module, directory, analysis, y_train, net, x_train)
        self._say(trainer, f"NetworkSupportVectors: saved {self.result_path} and its summary "
                           f"{self.result_path.with_suffix('.json').name} (lightning_nsv.artifacts.load_support_vectors)")
        write_layout(trainer)  # once per run
        sink = FigureSink(trainer.loggers, directory / "figures", type(self).__name__)
        sink.text("nsv/report", _markdown_report(epoch, analysis, self._scope.report(analysis)), trainer.global_step)
        return sink

    def _log_figures(self, trainer, dataset, net, x_train: Tensor, y_train: Tensor, analysis: SupportVectorAnalysis,
                     metrics: dict[str, float], epoch: int, sink: FigureSink) -> None:
        """The summary card, the approach to the max-margin classifier (from the second analysis on), the support
        vectors, and for a binary head its decision boundaries and path weights."""
        from lightning_nsv.plotting import plot_summary_card

        sink.figure("nsv/summary", plot_summary_card(metrics, epoch, scope=self._scope.label)[0], trainer.global_step)
        if self.history:
            from lightning_nsv.plotting import plot_max_margin_approach

            series = [*self.history, {"epoch": float(epoch), **metrics}]
            sink.figure("nsv/max_margin_approach", plot_max_margin_approach(
                [max(h["epoch"], 1.0) for h in series], [h["cosine_wbar_v"] for h in series],
                [h.get("margin_ratio", float("nan")) for h in series])[0], trainer.global_step)
        self._log_support_vectors(trainer, dataset, analysis, sink)
        for tag, figure in self._scope.figures(net, x_train, y_train, analysis):
            sink.figure(tag, figure, trainer.global_step)

    def _publish(self, trainer: pl.Trainer, pl_module: pl.LightningModule, metrics: dict[str, float],
                 epoch: int) -> None:
        """The analysis' numbers, ``nsv/zero_error_epoch`` and ``nsv/zero_error_reached`` = 1 to ``callback_metrics``
        on every rank (``pl_module.log(..., logger=False)``) and once to the loggers, TensorBoard's against the epoch
        (:func:`~lightning_nsv.callbacks.dashboard.log_scalars`): repeated analyses draw curves over epochs, and no
        number reaches TensorBoard twice (through Lightning at the global step as well)."""
        logged = {f"nsv/{key}": value for key, value in metrics.items()}
        logged.update({"nsv/zero_error_epoch": float(self.zero_error_epoch), "nsv/zero_error_reached": 1.0})
        for tag, value in logged.items():
            pl_module.log(tag, value, on_step=False, on_epoch=True, logger=False)
        log_scalars(trainer, logged, epoch)

    def dashboard_charts(self) -> tuple[str, dict[str, list[Any]]]:
        """The "support vectors" category of the custom-scalars layout."""
        per_class = self._scope is not None and self._scope.num_outputs > 1
        return nsv_charts("nsv/", per_class=per_class, repeated=not self.stop_on_zero_error)

    def dashboard_headline(self) -> list[str]:
        """The tags the HParams table shows as its first metric columns."""
        return [f"nsv/{key}" for key in HEADLINE]

    def _say(self, trainer: pl.Trainer, text: str) -> None:
        """Print on lines of its own: through the progress bar where one is shown, else the rank-zero log."""
        bar = trainer.progress_bar_callback
        if bar is not None and getattr(bar, "is_enabled", False) and callable(getattr(bar, "print", None)):
            bar.print(text)
        else:
            rank_zero_info(text)

    def _output_dir(self, trainer: pl.Trainer) -> Path:
        return Path(self.save_dir) if self.save_dir else log_directory(trainer) / "nsv"

    def _save(self, trainer, pl_module, directory: Path, analysis: SupportVectorAnalysis, y_train: Tensor,
              net, x_train: Tensor) -> Path:
        datamodule = trainer.datamodule
        source = getattr(datamodule, "train_indices", None)
        module_hparams = getattr(pl_module, "hparams", None)
        common = {
            "module_class": class_path(pl_module),
            "module_hparams": plain(dict(module_hparams)) if module_hparams else None,
            "module_state": {k: v.detach().cpu().clone() for k, v in pl_module.state_dict().items()},
            "data_class": class_path(datamodule),
            "data_hparams": plain(dict(datamodule.hparams)) if getattr(datamodule, "hparams", None) else None,
            "train_indices": None if source is None else torch.as_tensor(source),
            "epoch": self._current_epoch(trainer),
            "global_step": trainer.global_step,
            "metrics": analysis.to_metrics(),
        }
        stem = f"support_vectors_epoch{self._current_epoch(trainer)}"
        payload = {**common, **self._scope.payload(analysis, net, x_train, y_train, self.options)}
        return save_support_vectors(directory, stem, payload, report=self._scope.report(analysis))

    def _log_support_vectors(self, trainer, dataset, analysis: SupportVectorAnalysis, sink: FigureSink) -> None:
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
        images = self._as_images(trainer, images)
        if images is None:
            return
        if analysis.svm.alpha_.ndim > 1:  # grouped by class, the largest α first within each
            grouped = sorted(range(len(order)), key=lambda j: (int(labels[j]), -per_sample[order[j]]))
            order, images, labels = order[grouped], images[grouped], labels[grouped]
        titles = [f"y={int(c)} α={short_number(a)}" for c, a in zip(labels, per_sample[order])]
        figure = image_grid(images, titles, total=len(support), max_images=self.max_images)[0]
        sink.figure("nsv/support_vectors", figure, step)

    def _as_images(self, trainer, samples: Tensor) -> Tensor | None:
        """``(n, C, H, W)`` samples as they are, flat ones reshaped to ``image_shape`` (the callback's, else the data
        module's); ``None``, said once, when neither tells how."""
        if samples.dim() == 4:
            return samples
        datamodule = trainer.datamodule
        shape = self.image_shape or getattr(datamodule, "image_shape", None) or getattr(datamodule, "input_shape", None)
        shape = tuple(shape) if shape is not None and len(shape) in (2, 3) else None
        size = samples[0].numel()
        if shape is not None and math.prod(shape) == size:
            return samples.reshape(len(samples), *(shape if len(shape) == 3 else (1, *shape)))
        why = (f"image_shape={shape} holds {math.prod(shape)} values, a sample {size}" if shape is not None
               else f"inputs of shape {tuple(samples.shape[1:])} are not images (C, H, W)")
        message = (f"NetworkSupportVectors: no support-vector image grid: {why}; pass "
                   "NetworkSupportVectors(image_shape=(C, H, W)) to draw flat inputs as images")
        if message not in self._warned:
            self._warned.add(message)
            self._say(trainer, message)
        return None
