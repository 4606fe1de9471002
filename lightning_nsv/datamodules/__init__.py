"""LightningDataModules: digits (bundled, default), MNIST, CIFAR-10 classes, 2-D toy sets, quadrant data."""
from lightning_nsv.datamodules.base import ClassificationDataModule, TorchvisionDataModule
from lightning_nsv.datamodules.cifar import CIFAR10_CLASSES, CIFAR10FrogsShipsDataModule
from lightning_nsv.datamodules.digits import DigitsDataModule
from lightning_nsv.datamodules.mnist import BinaryMNISTDataModule
from lightning_nsv.datamodules.synthetic import TOY_SETS, QuadrantDataModule, Toy2DDataModule

__all__ = [
    "BinaryMNISTDataModule",
    "CIFAR10_CLASSES",
    "CIFAR10FrogsShipsDataModule",
    "ClassificationDataModule",
    "DigitsDataModule",
    "QuadrantDataModule",
    "TOY_SETS",
    "Toy2DDataModule",
    "TorchvisionDataModule",
]
