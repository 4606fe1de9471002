"""Binary per-sample factors of the pair network as packed bits (DESIGN.md §2c "Speed: channels collapse").

A ReLU-type gate (slope 0 below, ``gamma`` above) and a max-pool selection indicator are 0/1 masks up to one scale,
and so is any product of them. Packed 16 channels to a word, the per-position channel overlap of a block of pairs,
``C[i, j, p] = Σ_c A(x_i)[c, p] A(x_j)[c, p]``, is the population count of a bitwise AND: a few integer operations a
word instead of one float64 multiply-add a channel. Counts are exact integers, so the overlap equals the float64 sum
of 0/1 products bit for bit (times the scales).
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["Bits", "bit_overlap"]

WORD = 16  # channels per int16 word


class Bits:
    """``scale · mask`` for a bool mask ``(n, C, *spatial)``, stored as int16 words ``(n, ceil(C / 16), *spatial)``
    (bit ``k`` of word ``w`` is channel ``16·w + k``)."""

    def __init__(self, words: Tensor, channels: int, scale: float = 1.0) -> None:
        self.words, self.channels, self.scale = words, channels, scale

    @classmethod
    def pack(cls, mask: Tensor, scale: float = 1.0) -> Bits:
        """Pack a bool mask ``(n, C, *spatial)``."""
        n, channels, spatial = mask.shape[0], mask.shape[1], mask.shape[2:]
        count = -(-channels // WORD)
        padded = mask.new_zeros(n, count * WORD, *spatial)
        padded[:, :channels] = mask
        shifts = torch.arange(WORD, dtype=torch.int16, device=mask.device).view(1, 1, WORD, *(1,) * len(spatial))
        words = (padded.view(n, count, WORD, *spatial).to(torch.int16) << shifts).sum(2, dtype=torch.int16)
        return cls(words, channels, scale)

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.words.shape[0], self.channels, *self.words.shape[2:])

    def __len__(self) -> int:
        return self.words.shape[0]

    def __getitem__(self, rows) -> Bits:
        return Bits(self.words[rows], self.channels, self.scale)

    def __and__(self, other: Bits) -> Bits:
        """The product of two masks."""
        return Bits(self.words & other.words, self.channels, self.scale * other.scale)

    def map_words(self, fn) -> Bits:
        """``fn`` (a reshape or pick over the spatial dims, dims ``>= 2``) applied to the words."""
        return Bits(fn(self.words), self.channels, self.scale)

    def float(self) -> Tensor:
        """``scale · mask`` as float64 ``(n, C, *spatial)``."""
        n, count, spatial = self.words.shape[0], self.words.shape[1], self.words.shape[2:]
        shifts = torch.arange(WORD, dtype=torch.int16, device=self.words.device).view(1, 1, WORD, *(1,) * len(spatial))
        bits = (self.words.unsqueeze(2) >> shifts) & 1
        values = bits.reshape(n, count * WORD, *spatial)[:, :self.channels].to(torch.float64)
        return values if self.scale == 1.0 else values.mul_(self.scale)


_CONSTANTS: dict[torch.device, dict[int, Tensor]] = {}


def _int16(device: torch.device) -> dict[int, Tensor]:
    """The popcount's constants as int16 scalars on ``device`` (a Python int would be converted at every op)."""
    if device not in _CONSTANTS:
        _CONSTANTS[device] = {v: torch.tensor(v, dtype=torch.int16, device=device)
                              for v in (1, 2, 4, 8, 0x5555, 0x3333, 0x0F0F, 0x0101)}
    return _CONSTANTS[device]


def _popcount_(v: Tensor) -> Tensor:
    """Set bits of each int16 word, in place (SWAR; the arithmetic shifts' sign copies fall in masked bits, and the
    first subtraction's wrap-around is the two's-complement one; the last multiply adds the two byte counts into
    the high byte, whose bit 15 stays 0)."""
    k = _int16(v.device)
    v.sub_((v >> k[1]).bitwise_and_(k[0x5555]))
    high = (v >> k[2]).bitwise_and_(k[0x3333])
    v.bitwise_and_(k[0x3333]).add_(high)
    v.add_(v >> k[4]).bitwise_and_(k[0x0F0F])
    return v.mul_(k[0x0101]).bitwise_right_shift_(k[8])


def bit_overlap(first: Bits, second: Bits, outer: bool) -> Tensor:
    """``Σ_c first[i, c, p] second[j, c, p]`` as float64: ``(R, Cc, Q)`` for every pair when ``outer``, else
    ``(P, Q)`` for aligned rows (``Q`` the flattened positions)."""
    a, b = (w.reshape(*w.shape[:2], -1) for w in (first.words, second.words))
    both = torch.bitwise_and(a[:, None], b[None]) if outer else a & b
    counts = _popcount_(both)
    counts = counts.sum(-2, dtype=torch.int16) if counts.shape[-2] > 1 else counts.squeeze(-2)
    values = counts.to(torch.float64)
    scale = first.scale * second.scale
    return values if scale == 1.0 else values.mul_(scale)
