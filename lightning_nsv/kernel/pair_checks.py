"""Argument checks of the pair network's columns and of the compiled pair program's runners, in one place.

The compiled runner (:mod:`lightning_nsv.kernel.pair_engines`) reads the samples' factors without bounds checks, so
everything it is given is checked here first, in Python: sample indices, factors of the program, thread counts.
:func:`check_samples` refuses inputs and gates that are not those of the traced graph (and non-finite inputs) before
any pair runs; :func:`check_engine` names the engines of
:class:`~lightning_nsv.kernel.pair_network.PairNetworkColumns`.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from lightning_nsv.errors import NonFiniteError

__all__ = ["COLUMN_ENGINES", "check_engine", "check_factors", "check_indices", "check_samples", "index_arrays"]

#: ``engine`` of PairNetworkColumns: the compiled program (by numba, by torch, or whichever fits) or the torch network
COLUMN_ENGINES = ("auto", "numba", "torch", "reference")


def check_engine(engine, factored: bool, collapse: bool) -> None:
    """Refuse an engine outside :data:`COLUMN_ENGINES`, and ``"numba"``/``"torch"`` (the compiled program) with
    ``factored=False``/``collapse=False`` (which ask for the plain torch network)."""
    if not isinstance(engine, str) or engine not in COLUMN_ENGINES:
        raise ValueError(f"`engine` can be {', '.join(map(repr, COLUMN_ENGINES))}, got {engine!r}: 'auto' runs the "
                         "compiled pair program where it can, 'reference' the torch pair network")
    if engine in ("numba", "torch") and not (factored and collapse):
        raise ValueError(f"engine={engine!r} runs the compiled pair program, but factored={factored}, "
                         f"collapse={collapse} ask for the plain torch pair network: pass engine='reference' (or "
                         "'auto') with them, or leave them True")


def check_samples(graph, x, gates) -> None:
    """Refuse inputs ``x`` that are no real tensor of ``(m, *graph.input_shape)`` with finite values, and ``gates``
    that are not :func:`~lightning_nsv.kernel.pair_network.compute_gates` of ``m`` samples through this graph."""
    if not isinstance(x, Tensor):
        raise TypeError(f"the inputs must be a torch.Tensor of shape (m, {', '.join(map(str, graph.input_shape))}), "
                        f"got {type(x).__name__}; e.g. torch.as_tensor(x)")
    if x.is_complex():
        raise TypeError(f"the inputs are {x.dtype}: the path kernel takes real inputs (float or integer)")
    bits, selections = getattr(gates, "bits", None), getattr(gates, "selections", None)
    if not isinstance(bits, dict) or not isinstance(selections, dict):
        raise TypeError(f"`gates` must be the Gates of these inputs (gates = compute_gates(graph, x)), got "
                        f"{type(gates).__name__}")
    if len(x) != len(gates) or tuple(x.shape[1:]) != graph.input_shape:
        raise ValueError(f"inputs of shape {tuple(x.shape)} and gates of {len(gates)} samples; the graph was "
                         f"traced on inputs of shape (n, {', '.join(map(str, graph.input_shape))})")
    expected = {**{g.name: ("gate layer", tuple(g.shape), bits) for g in graph.gates},
                **{p.name: ("choice layer", tuple(p.shape), selections) for p in graph.pools}}  # max pools, pieces
    for name, (kind, shape, values) in expected.items():
        got = tuple(values[name].shape[1:]) if name in values else None
        if got != shape:
            raise ValueError(f"the gates are not this graph's: its {kind} {name} has {shape} units a sample, the "
                             f"gates {'none' if got is None else got}; compute them with compute_gates(graph, x) "
                             "of this graph")
    finite = torch.isfinite(x.reshape(len(x), math.prod(x.shape[1:]))).all(1) if x.is_floating_point() else None
    if finite is not None and not bool(finite.all()):
        first = int((~finite).nonzero()[0, 0])
        raise NonFiniteError(f"input sample {first} holds NaN or inf ({int((~finite).sum())} of the {len(x)} samples "
                             "have non-finite entries): the path kernel of non-finite inputs is not defined; clean the data first (drop "
                             "those samples or torch.nan_to_num)")


def check_factors(program, bits, dense) -> None:
    """Refuse factors (numpy or torch ``bits``, ``dense``) of another program: the runner reads each row at the
    program's offsets."""
    width = 8 * (bits.element_size() if isinstance(bits, Tensor) else bits.itemsize)
    kind = str(dense.dtype).removeprefix("torch.")
    if kind not in ("float32", "float64"):
        raise ValueError(f"factor values must be float64 or float32, got {kind}: form them with "
                         "sample_factors(program, graph, x, gates)")
    if (tuple(bits.shape[1:]), tuple(dense.shape[1:]), width) != ((program.words,), (program.dense,),
                                                                   program.word_bits) or len(bits) != len(dense):
        raise ValueError(f"factors of {len(bits)} samples of {tuple(bits.shape[1:])} words of {width} bits and "
                         f"{len(dense)} of {tuple(dense.shape[1:])} {kind} values, but the program reads "
                         f"{program.words} words of {program.word_bits} bits and {program.dense} values a sample: "
                         "form them with sample_factors(program, graph, x, gates) of this program")


def check_indices(m: int, aligned: bool, **named) -> None:
    """Refuse index arrays (numpy or torch) into ``m`` rows that are not one-dimensional integers in ``-m <= i < m``
    (as numpy and torch index), or, where ``aligned``, not of one length."""
    for name, v in named.items():
        integer = (not (v.is_floating_point() or v.is_complex()) and v.dtype != torch.bool) if isinstance(v, Tensor) \
            else np.issubdtype(v.dtype, np.integer)
        if v.ndim != 1 or not integer:
            raise ValueError(f"`{name}` must be a one-dimensional array of integer sample indices, got {v.dtype} of "
                             f"shape {tuple(v.shape)}")
        if len(v) and not (-m <= int(v.min()) and int(v.max()) < m):
            bad = v[(v < -m) | (v >= m)][0]
            raise IndexError(f"`{name}` holds index {int(bad)}, outside the {m} samples whose factors were formed "
                             f"(valid: {-m} to {m - 1})")
    if aligned and len({len(v) for v in named.values()}) > 1:
        raise ValueError("pairs (first[k], second[k]) need index arrays of one length, got "
                         f"{' and '.join(f'{name} of {len(v)}' for name, v in named.items())}")


def index_arrays(m: int, aligned: bool, **named) -> list[np.ndarray]:
    """``named`` (numpy, torch or lists) as contiguous int64 numpy indices, checked (:func:`check_indices`)."""
    arrays = {name: v.detach().cpu().numpy() if isinstance(v, Tensor) else np.asarray(v) for name, v in named.items()}
    arrays = {name: a.astype(np.int64) if a.shape == (0,) else a for name, a in arrays.items()}  # [] is float64
    check_indices(m, aligned, **arrays)
    return [np.ascontiguousarray(a, dtype=np.int64) for a in arrays.values()]
