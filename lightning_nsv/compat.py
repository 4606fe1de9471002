"""Which Lightning package the shell builds on: ``pytorch_lightning`` or the unified ``lightning.pytorch``.

Every model, data module and callback of the package subclasses what this module exports, so a Trainer of
the chosen package accepts them. The choice is made once, at import:

1. the environment variable ``LIGHTNING_NSV_PACKAGE`` = ``lightning`` or ``pytorch_lightning``, if set;
2. otherwise the package the program has already imported, if it imported exactly one of the two
   (``import lightning.pytorch as pl`` before ``import lightning_nsv`` selects ``lightning.pytorch``);
3. otherwise ``pytorch_lightning`` if it is installed, else ``lightning.pytorch``.

Mixing namespaces (a ``lightning.pytorch`` Trainer with classes built on ``pytorch_lightning``) fails at the
first hook with :class:`LightningPackageMismatch`, which says which package to choose and how.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any

__all__ = [
    "PACKAGE",
    "Callback",
    "LightningDataModule",
    "LightningModule",
    "LightningPackageMismatch",
    "Trainer",
    "check_same_package",
    "pl",
    "rank_zero_info",
    "rank_zero_warn",
    "submodule",
]

ENV_VAR = "LIGHTNING_NSV_PACKAGE"
_MODULES = {"lightning": "lightning.pytorch", "pytorch_lightning": "pytorch_lightning"}


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name.split(".")[0]) is not None and importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def _choose() -> str:
    requested = os.environ.get(ENV_VAR, "").strip()
    if requested:
        if requested not in _MODULES:
            raise ImportError(f"{ENV_VAR} can be {' or '.join(_MODULES)}, got {requested!r}")
        if not _installed(_MODULES[requested]):
            raise ImportError(
                f"{ENV_VAR}={requested} but {_MODULES[requested]} is not installed: `pip install {requested}`"
            )
        return _MODULES[requested]
    imported = [module for module in _MODULES.values() if module in sys.modules]
    if len(imported) == 1:
        return imported[0]
    for module in ("pytorch_lightning", "lightning.pytorch"):
        if _installed(module):
            return module
    raise ImportError("lightning_nsv needs `pytorch-lightning` or `lightning`: `pip install pytorch-lightning`")


PACKAGE: str = _choose()
pl: Any = importlib.import_module(PACKAGE)
LightningModule = pl.LightningModule
LightningDataModule = pl.LightningDataModule
Callback = pl.Callback
Trainer = pl.Trainer
_utilities = importlib.import_module(f"{PACKAGE}.utilities")
rank_zero_info = _utilities.rank_zero_info
rank_zero_warn = _utilities.rank_zero_warn


class LightningPackageMismatch(TypeError):
    """A Trainer of one Lightning package met a class of the package built on the other."""


def _package_of(obj: Any) -> str:
    module = type(obj).__module__
    return "lightning.pytorch" if module.startswith("lightning.") else module.split(".")[0]


def check_same_package(trainer: Any, what: Any) -> None:
    """Raise :class:`LightningPackageMismatch` unless ``trainer`` is a Trainer of :data:`PACKAGE`."""
    if isinstance(trainer, Trainer):
        return
    other = _package_of(trainer)
    choice = "lightning" if other == "lightning.pytorch" else other
    raise LightningPackageMismatch(
        f"{type(what).__name__} is built on {PACKAGE}, but the Trainer comes from {other}. Use one package "
        f"throughout: set {ENV_VAR}={choice} before importing lightning_nsv (or import {other} first), or build "
        f"the Trainer from {PACKAGE}."
    )


def submodule(name: str) -> Any:
    """``<PACKAGE>.<name>``, e.g. ``submodule("loggers")``."""
    return importlib.import_module(f"{PACKAGE}.{name}")
