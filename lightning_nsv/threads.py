"""Thread pools of the solvers.

torch (OpenMP) and numpy/scipy (OpenBLAS) each start a pool on every core. Inside the active-set solver the
BLAS calls are small (triangular solves and Cholesky factors of a few hundred rows) and slow down by orders of
magnitude when the two pools fight for the cores; the large products stay in torch, on its own pool.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from threadpoolctl import threadpool_limits

__all__ = ["single_threaded_blas"]


@contextlib.contextmanager
def single_threaded_blas(torch_threads: int | None = None) -> Iterator[None]:
    """numpy/scipy BLAS and LAPACK on one thread inside the block. torch's threads are left alone, or, with
    ``torch_threads``, set to that many and restored on exit (Ψ's spectrum: torch's pool does the products)."""
    saved = torch.get_num_threads()
    try:
        if torch_threads:
            torch.set_num_threads(torch_threads)
        with threadpool_limits(limits=1, user_api="blas"):
            yield
    finally:
        if torch_threads:
            torch.set_num_threads(saved)
