"""Kernel columns shared by the ranks of a ``torch.distributed`` group: moved to :mod:`lightning_nsv.kernel.sharded`
(kept for existing imports)."""
from lightning_nsv.kernel.sharded import ColumnSharing, ShardedKernelColumns, message_device, serve

__all__ = ["ColumnSharing", "ShardedKernelColumns", "message_device", "serve"]
