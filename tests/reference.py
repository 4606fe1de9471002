"""Brute-force path-space references: phi and wbar materialised coordinate by coordinate."""
from __future__ import annotations

import itertools

import torch

from lightning_nsv.path_space import PathNetwork, forward_with_slopes


def _outer(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a[:, None] * b[None, :]).reshape(-1)


def materialise_phi(net: PathNetwork, x: torch.Tensor) -> torch.Tensor:
    """Rows ``phi(x_i)``: input paths ``sigma_d ⊗ … ⊗ sigma_1 ⊗ x``, then (with biases) the paths seeded at
    layer ``k = 1..d`` (``sigma_d ⊗ … ⊗ sigma_k``) and the output-bias path (``1``)."""
    _, slopes = forward_with_slopes(net, x)
    rows = []
    for i in range(x.shape[0]):
        feats = x[i].reshape(-1).to(net.dtype)
        for s in slopes:
            feats = _outer(s[i], feats)
        parts = [feats]
        if net.biases is not None:
            for k in range(net.depth):
                seeded = slopes[k][i]
                for s in slopes[k + 1:]:
                    seeded = _outer(s[i], seeded)
                parts.append(seeded)
            parts.append(torch.ones(1, dtype=net.dtype))
        rows.append(torch.cat(parts))
    return torch.stack(rows)


def materialise_wbar(net: PathNetwork) -> torch.Tensor:
    """``wbar`` in the coordinate order of :func:`materialise_phi`, by walking every path."""
    w, d = net.weights, net.depth
    layer_sizes = [net.in_features, *net.hidden_widths]

    def path_weight(indices: tuple[int, ...], start: int, seed: torch.Tensor) -> torch.Tensor:
        # indices = (i_d, ..., i_start); A_k[i_{k+1}, i_k] joins layer k to layer k+1, A_d[0, i_d] the output
        by_layer = dict(zip(range(d, start - 1, -1), indices))
        value = seed * w[d][0, by_layer[d]]
        for k in range(start, d):
            value = value * w[k][by_layer[k + 1], by_layer[k]]
        return value

    def paths_from(start: int):
        return itertools.product(*[range(layer_sizes[k]) for k in range(d, start - 1, -1)])

    one = torch.ones((), dtype=net.dtype)
    coords = [path_weight(p, 0, one) for p in paths_from(0)]
    if net.biases is not None:
        for k in range(1, d + 1):
            coords += [path_weight(p, k, net.biases[k - 1][p[-1]]) for p in paths_from(k)]
        coords.append(net.biases[-1][0])
    return torch.stack(coords)
