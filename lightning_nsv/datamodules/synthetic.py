"""Synthetic data generated from the seed: 2-D toy sets and the quadrant data of the NSV paper."""
from __future__ import annotations

from typing import Any, Callable, Literal

import numpy as np
import torch
from sklearn.datasets import make_blobs, make_circles, make_moons
from torch import Tensor

from lightning_nsv.datamodules.base import ClassificationDataModule
from lightning_nsv.validate import check_choice, check_count, check_real


def _blobs(n: int, noise: float, rng: np.random.RandomState) -> tuple[np.ndarray, np.ndarray]:
    return make_blobs(n, centers=[(-1.0, -1.0), (1.0, 1.0)], cluster_std=noise, random_state=rng)


def _moons(n: int, noise: float, rng: np.random.RandomState) -> tuple[np.ndarray, np.ndarray]:
    return make_moons(n, noise=noise, random_state=rng)


def _circles(n: int, noise: float, rng: np.random.RandomState) -> tuple[np.ndarray, np.ndarray]:
    return make_circles(n, noise=noise, factor=0.5, random_state=rng)


def _xor(n: int, noise: float, rng: np.random.RandomState) -> tuple[np.ndarray, np.ndarray]:
    y = np.arange(n) % 2
    first = rng.choice([-1.0, 1.0], n)
    x = rng.uniform(0.0, 1.0, (n, 2)) * np.stack([first, first * (2 * y - 1)], 1)
    return x + noise * rng.standard_normal((n, 2)), y


def _spirals(n: int, noise: float, rng: np.random.RandomState) -> tuple[np.ndarray, np.ndarray]:
    y = np.arange(n) % 2
    t = np.sqrt(rng.uniform(0.0, 1.0, n)) * 3 * np.pi
    x = t[:, None] / (3 * np.pi) * np.stack([np.cos(t + np.pi * y), np.sin(t + np.pi * y)], 1)
    return x + noise * rng.standard_normal((n, 2)), y


TOY_SETS: dict[str, Callable[[int, float, np.random.RandomState], tuple[np.ndarray, np.ndarray]]] = {
    "blobs": _blobs, "moons": _moons, "circles": _circles, "xor": _xor, "spirals": _spirals,
}


class Toy2DDataModule(ClassificationDataModule):
    """Two-class 2-D toy sets, generated from ``seed``, ``x`` of shape (2,); easiest first:

    - ``"blobs"``: Gaussian blobs around (-1, -1) -> 0 and (1, 1) -> 1, standard deviation ``noise``.
    - ``"moons"``, ``"circles"``: scikit-learn's ``make_moons``, ``make_circles(factor=0.5)``.
    - ``"xor"``: uniform in [-1, 1]^2, label 1 where x1 * x2 > 0 (quadrants I and III).
    - ``"spirals"``: two interleaved spirals of 1.5 turns within the unit disc.

    ``noise`` is the standard deviation of Gaussian noise added to every point (for blobs, of the blobs).
    The classes have ``n_samples // 2`` and ``n_samples - n_samples // 2`` samples; ``val_fraction`` of
    them are held out once with the seed.

    Args:
        name: One of ``TOY_SETS``: blobs, moons, circles, xor, spirals.
        n_samples: Samples generated, before the validation split.
        noise: Standard deviation of the Gaussian noise.
        **kwargs: Arguments of :class:`~lightning_nsv.datamodules.base.ClassificationDataModule`.

    Raises:
        TypeError: On a non-integer ``n_samples`` or a non-number ``noise``.
        ValueError: On an unknown ``name``, fewer than 2 samples, ``noise`` negative, NaN or infinite, or a
            ``seed`` beyond 2**32 - 1.
    """

    input_shape = (2,)

    def __init__(
        self,
        name: Literal["blobs", "moons", "circles", "xor", "spirals"] = "moons",
        n_samples: int = 1000,
        noise: float = 0.1,
        **kwargs: Any,
    ) -> None:
        check_choice("name", name, tuple(TOY_SETS))
        n_samples = check_count("n_samples", n_samples, 2, 1000)
        noise = check_real("noise", noise, 0.1)
        super().__init__(**kwargs)
        check_count("seed", self.seed, 0, 0, high=2**32 - 1)  # numpy's RandomState, which generates the data
        self.name, self.n_samples, self.noise = name, n_samples, noise

    def _load(self) -> tuple[Tensor, Tensor, None]:
        x, y = TOY_SETS[self.name](self.n_samples, self.noise, np.random.RandomState(self.seed))
        return torch.from_numpy(x), torch.from_numpy(y), None


class QuadrantDataModule(ClassificationDataModule):
    """Quadrant data of the NSV paper: label 1 in the positive orthant, label 0 in the negative one.

    With ``y = 2 * label - 1`` in {-1, +1}, ``x = y * |z|``, ``z ~ N(0, I_dim)`` drawn from ``seed``, so
    every ``y * x`` is positive coordinatewise. The classes have ``n_samples // 2`` (label 1) and
    ``n_samples - n_samples // 2`` (label 0) samples; ``val_fraction`` of them are held out once.

    Args:
        n_samples: Samples generated, before the validation split.
        dim: Input dimension; ``x`` has shape ``(dim,)``.
        **kwargs: Arguments of :class:`~lightning_nsv.datamodules.base.ClassificationDataModule`.

    Raises:
        TypeError: On a non-integer ``n_samples`` or ``dim``.
        ValueError: On fewer than 2 samples or ``dim`` < 1.
    """

    def __init__(self, n_samples: int = 1000, dim: int = 2, **kwargs: Any) -> None:
        n_samples = check_count("n_samples", n_samples, 2, 1000)
        dim = check_count("dim", dim, 1, 2)
        super().__init__(**kwargs)
        self.n_samples, self.dim, self.input_shape = n_samples, dim, (dim,)

    def _load(self) -> tuple[Tensor, Tensor, None]:
        y = torch.arange(self.n_samples) % 2
        z = torch.randn(self.n_samples, self.dim, generator=torch.Generator().manual_seed(self.seed))
        return z.abs() * (2 * y - 1)[:, None], y, None
