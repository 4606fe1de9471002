"""The symbolic pair values of the pair program's compiler (:mod:`lightning_nsv.kernel.pair_program`).

A value of a node is what the program knows of the pair network there, for every pair: the same per-pair map in
every channel (:class:`Map`), a sum of terms ``coef · S[p] · A(x)[c, p] · A(x')[c, p]`` (:class:`Terms`), only its
channel sum (:class:`Summed`), a fixed map of terms or a sum waiting for its reader (:class:`Mapped`,
:class:`Added`), or a rearrangement
whose readers sum every entry (:class:`Flat`). Each states its channel sum, its terms, a shift and a scale by
emitting instructions through the compiler ``c``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lightning_nsv.kernel.pair_code import ADD, ADD_SCALAR, SCALE, SUM, NotFusable, Recipe, channels_and_positions

if TYPE_CHECKING:
    from lightning_nsv.kernel.pair_program import Compiler

__all__ = ["Added", "Flat", "Map", "Mapped", "Summed", "Term", "Terms", "Value", "positions_of"]


def positions_of(shape) -> int:
    """Positions of a per-sample shape ``(C, *spatial)``."""
    return math.prod(channels_and_positions(shape)[1])


@dataclass(frozen=True)
class Term:
    """``coef · S[p] · A(x)[c, p] · A(x')[c, p]``; ``reg`` ``None``: ``S = 1``; ``factor`` ``None``: ``A = 1``."""

    coef: float
    reg: int | None
    factor: Recipe | None


class Value:
    """A symbolic pair value of ``shape`` (per pair, ``(C, *spatial)``): what the program knows of it."""

    shape: tuple[int, ...]

    def channel_sum(self, c: Compiler) -> int:
        """A register over the positions holding ``Σ_c`` of the value."""
        raise NotFusable(f"a channel sum of a {type(self).__name__} value")

    def terms(self, c: Compiler) -> Terms:
        raise NotFusable(f"a {type(self).__name__} value read by an operation on each channel")

    def plus(self, c: Compiler, amount: float) -> Value:
        return self.terms(c).plus(c, amount)

    def scaled(self, c: Compiler, factor: float) -> Value:
        return self.terms(c).scaled(c, factor)

    def total(self, c: Compiler) -> int:
        """A one-value register holding the sum of every entry."""
        reg, positions = self.channel_sum(c), positions_of(self.shape)
        return reg if positions == 1 else c.e.emit(SUM, c.e.new(1), reg, ints=(positions,), value=1.0,
                                                     cost=positions)


@dataclass(frozen=True)
class Map(Value):
    """The same per-pair map ``S`` (register ``reg`` over the positions) in every channel."""

    reg: int
    shape: tuple[int, ...]

    def channel_sum(self, c):
        n = c.e.size[self.reg]
        return c.e.emit(SCALE, c.e.new(n), self.reg, ints=(n,), value=channels_and_positions(self.shape)[0], cost=n)

    def terms(self, c):
        return Terms((Term(1.0, self.reg, None),), self.shape)

    def plus(self, c, amount):
        n = c.e.size[self.reg]
        return Map(c.e.emit(ADD_SCALAR, c.e.new(n), self.reg, ints=(n,), value=amount, cost=n), self.shape)

    def scaled(self, c, factor):
        n = c.e.size[self.reg]
        return Map(c.e.emit(SCALE, c.e.new(n), self.reg, ints=(n,), value=factor, cost=n), self.shape)


@dataclass(frozen=True)
class Terms(Value):
    terms_: tuple[Term, ...]
    shape: tuple[int, ...]

    def channel_sum(self, c):
        return c.channel_sum(self.terms_, self.shape)

    def terms(self, c):
        return self

    def plus(self, c, amount):
        return Terms(self.terms_ + (Term(amount, None, None),), self.shape)

    def scaled(self, c, factor):
        return Terms(tuple(Term(t.coef * factor, t.reg, t.factor) for t in self.terms_), self.shape)


@dataclass(frozen=True)
class Summed(Value):
    """Only the channel sum is known (register over the positions): readers must sum over channels."""

    reg: int
    shape: tuple[int, ...]

    def channel_sum(self, c):
        return self.reg

    def plus(self, c, amount):
        n = c.e.size[self.reg]
        channels = channels_and_positions(self.shape)[0]
        return Summed(c.e.emit(ADD_SCALAR, c.e.new(n), self.reg, ints=(n,), value=amount * channels, cost=n),
                      self.shape)

    def scaled(self, c, factor):
        n = c.e.size[self.reg]
        return Summed(c.e.emit(SCALE, c.e.new(n), self.reg, ints=(n,), value=factor, cost=n), self.shape)


@dataclass(eq=False)
class Mapped(Value):
    """A fixed map that acts alike on every channel (``sparse``: rows, cols and weights over one plane, pair
    constants included) of ``inner``: a reader that sums over the channels maps the channel sum, any other splits
    the value over the map's entries; each once (the declared caches)."""

    inner: Value
    sparse: tuple
    shape: tuple[int, ...]
    summed: int | None = field(default=None, repr=False)
    split: Terms | None = field(default=None, repr=False)

    def channel_sum(self, c):
        if self.summed is None:
            self.summed = c.spmv(self.inner.channel_sum(c), self.sparse, positions_of(self.shape))
        return self.summed

    def terms(self, c):
        if self.split is None:
            self.split = c.split(self.inner.terms(c), self.sparse, self.shape)
        return self.split

    def scaled(self, c, factor):
        return Mapped(self.inner.scaled(c, factor), self.sparse, self.shape)


@dataclass(eq=False)
class Added(Value):
    """A sum of values whose reader decides how it is read: the sum of their channel sums, or all their terms
    (once each: the declared caches)."""

    parts: tuple
    shape: tuple[int, ...]
    summed: int | None = field(default=None, repr=False)
    joined: Terms | None = field(default=None, repr=False)

    def channel_sum(self, c):
        if self.summed is None:
            regs = [part.channel_sum(c) for part in self.parts]
            n = c.e.size[regs[0]]
            for reg in regs[1:]:
                regs[0] = c.e.emit(ADD, c.e.new(n), regs[0], reg, ints=(n,), cost=n)
            self.summed = regs[0]
        return self.summed

    def terms(self, c):
        if self.joined is None:
            self.joined = Terms(tuple(t for part in self.parts for t in part.terms(c).terms_), self.shape)
        return self.joined

    def scaled(self, c, factor):
        return Added(tuple(part.scaled(c, factor) for part in self.parts), self.shape)


@dataclass(frozen=True)
class Flat(Value):
    """A rearrangement (flatten, view, permute) of the values ``parts`` joined: readers must sum every entry."""

    parts: tuple
    shape: tuple[int, ...]

    def total(self, c):
        regs = [part.total(c) for part in self.parts]
        for reg in regs[1:]:
            regs[0] = c.e.emit(ADD, c.e.new(1), regs[0], reg, ints=(1,), cost=1)
        return regs[0]

    def plus(self, c, amount):
        raise NotFusable("a shift of a flattened value")

    def scaled(self, c, factor):
        return Flat(tuple(part.scaled(c, factor) for part in self.parts), self.shape)
