"""The formulas of path space (DESIGN.md §1), one short function each.

A network without biases computes ``N(x) = <phi(x), wbar>`` with ``phi(x) = sigma_d(x) ⊗ … ⊗ sigma_1(x) ⊗ x``
and ``wbar`` the products of weights along paths. Nothing here materialises ``phi`` or ``wbar``: kernels
factor over layers and path norms are forward passes of element-wise squared weights.

All functions compute in the dtype of the :class:`~lightning_nsv.kernel.network.PathNetwork` (float64 by default);
inputs are cast to it, those of a narrower float dtype a chunk of rows at a time.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from lightning_nsv.kernel.inputs import _InputChunks
from lightning_nsv.kernel.network import PathNetwork
from lightning_nsv.validate import is_count

__all__ = ["check_block_size", "forward_with_slopes", "output_gram", "path_kernel", "path_kernel_diagonal",
           "path_norm_squared", "slopes", "unique_patterns"]


def slopes(z: Tensor, beta: float, gamma: float) -> Tensor:
    """DESIGN.md §1 (activation): slope of ``rho(z) = gamma*z (z >= 0), beta*z (z < 0)`` at each pre-activation:
    ``gamma`` at ``z == 0``."""
    return torch.where(z >= 0, torch.tensor(gamma, dtype=z.dtype, device=z.device),
                       torch.tensor(beta, dtype=z.dtype, device=z.device))


def forward_with_slopes(net: PathNetwork, x: Tensor) -> tuple[Tensor, list[Tensor]]:
    """DESIGN.md §1: network output ``N(x)`` (shape ``(n,)`` for one output unit, ``(n, K)`` for ``K > 1``) and the
    slopes ``sigma_l(x)`` of each hidden layer."""
    x = x.reshape(x.shape[0], -1)
    if x.shape[1] != net.in_features:
        raise ValueError(f"inputs have {x.shape[1]} features, the path network expects {net.in_features}")
    chunks = _InputChunks(x, net.dtype)
    if x.dtype == net.dtype or len(x) <= chunks.step:
        return _forward(net, x.to(net.dtype))
    parts = [_forward(net, chunks(rows)) for rows in chunks.ranges()]  # no converted copy of all of x
    return torch.cat([out for out, _ in parts]), [torch.cat(layer) for layer in zip(*(s for _, s in parts))]


def _forward(net: PathNetwork, h: Tensor) -> tuple[Tensor, list[Tensor]]:
    """:func:`forward_with_slopes` of rows already in the network's dtype."""
    layer_slopes = []
    for k, a in enumerate(net.weights[:-1]):
        z = h @ a.T
        if net.biases is not None:
            z = z + net.biases[k]
        s = slopes(z, net.betas[k], net.gammas[k])
        layer_slopes.append(s)
        h = s * z
    out = h @ net.weights[-1].T
    if net.biases is not None:
        out = out + net.biases[-1]
    return (out[:, 0] if net.num_outputs == 1 else out), layer_slopes


def _combine(input_gram: Tensor, grams: Sequence[Tensor], bias: bool) -> Tensor:
    """DESIGN.md §1 (path kernel, with biases): ``G_0 ∘ Π G_l``, plus ``1 + Σ_k Π_{l>=k} G_l`` for the bias paths
    (Horner from the top); ``input_gram`` is overwritten without biases."""
    if not bias:
        for g in grams:
            input_gram *= g
        return input_gram
    upper = torch.ones_like(input_gram)
    total = torch.ones_like(input_gram)
    for g in reversed(grams):
        upper = upper * g
        total += upper
    return total + input_gram * upper


def _kernel_block(
    x_a: Tensor, slopes_a: Sequence[Tensor], x_b: Tensor, slopes_b: Sequence[Tensor], bias: bool
) -> Tensor:
    """DESIGN.md §1: ``K = (X_a X_bᵀ) ∘ Π_l (S_a,l S_b,lᵀ)`` (with the bias paths of :func:`_combine`)."""
    return _combine(x_a @ x_b.T, [s_a @ s_b.T for s_a, s_b in zip(slopes_a, slopes_b)], bias)


def path_kernel_diagonal(x: Tensor, slopes: Sequence[Tensor], *, bias: bool = False,
                         dtype: torch.dtype | None = None) -> Tensor:
    """DESIGN.md §1: ``K(x_i, x_i) = ||phi(x_i)||²`` for each sample, in ``O(n·(f + Σ Ω_l))``, in ``dtype``
    (default the wider of the inputs' and the slopes'; inputs of a narrower dtype are converted a chunk of rows at
    a time)."""
    x = x.reshape(x.shape[0], -1)
    dtype = dtype or (torch.promote_types(x.dtype, slopes[0].dtype) if len(slopes) else x.dtype)
    squares = _InputChunks(x, dtype).concat(lambda chunk: (chunk * chunk).sum(1))
    return _combine(squares, [(s * s).to(dtype).sum(1) for s in slopes], bias)


def check_block_size(block_size: int | None) -> None:
    """Refuse a ``block_size`` (rows per block of a kernel) that is not ``None`` or a positive integer."""
    if block_size is not None and not (is_count(block_size) and block_size >= 1):
        raise ValueError(f"block_size must be a positive integer (rows per block of the kernel) or None, "
                         f"got {block_size!r}")


def path_kernel(
    x_a: Tensor,
    slopes_a: Sequence[Tensor],
    x_b: Tensor | None = None,
    slopes_b: Sequence[Tensor] | None = None,
    *,
    bias: bool = False,
    block_size: int | None = None,
) -> Tensor:
    """DESIGN.md §1: path kernel ``K(x, x') = <phi(x), phi(x')>`` between two sets of samples.

    Without biases ``K = (X_a X_bᵀ) ∘ Π_l (S_a,l S_b,lᵀ)``; with biases the paths seeded at each layer add
    ``1 + Σ_k Π_{l>=k} G_l`` (DESIGN.md §1). Computed in blocks of rows of ``x_a``: cost
    ``O(n_a·n_b·(f + Σ Ω_l))`` time (half of it for the kernel of one set, whose upper blocks are mirrored),
    ``O(n_a·n_b)`` memory for the result plus one block of Gram matrices.

    Args:
        x_a: inputs of path space, ``(n_a, f)`` (flattened embeddings for CNN+FC networks).
        slopes_a: per-layer slopes of ``x_a`` from :func:`forward_with_slopes`.
        x_b, slopes_b: the second set; ``None`` for ``x_a`` itself.
        bias: whether the network has biases.
        block_size: rows per block; default keeps a block's Gram matrices near 32 MiB.

    Returns:
        ``(n_a, n_b)`` tensor in the dtype of ``x_a``.
    """
    check_block_size(block_size)
    symmetric = x_b is None
    if symmetric:
        x_b, slopes_b = x_a, slopes_a
    if slopes_b is None or len(slopes_a) != len(slopes_b):
        raise ValueError("slopes_a and slopes_b must list the same number of layers")
    x_a, x_b = x_a.reshape(x_a.shape[0], -1), x_b.reshape(x_b.shape[0], -1)
    if x_a.shape[1] != x_b.shape[1]:
        raise ValueError(f"x_a has {x_a.shape[1]} features and x_b {x_b.shape[1]}")
    n_a, n_b = x_a.shape[0], x_b.shape[0]
    if block_size is None:
        block_size = max(1, (1 << 22) // max(n_b, 1))
    kernel = torch.empty(n_a, n_b, dtype=x_a.dtype, device=x_a.device)
    x_b = x_b.to(x_a.dtype)
    slopes_b = [s.to(x_a.dtype) for s in slopes_b]
    for start in range(0, n_a, block_size):
        rows = slice(start, start + block_size)
        cols = slice(start if symmetric else 0, n_b)  # symmetric: the upper blocks, mirrored below
        kernel[rows, cols] = _kernel_block(x_a[rows], [s[rows] for s in slopes_a], x_b[cols],
                                           [s[cols] for s in slopes_b], bias)
        if symmetric:  # a product X Xᵀ need not be exactly symmetric (BLAS kernels): its upper triangle, mirrored
            diagonal = kernel[rows, rows]
            diagonal.copy_(diagonal.triu() + diagonal.triu(1).mT)
            kernel[start + block_size:, rows] = kernel[rows, start + block_size:].T
    return kernel


def _squared_mass(net: PathNetwork, weights) -> Tensor:
    """``M``: the squared weights of ``weights`` (the first layers of ``net``) multiplied along every path, summed at
    each unit they reach, ``b²`` added at each layer (a forward pass of ones through element-wise squares)."""
    mass = torch.ones(net.in_features, dtype=net.dtype, device=net.device)
    for k, a in enumerate(weights):
        mass = (a * a) @ mass
        if net.biases is not None:
            mass = mass + net.biases[k] ** 2
    return mass


def path_norm_squared(net: PathNetwork) -> float:
    """DESIGN.md §1: ``||wbar||²``, the squared weights multiplied along every path, summed."""
    if net.num_outputs != 1:
        raise ValueError(f"path_norm_squared needs 1 output unit, got {net.num_outputs}: use output_gram")
    return float(_squared_mass(net, net.weights)[0])


def output_gram(net: PathNetwork) -> np.ndarray:
    """DESIGN.md §2b: ``G_kl = <wbar_k, wbar_l>`` (``K×K``) without enumerating paths.

    Paths to outputs ``k`` and ``l`` share everything below the last hidden layer, so
    ``G_kl = Σ_j A_d[k, j] A_d[l, j] M_j + b_k b_l`` with ``M`` the squared-weight mass reaching last-hidden
    unit ``j`` (:func:`_squared_mass`). For ``K = 1`` this is :func:`path_norm_squared`.
    """
    mass = _squared_mass(net, net.weights[:-1])
    out = net.weights[-1]
    gram = (out * mass) @ out.T
    if net.biases is not None:
        gram = gram + torch.outer(net.biases[-1], net.biases[-1])
    return gram.to("cpu", torch.float64).numpy()


def unique_patterns(*slope_sets: Sequence[Tensor], gammas: Sequence[float]) -> int:
    """DESIGN.md §1 (``sigma_l``): number of distinct activation patterns (all hidden slopes of a sample) across the given sets.

    A network without hidden layers has one (empty) pattern.
    """
    if not gammas:
        return 1
    bits = torch.cat(
        [torch.cat([s == g for s, g in zip(layer_slopes, gammas)], dim=1) for layer_slopes in slope_sets]
    )
    if bits.shape[0] == 0:
        return 0
    pad = (-bits.shape[1]) % 64  # whole int64 words: one sort of integers where a pattern fits a word
    bits = torch.nn.functional.pad(bits.to(torch.uint8), (0, pad)).reshape(bits.shape[0], -1, 8)
    packed = (bits << torch.arange(7, -1, -1, dtype=torch.uint8, device=bits.device)).sum(-1, dtype=torch.uint8)
    words = packed.contiguous().view(torch.int64)
    return int((torch.unique(words[:, 0]) if words.shape[1] == 1 else torch.unique(words, dim=0)).shape[0])
