"""scikit-learn's bundled 8x8 digits."""
from __future__ import annotations

import torch
from sklearn.datasets import load_digits
from torch import Tensor

from lightning_nsv.datamodules.base import TASKS, ClassificationDataModule, five_or_more


class DigitsDataModule(ClassificationDataModule):
    """scikit-learn's ``load_digits``: 1797 images of 8x8 pixels, shipped with scikit-learn (no download).

    Binary task: digits 0-4 -> 0, 5-9 -> 1; multiclass: the digit. Pixels (0..16) are divided by 16;
    ``x`` has shape (1, 8, 8). ``val_fraction`` of the samples are held out once with the seed.

    Takes the arguments of :class:`~lightning_nsv.datamodules.base.ClassificationDataModule`.

    Example::

        dm = DigitsDataModule(m=500, seed=1)
        dm.setup("fit")
        x, y = dm.train_dataset[0]  # x: (1, 8, 8) float32 in [0, 1], y: int64 in {0, 1}
    """

    tasks = TASKS
    is_image = True
    input_shape = (1, 8, 8)
    max_value = 16.0
    num_multiclass = 10

    def _load(self) -> tuple[Tensor, Tensor, None]:
        digits = load_digits()
        return torch.from_numpy(digits.images).unsqueeze(1), torch.from_numpy(digits.target), None

    def _relabel(self, y: Tensor) -> Tensor:
        return five_or_more(y, self.task)
