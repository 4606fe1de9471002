"""The column provider of the factorised MLP path kernel (DESIGN.md §1): the solver's
:class:`~lightning_nsv.solver.protocol.KernelColumns` for a :class:`~lightning_nsv.kernel.network.PathNetwork`."""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from lightning_nsv.kernel.formulas import _combine, path_kernel_diagonal
from lightning_nsv.kernel.gram_cache import InputGramCache, gather_rows, whole_block
from lightning_nsv.kernel.inputs import _InputChunks, analysis_inputs, as_tensor_on, used_features
from lightning_nsv.memory import base_page_empty
from lightning_nsv.solver.protocol import KernelColumns

__all__ = ["INPUT_COPY_BYTES", "PathKernelColumns"]

# kernel columns hold one converted copy of narrower inputs up to this size (a conversion per block of columns cost
# about 8% of an analysis at m = 20,000); larger training sets are converted a chunk at a time, for memory
INPUT_COPY_BYTES = 256 << 20


class PathKernelColumns(KernelColumns):
    """Columns ``K[:, idx]`` of the path kernel of one training set, computed on demand: the solver's
    :class:`~lightning_nsv.solver.protocol.KernelColumns` (signed columns and blocks, rows on the device of ``x``).

    The slope Gram matrices come from one product of 0/1 indicators per layer in float32: with ``P_l`` the
    indicator of ``z >= 0`` (slope ``gamma``) and ``c_l`` its row sums,
    ``G_l = (gamma − beta)² P_l P_lᵀ + beta(gamma − beta)(c_l,i + c_l,j) + beta² Ω_l``; the counts ``P_l P_lᵀ``
    are integers ``<= Ω_l`` and exact in float32 below ``2**24``, so ``G_l`` is exact up to float64 rounding.
    The input Gram ``X Xᵀ[:, idx]`` is computed in the analysis dtype ``dtype`` (default that of ``x``); inputs of
    a narrower float dtype are converted once when the copy takes at most :data:`INPUT_COPY_BYTES` (the copy leaves
    out features that are zero in every sample, :func:`used_features`), else they stay as given and are converted
    a chunk of rows at a time (exact either way). An :class:`InputGramCache` keeps its rows between analyses of the
    same inputs.
    Each block of columns is formed a chunk of samples at a time (the products of a chunk stay in cache), with one
    conversion buffer per instance: do not call one instance from several threads at once. Everything runs on the
    device of ``x``.

    Cost per call: ``O(m·b·(f + Σ Ω_l))`` for ``b`` columns; memory ``O(m·b)`` plus ``x`` and the indicators.
    """

    def __init__(self, x: Tensor, layer_slopes: Sequence[Tensor], betas: Sequence[float],
                 gammas: Sequence[float], *, bias: bool = False,
                 input_gram_cache: InputGramCache | None = None, dtype: torch.dtype | None = None) -> None:
        if not len(layer_slopes) == len(betas) == len(gammas):
            raise ValueError(f"need slopes, betas and gammas per hidden layer, got {len(layer_slopes)}, "
                             f"{len(betas)} and {len(gammas)}")
        widest = max((s.shape[1] for s in layer_slopes), default=0)
        if widest >= 1 << 24:
            raise ValueError(f"a hidden layer of {widest} units is too wide for exact float32 counts (< 2**24)")
        self.x = x.reshape(x.shape[0], -1)
        self._dtype = self.x.dtype if dtype is None else dtype
        if analysis_inputs(self.x, self.dtype) is not self.x:
            raise ValueError(f"inputs of dtype {self.x.dtype} are not exact in the analysis dtype {self.dtype}: "
                             "convert them first")
        self.bias = bias
        self.betas, self.gammas = tuple(map(float, betas)), tuple(map(float, gammas))
        self.indicators = [(s == g).to(torch.float32) for s, g in zip(layer_slopes, self.gammas)]
        self.counts = [p.sum(1).to(self.dtype) for p in self.indicators]
        converted = self.x.numel() * torch.finfo(self.dtype).bits // 8
        copy = self.x.dtype != self.dtype and converted <= INPUT_COPY_BYTES
        # the converted copy leaves out the features that are zero in every sample (border pixels): the same X Xᵀ
        self._chunks = _InputChunks(used_features(self.x).to(self.dtype) if copy else self.x, self.dtype)
        self.input_gram_cache = input_gram_cache
        if input_gram_cache is not None:
            input_gram_cache.attach(self.x, self.dtype)

    offers_block = True  # signed_block costs O(b²·(f + Σ Ω_l)), not O(m·b·…)

    def __len__(self) -> int:
        return self.x.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        """The analysis dtype the kernel is computed in."""
        return self._dtype

    @property
    def device(self) -> torch.device:
        """The device of ``x``, where everything runs."""
        return self.x.device

    def diagonal(self) -> np.ndarray:
        """``diag(K)`` as float64 numpy (:func:`path_kernel_diagonal` of the slopes the indicators hold), in
        ``O(m·(f + Σ Ω_l))``."""
        def value(v: float) -> Tensor:
            return torch.tensor(v, dtype=self.dtype, device=self.device)

        layer_slopes = [torch.where(p > 0, value(g), value(b))
                        for p, b, g in zip(self.indicators, self.betas, self.gammas)]
        return path_kernel_diagonal(self.x, layer_slopes, bias=self.bias, dtype=self.dtype).to(
            "cpu", torch.float64).numpy()

    def columns(self, idx) -> np.ndarray:
        """``K[:, idx]`` as float64 numpy (:meth:`numpy`)."""
        return self.numpy(idx)

    def slope_gram(self, layer: int, idx: Tensor, part: slice = slice(None)) -> Tensor:
        """``G_l[idx, part]`` (transposed: rows are the requested samples; ``part`` a range of samples)."""
        p, c = self.indicators[layer], self.counts[layer]
        beta, gamma = self.betas[layer], self.gammas[layer]
        gram = (p[idx] @ p[part].T).to(self.dtype)
        if beta == 0.0:
            return gram.mul_(gamma * gamma) if gamma != 1.0 else gram
        gram.mul_((gamma - beta) ** 2)
        gram += beta * (gamma - beta) * (c[idx][:, None] + c[part][None, :])
        return gram.add_(beta * beta * p.shape[1])

    def _integer_counts(self) -> bool:
        """ReLU-type layers (``beta = 0``) without biases: the product of the counts is an integer ``<= Π Ω_l``,
        exact in float32 below ``2**24``."""
        return (not self.bias and all(b == 0.0 for b in self.betas)
                and math.prod(p.shape[1] for p in self.indicators) < 1 << 24)

    def rows(self, idx) -> Tensor:
        """``K[idx, :] = K[:, idx]ᵀ``, shape ``(len(idx), m)``, on the device of ``x``."""
        return self._rows(torch.as_tensor(idx, dtype=torch.long, device=self.x.device))

    def _rows(self, idx: Tensor, signs: Tensor | None = None, factor: float = 1.0,
              part: slice | None = None, out: Tensor | None = None) -> Tensor:
        """``factor · s_idx s_jᵀ ∘ K[idx, part]`` for signs ``s`` (``±1``; none: all ``+1``), a new tensor or written
        into ``out``; ``part``: a range of samples ``j`` (default all; the input-Gram cache serves full rows only).

        Formed a chunk of samples ``j`` at a time: the input Gram of the chunk (or the cache's rows), then its slope
        factor in place. ReLU-type layers without biases take the signs into the last layer's indicator product
        (exact integer counts ``±Π P_l P_lᵀ``) and scale the input Gram once."""
        cache = self.input_gram_cache if part is None else None
        start, stop, step = (slice(None) if part is None else part).indices(len(self))
        if step != 1:
            raise ValueError(f"`part` must be a range of consecutive samples, got a step of {step}")
        stop = max(start, stop)
        sources = cache.row_sources(self._chunks, idx) if cache is not None else None
        if sources is None:
            left = self._chunks.x[idx].to(self.dtype)
        if out is None:
            out = torch.empty(len(idx), stop - start, dtype=self.dtype, device=self.x.device)
        if not len(idx):
            return out
        whole = None if sources is None else whole_block(sources)
        if sources is not None and whole is None:
            # the kept rows are gathered a chunk of columns at a time into one buffer (stays in cache) and
            # the kernel written from it: no gathered copy of whole rows, whose fresh pages cost more than the copy
            chunk_buffer = out.new_empty(len(idx) * self._chunks.step)
        integer = self._integer_counts()
        if integer and self.indicators:
            factor *= math.prod(g * g for g in self.gammas)
            last = len(self.indicators) - 1
            rights = [p if signs is None or k < last else p * signs.to(p.dtype)[:, None]
                      for k, p in enumerate(self.indicators)]
            lefts = [right[idx] for right in rights]
        zero = torch.zeros((), dtype=self.dtype, device=self.x.device)
        for cols in self._chunks.ranges(start, stop):
            block = out[:, cols.start - start:cols.stop - start]
            if sources is None:
                gram = torch.mm(left, self._chunks(cols).T, out=block)
            elif whole is not None:  # exactly one of the cache's blocks: read in place
                gram = whole[:, cols]
            else:
                width = cols.stop - cols.start
                gram = gather_rows(sources, len(idx), cols, chunk_buffer[:len(idx) * width].view(len(idx), width))
            if integer and self.indicators:
                counts = None
                for left_p, right in zip(lefts, rights):
                    counts = left_p @ right[cols].T if counts is None else counts.mul_(left_p @ right[cols].T)
                torch.addcmul(zero, gram, counts, value=factor, out=block)
                continue
            if gram is not block:
                block.copy_(gram)
            if not integer:
                kernel = _combine(block, [self.slope_gram(k, idx, cols) for k in range(len(self.indicators))],
                                  self.bias)
                if kernel is not block:
                    block.copy_(kernel)
            if signs is not None:
                block.mul_(signs[cols].to(self.dtype)[None, :]).mul_(signs[idx].to(self.dtype)[:, None])
            if factor != 1.0:
                block.mul_(factor)
        return out

    def signed_columns(self, idx, signs, scale: float) -> np.ndarray:
        """``Q[:, idx] = (s sᵀ ∘ K)[:, idx] / scale``, float64 numpy in Fortran order: what the active-set solver
        of :func:`~lightning_nsv.solver.max_margin` asks for (labels ``s`` in ``±1``). On the CPU in float64
        the transpose of a C-ordered array that owns its memory, which the solver's store can then shrink in place."""
        if self.x.device.type != "cpu" or self.dtype != torch.float64:
            return self.signed_rows(idx, signs, scale).to("cpu", torch.float64).numpy().T
        rows = base_page_empty((len(idx), len(self)))
        self.signed_rows(idx, signs, scale, out=torch.from_numpy(rows))
        return rows.T

    def signed_block(self, idx, signs, scale: float) -> np.ndarray:
        """``Q[idx, idx] = (s sᵀ ∘ K)[idx, idx] / scale``, float64 numpy: what the active-set solver needs of
        candidates before it forms their full columns (:meth:`signed_columns`). Cost ``O(b²·(f + Σ Ω_l))``; the input
        Gram is read from the cache when it keeps the rows of all of ``idx``."""
        device = self.x.device
        idx = as_tensor_on(idx, torch.long, device)
        cache = self.input_gram_cache
        if cache is not None and len(idx) and cache.holds(idx):
            gram = cache.gram_among(idx)
        else:
            left = self._chunks.x[idx].to(self.dtype)
            gram = left @ left.T
        kernel = _combine(gram, [self.slope_gram(k, idx, idx) for k in range(len(self.indicators))], self.bias)
        s = as_tensor_on(signs, self.dtype, device)[idx]
        return (kernel * (s[:, None] * s[None, :]) / scale).to("cpu", torch.float64).numpy()

    def signed_rows(self, idx, signs, scale: float, part: slice | None = None, out: Tensor | None = None) -> Tensor:
        """``Q[part, idx]ᵀ``, shape ``(len(idx), len(part))``, on the device of ``x`` (see :meth:`signed_columns`), a
        new tensor or written into ``out``."""
        device = self.x.device
        return self._rows(as_tensor_on(idx, torch.long, device), as_tensor_on(signs, self.dtype, device), 1.0 / scale,
                          part, out)

    def __call__(self, idx) -> Tensor:
        """``K[:, idx]``, shape ``(m, len(idx))``, on the device of ``x``."""
        return self.rows(idx).T

    def numpy(self, idx):
        """``K[:, idx]`` as a float64 numpy array in Fortran order (the solver's columns)."""
        return self.rows(idx).to("cpu", torch.float64).numpy().T
