"""The pair network of a traced graph compiled into one short program over per-pair maps (DESIGN.md §2c "Speed").

Between gates the pair network carries one value per position and pair (a groups=1 convolution's all-ones kernel
sums over channels); where the value depends on the channel it is a sum of terms
``coef · S[p] · A(x)[c, p] · A(x')[c, p]`` whose per-sample factors ``A`` (the input, gate slopes, max-pool hit
indicators and their products) are formed once for every sample (:mod:`lightning_nsv.kernel.pair_factors`). A
channel sum is then, per term and position, the overlap ``Σ_c A(x)[c, p] A(x')[c, p]``: the population count of
ANDed words where ``A`` is a 0/1 mask.

:func:`compile_pair_program` runs the graph once in the interpreter's ``program`` mode
(:func:`lightning_nsv.kernel.graph.run`): each rule states its own form (``Rule.program``) on the symbolic values
below, through the :class:`Compiler` (the :class:`ProgramContext`), which writes what is left for each pair as a
:class:`~lightning_nsv.kernel.pair_code.PairProgram`: overlaps, window sums, picks, fixed sparse maps, additions
and scales on registers of a per-pair scratch array. A graph it cannot express raises
:class:`~lightning_nsv.kernel.pair_code.NotFusable` with the reason.
"""
from __future__ import annotations

import math
from typing import Protocol

import numpy as np
import torch

from lightning_nsv.kernel.pair_code import (ADD, ADD_SCALAR, AXPY, BOX, CONST, GATHER, OVERLAP_DENSE, OVERLAP_TERMS,
                                            SPMV, Emitter, NotFusable, PairProgram, Recipe, channels_and_positions,
                                            lay_out, recipe_is_bits, recipe_scale)
from lightning_nsv.kernel.pair_probes import PerChannel, entry_multiplier, plane_map
from lightning_nsv.kernel.pair_values import (Added, Flat, Map, Mapped, Summed, Term, Terms, Value,
                                              positions_of as _positions)

__all__ = ["Compiler", "NotFusable", "PairProgram", "ProgramContext", "compile_pair_program"]


class ProgramContext(Protocol):
    """What a rule's ``program(args, kwargs, ctx)`` calls (:mod:`lightning_nsv.kernel.rules`): one method per
    form, the rule passed for its settings and shapes (``in_shape``, ``out_shape``), the input-dependent argument
    as a :class:`Value`; each returns the node's :class:`Value`."""

    def gate(self, rule, v: Value) -> Value: ...
    def conv(self, rule, v: Value) -> Value: ...
    def conv_transpose(self, rule, v: Value) -> Value: ...
    def linear(self, rule, v: Value) -> Value: ...
    def shift(self, rule, v: Value) -> Value: ...
    def max_pool(self, rule, v: Value) -> Value: ...
    def branch_sum(self, rule, a: Value, b: Value) -> Value: ...
    def select(self, rule, a: Value, b: Value) -> Value: ...
    def piece(self, rule, v: Value) -> Value: ...
    def line_max(self, rule, v: Value) -> Value: ...
    def fixed_map(self, rule, args, kwargs) -> Value: ...
    def plane_map(self, rule, v: Value) -> Value: ...
    def reshape(self, rule, args, kwargs) -> Value: ...
    def same_shape(self, rule, v: Value) -> Value: ...


class Compiler:
    """The :class:`ProgramContext` of :func:`compile_pair_program`: emits the program and records the factors'
    shapes and the program's constants."""

    def __init__(self, graph) -> None:
        self.graph, self.e = graph, Emitter()
        self.family = {g.name: (g.beta, g.gamma) for g in graph.gates}
        self.shapes: dict[Recipe, tuple[int, ...]] = {}  # of every factor
        self.picked: dict[tuple, int] = {}  # a map at a pool's window unit, gathered once
        self.constants: list[torch.Tensor] = []  # of ("const", k, shape) and ("at", a, k, shape) factors
        self.temp = 0

    # --------------------------------------------------------------------------------------------- helpers
    def recipe(self, recipe: Recipe | None, shape) -> Recipe | None:
        if recipe is not None:
            self.shapes[recipe] = tuple(shape)
        return recipe

    def times(self, a: Recipe | None, b: Recipe, shape) -> Recipe:
        return b if a is None else self.recipe(("mul",) + tuple(sorted((a, b), key=repr)), shape)

    def refactored(self, v: Value, how, shape) -> Terms:
        """Every term's factor through ``how(factor)`` (``None`` stays all ones, unless ``how`` maps it)."""
        return Terms(tuple(Term(t.coef, t.reg, self.recipe(how(t.factor), shape)) for t in v.terms(self).terms_),
                     tuple(shape))

    def channel_sum(self, terms, shape) -> int:
        """``Σ_c`` of a sum of terms, a register over the positions: the terms whose factor is a 0/1 mask in one
        instruction (popcounts of ANDed words), each other factor's overlap and each term without a factor in one
        of their own."""
        channels, positions = channels_and_positions(shape)[0], _positions(shape)
        dst, written = self.e.new(positions), False
        masks = [t for t in terms if t.factor is not None and recipe_is_bits(t.factor, self.family)]
        for t in terms:
            if t.factor is None:
                self.e.emit(AXPY, dst, t.reg, ints=(positions, int(written)), value=t.coef * channels,
                            cost=positions)
            elif t not in masks:
                self.e.factor_rows.append(len(self.e.rows))
                self.temp = max(self.temp, positions)
                self.e.emit(OVERLAP_DENSE, dst, t.reg, ints=(positions, int(written), self.e.factor(t.factor)),
                            value=t.coef, cost=positions * (channels + 1))
            else:
                continue
            written = True
        if masks:
            base = self.e.index_table([v for t in masks for v in (-1 if t.reg is None else t.reg,
                                                                  self.e.factor(t.factor), 0)])
            for k, t in enumerate(masks):
                self.e.weights[base + 3 * k] = t.coef * recipe_scale(t.factor, self.family) ** 2
            self.e.factor_rows.append(len(self.e.rows))
            self.e.table_reads[len(self.e.rows)] = [t.reg for t in masks if t.reg is not None]
            self.temp = max(self.temp, positions)
            self.e.emit(OVERLAP_TERMS, dst, ints=(positions, len(masks), base, int(written)),
                        cost=2 * positions * len(masks))
        return dst

    def spmv(self, reg: int, sparse: tuple, n_out: int) -> int:
        """``dst[o] = Σ weights[k] · reg[cols[k]]`` over the entries ``k`` of row ``o`` (rows sorted)."""
        rows, cols, weights = sparse
        start = self.e.index_table(cols.tolist())
        self.e.weights[start:start + len(cols)] = np.asarray(weights, dtype=np.float64).tolist()
        pointer = self.e.index_table((start + np.searchsorted(rows, np.arange(n_out + 1))).tolist())
        return self.e.emit(SPMV, self.e.new(n_out), reg, ints=(n_out, pointer), cost=len(cols))

    def split(self, terms: Terms, sparse: tuple, shape) -> Terms:
        """``Σ_i E[o, i] v[c, i]`` as terms: for the ``j``-th entry ``i_j(o)`` of each output's row, ``S`` read at
        ``i_j(o)`` times ``E[o, i_j(o)]`` (0 where the row is shorter), the factor read at ``i_j(o)``."""
        rows, cols, weights = sparse
        n_out = _positions(shape)
        ptr = np.searchsorted(rows, np.arange(n_out + 1))
        count = np.diff(ptr)
        out = []
        for j in range(int(count.max()) if len(count) else 0):
            has = count > j
            at = np.minimum(ptr[:-1] + j, len(cols) - 1)
            index, weight = np.where(has, cols[at], 0), np.where(has, weights[at], 0.0)
            self.constants.append(torch.from_numpy(index))
            for t in terms.terms_:
                if t.reg is None:
                    start = self.e.index_table([0] * n_out)
                    self.e.weights[start:start + n_out] = weight.tolist()
                    reg = self.e.emit(CONST, self.e.new(n_out), ints=(n_out, start), cost=n_out)
                else:
                    reg = self.spmv(t.reg, (np.arange(n_out)[has], index[has], weight[has]), n_out)
                factor = None if t.factor is None else ("at", t.factor, len(self.constants) - 1, tuple(shape))
                out.append(Term(t.coef, reg, self.recipe(factor, shape)))
        return Terms(tuple(out), tuple(shape))

    def box(self, reg: int, spatial, rule) -> int:
        """Window sums of a one-channel map, one axis at a time (zero padding)."""
        shape = list(spatial)
        for d in range(len(shape)):
            outer, inner, n_out = math.prod(shape[:d]), math.prod(shape[d + 1:]), rule.out_size[d]
            reg = self.e.emit(BOX, self.e.new(outer * n_out * inner), reg, ints=(
                outer, shape[d], inner, n_out, rule.kernel[d], rule.stride[d], rule.dilation[d], rule.left[d]),
                cost=outer * n_out * inner * rule.kernel[d])
            shape[d] = n_out
        return reg

    def plus_one(self, reg: int, shift: bool) -> int:
        n = self.e.size[reg]
        return self.e.emit(ADD_SCALAR, self.e.new(n), reg, ints=(n,), value=1.0, cost=n) if shift else reg

    # -------------------------------------------------------------------------------------------- the forms
    def gate(self, rule, v):
        """A gate multiplies every factor by the sample's slopes (``sigma(x) sigma(x')`` per pair)."""
        shape = tuple(rule.out_shape[1:])
        gate = self.recipe(("gate", rule.name), shape)
        return self.refactored(v, lambda factor: self.times(factor, gate, shape), shape)

    def conv(self, rule, v, plane=None):
        """Channel sum (within each group), window sums, ``+1`` with a bias. Grouped convolutions of a value that
        depends on the channel give a term per group, its channels' indicator as factor. ``plane(reg)``: the map of
        one plane instead of the window sums."""
        out_shape = tuple(rule.out_shape[1:])
        channels, spatial = channels_and_positions(v.shape)
        plane = plane or (lambda reg: self.box(reg, spatial, rule))
        if rule.groups == 1 or isinstance(v, Map):
            reg = v.channel_sum(self)
            if rule.groups > 1:  # the sum within one group of a value equal in every channel
                reg = Map(reg, v.shape).scaled(self, 1.0 / rule.groups).reg
            return Map(self.plus_one(plane(reg), rule.bias is not None), out_shape)
        g, out_channels, terms = rule.groups, out_shape[0], []
        for k in range(g):
            inside = self.recipe(("channels", k * channels // g, (k + 1) * channels // g, v.shape), v.shape)
            part = self.refactored(v, lambda factor: self.times(factor, inside, v.shape), v.shape)
            reg = self.plus_one(plane(part.channel_sum(self)), rule.bias is not None)
            own = ("channels", k * out_channels // g, (k + 1) * out_channels // g, out_shape)
            terms.append(Term(1.0, reg, self.recipe(own, out_shape)))
        return Terms(tuple(terms), out_shape)

    def conv_transpose(self, rule, v):
        """As :meth:`conv`, the all-ones kernel's transposed convolution of one plane (its probed matrix) for the
        window sums."""
        return self.conv(rule, v, plane=lambda reg: self.spmv(reg, rule.sparse, rule.n_out))

    def linear(self, rule, v):
        in_shape = tuple(rule.in_shape[1:])
        if len(in_shape) != 1:
            raise NotFusable(f"{rule.where}: a Linear over the last dim of a {len(in_shape)}-dim value")
        return Map(self.plus_one(v.total(self), rule.bias is not None), tuple(rule.out_shape[1:]))

    def shift(self, rule, v):
        """A BatchNorm's shift, a bias or constant added: ``+1`` in every entry."""
        if tuple(rule.in_shape) != tuple(rule.out_shape):
            raise NotFusable(f"{rule.where}: a shift that broadcasts the value to another shape")
        return v.plus(self, 1.0)

    def max_pool(self, rule, v):
        """Each term split over the window units ``j``: ``S`` picked at ``j``, the factor picked at ``j`` times
        the sample's hit indicator ``[sel = j]`` (``Σ_j [sel(x) = j][sel(x') = j] = [sel(x) = sel(x')]``)."""
        out_shape, candidates = tuple(rule.out_shape[1:]), rule.candidates("cpu")[0]
        terms = []
        for j in range(candidates.shape[1]):
            for t in v.terms(self).terms_:
                factor = self.recipe(("pick", t.factor, rule.name, j), out_shape)
                terms.append(Term(t.coef, self.pick(t.reg, rule.name, j, candidates[:, j]), factor))
        return Terms(tuple(terms), out_shape)

    def piece(self, rule, v):
        """A saturating piece: every factor times the linear-piece mask, and the flat values' term
        ``c(x) c(x')`` (a path start per unit, ``S = 1``)."""
        shape = tuple(rule.out_shape[1:])
        linear = self.recipe(("piece", rule.name), shape)
        gated = self.refactored(v, lambda factor: self.times(factor, linear, shape), shape)
        if not rule.starts:
            return gated
        return Terms(gated.terms_ + (Term(1.0, None, self.recipe(("flat", rule.name, rule.lo, rule.hi), shape)),),
                     shape)

    def line_max(self, rule, v):
        """A max over a dim: each term split over the candidates ``j`` of the line, ``S`` read at ``j`` and the factor
        at ``j`` times the sample's indicator ``[sel = j]`` (as a max pool's window units)."""
        in_shape, out_shape = tuple(rule.in_shape[1:]), tuple(rule.out_shape[1:])
        axis = rule.dim - 1  # of the per-pair shape
        if axis == 0 and not (rule.keepdim or len(in_shape) == 1):
            raise NotFusable(f"{rule.where}: a max over the channels that drops the channel dim of a value with "
                             "positions (keepdim=True is fused)")
        factor_shape, positions = out_shape or (1,), _positions(out_shape)
        plane = torch.arange(_positions(in_shape)).view(in_shape[1:]) if axis else None

        def at(reg: int | None, j: int) -> int | None:  # S at candidate j, over the output's positions
            if reg is None or (self.e.size[reg] == 1 and positions == 1) or (axis == 0 and self.e.size[reg] > 1):
                return reg
            if self.e.size[reg] == 1:  # one value for every entry (a reshaped Linear's): spread over the positions
                return self.pick(reg, rule.name, -1, torch.zeros(positions, dtype=torch.long))
            return self.pick(reg, rule.name, j, plane.select(axis - 1, j).reshape(-1))

        terms = []
        for j in range(in_shape[axis]):
            for t in v.terms(self).terms_:
                factor = self.recipe(("line", t.factor, rule.name, j, rule.dim, rule.keepdim, factor_shape),
                                     factor_shape)
                terms.append(Term(t.coef, at(t.reg, j), factor))
        return Terms(tuple(terms), out_shape)

    def pick(self, reg: int | None, pool: str, unit: int, index: torch.Tensor) -> int | None:
        if reg is None:
            return None
        if (reg, pool, unit) not in self.picked:
            n = len(index)
            self.picked[reg, pool, unit] = self.e.emit(GATHER, self.e.new(n), reg,
                                                       ints=(n, self.e.index_table(index.tolist())), cost=n)
        return self.picked[reg, pool, unit]

    def select(self, rule, a, b):
        """A selection between two branches: each branch's terms times the samples' indicator of choosing it (the
        gate layer's bits, or their complement)."""
        shape = tuple(rule.out_shape[1:])
        chose_first = self.recipe(("gate", rule.name), shape)
        chose_second = self.recipe(("not", chose_first), shape)
        return Terms(self.refactored(a, lambda f: self.times(f, chose_first, shape), shape).terms_ +
                     self.refactored(b, lambda f: self.times(f, chose_second, shape), shape).terms_, shape)

    def branch_sum(self, rule, a, b):
        shape = tuple(rule.out_shape[1:])
        if a.shape != b.shape:
            raise NotFusable(f"{rule.where}: a sum of branches of different shapes (broadcast)")
        if isinstance(a, Map) and isinstance(b, Map):
            n = self.e.size[a.reg]
            return Map(self.e.emit(ADD, self.e.new(n), a.reg, b.reg, ints=(n,), cost=n), shape)
        if any(isinstance(v, (Summed, Mapped, Added)) for v in (a, b)):  # the reader decides: summed or split
            return Added((a, b), shape)
        return Terms(a.terms(self).terms_ + b.terms(self).terms_, shape)

    def fixed_map(self, rule, args, kwargs):
        """``c_o · (D v)`` for the fixed map ``D`` of one channel (probed on unit inputs); a map that multiplies
        each entry by its own constant (a buffer of per-channel gains) puts ``√(c·d)`` into the factors."""
        v = next(a for a in args if isinstance(a, Value))
        in_shape, out_shape = tuple(rule.in_shape[1:]), tuple(rule.out_shape[1:])
        call = lambda t: rule.call([t if isinstance(a, Value) else a for a in args], kwargs)  # noqa: E731
        try:
            rows, cols, weights, n_out = plane_map(rule.where, call, rule.c, in_shape, out_shape, self.graph.device)
        except PerChannel:
            multiplier = entry_multiplier(rule.where, call, rule.c, in_shape, out_shape, self.graph.device)
            if isinstance(v, (Summed, Flat)):
                raise NotFusable(f"{rule.where}: a per-channel constant on a value summed over channels") from None
            self.constants.append(multiplier.sqrt())
            constant = self.recipe(("const", len(self.constants) - 1, out_shape), out_shape)
            return self.refactored(v, lambda factor: self.times(factor, constant, out_shape), out_shape)
        return self.mapped(rule, v, rows, cols, weights, n_out, in_shape, out_shape)

    def plane_map(self, rule, v):
        """A fixed map with any coefficients on each channel's plane (:class:`~lightning_nsv.kernel.rules.PlaneMap`):
        its matrix, every entry squared."""
        rows, cols, weights = rule.sparse
        return self.mapped(rule, v, rows, cols, weights ** 2, rule.n_out, tuple(rule.in_shape[1:]),
                           tuple(rule.out_shape[1:]))

    def mapped(self, rule, v, rows, cols, weights, n_out, in_shape, out_shape):
        """The sparse map ``(rows, cols, weights)`` (pair constants in) of one plane on every channel of ``v``."""
        if n_out == _positions(in_shape) and np.array_equal(rows, np.arange(n_out)) and \
                np.array_equal(cols, rows) and np.all(weights == weights[0]):  # c · identity
            scaled = v.scaled(self, float(weights[0]))
            return Flat(scaled.parts, out_shape) if isinstance(scaled, Flat) else scaled
        if isinstance(v, (Map, Summed)):
            return type(v)(self.spmv(v.reg, (rows, cols, weights), n_out), out_shape)
        if isinstance(v, Flat):
            raise NotFusable(f"{rule.where}: a fixed map of a flattened value")
        return Mapped(v, (rows, cols, weights), out_shape)

    def same_shape(self, rule, v):
        """A learnable scale (a parameter edge: 1 in the pair network) or an identity of the same shape."""
        if tuple(rule.in_shape) != tuple(rule.out_shape):
            raise NotFusable(f"{rule.where}: a learnable scale that broadcasts the value to another shape")
        return v

    def reshape(self, rule, args, kwargs):
        """Shape operations (``rule.shape_kind``): the same entries in another order (``view``, ``permute``), a
        channel slice (``select``), a concatenation (``join``)."""
        kind, in_shape, out_shape = rule.shape_kind, tuple(rule.in_shape[1:]), tuple(rule.out_shape[1:])
        v = next((a for a in args if isinstance(a, Value)), None)
        if kind == "join":
            return self.join(rule, args, kwargs)
        if kind == "select":
            return self.channel_slice(rule, v, args, in_shape, out_shape)
        if kind not in ("view", "permute"):
            raise NotFusable(f"{rule.where}: a shape operation of the pair program does not cover ({kind})")
        if out_shape == in_shape and kind == "view":
            return v
        if isinstance(v, Map) and self.e.size[v.reg] == 1:  # every entry equal: any reshape, its register spread
            positions = _positions(out_shape)  # over the new positions (every reader reads that many)
            return Map(v.reg if positions == 1 else self.pick(v.reg, rule.name, -1, torch.zeros(positions,
                                                                                                 dtype=torch.long)),
                       out_shape)
        keeps_positions = kind == "view" and out_shape[:1] == in_shape[:1]
        if isinstance(v, Map) and keeps_positions:
            return Map(v.reg, out_shape)
        if isinstance(v, Terms) and (keeps_positions or all(t.reg is None for t in v.terms_)):
            how = ("view", out_shape) if kind == "view" else ("call", rule.name, out_shape)
            return self.refactored(v, lambda f: None if f is None else (how[0], f, *how[1:]), out_shape)
        if kind == "view" and isinstance(v, (Map, Terms)) and len(out_shape) > 1 and \
                _positions(out_shape) % _positions(in_shape) == 0:  # channels split into more positions (maxout)
            index = torch.arange(_positions(out_shape)) % _positions(in_shape)
            tile = lambda reg: None if reg is None else self.e.emit(  # noqa: E731
                GATHER, self.e.new(len(index)), reg, ints=(len(index), self.e.index_table(index.tolist())),
                cost=len(index))
            if isinstance(v, Map):
                return Map(tile(v.reg), out_shape)
            return Terms(tuple(Term(t.coef, tile(t.reg), self.recipe(None if t.factor is None else (
                "view", t.factor, out_shape), out_shape)) for t in v.terms_), out_shape)
        if math.prod(out_shape) == math.prod(in_shape):
            return Flat(v.parts if isinstance(v, Flat) else (v,), out_shape)
        raise NotFusable(f"{rule.where}: a shape operation on a value with per-pair maps")

    def join(self, rule, args, kwargs):
        """``torch.cat`` along the channels: each branch's terms, their factors zero outside its channels; of
        values whose readers sum every entry: the parts of a :class:`Flat`."""
        out_shape = tuple(rule.out_shape[1:])
        parts, dim = list(args[0]), args[1] if len(args) > 1 else kwargs.get("dim", 0)
        dim = dim + len(out_shape) + 1 if dim < 0 else dim
        if any(isinstance(p, (Flat, Summed)) for p in parts) or dim != 1:
            if dim == 1 and all(len(p.shape) == 1 or isinstance(p, Flat) for p in parts):
                return Flat(tuple(q for p in parts for q in (p.parts if isinstance(p, Flat) else (p,))), out_shape)
            raise NotFusable(f"{rule.where}: a concatenation along dim {dim}")
        terms, lo = [], 0
        for part in parts:
            hi = lo + part.shape[0]
            terms += [Term(t.coef, t.reg, self.recipe(("embed", t.factor, lo, hi, out_shape), out_shape))
                      for t in part.terms(self).terms_]
            lo = hi
        return Terms(tuple(terms), out_shape)

    def channel_slice(self, rule, v, args, in_shape, out_shape):
        """Indexing that slices the channels only (``x[:, 2:5]``): the factors sliced alike; that keeps every channel
        and slices the planes (``x[:, :, 1:3]``, from ``split`` along a spatial dim): a fixed map of each plane."""
        index = args[1] if isinstance(args[1], tuple) else (args[1],)
        if index[0] == slice(None) and (len(index) < 2 or index[1] == slice(None)) and out_shape[:1] == in_shape[:1]:
            rows, cols, weights, n_out = plane_map(rule.where, lambda t: t[index], 1.0, in_shape, out_shape,
                                                   self.graph.device)
            return self.mapped(rule, v, rows, cols, weights, n_out, in_shape, out_shape)
        if len(index) < 2 or index[0] != slice(None) or not isinstance(index[1], slice) or \
                not all(i == slice(None) or i is Ellipsis for i in index[2:]) or out_shape[1:] != in_shape[1:]:
            raise NotFusable(f"{rule.where}: indexing other than a slice of the channels")
        if isinstance(v, Map):
            return Map(v.reg, out_shape)
        return self.refactored(v, lambda f: None if f is None else ("call", f, rule.name, out_shape), out_shape)

    def output(self, v: Value) -> int:
        if isinstance(v, Map) and self.e.size[v.reg] == 1:  # every output has this kernel
            return v.reg
        if math.prod(v.shape) == 1:
            return v.total(self)
        raise NotFusable("outputs whose kernels may differ (the last map does not join every output to the same "
                         "units)")


def compile_pair_program(graph, word_bits: int | None = None) -> PairProgram:
    """The :class:`~lightning_nsv.kernel.pair_code.PairProgram` of ``graph``'s pair network, or
    :class:`NotFusable` naming what it cannot express; ``word_bits`` (8, 16, 32, 64) forces the width of the
    words of 0/1 factors. Once per graph (:func:`lightning_nsv.kernel.fused.pair_program` keeps it); the factors
    are formed for each set of samples by :func:`lightning_nsv.kernel.pair_factors.sample_factors`."""
    from lightning_nsv.kernel.graph import run

    compiler = Compiler(graph)
    source = compiler.recipe(("input",), graph.input_shape)
    out = run(graph, Terms((Term(1.0, None, source),), tuple(graph.input_shape)), "program", compiler)
    return lay_out(compiler.e, compiler.output(out), compiler.shapes, compiler.family, compiler.temp,
                   compiler.constants, word_bits)

