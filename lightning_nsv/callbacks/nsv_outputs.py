"""The outputs of :class:`~lightning_nsv.callbacks.NetworkSupportVectors`: what it prints around the fit, the saved
artifact, the markdown report (TensorBoard's Text tab), the HParams registration and the figures."""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor

from lightning_nsv.artifacts import class_path, plain, save_support_vectors
from lightning_nsv.callbacks.dashboard import (hparams_metrics, log_scalars, register_hparams,
                                               write_layout)
from lightning_nsv.callbacks.nsv_data import gather
from lightning_nsv.callbacks.sinks import FigureSink, log_directory
from lightning_nsv.compat import pl, rank_zero_info
from lightning_nsv.analysis.binary import SupportVectorAnalysis
from lightning_nsv.scope import AnalysisOptions, Scope
from lightning_nsv.solver import solver_progress


def _seconds(elapsed: float) -> str:
    return f"{elapsed:.1f} s" if elapsed >= 1 else f"{elapsed * 1000:.0f} ms"


class SolverBar:
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


def markdown_report(epoch: int, analysis: SupportVectorAnalysis, report: str) -> str:
    rows = "\n".join(f"| `nsv/{key}` | {value:.6g} |" for key, value in analysis.to_metrics().items())
    report = report.replace("\n", "  \n")
    return f"**Network support vectors at epoch {epoch}**  \n{report}\n\n| metric | value |\n|---|---|\n{rows}"


def register_nsv_hparams(trainer: pl.Trainer, pl_module: pl.LightningModule, metrics: dict[str, float]) -> None:
    """The run's HParams session (:func:`~lightning_nsv.callbacks.dashboard.register_hparams`): the headline metrics
    of the Trainer's analysis callbacks first, then the rest of this analysis' (the table reads the scalars)."""
    register_hparams(trainer, {"model": pl_module, "data": trainer.datamodule},
                     hparams_metrics(trainer, [f"nsv/{key}" for key in metrics]))


class Reporter:
    """What :class:`NetworkSupportVectors` says, saves and logs at an analysis: results under ``save_dir`` (default
    ``<log_dir>/nsv``), up to ``max_images`` support vectors drawn (flat inputs as ``image_shape``). Everything it
    reports comes in as arguments."""

    def __init__(self, save_dir: str | None, max_images: int, image_shape: tuple[int, ...] | None) -> None:
        self.save_dir, self.max_images, self.image_shape = save_dir, max_images, image_shape
        self.said: set[str] = set()  # what was said once

    def fit_with_progress(self, trainer, how: str, m: int, epoch: int,
                          fit: Callable[[Callable[[str], None], bool], Any], scope: Scope) -> Any:
        """``fit(say, progress)``, said before and after, with a solver bar where the Trainer shows a progress bar."""
        self.say(trainer, f"NetworkSupportVectors: zero training error at epoch {epoch} on all {m} "
                          f"training samples; computing the {how} for m = {m:,} and the max-margin classifier ...")
        started = time.perf_counter()
        bar = trainer.progress_bar_callback
        progress = SolverBar(enabled=bar is not None and getattr(bar, "is_enabled", False))
        try:
            with solver_progress(progress):
                analysis = fit(lambda text: self.say(trainer, f"NetworkSupportVectors: {text}"), progress.enabled)
        finally:
            progress.close()
        self.say(trainer, f"NetworkSupportVectors: analysis done in {_seconds(time.perf_counter() - started)}\n"
                          + scope.report(analysis))
        return analysis

    def save_and_report(self, trainer, pl_module, directory: Path, scope: Scope, analysis: Any, frozen: Any,
                        x_train: Tensor, y_train: Tensor, options: AnalysisOptions, epoch: int) -> tuple[Path, FigureSink]:
        """Save the artifact and send the markdown report to the loggers; returns the file and the sink of the
        figures."""
        path = self.save(trainer, pl_module, directory, scope, analysis, frozen, x_train, y_train, options, epoch)
        self.say(trainer, f"NetworkSupportVectors: saved {path} and its summary "
                          f"{path.with_suffix('.json').name} (lightning_nsv.artifacts.load_support_vectors)")
        write_layout(trainer)  # once per run
        sink = FigureSink(trainer.loggers, directory / "figures", "NetworkSupportVectors")
        sink.text("nsv/report", markdown_report(epoch, analysis, scope.report(analysis)), trainer.global_step)
        return path, sink

    def log_figures(self, trainer, dataset, scope: Scope, frozen: Any, x_train: Tensor, y_train: Tensor,
                    analysis: Any, metrics: dict[str, float], epoch: int, sink: FigureSink,
                    history: list[dict[str, float]]) -> None:
        """The summary card, the approach to the max-margin classifier (from the second analysis on: ``history``),
        the support vectors, and the scope's own figures (a binary head's decision boundaries and path weights)."""
        from lightning_nsv.plotting import plot_summary_card

        sink.figure("nsv/summary", plot_summary_card(metrics, epoch, scope=scope.label)[0], trainer.global_step)
        if history:
            from lightning_nsv.plotting import plot_max_margin_approach

            series = [*history, {"epoch": float(epoch), **metrics}]
            sink.figure("nsv/max_margin_approach", plot_max_margin_approach(
                [max(h["epoch"], 1.0) for h in series], [h["cosine_wbar_v"] for h in series],
                [h.get("margin_ratio", float("nan")) for h in series])[0], trainer.global_step)
        self._log_support_vectors(trainer, dataset, analysis, sink)
        for tag, figure in scope.figures(frozen, x_train, y_train, analysis):
            sink.figure(tag, figure, trainer.global_step)

    @staticmethod
    def publish(trainer: pl.Trainer, pl_module: pl.LightningModule, metrics: dict[str, float], zero_error_epoch: int,
                epoch: int) -> None:
        """The analysis' numbers, ``nsv/zero_error_epoch`` and ``nsv/zero_error_reached`` = 1 to ``callback_metrics``
        on every rank (``pl_module.log(..., logger=False)``) and once to the loggers, TensorBoard's against the epoch
        (:func:`~lightning_nsv.callbacks.dashboard.log_scalars`): repeated analyses draw curves over epochs, and no
        number reaches TensorBoard twice (through Lightning at the global step as well)."""
        logged = {f"nsv/{key}": value for key, value in metrics.items()}
        logged.update({"nsv/zero_error_epoch": float(zero_error_epoch), "nsv/zero_error_reached": 1.0})
        for tag, value in logged.items():
            pl_module.log(tag, value, on_step=False, on_epoch=True, logger=False)
        log_scalars(trainer, logged, epoch)

    @staticmethod
    def say(trainer: pl.Trainer, text: str) -> None:
        """Print on lines of its own: through the progress bar where one is shown, else the rank-zero log."""
        bar = trainer.progress_bar_callback
        if bar is not None and getattr(bar, "is_enabled", False) and callable(getattr(bar, "print", None)):
            bar.print(text)
        else:
            rank_zero_info(text)

    def output_dir(self, trainer: pl.Trainer) -> Path:
        return Path(self.save_dir) if self.save_dir else log_directory(trainer) / "nsv"

    @staticmethod
    def save(trainer, pl_module, directory: Path, scope: Scope, analysis: Any, frozen: Any, x_train: Tensor,
             y_train: Tensor, options: AnalysisOptions, epoch: int) -> Path:
        """The result file: what every result holds, and the scope's part (:meth:`~lightning_nsv.scope.Scope.payload`)."""
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
            "epoch": epoch,
            "global_step": trainer.global_step,
            "metrics": analysis.to_metrics(),
        }
        payload = {**common, **scope.payload(analysis, frozen, x_train, y_train, options)}
        return save_support_vectors(directory, f"support_vectors_epoch{epoch}", payload, report=scope.report(analysis))

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
        images, labels = gather(dataset, [int(i) for i in order])
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
        if message not in self.said:
            self.said.add(message)
            self.say(trainer, message)
        return None
