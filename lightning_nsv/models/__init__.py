"""LightningModules whose networks the analyses read.

Each name is imported on first use, so that the core can read :mod:`lightning_nsv.models.layers` (the activation
family, ``eval_mode``) without importing Lightning.
"""
from importlib import import_module

_HOMES = {"ConvFCNet": "conv_fc", "LeakyReLUFamily": "layers", "LeakyReLUMLP": "mlp", "ResNetClassifier": "resnet",
          "ResidualBlock": "residual", "SkipNetwork": "skip", "SmallResNet": "residual", "make_activation": "layers",
          "mlp_sequential": "layers"}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_HOMES[name]}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
