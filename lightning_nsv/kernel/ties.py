"""Near-ties of a choice (a gate's sign, a max pool's or a selection's winner): decided by one rule whatever the
block, tile or thread count a sample falls in (:func:`~lightning_nsv.kernel.pair_network.compute_gates`)."""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["TIE", "near_ties"]

TIE = 1e-10  # a choice this close to its other side, relative to the layer's largest value, is a near-tie


def near_ties(gap: Tensor, scale: Tensor, exact_zero: Tensor | None = None) -> Tensor:
    """Per sample (dim 0), whether any ``gap`` (``>= 0``) is within :data:`TIE` of the sample's largest ``|scale|``
    (``scale`` may be ``gap`` itself: its own magnitude); not where ``exact_zero``: candidates that are exactly 0 (a
    gate's 0 below its kink, in any summation order; were the gate's input near 0, the gate itself is a near-tie).
    Reductions, not masks: the smallest gap against the largest magnitude (a NaN among them counts as a tie)."""
    n = len(gap)
    magnitude = scale if scale is gap else scale.abs()
    largest = magnitude.reshape(n, -1).amax(1)
    gaps = gap.reshape(n, -1)
    if exact_zero is not None:
        gaps = gaps.masked_fill(exact_zero.reshape(n, -1), float("inf"))
    return ~(gaps.amin(1) > TIE * largest)
