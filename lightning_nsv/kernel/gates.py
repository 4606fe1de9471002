"""What the float64 forward of the frozen network fixes for each sample (DESIGN.md §2c): ``N(x)``, the gates'
slope bits, the max-pool selections (:class:`Gates`, :func:`compute_gates`), decided the same way whatever the block
a sample falls in (near-ties: :mod:`lightning_nsv.kernel.ties`)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from lightning_nsv.errors import NonFiniteError
from lightning_nsv.kernel.bitmasks import Bits
from lightning_nsv.kernel.graph import PiecewiseGraph, Recorder, run

__all__ = ["FORWARD_BLOCK_BYTES", "Gates", "MEMORY_BYTES", "compute_gates"]

# default budget of one block of pairs (all values alive at once in the plain pair network; the factored network's
# per-sample factors pay in blocks of many rows and columns: factored_block_scale); on a GPU pass a larger budget
MEMORY_BYTES = 128 << 20
# at most this much of the float64 forward alive at once: blocks whose maps stay in the cores' caches (SmallResNet(16),
# 2,000 samples of 3×32×32: 1.8 s in blocks of 32 MiB, 2.4 s of 128 MiB, 3.8 s of 1 MiB)
FORWARD_BLOCK_BYTES = 32 << 20


@dataclass(frozen=True)
class Gates:
    """What the float64 forward of the frozen network fixes for each sample (DESIGN.md §2c).

    Attributes:
        output: ``N(x)``, ``(m,)`` or ``(m, K)``, float64.
        bits: per gate layer (fx node name) ``z >= 0`` as bool, ``(m, *shape)``: slope ``gamma`` where set, else
            ``beta`` (the layer's family is in ``graph.gates``).
        selections: per max pool the flat index (within its channel's plane) of the selected input, int32,
            ``(m, C, *out)``: torch's choice on ties.
    """

    output: Tensor
    bits: dict[str, Tensor]
    selections: dict[str, Tensor]
    _packed: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __len__(self) -> int:
        return self.output.shape[0]

    def packed(self, name: str, gamma: float) -> Bits:
        """The slopes of a ReLU-type gate layer (``beta = 0``) as packed bits of every sample, formed once."""
        if name not in self._packed:
            self._packed[name] = Bits.pack(self.bits[name], scale=gamma)
        return self._packed[name]

    def hits(self, name: str, j: int, unit: Tensor, valid: Tensor) -> Bits:
        """Whether max pool ``name`` selects its windows' unit ``j`` (``unit``: the unit's flat index per output,
        ``valid``: where it is real), as packed bits of every sample, formed once."""
        if (name, j) not in self._packed:
            chosen = self.selections[name]
            self._packed[name, j] = Bits.pack(((chosen.flatten(2) == unit) & valid).view(chosen.shape))
        return self._packed[name, j]


def rows_per_block(graph: PiecewiseGraph, memory_bytes: int) -> int:
    return max(1, memory_bytes // (8 * max(1, graph.peak_elements)))


def compute_gates(graph: PiecewiseGraph, x: Tensor, memory_bytes: int = MEMORY_BYTES) -> Gates:
    """One float64 forward of ``x`` (``(m, *input_shape)``, any float dtype, any device) a block of rows at a time
    (within ``memory_bytes`` and :data:`FORWARD_BLOCK_BYTES`), on the graph's device: ``N(x)``, the slope bits and
    the max-pool selections (§2c). A choice within :data:`~lightning_nsv.kernel.ties.TIE` of its other side is
    decided by the sample's forward run alone (:func:`_decide_ties_alone`): the choices do not depend on how the
    samples are split."""
    if tuple(x.shape[1:]) != graph.input_shape:
        raise ValueError(f"inputs of shape {tuple(x.shape[1:])} per sample, the graph was traced on "
                         f"{graph.input_shape}")
    step = rows_per_block(graph, min(memory_bytes, FORWARD_BLOCK_BYTES))
    outputs, records = [], []
    for lo in range(0, len(x), step):
        chunk = x[lo:lo + step].to(graph.device, torch.float64)
        if not torch.isfinite(chunk).all():
            raise NonFiniteError(f"inputs {lo}..{lo + len(chunk) - 1} hold NaN or inf")
        recorder = Recorder(watch_ties=True)
        out = run(graph, chunk, "forward", recorder)
        if recorder.ties is not None and bool(recorder.ties.any()):
            _decide_ties_alone(graph, chunk, out, recorder)
        outputs.append(out)
        records.append(recorder.records)
    output = torch.cat(outputs) if outputs else torch.empty(0, *graph.output_shape, dtype=torch.float64,
                                                            device=graph.device)
    if not torch.isfinite(output).all():
        raise NonFiniteError("the float64 forward of the network is not finite")
    if not records:  # no samples: empty choices of each layer's shape
        empty = lambda shape, dtype: torch.empty(0, *shape, dtype=dtype, device=graph.device)  # noqa: E731
        return Gates(output, {g.name: empty(g.shape, torch.bool) for g in graph.gates},
                     {p.name: empty(p.shape, torch.int32) for p in graph.pools})
    cat = lambda name: torch.cat([r[name] for r in records])  # noqa: E731
    return Gates(output, {name: cat(name) for name, *_ in graph.gates},
                 {name: cat(name) for name, *_ in graph.pools})


def _decide_ties_alone(graph: PiecewiseGraph, chunk: Tensor, out: Tensor, recorder: Recorder) -> None:
    """The rule for near-ties (:data:`~lightning_nsv.kernel.ties.TIE`): a sample with a choice that close to its
    other side takes every choice and its output from its own float64 forward, run alone on one thread; elsewhere
    the block's rounding cannot change a choice, so every sample's choices are those of that forward, whatever the
    block, tile or thread count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for i in torch.nonzero(recorder.ties)[:, 0].tolist():
            alone = Recorder()
            out[i] = run(graph, chunk[i:i + 1], "forward", alone)[0]
            for name, value in alone.records.items():
                recorder.records[name][i] = value[0]
    finally:
        torch.set_num_threads(threads)
