"""``Q`` of the multi-class pair problem (DESIGN.md §2b) from sample kernel columns, and the sample rows it keeps.

The pairs are ``p = (i, k)``, ``k ≠ y_i`` (sample-major, classes ascending), ``Q_pq = K(x_i, x_j) c_pq / scale`` with
``c_pq = <d_p, d_q>``, ``d_p = e_{y_i} − e_k``. All pairs of a sample share its kernel column: :class:`SampleRows`
computes ``K(x_j, ·)`` once per sample (also for one-vs-rest and the generic pair columns of
:mod:`lightning_nsv.solver.multiclass`), and :class:`PairStore` answers the active-set solver from those rows.
"""
from __future__ import annotations

import numpy as np
import torch

from lightning_nsv.memory import base_page_empty
from lightning_nsv.solver.protocol import KernelColumns, finite_columns
from lightning_nsv.solver.store_protocol import Candidates, Store

__all__ = ["PairColumns", "PairStore", "SampleRows"]


class SampleRows(KernelColumns):
    """Kernel columns ``K(·, x_j)`` of a provider's samples, each computed once and kept as a row of an ``(s, m)``
    buffer that grows geometrically (``K`` is symmetric, so a column is also a row); itself a
    :class:`~lightning_nsv.solver.protocol.KernelColumns` whose columns are read from the buffer.
    Memory ``8·m·s`` bytes for ``s`` samples asked for."""

    def __init__(self, provider: KernelColumns, m: int) -> None:
        self.provider = provider
        self.slot = np.full(m, -1, dtype=np.int64)
        self.count = 0
        self._rows = np.empty((0, m))

    def __len__(self) -> int:
        return self._rows.shape[1]

    dtype = property(lambda self: torch.float64, doc="float64")
    device = property(lambda self: torch.device("cpu"), doc="the CPU")

    def diagonal(self) -> np.ndarray:
        return self.provider.diagonal()

    @property
    def kept(self) -> np.ndarray:
        """``K(x_j, ·)`` of the stored samples, one row per slot."""
        return self._rows[: self.count]

    def add(self, samples: np.ndarray) -> None:
        """Compute and keep the rows of those of ``samples`` that are not kept yet (one call of the provider)."""
        missing = np.unique(samples[self.slot[samples] < 0])
        if not len(missing):
            return
        need = self.count + len(missing)
        if need > self._rows.shape[0]:  # pages of np.empty are only touched when written
            grown = base_page_empty((max(need, 2 * self._rows.shape[0], 64), self._rows.shape[1]))
            grown[: self.count] = self._rows[: self.count]
            self._rows = grown
        self._rows[self.count:need] = finite_columns(self.provider.columns(missing)).T
        self.slot[missing] = np.arange(self.count, need)
        self.count = need

    def rows(self, samples: np.ndarray) -> np.ndarray:
        """``K(x_j, ·)`` for each sample ``j``, shape ``(len(samples), m)``."""
        self.add(samples)
        return self._rows[self.slot[samples]]

    def columns(self, idx: np.ndarray) -> np.ndarray:
        """``K[:, idx]`` (Fortran order)."""
        return self.rows(np.asarray(idx, dtype=np.int64)).T


class PairColumns(Candidates):
    """``Q[:, new]`` of multi-class pairs, formed on request from the sample kernel rows of a :class:`PairStore`."""

    def __init__(self, store: PairStore, new: np.ndarray) -> None:
        self.store, self.new = store, new

    def take(self, rows) -> np.ndarray:
        """``Q[rows, new] = K(x_i, x_j) c_pq / scale`` for pairs ``p = (i, k)`` in ``rows``, ``q = (j, l)`` in ``new``."""
        st = self.store
        rows = np.asarray(rows, dtype=np.int64)
        kernel = st.sample_rows[np.ix_(st.slot[st.pair_sample[self.new]], st.pair_sample[rows])].T
        return kernel * (st.directions[rows] @ st.directions[self.new].T) / st.scale

    def single(self, k: int) -> PairColumns:
        return PairColumns(self.store, self.new[k:k + 1])


class PairStore(Store[PairColumns]):
    """``Q`` of the multi-class pair problem from sample kernel columns: ``K(x_j, ·)`` is computed once for each
    sample ``j`` with a pair that is ever a candidate (:class:`SampleRows`); ``Q[:, F] α`` comes from ``f = K[:, S] β``
    (``β_jk`` the class coefficients of the free pairs), an ``m×s×K`` product, and blocks of ``Q_FF`` from ``K_SS``
    times ``c_pq = <d_p, d_q>``. Memory ``8·m·s`` bytes (against ``8·m(K − 1)`` per free pair for a
    :class:`~lightning_nsv.solver.column_store.ColumnStore`)."""

    def __init__(self, sample_columns: KernelColumns, labels: np.ndarray, num_classes: int, scale: float) -> None:
        m = labels.shape[0]
        self.labels, self.scale = labels, scale
        self._samples = SampleRows(sample_columns, m)
        classes = np.broadcast_to(np.arange(num_classes), (m, num_classes))
        self.pair_sample = np.repeat(np.arange(m), num_classes - 1)
        self.pair_class = classes[classes != labels[:, None]]
        self.directions = np.zeros((len(self.pair_sample), num_classes))  # d_p as rows
        pairs = np.arange(len(self.pair_sample))
        self.directions[pairs, labels[self.pair_sample]] = 1.0
        self.directions[pairs, self.pair_class] = -1.0

    @property
    def sample_rows(self) -> np.ndarray:
        """``K(x_j, ·)`` of the stored samples, one row per slot."""
        return self._samples.kept

    @property
    def slot(self) -> np.ndarray:
        """The row of each sample in :attr:`sample_rows` (−1: none)."""
        return self._samples.slot

    @property
    def count(self) -> int:
        return self._samples.count

    def fetch(self, new: np.ndarray, members: list[int] | None = None) -> PairColumns:
        self._samples.add(self.pair_sample[new])
        return PairColumns(self, new)

    def admit(self, columns: PairColumns) -> None:
        """Nothing to keep: the samples' kernel rows were kept at the fetch."""

    def class_coefficients(self, index: list[int], alpha: np.ndarray) -> np.ndarray:
        """``β`` per stored sample slot, ``(s, K)``: ``β_jk = Σ_{p=(j,·)} α_p (d_p)_k``."""
        pairs = np.asarray(index, dtype=np.int64)
        beta = np.zeros((self.count, self.directions.shape[1]))
        np.add.at(beta, self.slot[self.pair_sample[pairs]], alpha[:, None] * self.directions[pairs])
        return beta

    def q_times(self, index: list[int], alpha: np.ndarray) -> np.ndarray:
        """``Q[:, F] α`` over all pairs: ``(f_{y_i}(x_i) − f_k(x_i)) / scale``."""
        beta = torch.from_numpy(self.class_coefficients(index, alpha))
        f = (torch.from_numpy(self.sample_rows).T @ beta).numpy()  # torch's own thread pool for the large product
        return (f[self.pair_sample, self.labels[self.pair_sample]] - f[self.pair_sample, self.pair_class]) / self.scale

    def keep(self, kept: np.ndarray, members: int) -> None:
        """Nothing to drop: a sample's kernel row stays for its other pairs."""
