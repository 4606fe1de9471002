"""Runners of a :class:`~lightning_nsv.kernel.pair_program.PairProgram` on lists of pairs ``(i[k], j[k])``.

- :func:`numba_outer`, :func:`numba_pairs`: compiled (numba): every pair runs the whole program in a scratch array
  of its thread (a few float64 maps: the data of one pair stays in the core's cache from the first layer to the
  last); no Python per pair; threads (a pool of the process, as many as torch uses) take bands of rows and
  release the GIL. CPU only.
- :func:`torch_pairs`: the same instructions as torch operations over a batch of pairs, on any device (a GPU's
  formulation, and the reference the compiled runner is tested against).

Both read the samples' factors (:class:`~lightning_nsv.kernel.pair_factors.SampleFactors`) by row.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from torch import Tensor

from lightning_nsv.kernel.pair_factors import SampleFactors
from lightning_nsv.kernel.pair_checks import check_factors, check_indices, index_arrays
from lightning_nsv.validate import check_threads
from lightning_nsv.kernel.pair_code import (ADD, ADD_SCALAR, AXPY, BOX, CONST, GATHER, OVERLAP_DENSE, OVERLAP_TERMS,
                                            SCALE, SPMV, SUM, PairProgram)

__all__ = ["NO_NUMBA", "numba_available", "numba_outer", "numba_pairs", "numba_turned_off", "torch_pairs"]

try:  # numba is a dependency; a platform without its wheels runs the torch formulation
    import numba
    from numba import njit, types
    from numba.extending import intrinsic
except ImportError:  # pragma: no cover - exercised only where numba is missing
    numba = None


NO_NUMBA = "LIGHTNING_NSV_NO_NUMBA"  # set to 1 (or true, yes, on): the compiled runner is not used
_UNSET = ("", "0", "false", "no", "off")


def numba_turned_off() -> bool:
    """Whether :data:`NO_NUMBA` turns the compiled runner off (``1``, ``true``, ``yes``, ``on``; not ``0``,
    ``false``, ``no``, ``off`` or empty)."""
    return os.environ.get(NO_NUMBA, "").strip().lower() not in _UNSET


def numba_available() -> bool:
    """Whether numba imports and :data:`NO_NUMBA` does not turn it off."""
    return numba is not None and not numba_turned_off()


if numba is not None:
    @intrinsic
    def _popcount(typingctx, word):
        """LLVM's ``ctpop`` (the CPU's population count, vectorised where the CPU has one)."""
        if not isinstance(word, types.Integer):
            return None

        def codegen(context, builder, signature, args):
            return builder.ctpop(args[0])
        return word(word), codegen

    @njit(cache=True, boundscheck=False, nogil=True, inline='always')
    def _overlap(d, s, s0, n, value, fresh, is_bits, a_row, b_row, off, count, temp):
        """``d (=|+=) value · S · Σ A_i A_j`` over the words (``is_bits``) or channels of one factor of the rows
        ``a_row``, ``b_row`` (``S`` the register at ``s0``, 1 where ``s0 < 0``; views keep the loops
        vectorisable)."""
        if is_bits and count == 1 and s0 >= 0:  # the common case in one pass
            a, b, m = a_row[off:off + n], b_row[off:off + n], s[s0:s0 + n]
            if fresh:
                for p in range(n):
                    d[p] = value * m[p] * _popcount(a[p] & b[p])
            else:
                for p in range(n):
                    d[p] += value * m[p] * _popcount(a[p] & b[p])
            return
        if not is_bits and s0 < 0 and fresh:  # an input's overlap, straight into its register
            a, b = a_row[off:off + n], b_row[off:off + n]
            for p in range(n):
                d[p] = np.float64(a[p]) * np.float64(b[p])
            for c in range(1, count):
                a, b = a_row[off + c * n:off + (c + 1) * n], b_row[off + c * n:off + (c + 1) * n]
                for p in range(n):
                    d[p] += np.float64(a[p]) * np.float64(b[p])
            if value != 1.0:
                for p in range(n):
                    d[p] *= value
            return
        t = temp[:n]
        t[:] = 0.0
        for c in range(count):
            a, b = a_row[off + c * n:off + (c + 1) * n], b_row[off + c * n:off + (c + 1) * n]
            if is_bits:
                for p in range(n):
                    t[p] += _popcount(a[p] & b[p])
            else:
                for p in range(n):
                    t[p] += np.float64(a[p]) * np.float64(b[p])
        if s0 >= 0:
            m = s[s0:s0 + n]
            if fresh:
                for p in range(n):
                    d[p] = value * m[p] * t[p]
            else:
                for p in range(n):
                    d[p] += value * m[p] * t[p]
        elif fresh:
            for p in range(n):
                d[p] = value * t[p]
        else:
            for p in range(n):
                d[p] += value * t[p]

    @njit(cache=True, boundscheck=False, nogil=True, inline='always')
    def _taps(out, src, first, step, size, value):
        """``out[q] = value + Σ_t src[first + t·step + q]`` in one pass (the common tap counts unrolled)."""
        n = len(out)
        if size == 3:
            a, b, c = src[first:first + n], src[first + step:first + step + n], \
                src[first + 2 * step:first + 2 * step + n]
            for q in range(n):
                out[q] = a[q] + b[q] + c[q] + value
        elif size == 2:
            a, b = src[first:first + n], src[first + step:first + step + n]
            for q in range(n):
                out[q] = a[q] + b[q] + value
        else:
            a = src[first:first + n]
            for q in range(n):
                out[q] = a[q] + value
            for t in range(1, size):
                a = src[first + t * step:first + t * step + n]
                for q in range(n):
                    out[q] += a[q]

    @njit(cache=True, boundscheck=False, nogil=True, inline='always')
    def _box(code, k, s, value):
        """Window sums along the middle axis of ``(outer, n_in, inner)``, zero padding, plus ``value``. Stride 1:
        the outputs whose taps all fall inside in one pass over all of their ``inner`` values (along a last axis,
        over the whole flattened map), then the outputs near the ends (or, along a last axis, near each row's
        ends, where a flat tap would read the next row) summed from the taps that fall inside."""
        dst, s0 = code[k, 1], code[k, 2]
        outer, n_in, inner, n_out = code[k, 4], code[k, 5], code[k, 6], code[k, 7]
        size, stride, dilation, left = code[k, 8], code[k, 9], code[k, 10], code[k, 11]
        d, src = s[dst:dst + outer * n_out * inner], s[s0:s0 + outer * n_in * inner]
        span = (size - 1) * dilation
        if stride == 1 and inner == 1 and n_out == n_in:
            lo, hi = left, n_in - span + left  # within a row: outputs whose taps all fall inside it
            flat_hi = outer * n_in - span + left
            if flat_hi > lo:
                _taps(d[lo:flat_hi], src, 0, dilation, size, value)
            rows, step = outer, n_in
            lo = min(max(lo, 0), n_in)
            hi = max(min(hi, n_in), lo)
        else:
            rows, step = 1, 0
            lo, hi = 0, 0
            for o in range(outer):
                if stride == 1:
                    # outputs i in [lo, hi) read inputs i + t·dilation - left, all inside
                    lo, hi = min(left, n_out), max(min(n_out, n_in - span + left), min(left, n_out))
                    if hi > lo:
                        _taps(d[(o * n_out + lo) * inner:(o * n_out + hi) * inner], src,
                              (o * n_in + lo - left) * inner, dilation * inner, size, value)
                for i in range(n_out):
                    if lo <= i < hi:
                        continue
                    out = d[(o * n_out + i) * inner:(o * n_out + i + 1) * inner]
                    out[:] = value
                    for t in range(size):
                        j = i * stride + t * dilation - left
                        if 0 <= j < n_in:
                            a = src[(o * n_in + j) * inner:(o * n_in + j + 1) * inner]
                            for q in range(inner):
                                out[q] += a[q]
            return
        if size == 3 and dilation == 1 and left == 1 and lo == 1 and hi == n_in - 1:  # 'same' 3-tap rows
            for r in range(rows):
                base = r * step
                d[base] = src[base] + src[base + 1] + value
                d[base + n_in - 1] = src[base + n_in - 2] + src[base + n_in - 1] + value
            return
        for r in range(rows):  # a last axis: each row's outputs near its ends
            base = r * step
            for i in range(lo + n_in - hi):
                i = i if i < lo else hi + i - lo
                acc = value
                for t in range(size):
                    j = i + t * dilation - left
                    if 0 <= j < n_in:
                        acc += src[base + j]
                d[base + i] = acc

    @njit(cache=True, boundscheck=False, nogil=True)
    def _run(code, values, table, slots, weights, bits_i, bits_j, dense_i, dense_j, s, temp):
        """One pair: every instruction on the scratch array ``s`` (see the opcodes in ``pair_program``)."""
        for k in range(code.shape[0]):
            op, dst, s0, s1, n = code[k, 0], code[k, 1], code[k, 2], code[k, 3], code[k, 4]
            value = values[k]
            if op == OVERLAP_TERMS:  # every mask term of a channel sum, (s0, offset, words) a term in the table
                d, fresh, base = s[dst:dst + n], code[k, 7] == 0, code[k, 6]
                for t in range(code[k, 5]):
                    _overlap(d, s, table[base + 3 * t], n, weights[base + 3 * t], fresh and t == 0, True, bits_i,
                             bits_j, table[base + 3 * t + 1], table[base + 3 * t + 2], temp)
            elif op == OVERLAP_DENSE:
                _overlap(s[dst:dst + n], s, s0, n, value, code[k, 5] == 0, False, dense_i, dense_j, code[k, 6],
                         code[k, 7], temp)
            elif op == BOX:
                _box(code, k, s, value)
            elif op == AXPY:
                d = s[dst:dst + n]
                if code[k, 5] == 0:
                    d[:] = 0.0
                if s0 >= 0:
                    m = s[s0:s0 + n]
                    for p in range(n):
                        d[p] += value * m[p]
                else:
                    for p in range(n):
                        d[p] += value
            elif op == ADD_SCALAR or op == SCALE:
                d, m = s[dst:dst + n], s[s0:s0 + n]
                if op == ADD_SCALAR:
                    for p in range(n):
                        d[p] = m[p] + value
                else:
                    for p in range(n):
                        d[p] = value * m[p]
            elif op == ADD:
                d, a, b = s[dst:dst + n], s[s0:s0 + n], s[s1:s1 + n]
                for p in range(n):
                    d[p] = a[p] + b[p]
            elif op == GATHER:  # unsigned scratch offsets: no wrap-around check, a vector gather
                d, idx = s[dst:dst + n], slots[code[k, 5]:code[k, 5] + n]
                for q in range(n):
                    d[q] = s[idx[q]]
            elif op == SPMV:
                ptr = code[k, 5]
                for o in range(n):
                    total = 0.0
                    for e in range(table[ptr + o], table[ptr + o + 1]):
                        total += weights[e] * s[slots[e]]
                    s[dst + o] = total
            elif op == SUM:
                total = 0.0
                for p in range(n):
                    total += s[s0 + p]
                s[dst] = value * total
            elif op == CONST:
                s[dst:dst + n] = weights[code[k, 5]:code[k, 5] + n]

    @njit(cache=True, boundscheck=False, nogil=True)
    def _run_pairs(code, values, table, slots, weights, scratch, temp_at, out_at, bits, dense, first, second, out):
        s = np.zeros(scratch)
        temp = s[temp_at:]
        for k in range(len(first)):
            i, j = first[k], second[k]
            _run(code, values, table, slots, weights, bits[i], bits[j], dense[i], dense[j], s, temp)
            out[k] = s[out_at]

    @njit(cache=True, boundscheck=False, nogil=True)
    def _run_outer(code, values, table, slots, weights, scratch, temp_at, out_at, bits, dense, rows, cols, out, side):
        """Every pair ``(rows[a], cols[b])`` into ``out[a, b]``, in blocks of ``side × side`` pairs (the factors of
        a block's samples stay in the core's cache while its pairs run)."""
        s = np.zeros(scratch)
        temp = s[temp_at:]
        for top in range(0, len(rows), side):
            for left in range(0, len(cols), side):
                for a in range(top, min(len(rows), top + side)):
                    i = rows[a]
                    for b in range(left, min(len(cols), left + side)):
                        j = cols[b]
                        _run(code, values, table, slots, weights, bits[i], bits[j], dense[i], dense[j], s, temp)
                        out[a, b] = s[out_at]


_POOL: list = []  # one thread pool of the process, grown to the threads asked for


def _parallel(work, parts: list) -> None:
    """``work(part)`` for every part on threads of their own (the runner releases the GIL)."""
    if len(parts) == 1:
        work(parts[0])
        return
    if not _POOL or _POOL[0]._max_workers < len(parts):
        if _POOL:
            _POOL.pop().shutdown(wait=False)
        _POOL.append(ThreadPoolExecutor(max_workers=len(parts), thread_name_prefix="lightning-nsv-pairs"))
    for future in [_POOL[0].submit(work, part) for part in parts]:
        future.result()


def _program_args(program: PairProgram, factors: SampleFactors) -> tuple:
    check_factors(program, factors.bits, factors.dense)  # the runner reads rows at the program's offsets, unchecked
    return (program.code, program.values, program.table, program.table.view(np.uint64), program.weights,
            program.scratch, program.scratch - program.temp, program.out, factors.bits, factors.dense)


def _threads(threads: int | None, work: int) -> int:
    check_threads(threads)
    return max(1, min(work, threads or torch.get_num_threads()))


def numba_pairs(program: PairProgram, factors: SampleFactors, first: np.ndarray, second: np.ndarray,
                threads: int | None = None) -> np.ndarray:
    """``K(x_first[k], x_second[k])`` for every ``k`` (int64 numpy indices into the factors' rows), float64 numpy,
    by the compiled runner on ``threads`` threads (default: torch's). Indices outside the factors' rows, or
    ``first`` and ``second`` of two lengths, are refused (:mod:`~lightning_nsv.kernel.pair_checks`)."""
    args = _program_args(program, factors)
    first, second = index_arrays(len(factors.bits), True, first=first, second=second)
    out = np.empty(len(first), dtype=np.float64)
    bounds = np.linspace(0, len(first), _threads(threads, len(first)) + 1).astype(np.int64)
    _parallel(lambda k: _run_pairs(*args, first[bounds[k]:bounds[k + 1]], second[bounds[k]:bounds[k + 1]],
                                   out[bounds[k]:bounds[k + 1]]), list(range(len(bounds) - 1)))
    return out


BLOCK_SIDE = 8  # samples a side of a block of pairs: 16 samples' factors (37 KiB each for SmallResNet(16)) in L2
THREADED_PAIRS = 128  # a tile of fewer pairs runs on one thread (15 × 15 pairs of SmallResNet(16): 7.2 µs a pair on
# one thread, 4.6 on two; a tile of one block has nothing to share)


def numba_outer(program: PairProgram, factors: SampleFactors, rows: np.ndarray, cols: np.ndarray,
                threads: int | None = None) -> np.ndarray:
    """``K(x_rows[a], x_cols[b])`` as float64 numpy ``(len(rows), len(cols))`` by the compiled runner; threads take
    bands of rows, or of columns where there are more blocks of those; a tile of fewer than
    :data:`THREADED_PAIRS` pairs runs on the calling thread (the pool's hand-over would cost more)."""
    args = _program_args(program, factors)
    rows, cols = index_arrays(len(factors.bits), False, rows=rows, cols=cols)
    check_threads(threads)  # (a small tile runs on the calling thread: checked all the same)
    out = np.empty((len(rows), len(cols)), dtype=np.float64)
    by_rows = len(rows) >= len(cols)
    blocks = -(-(len(rows) if by_rows else len(cols)) // BLOCK_SIDE)
    parts = _threads(threads, blocks) if out.size >= THREADED_PAIRS else 1
    bounds = BLOCK_SIDE * np.linspace(0, blocks, parts + 1).astype(np.int64)
    if by_rows:
        work = lambda k: _run_outer(*args, rows[bounds[k]:bounds[k + 1]], cols, out[bounds[k]:bounds[k + 1]],  # noqa
                                    BLOCK_SIDE)
    else:
        work = lambda k: _run_outer(*args, rows, cols[bounds[k]:bounds[k + 1]], out[:, bounds[k]:bounds[k + 1]],  # noqa
                                    BLOCK_SIDE)
    _parallel(work, list(range(parts)))
    return out


_POPCOUNT: dict[torch.device, Tensor] = {}


def _popcount_bytes(words: Tensor) -> Tensor:
    """Set bits of each word (any integer width), int64, by a byte table."""
    device = words.device
    if device not in _POPCOUNT:
        _POPCOUNT[device] = torch.tensor([bin(v).count("1") for v in range(256)], dtype=torch.int64, device=device)
    as_bytes = words.contiguous().view(torch.uint8).reshape(*words.shape, words.element_size())
    return _POPCOUNT[device][as_bytes.long()].sum(-1)


def torch_pairs(program: PairProgram, bits: Tensor, dense: Tensor, first: Tensor, second: Tensor) -> Tensor:
    """The same as :func:`numba_pairs` by torch operations over all the pairs at once (``bits`` and ``dense`` from
    :meth:`SampleFactors.tensors`, indices on their device), float64 on that device."""
    device = dense.device
    check_factors(program, bits, dense)
    check_indices(len(dense), True, first=first, second=second)
    s = torch.zeros(len(first), program.scratch, dtype=torch.float64, device=device)
    table = torch.as_tensor(program.table, device=device)
    weights = torch.as_tensor(program.weights, device=device)
    reg = lambda at, n: s[:, at:at + n]  # noqa: E731
    for row, value in zip(program.code.tolist(), program.values.tolist()):
        op, dst, s0, s1 = row[:4]
        if op == OVERLAP_TERMS:
            n, terms, base, acc = row[4:8]
            for t in range(terms):
                s0, off, count = (int(v) for v in program.table[base + 3 * t:base + 3 * t + 3])
                a, b = bits[first, off:off + count * n], bits[second, off:off + count * n]
                overlap = _popcount_bytes(a & b).view(len(first), count, n).sum(1).to(torch.float64)
                term = float(program.weights[base + 3 * t]) * overlap * (reg(s0, n) if s0 >= 0 else 1.0)
                reg(dst, n).copy_(reg(dst, n) + term if acc or t else term)
        elif op == OVERLAP_DENSE:
            n, acc, off, count = row[4:8]
            a, b = (dense[k, off:off + count * n].to(torch.float64) for k in (first, second))
            term = value * (a * b).view(len(first), count, n).sum(1) * (reg(s0, n) if s0 >= 0 else 1.0)
            reg(dst, n).copy_(reg(dst, n) + term if acc else term)
        elif op == AXPY:
            n, acc = row[4:6]
            term = value * reg(s0, n) if s0 >= 0 else torch.full_like(reg(dst, n), value)
            reg(dst, n).copy_(reg(dst, n) + term if acc else term)
        elif op == ADD_SCALAR:
            reg(dst, row[4]).copy_(reg(s0, row[4]) + value)
        elif op == SCALE:
            reg(dst, row[4]).copy_(value * reg(s0, row[4]))
        elif op == ADD:
            reg(dst, row[4]).copy_(reg(s0, row[4]) + reg(s1, row[4]))
        elif op == BOX:
            reg(dst, row[4] * row[7] * row[6]).copy_(_box_torch(reg(s0, row[4] * row[5] * row[6]), *row[4:12]) + value)
        elif op == GATHER:
            reg(dst, row[4]).copy_(s.index_select(1, table[row[5]:row[5] + row[4]]))
        elif op == SPMV:
            n, ptr = row[4:6]
            bounds = program.table[ptr:ptr + n + 1]
            entries = torch.arange(int(bounds[0]), int(bounds[-1]), device=device)
            rows = torch.repeat_interleave(torch.arange(n, device=device),
                                           torch.as_tensor(np.diff(bounds), device=device))
            products = s.index_select(1, table[entries]) * weights[entries]
            reg(dst, n).copy_(torch.zeros(len(first), n, dtype=torch.float64, device=device).index_add_(
                1, rows, products))
        elif op == SUM:
            reg(dst, 1).copy_(value * reg(s0, row[4]).sum(1, keepdim=True))
        elif op == CONST:
            reg(dst, row[4]).copy_(weights[row[5]:row[5] + row[4]].expand(len(first), row[4]))
    return s[:, program.out].clone()


def _box_torch(v: Tensor, outer: int, n_in: int, inner: int, n_out: int, size: int, stride: int, dilation: int,
         left: int) -> Tensor:
    """Window sums along the middle axis of ``v`` viewed ``(B, outer, n_in, inner)``, zero padding."""
    v = v.reshape(len(v), outer, n_in, inner)
    need = (n_out - 1) * stride + dilation * (size - 1) + 1
    padded = torch.nn.functional.pad(v, (0, 0, left, max(0, need - n_in - left)))
    total = None
    for t in range(size):
        part = padded[:, :, t * dilation:t * dilation + (n_out - 1) * stride + 1:stride]
        total = part.clone() if total is None else total.add_(part)
    return total.reshape(len(v), -1)
