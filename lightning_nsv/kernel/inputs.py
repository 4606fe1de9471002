"""Training inputs as the path kernel reads them: in the analysis dtype, a chunk of rows at a time, without the
features that are zero in every sample; their input Gram rows and fingerprint."""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = ["INPUT_CHUNK_BYTES", "ZERO_FEATURES_SHARE", "analysis_inputs", "as_tensor_on", "random_projection",
           "used_features"]

INPUT_CHUNK_BYTES = 8 << 20  # rows of the training inputs converted to the analysis dtype at a time


class _InputChunks:
    """Rows ``lo:hi`` of ``x`` in ``dtype``: views when ``x`` has that dtype, else copies into one buffer that every
    chunk reuses (a fresh allocation per chunk costs its page faults). Use a chunk before asking for the next."""

    def __init__(self, x: Tensor, dtype: torch.dtype) -> None:
        self.x, self.dtype = x, dtype
        self.step = max(1, INPUT_CHUNK_BYTES // max(1, x.shape[1] * torch.empty((), dtype=dtype).element_size()))
        self._buffer: Tensor | None = None

    def ranges(self, start: int = 0, stop: int | None = None) -> list[slice]:
        stop = len(self.x) if stop is None else stop
        return [slice(lo, min(stop, lo + self.step)) for lo in range(start, stop, self.step)]

    def __call__(self, rows: slice) -> Tensor:
        if self.x.dtype == self.dtype:
            return self.x[rows]
        if self._buffer is None:
            self._buffer = torch.empty(self.step, self.x.shape[1], dtype=self.dtype, device=self.x.device)
        return self._buffer[:rows.stop - rows.start].copy_(self.x[rows])

    def concat(self, per_row) -> Tensor:
        """``per_row`` (a function of a chunk giving one value per row) over all rows, concatenated."""
        return torch.cat([per_row(self(rows)) for rows in self.ranges()]) if len(self.x) \
            else per_row(self.x[:0].to(self.dtype))


def analysis_inputs(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``x`` as the analysis keeps it: unchanged when its dtype is a narrower float (every value is exact in
    ``dtype``; the kernels convert it exactly, in chunks or, up to :data:`INPUT_COPY_BYTES`, one copy), else cast."""
    if x.is_floating_point() and torch.finfo(x.dtype).bits < torch.finfo(dtype).bits:
        return x
    return x.to(dtype)


# a copy of the inputs leaves out the features zero in every sample when they are at least this share of them
ZERO_FEATURES_SHARE = 0.02


def used_features(x: Tensor) -> Tensor:
    """``x`` (2-d) without the features that are zero in every sample, when they are at least
    :data:`ZERO_FEATURES_SHARE` of them (a new tensor), else ``x`` itself: every inner product between samples is
    the same."""
    used = (x.amax(0) != 0) | (x.amin(0) != 0)  # a third of the time of (x != 0).any(0)
    kept = int(used.sum())
    if kept == 0 or kept > (1.0 - ZERO_FEATURES_SHARE) * x.shape[1]:
        return x
    return x.index_select(1, torch.nonzero(used)[:, 0])


def _input_gram_rows(chunks: _InputChunks, idx: Tensor) -> Tensor:
    """``(X Xᵀ)[idx, :]`` in the dtype of ``chunks``."""
    left = chunks.x[idx].to(chunks.dtype)
    if chunks.x.dtype == chunks.dtype:
        return left @ chunks.x.T
    out = torch.empty(len(idx), len(chunks.x), dtype=chunks.dtype, device=chunks.x.device)
    for rows in chunks.ranges():
        torch.mm(left, chunks(rows).T, out=out[:, rows])
    return out


def random_projection(a: Tensor, generator: torch.Generator) -> Tensor:
    """``a r`` in float64 for a Gaussian ``r`` drawn from ``generator``: a fingerprint of the rows of ``a``."""
    r = torch.randn(a.shape[1], generator=generator, dtype=torch.float64).to(a.device)
    return _InputChunks(a, torch.float64).concat(lambda chunk: chunk @ r)



def as_tensor_on(values, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Indices or labels given as a tensor (on any device), an array or a list, as a tensor on ``device``."""
    return torch.as_tensor(values if isinstance(values, Tensor) else np.asarray(values), dtype=dtype, device=device)

