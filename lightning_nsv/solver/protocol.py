"""The one interface between who computes kernel columns and the max-margin solver (DESIGN.md §4).

The solver sees a kernel ``K`` (``m×m``, symmetric, positive semi-definite) only through :class:`KernelColumns`, as
LIBSVM's ``Solver`` sees only a ``QMatrix``: it asks for signed, scaled columns of ``Q = (s sᵀ ∘ K) / scale`` (``s``
the labels in ±1, ``scale`` the kernel's normalisation) and never asks who provides them. Providers declare that
they implement it by subclassing (or :meth:`KernelColumns.register`); the kernel side's
:class:`~lightning_nsv.kernel.PathKernelColumns` and :class:`~lightning_nsv.kernel.ShardedKernelColumns` do.
What :func:`~lightning_nsv.solver.max_margin` accepts besides a provider (a dense matrix, a function of column
indices) is wrapped once, at the facade, by :func:`as_kernel_columns` into one of the adapters below. Beneath it the
solver's free set reads ``Q`` through the column store's protocol, :mod:`lightning_nsv.solver.store_protocol`.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable

import numpy as np
import torch

__all__ = ["CallableColumns", "DenseColumns", "DenseTensorColumns", "KernelColumns", "as_kernel_columns",
           "finite_columns", "signed", "signed_rows"]

ColumnFunction = Callable[[np.ndarray], "np.ndarray | torch.Tensor"]


class KernelColumns(ABC):
    """Columns of a kernel ``K`` on ``m`` samples, computed on demand; what the max-margin solver reads.

    Indices ``idx`` are int64 arrays of sample indices (possibly repeated), ``signs`` a float64 array of ±1 of
    length ``m``, ``scale`` a positive float. A provider must implement :meth:`__len__`, :attr:`dtype`,
    :attr:`device`, :meth:`diagonal` and :meth:`columns`; the signed methods have generic defaults built on
    :meth:`columns` that a provider overrides where it can do better (sign and scale while it forms the columns,
    hand over tensors on its device, form ``Q[idx, idx]`` without full columns).

    Memory contract of :meth:`signed_columns`: the array returned belongs to the caller. The solver's column store
    keeps it as a block of ``Q[:, F]`` for as long as it needs and, when it is the transpose of a C-ordered array
    that owns its memory (``rows.T`` with ``rows.flags.owndata``: e.g. ``base_page_empty((b, m)).T``), compacts it
    in place (moves the live columns to the front and shrinks the memory with ``realloc``). So the provider must not
    keep that array, nor a view of it, nor return a view of memory it keeps (a cache's rows): any other layout is
    copied before it is changed, and the store never writes into an array it did not get this way. The tensor of
    :meth:`signed_rows` is kept too (its transpose, moved to the solver's device in float64: no copy when it is there
    already), so it must be one the provider does not write to again.

    Entries are taken as finite: the solver checks only the diagonal (a Gram matrix has ``|K_ij| <= √(K_ii K_jj)``);
    the generic defaults and the adapters check every entry and name the first non-finite sample.
    """

    #: whether :meth:`signed_block` forms ``Q[idx, idx]`` at less cost than full columns (then the numpy solver
    #: admits candidates from it and forms full columns only for those still free when the margins are next needed)
    offers_block: bool = False

    @abstractmethod
    def __len__(self) -> int:
        """``m``, the number of samples (rows of every column)."""

    @property
    @abstractmethod
    def dtype(self) -> torch.dtype:
        """The precision the kernel's entries are computed in. Only float64 columns are admitted lazily from
        :meth:`signed_block`: a block rounded apart from the columns (float32: by 1e-7) would pass a duplicate
        sample for an independent one."""

    @property
    @abstractmethod
    def device(self) -> torch.device:
        """Where :meth:`signed_rows` returns its tensors."""

    @abstractmethod
    def diagonal(self) -> np.ndarray:
        """``diag(K)`` as a float64 array of shape ``(m,)``."""

    @abstractmethod
    def columns(self, idx: np.ndarray) -> np.ndarray:
        """``K[:, idx]``, unsigned and unscaled, as float64 of shape ``(m, len(idx))`` (any memory order): what the
        multi-class pair store and the intercept protocol read."""

    def signed_columns(self, idx: np.ndarray, signs: np.ndarray, scale: float) -> np.ndarray:
        """``Q[:, idx] = (s sᵀ ∘ K)[:, idx] / scale`` as float64 numpy of shape ``(m, len(idx))`` in Fortran order,
        owned by the caller (see the memory contract). Default: :meth:`columns`, checked finite, signed and scaled
        into a new array."""
        return signed(self.columns(idx), signs, idx, scale)

    def signed_block(self, idx: np.ndarray, signs: np.ndarray, scale: float) -> np.ndarray:
        """``Q[idx, idx]``, float64 numpy ``(len(idx), len(idx))``; asked for only when :attr:`offers_block`."""
        raise NotImplementedError(f"{type(self).__name__} offers no signed_block (offers_block is False)")

    def signed_rows(self, idx: np.ndarray, signs: np.ndarray, scale: float) -> torch.Tensor:
        """``Q[:, idx]ᵀ``, shape ``(len(idx), m)``, a float tensor on :attr:`device`: what the torch solver reads (it
        moves the rows to its device in float64). Default: :meth:`signed_columns`, transposed, without a copy."""
        return torch.from_numpy(self.signed_columns(idx, signs, scale)).T


def signed(cols, signs: np.ndarray, idx: np.ndarray, scale: float) -> np.ndarray:
    """``(s sᵀ ∘ cols) / scale`` for ``cols = K[:, idx]``, checked finite, into a new Fortran-ordered array."""
    out = np.multiply(finite_columns(cols), signs[:, None], order="F")  # the provider's array stays
    out *= (signs[idx] / scale)[None, :]
    return out


def finite_columns(cols) -> np.ndarray:
    """``cols`` as float64 numpy; raises, naming the first sample, when an entry is NaN or inf."""
    cols = np.asarray(cols, dtype=np.float64)
    if not np.all(np.isfinite(cols)):
        bad = np.flatnonzero(~np.all(np.isfinite(cols), axis=1))
        raise ValueError(f"kernel columns hold NaN or inf in row {bad[0]} ({len(bad)} rows in all): sample "
                         f"{bad[0]} has non-finite values (check the inputs and the network)")
    return cols


class _GivenDiagonal(KernelColumns):
    """An adapter whose diagonal was given or read once."""

    def __init__(self, diag: np.ndarray) -> None:
        self._diag = diag

    def __len__(self) -> int:
        return self._diag.shape[0]

    def diagonal(self) -> np.ndarray:
        return self._diag


class DenseColumns(_GivenDiagonal):
    """A dense float64 numpy kernel; the solver reads its rows, which are contiguous, as its columns (``K``
    symmetric)."""

    def __init__(self, dense: np.ndarray) -> None:
        super().__init__(np.diag(dense).copy())
        self.dense = dense

    dtype = property(lambda self: torch.float64, doc="float64")
    device = property(lambda self: torch.device("cpu"), doc="the CPU")

    def columns(self, idx: np.ndarray) -> np.ndarray:
        return self.dense[:, idx]

    def signed_columns(self, idx: np.ndarray, signs: np.ndarray, scale: float) -> np.ndarray:
        return signed(self.dense[idx].T, signs, idx, scale)


class DenseTensorColumns(_GivenDiagonal):
    """A dense float64 tensor kernel for the torch solver, read a block of rows at a time on its own device."""

    def __init__(self, dense: torch.Tensor) -> None:
        super().__init__(torch.diagonal(dense).cpu().numpy().copy())
        self.dense = dense

    dtype = property(lambda self: torch.float64, doc="float64")
    device = property(lambda self: self.dense.device, doc="the tensor's device")

    def columns(self, idx: np.ndarray) -> np.ndarray:
        return self.dense[:, torch.as_tensor(np.asarray(idx), dtype=torch.long, device=self.device)].cpu().numpy()

    def signed_rows(self, idx: np.ndarray, signs: np.ndarray, scale: float) -> torch.Tensor:
        rows = torch.as_tensor(np.asarray(idx), dtype=torch.long, device=self.device)
        return signed_rows(self.dense[rows].T, signs, idx, scale)


class CallableColumns(_GivenDiagonal):
    """A function ``idx -> K[:, idx]`` (numpy or a tensor) with the kernel's diagonal given beside it."""

    def __init__(self, function: ColumnFunction, diag: np.ndarray) -> None:
        super().__init__(diag)
        self.function = function

    dtype = property(lambda self: torch.float64, doc="taken as float64")
    device = property(lambda self: torch.device("cpu"), doc="the CPU (tensors on another device stay there)")

    def columns(self, idx: np.ndarray) -> np.ndarray:
        return self.function(idx)

    def signed_rows(self, idx: np.ndarray, signs: np.ndarray, scale: float) -> torch.Tensor:
        cols = self.function(idx)
        cols = cols if isinstance(cols, torch.Tensor) else torch.from_numpy(finite_columns(cols))
        return signed_rows(cols.to(torch.float64), signs, idx, scale)


def signed_rows(cols: torch.Tensor, signs: np.ndarray, idx: np.ndarray, scale: float) -> torch.Tensor:
    """``(s sᵀ ∘ cols) / scale`` transposed, for float64 columns ``cols = K[:, idx]`` on any device; raises, naming
    the sample, on a non-finite entry."""
    if not bool(torch.isfinite(cols).all()):
        finite_columns(cols.cpu().numpy())  # raises, naming the sample
    labels = torch.from_numpy(signs).to(cols.device)
    column_labels = labels[torch.as_tensor(np.asarray(idx), dtype=torch.long, device=cols.device)]
    return (cols * labels[:, None] * (column_labels / scale)[None, :]).T


def as_kernel_columns(kernel, kernel_diag: np.ndarray | None = None, *,
                      tensor: bool = False) -> tuple[KernelColumns, np.ndarray]:
    """The facade's one wrapping of what :func:`~lightning_nsv.solver.max_margin` accepts, with ``diag(K)``: a
    :class:`KernelColumns` as it is (``kernel_diag``, when given, instead of its :meth:`~KernelColumns.diagonal`); a
    function of column indices with ``kernel_diag`` (required); a dense square matrix (numpy, or a tensor moved to
    the CPU), or with ``tensor`` a dense matrix kept as a float64 tensor on its device (numpy shared, not copied) for
    the torch solver. This is the only place that looks at what kind of object ``kernel`` is."""
    if isinstance(kernel, KernelColumns):
        return kernel, kernel.diagonal() if kernel_diag is None else np.asarray(kernel_diag, dtype=np.float64)
    if callable(kernel):
        if kernel_diag is None:
            raise ValueError("kernel_diag is required when kernel is a function of column indices")
        columns = CallableColumns(kernel, np.asarray(kernel_diag, dtype=np.float64))
        return columns, columns.diagonal()
    on_device = tensor and isinstance(kernel, torch.Tensor)
    dense = kernel.detach() if on_device else (
        kernel.detach().cpu().numpy() if isinstance(kernel, torch.Tensor) else np.asarray(kernel))
    if dense.ndim != 2 or dense.shape[0] != dense.shape[1]:
        raise ValueError(f"Precomputed kernel must be a square matrix. Input is a {tuple(dense.shape)} matrix.")
    if on_device:
        columns = DenseTensorColumns(dense.to(torch.float64))
    else:
        dense = dense.astype(np.float64, copy=False)
        columns = DenseTensorColumns(torch.from_numpy(dense)) if tensor else DenseColumns(dense)
    return columns, columns.diagonal()
