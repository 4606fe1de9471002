"""How the columns route of a binary analysis starts: the kernel columns that the root and the serving ranks compute
alike, the serving ranks' loop, and the first candidates (a previous support, pruned, or the smallest margins)."""
from __future__ import annotations

import math
import warnings
from typing import Any, Sequence

import numpy as np
import torch
from torch import Tensor

from lightning_nsv.kernel.columns import PathKernelColumns
from lightning_nsv.kernel.formulas import _combine, forward_with_slopes
from lightning_nsv.kernel.gram_cache import InputGramCache
from lightning_nsv.kernel.inputs import analysis_inputs
from lightning_nsv.kernel.network import PathNetwork
from lightning_nsv.kernel.sharded import serve
from lightning_nsv.solver import NotSeparableError, max_margin, sample_indices

__all__ = ["INITIAL_MARGINS", "PRUNE_MAX_BYTES", "first_candidates", "kernel_columns", "pruned_support",
           "serve_kernel_columns"]

# the cold start tries the INITIAL_MARGINS·⌊√m⌋ smallest network margins first: at m = 20,000 (60,000) the solver
# then fetches 1,589 (4,174) columns for 1,183 (3,047) support vectors, against 1,777 (4,785) from ⌊√m⌋; admitted as
# one lazy block rather than ⌊√m⌋ at a time, 1,512 columns in 11 requests for 1,339 support vectors against 1,536 in
# 15 (benchmarks/nsv_scale.py's stand-in at m = 20,000)
INITIAL_MARGINS = 4


def serve_kernel_columns(net: PathNetwork, x_train: Tensor, *, group: Any = None, root: int = 0) -> int:
    """The other ranks' side of :func:`~lightning_nsv.analysis.binary.network_support_vectors` with ``sharing``: compute the kernel columns the
    root asks for, on this rank's shard of the rows of the same ``net`` and ``x_train``, until the root's
    :class:`~lightning_nsv.kernel.sharded.ColumnSharing` block ends; the number of column blocks computed."""
    x_train = analysis_inputs(x_train.reshape(len(x_train), -1), net.dtype)
    on_device = net.to(x_train.device)
    return serve(kernel_columns(on_device, x_train, forward_with_slopes(on_device, x_train)[1]), group, root)


# largest kernel of a previous support that a warm start solves on its own first (5,792 samples in float64)
PRUNE_MAX_BYTES = 256 << 20


def pruned_support(net: PathNetwork, x_train: Tensor, slopes_train: Sequence[Tensor], y: Tensor,
                   previous: Tensor | np.ndarray, *, cache: InputGramCache | None = None) -> np.ndarray:
    """The members of a previous support ``previous`` that are support vectors of the max-margin problem on those
    samples alone, on the current ``net`` (``slopes_train`` its slopes on ``x_train``, ``y`` in ±1): what a warm
    start admits first. Members the new network no longer needs then never have their full kernel columns formed
    nor leave the solver's factor one downdate at a time; any that the whole training set does need re-enter as
    violators. ``previous`` itself when its kernel exceeds :data:`PRUNE_MAX_BYTES` or the sub-problem fails.
    ``cache``: an :class:`~lightning_nsv.kernel.gram_cache.InputGramCache` attached to ``x_train`` in the dtype of ``net``
    that keeps the rows of ``previous`` (their input Gram is read from it instead of computed).

    Cost: the ``b×b`` kernel of the ``b`` members and an active-set solve on it."""
    samples = np.asarray(previous.cpu() if isinstance(previous, Tensor) else previous, dtype=np.int64)
    if not len(samples) or len(samples) ** 2 * torch.finfo(net.dtype).bits // 8 > PRUNE_MAX_BYTES:
        return samples
    idx = torch.from_numpy(samples).to(x_train.device)
    if cache is not None:
        kernel = _combine(cache.gram_among(idx),
                          [(s[idx] @ s[idx].T).to(net.dtype) for s in slopes_train], net.biases is not None)
    else:
        kernel = kernel_columns(net, x_train[idx], [s[idx] for s in slopes_train]).rows(
            torch.arange(len(idx), device=x_train.device))
    try:
        with warnings.catch_warnings():  # a guess: the solve of the whole problem reports on its own accuracy
            warnings.simplefilter("ignore")
            sub = max_margin(kernel.to(torch.float64), y[idx], initial=np.arange(len(idx)), initial_block=len(idx))
    except (NotSeparableError, ValueError, np.linalg.LinAlgError):
        return samples
    kept = samples[sub.support_]
    return kept if len(kept) else samples


def kernel_columns(net: PathNetwork, x_train: Tensor, slopes_train: Sequence[Tensor],
                    cache: InputGramCache | None = None) -> PathKernelColumns:
    """The kernel columns of ``x_train`` (as :func:`analysis_inputs` keeps it) that the root and the serving ranks
    compute alike."""
    return PathKernelColumns(x_train, slopes_train, net.betas, net.gammas, bias=net.biases is not None,
                             input_gram_cache=cache, dtype=net.dtype)


def first_candidates(net: PathNetwork, x_train: Tensor, slopes_train: Sequence[Tensor], y: Tensor, outputs: Tensor,
                     initial, cache: InputGramCache | None, lazy: bool) -> tuple[np.ndarray, int | None]:
    """The samples the solver tries first and how many it admits at a time (``None``: ``⌊√m⌋``, most violated first):
    ``initial`` when given, else the support kept in ``cache``, both admitted whole; else the
    ``INITIAL_MARGINS·⌊√m⌋`` smallest margins ``y·N(x)`` (ties at the start: index order), admitted whole too where
    the solver admits candidates ``lazy``-ly (:func:`~lightning_nsv.solver.column_store.admits_lazily`: from
    ``Q[F ∪ new, new]``, full columns formed only for those kept), else ``⌊√m⌋`` at a time (members that earlier
    blocks made redundant then never have their columns formed). Where it is not lazy, e.g. with the torch solver,
    a kept support is pruned first (:func:`pruned_support`). Those whose input-Gram rows ``cache`` keeps come
    first, in its order."""
    if initial is None and cache is not None and len(cache):
        initial = cache.samples if lazy else pruned_support(net, x_train, slopes_train, y, cache.samples, cache=cache)
    guess = initial is None
    if guess:
        initial = np.sort(torch.argsort(y * outputs)[: INITIAL_MARGINS * int(math.sqrt(len(y)))].cpu().numpy())
    initial_block = None if guess and not lazy else max(1, len(initial))
    initial = sample_indices(initial)
    return (cache.in_slot_order(initial) if cache is not None else initial), initial_block
