"""Path space of Leaky-ReLU-family networks (DESIGN.md §1).

A network without biases computes ``N(x) = <phi(x), wbar>`` with ``phi(x) = sigma_d(x) ⊗ … ⊗ sigma_1(x) ⊗ x``
and ``wbar`` the products of weights along paths. Nothing here materialises ``phi`` or ``wbar``: kernels
factor over layers and path norms are forward passes of element-wise squared weights.

All functions compute in the dtype of the :class:`PathNetwork` (float64 by default); inputs are cast to it, those
of a narrower float dtype a chunk of rows at a time (kernel columns hold one converted copy up to
:data:`INPUT_COPY_BYTES`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from lightning_nsv.memory import base_page_empty
from lightning_nsv.solver.protocol import KernelColumns

__all__ = [
    "InputGramCache",
    "PathKernelColumns",
    "PathNetwork",
    "PathSigns",
    "forward_with_slopes",
    "path_kernel",
    "path_kernel_diagonal",
    "path_norm_squared",
    "path_signs",
    "slopes",
    "unique_patterns",
]


def slopes(z: Tensor, beta: float, gamma: float) -> Tensor:
    """Slope of ``rho(z) = gamma*z (z >= 0), beta*z (z < 0)`` at each pre-activation: ``gamma`` at ``z == 0``."""
    return torch.where(z >= 0, torch.tensor(gamma, dtype=z.dtype, device=z.device),
                       torch.tensor(beta, dtype=z.dtype, device=z.device))


@dataclass(frozen=True)
class PathNetwork:
    """The fully connected Leaky-ReLU-family part of a network, in the dtype of the analysis.

    Attributes:
        weights: ``A_0 (Ω_1×f), A_1, …, A_d (K×Ω_d)``, ``K >= 1`` output units (``K = 1``: binary).
        biases: ``b_1, …, b_d, b_{d+1}`` or ``None`` for a network without biases.
        betas: negative-side slope of each hidden layer (``d`` values).
        gammas: positive-side slope of each hidden layer.
    """

    weights: tuple[Tensor, ...]
    biases: tuple[Tensor, ...] | None
    betas: tuple[float, ...]
    gammas: tuple[float, ...]

    def __post_init__(self) -> None:
        depth = len(self.weights) - 1
        if depth < 0:
            raise ValueError("a PathNetwork needs at least one weight matrix")
        if len(self.betas) != depth or len(self.gammas) != depth:
            raise ValueError(
                f"need one (beta, gamma) per hidden layer: {depth} hidden layers, got "
                f"{len(self.betas)} betas and {len(self.gammas)} gammas"
            )
        for k in range(1, depth + 1):
            if self.weights[k].shape[1] != self.weights[k - 1].shape[0]:
                raise ValueError(
                    f"weights[{k}] has shape {tuple(self.weights[k].shape)} but weights[{k - 1}] has "
                    f"{self.weights[k - 1].shape[0]} outputs"
                )
        if self.weights[-1].shape[0] < 1:
            raise ValueError("the output layer must have at least 1 unit, got 0")
        if self.biases is not None and [b.shape[0] for b in self.biases] != [w.shape[0] for w in self.weights]:
            raise ValueError(
                f"bias sizes {[b.shape[0] for b in self.biases]} do not match layer widths "
                f"{[w.shape[0] for w in self.weights]}"
            )

    @classmethod
    def from_tensors(
        cls,
        weights: Sequence[Tensor],
        biases: Sequence[Tensor] | None,
        betas: Sequence[float],
        gammas: Sequence[float],
        dtype: torch.dtype = torch.float64,
    ) -> "PathNetwork":
        """Detached copies on the CPU in ``dtype``."""
        cast = lambda ts: tuple(t.detach().to("cpu", dtype).clone() for t in ts)  # noqa: E731
        return cls(cast(weights), None if biases is None else cast(biases), tuple(map(float, betas)),
                   tuple(map(float, gammas)))

    @property
    def dtype(self) -> torch.dtype:
        return self.weights[0].dtype

    @property
    def device(self) -> torch.device:
        return self.weights[0].device

    def to(self, device: torch.device | str) -> "PathNetwork":
        """The same network with its tensors on ``device`` (itself when they are there already)."""
        device = torch.device(device)
        if self.device == device or (device.index is None and self.device.type == device.type):
            return self
        move = lambda ts: tuple(t.to(device) for t in ts)  # noqa: E731
        return PathNetwork(move(self.weights), None if self.biases is None else move(self.biases), self.betas,
                           self.gammas)

    @property
    def depth(self) -> int:
        """Number of hidden layers ``d``."""
        return len(self.weights) - 1

    @property
    def in_features(self) -> int:
        return self.weights[0].shape[1]

    @property
    def num_outputs(self) -> int:
        """Output units ``K`` (1 for a binary network)."""
        return self.weights[-1].shape[0]

    @property
    def hidden_widths(self) -> tuple[int, ...]:
        return tuple(w.shape[0] for w in self.weights[:-1])

    @property
    def num_paths(self) -> int:
        """Coordinates of path space: ``f·Ω_1···Ω_d`` plus, with biases, the paths seeded at each layer."""
        widths = self.hidden_widths
        count = self.in_features * math.prod(widths)
        if self.biases is not None:
            count += 1 + sum(math.prod(widths[k:]) for k in range(len(widths)))
        return count


def forward_with_slopes(net: PathNetwork, x: Tensor) -> tuple[Tensor, list[Tensor]]:
    """Network output ``N(x)`` (shape ``(n,)`` for one output unit, ``(n, K)`` for ``K > 1``) and the slopes
    ``sigma_l(x)`` of each hidden layer."""
    x = x.reshape(x.shape[0], -1)
    if x.shape[1] != net.in_features:
        raise ValueError(f"inputs have {x.shape[1]} features, the path network expects {net.in_features}")
    chunks = _InputChunks(x, net.dtype)
    if x.dtype == net.dtype or len(x) <= chunks.step:
        return _forward(net, x.to(net.dtype))
    parts = [_forward(net, chunks(rows)) for rows in chunks.ranges()]  # no converted copy of all of x
    return torch.cat([out for out, _ in parts]), [torch.cat(layer) for layer in zip(*(s for _, s in parts))]


def _forward(net: PathNetwork, h: Tensor) -> tuple[Tensor, list[Tensor]]:
    layer_slopes = []
    for k, a in enumerate(net.weights[:-1]):
        z = h @ a.T
        if net.biases is not None:
            z = z + net.biases[k]
        s = slopes(z, net.betas[k], net.gammas[k])
        layer_slopes.append(s)
        h = s * z
    out = h @ net.weights[-1].T
    if net.biases is not None:
        out = out + net.biases[-1]
    return (out[:, 0] if net.num_outputs == 1 else out), layer_slopes


def _combine(input_gram: Tensor, grams: Sequence[Tensor], bias: bool) -> Tensor:
    """``G_0 ∘ Π G_l``, plus ``1 + Σ_k Π_{l>=k} G_l`` for the bias paths (Horner from the top)."""
    if not bias:
        for g in grams:
            input_gram *= g
        return input_gram
    upper = torch.ones_like(input_gram)
    total = torch.ones_like(input_gram)
    for g in reversed(grams):
        upper = upper * g
        total += upper
    return total + input_gram * upper


def _kernel_block(
    x_a: Tensor, slopes_a: Sequence[Tensor], x_b: Tensor, slopes_b: Sequence[Tensor], bias: bool
) -> Tensor:
    return _combine(x_a @ x_b.T, [s_a @ s_b.T for s_a, s_b in zip(slopes_a, slopes_b)], bias)


def path_kernel_diagonal(x: Tensor, slopes: Sequence[Tensor], *, bias: bool = False,
                         dtype: torch.dtype | None = None) -> Tensor:
    """``K(x_i, x_i) = ||phi(x_i)||²`` for each sample, in ``O(n·(f + Σ Ω_l))``, in ``dtype`` (default the wider of
    the inputs' and the slopes'; inputs of a narrower dtype are converted a chunk of rows at a time)."""
    x = x.reshape(x.shape[0], -1)
    dtype = dtype or (torch.promote_types(x.dtype, slopes[0].dtype) if len(slopes) else x.dtype)
    squares = _InputChunks(x, dtype).concat(lambda chunk: (chunk * chunk).sum(1))
    return _combine(squares, [(s * s).to(dtype).sum(1) for s in slopes], bias)


INPUT_CHUNK_BYTES = 8 << 20  # rows of the training inputs converted to the analysis dtype at a time
# kernel columns hold one converted copy of narrower inputs up to this size (a conversion per block of columns cost
# about 8% of an analysis at m = 20,000); larger training sets are converted a chunk at a time, for memory
INPUT_COPY_BYTES = 256 << 20


class _InputChunks:
    """Rows ``lo:hi`` of ``x`` in ``dtype``: views when ``x`` has that dtype, else copies into one buffer that every
    chunk reuses (a fresh allocation per chunk costs its page faults). Use a chunk before asking for the next."""

    def __init__(self, x: Tensor, dtype: torch.dtype) -> None:
        self.x, self.dtype = x, dtype
        self.step = max(1, INPUT_CHUNK_BYTES // max(1, x.shape[1] * torch.empty((), dtype=dtype).element_size()))
        self._buffer: Tensor | None = None

    def ranges(self, start: int = 0, stop: int | None = None) -> list[slice]:
        stop = len(self.x) if stop is None else stop
        return [slice(lo, min(stop, lo + self.step)) for lo in range(start, stop, self.step)]

    def __call__(self, rows: slice) -> Tensor:
        if self.x.dtype == self.dtype:
            return self.x[rows]
        if self._buffer is None:
            self._buffer = torch.empty(self.step, self.x.shape[1], dtype=self.dtype, device=self.x.device)
        return self._buffer[:rows.stop - rows.start].copy_(self.x[rows])

    def concat(self, per_row) -> Tensor:
        """``per_row`` (a function of a chunk giving one value per row) over all rows, concatenated."""
        return torch.cat([per_row(self(rows)) for rows in self.ranges()]) if len(self.x) \
            else per_row(self.x[:0].to(self.dtype))


def analysis_inputs(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``x`` as the analysis keeps it: unchanged when its dtype is a narrower float (every value is exact in
    ``dtype``; the kernels convert it exactly, in chunks or, up to :data:`INPUT_COPY_BYTES`, one copy), else cast."""
    if x.is_floating_point() and torch.finfo(x.dtype).bits < torch.finfo(dtype).bits:
        return x
    return x.to(dtype)


# a copy of the inputs leaves out the features zero in every sample when they are at least this share of them
ZERO_FEATURES_SHARE = 0.02


def used_features(x: Tensor) -> Tensor:
    """``x`` (2-d) without the features that are zero in every sample, when they are at least
    :data:`ZERO_FEATURES_SHARE` of them (a new tensor), else ``x`` itself: every inner product between samples is
    the same."""
    used = (x.amax(0) != 0) | (x.amin(0) != 0)  # a third of the time of (x != 0).any(0)
    kept = int(used.sum())
    if kept == 0 or kept > (1.0 - ZERO_FEATURES_SHARE) * x.shape[1]:
        return x
    return x.index_select(1, torch.nonzero(used)[:, 0])


def _input_gram_rows(chunks: _InputChunks, idx: Tensor) -> Tensor:
    """``(X Xᵀ)[idx, :]`` in the dtype of ``chunks``."""
    left = chunks.x[idx].to(chunks.dtype)
    if chunks.x.dtype == chunks.dtype:
        return left @ chunks.x.T
    out = torch.empty(len(idx), len(chunks.x), dtype=chunks.dtype, device=chunks.x.device)
    for rows in chunks.ranges():
        torch.mm(left, chunks(rows).T, out=out[:, rows])
    return out


def path_kernel(
    x_a: Tensor,
    slopes_a: Sequence[Tensor],
    x_b: Tensor | None = None,
    slopes_b: Sequence[Tensor] | None = None,
    *,
    bias: bool = False,
    block_size: int | None = None,
) -> Tensor:
    """Path kernel ``K(x, x') = <phi(x), phi(x')>`` between two sets of samples.

    Without biases ``K = (X_a X_bᵀ) ∘ Π_l (S_a,l S_b,lᵀ)``; with biases the paths seeded at each layer add
    ``1 + Σ_k Π_{l>=k} G_l`` (DESIGN.md §1). Computed in blocks of rows of ``x_a``: cost
    ``O(n_a·n_b·(f + Σ Ω_l))`` time (half of it for the kernel of one set, whose upper blocks are mirrored),
    ``O(n_a·n_b)`` memory for the result plus one block of Gram matrices.

    Args:
        x_a: inputs of path space, ``(n_a, f)`` (flattened embeddings for CNN+FC networks).
        slopes_a: per-layer slopes of ``x_a`` from :func:`forward_with_slopes`.
        x_b, slopes_b: the second set; ``None`` for ``x_a`` itself.
        bias: whether the network has biases.
        block_size: rows per block; default keeps a block's Gram matrices near 32 MiB.

    Returns:
        ``(n_a, n_b)`` tensor in the dtype of ``x_a``.
    """
    symmetric = x_b is None
    if symmetric:
        x_b, slopes_b = x_a, slopes_a
    if slopes_b is None or len(slopes_a) != len(slopes_b):
        raise ValueError("slopes_a and slopes_b must list the same number of layers")
    x_a, x_b = x_a.reshape(x_a.shape[0], -1), x_b.reshape(x_b.shape[0], -1)
    if x_a.shape[1] != x_b.shape[1]:
        raise ValueError(f"x_a has {x_a.shape[1]} features and x_b {x_b.shape[1]}")
    n_a, n_b = x_a.shape[0], x_b.shape[0]
    if block_size is None:
        block_size = max(1, (1 << 22) // max(n_b, 1))
    kernel = torch.empty(n_a, n_b, dtype=x_a.dtype, device=x_a.device)
    x_b = x_b.to(x_a.dtype)
    slopes_b = [s.to(x_a.dtype) for s in slopes_b]
    for start in range(0, n_a, block_size):
        rows = slice(start, start + block_size)
        cols = slice(start if symmetric else 0, n_b)  # symmetric: the upper blocks, mirrored below
        kernel[rows, cols] = _kernel_block(x_a[rows], [s[rows] for s in slopes_a], x_b[cols],
                                           [s[cols] for s in slopes_b], bias)
        if symmetric:  # a product X Xᵀ need not be exactly symmetric (BLAS kernels): its upper triangle, mirrored
            diagonal = kernel[rows, rows]
            diagonal.copy_(diagonal.triu() + diagonal.triu(1).mT)
            kernel[start + block_size:, rows] = kernel[rows, start + block_size:].T
    return kernel


def random_projection(a: Tensor, generator: torch.Generator) -> Tensor:
    """``a r`` in float64 for a Gaussian ``r`` drawn from ``generator``: a fingerprint of the rows of ``a``."""
    r = torch.randn(a.shape[1], generator=generator, dtype=torch.float64).to(a.device)
    return _InputChunks(a, torch.float64).concat(lambda chunk: chunk @ r)


COMPACT_ROWS = 64  # rows moved at a time when the kept rows of the cache are compacted in place
RECOMPUTE_HITS_BELOW = 8  # a request with fewer than 1/8 kept rows recomputes them (a row's product ~ 10 copies)


class InputGramCache:
    """Rows of the input Gram ``X Xᵀ`` kept between analyses of the same training inputs (a warm start).

    ``X Xᵀ`` is most of the cost of kernel columns and does not change while the network trains; the slope Grams
    are cheap. Pass one cache to repeated analyses (``network_support_vectors(..., cache=cache)``): each analysis
    reads the rows it finds, computes the others, and keeps the rows of its support vectors for the next one.
    The inputs are identified by ``(shape, dtype, X r)`` for a fixed random ``r``; other inputs reset the cache.

    Memory: ``8·m`` bytes per kept row (float64): ``8·m·s`` between analyses, up to ``8·m·s'`` during one
    (``s'`` the samples whose columns the solver asked for), on the device of ``X``.
    """

    def __init__(self) -> None:
        self._fingerprint: tuple | None = None
        self._slot: Tensor | None = None  # kept row of each sample (order of computation), -1 when absent
        self._blocks: list[Tensor] = []  # rows in the blocks they were computed in: no copies as the cache grows
        self._starts: list[int] = []  # first slot of each block
        self._next_slot = 0
        self.hits = self.misses = 0

    def __len__(self) -> int:
        """Samples whose rows are kept."""
        return 0 if self._slot is None else int((self._slot >= 0).sum())

    @property
    def nbytes(self) -> int:
        """Memory of the kept rows' blocks (a block compacted in place keeps its memory)."""
        return sum(block.untyped_storage().nbytes() for block in self._blocks)

    @property
    def samples(self) -> Tensor:
        """Samples whose rows are kept, in slot order."""
        if self._slot is None:
            return torch.zeros(0, dtype=torch.long)
        held = torch.nonzero(self._slot >= 0)[:, 0]
        return held[torch.argsort(self._slot[held])]

    def in_slot_order(self, samples: np.ndarray) -> np.ndarray:
        """``samples`` with those whose rows are kept first, in the order of the rows (a block of them is then served
        without a copy), the others after them in their order."""
        samples = np.asarray(samples, dtype=np.int64)
        if self._slot is None or not len(samples) or samples.min() < 0 or samples.max() >= len(self._slot):
            return samples  # nothing kept, or indices the caller refuses
        slots = self._slot.cpu().numpy()[samples]
        held = slots >= 0
        return np.concatenate([samples[held][np.argsort(slots[held], kind="stable")], samples[~held]])

    @staticmethod
    def _identify(x: Tensor, dtype: torch.dtype) -> tuple:
        return (tuple(x.shape), x.dtype, dtype, x.device), random_projection(x, torch.Generator().manual_seed(0)).cpu()

    def attach(self, x: Tensor, dtype: torch.dtype | None = None) -> bool:
        """Use the cache for inputs ``x`` and rows in ``dtype`` (default that of ``x``); ``True`` when its rows
        belong to them, else it is emptied."""
        fingerprint = self._identify(x, x.dtype if dtype is None else dtype)
        if self._fingerprint is not None and fingerprint[0] == self._fingerprint[0] \
                and torch.equal(fingerprint[1], self._fingerprint[1]):
            return True
        self._fingerprint = fingerprint
        self._slot = torch.full((x.shape[0],), -1, dtype=torch.long, device=x.device)
        self._blocks, self._starts, self._next_slot = [], [], 0
        return False

    def rows(self, x: Tensor, idx: Tensor, dtype: torch.dtype | None = None) -> Tensor:
        """``(X Xᵀ)[idx, :]`` in ``dtype`` (default the one the cache was attached with; a new tensor), from kept rows
        where present; computed rows are kept."""
        if dtype is None:
            dtype = x.dtype if self._fingerprint is None else self._fingerprint[0][2]
        view = self.rows_view(_InputChunks(x, dtype), idx)
        return view.clone() if self.shares(view) else view

    def rows_view(self, chunks: _InputChunks, idx: Tensor) -> Tensor:
        """:meth:`rows` of ``chunks.x`` in ``chunks.dtype``, but the cache's own block when it holds exactly these
        rows (read it, do not write it)."""
        sources = self.row_sources(chunks, idx)
        if not len(idx):
            return chunks.x.new_empty(0, chunks.x.shape[0], dtype=chunks.dtype)
        whole = whole_block(sources)
        return whole if whole is not None else gather_rows(sources, len(idx), slice(None))

    def row_sources(self, chunks: _InputChunks, idx: Tensor) -> list[tuple[Tensor | None, Tensor, Tensor | None]]:
        """Where the rows ``(X Xᵀ)[idx, :]`` are, after the missing ones are computed and kept: ``(positions,
        block, rows)`` for each block that holds some, ``block[rows]`` being the rows at ``positions`` of ``idx``
        (``positions`` ``None``: all of them; ``rows`` ``None``: the whole block, in order). Read the blocks, do not
        write them; :func:`gather_rows` copies a range of columns."""
        x = chunks.x
        if self._fingerprint is not None and self._fingerprint[0][2] != chunks.dtype:
            raise ValueError(f"the cache holds rows in {self._fingerprint[0][2]}, asked for {chunks.dtype}: attach it "
                             "again for another dtype")
        if not len(idx):
            return []
        distinct = len(torch.unique(idx)) == len(idx)
        missing = idx[self._slot[idx] < 0]
        if not distinct:
            missing = torch.unique(missing)
        self.misses += len(missing)
        self.hits += len(idx) - len(missing)
        if distinct and len(missing) and len(idx) - len(missing) <= len(idx) // RECOMPUTE_HITS_BELOW:
            # a few kept rows among new ones: recomputing them costs less than gathering the block together
            missing = idx
        if len(missing):
            self._blocks.append(_input_gram_rows(chunks, missing))
            self._starts.append(self._next_slot)
            self._slot[missing] = torch.arange(self._next_slot, self._next_slot + len(missing), device=x.device)
            self._next_slot += len(missing)
        slots = self._slot[idx]
        return [(None, self._blocks[-1], None)] if self._is_last_block(slots) else self._sources(slots)

    def _is_last_block(self, slots: Tensor) -> bool:
        """Whether ``slots`` are exactly those of the last block, in order."""
        return len(slots) == len(self._blocks[-1]) and torch.equal(
            slots, torch.arange(self._starts[-1], self._next_slot, device=slots.device))

    def gram_among(self, samples: Tensor) -> Tensor:
        """``(X Xᵀ)[samples][:, samples]`` from the kept rows (every sample's row must be kept); not counted in
        :attr:`hits`. Cost: a gather of ``len(samples)`` columns from each block that holds some of the rows."""
        slots = self._slot[samples] if self._slot is not None else torch.full((len(samples),), -1)
        if bool((slots < 0).any()):
            raise ValueError("gram_among needs the kept rows of every sample")
        out = self._blocks[0].new_empty(len(samples), len(samples))
        for start, block in zip(self._starts, self._blocks):
            positions = torch.nonzero((slots >= start) & (slots < start + len(block)))[:, 0]
            if len(positions):
                out[positions] = block[:, samples][slots[positions] - start]
        return out

    def holds(self, samples: Tensor) -> bool:
        """Whether the rows of all ``samples`` are kept."""
        return self._slot is not None and bool((self._slot[samples] >= 0).all())

    def shares(self, rows: Tensor) -> bool:
        """Whether ``rows`` is one of the cache's own blocks (to be read, not written)."""
        return any(rows.data_ptr() == block.data_ptr() for block in self._blocks)

    def keep(self, samples) -> None:
        """Keep the rows of ``samples`` only (e.g. the support vectors), freeing the others."""
        if not self._blocks:
            return
        samples = as_tensor_on(samples, torch.long, self._slot.device)
        samples = torch.unique(samples[self._slot[samples] >= 0])
        slots, order = torch.sort(self._slot[samples])  # kept in slot order: each block's rows are copied once
        samples = samples[order]
        kept = None
        if self._is_last_block(slots):
            kept = self._blocks[-1]
        elif len(samples):
            kept = self._compacted(slots)
        self._slot.fill_(-1)
        self._slot[samples] = torch.arange(len(samples), device=self._slot.device)
        self._blocks, self._starts = ([kept], [0]) if kept is not None else ([], [])
        self._next_slot = len(samples)

    def _compacted(self, slots: Tensor) -> Tensor:
        """The rows of ``slots`` (ascending) as one block: in the first block's memory when they fill at least half
        of it, as after a warm start (no new memory to fault in, no copy of the rows already in place), else new."""
        first = self._blocks[0]
        in_place = len(first) >= len(slots) >= len(first) / 2
        kept = first[:len(slots)] if in_place else first.new_empty(len(slots), first.shape[1])
        bounds = torch.searchsorted(slots, torch.tensor(self._starts + [self._next_slot], device=slots.device))
        for start, block, lo, hi in zip(self._starts, self._blocks, bounds[:-1].tolist(), bounds[1:].tolist()):
            if hi <= lo:
                continue
            rows = slots[lo:hi] - start
            if not (in_place and block is first):
                torch.index_select(block, 0, rows, out=kept[lo:hi])
                continue
            # first's own kept rows move up (row j from rows[j] >= j), a chunk read whole before it is written:
            # the rows it overwrites were read with the chunks before it, the later chunks read rows past it
            for a in range(0, hi, COMPACT_ROWS):
                z = min(hi, a + COMPACT_ROWS)
                if int(rows[z - 1]) != z - 1:  # distinct, ascending and >= j: in place exactly when the last one is
                    first[a:z] = first.index_select(0, rows[a:z])
        return kept

    def _sources(self, slots: Tensor) -> list[tuple[Tensor | None, Tensor, Tensor]]:
        """``(positions, block, rows)`` of the blocks that hold ``slots`` (see :meth:`row_sources`)."""
        sources = []
        for start, block in zip(self._starts, self._blocks):
            positions = torch.nonzero((slots >= start) & (slots < start + len(block)))[:, 0]
            if len(positions) == len(slots):
                return [(None, block, slots - start)]
            if len(positions):
                sources.append((positions, block, slots[positions] - start))
        return sources


def whole_block(sources: list[tuple[Tensor | None, Tensor, Tensor | None]]) -> Tensor | None:
    """The cache's block when :meth:`InputGramCache.row_sources` found the rows to be exactly one whole block, in
    order (read it in place), else ``None``."""
    return sources[0][1] if len(sources) == 1 and sources[0][2] is None else None


def gather_rows(sources: list[tuple[Tensor | None, Tensor, Tensor]], count: int, cols: slice,
                out: Tensor | None = None) -> Tensor:
    """Columns ``cols`` of the ``count`` rows that :meth:`InputGramCache.row_sources` located (not a
    :func:`whole_block`: read that in place), copied into ``out`` (a new ``(count, width)`` tensor when ``None``;
    contiguous)."""
    first = sources[0][1]
    width = len(range(first.shape[1])[cols])
    out = first.new_empty(count, width) if out is None else out
    for positions, block, rows in sources:
        part = block[:, cols]
        if positions is None:
            torch.index_select(part, 0, rows, out=out)
        else:
            out.index_copy_(0, positions, part.index_select(0, rows))
    return out


class PathKernelColumns(KernelColumns):
    """Columns ``K[:, idx]`` of the path kernel of one training set, computed on demand: the solver's
    :class:`~lightning_nsv.solver.protocol.KernelColumns` (signed columns and blocks, rows on the device of ``x``).

    The slope Gram matrices come from one product of 0/1 indicators per layer in float32: with ``P_l`` the
    indicator of ``z >= 0`` (slope ``gamma``) and ``c_l`` its row sums,
    ``G_l = (gamma − beta)² P_l P_lᵀ + beta(gamma − beta)(c_l,i + c_l,j) + beta² Ω_l``; the counts ``P_l P_lᵀ``
    are integers ``<= Ω_l`` and exact in float32 below ``2**24``, so ``G_l`` is exact up to float64 rounding.
    The input Gram ``X Xᵀ[:, idx]`` is computed in the analysis dtype ``dtype`` (default that of ``x``); inputs of
    a narrower float dtype are converted once when the copy takes at most :data:`INPUT_COPY_BYTES` (the copy leaves
    out features that are zero in every sample, :func:`used_features`), else they stay as given and are converted
    a chunk of rows at a time (exact either way). An :class:`InputGramCache` keeps its rows between analyses of the
    same inputs.
    Each block of columns is formed a chunk of samples at a time (the products of a chunk stay in cache), with one
    conversion buffer per instance: do not call one instance from several threads at once. Everything runs on the
    device of ``x``.

    Cost per call: ``O(m·b·(f + Σ Ω_l))`` for ``b`` columns; memory ``O(m·b)`` plus ``x`` and the indicators.
    """

    def __init__(self, x: Tensor, layer_slopes: Sequence[Tensor], betas: Sequence[float],
                 gammas: Sequence[float], *, bias: bool = False,
                 input_gram_cache: InputGramCache | None = None, dtype: torch.dtype | None = None) -> None:
        if not len(layer_slopes) == len(betas) == len(gammas):
            raise ValueError(f"need slopes, betas and gammas per hidden layer, got {len(layer_slopes)}, "
                             f"{len(betas)} and {len(gammas)}")
        widest = max((s.shape[1] for s in layer_slopes), default=0)
        if widest >= 1 << 24:
            raise ValueError(f"a hidden layer of {widest} units is too wide for exact float32 counts (< 2**24)")
        self.x = x.reshape(x.shape[0], -1)
        self._dtype = self.x.dtype if dtype is None else dtype
        if analysis_inputs(self.x, self.dtype) is not self.x:
            raise ValueError(f"inputs of dtype {self.x.dtype} are not exact in the analysis dtype {self.dtype}: "
                             "convert them first")
        self.bias = bias
        self.betas, self.gammas = tuple(map(float, betas)), tuple(map(float, gammas))
        self.indicators = [(s == g).to(torch.float32) for s, g in zip(layer_slopes, self.gammas)]
        self.counts = [p.sum(1).to(self.dtype) for p in self.indicators]
        converted = self.x.numel() * torch.finfo(self.dtype).bits // 8
        copy = self.x.dtype != self.dtype and converted <= INPUT_COPY_BYTES
        # the converted copy leaves out the features that are zero in every sample (border pixels): the same X Xᵀ
        self._chunks = _InputChunks(used_features(self.x).to(self.dtype) if copy else self.x, self.dtype)
        self.input_gram_cache = input_gram_cache
        if input_gram_cache is not None:
            input_gram_cache.attach(self.x, self.dtype)

    offers_block = True  # signed_block costs O(b²·(f + Σ Ω_l)), not O(m·b·…)

    def __len__(self) -> int:
        return self.x.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        """The analysis dtype the kernel is computed in."""
        return self._dtype

    @property
    def device(self) -> torch.device:
        """The device of ``x``, where everything runs."""
        return self.x.device

    def diagonal(self) -> np.ndarray:
        """``diag(K)`` as float64 numpy (:func:`path_kernel_diagonal` of the slopes the indicators hold), in
        ``O(m·(f + Σ Ω_l))``."""
        def value(v: float) -> Tensor:
            return torch.tensor(v, dtype=self.dtype, device=self.device)

        layer_slopes = [torch.where(p > 0, value(g), value(b))
                        for p, b, g in zip(self.indicators, self.betas, self.gammas)]
        return path_kernel_diagonal(self.x, layer_slopes, bias=self.bias, dtype=self.dtype).to(
            "cpu", torch.float64).numpy()

    def columns(self, idx) -> np.ndarray:
        """``K[:, idx]`` as float64 numpy (:meth:`numpy`)."""
        return self.numpy(idx)

    def slope_gram(self, layer: int, idx: Tensor, part: slice = slice(None)) -> Tensor:
        """``G_l[idx, part]`` (transposed: rows are the requested samples; ``part`` a range of samples)."""
        p, c = self.indicators[layer], self.counts[layer]
        beta, gamma = self.betas[layer], self.gammas[layer]
        gram = (p[idx] @ p[part].T).to(self.dtype)
        if beta == 0.0:
            return gram.mul_(gamma * gamma) if gamma != 1.0 else gram
        gram.mul_((gamma - beta) ** 2)
        gram += beta * (gamma - beta) * (c[idx][:, None] + c[part][None, :])
        return gram.add_(beta * beta * p.shape[1])

    def _integer_counts(self) -> bool:
        """ReLU-type layers (``beta = 0``) without biases: the product of the counts is an integer ``<= Π Ω_l``,
        exact in float32 below ``2**24``."""
        return (not self.bias and all(b == 0.0 for b in self.betas)
                and math.prod(p.shape[1] for p in self.indicators) < 1 << 24)

    def rows(self, idx) -> Tensor:
        """``K[idx, :] = K[:, idx]ᵀ``, shape ``(len(idx), m)``, on the device of ``x``."""
        return self._rows(torch.as_tensor(idx, dtype=torch.long, device=self.x.device))

    def _rows(self, idx: Tensor, signs: Tensor | None = None, factor: float = 1.0,
              part: slice | None = None, out: Tensor | None = None) -> Tensor:
        """``factor · s_idx s_jᵀ ∘ K[idx, part]`` for signs ``s`` (``±1``; none: all ``+1``), a new tensor or written
        into ``out``; ``part``: a range of samples ``j`` (default all; the input-Gram cache serves full rows only).

        Formed a chunk of samples ``j`` at a time: the input Gram of the chunk (or the cache's rows), then its slope
        factor in place. ReLU-type layers without biases take the signs into the last layer's indicator product
        (exact integer counts ``±Π P_l P_lᵀ``) and scale the input Gram once."""
        cache = self.input_gram_cache if part is None else None
        start, stop, step = (slice(None) if part is None else part).indices(len(self))
        if step != 1:
            raise ValueError(f"`part` must be a range of consecutive samples, got a step of {step}")
        stop = max(start, stop)
        sources = cache.row_sources(self._chunks, idx) if cache is not None else None
        if sources is None:
            left = self._chunks.x[idx].to(self.dtype)
        if out is None:
            out = torch.empty(len(idx), stop - start, dtype=self.dtype, device=self.x.device)
        if not len(idx):
            return out
        whole = None if sources is None else whole_block(sources)
        if sources is not None and whole is None:
            # the kept rows are gathered a chunk of columns at a time into one buffer (stays in cache) and
            # the kernel written from it: no gathered copy of whole rows, whose fresh pages cost more than the copy
            chunk_buffer = out.new_empty(len(idx) * self._chunks.step)
        integer = self._integer_counts()
        if integer and self.indicators:
            factor *= math.prod(g * g for g in self.gammas)
            last = len(self.indicators) - 1
            rights = [p if signs is None or k < last else p * signs.to(p.dtype)[:, None]
                      for k, p in enumerate(self.indicators)]
            lefts = [right[idx] for right in rights]
        zero = torch.zeros((), dtype=self.dtype, device=self.x.device)
        for cols in self._chunks.ranges(start, stop):
            block = out[:, cols.start - start:cols.stop - start]
            if sources is None:
                gram = torch.mm(left, self._chunks(cols).T, out=block)
            elif whole is not None:  # exactly one of the cache's blocks: read in place
                gram = whole[:, cols]
            else:
                width = cols.stop - cols.start
                gram = gather_rows(sources, len(idx), cols, chunk_buffer[:len(idx) * width].view(len(idx), width))
            if integer and self.indicators:
                counts = None
                for left_p, right in zip(lefts, rights):
                    counts = left_p @ right[cols].T if counts is None else counts.mul_(left_p @ right[cols].T)
                torch.addcmul(zero, gram, counts, value=factor, out=block)
                continue
            if gram is not block:
                block.copy_(gram)
            if not integer:
                kernel = _combine(block, [self.slope_gram(k, idx, cols) for k in range(len(self.indicators))],
                                  self.bias)
                if kernel is not block:
                    block.copy_(kernel)
            if signs is not None:
                block.mul_(signs[cols].to(self.dtype)[None, :]).mul_(signs[idx].to(self.dtype)[:, None])
            if factor != 1.0:
                block.mul_(factor)
        return out

    def signed_columns(self, idx, signs, scale: float) -> np.ndarray:
        """``Q[:, idx] = (s sᵀ ∘ K)[:, idx] / scale``, float64 numpy in Fortran order: what the active-set solver
        of :func:`~lightning_nsv.max_margin.max_margin` asks for (labels ``s`` in ``±1``). On the CPU in float64
        the transpose of a C-ordered array that owns its memory, which the solver's store can then shrink in place."""
        if self.x.device.type != "cpu" or self.dtype != torch.float64:
            return self.signed_rows(idx, signs, scale).to("cpu", torch.float64).numpy().T
        rows = base_page_empty((len(idx), len(self)))
        self.signed_rows(idx, signs, scale, out=torch.from_numpy(rows))
        return rows.T

    def signed_block(self, idx, signs, scale: float) -> np.ndarray:
        """``Q[idx, idx] = (s sᵀ ∘ K)[idx, idx] / scale``, float64 numpy: what the active-set solver needs of
        candidates before it forms their full columns (:meth:`signed_columns`). Cost ``O(b²·(f + Σ Ω_l))``; the input
        Gram is read from the cache when it keeps the rows of all of ``idx``."""
        device = self.x.device
        idx = as_tensor_on(idx, torch.long, device)
        cache = self.input_gram_cache
        if cache is not None and len(idx) and cache.holds(idx):
            gram = cache.gram_among(idx)
        else:
            left = self._chunks.x[idx].to(self.dtype)
            gram = left @ left.T
        kernel = _combine(gram, [self.slope_gram(k, idx, idx) for k in range(len(self.indicators))], self.bias)
        s = as_tensor_on(signs, self.dtype, device)[idx]
        return (kernel * (s[:, None] * s[None, :]) / scale).to("cpu", torch.float64).numpy()

    def signed_rows(self, idx, signs, scale: float, part: slice | None = None, out: Tensor | None = None) -> Tensor:
        """``Q[part, idx]ᵀ``, shape ``(len(idx), len(part))``, on the device of ``x`` (see :meth:`signed_columns`), a
        new tensor or written into ``out``."""
        device = self.x.device
        return self._rows(as_tensor_on(idx, torch.long, device), as_tensor_on(signs, self.dtype, device), 1.0 / scale,
                          part, out)

    def __call__(self, idx) -> Tensor:
        """``K[:, idx]``, shape ``(m, len(idx))``, on the device of ``x``."""
        return self.rows(idx).T

    def numpy(self, idx):
        """``K[:, idx]`` as a float64 numpy array in Fortran order (the solver's columns)."""
        return self.rows(idx).to("cpu", torch.float64).numpy().T


def as_tensor_on(values, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Indices or labels given as a tensor (on any device), an array or a list, as a tensor on ``device``."""
    return torch.as_tensor(values if isinstance(values, Tensor) else np.asarray(values), dtype=dtype, device=device)


def path_norm_squared(net: PathNetwork) -> float:
    """``||wbar||²``: the squared weights multiplied along every path, summed (a forward pass of ones)."""
    if net.num_outputs != 1:
        raise ValueError(f"path_norm_squared needs 1 output unit, got {net.num_outputs}: use multiclass.output_gram")
    mass = torch.ones(net.in_features, dtype=net.dtype, device=net.device)
    for k, a in enumerate(net.weights):
        mass = (a * a) @ mass
        if net.biases is not None:
            mass = mass + net.biases[k] ** 2
    return float(mass[0])


@dataclass(frozen=True)
class PathSigns:
    """Signs of the path weights ``wbar``, summed over all paths without enumerating them."""

    positive_mass: float
    negative_mass: float
    positive_count: float
    negative_count: float
    num_paths: int

    @property
    def positive_mass_fraction(self) -> float:
        total = self.positive_mass + self.negative_mass
        return self.positive_mass / total if total > 0 else float("nan")

    @property
    def positive_count_fraction(self) -> float:
        return self.positive_count / self.num_paths

    def to_metrics(self) -> dict[str, float]:
        return {
            "path_positive_mass_fraction": self.positive_mass_fraction,
            "path_positive_count_fraction": self.positive_count_fraction,
            "path_negative_count": self.negative_count,
            "path_zero_count": self.num_paths - self.positive_count - self.negative_count,
        }


def path_signs(net: PathNetwork) -> PathSigns:
    """Positive and negative path mass (sum of ``|wbar_p|``) and path counts by sign.

    Dynamic programme over layers: the positive and negative mass entering each neuron obey
    ``P' = A⁺P + A⁻N``, ``N' = A⁺N + A⁻P`` (``A⁺``, ``A⁻`` the positive and negative parts of ``A``);
    counts use the indicators ``[A > 0]``, ``[A < 0]``. Counts are exact up to ``2**53`` paths.
    """
    if net.num_outputs != 1:
        raise ValueError(f"path_signs needs 1 output unit, got {net.num_outputs}")

    def propagate(pos_part, neg_part, pos_bias, neg_bias):
        pos = torch.ones(net.in_features, dtype=net.dtype, device=net.device)
        neg = torch.zeros_like(pos)
        for k, a in enumerate(net.weights):
            pos, neg = pos_part(a) @ pos + neg_part(a) @ neg, pos_part(a) @ neg + neg_part(a) @ pos
            if net.biases is not None:
                pos, neg = pos + pos_bias(net.biases[k]), neg + neg_bias(net.biases[k])
        return float(pos[0]), float(neg[0])

    pos_mass, neg_mass = propagate(lambda a: a.clamp(min=0), lambda a: (-a).clamp(min=0),
                                   lambda b: b.clamp(min=0), lambda b: (-b).clamp(min=0))
    ind_pos, ind_neg = (lambda a: (a > 0).to(net.dtype)), (lambda a: (a < 0).to(net.dtype))
    pos_count, neg_count = propagate(ind_pos, ind_neg, ind_pos, ind_neg)
    return PathSigns(pos_mass, neg_mass, pos_count, neg_count, net.num_paths)


def unique_patterns(*slope_sets: Sequence[Tensor], gammas: Sequence[float]) -> int:
    """Number of distinct activation patterns (all hidden slopes of a sample) across the given sets.

    A network without hidden layers has one (empty) pattern.
    """
    if not gammas:
        return 1
    bits = torch.cat(
        [torch.cat([s == g for s, g in zip(layer_slopes, gammas)], dim=1) for layer_slopes in slope_sets]
    )
    if bits.shape[0] == 0:
        return 0
    pad = (-bits.shape[1]) % 64  # whole int64 words: one sort of integers where a pattern fits a word
    bits = torch.nn.functional.pad(bits.to(torch.uint8), (0, pad)).reshape(bits.shape[0], -1, 8)
    packed = (bits << torch.arange(7, -1, -1, dtype=torch.uint8, device=bits.device)).sum(-1, dtype=torch.uint8)
    words = packed.contiguous().view(torch.int64)
    return int((torch.unique(words[:, 0]) if words.shape[1] == 1 else torch.unique(words, dim=0)).shape[0])
