"""Cut a module at the input of one of its submodules (issue 44): the part before the cut (``before``, the input to
the cut value) and after it (``after``, the cut value to the output), both fx GraphModules over the module's own
submodules. A cut is a point every path from the input to the output passes through; one that a skip connection
crosses is refused, naming the value that bypasses it."""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx as fx
from torch import Tensor, nn

from lightning_nsv.kernel.graph import fx_graph

__all__ = ["INPUT", "Cut", "Float64Embedding", "cut_network", "valid_cuts"]

INPUT = "input"  # the cut at the module's input (unless a submodule is called so)
_MAPS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
EMBED_BATCH = 1024  # samples embedded at once


@dataclass(frozen=True)
class Cut:
    """``module`` cut at the input of its submodule ``name``: ``before`` maps the module's input to the cut value (fx
    node ``node``), ``after`` the cut value to the module's output."""

    name: str
    node: str
    before: fx.GraphModule
    after: fx.GraphModule


def _dynamic(graph: fx.Graph) -> set[fx.Node]:
    """The nodes whose value depends on the input."""
    dynamic: set[fx.Node] = set()
    for node in graph.nodes:
        if node.op == "placeholder" or any(a in dynamic for a in node.all_input_nodes):
            dynamic.add(node)
    return dynamic


def _cut_node(graph: fx.Graph, module: nn.Module, name: str, dynamic: set[fx.Node]) -> fx.Node:
    """The node whose value enters submodule ``name``, refused where there is no single one."""
    nodes = list(graph.nodes)
    if name == INPUT and INPUT not in dict(module.named_modules()):
        return nodes[0]
    where = type(module).__name__
    known = dict(module.named_modules())
    if name not in known or name == "":
        names = [n for n in known if n][:12]
        raise ValueError(f"{where} has no submodule {name!r} to cut at; `from:NAME` names a module of "
                         f"named_modules() (e.g. {', '.join(names)}) or '{INPUT}'")
    inside = [n for n in nodes if name in _module_stack(n) or (n.op == "call_module" and n.target == name)]
    if not inside:
        raise ValueError(f"{where}.forward never calls its submodule `{name}`: there is no cut there")
    entering = {a for n in inside for a in n.all_input_nodes if a in dynamic and a not in inside}
    if len(entering) != 1:
        raise ValueError(f"`{name}` of {where} reads {len(entering)} values from before it (" +
                         ", ".join(f"`{a.name}`" for a in entering) + "): it is called more than once or on several "
                         "inputs; a cut is the single input of a module: name another module")
    return entering.pop()


def _module_stack(node: fx.Node) -> set[str]:
    """The qualified names of the modules whose ``forward`` recorded ``node`` (fx keeps them in its meta, keyed by the
    qualified name, with ``(qualified name, type)`` values in recent torch)."""
    stack = node.meta.get("nn_module_stack", {})
    return set(stack) | {value[0] for value in stack.values() if isinstance(value, tuple) and value}


def _descendants(node: fx.Node) -> set[fx.Node]:
    seen, stack = set(), [node]
    while stack:
        for user in stack.pop().users:
            if user not in seen:
                seen.add(user)
                stack.append(user)
    return seen


def _bypass(graph: fx.Graph, cut: fx.Node, dynamic: set[fx.Node]) -> tuple[fx.Node, fx.Node] | None:
    """A value that does not pass through the cut, read after it ``(value, reader)``, or ``None`` where every path
    passes the cut."""
    after = _descendants(cut)
    for node in graph.nodes:
        if node in after:
            for arg in node.all_input_nodes:
                if arg in dynamic and arg is not cut and arg not in after:
                    return arg, node
    return None


def _copy(graph: fx.Graph, keep: Callable[[fx.Node], bool], start: fx.Node | None = None) -> tuple[fx.Graph, dict]:
    """The nodes of ``graph`` that ``keep`` selects, in order, into a new graph whose input (a placeholder ``x``)
    stands for ``start`` where given; with the map from old nodes to new ones (the output node left out)."""
    new, env = fx.Graph(), {}
    if start is not None:
        env[start] = new.placeholder("x")
    for node in graph.nodes:
        if node not in env and node.op != "output" and keep(node):
            env[node] = new.node_copy(node, env.__getitem__)
    return new, env


def cut_network(module: nn.Module, name: str) -> Cut:
    """``module`` cut at the input of its submodule ``name`` (``"input"``: the module's own input).

    Raises:
        ValueError: where ``name`` is no submodule, is called more than once or on several inputs, or a connection
            crosses the cut (the refusal names the value that bypasses it and the operation that reads it).
        NotPiecewiseLinearError: where torch.fx cannot read ``forward``.
    """
    graph = fx_graph(module)
    dynamic = _dynamic(graph)
    cut = _cut_node(graph, module, name, dynamic)
    out = next(n for n in graph.nodes if n.op == "output")
    crossing = _bypass(graph, cut, dynamic)
    if crossing is not None or out not in _descendants(cut):
        what = ("the output does not depend on it" if crossing is None else
                f"the value `{crossing[0].name}`{_of_module(crossing[0])}, which does not pass through it, is read "
                f"by `{crossing[1].name}` after it ({crossing[1].format_node().strip()})")
        raise ValueError(f"{type(module).__name__} cannot be cut at `{name}` (fx node `{cut.name}`): {what}; a cut "
                         "is a point every path from the input to the output passes through, such as the input of "
                         "a residual block or of a top-level layer, not inside a skip connection")
    after_nodes = _descendants(cut)
    after, env = _copy(graph, lambda n: n in after_nodes or n not in dynamic, start=cut)  # constants copied too
    after.output(fx.node.map_arg(out.args[0], env.__getitem__))
    before, env = _copy(graph, lambda n: n not in after_nodes)
    before.output(env[cut])
    label = type(module).__name__
    return Cut(name, cut.name, _module(module, before, f"{label}_before"),
               _module(module, after, f"{label}_from_{name.replace('.', '_')}"))


def _of_module(node: fx.Node) -> str:
    return f" (the output of `{node.target}`)" if node.op == "call_module" else ""


def _module(root: nn.Module, graph: fx.Graph, class_name: str) -> fx.GraphModule:
    module = fx.GraphModule(root, graph, class_name=class_name)
    module.graph.eliminate_dead_code()
    module.recompile()
    return module


def valid_cuts(module: nn.Module, every: bool = False) -> list[str]:
    """The names of the valid cuts of ``module`` in order of depth, ``"input"`` first: one name per cut point (the
    outermost module that starts there); without ``every`` only those at a module holding a Linear or a convolution
    (the inputs of layers and residual blocks, the head's first Linear) after some parameter (not the input again,
    flattened)."""
    graph = fx_graph(module)
    dynamic, order = _dynamic(graph), {n: i for i, n in enumerate(graph.nodes)}
    out = next(n for n in graph.nodes if n.op == "output")
    found: dict[fx.Node, str] = {next(iter(graph.nodes)): INPUT}
    for name, sub in module.named_modules():
        if not name or not (every or any(isinstance(m, _MAPS) for m in sub.modules())):
            continue
        try:
            node = _cut_node(graph, module, name, dynamic)
        except ValueError:
            continue
        if (node not in found and _bypass(graph, node, dynamic) is None and out in _descendants(node)
                and (every or _weighted(module, node))):
            found[node] = name
    return [found[n] for n in sorted(found, key=order.__getitem__)]


def _weighted(module: nn.Module, node: fx.Node) -> bool:
    """Whether a parameter acts before ``node`` (else the cut is the input's, up to parameter-free maps)."""
    seen, stack = set(), [node]
    while stack:
        current = stack.pop()
        if current.op == "get_attr" or (current.op == "call_module" and any(
                True for _ in module.get_submodule(current.target).parameters())):
            return True
        for arg in current.all_input_nodes:
            if arg not in seen:
                seen.add(arg)
                stack.append(arg)
    return False


class Float64Embedding(nn.Module):
    """``h(x)``: the part before a cut, run in float64 and eval mode on a copy of its current weights, on the
    module's device."""

    def __init__(self, before: fx.GraphModule) -> None:
        super().__init__()
        self.before = before

    def forward(self, x: Tensor) -> Tensor:
        exact = copy.deepcopy(self.before).to(torch.float64).eval()
        tensor = next(iter(self.before.parameters()), next(iter(self.before.buffers()), x))
        with torch.no_grad():
            parts = [exact(x[i:i + EMBED_BATCH].to(tensor.device, torch.float64, copy=True))  # in-place ops: a copy
                     for i in range(0, len(x), EMBED_BATCH)]
        return torch.cat(parts) if parts else exact(x.to(tensor.device, torch.float64, copy=True))


