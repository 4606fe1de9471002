"""Memory of the whole-network support-vector analysis (:mod:`lightning_nsv.analysis.whole_network`): what it
allocates before its solver starts, checked against a budget before the allocation, and the solver's kernel columns
counted against the same budget before each is formed."""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from lightning_nsv.kernel import PairNetworkColumns, PiecewiseGraph
from lightning_nsv.kernel.fused import fused_bytes_per_sample
from lightning_nsv.kernel.pair_network import CACHE_BYTES, MEMORY_BYTES
from lightning_nsv.solver.protocol import KernelColumns
from lightning_nsv.memory import available_memory_bytes

__all__ = ["BudgetedColumns", "cache_budget", "memory_budget", "memory_estimate"]

MEMORY_FIX = "analyse fewer samples, or a smaller network (or only its head: network_support_vectors)"


def _gate_bytes(graph: PiecewiseGraph) -> int:
    """Bytes of the gates of one sample: a bool per gate unit, an int32 per max-pool selection, the float64 output."""
    units = lambda shape: math.prod(shape)  # noqa: E731
    return (sum(units(g.shape) for g in graph.gates) + 4 * sum(units(p.shape) for p in graph.pools)
            + 8 * graph.num_outputs)


def memory_estimate(graph: PiecewiseGraph, m: int, n_val: int = 0, block_bytes: int = MEMORY_BYTES) -> dict[str, int]:
    """What :func:`whole_network_support_vectors` allocates before its solver starts, in bytes: ``inputs`` (float64
    copies of the training and validation inputs), ``gates`` (of both sets: a bool per gate unit, an int32 per max-pool
    selection, the float64 outputs), ``factors`` (the per-sample factors of the compiled pair program, none where the
    graph is not fused), ``blocks`` (one block of the pair network and one of the float64 forward),
    ``diagonal``, and ``total``. The solver then stores ``8·m`` bytes per sample whose kernel column it forms (the
    binary solver's free set; the K-class solver keeps every sample column it asked for, in a buffer that grows by
    doubling) plus its Cholesky factor; :class:`BudgetedColumns` counts the columns against the same budget."""
    f = math.prod(graph.input_shape)
    parts = {
        "inputs": 8 * (m + n_val) * f,
        "gates": (m + n_val) * _gate_bytes(graph),
        "factors": (m + n_val) * fused_bytes_per_sample(graph),
        "blocks": 2 * block_bytes,
        "diagonal": 8 * m,
    }
    parts["total"] = sum(parts.values())
    return parts


def memory_budget(parts: dict[str, int], memory_bytes: int | None, device: torch.device) -> tuple[int, str] | None:
    """Refuses when the allocations of :func:`memory_estimate` exceed ``memory_bytes`` or the memory available (on
    a CUDA device: free there too); else the budget that the solver's columns are counted against, and its name."""
    limits = []
    if memory_bytes is not None:
        limits.append((memory_bytes, f"memory_bytes={memory_bytes:,}"))
    available = available_memory_bytes()
    if available is not None:
        limits.append((available, f"the {available / 2**20:,.1f} MiB of memory available"))
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device) \
            - torch.cuda.memory_allocated(device)
        limits.append((free, f"the {free / 2**20:,.1f} MiB free on {device}"))
    need = parts["total"]
    detail = ", ".join(f"{name} {value / 2**20:.1f} MiB" for name, value in parts.items() if name != "total")
    for limit, name in limits:
        if need > limit:
            raise ValueError(f"the whole-network analysis needs at least {need / 2**20:.1f} MiB before its solver "
                             f"starts ({detail}), above {name}; {MEMORY_FIX}")
    return min(limits) if limits else None


def cache_budget(fixed: int, budget: tuple[int, str] | None, m: int) -> int:
    """Bytes for the columns that :class:`PairNetworkColumns` keeps to read ``K[r, j] = K[j, r]``: what the budget
    leaves after the allocations before the solve (``fixed``) and the solver's largest store of columns (all ``m``,
    ``8·m²`` bytes), at most :data:`~lightning_nsv.kernel.pair_network.CACHE_BYTES`; so the cache never makes
    :class:`BudgetedColumns` refuse a solve it would otherwise allow (it only spares pairs)."""
    if budget is None:
        return CACHE_BYTES
    return max(0, min(CACHE_BYTES, budget[0] - fixed - 8 * m * m))


class BudgetedColumns(KernelColumns):
    """A :class:`PairNetworkColumns` (itself a :class:`~lightning_nsv.solver.protocol.KernelColumns`) with a memory
    budget: the same columns, refused (``ValueError`` with the numbers) before the columns of the
    distinct samples asked for so far (``8·m`` bytes each) and the memory allocated before the solve (``fixed``)
    would exceed the budget. Blocks among candidates (``signed_block``) are not counted."""

    offers_block = True  # Q[idx, idx] by the pair network on idx × idx only

    def __init__(self, columns: PairNetworkColumns, fixed: int, budget: tuple[int, str] | None) -> None:
        self.inner, self.fixed, self.budget = columns, fixed, budget
        self.seen = np.zeros(len(columns), dtype=bool)

    def _admit(self, idx) -> None:
        idx = np.asarray(idx.cpu() if isinstance(idx, Tensor) else idx, dtype=np.int64).reshape(-1)
        if self.budget is None or self.seen[idx].all():
            return
        count = int(self.seen.sum()) + len(np.unique(idx[~self.seen[idx]]))
        need = self.fixed + 8 * len(self.seen) * count
        limit, name = self.budget
        if need > limit:
            raise ValueError(f"the max-margin solver needs the kernel columns of {count:,} samples "
                             f"({8 * len(self.seen) * count / 2**20:.1f} MiB; {need / 2**20:.1f} MiB with the inputs "
                             f"and gates), above {name}: the support is larger than that budget holds; {MEMORY_FIX}")
        self.seen[idx] = True

    def __len__(self) -> int:
        return len(self.inner)

    dtype = property(lambda self: torch.float64, doc="float64")
    device = property(lambda self: self.inner.device, doc="the traced graph's device")

    def diagonal(self) -> np.ndarray:
        return self.inner.diagonal()

    def columns(self, idx) -> np.ndarray:
        """``K[:, idx]`` as float64 numpy (the sample columns of the K-class solver)."""
        self._admit(idx)
        return self.inner.columns(idx)

    def signed_columns(self, idx, signs, scale: float) -> np.ndarray:
        self._admit(idx)
        return self.inner.signed_columns(idx, signs, scale)

    def signed_block(self, idx, signs, scale: float) -> np.ndarray:
        return self.inner.signed_block(idx, signs, scale)

    def signed_rows(self, idx, signs, scale: float) -> Tensor:
        """``Q[:, idx]ᵀ`` on the graph's device (the torch solver's columns, no round trip through numpy)."""
        self._admit(idx)
        return self.inner.signed_rows(idx, signs, scale)
