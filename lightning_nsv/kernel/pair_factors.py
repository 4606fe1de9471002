"""Per-sample factors of a :class:`~lightning_nsv.kernel.pair_program.PairProgram`, formed once for every sample.

A factor ``A(x)[c, p]`` is a product of the input, gate slopes and max-pool hit indicators ``[sel(x) = j]``
(:data:`~lightning_nsv.kernel.pair_program.Recipe`). One that is a constant times a 0/1 mask is stored as words of
``word_bits`` channel bits per position (the program's overlaps count the set bits of ANDed words), the others as
float64 values. A sample's factors lie in one row: ``bits[i]`` (words) and ``dense[i]`` (values), each factor laid out
``(count, positions)`` at its slot's offset. The values are kept as float32 where every one of them is a float32
exactly (float32 data through ReLU-type gates): half the memory traffic of a pair's input overlap, the same numbers
(the runners multiply them in float64).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from lightning_nsv.kernel.pair_code import PairProgram, Recipe, recipe_is_bits, recipe_scale
from lightning_nsv.kernel.piece_rules import HIGH, LINEAR, LOW, piece_sides
from lightning_nsv.kernel.slopes import gate_slopes, relu_type

__all__ = ["SampleFactors", "sample_factors"]

WORD_DTYPES = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}
SIGNED = {8: torch.int8, 16: torch.int16, 32: torch.int32, 64: torch.int64}
CHUNK_BYTES = 256 << 20  # intermediate factors of one chunk of samples (bool masks, float64 values)


@dataclass
class SampleFactors:
    """The factors of ``m`` samples: ``bits`` ``(m, program.words)`` unsigned words, ``dense`` ``(m,
    program.dense)`` float64, or float32 where that holds every value exactly (numpy, on the CPU)."""

    bits: np.ndarray
    dense: np.ndarray

    @property
    def nbytes(self) -> int:
        return self.bits.nbytes + self.dense.nbytes

    def tensors(self, device) -> tuple[Tensor, Tensor]:
        """The same as torch tensors on ``device`` (words as signed integers of the same width, the same bits)."""
        signed = self.bits.view(np.dtype(f"int{self.bits.dtype.itemsize * 8}"))
        return torch.from_numpy(signed).to(device), torch.from_numpy(self.dense).to(device)


def factor_bytes(program: PairProgram) -> int:
    """Bytes of one sample's factors."""
    return program.words * program.word_bits // 8 + 8 * program.dense


def sample_factors(program: PairProgram, graph, x: Tensor, gates) -> SampleFactors:
    """The factors of every sample of ``x`` (``(m, *input_shape)``) with its ``gates``
    (:class:`~lightning_nsv.kernel.pair_network.Gates`), a chunk of samples at a time."""
    m = len(x)
    family = {g.name: (g.beta, g.gamma) for g in graph.gates}
    bits = np.zeros((m, program.words), dtype=WORD_DTYPES[program.word_bits])
    dense = np.zeros((m, program.dense), dtype=np.float64)
    sizes = [math.prod(slot.shape) for slot in program.factors]
    # a chunk's memo holds every factor and the values they are made from: at most 8 bytes an entry, twice the largest
    chunk = max(1, CHUNK_BYTES // (8 * (sum(sizes) + 2 * max(sizes + [1]))))
    for lo in range(0, m, chunk):
        rows = slice(lo, min(m, lo + chunk))
        memo: dict = {}
        for slot in program.factors:
            value, is_mask = _evaluate(slot.recipe, graph, x, gates, rows, family, memo)
            count, positions = slot.count, math.prod(slot.shape[1:])
            if slot.bits:
                words = _pack(value.reshape(value.shape[0], slot.shape[0], positions), program.word_bits, count)
                bits[rows, slot.offset:slot.offset + count * positions] = words.reshape(len(words), -1)
            else:
                block = value.reshape(value.shape[0], -1).cpu().numpy()
                dense[rows, slot.offset:slot.offset + count * positions] = block
    return SampleFactors(bits, narrowed(dense))


def narrowed(values: np.ndarray) -> np.ndarray:
    """``values`` as float32 where every one of them is a float32 exactly, else as they are."""
    single = values.astype(np.float32)
    return single if np.array_equal(single, values) else values


def _evaluate(recipe: Recipe, graph, x: Tensor, gates, rows: slice, family, memo) -> tuple[Tensor, bool]:
    """``(value, is_mask)`` of a factor for the samples ``rows``: a bool mask (the factor over its scale) or
    float64 values, ``(n, C, *spatial)`` on the graph's device."""
    if recipe in memo:
        return memo[recipe]
    kind = recipe[0]
    if kind == "input":
        out = (x[rows].to(graph.device, torch.float64), False)
    elif kind == "gate":
        beta, gamma = family[recipe[1]]
        mask = gates.bits[recipe[1]][rows]
        out = (mask, True) if relu_type(beta) else (gate_slopes(mask, beta, gamma), False)
    elif kind == "mul":
        (a, a_mask), (b, b_mask) = (_evaluate(r, graph, x, gates, rows, family, memo) for r in recipe[1:])
        if a_mask and b_mask:
            out = (a & b, True)
        else:
            out = (_dense(a, a_mask, recipe[1], family) * _dense(b, b_mask, recipe[2], family), False)
    elif kind == "channels":
        _, lo, hi, shape = recipe
        mask = torch.zeros(rows.stop - rows.start, *shape, dtype=torch.bool, device=graph.device)
        mask[:, lo:hi] = True
        out = (mask, True)
    elif kind == "embed":
        _, inner, lo, hi, shape = recipe
        value, is_mask = (None, True) if inner is None else _evaluate(inner, graph, x, gates, rows, family, memo)
        full = torch.zeros(rows.stop - rows.start, *shape, dtype=torch.bool if is_mask else torch.float64,
                           device=graph.device)
        full[:, lo:hi] = True if value is None else value
        out = (full, is_mask)
    elif kind == "const":
        constant = program_constants(graph)[recipe[1]].to(graph.device)
        out = (constant.expand(rows.stop - rows.start, *constant.shape), False)
    elif kind == "at":
        value, is_mask = _evaluate(recipe[1], graph, x, gates, rows, family, memo)
        index = program_constants(graph)[recipe[2]].to(value.device)
        out = (value.flatten(2).index_select(2, index).reshape(len(value), *recipe[3]), is_mask)
    elif kind in ("piece", "flat", "line"):
        out = _vocabulary_factor(recipe, graph, x, gates, rows, family, memo)
    elif kind == "not":
        value, _ = _evaluate(recipe[1], graph, x, gates, rows, family, memo)
        out = (~value, True)
    elif kind == "view":
        value, is_mask = _evaluate(recipe[1], graph, x, gates, rows, family, memo)
        out = (value.reshape(len(value), *recipe[2]), is_mask)
    elif kind == "call":
        value, is_mask = _evaluate(recipe[1], graph, x, gates, rows, family, memo)
        out = (_call(graph, recipe[2], value), is_mask)
    else:
        _, inner, pool, j = recipe
        rule = graph.rules[pool]
        candidates, valid = rule.candidates(graph.device)
        chosen = gates.selections[pool][rows]
        hit = (chosen.flatten(2) == candidates[:, j]) & valid[:, j]
        if inner is None:
            out = (hit.view(chosen.shape), True)
        else:
            value, is_mask = _evaluate(inner, graph, x, gates, rows, family, memo)
            picked = value.flatten(2).index_select(2, candidates[:, j])
            out = ((picked & hit).view(chosen.shape), True) if is_mask else \
                ((picked * hit).view(chosen.shape), False)
    memo[recipe] = out
    return out


def _vocabulary_factor(recipe: Recipe, graph, x: Tensor, gates, rows: slice, family, memo) -> tuple[Tensor, bool]:
    """A saturating unit's linear-piece mask (``piece``) or flat value (``flat``: the mask of the side of its one
    bound other than 0, else float64), or a factor at one candidate of a max over a dim (``line``)."""
    kind, name = recipe[0], recipe[1] if recipe[0] != "line" else recipe[2]
    chosen = gates.selections[name][rows]
    if kind == "piece":
        return chosen == LINEAR, True
    if kind == "flat":
        _, _, lo, hi = recipe
        if recipe_is_bits(recipe, family):
            return chosen == (LOW if lo else HIGH), True
        return piece_sides(chosen, lo, hi)[1], False
    _, inner, _, j, dim, keepdim, shape = recipe
    hit = (chosen == j).reshape(len(chosen), *shape)
    if inner is None:
        return hit, True
    value, is_mask = _evaluate(inner, graph, x, gates, rows, family, memo)
    picked = value.select(dim, j)
    picked = (picked.unsqueeze(dim) if keepdim else picked).reshape(len(chosen), *shape)
    return (picked & hit, True) if is_mask else (picked * hit, False)


def program_constants(graph) -> list:
    return graph.pair_program.constants


def _call(graph, name: str, value: Tensor) -> Tensor:
    """The shape operation of node ``name`` on ``value`` in place of its input-dependent argument."""
    import torch.fx as fx

    node = next(n for n in graph.nodes if n.name == name)
    swap = lambda n: value if n.name in graph.dynamic else graph.consts[n.target]  # noqa: E731
    return graph.rules[name].call(fx.node.map_arg(node.args, swap), fx.node.map_arg(node.kwargs, swap))


def _dense(value: Tensor, is_mask: bool, recipe: Recipe, family) -> Tensor:
    if not is_mask:
        return value
    return value.to(torch.float64) * recipe_scale(recipe, family)


def _pack(mask: Tensor, word_bits: int, count: int) -> np.ndarray:
    """A bool mask ``(n, C, P)`` as words ``(n, count, P)``: bit ``k`` of word ``w`` is channel ``word_bits·w + k``
    (eight channels at a time summed into a byte by their bit weights, a position's bytes read as one little-endian
    word)."""
    n, channels, positions = mask.shape
    if channels < count * word_bits:
        mask = torch.nn.functional.pad(mask, (0, 0, 0, count * word_bits - channels))
    lanes = mask.view(torch.uint8).reshape(n, count * word_bits // 8, 8, positions)
    weights = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8, device=mask.device).view(1, 1, 8, 1)
    octets = (lanes * weights).sum(2, dtype=torch.uint8).view(n, count, word_bits // 8, positions)
    octets = octets.permute(0, 1, 3, 2).contiguous().cpu().numpy()  # (n, count, P, bytes)
    words = octets.view(np.dtype(f"<u{word_bits // 8}")).reshape(n, count, positions)
    return words.astype(WORD_DTYPES[word_bits], copy=False)
