"""Lightning callbacks: thin adapters over the core maths."""
from lightning_nsv.callbacks.loss_valley import LossValleyMonitor
from lightning_nsv.callbacks.network_support_vectors import NetworkSupportVectors
from lightning_nsv.callbacks.psi_rank import PsiRankMonitor

__all__ = ["LossValleyMonitor", "NetworkSupportVectors", "PsiRankMonitor"]
