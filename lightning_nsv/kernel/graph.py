"""Trace a user's module into the operation table of DESIGN.md §2c (torch.fx), or refuse it by name.

:func:`trace` reads ``forward`` with ``torch.fx.symbolic_trace`` semantics (residual sums, ``F.relu``, ``flatten``,
``x.mean((2, 3))``, ``torch.cat``, learnable scales and shifts) and gives every call a rule of
:mod:`lightning_nsv.kernel.rules`. The graph is a float64 snapshot of the weights on the module's device; the
module itself is neither copied nor changed (no ``.eval()``, no ``.double()``): trace again after the weights change.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import torch
import torch.fx as fx
from torch import Tensor, nn

from lightning_nsv.errors import NonFiniteError
from lightning_nsv.kernel import rules as R
from lightning_nsv.kernel.linear_vocabulary import len_as_size, rewrite
from lightning_nsv.kernel.table import NotPiecewiseLinearError, Classifier, is_leaky_family

__all__ = ["GateLayer", "NotPiecewiseLinearError", "PiecewiseGraph", "PoolLayer", "fx_graph", "run", "trace"]


class GateLayer(NamedTuple):
    """A gate layer (Leaky-ReLU family, PReLU): fx node ``name``, ``where`` for messages, slopes (``beta`` a number
    or a float64 tensor of one per channel), unit shape of one sample."""

    name: str
    where: str
    beta: Any
    gamma: float
    shape: tuple[int, ...]


class PoolLayer(NamedTuple):
    """A max pool, or another choice recorded as an index (the piece of a Hardtanh/clamp unit, a max over a dim):
    fx node ``name``, ``where`` for messages, the shape of its selections for one sample."""

    name: str
    where: str
    shape: tuple[int, ...]


class _Tracer(fx.Tracer):
    """Keeps the package's Leaky-ReLU-family module a leaf (one gate, not its ``torch.where``); ``len(x)`` in
    ``forward`` is a size."""

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return is_leaky_family(m) or super().is_leaf_module(m, qualname)

    def trace(self, root, concrete_args=None):
        with len_as_size(root):
            return super().trace(root, concrete_args)


@dataclass
class PiecewiseGraph:
    """A traced module: fx nodes in order, one rule per call, float64 constants, probe shapes (batch dim dropped).

    Attributes:
        gates: one :class:`GateLayer` per gate layer, ``pools`` one :class:`PoolLayer` per max pool, in order.
        chain: ``(linear rules, gate rules)`` when the graph is a plain Linear/Leaky-ReLU chain (§1's fast path).
    """

    nodes: list[fx.Node]
    rules: dict[str, R.Rule]
    consts: dict[str, Any]
    frees: list[list[fx.Node]]
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    device: torch.device
    gates: list[GateLayer]
    pools: list[PoolLayer]
    peak_elements: int  # float64 values alive at once per sample (a pair) in a run, with headroom for temporaries
    chain: tuple[list[R.Linear], list[R.Gate]] | None = None
    dynamic: frozenset[str] = frozenset()  # nodes whose value depends on the input (the placeholder included)
    pair_program: Any = None  # the compiled pair network (kernel.fused.pair_program), or why it cannot be

    @property
    def num_outputs(self) -> int:
        return 1 if len(self.output_shape) == 0 else self.output_shape[0]

    def maps(self) -> list[R.Rule]:
        return [rule for rule in self.rules.values() if rule.is_map]


def fx_graph(module: nn.Module) -> fx.Graph:
    """``module.forward`` as an fx graph (the package's Leaky-ReLU-family modules kept as leaves, ``len(x)`` a size),
    or :class:`NotPiecewiseLinearError` saying why torch.fx cannot read it."""
    try:
        return _Tracer().trace(module)
    except Exception as err:  # fx raises TraceError, TypeError, … on data-dependent control flow
        if "'len' is not supported" in str(err):
            raise NotPiecewiseLinearError(
                f"{type(module).__name__}.forward calls len() on a tensor, which torch.fx cannot trace (it is a "
                "size, not control flow): write x.size(0) or x.shape[0] instead") from None
        if "Proxy object cannot be iterated" in str(err):
            raise NotPiecewiseLinearError(
                f"{type(module).__name__}.forward iterates over a tensor or over the pieces of a split, whose number "
                "torch.fx does not know when tracing: take the pieces by index (a, b = x.chunk(2, 1); "
                "pieces[0] + pieces[1])") from None
        raise NotPiecewiseLinearError(
            f"torch.fx could not trace {type(module).__name__}.forward ({type(err).__name__}: {err}). Control flow "
            "that depends on tensor values (if/for on x) cannot be traced; write it without, or move that part into "
            f"a trunk treated as a fixed embedding (`embedding=`).") from None


def trace(module: nn.Module, example: Tensor) -> PiecewiseGraph:
    """The operation graph of ``module`` (DESIGN.md §2c), or :class:`NotPiecewiseLinearError` naming what is not.

    Args:
        module: takes a batch of inputs and returns ``(n,)`` or ``(n, K)`` logits; not changed.
        example: a few inputs (``(n, ...)``, any float dtype) for the shapes and a check that the graph reproduces
            the module's output.
    """
    graph = fx_graph(module)
    gm = fx.GraphModule(module, graph)
    param = next(iter(module.parameters()), None)
    device = param.device if param is not None else example.device
    rewrite(gm, module, example, device)
    classifier = Classifier(gm, device)
    nodes = list(graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    if len(placeholders) != 1:
        raise NotPiecewiseLinearError(f"{type(module).__name__}.forward takes {len(placeholders)} arguments; the "
                                      "path kernel needs a module of one input batch")
    rules: dict[str, R.Rule] = {}
    for node in nodes:
        if node.op == "placeholder":
            classifier.dynamic.add(node)
        elif node.op == "get_attr":
            classifier.const(node.target)
        elif node.op != "output":
            rules[node.name] = classifier.classify(node)
    rules.update(classifier.overrides)
    result_node = nodes[-1].args[0]
    if not isinstance(result_node, fx.Node) or result_node not in classifier.dynamic:
        raise NotPiecewiseLinearError(f"{type(module).__name__}.forward returns {result_node!r}; the path kernel "
                                      "needs one tensor of logits, (n,) or (n, K), that depends on the input")
    frees = _frees(nodes)
    result = PiecewiseGraph(nodes, rules, classifier.consts, frees, (), (), device, [], [], 0)
    _probe(result, module, example, classifier)
    return result


def _frees(nodes: list[fx.Node]) -> list[list[fx.Node]]:
    """After step ``i``, the values no later step reads."""
    last = {}
    for i, node in enumerate(nodes):
        for arg in node.all_input_nodes:
            last[arg] = i
    frees: list[list[fx.Node]] = [[] for _ in nodes]
    for node, i in last.items():
        frees[i].append(node)
    return frees


class ForwardContext(Protocol):
    """What a rule's ``forward`` writes to (:mod:`lightning_nsv.kernel.rules`): the choices of its gates, max pools
    and selections (``record``) and, where ``watch_ties``, the samples with a choice within
    :data:`~lightning_nsv.kernel.ties.TIE` of its other side (``tie``: a bool per sample)."""

    watch_ties: bool

    def record(self, name: str, value: Tensor) -> None: ...
    def tie(self, samples: Tensor) -> None: ...


class Recorder:
    """Forward-mode context: keeps what gates, max pools and selections record, and which samples had a near-tie."""

    def __init__(self, watch_ties: bool = False) -> None:
        self.records: dict[str, Tensor] = {}
        self.watch_ties, self.ties = watch_ties, None

    def record(self, name: str, value: Tensor) -> None:
        self.records[name] = value

    def tie(self, samples: Tensor) -> None:
        self.ties = samples if self.ties is None else self.ties | samples



def run(graph: PiecewiseGraph, x: Tensor, mode: str, ctx=None, capture: str | None = None,
        after=None) -> Tensor:
    """Evaluate ``graph`` on ``x`` in ``mode`` (``forward``, ``pair``, ``factored``, ``norm`` or ``program``, see
    :mod:`rules`): each node's rule in that mode, with ``ctx`` (a :class:`ForwardContext`, a
    :class:`~lightning_nsv.kernel.factored.PairContext` or :class:`~lightning_nsv.kernel.factored.FactoredContext`,
    a :class:`~lightning_nsv.kernel.pair_program.ProgramContext`); with ``capture`` the value of that node instead of
    the output; ``after(node, args, value)`` sees every call."""
    env: dict[fx.Node, Any] = {}
    for i, node in enumerate(graph.nodes):
        if node.op == "placeholder":
            value = x
        elif node.op == "get_attr":
            value = graph.consts[node.target]
        elif node.op == "output":
            return env[node.args[0]]
        else:
            args = fx.node.map_arg(node.args, env.__getitem__)
            kwargs = fx.node.map_arg(node.kwargs, env.__getitem__)
            rule = graph.rules[node.name]
            if mode == "forward":
                value = rule.forward(args, kwargs, ctx)
            elif mode == "pair":
                value = rule.pair(args, kwargs, ctx)
            elif mode == "factored":
                value = rule.factored(args, kwargs, ctx)
            elif mode == "program":
                value = rule.program(args, kwargs, ctx)
            else:
                value = rule.norm(args, kwargs)
            if after is not None:
                after(node, args, value)
        if node.name == capture:
            return value
        env[node] = value
        for dead in graph.frees[i]:
            del env[dead]
    raise AssertionError("an fx graph ends with its output node")


PROBE_SAMPLES = 3  # the probe's batch: a reshape that mixes samples changes its first dim


def _probe(graph: PiecewiseGraph, module: nn.Module, example: Tensor, classifier: Classifier) -> None:
    """One forward of a few samples: binds every rule to its shapes, checks the batch axis and the output against
    the module's own, fills in the graph's shapes, gates, pools, memory estimate and chain."""
    example = example[:PROBE_SAMPLES]
    if len(example) == 0:
        raise ValueError("trace needs at least one example input")
    example = example[torch.arange(PROBE_SAMPLES) % len(example)]
    x = example.detach().to(graph.device, torch.float64)

    env_shapes: dict[str, tuple[int, ...]] = {}

    def bind(node, args, value):  # each rule learns its shapes right after its own step
        if node not in classifier.dynamic:
            return
        dynamic = [a for a in node.all_input_nodes if a in classifier.dynamic]
        in_shape = tuple(x.shape) if dynamic[0].op == "placeholder" else env_shapes[dynamic[0].name]
        rule = graph.rules[node.name]
        value = value[0] if isinstance(value, tuple) else value  # a max's (values, indices)
        rule.in_shape, rule.out_shape = in_shape, tuple(value.shape)
        rule.bind(in_shape, tuple(value.shape))
        env_shapes[node.name] = tuple(value.shape)

    out = run(graph, x, "forward", Recorder(), after=bind)
    _check_output(graph, module, example, out)
    graph.input_shape, graph.output_shape = tuple(x.shape[1:]), tuple(out.shape[1:])
    graph.gates = [GateLayer(name, where, beta, gamma, env_shapes[name][1:])
                   for name, where, beta, gamma in classifier.gates]
    graph.pools = [PoolLayer(name, where, env_shapes[name][1:]) for name, where in classifier.pools]
    graph.peak_elements = _peak_elements(graph, env_shapes, math.prod(graph.input_shape))
    graph.chain = _chain(graph, classifier, env_shapes)
    graph.dynamic = frozenset(n.name for n in classifier.dynamic)
    _mark_collapsible_gates(graph, classifier)
    _mark_summed_maps(graph, classifier)


def _check_output(graph: PiecewiseGraph, module: nn.Module, example: Tensor, out: Tensor) -> None:
    """The output is ``(n,)`` or ``(n, K)``, finite, and the module's own (in its dtype) up to rounding."""
    where = type(module).__name__
    if out.dim() not in (1, 2):
        raise ValueError(f"{where} returns a tensor of shape {tuple(out.shape)}; the path kernel needs (n,) or (n, K) "
                         "logits")
    if not torch.isfinite(out).all():
        raise NonFiniteError(f"{where}: the float64 forward of the example inputs is not finite")
    param = next(iter(module.parameters()), None)
    dtype = param.dtype if param is not None else example.dtype
    with torch.no_grad():
        theirs = module(example.to(graph.device, dtype)).to(torch.float64)
    tolerance = 10 * torch.finfo(dtype).eps ** 0.5 * (1 + float(theirs.abs().max()))
    if theirs.shape != out.shape or float((theirs - out).abs().max()) > tolerance:
        raise ValueError(f"{where}: the traced graph does not reproduce the module's output (shapes "
                         f"{tuple(out.shape)} and {tuple(theirs.shape)}, largest difference "
                         f"{float((theirs - out).abs().max()) if theirs.shape == out.shape else float('nan'):.3g}); "
                         "in-place operations whose effect fx does not see, or state that changes between calls, "
                         "can cause this")


def _peak_elements(graph: PiecewiseGraph, shapes: dict[str, tuple], input_elements: int) -> int:
    """Values alive at once in a run, per sample, plus twice the largest one (temporaries, gate products)."""
    size = {name: math.prod(shape[1:]) for name, shape in shapes.items()}
    live: dict[str, int] = {}
    peak = largest = input_elements
    for i, node in enumerate(graph.nodes):
        if node.name in size:
            live[node.name] = size[node.name]
            largest = max(largest, size[node.name])
        peak = max(peak, input_elements + sum(live.values()))
        for dead in graph.frees[i]:
            live.pop(dead.name, None)
    return peak + 2 * largest


_FLATTENS = ("flatten", torch.flatten, "view", "reshape", torch.reshape)


def _chain(graph: PiecewiseGraph, classifier: Classifier, shapes: dict) -> tuple | None:
    """``(linears, gates)`` when the dynamic steps are: reshapes of the input to ``(n, f)``, then Linear, gate, …,
    Linear, then reshapes (§1's factorised kernel applies); else ``None``."""
    steps = [n for n in graph.nodes if n in classifier.dynamic and n.op != "placeholder"]
    previous = next(n for n in graph.nodes if n.op == "placeholder")
    linears, gates, state = [], [], "input"
    for node in steps:
        inputs = [a for a in node.all_input_nodes if a in classifier.dynamic]
        if inputs != [previous]:
            return None
        previous = node
        rule = graph.rules[node.name]
        if isinstance(rule, R.Identity):
            continue
        flattening = node.target in _FLATTENS or (
            node.op == "call_module" and isinstance(classifier.gm.get_submodule(node.target), nn.Flatten))
        if state == "input" and flattening:
            continue
        if isinstance(rule, R.Linear) and state in ("input", "gate") and len(shapes[node.name]) == 2:
            linears.append(rule)
            state = "linear"
        elif isinstance(rule, R.Gate) and state == "linear" and not isinstance(rule.beta, Tensor):
            gates.append(rule)  # one slope below 0 (§1's formulas; a PReLU per channel takes the pair network)
            state = "gate"
        elif state in ("linear", "output") and isinstance(rule, (R.Passthrough, R.Squeeze)):
            state = "output"
        else:
            return None
    if state not in ("linear", "output") or len({rule.bias is None for rule in linears}) != 1:
        return None
    return linears, gates


def _constant_channels(node: fx.Node, graph: PiecewiseGraph) -> bool:
    """Whether the pair network's value at ``node`` is the same in every channel: a groups=1 conv, then shifts
    (BatchNorm, bias, identity) that keep the shape."""
    rule = graph.rules.get(node.name)
    if isinstance(rule, R.Conv):
        return rule.groups == 1
    if isinstance(rule, (R.BatchNorm, R.Identity, R.Shift)):
        source = [a for a in node.all_input_nodes if a.name in graph.dynamic]
        return len(source) == 1 and rule.in_shape == rule.out_shape and _constant_channels(source[0], graph)
    return False


def _mark_collapsible_gates(graph: PiecewiseGraph, classifier: Classifier) -> None:
    """DESIGN.md §2c "Speed": a gate whose input is constant over channels and whose only reader sums over its
    channels (a groups=1 conv, or a flatten from dim 1 read only by a Linear) passes one channel of pair values."""
    for node in graph.nodes:
        rule = graph.rules.get(node.name)
        if not isinstance(rule, R.Gate) or len(rule.in_shape) < 3 or len(node.users) != 1:
            continue
        user = next(iter(node.users))
        reader = graph.rules.get(user.name)
        sums = isinstance(reader, R.Conv) and reader.groups == 1
        if not sums and _flattens_from_one(user, classifier) and len(user.users) == 1:
            sums = isinstance(graph.rules.get(next(iter(user.users)).name), R.Linear)
        rule.collapse = sums and _constant_channels(node.all_input_nodes[0], graph)


def _mark_summed_maps(graph: PiecewiseGraph, classifier: Classifier) -> None:
    """A fixed map whose only reader is a flatten from dim 1 whose only reader is a Linear (whose pair form sums every
    entry of its input): the factored network passes its channel sum (:meth:`~lightning_nsv.kernel.rules.FixedMap.
    factored`)."""
    for node in graph.nodes:
        rule = graph.rules.get(node.name)
        if not isinstance(rule, R.FixedMap) or len(node.users) != 1:
            continue
        flat = next(iter(node.users))
        rule.summed = bool(flat.args) and flat.args[0] is node and len(flat.users) == 1 and \
            _flattens_from_one(flat, classifier) and isinstance(graph.rules.get(next(iter(flat.users)).name), R.Linear)


def _flattens_from_one(node: fx.Node, classifier: Classifier) -> bool:
    if node.op == "call_module":
        m = classifier.gm.get_submodule(node.target)
        return isinstance(m, nn.Flatten) and m.start_dim == 1 and m.end_dim == -1
    return node.target in ("flatten", torch.flatten) and _arg_value(node, 1, "start_dim", 0) == 1 and \
        _arg_value(node, 2, "end_dim", -1) == -1


def _arg_value(node: fx.Node, index: int, key: str, default):
    return node.args[index] if len(node.args) > index else node.kwargs.get(key, default)
