"""What the active-set solver asks of its column store, and what the store's batches of candidates answer.

Beneath :class:`~lightning_nsv.solver.protocol.KernelColumns` (who computes kernel columns) the solver's free set
(:class:`~lightning_nsv.solver.factor.FreeSet`) sees ``Q = (y yᵀ ∘ K) / scale`` only through a :class:`Store`: it
fetches the columns of a block of candidates as :class:`Candidates`, reads ``Q[rows, new]`` from them, admits them
when the factor takes them, asks for ``Q[:, F] α`` and says which members stay. Samples are indices in ``[0, m)``
(int64 arrays or lists of ints), vectors float64. The solver's stores declare the protocol by subclassing it (its
methods are abstract): :class:`~lightning_nsv.solver.column_store.ColumnStore`,
:class:`~lightning_nsv.solver.column_store.DeviceColumnStore` (a :class:`DeviceStore`) and
:class:`~lightning_nsv.solver.pair_store.PairStore`; the protocols are structural and checked at run time
(``isinstance``), so a store written from these docstrings alone need not subclass them.
"""
from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable

import numpy as np
import torch

if TYPE_CHECKING:
    from lightning_nsv.solver.column_store import ColumnStore

__all__ = ["Candidates", "DeviceStore", "Store", "StoredCandidates"]


@runtime_checkable
class Candidates(Protocol):
    """The columns ``Q[:, new]`` of a block of candidates, as far as a :class:`Store` formed them at the fetch.

    ``new``: the candidates' samples, int64 of shape ``(b,)``, distinct and outside F at the fetch, in the order they
    join F when admitted."""

    new: np.ndarray

    @abstractmethod
    def take(self, rows) -> np.ndarray | torch.Tensor:
        """``Q[rows, new]``, float64 of shape ``(len(rows), b)``: numpy from a :class:`Store`, a tensor on its
        :attr:`~DeviceStore.device` from a :class:`DeviceStore`. ``rows`` (int64 samples) lie among the members
        given to :meth:`Store.fetch` and ``new`` (any samples when no members were given); another row may raise
        ``RuntimeError``. The caller reads the result and does not write it (it may be the batch's memory)."""

    @abstractmethod
    def single(self, k: int) -> Candidates:
        """The batch of the candidate ``new[k]`` alone (``new`` of shape ``(1,)``), admitted on its own when the
        block is refused; it may share memory with this batch."""


@runtime_checkable
class StoredCandidates(Candidates, Protocol):
    """:class:`Candidates` of a :class:`~lightning_nsv.solver.column_store.ColumnStore`, which keep themselves in it
    the way they were formed (full columns as a block, lazily fetched ones as pending)."""

    @abstractmethod
    def store_into(self, store: ColumnStore) -> None:
        """Called by the store's :meth:`~Store.admit`: its candidates joined F after the members; the store owns the
        batch's columns from then on (no one writes them)."""


C = TypeVar("C", bound=Candidates)


@runtime_checkable
class Store(Protocol[C]):
    """The columns ``Q[:, F]`` of the free set F of the active-set solver on ``m`` samples, and the columns of its
    candidates. F is the members' samples in the order they were admitted (:attr:`FreeSet.index
    <lightning_nsv.solver.factor.FreeSet.index>`); the store follows it through :meth:`admit` and :meth:`keep`.
    Memory is the store's: what it returns from :meth:`q_times` is the caller's, the batches of :meth:`fetch` are read
    by the caller and handed back to :meth:`admit`."""

    @abstractmethod
    def fetch(self, new: np.ndarray, members: list[int] | None = None) -> C:
        """The columns of candidates ``new`` (int64, distinct, outside F) for rows among the ``members`` (F's samples
        in order) and ``new`` at least, every row when ``members`` is ``None``; the batch's own ``new`` holds the same
        samples, in the order the store chose. Raises what the kernel's provider raises (``ValueError`` on non-finite
        columns)."""

    @abstractmethod
    def admit(self, columns: C) -> None:
        """The candidates of ``columns`` (this store's last :meth:`fetch`, F unchanged since) joined F after its
        members, in the order of ``columns.new``."""

    @abstractmethod
    def q_times(self, index: list[int], alpha: np.ndarray) -> np.ndarray:
        """``Q[:, index] @ alpha``: ``index`` F's samples in order, ``alpha`` float64 of shape ``(len(index),)``; a new
        float64 numpy array of shape ``(m,)`` (from a :class:`DeviceStore` too)."""

    @abstractmethod
    def keep(self, kept: np.ndarray, members: int) -> None:
        """The members at positions ``kept`` of F (int64, ascending) stay, in their order; the others left F.
        ``members``: how many stay (``len(kept)``)."""


@runtime_checkable
class DeviceStore(Store[C], Protocol):
    """A :class:`Store` whose batches' :meth:`~Candidates.take` gives float64 tensors on :attr:`device`, where the
    torch free set keeps its factor."""

    device: torch.device
