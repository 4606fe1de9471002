"""Brute-force path-space references: phi and wbar materialised coordinate by coordinate."""
from __future__ import annotations

import itertools

import torch

from lightning_nsv.kernel import PathNetwork, forward_with_slopes


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


def reference_forward(net: PathNetwork, x: torch.Tensor) -> tuple[list, list, list]:
    """``N(x)``, pre-activations and slopes by plain Python loops over neurons (no matrix products), for an
    independent check of :func:`forward_with_slopes`. Returns ``(outputs, pre_activations, slopes)`` with
    ``pre_activations[l][i][j]`` / ``slopes[l][i][j]`` for hidden layer ``l``, sample ``i``, neuron ``j``."""
    weights = [w.tolist() for w in net.weights]
    biases = None if net.biases is None else [b.tolist() for b in net.biases]
    outputs, pre = [], [[] for _ in range(net.depth)]
    slopes = [[] for _ in range(net.depth)]
    for row in x.to(net.dtype).reshape(x.shape[0], -1).tolist():
        h = row
        for k in range(net.depth):
            z = [sum(a * v for a, v in zip(weights[k][j], h)) + (biases[k][j] if biases else 0.0)
                 for j in range(len(weights[k]))]
            s = [net.gammas[k] if v >= 0 else net.betas[k] for v in z]
            pre[k].append(z)
            slopes[k].append(s)
            h = [a * v for a, v in zip(s, z)]
        outputs.append(sum(a * v for a, v in zip(weights[-1][0], h)) + (biases[-1][0] if biases else 0.0))
    return outputs, pre, slopes


def exhaustive_max_margin(kernel, y, *, feasibility_tol: float = 1e-8, max_condition: float = 1e10):
    """Every KKT point of ``min ½αᵀQα − 1ᵀα, α >= 0`` (``Q = yyᵀ∘K``) by trying every support set ``S``.

    For each ``S`` with ``Q_SS`` well conditioned (``cond < max_condition`` after scaling to unit diagonal, so that
    samples of very different norms are not mistaken for dependent ones; singular and nearly singular sets are
    skipped: by Carathéodory the optimal ``v`` is a positive combination of linearly independent samples, so
    a nonsingular support always exists), solve ``Q_SS α_S = 1`` and keep it when ``α_S > 0`` and
    ``y_i f(x_i) = (Qα)_i >= 1 − feasibility_tol`` for all ``i``. Returns ``[(support, alpha, sum_alpha)]``
    (numpy); at the optimum ``Σα = ||v||²``, the same for every KKT point (``v`` is unique).
    """
    import numpy as np

    kernel, y = np.asarray(kernel, dtype=np.float64), np.asarray(y, dtype=np.float64)
    q = kernel * np.outer(y, y)
    m = len(y)
    found = []
    for size in range(1, m + 1):
        for support in map(list, itertools.combinations(range(m), size)):
            block = q[np.ix_(support, support)]
            unit = 1 / np.sqrt(np.diag(block))
            if np.linalg.cond(block * np.outer(unit, unit)) >= max_condition:
                continue
            a = np.linalg.solve(block, np.ones(size))
            if not np.all(a > 0):
                continue
            alpha = np.zeros(m)
            alpha[support] = a
            if np.all(q @ alpha >= 1 - feasibility_tol):
                found.append((support, alpha, float(a.sum())))
    return found
