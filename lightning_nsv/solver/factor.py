"""The free set of the active-set solver and the Cholesky factor of ``Q_FF`` (DESIGN.md §2).

:class:`FreeSet` holds the members of F, their column store and the logic of admitting a block of candidates (a
block Cholesky step, refused when ``Q_FF`` would turn numerically singular) and of deleting members (a QR of the kept
trailing rows); :class:`NumpyFreeSet` keeps the factor as a Fortran-ordered numpy array in memory it reuses
(LAPACK ``tpqrt`` for deletions), :class:`TorchFreeSet` as a float64 tensor on the store's device.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import scipy.linalg
import scipy.linalg.lapack
import torch

from lightning_nsv.memory import base_page_empty
from lightning_nsv.solver.store_protocol import Candidates, DeviceStore, Store

__all__ = ["FreeSet", "NumpyFreeSet", "TorchFreeSet"]

REMOVE_COLUMNS = GROW_COLUMNS = 256  # columns of the factor moved at a time in a downdate or an update


class FreeSet(ABC):
    """Free set F of the active-set method: the Cholesky factor ``L`` of ``Q_FF`` (a backend's: the abstract methods)
    and a :class:`~lightning_nsv.solver.store_protocol.Store` that gives ``Q[rows, new]`` for candidates and
    ``Q[:, F] α`` (a :class:`~lightning_nsv.solver.column_store.ColumnStore`, or a
    :class:`~lightning_nsv.solver.pair_store.PairStore` for the multi-class pairs). Vectors in and out are numpy."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.index: list[int] = []  # F's samples, in the order of the factor's rows
        self._chol: np.ndarray | torch.Tensor | None = self._empty_factor()  # None only while numpy resizes it

    def __len__(self) -> int:
        return len(self.index)

    @property
    def chol(self):
        """Lower Cholesky factor of ``Q_FF``, exactly ``n×n``."""
        return self._chol

    def fetch(self, new: np.ndarray) -> Candidates:
        """The columns of candidates ``new`` for :meth:`try_add` (``Q[F ∪ new, new]`` at least)."""
        return self.store.fetch(new, self.index)

    def q_times(self, alpha: np.ndarray) -> np.ndarray:
        """``Q[:, F] @ alpha``."""
        return self.store.q_times(self.index, alpha)

    def solve_ones(self) -> np.ndarray:
        return self.solve(np.ones(len(self)))

    def try_add(self, columns: Candidates) -> bool:
        """Append the candidates of ``columns`` (from :meth:`fetch`) unless that makes ``Q_FF`` (numerically)
        singular: ``L_21 = (L⁻¹ Q_FB)ᵀ``, ``L_22`` the Cholesky factor of the Schur complement
        ``Q_BB − L_21 L_21ᵀ``, refused when it fails or a pivot falls below ``1e-10`` of the block's diagonal."""
        new = columns.new
        q_fb, q_bb = columns.take(np.asarray(self.index, dtype=np.int64)), columns.take(new)
        w = self._lower_solve_block(q_fb) if len(self) else q_fb
        l22 = self._cholesky(q_bb - w.T @ w)
        if l22 is None or self._degenerate(l22, q_bb):
            return False
        self._append(w, l22)
        self.store.admit(columns)
        self.index += new.tolist()
        return True

    def remove(self, positions: np.ndarray) -> None:
        """Delete the members at ``positions``: with ``p`` the first of them, the kept rows after it,
        ``M = L[after, p:]``, give the new trailing block ``M Mᵀ = Rᵀ R`` from a QR of ``Mᵀ`` (:meth:`_downdated`)."""
        positions = np.unique(np.asarray(positions, dtype=np.int64))
        if not len(positions):
            return
        keep = np.setdiff1d(np.arange(len(self)), positions)
        self._chol = self._downdated(positions, keep)
        self.index = [self.index[k] for k in keep]
        self.store.keep(keep, len(self.index))

    @abstractmethod
    def _empty_factor(self) -> np.ndarray | torch.Tensor:
        """The ``0×0`` factor of an empty F."""

    @abstractmethod
    def solve(self, rhs):
        """``Q_FF⁻¹ rhs`` for a vector or matrix ``rhs`` (numpy, or a tensor of the store's batches), as numpy; ``rhs``
        itself while F is empty."""

    @abstractmethod
    def lower_solve(self, rhs) -> np.ndarray:
        """``L⁻¹ rhs``, as numpy."""

    @abstractmethod
    def lower_t_solve(self, rhs) -> np.ndarray:
        """``L⁻ᵀ rhs``, as numpy."""

    @abstractmethod
    def _lower_solve_block(self, q_fb):
        """``L⁻¹ Q_FB`` in the backend's type, for ``Q_FB`` from a batch's :meth:`~Candidates.take`."""

    @staticmethod
    @abstractmethod
    def _cholesky(schur):
        """The lower Cholesky factor of ``schur``, ``None`` when it is not positive definite."""

    @staticmethod
    @abstractmethod
    def _degenerate(l22, q_bb) -> bool:
        """Whether the new pivots ``diag(l22)²`` fall below ``1e-10`` of the largest diagonal of ``q_bb``."""

    @abstractmethod
    def _append(self, w, l22) -> None:
        """``L`` grown by the rows ``[wᵀ | l22]``."""

    @abstractmethod
    def _downdated(self, positions: np.ndarray, keep: np.ndarray):
        """The factor of ``Q_FF`` without the members at ``positions`` (``keep`` the others, ascending)."""


class NumpyFreeSet(FreeSet):
    """:class:`FreeSet` with ``L`` a Fortran-ordered numpy array (LAPACK reads it in place) that is a view of the
    first ``n²`` entries of memory that never shrinks: updates and downdates write over it."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self._memory: np.ndarray | None = None  # the factor's memory, grown on the first admission

    def _empty_factor(self) -> np.ndarray:
        return np.zeros((0, 0), order="F")

    def solve(self, rhs: np.ndarray) -> np.ndarray:
        """``Q_FF⁻¹ rhs``."""
        if not len(self):
            return rhs
        return scipy.linalg.cho_solve((self.chol, True), rhs, check_finite=False)

    def lower_solve(self, rhs: np.ndarray) -> np.ndarray:
        """``L⁻¹ rhs``."""
        return scipy.linalg.solve_triangular(self.chol, rhs, lower=True, check_finite=False)

    def lower_t_solve(self, rhs: np.ndarray) -> np.ndarray:
        """``L⁻ᵀ rhs``."""
        return scipy.linalg.solve_triangular(self.chol, rhs, lower=True, trans="T", check_finite=False)

    _lower_solve_block = lower_solve

    @staticmethod
    def _cholesky(schur: np.ndarray) -> np.ndarray | None:
        try:
            return np.linalg.cholesky(schur)
        except np.linalg.LinAlgError:
            return None

    @staticmethod
    def _degenerate(l22: np.ndarray, q_bb: np.ndarray) -> bool:
        return np.min(np.diag(l22)) ** 2 <= 1e-10 * np.max(np.diag(q_bb))

    def _append(self, w: np.ndarray, l22: np.ndarray) -> None:
        n, b = len(self), l22.shape[0]
        chol = self._grown(n + b)
        chol[:n, n:], chol[n:, :n], chol[n:, n:] = 0.0, w.T, l22
        self._chol = chol

    def _grown(self, size: int) -> np.ndarray:
        """The factor as the leading ``n×n`` block of a ``size×size`` Fortran array (the rest to be filled): in the
        memory of the old factor while it holds ``size²`` entries, e.g. after a downdate (columns moved last to first:
        each lands at or after where it was), else in that memory enlarged in place (``realloc``: the old factor is not
        held twice), else in new memory."""
        n = len(self)
        if (self._memory is None or self._memory.size < size * size) and not self._enlarged(size * size):
            old = self._memory[:n * n].reshape((n, n), order="F") if n else None
            self._memory = base_page_empty(size * size)
            chol = self._memory.reshape((size, size), order="F")
            if n:
                chol[:n, :n] = old
            return chol
        flat = self._memory
        for hi in range(n, 0, -GROW_COLUMNS):
            lo = max(0, hi - GROW_COLUMNS)
            source = flat[lo * n:hi * n].reshape((n, hi - lo), order="F")
            flat[lo * size:hi * size].reshape((size, hi - lo), order="F")[:n] = source  # numpy buffers overlaps
        return flat[:size * size].reshape((size, size), order="F")

    def _enlarged(self, entries: int) -> bool:
        """Whether the factor's memory could be resized in place to ``entries`` (no other view of it held)."""
        if self._memory is None:
            return False
        self._chol = None  # the factor is a view of the memory: numpy resizes only memory that nothing views
        try:
            self._memory.resize(entries)
        except ValueError:
            return False
        return True

    def _downdated(self, positions: np.ndarray, keep: np.ndarray) -> np.ndarray:
        """The factor without the members at ``positions``. The kept rows after the first deleted one,
        ``M = [L_KK | L_KD]``, span the new trailing block ``M Mᵀ``: a triangular-pentagonal QR (LAPACK ``tpqrt``) of
        ``[L_KKᵀ; L_KDᵀ]`` gives its factor in ``O(k·r²)`` for ``k`` deleted and ``r`` trailing members, a panel of
        :data:`REMOVE_COLUMNS` rows of it at a time (``tpmqrt`` applies a panel's reflectors to the rows after it).
        The new factor is written over the old one's memory (its first ``(n − k)²`` entries, column by column):
        besides it only ``L_KD`` and one panel are copied (``O(r·(k + 256))`` memory, not the ``r×r`` trailing
        block)."""
        p = int(positions[0])
        after = keep[keep > p]
        r, chol, size = len(after), self._chol, len(keep)
        # the deleted columns' entries of the kept rows, before the old factor is overwritten
        pentagon = _submatrix(chol, after, positions).T if r else None  # F-contiguous (k, r)
        flat = chol.reshape(-1, order="F")  # a view: chol is Fortran-contiguous
        for lo in range(0, p, REMOVE_COLUMNS):
            # column j moves from offset j·n to j·size <= j·n: a strip is read whole before it is written, and
            # what it overwrites was read with the strips before it
            hi = min(p, lo + REMOVE_COLUMNS)
            strip = chol[keep, lo:hi]
            flat[lo * size:hi * size] = strip.ravel(order="F")
        factor = flat[:size * size].reshape((size, size), order="F")
        for lo in range(0, r, REMOVE_COLUMNS):
            # rows lo:hi of [L_KKᵀ; L_KDᵀ]'s QR from old columns after[lo:hi], which the new columns p + [0, hi)
            # written so far end before (p + hi)·size <= after[hi]·n: the columns still to be read are intact
            hi = min(r, lo + REMOVE_COLUMNS)
            panel = _submatrix(chol, after[lo:], after[lo:hi]).T  # F-ordered (hi − lo, r − lo), upper-trapezoidal
            width = hi - lo
            head, reflectors, t, info = scipy.linalg.lapack.dtpqrt(0, min(32, width), panel[:, :width],
                                                                     pentagon[:, lo:hi], overwrite_a=1, overwrite_b=1)
            if info != 0:
                raise RuntimeError(f"LAPACK dtpqrt failed with info={info}")
            panel[:, :width] = head
            if hi < r:
                tail, rest, info = scipy.linalg.lapack.dtpmqrt(0, reflectors, t, panel[:, width:], pentagon[:, hi:],
                                                                 side="L", trans="T", overwrite_a=1, overwrite_b=1)
                if info != 0:
                    raise RuntimeError(f"LAPACK dtpmqrt failed with info={info}")
                panel[:, width:], pentagon[:, hi:] = tail, rest
            panel *= np.sign(np.diag(panel[:, :width]))[:, None]
            columns = factor[:, p + lo:p + hi]
            columns[:p + lo] = 0.0
            columns[p + lo:] = panel.T  # the strictly lower part of the panel's head is 0
        return factor


def _submatrix(a: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``a[np.ix_(rows, cols)]`` (C order) for increasing ``cols``, a run of consecutive columns at a time (several
    times faster than ``np.ix_`` on a Fortran-ordered factor)."""
    out = np.empty((len(rows), len(cols)))
    starts = np.flatnonzero(np.diff(cols, prepend=-2) != 1)
    for lo, hi in zip(starts, [*starts[1:], len(cols)]):
        out[:, lo:hi] = a[rows, cols[lo]:cols[lo] + hi - lo]
    return out


class TorchFreeSet(FreeSet):
    """:class:`FreeSet` with ``L`` a float64 tensor on the store's device (``torch.linalg`` for every step)."""

    def __init__(self, store: DeviceStore) -> None:
        self.device = store.device
        super().__init__(store)

    def _empty_factor(self) -> torch.Tensor:
        return torch.zeros(0, 0, dtype=torch.float64, device=self.device)

    def _on_device(self, values) -> torch.Tensor:
        values = values if isinstance(values, torch.Tensor) else torch.from_numpy(np.asarray(values, dtype=np.float64))
        return values.to(self.device, torch.float64)

    def _apply(self, solve, rhs) -> np.ndarray:
        """``solve`` (of a matrix on the device) applied to a vector or matrix ``rhs``, as numpy."""
        b = self._on_device(rhs)
        out = solve(b[:, None] if b.ndim == 1 else b)
        return (out[:, 0] if b.ndim == 1 else out).cpu().numpy()

    def lower_solve(self, rhs) -> np.ndarray:
        return self._apply(lambda b: torch.linalg.solve_triangular(self._chol, b, upper=False), rhs)

    def lower_t_solve(self, rhs) -> np.ndarray:
        return self._apply(lambda b: torch.linalg.solve_triangular(self._chol.T, b, upper=True), rhs)

    def solve(self, rhs) -> np.ndarray:
        if not len(self):
            return rhs.cpu().numpy() if isinstance(rhs, torch.Tensor) else rhs
        return self._apply(lambda b: torch.cholesky_solve(b, self._chol), rhs)

    def _lower_solve_block(self, q_fb: torch.Tensor) -> torch.Tensor:
        return torch.linalg.solve_triangular(self._chol, q_fb, upper=False)

    @staticmethod
    def _cholesky(schur: torch.Tensor) -> torch.Tensor | None:
        l22, info = torch.linalg.cholesky_ex(schur)
        return l22 if int(info) == 0 else None

    @staticmethod
    def _degenerate(l22: torch.Tensor, q_bb: torch.Tensor) -> bool:
        return float(torch.diagonal(l22).min()) ** 2 <= 1e-10 * float(torch.diagonal(q_bb).max())

    def _append(self, w: torch.Tensor, l22: torch.Tensor) -> None:
        n, b = len(self), l22.shape[0]
        chol = torch.zeros(n + b, n + b, dtype=torch.float64, device=self.device)
        chol[:n, :n], chol[n:, :n], chol[n:, n:] = self._chol, w.T, l22
        self._chol = chol

    def _downdated(self, positions: np.ndarray, keep: np.ndarray) -> torch.Tensor:
        p = int(positions[0])
        kept = torch.as_tensor(keep, device=self.device)
        after = kept[kept > p]
        chol = self._chol
        factor = chol[kept][:, kept]
        if len(after):
            r = torch.linalg.qr(chol[after, p:].T, mode="r").R
            factor[p:, p:] = (r * torch.sign(torch.diagonal(r))[:, None]).T
        return factor
