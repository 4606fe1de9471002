"""The pair network of a traced graph as one compiled program on a set of samples (DESIGN.md §2c "Speed").

:class:`FusedPairs` holds the :class:`~lightning_nsv.kernel.pair_program.PairProgram` of a graph, the samples'
per-sample factors and the engine that runs the program on pairs: ``numba`` (compiled, on the CPU) or ``torch``
(the same instructions as torch operations over batches of pairs, on any device: the formulation a GPU runs).
:func:`fuse` builds it, or says why the graph is not fused (:class:`~lightning_nsv.kernel.pair_program.NotFusable`).
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator

import torch
from torch import Tensor

from lightning_nsv.kernel.pair_checks import check_samples
from lightning_nsv.kernel.pair_engines import NO_NUMBA, numba_available, numba_outer, numba_pairs, numba_turned_off, \
    torch_pairs
from lightning_nsv.kernel.pair_factors import SampleFactors, factor_bytes, sample_factors
from lightning_nsv.kernel.pair_code import NotFusable, PairProgram
from lightning_nsv.kernel.pair_program import compile_pair_program

__all__ = ["ENGINES", "FusedPairs", "NotFusable", "fuse", "pair_program"]

ENGINES = ("auto", "numba", "torch")
TORCH_BATCH_BYTES = 256 << 20  # the torch engine's scratch for one batch of pairs


def pair_program(graph) -> PairProgram:
    """The graph's pair program, compiled once per graph (:class:`NotFusable` if it cannot be)."""
    if graph.pair_program is None:
        try:
            graph.pair_program = compile_pair_program(graph)
        except NotFusable as err:
            graph.pair_program = err
    if isinstance(graph.pair_program, NotFusable):
        raise graph.pair_program
    return graph.pair_program


def resolve_engine(engine: str, device: torch.device) -> str:
    """``auto``: numba on a CPU where numba imports, torch elsewhere."""
    if not isinstance(engine, str) or engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(map(repr, ENGINES))}, got {engine!r}")
    if engine == "numba" and (device.type != "cpu" or not numba_available()):
        why = f"the graph is on {device}" if device.type != "cpu" else (
            f"{NO_NUMBA}={os.environ.get(NO_NUMBA)} turns numba off (unset it, or set it to 0)" if numba_turned_off()
            else "numba is not installed (pip install numba)")
        raise ValueError(f"engine='numba' runs on the CPU with numba, but {why}; or use engine='torch' (the same "
                         "program as torch operations, on any device)")
    if engine == "auto":
        return "numba" if device.type == "cpu" and numba_available() else "torch"
    return engine


class FusedPairs:
    """``K(x_i, x_j)`` of a traced graph's samples by its compiled pair program.

    Memory: the samples' factors (:attr:`nbytes`, ``m · factor_bytes(program)``; for SmallResNet(16) on 3×32×32
    37 KiB a sample, the float64 input 24 KiB of it) on the CPU (numba) or on the graph's device (torch), and a
    per-pair scratch of ``8 · program.scratch`` bytes a thread (numba) or a batch of pairs within
    :data:`TORCH_BATCH_BYTES` (torch)."""

    def __init__(self, program: PairProgram, factors: SampleFactors, engine: str, device: torch.device) -> None:
        self.program, self.factors, self.engine, self.device = program, factors, engine, device
        self.threads: int | None = None  # the compiled runner's threads (None: torch's at each call)
        if engine == "torch":
            self._bits, self._dense = factors.tensors(device)

    @contextlib.contextmanager
    def owning_the_cores(self) -> Iterator[None]:
        """Inside the block torch runs on one thread and the compiled runner on the threads torch had: torch's
        OpenMP workers spin for milliseconds after each of its parallel operations and take the cores from the
        runner's threads (the solver's small torch steps between two tiles slowed the tiles by about a third;
        ``benchmarks/runner_threads.py``). The torch engine keeps torch's threads."""
        if self.engine != "numba" or self.threads is not None:
            yield
            return
        threads = torch.get_num_threads()
        self.threads = threads
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(threads)
            self.threads = None

    @property
    def nbytes(self) -> int:
        return self.factors.nbytes

    def outer(self, rows: Tensor, cols: Tensor) -> Tensor:
        """``K[rows][:, cols]``, float64 on the graph's device."""
        if self.engine == "numba":
            out = numba_outer(self.program, self.factors, rows.cpu().numpy(), cols.cpu().numpy(),
                              self.threads)
            return torch.from_numpy(out).to(self.device)
        first = rows.to(self.device).repeat_interleave(len(cols))
        second = cols.to(self.device).repeat(len(rows))
        return self._torch(first, second).view(len(rows), len(cols))

    def aligned(self, first: Tensor, second: Tensor) -> Tensor:
        """``K(x_first[k], x_second[k])``, float64 on the graph's device."""
        if self.engine == "numba":
            return torch.from_numpy(numba_pairs(self.program, self.factors, first.cpu().numpy(),
                                                second.cpu().numpy(), self.threads)).to(self.device)
        return self._torch(first.to(self.device), second.to(self.device))

    def _torch(self, first: Tensor, second: Tensor) -> Tensor:
        batch = max(1, TORCH_BATCH_BYTES // (8 * 3 * max(1, self.program.scratch)))
        parts = [torch_pairs(self.program, self._bits, self._dense, first[lo:lo + batch], second[lo:lo + batch])
                 for lo in range(0, len(first), batch)]
        return torch.cat(parts) if parts else torch.empty(0, dtype=torch.float64, device=self.device)


def fuse(graph, x: Tensor, gates, engine: str = "auto") -> FusedPairs:
    """The :class:`FusedPairs` of ``graph`` on the samples ``x`` with their ``gates``; :class:`NotFusable` names
    what the program cannot express. Inputs and gates that are not the graph's, and non-finite inputs, are refused
    before anything is formed (:func:`~lightning_nsv.kernel.pair_checks.check_samples`)."""
    check_samples(graph, x, gates)
    engine = resolve_engine(engine, graph.device)
    program = pair_program(graph)
    return FusedPairs(program, sample_factors(program, graph, x, gates), engine, graph.device)


def fused_bytes_per_sample(graph) -> int:
    """Bytes of one sample's factors of the graph's pair program (0 when the graph is not fused)."""
    try:
        return factor_bytes(pair_program(graph))
    except NotFusable:
        return 0
