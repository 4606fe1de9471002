"""Large arrays of the solvers, backed by base pages.

numpy advises the kernel to back arrays of 4 MiB and more with transparent huge pages (``madvise``). Where memory
is fragmented, as on shared virtual machines, the first touch of such an array then waits for the kernel to
compact memory: writing a fresh 208 MB array measured 0.15–2.0 s there against 0.04–0.09 s on base pages. The
solvers' kernel columns and factors are read in streams, which huge pages do not speed up, so their arrays ask for
base pages (``MADV_NOHUGEPAGE``, Linux; elsewhere, or where the call fails, numpy's default stays).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import sys

import numpy as np

__all__ = ["base_page_empty"]

MADV_NOHUGEPAGE = 15  # Linux <sys/mman.h>
# numpy's own threshold for its huge-page advice. Arrays below glibc's largest mmap threshold (32 MiB) may lie on
# the heap, whose pages then keep the advice after the array is freed (base pages for what is allocated there
# later: harmless); a threshold of 32 MiB measured 7–40% slower at m = 20,000 (stalls on the smaller arrays)
ADVISED_BYTES_MIN = 4 << 20


def _libc_madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        madvise = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


_MADVISE = _libc_madvise()


def base_page_empty(shape, dtype=np.float64) -> np.ndarray:
    """``np.empty(shape, dtype)`` (C order, owning its memory) whose untouched pages the kernel backs with base
    pages rather than transparent huge pages (see the module's note)."""
    array = np.empty(shape, dtype)
    if _MADVISE is not None and array.nbytes >= ADVISED_BYTES_MIN:
        page = mmap.PAGESIZE
        start = -(-array.ctypes.data // page) * page  # the whole pages inside the array
        stop = (array.ctypes.data + array.nbytes) // page * page
        if stop > start:
            _MADVISE(start, stop - start, MADV_NOHUGEPAGE)  # advice: a failure leaves numpy's default
    return array
