"""Kernel columns shared by the processes of a ``torch.distributed`` group (DDP ranks).

The active-set solver runs on one rank (``root``); every column block it asks for is computed by all ranks,
each on its contiguous shard of the training rows, and gathered on the root. The other ranks hold the same
training inputs and network (every DDP rank has the data set) and answer requests in :func:`serve` until the
root sends the stop: the root works inside ``with ColumnSharing(...)``, whose exit sends it exactly once, also when
the root fails or never asks for a column.

Messages are broadcasts of an int64 header ``[kind, b, labels follow]`` (``kind`` 2, once: every rank compares
a fingerprint of its inputs and activation patterns with the root's, and the root raises if one differs; 1: a
block of ``b`` columns follows with its indices, the scale and, when they change, the labels; 0: stop), then a
gather of ``(b, max shard)`` blocks (gloo and NCCL both need equal shapes: shorter shards are padded). Each entry is computed exactly as one process
computes it (:meth:`~lightning_nsv.kernel.columns.PathKernelColumns.signed_rows` of a row range), so the solver sees
the same columns up to the blocking of the products.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from lightning_nsv.kernel.columns import PathKernelColumns
from lightning_nsv.kernel.inputs import random_projection
from lightning_nsv.solver.protocol import KernelColumns

__all__ = ["ColumnSharing", "ShardedKernelColumns", "message_device", "serve"]

_REQUEST, _STOP, _CHECK = 1, 0, 2


class ShardedKernelColumns(KernelColumns):
    """The solver's columns ``Q[:, idx]`` computed by every rank of ``group`` on its shard of the rows (a
    :class:`~lightning_nsv.solver.protocol.KernelColumns`; rows on the group's message device).

    Build it on every rank with the same ``columns``; the root passes it to
    :func:`~lightning_nsv.solver.max_margin` inside a :class:`ColumnSharing` block, the others call
    :meth:`serve`. Communication per block:
    ``8·b·m`` bytes gathered on the root; work per rank: ``1/world_size`` of the block's products.
    """

    def __init__(self, columns: PathKernelColumns, group: Any = None, root: int = 0) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("ShardedKernelColumns needs an initialised torch.distributed process group")
        self.local, self.group, self.root = columns, group, root
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        m = len(columns)
        bounds = [m * r // self.world_size for r in range(self.world_size + 1)]
        self.shards = [slice(bounds[r], bounds[r + 1]) for r in range(self.world_size)]
        self.widest = max(s.stop - s.start for s in self.shards)
        self._device = message_device(group)
        self._signs: Tensor | None = None
        self._sent_signs: Tensor | None = None  # the root's CPU copy of the labels last sent
        if self.rank == root:
            self._check_same_problem()

    offers_block = True  # the root forms Q[idx, idx] alone

    def __len__(self) -> int:
        return len(self.local)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the columns are computed in (that of the root's :class:`PathKernelColumns`)."""
        return self.local.dtype

    @property
    def device(self) -> torch.device:
        """The group's message device, where :meth:`signed_rows` gathers the rows."""
        return self._device

    def diagonal(self) -> np.ndarray:
        """``diag(K)``, on the root alone (``O(m·(f + Σ Ω_l))``)."""
        return self.local.diagonal()

    def columns(self, idx) -> np.ndarray:
        """``K[:, idx]`` as float64 numpy, computed by all ranks (root only)."""
        return self.signed_columns(idx, np.ones(len(self)), 1.0)

    def __call__(self, idx) -> Tensor:
        """``K[:, idx]`` (root only), shape ``(m, len(idx))``."""
        return torch.from_numpy(self.signed_columns(idx, np.ones(len(self)), 1.0))

    def signed_columns(self, idx, signs, scale: float) -> np.ndarray:
        """``Q[:, idx]`` as :meth:`PathKernelColumns.signed_columns` gives it, computed by all ranks (root only)."""
        return self.signed_rows(idx, signs, scale).to("cpu", torch.float64).numpy().T

    def signed_block(self, idx, signs, scale: float) -> np.ndarray:
        """``Q[idx, idx]`` (:meth:`PathKernelColumns.signed_block`), on the root alone: ``b²`` entries."""
        return self.local.signed_block(idx, signs, scale)

    def signed_rows(self, idx, signs, scale: float) -> Tensor:
        """``Q[:, idx]ᵀ``, shape ``(len(idx), m)``, on the group's message device (root only)."""
        if self.rank != self.root:
            raise RuntimeError("only the root rank asks for columns; the others serve()")
        idx = torch.as_tensor(np.asarray(idx), dtype=torch.long)
        signs = torch.as_tensor(np.asarray(signs), dtype=torch.float64)
        new_signs = self._sent_signs is None or not torch.equal(self._sent_signs, signs)
        self._broadcast(torch.tensor([_REQUEST, len(idx), int(new_signs)], dtype=torch.long))
        self._broadcast(idx.to(self.device))
        self._broadcast(torch.tensor([scale], dtype=torch.float64, device=self.device))
        if new_signs:  # sent once per analysis (the labels), again only if they change
            self._sent_signs, self._signs = signs.clone(), signs.to(self.device)
            self._broadcast(self._signs)
        parts = self._gather(self._local(idx.to(self.device), scale))
        return torch.cat([p[:, : s.stop - s.start] for p, s in zip(parts, self.shards)], dim=1)

    def serve(self) -> int:
        """Answer the root's requests until it stops (non-root ranks); the number of blocks computed."""
        if self.rank == self.root:
            raise RuntimeError("the root rank asks for columns; serve() is for the other ranks")
        blocks = 0
        while True:
            header = torch.zeros(3, dtype=torch.long)
            self._broadcast(header)
            if int(header[0]) == _STOP:
                return blocks
            if int(header[0]) == _CHECK:
                self._check_same_problem(int(header[1]))
                continue
            idx = torch.zeros(int(header[1]), dtype=torch.long, device=self.device)
            self._broadcast(idx)
            scale = torch.zeros(1, dtype=torch.float64, device=self.device)
            self._broadcast(scale)
            if int(header[2]):
                self._signs = torch.zeros(len(self), dtype=torch.float64, device=self.device)
                self._broadcast(self._signs)
            self._gather(self._local(idx, float(scale[0])))
            blocks += 1

    def _fingerprint(self) -> Tensor:
        """``X r + Σ_l P_l r_l`` for fixed random ``r``: differs when a rank's inputs or activation patterns do."""
        generator = torch.Generator().manual_seed(0)
        summary = random_projection(self.local.x, generator)
        for p in self.local.indicators:
            summary += random_projection(p, generator)
        return summary.to(self.device)

    def _check_same_problem(self, root_samples: int | None = None) -> None:
        """Every rank compares its inputs and patterns with the root's; the root raises if one differs."""
        if self.rank == self.root:
            root_samples = len(self)
            self._broadcast(torch.tensor([_CHECK, root_samples, 0], dtype=torch.long))
        mine = self._fingerprint()
        roots = mine.clone() if len(mine) == root_samples else mine.new_zeros(root_samples)
        self._broadcast(roots)
        scale = float(roots.abs().max()) if len(roots) else 0.0
        same = len(mine) == root_samples and torch.allclose(mine, roots, rtol=1e-9, atol=1e-9 * scale)
        differs = torch.tensor([0.0 if same else 1.0], device=self.device)
        dist.all_reduce(differs, op=dist.ReduceOp.MAX, group=self.group)
        if self.rank == self.root and bool(differs[0]):
            raise ValueError("another rank holds other training inputs, or other activation patterns, than rank "
                             f"{self.root}: the kernel columns cannot be shared (every rank must see the same "
                             "training set in the same order and the same weights)")

    def _local(self, idx: Tensor, scale: float) -> Tensor:
        shard, here = self.shards[self.rank], self.local.x.device
        rows = self.local.signed_rows(idx.to(here), self._signs.to(here), scale, part=shard)
        rows = rows.to(self.device, torch.float64)
        if rows.shape[1] < self.widest:
            rows = torch.cat([rows, rows.new_zeros(rows.shape[0], self.widest - rows.shape[1])], dim=1)
        return rows.contiguous()

    def _broadcast(self, tensor: Tensor) -> None:
        moved = tensor.to(self.device)
        dist.broadcast(moved, src=self.root, group=self.group)
        if moved is not tensor:
            tensor.copy_(moved.to(tensor.device))

    def _gather(self, local: Tensor) -> list[Tensor]:
        if self.rank == self.root:
            parts = [torch.empty_like(local) for _ in range(self.world_size)]
            dist.gather(local, parts, dst=self.root, group=self.group)
            return parts
        dist.gather(local, None, dst=self.root, group=self.group)
        return []


def message_device(group: Any = None) -> torch.device:
    """Where the service's messages live: this rank's CUDA device for NCCL, else the CPU."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class ColumnSharing:
    """The root's side of a column service: ``with ColumnSharing(group) as sharing`` around the work that asks
    for columns (``sharing.columns(cols)`` wraps a :class:`PathKernelColumns`); leaving the block stops the
    serving ranks, exactly once."""

    def __init__(self, group: Any = None, root: int = 0) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("ColumnSharing needs an initialised torch.distributed process group")
        if dist.get_rank(group) != root:
            raise RuntimeError("ColumnSharing is the root rank's side; the other ranks call serve()")
        self.group, self.root = group, root
        self.device = message_device(group)

    @property
    def world_size(self) -> int:
        return dist.get_world_size(self.group)

    def columns(self, columns: PathKernelColumns) -> ShardedKernelColumns:
        return ShardedKernelColumns(columns, self.group, self.root)

    def __enter__(self) -> "ColumnSharing":
        return self

    def __exit__(self, *exc) -> None:
        dist.broadcast(torch.tensor([_STOP, 0, 0], dtype=torch.long, device=self.device), src=self.root,
                       group=self.group)


def serve(columns: PathKernelColumns, group: Any = None, root: int = 0) -> int:
    """Answer the root rank's column requests for ``columns`` until it stops; the number of blocks computed."""
    return ShardedKernelColumns(columns, group, root).serve()
