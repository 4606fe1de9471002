"""Lightning callbacks: thin adapters over the core maths."""
from lightning_nsv.callbacks.network_support_vectors import NetworkSupportVectors

__all__ = ["NetworkSupportVectors"]
