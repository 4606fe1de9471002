"""Brute-force path space of a traced network: every map unrolled into a dense matrix, every path of the unrolled
DAG enumerated, phi(x) and wbar materialised (DESIGN.md §2c). Only for tiny networks.

A path is a sequence of edges from an input unit or a shift to an output unit. Each edge carries a weight (goes into
wbar) and a coefficient (goes into phi): parameter maps (Linear, conv, BatchNorm scale, learnable scale) have weight
= their Jacobian entry and coefficient 1; fixed maps (pooling averages, constants, reshapes, sums) weight 1 and
coefficient = their Jacobian entry; gates weight 1 and coefficient = the slope of the sample; max pools weight 1 and
coefficient 1 on the edge from the selected unit, 0 on the other window edges. A shift starts a path with weight b
and coefficient 1. Jacobians come from autograd on the float64 forward, independent of the pair-network rules.
"""
from __future__ import annotations

import torch
from torch import Tensor

from lightning_nsv.kernel import piece_rules as PR
from lightning_nsv.kernel import choice_rules as C
from lightning_nsv.kernel import rules as R
from lightning_nsv.kernel.graph import PiecewiseGraph, run
from lightning_nsv.kernel.linear_vocabulary import ConvTranspose

PARAMETER_MAPS = (R.Linear, R.Conv, R.BatchNorm, R.ParamScale, ConvTranspose)


class Paths:
    """Paths ending at the units of one node: ``end`` (P,), ``phi`` (n, P), ``w`` (P,)."""

    def __init__(self, end: Tensor, phi: Tensor, w: Tensor) -> None:
        self.end, self.phi, self.w = end, phi, w

    @staticmethod
    def cat(parts: list["Paths"], n: int) -> "Paths":
        if not parts:
            return Paths(torch.zeros(0, dtype=torch.long), torch.zeros(n, 0, dtype=torch.float64),
                         torch.zeros(0, dtype=torch.float64))
        return Paths(torch.cat([p.end for p in parts]), torch.cat([p.phi for p in parts], 1),
                     torch.cat([p.w for p in parts]))


def extend(paths: Paths, edges: Tensor, weight: Tensor, coefficient: Tensor) -> Paths:
    """Every path ending at unit u, continued along every edge (o, u): ``edges`` (E, 2) rows ``(o, u)``,
    ``weight`` (E,), ``coefficient`` (n, E)."""
    top = lambda t: int(t.max()) if len(t) else -1  # noqa: E731
    units = max(top(paths.end), top(edges[:, 1])) + 1
    order = torch.argsort(paths.end, stable=True)
    counts = torch.bincount(paths.end, minlength=units)
    starts = torch.cumsum(counts, 0) - counts
    per_edge = counts[edges[:, 1]]
    edge = torch.repeat_interleave(torch.arange(len(edges)), per_edge)
    offset = torch.arange(len(edge)) - torch.repeat_interleave(torch.cumsum(per_edge, 0) - per_edge, per_edge)
    source = order[starts[edges[edge, 1]] + offset]
    return Paths(edges[edge, 0], paths.phi[:, source] * coefficient[:, edge], paths.w[source] * weight[edge])


def _values(graph: PiecewiseGraph, x: Tensor) -> dict:
    """Arguments and value of every call on the float64 forward of ``x``."""
    seen = {}

    def keep(node, args, value):
        seen[node.name] = (args, value)

    run(graph, x, "forward", _NullRecorder(), after=keep)
    return seen


class _NullRecorder:
    watch_ties = False

    def record(self, name, value):
        pass


def _jacobian(rule: R.Rule, args, kwargs, position: list, dynamic_paths: list) -> tuple[Tensor, Tensor]:
    """``(J, f(0))`` of the call with respect to the dynamic argument at ``position`` (others held at 0), for
    sample 0: ``J`` (units_out, units_in), ``f(0)`` (units_out,)."""

    def with_input(value, zero_all=False):
        def replace(obj, path):
            if isinstance(obj, (list, tuple)):
                return type(obj)(replace(o, path + [i]) for i, o in enumerate(obj))
            if path in dynamic_paths:
                return value if (path == position and not zero_all) else torch.zeros_like(obj)
            return obj
        return replace(list(args), [])

    def f(value):
        return rule.forward(with_input(value), kwargs, _NullRecorder())[0].reshape(-1)

    base = rule.forward(with_input(None, zero_all=True), kwargs, _NullRecorder())[0].reshape(-1)
    original = _get(args, position)
    jac = torch.autograd.functional.jacobian(lambda v: f(v) - base, original, vectorize=True)
    return jac.reshape(base.shape[0], original.shape[0], -1)[:, 0, :], base


def _get(obj, path):
    for i in path:
        obj = obj[i]
    return obj


def _dynamic_positions(args, dynamic_values) -> list:
    found = []

    def walk(obj, path):
        if isinstance(obj, (list, tuple)):
            for i, o in enumerate(obj):
                walk(o, path + [i])
        elif isinstance(obj, Tensor) and any(obj is v for v in dynamic_values):
            found.append(path)
    walk(list(args), [])
    return found


def enumerate_paths(graph: PiecewiseGraph, x: Tensor) -> tuple[Tensor, Tensor]:
    """``(phi, wbar)``: ``phi`` (n, P) and ``wbar`` (P, K) over the paths ending at each output unit (the paths of
    output k are rows of its own; use :func:`shared_paths` for the path space shared by K outputs)."""
    paths, out_node = _all_paths(graph, x)
    return _split_outputs(paths[out_node.name], graph, x)


def _all_paths(graph: PiecewiseGraph, x: Tensor):
    x = x.to(torch.float64)
    n = len(x)
    values = _values(graph, x)
    units_in = x[0].numel()
    paths = {}
    placeholder = next(nd for nd in graph.nodes if nd.op == "placeholder")
    paths[placeholder.name] = Paths(torch.arange(units_in), x.reshape(n, -1).clone(),
                                    torch.ones(units_in, dtype=torch.float64))
    dynamic_value = {placeholder.name: x}
    for node in graph.nodes:
        if node.name not in graph.dynamic or node.op == "placeholder":
            continue
        rule = graph.rules[node.name]
        args, value = values[node.name]
        kwargs = torch.fx.node.map_arg(node.kwargs, lambda a: values[a.name][1] if a.name in values else None)
        dynamic_value[node.name] = value
        inputs = [a for a in node.all_input_nodes if a.name in graph.dynamic]
        units_out = value[0].numel() if isinstance(value, Tensor) else value[0][0].numel()
        parts = []
        if isinstance(rule, PR.ForwardOnly):  # read only by a where gate: no paths of its own
            paths[node.name] = Paths.cat([], n)
            continue
        if isinstance(rule, PR.TakeValues):
            paths[node.name] = paths[inputs[0].name]
            dynamic_value[node.name] = value[0] if isinstance(value, tuple) else value
            continue
        if isinstance(rule, PR.WhereGate):  # the slope of the piece of z, as a Leaky-ReLU gate
            z = args[rule.position]
            one = torch.ones_like(z, dtype=torch.float64)
            slope = torch.where(z >= 0, one, rule.beta * one).reshape(n, -1)
            edges = torch.stack([torch.arange(units_out)] * 2, 1)
            parts.append(extend(paths[node.args[rule.position].name], edges, torch.ones(units_out, dtype=torch.float64),
                                slope))
        elif isinstance(rule, PR.PieceGate):  # slope 1 in the linear piece; a path start of flat value per unit
            z = args[0]
            lo = -float("inf") if rule.lo is None else rule.lo
            hi = float("inf") if rule.hi is None else rule.hi
            slope = ((z >= lo) & (z <= hi)).to(torch.float64).reshape(n, -1)
            zero = torch.zeros_like(z, dtype=torch.float64)
            flat = torch.where(z < lo, zero + lo, torch.where(z > hi, zero + hi, zero)).reshape(n, -1)
            edges = torch.stack([torch.arange(units_out)] * 2, 1)
            parts.append(extend(paths[inputs[0].name], edges, torch.ones(units_out, dtype=torch.float64), slope))
            if lo not in (0.0, -float("inf")) or hi not in (0.0, float("inf")):
                parts.append(Paths(torch.arange(units_out), flat, torch.ones(units_out, dtype=torch.float64)))
        elif isinstance(rule, PR.LineMax):  # an edge from every candidate of the line, 1 where chosen
            z = args[0]
            dim = rule.dim
            index = (torch.min if rule.minimum else torch.max)(z, dim, keepdim=True).indices
            line = torch.arange(z.shape[dim]).view(*[1] * dim, -1, *[1] * (z.dim() - dim - 1))
            selected = (index == line).to(torch.float64).reshape(n, -1)
            in_units = torch.arange(z[0].numel()).view(z.shape[1:])
            out_units = torch.arange(units_out).view(*z.shape[1:dim], 1, *z.shape[dim + 1:]).expand(z.shape[1:])
            edges = torch.stack([out_units.reshape(-1), in_units.reshape(-1)], 1)
            parts.append(extend(paths[inputs[0].name], edges, torch.ones(len(edges), dtype=torch.float64), selected))
            if isinstance(value, tuple):
                dynamic_value[node.name] = value[0]
        elif isinstance(rule, R.Gate):
            below = torch.as_tensor(rule.beta, dtype=torch.float64)
            if below.dim() == 1:  # one slope per channel (PReLU)
                below = below.view(1, -1, *[1] * (args[0].dim() - 2))
            slope = torch.where(args[0] >= 0, torch.tensor(rule.gamma, dtype=torch.float64),
                                below).expand(args[0].shape).reshape(n, -1)
            edges = torch.stack([torch.arange(units_out)] * 2, 1)
            parts.append(extend(paths[inputs[0].name], edges, torch.ones(units_out, dtype=torch.float64), slope))
        elif isinstance(rule, C.Select):  # an edge from each branch, coefficient 1 where that branch is chosen
            a, b = args[0].reshape(n, -1), args[1].reshape(n, -1)
            first = (a <= b if rule.minimum else a >= b).to(torch.float64)
            edges = torch.stack([torch.arange(units_out)] * 2, 1)
            ones = torch.ones(units_out, dtype=torch.float64)
            parts.append(extend(paths[inputs[0].name], edges, ones, first))
            parts.append(extend(paths[inputs[1].name], edges, ones, 1 - first))
        elif isinstance(rule, C.MaxPool):
            parts.append(_max_pool_paths(rule, args[0], paths[inputs[0].name]))
        else:
            dynamic_paths = _dynamic_positions(args, [dynamic_value[a.name] for a in inputs])
            sources = [(p, next(a for a in inputs if _get(args, p) is dynamic_value[a.name])) for p in dynamic_paths]
            base = None
            for position, source in sources:
                jac, base = _jacobian(rule, args, kwargs, position, dynamic_paths)
                edges = torch.nonzero(jac)
                entry = jac[edges[:, 0], edges[:, 1]]
                if isinstance(rule, PARAMETER_MAPS):
                    weight, coefficient = entry, torch.ones(n, len(edges), dtype=torch.float64)
                else:
                    weight, coefficient = torch.ones(len(edges), dtype=torch.float64), entry.expand(n, -1)
                parts.append(extend(paths[source.name], edges, weight, coefficient))
            if _starts(rule):
                parts.append(Paths(torch.arange(units_out), torch.ones(n, units_out, dtype=torch.float64),
                                   base.clone()))
        paths[node.name] = Paths.cat(parts, n)
    out_node = next(nd for nd in graph.nodes if nd.op == "output").args[0]
    return paths, out_node


def _starts(rule: R.Rule) -> bool:
    if isinstance(rule, (R.Linear, R.Conv, ConvTranspose)):
        return rule.bias is not None
    return isinstance(rule, (R.BatchNorm, R.Shift))


def _max_pool_paths(rule: C.MaxPool, z: Tensor, paths: Paths) -> Paths:
    n, channels = z.shape[0], z.shape[1]
    plane = z[0, 0].numel()
    units_in = z[0].numel()
    basis = torch.eye(units_in, dtype=torch.float64).reshape(units_in, *z.shape[1:])
    member = rule.pool(basis)[0].reshape(units_in, -1).T > 0.5  # (units_out, units_in): u in the window of o
    edges = torch.nonzero(member)
    _, index = rule.pool(z)
    index = index.reshape(n, -1)  # flat index within the channel plane
    out_per_channel = index.shape[1] // channels
    channel = edges[:, 0] // out_per_channel
    selected = (index[:, edges[:, 0]] + channel * plane) == edges[:, 1]
    return extend(paths, edges, torch.ones(len(edges), dtype=torch.float64), selected.to(torch.float64))


def _split_outputs(paths: Paths, graph: PiecewiseGraph, x: Tensor) -> tuple[Tensor, Tensor]:
    k = graph.num_outputs
    wbar = torch.zeros(len(paths.w), k, dtype=torch.float64)
    wbar[torch.arange(len(paths.w)), paths.end] = paths.w
    return paths.phi, wbar


def output_phi(graph: PiecewiseGraph, x: Tensor, output: int) -> tuple[Tensor, Tensor]:
    """``(phi, wbar)`` of the paths ending at one output unit."""
    paths, out_node = _all_paths(graph, x)
    p = paths[out_node.name]
    keep = p.end == output
    return p.phi[:, keep], p.w[keep]


def shared_paths(graph: PiecewiseGraph, x: Tensor, last_linear: str) -> tuple[Tensor, Tensor]:
    """DESIGN.md §2b: the path space shared by K outputs of a final Linear ``A``, ``c``: the paths reaching its inputs
    plus the bias start; ``wbar_k`` = path weight × ``A[k, j]`` (or ``c_k``). Returns ``phi`` (n, P) and ``wbar``
    (P, K)."""
    paths, _ = _all_paths(graph, x)
    node = next(nd for nd in graph.nodes if nd.name == last_linear)
    rule = graph.rules[last_linear]
    p = paths[node.args[0].name]
    wbar = p.w[:, None] * rule.weight.T[p.end]  # (P, K)
    phi = p.phi
    if rule.bias is not None:
        phi = torch.cat([phi, torch.ones(len(x), 1, dtype=torch.float64)], 1)
        wbar = torch.cat([wbar, rule.bias[None, :]])
    return phi, wbar
