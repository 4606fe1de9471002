"""The sample-compression bound on the test error (DESIGN.md §2), and how a report states it."""
from __future__ import annotations

import math

from lightning_nsv.validate import check_probability

__all__ = ["bound_text", "compression_bound"]


def compression_bound(m: int, s: int, n_hidden: int, delta: float = 0.05) -> float:
    """Sample-compression bound on the test error, holding with probability ``>= 1 − delta``.

    ``(n·s·ln 2 + ln C(m, s) + ln(m/δ)) / (m − s)``: a compression set of ``s`` samples with ``n`` bits of
    side information each (the activation pattern of the ``n`` hidden neurons). Returned even when above 1;
    ``inf`` when ``s == m``.
    """
    if not 0 <= s <= m or m < 1:
        raise ValueError(f"need 0 <= s <= m and m >= 1, got s={s}, m={m}")
    check_probability("delta", delta)
    if s == m:
        return math.inf
    log_binom = math.lgamma(m + 1) - math.lgamma(s + 1) - math.lgamma(m - s + 1)
    return (n_hidden * s * math.log(2) + log_binom + math.log(m / delta)) / (m - s)


def bound_text(bound: float) -> str:
    """``bound`` as a report states it: a value above 1 (or ``inf``) is marked vacuous, since an error rate is at
    most 1 anyway."""
    if bound == math.inf:
        return "inf — vacuous (s = m: every sample is a support vector, says nothing about the error)"
    if bound > 1:
        return f"{bound:.4g} — vacuous (above 1: says nothing about the error)"
    return f"{bound:.4g}"
