"""``||wbar||²`` and the output Gram of a traced piecewise-linear network (DESIGN.md §2b, §2c): the *norm network*
(every weight squared, gates 1, shifts ``b²``) run on ones."""
from __future__ import annotations

import torch
from torch import Tensor

from lightning_nsv.errors import NonFiniteError
from lightning_nsv.kernel import rules as R
from lightning_nsv.kernel.graph import PiecewiseGraph, run

__all__ = ["output_gram", "path_norm_squared"]


def _norm(graph: PiecewiseGraph, capture: str | None = None) -> Tensor:
    ones = torch.ones(1, *graph.input_shape, dtype=torch.float64, device=graph.device)
    out = run(graph, ones, "norm", capture=capture)
    if not torch.isfinite(out).all():
        raise NonFiniteError("the path norm is not finite")
    return out


def path_norm_squared(graph: PiecewiseGraph) -> float:
    """``||wbar||²`` (DESIGN.md §2c): the network with every weight squared, gates 1, shifts ``b²``, run on ones;
    a fixed map (average pool, mean, ``c·x``) passes with coefficient 1 on each of its edges, since its constants
    are in ``phi``, not in ``wbar`` (§2c's sentence "every fixed constant squared" is wrong; the enumeration tests
    confirm this). One output only (see :func:`output_gram` for ``K``)."""
    if graph.num_outputs != 1:
        raise ValueError(f"path_norm_squared needs 1 output, the network has {graph.num_outputs}: use output_gram")
    return float(_norm(graph).reshape(-1)[0])


def output_gram(graph: PiecewiseGraph) -> Tensor:
    """``G_kl = <wbar_k, wbar_l>`` (DESIGN.md §2b, §2c), ``(K, K)``: ``Σ_j A[k, j] A[l, j] M_j + c_k c_l`` for the
    last Linear ``A``, ``c`` and ``M`` the norm network's value at its inputs. The network's output must be that
    Linear's (up to reshapes)."""
    last = _last_linear(graph)
    if last is None:
        if graph.num_outputs == 1:
            return torch.tensor([[path_norm_squared(graph)]], dtype=torch.float64)
        raise ValueError("output_gram needs a network that ends with nn.Linear (then reshapes only)")
    node, rule = last
    source = node.args[0]
    mass = torch.ones(graph.input_shape, dtype=torch.float64, device=graph.device) if source.op == "placeholder" \
        else _norm(graph, capture=source.name)
    mass = mass.reshape(-1)
    a = rule.weight
    if mass.numel() != a.shape[1]:
        raise ValueError(f"output_gram needs the last Linear applied to (n, features), got {mass.numel()} values for "
                         f"{a.shape[1]} features")
    gram = (a * mass) @ a.T
    if rule.bias is not None:
        gram = gram + rule.bias[:, None] * rule.bias[None, :]
    return gram.cpu()


def _last_linear(graph: PiecewiseGraph):
    """``(node, rule)`` of the Linear whose output, through reshapes only, is the network's; else ``None``."""
    node = next(n for n in graph.nodes if n.op == "output").args[0]
    while node.name in graph.rules:
        rule = graph.rules[node.name]
        if isinstance(rule, R.Linear):
            return node, rule
        dynamic = [a for a in node.all_input_nodes if a.name in graph.dynamic]
        if not isinstance(rule, (R.Passthrough, R.Squeeze, R.Identity)) or len(dynamic) != 1:
            return None
        node = dynamic[0]
    return None
