"""The pair program as data (DESIGN.md §2c "Speed"): instructions on registers of a per-pair scratch array, the
per-sample factors they read (:data:`Recipe`), and the :class:`Emitter` that writes them and places the registers.
:mod:`lightning_nsv.kernel.pair_program` compiles a graph into it, :mod:`lightning_nsv.kernel.pair_engines` runs it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from lightning_nsv.kernel.slopes import relu_type

__all__ = ["Emitter", "FactorSlot", "NotFusable", "PairProgram", "Recipe", "channels_and_positions", "lay_out",
           "recipe_is_bits", "recipe_scale"]

# opcodes; an instruction row is [op, dst, s0, s1, i0 .. i7] (registers are scratch offsets, -1: none):
#   OVERLAP_TERMS       dst[p] (+)= Σ_t w_t · S_t[p] · Σ_k popcount(A_i[o_t + k·P + p] & A_j[...])   i: P, T, base,
#                       (s0_t, o_t, words_t) = table[base + 3t ...], w_t = weights[base + 3t]     accumulate
#   OVERLAP_DENSE       dst[p] (+)= value · s0[p] · Σ_c A_i[off + c·P + p] A_j[...]       i: P, accumulate, off, C
#   AXPY                dst[p] (+)= value · s0[p] (s0 -1: 1)                             i: P, accumulate
#   ADD_SCALAR, SCALE   dst[p] = s0[p] + value, value · s0[p];  ADD dst = s0 + s1         i: n
#   BOX                 window sums along the middle axis of s0 (outer, n_in, inner)       i: outer, n_in, inner, n_out,
#                       zero padding ``left`` before it, plus value                           k, stride, dilation, left
#   GATHER              dst[q] = s0[table[off + q]]                                       i: n, off
#   SPMV                dst[o] = Σ_k weights[k] s0[table[k]], k in table[ptr + o] .. table[ptr + o + 1]   i: n, ptr
#                       (the finished program's GATHER and SPMV indices are offsets into the scratch array: s0
#                       added)
#   SUM                 dst[0] = value · Σ s0                                             i: n
#   CONST               dst[q] = weights[off + q]                                         i: n, off
OVERLAP_TERMS, OVERLAP_DENSE, AXPY, ADD_SCALAR, SCALE, ADD, BOX, GATHER, SPMV, SUM, CONST = range(1, 12)
OP_NAMES = {OVERLAP_TERMS: "overlap_terms", OVERLAP_DENSE: "overlap_dense", AXPY: "axpy", ADD_SCALAR: "add_scalar",
            SCALE: "scale", ADD: "add", BOX: "box", GATHER: "gather", SPMV: "spmv", SUM: "sum", CONST: "const"}
ROW = 12


class NotFusable(ValueError):
    """The graph holds an operation (or a use of one) that the pair program does not express."""


# a per-sample factor: ("input",), ("gate", name), ("mul", a, b), ("pick", a | None, pool, unit), ("channels", lo,
# hi, shape) (1 on those channels), ("embed", a | None, lo, hi, shape) (a on those channels, 0 elsewhere),
# ("view", a, shape) (reshaped), ("call", a, node, shape) (the node's shape operation applied to a), ("const", k,
# shape) (the program's constants[k], the same for every sample), ("at", a, k, shape) (a read at the plane
# positions constants[k] of each output position), ("not", a) (1 − a, a a 0/1 mask of scale 1), ("piece", node)
# (1 in a saturating unit's linear piece), ("flat", node, lo, hi) (its flat value: lo, 0 or hi), ("line", a | None,
# node, j, dim, keepdim, shape) (a at candidate j along dim of a max, times [the max chose j])
Recipe = tuple


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
        return relu_type(family[recipe[1]][0])
    if kind == "piece":
        return True
    if kind == "flat":  # one bound other than 0: that bound times the mask of its piece
        return not (recipe[2] and recipe[3])
    if kind == "mul":
        return recipe_is_bits(recipe[1], family) and recipe_is_bits(recipe[2], family)
    return recipe_is_bits(recipe[1], family)  # pick, embed, view, call, at, not: as the factor they carry


def recipe_scale(recipe: Recipe | None, family: dict[str, tuple[float, float]]) -> float:
    """The constant of a 0/1 factor (``A = scale · mask``): the product of its gates' ``gamma``."""
    kind = recipe[0] if recipe is not None else None
    if kind == "gate":
        return family[recipe[1]][1]
    if kind == "mul":
        return recipe_scale(recipe[1], family) * recipe_scale(recipe[2], family)
    if kind in ("pick", "embed", "view", "call", "at", "not", "line"):
        return recipe_scale(recipe[1], family)
    if kind == "flat":
        return recipe[2] or recipe[3] or 1.0
    return 1.0


def channels_and_positions(shape: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
    """Channels and spatial dims of a per-sample shape (a scalar is one channel)."""
    return (shape[0], tuple(shape[1:])) if shape else (1, ())


class Emitter:
    """Instructions on virtual registers; :meth:`finish` places the registers in the scratch array."""

    def __init__(self) -> None:
        self.rows: list[list[int]] = []
        self.values: list[float] = []
        self.size: dict[int, int] = {}
        self.table: list[int] = []
        self.weights: list[float] = []
        self.factor_ids: dict[Recipe, int] = {}
        self.factor_rows: list[int] = []  # instructions whose i1 is a factor id (patched to its offset)
        self.table_reads: dict[int, list[int]] = {}  # registers an instruction reads through its table
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
        for k, row in enumerate(self.rows):
            for reg in [*(set(row[2:4]) - {-1}), *self.table_reads.get(k, ())]:
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
        self.table_reads = {moved[k]: regs for k, regs in self.table_reads.items()}

    def _shift_indices(self, lo: int, hi: int, by: int) -> None:
        self.table[lo:hi] = [int(i) + int(by) for i in self.table[lo:hi]]

    def finish(self, out: int, factor_layout: Callable[[int], tuple[int, int]]) -> tuple[np.ndarray, int, int]:
        """Scratch offsets for the registers (a register's space is reused once it is dead; never by the
        instruction that reads it last), the factor offsets patched in; ``(code, scratch size, out offset)``."""
        self.fold_shifts()
        code = np.asarray(self.rows, dtype=np.int64).reshape(-1, ROW)
        first, last = {}, {}
        for k, row in enumerate(code):
            for reg in (*row[1:4], *self.table_reads.get(k, ())):
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
            for r in {int(code[k, 1]), int(code[k, 2]), int(code[k, 3]), *self.table_reads.get(k, ())} - {-1}:
                if last.get(r) == k:
                    free.setdefault(self.size[r], []).append(offset[r])
        for k in range(len(code)):
            for col in (1, 2, 3):
                if code[k, col] >= 0:
                    code[k, col] = offset[int(code[k, col])]
            if code[k, 0] == GATHER:  # the indices read the scratch array itself (no offset to add per pair)
                self._shift_indices(code[k, 5], code[k, 5] + code[k, 4], code[k, 2])
            elif code[k, 0] == SPMV:
                self._shift_indices(self.table[code[k, 5]], self.table[code[k, 5] + code[k, 4]], code[k, 2])
        for k in self.factor_rows:
            if code[k, 0] == OVERLAP_TERMS:  # each term's register and factor in the table
                for t in range(code[k, 5]):
                    at = code[k, 6] + 3 * t
                    if self.table[at] >= 0:
                        self.table[at] = offset[self.table[at]]
                    self.table[at + 1], self.table[at + 2] = factor_layout(self.table[at + 1])
            else:
                code[k, 6], code[k, 7] = factor_layout(int(code[k, 6]))
        return code, top, offset[out]


def lay_out(emitter: Emitter, out: int, shapes: dict, family: dict, temp: int, constants: list,
            word_bits: int | None = None) -> PairProgram:
    """The finished program: the per-sample factors laid out (0/1 masks as words of ``word_bits`` bits, the
    narrowest that hold them by default; the rest float64) and the registers placed."""
    recipes = sorted(emitter.factor_ids, key=emitter.factor_ids.get)
    bits = [recipe_is_bits(r, family) for r in recipes]
    split = [channels_and_positions(shapes[r]) for r in recipes]
    masks = [(c, math.prod(s)) for (c, s), b in zip(split, bits) if b]
    if word_bits is None:  # ties: wider words, fewer of them
        word_bits = min((64, 32, 16, 8), key=lambda w: sum(-(-c // w) * p * w for c, p in masks))
    if isinstance(word_bits, bool) or not isinstance(word_bits, int) or word_bits not in (8, 16, 32, 64):
        raise ValueError(f"word_bits must be 8, 16, 32 or 64, got {word_bits!r}")
    layout, words, values = [], 0, 0
    for (channels, spatial), is_bits in zip(split, bits):
        positions = math.prod(spatial)
        if is_bits:
            count = -(-channels // word_bits)
            layout.append((words, count))
            words += count * positions
        else:
            layout.append((values, channels))
            values += channels * positions
    code, top, out_offset = emitter.finish(out, lambda factor: layout[factor])
    factors = [FactorSlot(r, b, shapes[r], recipe_scale(r, family) if b else 1.0, *lay)
               for r, b, lay in zip(recipes, bits, layout)]
    return PairProgram(code, np.asarray(emitter.values, dtype=np.float64), np.asarray(emitter.table, dtype=np.int64),
                       np.asarray(emitter.weights, dtype=np.float64), top + temp, temp, out_offset, factors,
                       emitter.operations, word_bits, words, values, constants)
