"""Where the callbacks' figures, histograms and text go, whatever the loggers are.

Loggers are told apart by what they can do, not by class, so TensorBoard of either Lightning package, W&B,
MLflow and others are served:

- an ``experiment`` with ``add_figure`` (TensorBoard's ``SummaryWriter``): figures, histograms, text;
- a ``log_image(key, images, step)`` method (W&B, Neptune, …): figures as RGB arrays;
- anything else, or no logger at all: PNG (and markdown) files under ``<directory>``, announced once.

Nothing is dropped silently. Call these on the rank that logs (rank 0).
"""
from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from lightning_nsv.atomic import save_figure, write_text
from lightning_nsv.compat import rank_zero_info

__all__ = ["FigureSink", "check_writable_folder", "log_directory"]


def check_writable_folder(folder: Any, label: str) -> None:
    """Refuse, before training, a ``folder`` (named ``label`` in the message) that results could not be saved to: an
    existing file, a path under a file, or one whose nearest existing folder refuses a new entry (probed with a
    temporary folder, removed at once)."""
    path = Path(folder)
    existing = next(p for p in (path, *path.parents) if p.exists())
    after = "so no result could be saved there after training"
    if not existing.is_dir():
        where = "is an existing file" if existing == path else f"lies under the existing file {existing}"
        raise NotADirectoryError(f"{label} {where}, {after}; name a directory")
    try:
        tempfile.TemporaryDirectory(dir=existing).cleanup()
    except OSError as error:
        raise PermissionError(f"{label} cannot be created: {existing} takes no new folder ({error.strerror}), "
                              f"{after}; name a writable directory") from error


def log_directory(trainer: Any) -> Path:
    """``trainer.log_dir``, or ``default_root_dir`` without a logger. ``Trainer.log_dir`` is a collective under
    DDP: every rank must ask for it."""
    return Path(trainer.log_dir or trainer.default_root_dir)


def _file_stem(tag: str, step: int) -> str:
    return f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', tag)}_step{step}"


def _rgb(figure: Any) -> np.ndarray:
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # the package's figures have no backend canvas

    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


class FigureSink:
    """Figures, histograms and markdown for ``trainer.loggers``, with files under ``directory`` as fallback.

    Args:
        loggers: the Trainer's loggers (``trainer.loggers``).
        directory: where files go for loggers without an image API (e.g. ``<log_dir>/figures``).
        owner: name used in the announcement.
        dpi: resolution of the PNG files.
    """

    def __init__(self, loggers: list[Any], directory: str | Path, owner: str, dpi: int = 150) -> None:
        self.loggers = list(loggers)
        self.directory = Path(directory)
        self.owner = owner
        self.dpi = dpi
        self._announced = False

    def _writers(self) -> list[Any]:
        return [lg.experiment for lg in self.loggers if hasattr(getattr(lg, "experiment", None), "add_figure")]

    def _image_loggers(self) -> list[Any]:
        return [lg for lg in self.loggers if not hasattr(getattr(lg, "experiment", None), "add_figure")
                and callable(getattr(lg, "log_image", None))]

    @property
    def needs_files(self) -> bool:
        """True where some logger (or the lack of one) cannot take figures."""
        served = len(self._writers()) + len(self._image_loggers())
        return served < max(1, len(self.loggers))

    def _announce(self, what: str) -> None:
        if not self._announced:
            names = sorted({type(lg).__name__ for lg in self.loggers})
            where = f"({', '.join(names)} cannot show them)" if names else "(no logger is attached)"
            rank_zero_info(f"{self.owner}: {what} go to {self.directory} {where}")
            self._announced = True

    def figure(self, tag: str, figure: Any, step: int) -> None:
        """Log ``figure`` under ``tag`` and close it."""
        import matplotlib.pyplot as plt

        try:
            for writer in self._writers():
                writer.add_figure(tag, figure, step, close=False)
            image_loggers = self._image_loggers()
            if image_loggers:
                image = _rgb(figure)
                for logger in image_loggers:
                    logger.log_image(key=tag, images=[image], step=step)
            if self.needs_files:
                self._announce("figures")
                save_figure(figure, self.directory / f"{_file_stem(tag, step)}.png", dpi=self.dpi,
                            bbox_inches="tight")
        finally:
            plt.close(figure)

    def histogram(self, tag: str, values: np.ndarray, step: int) -> None:
        """TensorBoard histogram where there is a writer; elsewhere the caller's figure of it stands for it."""
        for writer in self._writers():
            writer.add_histogram(tag, values, step)

    def text(self, tag: str, markdown: str, step: int) -> None:
        """Markdown text: TensorBoard's Text tab, else a ``.md`` file."""
        writers = self._writers()
        for writer in writers:
            writer.add_text(tag, markdown, step)
        if len(writers) < max(1, len(self.loggers)):
            self._announce("figures and reports")
            write_text(self.directory / f"{_file_stem(tag, step)}.md", markdown + "\n")
