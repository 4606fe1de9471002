"""Pair-network kernel columns shared by the ranks of a ``torch.distributed`` group (issue 32 item 1).

:class:`ShardedPairColumns` is :class:`~lightning_nsv.kernel.ShardedKernelColumns` (the message protocol, the
root's :class:`~lightning_nsv.kernel.ColumnSharing` block, the serving ranks' loop) for a
:class:`~lightning_nsv.kernel.PairNetworkColumns`: every rank runs the pair network on its contiguous shard of the
rows of each block of columns the root's solver asks for, and the shards are gathered on the root. Each entry is
computed as one process computes it (the same pairs, the same blocks of columns), so the solver sees the same
columns. Every rank holds the training inputs, the network and its gates; the root checks a fingerprint of the
inputs, outputs, slope bits and max-pool selections of every rank before the first column. No Lightning here.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from lightning_nsv.kernel.pair_network import PairNetworkColumns
from lightning_nsv.kernel.inputs import random_projection
from lightning_nsv.kernel.sharded import ShardedKernelColumns

__all__ = ["ShardedPairColumns", "serve_pair_columns"]


class ShardedPairColumns(ShardedKernelColumns):
    """The columns of a :class:`PairNetworkColumns` computed by every rank of ``group`` on its shard of the rows
    (a :class:`~lightning_nsv.solver.protocol.KernelColumns`). Build it on every rank with the same training set
    and network; the root passes it to the solver inside ``with ColumnSharing(group)``, the others call
    :meth:`serve`. Per block of ``b`` columns: ``8·b·m`` bytes gathered on the root, ``1/world_size`` of the
    ``m·b`` pair-network evaluations per rank; ``diagonal`` and ``signed_block`` run on the root alone."""

    def __init__(self, columns: PairNetworkColumns, group: Any = None, root: int = 0) -> None:
        if not isinstance(columns, PairNetworkColumns):
            raise TypeError(f"ShardedPairColumns shares a PairNetworkColumns, got {type(columns).__name__}; for a "
                            "Linear chain's PathKernelColumns use lightning_nsv.kernel.ShardedKernelColumns")
        super().__init__(columns, group, root)

    def _fingerprint(self) -> Tensor:
        """Random projections of the inputs, outputs, slope bits and selections: differ when a rank's do."""
        generator = torch.Generator().manual_seed(0)
        local: PairNetworkColumns = self.local
        m = len(local)
        parts = [local.x, local.gates.output, *local.gates.bits.values(), *local.gates.selections.values()]
        summary = torch.zeros(m, dtype=torch.float64, device=local.device)
        for part in parts:
            summary += random_projection(part.reshape(m, -1).to(torch.float64), generator)
        return summary.to(self.device)

    def _local(self, idx: Tensor, scale: float) -> Tensor:
        shard, local = self.shards[self.rank], self.local
        idx = idx.to(local.device)
        signs = self._signs.to(local.device, torch.float64)
        block = local.columns_tensor(idx, part=shard) * signs[shard, None] * (signs[idx] / scale)[None, :]
        rows = block.T.to(self.device, torch.float64)
        if rows.shape[1] < self.widest:
            rows = torch.cat([rows, rows.new_zeros(rows.shape[0], self.widest - rows.shape[1])], dim=1)
        return rows.contiguous()

    def signed_block(self, idx, signs, scale: float) -> np.ndarray:
        """``Q[idx, idx]`` by the pair network on ``idx × idx``, on the root alone."""
        return self.local.signed_block(idx, signs, scale)


def serve_pair_columns(columns: PairNetworkColumns, group: Any = None, root: int = 0) -> int:
    """Answer the root rank's column requests for ``columns`` until it stops; the number of blocks computed."""
    return ShardedPairColumns(columns, group, root).serve()
