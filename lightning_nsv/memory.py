"""Memory: what is available (:func:`available_memory_bytes`), refusing what does not fit (:func:`check_memory`),
and large arrays of the solvers, backed by base pages.

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
import os
import sys

import numpy as np
import torch

__all__ = ["available_memory_bytes", "base_page_empty", "check_memory"]

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


def available_memory_bytes() -> int | None:
    """Memory available to new allocations (``MemAvailable`` of ``/proc/meminfo``, else physical pages)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(nbytes: int, need: str, fix: str, device: torch.device = torch.device("cpu"),
                 limit: int | None = None, limit_name: str = "") -> None:
    """Refuse, before allocating it, ``nbytes`` above ``limit`` or above the memory available (on ``device`` for
    CUDA). ``need`` says what the bytes are for, ``fix`` what to do."""
    if limit is not None and nbytes > limit:
        raise ValueError(f"{need}, above {limit_name}={limit:,}; {fix} or raise {limit_name}")
    available = available_memory_bytes()
    if available is not None and nbytes > available:
        raise ValueError(f"{need}, more than the {available / 1e9:.1f} GB of memory available; {fix}")
    if device.type == "cuda":  # formed there; torch's allocator reuses what it holds unused
        unused = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        free = torch.cuda.mem_get_info(device)[0] + unused
        if nbytes > free:
            raise ValueError(f"{need}, more than the {free / 1e9:.1f} GB free on {device}; {fix}")
