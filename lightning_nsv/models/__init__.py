"""LightningModules whose networks the analyses read."""
from lightning_nsv.models.conv_fc import ConvFCNet
from lightning_nsv.models.layers import LeakyReLUFamily, make_activation, mlp_sequential
from lightning_nsv.models.mlp import LeakyReLUMLP
from lightning_nsv.models.skip import SkipNetwork

__all__ = ["ConvFCNet", "LeakyReLUFamily", "LeakyReLUMLP", "SkipNetwork", "make_activation", "mlp_sequential"]
