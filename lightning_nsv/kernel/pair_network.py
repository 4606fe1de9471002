"""Path kernel, ``||wbar||²`` and the output Gram of any traced piecewise-linear network (DESIGN.md §2c).

``K(x, x') = Σ_p phi_p(x) phi_p(x')`` is the output of the *pair network* run on ``x ⊙ x'`` with the gates of both
samples; ``||wbar||²`` is the output of the *norm network* run on ones (the rules are in
:mod:`lightning_nsv.kernel.rules`). Everything runs in float64 on the device of the traced graph.
"""
from __future__ import annotations

import contextlib
import math
import time

import numpy as np
import torch
from torch import Tensor

from lightning_nsv.errors import NonFiniteError
from lightning_nsv.kernel.bitmasks import Bits
from lightning_nsv.kernel.column_cache import ColumnCache, cached_columns, even_parts, symmetric_block
from lightning_nsv.kernel.factored import Terms, channel_overlap, plain
from lightning_nsv.kernel.gates import MEMORY_BYTES, Gates, rows_per_block, compute_gates
from lightning_nsv.kernel.summary import ScopeSummary, scope_summary, unique_patterns
from lightning_nsv.kernel.graph import PiecewiseGraph, run
from lightning_nsv.kernel.columns import PathKernelColumns
from lightning_nsv.kernel.formulas import path_kernel, path_kernel_diagonal
from lightning_nsv.kernel.fused import FusedPairs, NotFusable, fuse
from lightning_nsv.kernel.pair_checks import check_engine, check_samples
from lightning_nsv.kernel.path_norm import output_gram, path_norm_squared
from lightning_nsv.kernel.piece_rules import piece_sides
from lightning_nsv.kernel.slopes import gate_slopes, relu_type
from lightning_nsv.solver.protocol import KernelColumns, signed_rows
from lightning_nsv.validate import check_bytes

__all__ = ["Gates", "PairNetworkColumns", "ScopeSummary", "compute_gates", "output_gram", "path_norm_squared",
           "scope_summary", "unique_patterns"]

# default budget of the columns PairNetworkColumns keeps (8·m bytes each: the whole kernel up to m = 11,585)
CACHE_BYTES = 1 << 30


class _PairContext:
    """Gate products ``sigma(x) sigma(x')`` and shared max-pool selections of the pairs in a block: every
    ``(a[i], b[j])`` when ``outer`` (pair ``i·len(b) + j``), else ``(a[p], b[p])``. The context of the ``pair``
    and ``factored`` modes (:class:`~lightning_nsv.kernel.factored.PairContext`,
    :class:`~lightning_nsv.kernel.factored.FactoredContext`).

    Gates stay bits until a block needs them: the slopes of the block's rows and of its columns are formed once
    per gate layer (``len(a) + len(b)`` samples, not one value per pair) and multiply the pair values by
    broadcasting, in place where the value is the block's own."""

    def __init__(self, graph: PiecewiseGraph, gates: Gates, a: Tensor, b: Tensor, outer: bool,
                 collapse: bool = True) -> None:
        self.gates, self.a, self.b, self.outer, self.collapse = gates, a, b, outer, collapse
        self.family = {name: (beta, gamma) for name, _, beta, gamma, _ in graph.gates}
        self._sides: dict[str, tuple[Tensor, Tensor]] = {}

    def combine(self, t: Tensor, fn) -> Tensor:
        """``fn(t[first], t[second])`` for every pair, ``(P, *t.shape[1:])``."""
        if self.outer:
            return fn(t[self.a][:, None], t[self.b][None]).reshape(-1, *t.shape[1:])
        return fn(t[self.a], t[self.b])

    def sides(self, name: str) -> tuple[Tensor, Tensor]:
        """The slopes of the block's first and second samples at gate layer ``name``, float64."""
        if name not in self._sides:
            beta, gamma = self.family[name]
            bits = self.gates.bits[name]
            self._sides[name] = (gate_slopes(bits[self.a], beta, gamma), gate_slopes(bits[self.b], beta, gamma))
        return self._sides[name]

    def bit_sides(self, name: str) -> tuple[Bits, Bits] | None:
        """The slopes of a ReLU-type gate layer (``beta = 0``: ``gamma`` times a mask) as packed bits of the block's
        first and second samples; ``None`` for other layers."""
        beta, gamma = self.family[name]
        if not relu_type(beta):
            return None
        packed = self.gates.packed(name, gamma)
        return packed[self.a], packed[self.b]

    def selections(self, name: str) -> Tensor:
        """Every sample's choices at max pool or max over a dim ``name``."""
        return self.gates.selections[name]

    def hits(self, name: str, j: int, unit: Tensor, valid: Tensor) -> Bits:
        """Whether each sample selects unit ``j`` of max pool ``name``'s windows, as packed bits."""
        return self.gates.hits(name, j, unit, valid)

    def gate(self, name: str, v: Tensor) -> Tensor:
        """DESIGN.md §2c: a gate multiplies the pair value by ``sigma(x) sigma(x')``."""
        first, second = self.sides(name)
        if not self.outer:
            return v * first * second
        shape = (len(first), len(second), *first.shape[1:])
        v = v.reshape(len(first), len(second), *v.shape[1:])
        return (v * first[:, None]).mul_(second[None]).reshape(-1, *shape[2:])

    def overlap(self, name: str) -> Tensor:
        """DESIGN.md §2c "Speed": ``C[p](x, x') = Σ_c sigma_{c,p}(x) sigma_{c,p}(x')`` per position,
        ``(P, *spatial)``; for a block of rows × columns one GEMM over channels per position (bit counts for a
        ReLU-type layer)."""
        first, second = self.bit_sides(name) or self.sides(name)
        return channel_overlap(first, second, self.outer).reshape(-1, *first.shape[2:])

    def select(self, name: str, first: Tensor, second: Tensor) -> Tensor:
        """A selection between two branches (:class:`~lightning_nsv.kernel.choice_rules.Select`): the pair values of the
        branch both samples choose, else 0."""
        bits = self.gates.bits[name]
        chose = lambda t: t.to(torch.float64)  # noqa: E731
        both_first = self.combine(bits, lambda a, b: chose(a & b))
        both_second = self.combine(bits, lambda a, b: chose(~a & ~b))
        return first * both_first + second * both_second

    def piece_sides(self, rule) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
        """``(s, c)`` of the block's first and of its second samples at saturating layer ``rule``
        (:class:`~lightning_nsv.kernel.piece_rules.PieceGate`): slopes and flat values, float64."""
        if rule.name not in self._sides:
            piece = self.gates.selections[rule.name]
            self._sides[rule.name] = (piece_sides(piece[self.a], rule.lo, rule.hi),
                                      piece_sides(piece[self.b], rule.lo, rule.hi))
        return self._sides[rule.name]

    def piece(self, rule, v: Tensor) -> Tensor:
        """A saturating piece (§2c): ``s(x) s(x') v + c(x) c(x')``, the flat values a path start of their own."""
        (s_first, c_first), (s_second, c_second) = self.piece_sides(rule)
        if not self.outer:
            return v * s_first * s_second + c_first * c_second
        rows, cols = len(s_first), len(s_second)
        v = v.reshape(rows, cols, *v.shape[1:])
        out = (v * s_first[:, None]).mul_(s_second[None]).addcmul_(c_first[:, None], c_second[None])
        return out.reshape(rows * cols, *out.shape[2:])

    def line_select(self, rule, v: Tensor) -> Tensor:
        """A max over a dim (:class:`~lightning_nsv.kernel.piece_rules.LineMax`): the candidate both samples choose,
        else 0."""
        chosen = self.gates.selections[rule.name]
        first = rule.chosen(self.combine(chosen, lambda a, b: torch.broadcast_tensors(a, b)[0]))
        same = self.combine(chosen, lambda a, b: a == b)
        picked = v.gather(rule.dim, first)
        picked = picked if rule.keepdim else picked.squeeze(rule.dim)
        return picked * same

    def pool(self, name: str, v: Tensor) -> Tensor:
        """Max pool ``name`` on pair values ``v`` (``(P, C, *in)``): the unit x selects where x' selects the same
        one, else 0 (§2c), ``(P, C, *out)``."""
        chosen = self.gates.selections[name]
        first, second = chosen[self.a].to(torch.long).flatten(2), chosen[self.b].flatten(2)
        if not self.outer:
            picked = v.flatten(2).gather(2, first)
            return (picked * (chosen[self.a].flatten(2) == second)).view(len(v), *chosen.shape[1:])
        rows, cols = len(first), len(second)
        v = v.reshape(rows, cols, *v.shape[1:2], -1)
        picked = v.gather(3, first[:, None].expand(rows, cols, *first.shape[1:]))
        same = chosen[self.a].flatten(2)[:, None] == second[None]
        return picked.mul_(same).view(rows * cols, *chosen.shape[1:])


class PairNetworkColumns(KernelColumns):
    """Columns ``K[:, idx]`` of the path kernel of a traced network on ``m`` training inputs (DESIGN.md §2c).

    Each entry is the output of the pair network on ``x_i ⊙ x_j``. ``engine`` says how (:attr:`engine` names what
    was chosen): ``"auto"`` (default) runs the graph's compiled pair program (:mod:`lightning_nsv.kernel.fused`:
    numba on a CPU, torch operations elsewhere; ``"numba"`` or ``"torch"`` ask for one) and, for a graph the
    program cannot express, the torch factored network (channels kept as per-sample factors, blocks of pairs sized
    so that the values alive at once stay near ``memory_bytes``); ``"reference"`` that torch network always
    (``factored=False``/``collapse=False``: the plain one). A plain Linear/Leaky-ReLU chain takes §1's factorised
    kernel (``fast=True``, the default).

    Cost: one pair-network evaluation per unordered pair (about 3 µs for a trained SmallResNet(3, 1, 16, (1, 1)) on
    3×32×32 on two CPU threads with the compiled program; 25–35 µs with the torch network), about, while the columns
    fit in ``cache_bytes`` (:mod:`lightning_nsv.kernel.column_cache`): columns asked for are kept, a new column ``j``
    reads ``K[r, j] = K[j, r]`` from kept columns, from earlier columns of the same call and from the last ``block``;
    ``block`` reads kept columns and runs the tiles ``i <= j`` of the rest. The dense kernel costs ``m(m + w)/2``
    pairs (``w`` a tile's width, :attr:`tile_width`: 16 for the compiled program). Memory: the inputs and gates of
    all samples, the compiled program's per-sample factors (37 KiB a sample for that network), one block of about
    ``memory_bytes``, the kept columns (``8·m`` bytes each, up to ``cache_bytes``; 0
    keeps none) and the last ``block`` (``8·b²`` bytes, if within ``cache_bytes``). Float64, on the graph's device.
    With K outputs every output has the same kernel (checked exactly). ``pairs_evaluated`` counts the pairs run.

    A :class:`~lightning_nsv.solver.protocol.KernelColumns`: the solver reads it as it is (numpy ``columns`` and
    ``diagonal``, ``signed_columns`` owned by the caller, ``signed_rows`` on the graph's device, ``signed_block`` on
    ``idx × idx`` pairs only); ``columns_tensor``, ``diagonal_tensor`` and ``block`` give float64 tensors on the
    graph's device.
    """

    def __init__(self, graph: PiecewiseGraph, x: Tensor, gates: Gates, *, memory_bytes: int = MEMORY_BYTES,
                 fast: bool = True, collapse: bool = True, factored: bool = True,
                 cache_bytes: int = CACHE_BYTES, engine: str = "auto") -> None:
        check_engine(engine, factored, collapse)
        check_bytes("memory_bytes", memory_bytes)
        check_bytes("cache_bytes", cache_bytes, low=0)
        check_samples(graph, x, gates)  # before anything is formed: non-finite inputs named, not run
        self.graph, self.gates, self.collapse, self.factored = graph, gates, collapse, factored
        self.x = x.detach().to(graph.device, torch.float64)
        self.pairs_per_block = rows_per_block(graph, memory_bytes)
        self.cache = ColumnCache(len(self.x), cache_bytes, graph.device)
        self.pairs_evaluated = 0
        self._chain = None
        self.fused: FusedPairs | None = None
        self.on_pairs = None  # called with the number of pairs of every block run (a progress bar)
        self.engine = "plain torch"  # how entries are computed, for reports
        if fast and graph.chain is not None:
            self.engine = "Linear chain (§1's factorised kernel)"
        elif engine != "reference" and factored and collapse:
            try:
                self.fused = fuse(graph, self.x, gates, engine)
                self.engine = f"fused pair program ({self.fused.engine})"
            except NotFusable as why:
                if engine != "auto":
                    raise
                self.engine = f"factored torch (not fused: {why})"
        elif factored and collapse:
            self.engine = "factored torch"
        if fast and graph.chain is not None:
            linears, layers = graph.chain
            slopes = [gate_slopes(gates.bits[g.name], g.beta, g.gamma) for g in layers]
            flat = self.x.reshape(len(self.x), -1)
            self._chain = (flat, slopes, [g.beta for g in layers], [g.gamma for g in layers],
                           linears[0].bias is not None)
            self._columns = PathKernelColumns(flat, slopes, self._chain[2], self._chain[3], bias=self._chain[4])

    @property
    def device(self) -> torch.device:
        return self.graph.device

    def owning_the_cores(self) -> contextlib.AbstractContextManager:
        """A block in which torch runs on one thread and the compiled runner on the threads torch had
        (:meth:`FusedPairs.owning_the_cores`): around a solve, whose small torch steps between tiles would
        otherwise leave torch's workers spinning on the runner's cores."""
        return self.fused.owning_the_cores() if self.fused is not None else contextlib.nullcontext()

    @property
    def dtype(self) -> torch.dtype:
        return torch.float64

    def __len__(self) -> int:
        return len(self.x)

    def pairs(self, a: Tensor, b: Tensor, outer: bool = False) -> Tensor:
        """``K(x_a[p], x_b[p])`` for index vectors ``a``, ``b`` of one length, by the pair network; with ``outer``
        every pair ``(a[i], b[j])``, flattened (``i·len(b) + j``)."""
        self.pairs_evaluated += len(a) * len(b) if outer else len(a)
        if self.on_pairs is not None:
            self.on_pairs(len(a) * len(b) if outer else len(a))
        if self.fused is not None:
            out = (self.fused.outer(a, b) if outer else self.fused.aligned(a, b)).reshape(-1)
            if not torch.isfinite(out).all():
                raise NonFiniteError("the pair network gave a non-finite kernel value")
            return out
        ctx = _PairContext(self.graph, self.gates, a, b, outer, self.collapse)
        # the factored network's per-sample work (len(a) + len(b) samples a block) pays only in blocks of many rows
        # and columns; aligned pairs (the diagonal) gain nothing
        if self.factored and outer and min(len(a), len(b)) >= self.factored_min_side:
            out = plain(run(self.graph, Terms.input(ctx, self.x), "factored", ctx))
        else:
            out = run(self.graph, ctx.combine(self.x, torch.mul), "pair", ctx)
        if out.dim() == 2:
            if not bool((out == out[:, :1]).all()):
                raise ValueError("the outputs of this network have different path kernels (its last map does not "
                                 "join every output to the same units)")
            out = out[:, 0]
        if not torch.isfinite(out).all():
            raise NonFiniteError("the pair network gave a non-finite kernel value")
        return out

    @property
    def tile_width(self) -> int:
        """Columns computed at once by a request for new columns (entries between them are computed twice)."""
        return self._tile_shape(len(self), len(self))[1]

    @property
    def by_pairs(self) -> bool:
        """Whether entries come from pair-network evaluations (not §1's GEMMs of a Linear chain)."""
        return self._chain is None

    def time_pairs(self, rows: Tensor, cols: Tensor) -> tuple[float, int]:
        """Seconds that the entries ``K[rows][:, cols]`` take to compute (neither kept nor counted), and their
        number: the rate the analysis' cost estimate reads."""
        counted, hook = self.pairs_evaluated, self.on_pairs
        self.on_pairs = None
        start = time.perf_counter()
        try:
            if self._chain is not None:
                self._columns(cols.to(self.device))
            else:
                self._tiles(rows.to(self.device), cols.to(self.device))
        finally:
            self.pairs_evaluated, self.on_pairs = counted, hook
        return time.perf_counter() - start, len(rows) * len(cols)

    def _index(self, idx) -> Tensor:
        return torch.as_tensor(idx, dtype=torch.long).to(self.device).reshape(-1)

    offers_block = True  # Q[idx, idx] by the pair network on idx × idx only
    # blocks of fewer rows or columns take the plain network: one column of m = 300 (SmallResNet, 3×32×32, one
    # thread) cost 16.6 ms a pair factored and 4.9 ms plain; 12 rows × 16 columns 2.0 and 3.0 ms
    factored_min_side = 8
    # the factored network holds pair values of one channel (per-sample masks aside), far below the plain
    # network's peak: blocks of that many times ``pairs_per_block`` pairs. SmallResNet(3, 1, 16, (1, 1)), 3×32×32,
    # 300 rows × 64 columns, one CPU thread: 0.14, 0.11, 0.098, 0.093 ms a pair at 1, 2, 4, 6 times 197 pairs; with
    # packed gates, 600 rows × 64 columns, two threads: 44.6, 36, 34, 52.6 µs at 2, 4, 8, 16 times; the pair input
    # factored (no block over glibc's 32 MiB mmap threshold), 2,000 × 44: 22.4, 15.9, 15.6 µs at 2, 4, 8
    factored_block_scale = 8

    def columns(self, idx) -> np.ndarray:
        """``K[:, idx]`` as float64 numpy ``(m, len(idx))`` (the :class:`KernelColumns` protocol)."""
        return self.columns_tensor(idx).cpu().numpy()

    def diagonal(self) -> np.ndarray:
        """``diag(K)`` as float64 numpy ``(m,)`` (the :class:`KernelColumns` protocol)."""
        return self.diagonal_tensor().cpu().numpy()

    def signed_rows(self, idx, signs, scale: float) -> Tensor:
        """``Q[:, idx]ᵀ`` on the graph's device (the torch solver's columns, no round trip through numpy)."""
        return signed_rows(self.columns_tensor(idx), np.asarray(signs, dtype=np.float64), np.asarray(idx), scale)

    def columns_tensor(self, idx, part: slice | None = None) -> Tensor:
        """``K[part, idx]`` (all rows by default), shape ``(rows, len(idx))`` (unsigned), float64 on the graph's
        device. The pair network runs only on entries that no kept column holds (see the class); a slice of the rows
        reads the kept columns but keeps none."""
        idx = self._index(idx)
        lo, hi, _ = (part or slice(None)).indices(len(self))
        if self._chain is not None:
            return self._columns(idx)[lo:hi]
        return cached_columns(self.cache, idx, lo, hi, self._tile_shape(hi - lo, len(idx))[1], self._tiles)

    def _tile_shape(self, rows: int, cols: int) -> tuple[int, int]:
        """The pairs and the columns of a tile of ``_tiles`` on ``rows × cols`` pairs (the columns also make a chunk
        of new columns of ``columns_tensor``)."""
        if self.fused is not None:  # the new columns of a call go 16 at a time (rows read from earlier chunks)
            return rows * cols, min(cols, 16)
        budget = self.pairs_per_block
        if self.factored and min(rows, cols) >= self.factored_min_side:
            budget *= self.factored_block_scale
        # near-square tiles: the per-sample work of a tile (its rows and columns) is the smallest per pair
        side = max(self.factored_min_side, math.isqrt(budget))
        return budget, max(1, min(cols, side, budget // self.factored_min_side))

    def _tiles(self, rows: Tensor, cols: Tensor) -> Tensor:
        """``K[rows][:, cols]`` by blocks of at most ``pairs_per_block`` pairs (``factored_block_scale`` times as
        many for blocks of the factored network), at least ``factored_min_side`` rows where the budget allows (the
        factored network's per-sample work then pays)."""
        if self.fused is not None:  # one call: its runner blocks the pairs for the cache itself
            return self.pairs(rows, cols, outer=True).view(len(rows), len(cols))
        out = torch.empty(len(rows), len(cols), dtype=torch.float64, device=self.device)
        budget, width = self._tile_shape(len(rows), len(cols))
        height = max(1, budget // width)
        for j0, right in even_parts(cols, width):
            for i0, left in even_parts(rows, height):
                # a block too narrow for the factored network takes the plain one, within the plain budget
                plain = min(len(left), len(right)) < self.factored_min_side or not self.factored
                step = max(1, self.pairs_per_block // len(right)) if plain else len(left)
                for k0 in range(0, len(left), step):
                    part = left[k0:k0 + step]
                    out[i0 + k0:i0 + k0 + len(part), j0:j0 + len(right)] = self.pairs(part, right, outer=True).view(
                        len(part), len(right))
        return out

    def __call__(self, idx) -> Tensor:
        """``K[:, idx]`` (the column function of :func:`~lightning_nsv.solver.max_margin`)."""
        return self.columns_tensor(idx)

    def signed_columns(self, idx, signs, scale: float) -> np.ndarray:
        """``Q[:, idx] = (s sᵀ ∘ K)[:, idx] / scale``, float64 numpy in Fortran order (labels ``s`` in ``±1``): the
        solver's columns, as :class:`~lightning_nsv.kernel.PathKernelColumns` gives them."""
        idx = self._index(idx)
        s = torch.as_tensor(np.asarray(signs), dtype=torch.float64, device=self.device)
        q = self.columns_tensor(idx) * s[:, None] * (s[idx] / scale)[None, :]
        return np.asfortranarray(q.cpu().numpy())

    def signed_block(self, idx, signs, scale: float) -> np.ndarray:
        """``Q[idx, idx]``, float64 numpy."""
        idx = self._index(idx)
        s = torch.as_tensor(np.asarray(signs), dtype=torch.float64, device=self.device)[idx]
        return (self.block(idx) * s[:, None] * s[None, :] / scale).cpu().numpy()

    def block(self, idx) -> Tensor:
        """``K[idx][:, idx]``, shape ``(len(idx), len(idx))``."""
        idx = self._index(idx)
        if self._chain is not None:
            flat, slopes, _, _, bias = self._chain
            return path_kernel(flat[idx], [s[idx] for s in slopes], bias=bias)
        return symmetric_block(self.cache, idx, self._tile_shape(len(idx), len(idx))[1], self._tiles)

    def diagonal_tensor(self) -> Tensor:
        """``K(x_i, x_i) = ||phi(x_i)||²``, shape ``(m,)``, float64 on the graph's device."""
        if self._chain is not None:
            flat, slopes, _, _, bias = self._chain
            return path_kernel_diagonal(flat, slopes, bias=bias)
        step = len(self) if self.fused is not None else self.pairs_per_block
        parts = [self.pairs(rows, rows) for rows in torch.arange(len(self), device=self.device).split(max(1, step))]
        return torch.cat(parts) if parts else torch.empty(0, dtype=torch.float64, device=self.device)
