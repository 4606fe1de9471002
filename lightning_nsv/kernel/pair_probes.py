"""Fixed linear maps probed on unit inputs, for the pair program (:mod:`lightning_nsv.kernel.pair_program`).

A fixed map written in ``forward`` (average pooling, a mean, ``c·x``, ``x·buffer``) is known only as a call; the
program needs its matrix. :func:`plane_map` probes the map of one channel's plane, a few hundred unit inputs a
call, as a sparse matrix times the rule's pair constant; :func:`entry_multiplier` reads a map that multiplies each
entry by a constant of its own.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from lightning_nsv.kernel.pair_code import NotFusable, channels_and_positions

__all__ = ["PerChannel", "entry_multiplier", "plane_map", "probe_plane"]

PROBE_UNITS = 1024  # unit inputs a call


class PerChannel(NotFusable):
    """A fixed map that differs between channels."""


def plane_map(where: str, call, c, in_shape, out_shape, device) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """``diag(c_o) · D`` as sparse ``(rows, cols, weights, n_out)``, rows sorted: ``D[o, i]`` the map's response at
    ``o`` to the unit input ``i`` of one channel's plane, ``c`` the rule's pair constant; :class:`PerChannel` when
    the map or its constant differs between channels (checked on a random input of every channel)."""
    channels, spatial = channels_and_positions(in_shape)
    units = max(1, math.prod(spatial))
    out_channels, out_spatial = channels_and_positions(out_shape)
    if out_channels != channels or not in_shape:
        raise NotFusable(f"{where}: a fixed map across channels")
    n_out = max(1, math.prod(out_spatial))
    if isinstance(c, torch.Tensor):
        if c.numel() != 1 and (c.dim() < 2 or c.shape[1] != 1):
            raise PerChannel(f"{where}: a pair constant that differs between channels")
        c = c.reshape(-1).double().cpu() if c.numel() > 1 else float(c)
    rows, cols, weights = [], [], []
    for lo in range(0, units, PROBE_UNITS):
        basis = torch.zeros(min(PROBE_UNITS, units - lo), units, dtype=torch.float64, device=device)
        basis[torch.arange(len(basis)), torch.arange(lo, lo + len(basis))] = 1.0
        response = call(basis.reshape(len(basis), 1, *spatial))
        if tuple(response.shape) != (len(basis), 1, *out_spatial):
            raise PerChannel(f"{where}: a fixed map whose output on one channel has shape "
                             f"{tuple(response.shape[1:])}")
        response = response.reshape(len(basis), -1)
        unit, out = torch.nonzero(response, as_tuple=True)
        rows.append(out.cpu().numpy())
        cols.append((unit + lo).cpu().numpy())
        weights.append(response[unit, out].cpu().numpy())
    rows, cols, weights = (np.concatenate(parts) for parts in (rows, cols, weights))
    order = np.lexsort((cols, rows))
    rows, cols, weights = rows[order].astype(np.int64), cols[order].astype(np.int64), weights[order]
    probe = torch.randn(2, *in_shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    expected = torch.zeros(2, channels, n_out, dtype=torch.float64)
    expected.index_add_(2, torch.from_numpy(rows), probe.reshape(2, channels, units)[:, :, cols] *
                        torch.from_numpy(weights))
    if not torch.allclose(call(probe.to(device)).cpu().reshape(2, channels, n_out), expected, rtol=1e-10,
                          atol=1e-12):
        raise PerChannel(f"{where}: a fixed map that differs between channels")
    return rows, cols, weights * (c[rows].numpy() if isinstance(c, torch.Tensor) else c), n_out


def entry_multiplier(where: str, call, c, in_shape, out_shape, device) -> torch.Tensor:
    """``c · d`` of a fixed map that multiplies each entry by its own constant ``d`` (``x · buffer``), per entry
    ``(C, *spatial)``, on the CPU; :class:`NotFusable` for any other map across channels."""
    refuse = NotFusable(f"{where}: a fixed map that differs between channels and is not a product by constants")
    if in_shape != out_shape:
        raise refuse
    d = call(torch.ones(1, *in_shape, dtype=torch.float64, device=device))
    probe = torch.randn(2, *in_shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(device)
    c = c if isinstance(c, torch.Tensor) else torch.tensor(c, dtype=torch.float64)
    if tuple(d.shape[1:]) != tuple(in_shape) or not torch.allclose(call(probe), probe * d, rtol=1e-10, atol=1e-12):
        raise refuse
    multiplier = (d * c.to(device)).reshape(in_shape)
    if bool((multiplier < 0).any()):
        raise refuse
    return multiplier.cpu()


def probe_plane(where: str, plane, in_shape, out_shape, device) -> tuple[tuple[np.ndarray, ...], int]:
    """The matrix of a :class:`~lightning_nsv.kernel.rules.PlaneMap` (``plane(x)``: the map on one-channel planes)
    as sparse ``(rows, cols, weights)`` and its outputs a plane, or a refusal where it does not act alike on every
    channel."""
    from lightning_nsv.kernel.refusals import TRUNK, refuse

    try:
        rows, cols, weights, n_out = plane_map(where, plane, 1.0, in_shape, out_shape, device)
    except NotFusable as err:
        raise refuse(where, f"it does not act alike on every channel ({err})", TRUNK, linear=True) from None
    return (rows, cols, weights), n_out
