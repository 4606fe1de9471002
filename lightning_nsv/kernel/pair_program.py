"""The pair network of a traced graph compiled into one short program over per-pair maps (DESIGN.md §2c "Speed").

Between gates the pair network carries one value per position and pair (a groups=1 convolution's all-ones kernel
sums over channels); where the value depends on the channel it is a sum of terms
``coef · S[p] · A(x)[c, p] · A(x')[c, p]`` whose per-sample factors ``A`` (the input, gate slopes, max-pool hit
indicators and their products) are formed once for every sample (:mod:`lightning_nsv.kernel.pair_factors`). A
channel sum is then, per term and position, the overlap ``Σ_c A(x)[c, p] A(x')[c, p]``: the population count of
ANDed words where ``A`` is a 0/1 mask. :func:`compile_pair_program` evaluates the graph once on these symbolic values
and writes what is left for each pair as a :class:`PairProgram`: overlaps, window sums, picks, fixed sparse maps,
additions and scales on registers of a per-pair scratch array. :mod:`lightning_nsv.kernel.pair_engines` runs the
program (numba on a CPU, torch anywhere); a graph it cannot express raises :class:`NotFusable` with the reason.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
import torch.fx as fx

from lightning_nsv.kernel import rules as R
from lightning_nsv.kernel.graph import PiecewiseGraph

__all__ = ["NotFusable", "PairProgram", "compile_pair_program", "Recipe"]

# opcodes; an instruction row is [op, dst, s0, s1, i0 .. i7] (registers are scratch offsets, -1: none):
#   OVERLAP_BITS/DENSE  dst[p] (+)= value · s0[p] · Σ_w|c A_i[off + k·P + p] A_j[...]   i: P, accumulate, off, W|C
#   AXPY                dst[p] (+)= value · s0[p] (s0 -1: 1)                             i: P, accumulate
#   ADD_SCALAR, SCALE   dst[p] = s0[p] + value, value · s0[p];  ADD dst = s0 + s1         i: n
#   BOX                 window sums along the middle axis of s0 (outer, n_in, inner)       i: outer, n_in, inner, n_out,
#                       zero padding ``left`` before it, plus value                           k, stride, dilation, left
#   GATHER              dst[q] = s0[table[off + q]]                                       i: n, off
#   SPMV                dst[o] = Σ_k weights[k] s0[table[k]], k in table[ptr + o] .. table[ptr + o + 1]   i: n, ptr
#   SUM                 dst[0] = value · Σ s0                                             i: n
#   CONST               dst[q] = weights[off + q]                                         i: n, off
OVERLAP_BITS, OVERLAP_DENSE, AXPY, ADD_SCALAR, SCALE, ADD, BOX, GATHER, SPMV, SUM, CONST = range(1, 12)
OP_NAMES = {OVERLAP_BITS: "overlap_bits", OVERLAP_DENSE: "overlap_dense", AXPY: "axpy", ADD_SCALAR: "add_scalar",
            SCALE: "scale", ADD: "add", BOX: "box", GATHER: "gather", SPMV: "spmv", SUM: "sum", CONST: "const"}
ROW = 12


class NotFusable(ValueError):
    """The graph holds an operation (or a use of one) that the pair program does not express."""


# a per-sample factor: ("input",), ("gate", name), ("mul", a, b), ("pick", a | None, pool, unit), ("channels", lo,
# hi, shape) (1 on those channels), ("embed", a | None, lo, hi, shape) (a on those channels, 0 elsewhere),
# ("view", a, shape) (reshaped), ("call", a, node, shape) (the node's shape operation applied to a), ("const", k,
# shape) (the program's constants[k], the same for every sample), ("at", a, k, shape) (a read at the plane
# positions constants[k] of each output position)
Recipe = tuple


@dataclass(frozen=True)
class Term:
    """``coef · S[p] · A(x)[c, p] · A(x')[c, p]``; ``reg`` ``None``: ``S = 1``; ``factor`` ``None``: ``A = 1``."""

    coef: float
    reg: int | None
    factor: Recipe | None


@dataclass(frozen=True)
class Map:
    """The same per-pair map ``S`` (register ``reg`` over the positions) in every channel of ``shape``."""

    reg: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Terms:
    terms: tuple[Term, ...]
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Summed:
    """Only the channel sum is known (register over the positions): readers must sum over channels."""

    reg: int
    shape: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class Mapped:
    """A fixed map that acts alike on every channel (sparse over one plane: ``rows``, ``cols``, ``weights``, pair
    constants included) applied to ``inner``: a reader that sums over the channels maps the channel sum; any other
    splits it over the map's entries (:meth:`_Compiler.as_terms`)."""

    inner: Any
    sparse: tuple
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Flat:
    """A rearrangement (flatten, view, permute) of the values ``parts`` joined: readers must sum every entry."""

    parts: tuple
    shape: tuple[int, ...]


@dataclass(frozen=True)
class FactorSlot:
    """A per-sample factor: its recipe, ``bits`` (``scale`` times a 0/1 mask, in words) or ``dense`` (float64), its
    shape ``(C, *spatial)``, and where it lies in a sample's row: ``offset`` and ``count`` (words a position, or
    channels), laid out ``(count, positions)``."""

    recipe: Recipe
    bits: bool
    shape: tuple[int, ...]
    scale: float
    offset: int
    count: int


@dataclass
class PairProgram:
    """A compiled pair network: instructions (``code`` rows, ``values`` one float each), index tables (``table``
    int64, ``weights`` float64), the scratch size per pair (``scratch`` float64 values, the last ``temp`` of them a
    temporary of the overlaps), the output register, and the per-sample factors the overlaps read."""

    code: np.ndarray
    values: np.ndarray
    table: np.ndarray
    weights: np.ndarray
    scratch: int
    temp: int
    out: int
    factors: list[FactorSlot]
    operations: int  # elementary operations a pair (a multiply-add, an AND + popcount, a load-add count one each)
    word_bits: int  # bits of the words that hold 0/1 factors (16: one int16 word a position for 16 channels)
    words: int  # words of 0/1 factors per sample
    dense: int  # float64 values of the other factors per sample
    constants: list  # per-entry constants of ("const", k, shape) factors

    def describe(self) -> str:
        counts: dict[str, int] = {}
        for op in self.code[:, 0]:
            counts[OP_NAMES[int(op)]] = counts.get(OP_NAMES[int(op)], 0) + 1
        return (f"{len(self.code)} instructions ({', '.join(f'{v} {k}' for k, v in sorted(counts.items()))}), "
                f"{len(self.factors)} per-sample factors, {self.operations:,} operations a pair")


def recipe_is_bits(recipe: Recipe | None, family: dict[str, tuple[float, float]]) -> bool:
    """Whether a factor is a constant times a 0/1 mask: built from ReLU-type gates (``beta = 0``) and max-pool hit
    indicators only."""
    kind = recipe[0] if recipe is not None else None
    if kind is None or kind == "channels":
        return True
    if kind in ("input", "const"):
        return False
    if kind == "gate":
        return family[recipe[1]][0] == 0.0
    if kind == "mul":
        return recipe_is_bits(recipe[1], family) and recipe_is_bits(recipe[2], family)
    return recipe_is_bits(recipe[1], family)  # pick, embed, view, call, at: as the factor they carry


def recipe_scale(recipe: Recipe | None, family: dict[str, tuple[float, float]]) -> float:
    """The constant of a 0/1 factor (``A = scale · mask``): the product of its gates' ``gamma``."""
    kind = recipe[0] if recipe is not None else None
    if kind == "gate":
        return family[recipe[1]][1]
    if kind == "mul":
        return recipe_scale(recipe[1], family) * recipe_scale(recipe[2], family)
    if kind in ("pick", "embed", "view", "call", "at"):
        return recipe_scale(recipe[1], family)
    return 1.0


def _split(shape: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
    """Channels and spatial dims of a per-sample shape (a scalar is one channel)."""
    return (shape[0], tuple(shape[1:])) if shape else (1, ())


_VALUES = (Map, Terms, Summed, Flat, Mapped)


class _Emitter:
    """Instructions on virtual registers; :meth:`finish` places the registers in the scratch array."""

    def __init__(self) -> None:
        self.rows: list[list[int]] = []
        self.values: list[float] = []
        self.size: dict[int, int] = {}
        self.table: list[int] = []
        self.weights: list[float] = []
        self.factor_ids: dict[Recipe, int] = {}
        self.factor_rows: list[int] = []  # instructions whose i1 is a factor id (patched to its offset)
        self.operations = 0

    def new(self, size: int) -> int:
        self.size[len(self.size)] = int(size)
        return len(self.size) - 1

    def emit(self, op: int, dst: int, s0: int | None = None, s1: int | None = None, ints=(), value: float = 0.0,
             cost: int = 0) -> int:
        row = [op, dst, -1 if s0 is None else s0, -1 if s1 is None else s1, *ints]
        self.rows.append(row + [0] * (ROW - len(row)))
        self.values.append(float(value))
        self.operations += int(cost)
        return dst

    def factor(self, recipe: Recipe) -> int:
        return self.factor_ids.setdefault(recipe, len(self.factor_ids))

    def index_table(self, entries) -> int:
        self.table.extend(int(e) for e in entries)
        self.weights.extend([0.0] * len(entries))
        return len(self.table) - len(entries)

    def fold_shifts(self) -> None:
        """A window sum read only by the shift after it adds the shift itself (one pass less)."""
        readers: dict[int, int] = {}
        for row in self.rows:
            for reg in set(row[2:4]) - {-1}:
                readers[reg] = readers.get(reg, 0) + 1
        made = {row[1]: k for k, row in enumerate(self.rows) if row[0] == BOX}
        keep = []
        for k, row in enumerate(self.rows):
            source = made.get(row[2])
            if row[0] == ADD_SCALAR and source is not None and readers[row[2]] == 1 and \
                    self.values[source] == 0.0:
                self.rows[source][1], self.values[source] = row[1], self.values[k]
                self.operations -= row[4]
                continue
            keep.append(k)
        self.rows = [self.rows[k] for k in keep]
        self.values = [self.values[k] for k in keep]
        moved = {old: new for new, old in enumerate(keep)}
        self.factor_rows = [moved[k] for k in self.factor_rows]

    def finish(self, out: int, factor_layout: Callable[[int], tuple[int, int]]) -> tuple[np.ndarray, int, int]:
        """Scratch offsets for the registers (a register's space is reused once it is dead; never by the
        instruction that reads it last), the factor offsets patched in; ``(code, scratch size, out offset)``."""
        self.fold_shifts()
        code = np.asarray(self.rows, dtype=np.int64).reshape(-1, ROW)
        first, last = {}, {}
        for k, row in enumerate(code):
            for reg, writes in ((row[1], True), (row[2], False), (row[3], False)):
                if reg >= 0:
                    first.setdefault(int(reg), k)
                    last[int(reg)] = k
        last[out] = len(code)
        offset: dict[int, int] = {}
        free: dict[int, list[int]] = {}
        top = 0
        for k in range(len(code)):
            reg = int(code[k, 1])
            if first.get(reg) == k and reg not in offset:
                size = self.size[reg]
                if free.get(size):
                    offset[reg] = free[size].pop()
                else:
                    offset[reg], top = top, top + size
            for r in {int(code[k, 1]), int(code[k, 2]), int(code[k, 3])} - {-1}:
                if last.get(r) == k:
                    free.setdefault(self.size[r], []).append(offset[r])
        for k in range(len(code)):
            for col in (1, 2, 3):
                if code[k, col] >= 0:
                    code[k, col] = offset[int(code[k, col])]
        for k in self.factor_rows:
            code[k, 6], code[k, 7] = factor_layout(int(code[k, 6]))
        return code, top, offset[out]


class _Compiler:
    """The symbolic pass: every rule's pair operation on :class:`Map`, :class:`Terms`, :class:`Summed` and
    :class:`Flat` values."""

    def __init__(self, graph: PiecewiseGraph) -> None:
        self.graph, self.e = graph, _Emitter()
        self.gate_family = {g.name: (g.beta, g.gamma) for g in graph.gates}
        self.factor_shapes: dict[Recipe, tuple[int, ...]] = {}
        self.picked: dict[tuple, int] = {}
        self.resolved: dict[tuple[int, str], Any] = {}  # a Mapped value's channel sum or terms, once each
        self.constants: list[torch.Tensor] = []  # per-entry constants of ("const", k, shape) factors
        self.temp = 0

    # ---------------------------------------------------------------------------------------------- factors
    def _shape_of(self, recipe: Recipe) -> tuple[int, ...]:
        return self.factor_shapes[recipe]

    def is_bits(self, recipe: Recipe) -> bool:
        return recipe_is_bits(recipe, self.gate_family)

    def scale(self, recipe: Recipe) -> float:
        return recipe_scale(recipe, self.gate_family)

    def times(self, a: Recipe | None, b: Recipe, shape) -> Recipe:
        if a is None:
            return b
        recipe = ("mul",) + tuple(sorted((a, b), key=repr))
        self.factor_shapes[recipe] = shape
        return recipe

    # ---------------------------------------------------------------------------------------------- values
    def channel_sum(self, v) -> int:
        """A register over the positions holding ``Σ_c`` of the value."""
        if isinstance(v, Summed):
            return v.reg
        if isinstance(v, Mapped):
            key = (id(v), "sum")
            if key not in self.resolved:
                self.resolved[key] = self.spmv(self.channel_sum(v.inner), v.sparse, math.prod(_split(v.shape)[1]))
            return self.resolved[key]
        channels, spatial = _split(v.shape)
        positions = math.prod(spatial)
        if isinstance(v, Map):
            return self.e.emit(SCALE, self.e.new(positions), v.reg, ints=(positions,), value=channels,
                               cost=positions)
        if isinstance(v, Terms):
            dst = self.e.new(positions)
            for k, term in enumerate(v.terms):
                self.overlap(dst, term, channels, positions, accumulate=k > 0)
            return dst
        raise NotFusable(f"a {type(v).__name__} value read by a channel sum")

    def overlap(self, dst: int, term: Term, channels: int, positions: int, accumulate: bool) -> None:
        if term.factor is None:
            self.e.emit(AXPY, dst, term.reg, ints=(positions, int(accumulate)), value=term.coef * channels,
                        cost=positions)
            return
        bits = self.is_bits(term.factor)
        coef = term.coef * (self.scale(term.factor) ** 2 if bits else 1.0)
        self.e.factor_rows.append(len(self.e.rows))
        self.temp = max(self.temp, positions)
        self.e.emit(OVERLAP_BITS if bits else OVERLAP_DENSE, dst, term.reg,
                    ints=(positions, int(accumulate), self.e.factor(term.factor)), value=coef,
                    cost=positions * (1 if bits else channels) + positions)

    def total(self, v) -> int:
        """A one-value register holding the sum of every entry."""
        if isinstance(v, Flat):
            regs = [self.total(part) for part in v.parts]
            for reg in regs[1:]:
                regs[0] = self.e.emit(ADD, self.e.new(1), regs[0], reg, ints=(1,), cost=1)
            return regs[0]
        if isinstance(v, Map) and not _split(v.shape)[1]:
            return self.e.emit(SCALE, self.e.new(1), v.reg, ints=(1,), value=_split(v.shape)[0], cost=1)
        reg = self.channel_sum(v)
        positions = math.prod(_split(v.shape)[1])
        if positions == 1:
            return reg
        return self.e.emit(SUM, self.e.new(1), reg, ints=(positions,), value=1.0, cost=positions)

    def as_terms(self, v) -> Terms:
        if isinstance(v, Terms):
            return v
        if isinstance(v, Mapped):
            key = (id(v), "terms")
            if key not in self.resolved:
                self.resolved[key] = self.split(self.as_terms(v.inner), v.sparse, v.shape)
            return self.resolved[key]
        if isinstance(v, Map):
            return Terms((Term(1.0, v.reg, None),), v.shape)
        raise NotFusable(f"a {type(v).__name__} value read by an operation on each channel")

    def split(self, terms: Terms, sparse: tuple, shape) -> Terms:
        """``Σ_i E[o, i] v[c, i]`` as terms: for the ``j``-th entry ``i_j(o)`` of each output's row, ``S`` read at
        ``i_j(o)`` times ``E[o, i_j(o)]`` (0 where the row is shorter), the factor read at ``i_j(o)``."""
        rows, cols, weights = sparse
        n_out = math.prod(_split(shape)[1])
        ptr = np.searchsorted(rows, np.arange(n_out + 1))
        count = np.diff(ptr)
        out = []
        for j in range(int(count.max()) if len(count) else 0):
            has = count > j
            index = np.where(has, cols[np.minimum(ptr[:-1] + j, len(cols) - 1)], 0)
            weight = np.where(has, weights[np.minimum(ptr[:-1] + j, len(cols) - 1)], 0.0)
            entries = (np.arange(n_out)[has], index[has], weight[has])
            recipe_index = len(self.constants)
            self.constants.append(torch.from_numpy(index))
            for t in terms.terms:
                if t.reg is None:
                    start = self.e.index_table([0] * n_out)
                    self.e.weights[start:start + n_out] = weight.tolist()
                    reg = self.e.emit(CONST, self.e.new(n_out), ints=(n_out, start), cost=n_out)
                else:
                    reg = self.spmv(t.reg, entries, n_out)
                recipe = None if t.factor is None else ("at", t.factor, recipe_index, shape)
                if recipe is not None:
                    self.factor_shapes[recipe] = shape
                out.append(Term(t.coef, reg, recipe))
        return Terms(tuple(out), shape)

    def spmv(self, reg: int, sparse: tuple, n_out: int) -> int:
        """``dst[o] = Σ weights[k] · reg[cols[k]]`` over the entries ``k`` of row ``o`` (rows sorted)."""
        rows, cols, weights = sparse
        ptr = np.searchsorted(rows, np.arange(n_out + 1))
        start = self.e.index_table(cols.tolist())
        self.e.weights[start:start + len(cols)] = np.asarray(weights, dtype=np.float64).tolist()
        pointer = self.e.index_table((start + ptr).tolist())
        return self.e.emit(SPMV, self.e.new(n_out), reg, ints=(n_out, pointer), cost=len(cols))

    def plus(self, v, shape, amount: float = 1.0):
        """The value plus ``amount`` in every entry (a shift, a BatchNorm, a bias)."""
        if isinstance(v, Mapped):
            v = self.as_terms(v)
        if isinstance(v, Map):
            n = self.e.size[v.reg]
            return Map(self.e.emit(ADD_SCALAR, self.e.new(n), v.reg, ints=(n,), value=amount, cost=n), shape)
        if isinstance(v, Terms):
            return Terms(v.terms + (Term(amount, None, None),), shape)
        if isinstance(v, Summed):
            n = self.e.size[v.reg]
            channels = _split(shape)[0]
            return Summed(self.e.emit(ADD_SCALAR, self.e.new(n), v.reg, ints=(n,), value=amount * channels,
                                      cost=n), shape)
        raise NotFusable(f"a shift of a {type(v).__name__} value")

    def scaled(self, v, factor: float):
        if isinstance(v, Terms):
            return Terms(tuple(Term(t.coef * factor, t.reg, t.factor) for t in v.terms), v.shape)
        if isinstance(v, (Map, Summed)):
            n = self.e.size[v.reg]
            return type(v)(self.e.emit(SCALE, self.e.new(n), v.reg, ints=(n,), value=factor, cost=n), v.shape)
        if isinstance(v, Flat):
            return Flat(tuple(self.scaled(part, factor) for part in v.parts), v.shape)
        if isinstance(v, Mapped):
            return Mapped(self.scaled(v.inner, factor), v.sparse, v.shape)
        raise NotFusable(f"a scaled {type(v).__name__} value")

    def box(self, reg: int, spatial, rule: R.Conv) -> int:
        """Window sums of a one-channel map, one axis at a time (zero padding)."""
        shape = list(spatial)
        for d in range(len(shape)):
            outer, inner = math.prod(shape[:d]), math.prod(shape[d + 1:])
            n_out = rule.out_size[d]
            dst = self.e.new(outer * n_out * inner)
            self.e.emit(BOX, dst, reg, ints=(outer, shape[d], inner, n_out, rule.kernel[d], rule.stride[d],
                                             rule.dilation[d], rule.left[d]),
                        cost=outer * n_out * inner * rule.kernel[d])
            reg, shape[d] = dst, n_out
        return reg

    # ------------------------------------------------------------------------------------------ operations
    def max_pool(self, v, rule: R.MaxPool, out_shape):
        """Each term split over the window units ``j``: ``S`` picked at ``j``, the factor picked at ``j`` times
        the sample's hit indicator ``[sel = j]`` (``Σ_j [sel(x) = j][sel(x') = j] = [sel(x) = sel(x')]``)."""
        terms = self.as_terms(v).terms
        candidates, _ = rule.candidates("cpu")
        positions = len(candidates)
        out = []
        for j in range(candidates.shape[1]):
            for term in terms:
                recipe = ("pick", term.factor, rule.name, j)
                self.factor_shapes[recipe] = out_shape
                out.append(Term(term.coef, self.pick(term.reg, rule.name, j, candidates[:, j]), recipe))
        return Terms(tuple(out), out_shape)

    def pick(self, reg: int | None, pool: str, unit: int, index: torch.Tensor) -> int | None:
        """A per-pair map at a max pool's window unit (a gather, once per map and unit)."""
        if reg is None:
            return None
        key = (reg, pool, unit)
        if key not in self.picked:
            n = len(index)
            self.picked[key] = self.e.emit(GATHER, self.e.new(n), reg, ints=(n, self.e.index_table(index.tolist())),
                                           cost=n)
        return self.picked[key]

    def fixed_map(self, v, rule: R.FixedMap, args, kwargs, in_shape, out_shape):
        """``c_o · (D v)`` for the fixed map ``D`` of one channel (probed on unit inputs); a map that multiplies
        each entry by its own constant (a buffer of per-channel gains) puts ``√(c·d)`` into the factors."""
        call = lambda t: rule.call([t if isinstance(a, _VALUES) else a for a in args],  # noqa
                                   kwargs)
        try:
            rows, cols, weights, n_out = _plane_map(rule.where, call, rule.c, in_shape, out_shape,
                                                    self.graph.device)
        except _PerChannel:
            return self.multiplied(v, _entry_multiplier(rule, call, in_shape, out_shape, self.graph.device),
                                   out_shape, rule.where)
        if n_out == math.prod(_split(in_shape)[1]) and np.array_equal(rows, np.arange(n_out)) and \
                np.array_equal(cols, rows) and np.all(weights == weights[0]):  # c · identity
            scaled = self.scaled(v, float(weights[0]))
            return Flat(scaled.parts, out_shape) if isinstance(scaled, Flat) else scaled
        if isinstance(v, Flat):
            raise NotFusable(f"{rule.where}: a fixed map of a flattened value")
        if isinstance(v, Map):
            return Map(self.spmv(v.reg, (rows, cols, weights), n_out), out_shape)
        if isinstance(v, Summed):
            return Summed(self.spmv(v.reg, (rows, cols, weights), n_out), out_shape)
        return Mapped(v, (rows, cols, weights), out_shape)

    def multiplied(self, v, multiplier: torch.Tensor, out_shape, where: str):
        """The value times a per-entry constant ``multiplier >= 0`` (``(C, *spatial)``): ``√multiplier`` joins
        every factor."""
        if isinstance(v, (Summed, Flat)):
            raise NotFusable(f"{where}: a per-channel constant on a value summed over channels")
        recipe = ("const", len(self.constants), out_shape)
        self.constants.append(multiplier.sqrt())
        self.factor_shapes[recipe] = out_shape
        return Terms(tuple(Term(t.coef, t.reg, self.times(t.factor, recipe, out_shape))
                           for t in self.as_terms(v).terms), out_shape)

    def conv(self, v, rule: R.Conv, out_shape):
        channels, spatial = _split(v.shape)
        if rule.groups == 1 or isinstance(v, Map):
            reg = self.channel_sum(v)
            if rule.groups > 1:  # the sum within one group of a value equal in every channel
                n = self.e.size[reg]
                reg = self.e.emit(SCALE, self.e.new(n), reg, ints=(n,), value=1.0 / rule.groups, cost=n)
            return Map(self.shifted(self.box(reg, spatial, rule), rule.bias is not None), out_shape)
        # groups > 1 on a value that depends on the channel: a term per group, its channels' indicator as factor
        g, out_channels = rule.groups, out_shape[0]
        terms = []
        for k in range(g):
            inside = ("channels", k * channels // g, (k + 1) * channels // g, v.shape)
            part = Terms(tuple(Term(t.coef, t.reg, self.times(t.factor, inside, v.shape))
                               for t in self.as_terms(v).terms), v.shape)
            self.factor_shapes[inside] = v.shape
            reg = self.shifted(self.box(self.channel_sum(part), spatial, rule), rule.bias is not None)
            own = ("channels", k * out_channels // g, (k + 1) * out_channels // g, out_shape)
            self.factor_shapes[own] = out_shape
            terms.append(Term(1.0, reg, own))
        return Terms(tuple(terms), out_shape)

    def shifted(self, reg: int, shift: bool) -> int:
        if not shift:
            return reg
        n = self.e.size[reg]
        return self.e.emit(ADD_SCALAR, self.e.new(n), reg, ints=(n,), value=1.0, cost=n)

    def linear(self, v, rule: R.Linear, in_shape, out_shape):
        if len(in_shape) != 1:
            raise NotFusable(f"{rule.where}: a Linear over the last dim of a {len(in_shape)}-dim value")
        reg = self.total(v)
        if rule.bias is not None:
            reg = self.e.emit(ADD_SCALAR, self.e.new(1), reg, ints=(1,), value=1.0, cost=1)
        return Map(reg, out_shape)

    def branch_sum(self, a, b, out_shape):
        if a.shape != b.shape:
            raise NotFusable("a sum of branches of different shapes (broadcast)")
        if isinstance(a, Map) and isinstance(b, Map):
            n = self.e.size[a.reg]
            return Map(self.e.emit(ADD, self.e.new(n), a.reg, b.reg, ints=(n,), cost=n), out_shape)
        if isinstance(a, Summed) or isinstance(b, Summed) or (isinstance(a, Mapped) and isinstance(b, Mapped)):
            first, second = self.channel_sum(a), self.channel_sum(b)
            n = self.e.size[first]
            return Summed(self.e.emit(ADD, self.e.new(n), first, second, ints=(n,), cost=n), out_shape)
        return Terms(self.as_terms(a).terms + self.as_terms(b).terms, out_shape)

    def reshape(self, v, node: fx.Node, args, in_shape, out_shape):
        """Shape operations: same entries in another order (a view, a permutation), a channel slice, a join."""
        where = self.graph.rules[node.name].where
        keeps_order = _keeps_order(node)
        if keeps_order == "join":
            return self.join(node, args, out_shape)
        if keeps_order == "select":
            return self.select(v, node, args, in_shape, out_shape)
        if out_shape == in_shape and keeps_order:
            return v
        if isinstance(v, Map) and self.e.size[v.reg] == 1:  # every entry equal: any reshape
            return Map(v.reg, out_shape)
        if isinstance(v, Terms) and keeps_order and out_shape[:1] == in_shape[:1] and \
                math.prod(out_shape[1:]) == math.prod(in_shape[1:]):  # positions keep their order
            return self.refactored(v, ("view", out_shape), out_shape)
        if isinstance(v, Terms) and all(t.reg is None for t in v.terms):  # per-sample factors only
            return self.refactored(v, ("call", node.name, out_shape) if not keeps_order else ("view", out_shape),
                                   out_shape)
        if isinstance(v, Map) and keeps_order and out_shape[:1] == in_shape[:1]:
            return Map(v.reg, out_shape)
        if math.prod(out_shape) == math.prod(in_shape):
            return Flat(v.parts if isinstance(v, Flat) else (v,), out_shape)
        raise NotFusable(f"{where}: a shape operation on a value with per-pair maps")

    def refactored(self, v: Terms, how: tuple, out_shape) -> Terms:
        """Every factor through a shape operation ``how`` (``("view", shape)``, ``("call", node, shape)``);
        a factor ``None`` (all ones) stays all ones."""
        terms = []
        for t in v.terms:
            recipe = None if t.factor is None else (how[0], t.factor, *how[1:])
            if recipe is not None:
                self.factor_shapes[recipe] = out_shape
            terms.append(Term(t.coef, t.reg, recipe))
        return Terms(tuple(terms), out_shape)

    def join(self, node: fx.Node, args, out_shape):
        """``torch.cat`` along the channels: each branch's terms, their factors zero outside its channels; of
        values whose readers sum every entry: the parts of a :class:`Flat`."""
        dim = args[1] if len(args) > 1 else node.kwargs.get("dim", 0)
        parts = list(args[0])
        if node.target is not torch.cat and node.target is not torch.concat:
            raise NotFusable(f"{self.graph.rules[node.name].where}: torch.stack")
        dim = dim + len(out_shape) + 1 if dim < 0 else dim
        if any(isinstance(p, (Flat, Summed)) for p in parts) or dim != 1:
            if all(len(p.shape) == 1 for p in parts) or any(isinstance(p, Flat) for p in parts):
                return Flat(tuple(q for p in parts for q in (p.parts if isinstance(p, Flat) else (p,))), out_shape)
            raise NotFusable(f"{self.graph.rules[node.name].where}: a concatenation along dim {dim}")
        terms, lo = [], 0
        for part in parts:
            hi = lo + part.shape[0]
            for t in self.as_terms(part).terms:
                recipe = ("embed", t.factor, lo, hi, out_shape)
                self.factor_shapes[recipe] = out_shape
                terms.append(Term(t.coef, t.reg, recipe))
            lo = hi
        return Terms(tuple(terms), out_shape)

    def select(self, v, node: fx.Node, args, in_shape, out_shape):
        """Indexing that slices the channels only (``x[:, 2:5]``): the factors sliced alike."""
        index = args[1] if isinstance(args[1], tuple) else (args[1],)
        rest = index[2:] if len(index) > 1 else ()
        if not (index and index[0] == slice(None)) or not all(i == slice(None) or i is Ellipsis for i in rest) or \
                len(index) < 2 or not isinstance(index[1], slice) or out_shape[1:] != in_shape[1:]:
            raise NotFusable(f"{self.graph.rules[node.name].where}: indexing other than a slice of the channels")
        if isinstance(v, Map):
            return Map(v.reg, out_shape)
        return self.refactored(self.as_terms(v), ("call", node.name, out_shape), out_shape)

    def output(self, v) -> int:
        if isinstance(v, Map) and self.e.size[v.reg] == 1:
            return v.reg
        if math.prod(v.shape) == 1:
            return self.total(v)
        raise NotFusable("outputs whose kernels may differ (the last map does not join every output to the same "
                         "units)")


def _keeps_order(node: fx.Node) -> bool | str:
    """``True`` for reshapes that keep the entries' order, ``False`` for permutations, ``"join"`` for
    concatenation, ``"select"`` for indexing."""
    target = node.target
    if node.op == "call_module":
        return True  # nn.Flatten, nn.Unflatten (the table's only shape modules)
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    if target in (torch.cat, torch.concat, torch.stack):
        return "join"
    if name == "getitem":
        return "select"
    return name not in ("permute", "transpose")


class _PerChannel(NotFusable):
    """A fixed map that differs between channels."""


PROBE_UNITS = 1024  # unit inputs a call when a fixed map is probed


def _plane_map(where: str, call, c, in_shape, out_shape, device) -> tuple[np.ndarray, ...]:
    """``diag(c_o) · D`` as sparse ``(rows, cols, weights, n_out)``: the map of one channel's plane (``D[o, i]``
    its response at ``o`` to the unit input ``i``, a few hundred unit inputs a call) times the rule's pair constant;
    :class:`_PerChannel` when the map or its constant differs between channels."""
    channels, spatial = _split(in_shape)
    units = max(1, math.prod(spatial))
    out_channels, out_spatial = _split(out_shape)
    if out_channels != channels or not in_shape:
        raise NotFusable(f"{where}: a fixed map across channels")
    n_out = max(1, math.prod(out_spatial))
    if isinstance(c, torch.Tensor):
        if c.numel() != 1 and (c.dim() < 2 or c.shape[1] != 1):
            raise _PerChannel(f"{where}: a pair constant that differs between channels")
        c = c.reshape(-1).double().cpu() if c.numel() > 1 else float(c)
    rows, cols, weights = [], [], []
    for lo in range(0, units, PROBE_UNITS):
        basis = torch.zeros(min(PROBE_UNITS, units - lo), units, dtype=torch.float64, device=device)
        basis[torch.arange(len(basis)), torch.arange(lo, lo + len(basis))] = 1.0
        response = call(basis.reshape(len(basis), 1, *spatial))
        if tuple(response.shape) != (len(basis), 1, *out_spatial):
            raise _PerChannel(f"{where}: a fixed map whose output on one channel has shape "
                              f"{tuple(response.shape[1:])}")
        unit, out = torch.nonzero(response.reshape(len(basis), -1), as_tuple=True)
        rows.append(out.cpu().numpy())
        cols.append((unit + lo).cpu().numpy())
        weights.append(response.reshape(len(basis), -1)[unit, out].cpu().numpy())
    rows, cols, weights = (np.concatenate(parts) for parts in (rows, cols, weights))
    order = np.lexsort((cols, rows))
    rows, cols, weights = rows[order], cols[order], weights[order]
    probe = torch.randn(2, *in_shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    flat = probe.reshape(2, channels, units)
    expected = torch.zeros(2, channels, n_out, dtype=torch.float64)
    expected.index_add_(2, torch.from_numpy(rows), flat[:, :, cols] * torch.from_numpy(weights))
    if not torch.allclose(call(probe.to(device)).cpu().reshape(2, channels, n_out), expected, rtol=1e-10,
                          atol=1e-12):
        raise _PerChannel(f"{where}: a fixed map that differs between channels")
    scale = c[rows].numpy() if isinstance(c, torch.Tensor) else c
    return rows.astype(np.int64), cols.astype(np.int64), weights * scale, n_out


def _entry_multiplier(rule, call, in_shape, out_shape, device) -> torch.Tensor:
    """``c · d`` of a fixed map that multiplies each entry by its own constant ``d`` (``x · buffer``), per entry
    ``(C, *spatial)``; :class:`NotFusable` for any other map across channels."""
    if in_shape != out_shape:
        raise NotFusable(f"{rule.where}: a fixed map that differs between channels")
    d = call(torch.ones(1, *in_shape, dtype=torch.float64, device=device))
    probe = torch.randn(2, *in_shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(device)
    c = rule.c if isinstance(rule.c, torch.Tensor) else torch.tensor(rule.c, dtype=torch.float64)
    multiplier = (d * c.to(device)).reshape(in_shape) if d.shape[1:] == in_shape else None
    if multiplier is None or not torch.allclose(call(probe), probe * d, rtol=1e-10, atol=1e-12) or \
            bool((multiplier < 0).any()):
        raise NotFusable(f"{rule.where}: a fixed map that differs between channels")
    return multiplier.cpu()


def _step(compiler: _Compiler, node: fx.Node, rule: R.Rule, args, kwargs):
    """One node on symbolic values (``None`` for sizes)."""
    if isinstance(rule, R.Meta):
        return None
    in_shape, out_shape = tuple(rule.in_shape[1:]), tuple(rule.out_shape[1:])
    v = next((a for a in args if isinstance(a, _VALUES)), None)
    if isinstance(rule, R.Gate):
        terms = compiler.as_terms(v).terms
        gate = ("gate", rule.name)
        compiler.factor_shapes[gate] = out_shape
        return Terms(tuple(Term(t.coef, t.reg, compiler.times(t.factor, gate, out_shape)) for t in terms),
                     out_shape)
    if isinstance(rule, R.Conv):
        return compiler.conv(v, rule, out_shape)
    if isinstance(rule, R.Linear):
        return compiler.linear(v, rule, in_shape, out_shape)
    if isinstance(rule, R.BatchNorm) or (isinstance(rule, R.Shift) and in_shape == out_shape):
        return compiler.plus(v, out_shape)
    if isinstance(rule, R.MaxPool):
        return compiler.max_pool(v, rule, out_shape)
    if isinstance(rule, R.BranchSum):
        return compiler.branch_sum(args[0], args[1], out_shape)
    if isinstance(rule, R.FixedMap):
        return compiler.fixed_map(v, rule, args, kwargs, in_shape, out_shape)
    if isinstance(rule, (R.Identity, R.ParamScale)) and in_shape == out_shape:
        return v
    if isinstance(rule, (R.Passthrough, R.Squeeze)):
        return compiler.reshape(v, node, args, in_shape, out_shape)
    raise NotFusable(f"{rule.where}: {type(rule).__name__} with input {in_shape} and output {out_shape}")


def compile_pair_program(graph: PiecewiseGraph, word_bits: int | None = None) -> PairProgram:
    """The :class:`PairProgram` of ``graph``'s pair network, or :class:`NotFusable` naming what it cannot express.

    Once per graph (the per-sample factors are formed for each set of samples by
    :func:`lightning_nsv.kernel.pair_factors.sample_factors`)."""
    compiler = _Compiler(graph)
    env: dict[fx.Node, Any] = {}
    for node, dead in zip(graph.nodes, graph.frees):
        if node.op == "placeholder":
            source = ("input",)
            compiler.factor_shapes[source] = graph.input_shape
            env[node] = Terms((Term(1.0, None, source),), graph.input_shape)
        elif node.op == "get_attr":
            env[node] = graph.consts[node.target]
        elif node.op == "output":
            return _program(compiler, compiler.output(env[node.args[0]]), word_bits)
        else:
            args = fx.node.map_arg(node.args, env.__getitem__)
            kwargs = fx.node.map_arg(node.kwargs, env.__getitem__)
            env[node] = _step(compiler, node, graph.rules[node.name], args, kwargs)
        for gone in dead:
            del env[gone]
    raise AssertionError("an fx graph ends with its output node")


def _program(compiler: _Compiler, out: int, word_bits: int | None) -> PairProgram:
    """Lays out the per-sample factors (0/1 masks as words of ``word_bits`` bits, the rest float64) and places the
    registers."""
    e = compiler.e
    recipes = sorted(e.factor_ids, key=e.factor_ids.get)
    shapes = [compiler.factor_shapes[r] for r in recipes]
    bits = [compiler.is_bits(r) for r in recipes]
    masks = [(_split(s)[0], math.prod(_split(s)[1])) for s, b in zip(shapes, bits) if b]
    if word_bits is None:  # the narrowest words that hold the masks (ties: wider words, fewer of them)
        word_bits = min((64, 32, 16, 8), key=lambda w: sum(-(-c // w) * p * w for c, p in masks))
    if word_bits not in (8, 16, 32, 64):
        raise ValueError(f"word_bits must be 8, 16, 32 or 64, got {word_bits!r}")
    layout, words, values = [], 0, 0
    for shape, is_bits in zip(shapes, bits):
        channels, positions = _split(shape)[0], math.prod(_split(shape)[1])
        if is_bits:
            count = -(-channels // word_bits)
            layout.append((words, count))
            words += count * positions
        else:
            layout.append((values, channels))
            values += channels * positions
    code, top, out_offset = e.finish(out, lambda factor: layout[factor])
    factors = [FactorSlot(r, b, s, compiler.scale(r) if b else 1.0, *lay) for r, b, s, lay in
               zip(recipes, bits, shapes, layout)]
    return PairProgram(code, np.asarray(e.values, dtype=np.float64), np.asarray(e.table, dtype=np.int64),
                       np.asarray(e.weights, dtype=np.float64), top + compiler.temp, compiler.temp, out_offset,
                       factors, e.operations, word_bits, words, values, compiler.constants)
