"""What a comparison of support sets writes (:func:`write_comparison`: CSVs, report, figures) and the most frequent
support vectors as images (:func:`support_images`, which rebuilds the runs' data module: the only part of
:mod:`lightning_nsv.compare` that reads data; the figures are drawn by :mod:`lightning_nsv.plotting`)."""
from __future__ import annotations

import importlib
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from lightning_nsv.compare.support_sets import IMAGE_COUNT, ImagesUnavailable, SupportSetComparison, _label
from lightning_nsv.atomic import save_figure, write_text


def support_images(comparison: SupportSetComparison, n: int = IMAGE_COUNT,
                   datamodule: Any = None) -> tuple[torch.Tensor, np.ndarray]:
    """The ``n`` most frequent support vectors (:meth:`SupportSetComparison.most_frequent`) as images
    ``(n, C, H, W)``, with their dataset indices.

    The inputs come from ``datamodule`` or from the runs' data module rebuilt from its recorded class and
    arguments (as :func:`~lightning_nsv.artifacts.reproduce` does; this imports Lightning and reads the data).
    Inputs of 2 or 3 dimensions per sample are images; flat inputs are reshaped to the data module's
    ``input_shape`` where it has 2 or 3 dimensions.

    Raises:
        ImagesUnavailable: no data module recorded, it cannot be rebuilt here (files missing, …), it draws other
            training samples, or its inputs are flat with no known image shape; the message says which, in a line.
    """
    if datamodule is None:
        datamodule = _rebuild_datamodule(comparison)
    else:
        datamodule.setup("fit")
    name = type(datamodule).__name__
    dataset = getattr(datamodule, "train_dataset", None)
    if dataset is None or len(dataset) != comparison.m:
        raise ImagesUnavailable(f"{name}'s training set has {None if dataset is None else len(dataset)} samples, "
                                f"the runs {comparison.m}")
    wanted = comparison.most_frequent(n)
    rebuilt = getattr(datamodule, "train_indices", None)
    if rebuilt is None or not comparison.indices_recorded:
        positions = np.searchsorted(comparison.train_indices, wanted)
    else:
        rebuilt = np.asarray(rebuilt, dtype=np.int64)
        order = np.argsort(rebuilt)
        if not np.array_equal(rebuilt[order], comparison.train_indices):
            raise ImagesUnavailable(f"{name} rebuilt here draws other training samples than the runs")
        positions = order[np.searchsorted(rebuilt[order], wanted)]
    x = torch.stack([torch.as_tensor(dataset[int(p)][0]) for p in positions]) if len(positions) else None
    if x is None:
        raise ImagesUnavailable("no run has a support vector")
    shape = tuple(getattr(datamodule, "input_shape", ()) or ())
    if x.dim() == 3:
        x = x.unsqueeze(1)
    elif x.dim() == 2 and len(shape) in (2, 3) and math.prod(shape) == x.shape[1]:
        x = x.reshape(len(x), *shape)
        x = x.unsqueeze(1) if len(shape) == 2 else x
    elif x.dim() != 4:
        raise ImagesUnavailable(f"{name}'s inputs are flat ({tuple(x.shape[1:])}) and it names no image shape "
                                "(`input_shape` of 2 or 3 dimensions), so they are not drawn as images")
    return x, wanted


def _rebuild_datamodule(comparison: SupportSetComparison) -> Any:
    if comparison.data_class is None:
        raise ImagesUnavailable("the result files record no data module to read the inputs from")
    try:
        module, _, name = comparison.data_class.rpartition(".")
        datamodule = getattr(importlib.import_module(module), name)(**(comparison.data_hparams or {}))
        datamodule.setup("fit")
    except Exception as error:  # any failure to rebuild means: no images, said in one line
        reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise ImagesUnavailable(f"{comparison.data_class.rpartition('.')[2]} cannot be rebuilt here "
                                f"({type(error).__name__}: {reason})") from error
    return datamodule


def image_titles(comparison: SupportSetComparison, indices: np.ndarray) -> list[str]:
    """``"#<dataset index> y=<label> <c>/<k>"`` for each support vector of :func:`support_images`."""
    where = np.searchsorted(comparison.train_indices, indices)
    binary = bool(np.isin(comparison.labels, (-1.0, 1.0)).all())
    return [f"#{int(i)} y={_label(comparison.labels[j]):{'+d' if binary else 'd'}} "
            f"{int(comparison.frequency[j])}/{comparison.k}" for i, j in zip(indices, where)]


def write_comparison(
    comparison: SupportSetComparison,
    directory: str | Path,
    stem: str = "compare",
    *,
    images: int = IMAGE_COUNT,
    datamodule: Any = None,
    formats: Sequence[str] = ("png",),
    dpi: int = 150,
) -> tuple[list[Path], str | None]:
    """Write ``<stem>.csv`` (:meth:`~SupportSetComparison.to_csv`), ``<stem>_samples.csv``
    (:meth:`~SupportSetComparison.samples_to_csv`), ``<stem>.md`` (the report), ``<stem>.<format>`` (Jaccard heat
    map and the samples by number of runs) and ``<stem>_frequent.<format>`` (the ``images`` most frequent support
    vectors, where the inputs are images: :func:`support_images`) under ``directory``, each atomically.

    Returns:
        The files written, and the one-line reason why there is no image grid (``None`` when there is one, or
        ``images`` is 0).
    """
    import matplotlib.pyplot as plt

    from lightning_nsv.plotting import image_grid, plot_support_stability

    directory = Path(directory)
    written = [comparison.to_csv(directory / f"{stem}.csv"),
               comparison.samples_to_csv(directory / f"{stem}_samples.csv"),
               write_text(directory / f"{stem}.md", comparison.report() + "\n")]
    chance = float(comparison.jaccard_chance[np.triu_indices(comparison.k, 1)].mean())
    labels = [f"{name}\ns={s}" for name, s in zip(comparison.names, comparison.n_support)]
    figure, _ = plot_support_stability(comparison.jaccard, labels, comparison.in_runs, chance=chance)
    written += [save_figure(figure, directory / f"{stem}.{fmt}", dpi=dpi, bbox_inches="tight") for fmt in formats]
    plt.close(figure)
    if images <= 0:
        return written, None
    try:
        x, indices = support_images(comparison, images, datamodule)
    except ImagesUnavailable as reason:
        return written, f"no image grid: {reason}"
    figure, _ = image_grid(x, image_titles(comparison, indices), total=int(comparison.union.size), max_images=images,
                           what=f"support vectors, most runs first (of {comparison.k})")
    written += [save_figure(figure, directory / f"{stem}_frequent.{fmt}", dpi=dpi, bbox_inches="tight")
                for fmt in formats]
    plt.close(figure)
    return written, None
