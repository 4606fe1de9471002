"""Linear maps of DESIGN.md §2c's table written in terms of others, and the transposed convolution's rule.

Before the table reads a traced graph, :func:`rewrite` puts two operations into the table's own terms:

- a convolution with ``padding_mode`` reflect, replicate or circular becomes its padding (an ``F.pad`` node, a
  fixed map of each plane) followed by the convolution without padding: one edge per (weight, input, output), so
  the pair network counts the weights that join two units (2 or 4 at a reflected border);
- ``chunk``, ``split``, ``unbind`` and ``narrow`` become the slices they take (``x[:, a:b]``, ``x[:, i]``), read
  by index, by a slice of the pieces or as the whole tuple.

:func:`len_as_size` lets ``len(x)`` trace as a size (as ``x.size(0)``); :class:`ConvTranspose` is a parameter map
(its weights in ``wbar``) whose program form is the all-ones kernel's map of one plane, probed on unit inputs.
"""
from __future__ import annotations

import builtins
import contextlib
import operator
from types import SimpleNamespace

import torch
import torch.fx as fx
import torch.fx.passes.shape_prop  # noqa: F401 (fx.passes.shape_prop)
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_nsv.kernel.refusals import BUFFER, TRUNK, refuse
from lightning_nsv.kernel.rules import Conv, Linear, Rule

__all__ = ["ConvTranspose", "function_rule", "len_as_size", "module_rule", "rewrite", "unpadded"]

UNPADDED = "lightning_nsv.unpadded"  # node.meta key: a convolution whose padding is the F.pad node before it
_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_CONV_FUNCTIONS = {F.conv1d: 1, F.conv2d: 2, F.conv3d: 3, torch.conv1d: 1, torch.conv2d: 2, torch.conv3d: 3}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
_CONV_T_FUNCTIONS = {F.conv_transpose1d: 1, F.conv_transpose2d: 2, F.conv_transpose3d: 3,
                     torch.conv_transpose1d: 1, torch.conv_transpose2d: 2, torch.conv_transpose3d: 3}
_CONV_T_MODULES = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
_MATMUL = {operator.matmul, torch.matmul, torch.mm, "matmul", "mm", "__matmul__"}
SPLITS = {torch.chunk, torch.split, torch.unbind, torch.narrow, "chunk", "split", "unbind", "narrow"}


# ------------------------------------------------------------------------------------------------------ len(x)
def _traced_len(obj):
    if isinstance(obj, fx.Proxy):
        return obj.tracer.create_proxy("call_function", builtins.len, (obj,), {})
    return builtins.len(obj)


@contextlib.contextmanager
def len_as_size(root: nn.Module):
    """While tracing, ``len`` in the ``forward`` of ``root`` and its submodules (their modules' globals, torch's
    own left alone) records ``len(x)`` as a size node instead of raising."""
    patched = []
    try:
        for m in root.modules():
            forward = getattr(type(m), "forward", None)
            space = getattr(forward, "__globals__", None)
            if space is None or type(m).__module__.startswith("torch.") or "len" in space or \
                    any(space is p for p in patched):
                continue
            space["len"] = _traced_len
            patched.append(space)
        yield
    finally:
        for space in patched:
            if space.get("len") is _traced_len:
                del space["len"]


# ------------------------------------------------------------------------------------------------ rewrites
def rewrite(gm: fx.GraphModule, module: nn.Module, example: Tensor, device) -> None:
    """Padded convolutions and splits in the table's terms (module docstring); ``gm.code`` is left as traced."""
    graph = gm.graph
    splits = [n for n in graph.nodes if n.op in ("call_function", "call_method") and n.target in SPLITS]
    if splits:  # before the padded convolutions: the shapes come from running the graph as traced
        param = next(iter(module.parameters()), None)
        dtype = param.dtype if param is not None else example.dtype
        saved = [b.detach().clone() for b in module.buffers()]  # a forward in training mode updates BatchNorm's
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                fx.passes.shape_prop.ShapeProp(gm).propagate(example[:2].to(device, dtype))
        except Exception:  # noqa: BLE001 - the table refuses the splits left
            splits = []
        finally:
            with torch.no_grad():
                for buffer, value in zip(module.buffers(), saved):
                    buffer.copy_(value)
        for node in splits:
            _slices(graph, node)
    for node in list(graph.nodes):
        if node.op == "call_module" and isinstance(gm.get_submodule(node.target), _CONVS):
            conv = gm.get_submodule(node.target)
            if conv.padding_mode != "zeros" and len(node.args) == 1 and not node.kwargs:
                with graph.inserting_before(node):
                    pad = graph.call_function(F.pad, (node.args[0], tuple(conv._reversed_padding_repeated_twice)),
                                              {"mode": conv.padding_mode})
                pad.meta = dict(node.meta)
                node.args = (pad,)
                node.meta[UNPADDED] = True


def _slices(graph: fx.Graph, node: fx.Node) -> None:
    """A split becomes slices of its input, read by index, by a slice of the pieces or whole (left as it is where its
    sizes or an index are computed inside forward: the table refuses it)."""
    name = node.target if isinstance(node.target, str) else node.target.__name__
    source = node.args[0]
    meta = source.meta.get("tensor_meta") if isinstance(source, fx.Node) else None
    keys = {"chunk": ("chunks", "dim"), "split": ("split_size", "dim"), "unbind": ("dim",),
            "narrow": ("dim", "start", "length")}[name]
    settings = dict(zip(keys, node.args[1:]))
    for key, value in node.kwargs.items():
        settings["split_size" if key == "split_size_or_sections" else key] = value
    computed = []
    fx.node.map_arg(settings, computed.append)
    if meta is None or computed:
        return
    shape = tuple(meta.shape)
    dim = settings.get("dim", 0)
    dim = dim + len(shape) if dim < 0 else dim
    units = torch.arange(shape[dim])
    lead = (slice(None),) * dim
    if name == "narrow":
        piece = units.narrow(0, settings["start"], settings["length"])
        if len(piece) == 0:
            return
        node.op, node.target, node.kwargs = "call_function", operator.getitem, {}
        node.args = (source, lead + (slice(int(piece[0]), int(piece[0]) + len(piece)),))
        return
    if any(u.op == "call_function" and u.target is operator.getitem and not isinstance(u.args[1], (int, slice))
           for u in node.users):
        return
    if name == "unbind":
        index = [lead + (i,) for i in range(shape[dim])]
    else:
        pieces = units.chunk(settings["chunks"]) if name == "chunk" else units.split(settings["split_size"])
        starts = [sum(len(p) for p in pieces[:k]) for k in range(len(pieces))]
        index = [lead + (slice(a, a + len(p)),) for a, p in zip(starts, pieces)]
    whole = []  # the pieces as slice nodes, for readers of the whole tuple or of a slice of it

    def pieces_of(part: slice) -> tuple[fx.Node, ...]:
        if not whole:
            with graph.inserting_after(node):
                whole.extend(graph.call_function(operator.getitem, (source, i)) for i in reversed(index))
            whole.reverse()
        return tuple(whole[part])

    for user in list(node.users):
        if user.op == "call_function" and user.target is operator.getitem and isinstance(user.args[1], int):
            user.args = (source, index[user.args[1]])
        elif user.op == "call_function" and user.target is operator.getitem and isinstance(user.args[1], slice):
            for reader in list(user.users):  # x.chunk(2, 1)[::-1] read whole
                reader.args, reader.kwargs = fx.node.map_arg((reader.args, reader.kwargs),
                                                             lambda a: pieces_of(user.args[1]) if a is user else a)
            graph.erase_node(user)
        else:  # torch.cat(x.chunk(2, 1), 1)
            user.args, user.kwargs = fx.node.map_arg((user.args, user.kwargs),
                                                     lambda a: pieces_of(slice(None)) if a is node else a)
    graph.erase_node(node)


# --------------------------------------------------------------------------------------------- the table
def unpadded(conv: nn.Module) -> SimpleNamespace:
    """The settings of ``conv`` without its padding (done by the ``F.pad`` node before it)."""
    return SimpleNamespace(stride=conv.stride, dilation=conv.dilation, groups=conv.groups,
                           padding=(0,) * (conv.weight.dim() - 2))


def module_rule(classifier, node: fx.Node, where: str, m: nn.Module) -> Rule | None:
    """The rule of a transposed convolution module, or ``None`` for other modules."""
    if not isinstance(m, _CONV_T_MODULES):
        return None
    if len(node.args) > 1 or node.kwargs:
        raise refuse(where, "output_size= chooses the output padding inside forward",
                     "set output_padding in the constructor instead", TRUNK, linear=True)
    weight, bias = classifier.weights(m)
    return ConvTranspose(where, weight, bias, tuple(m.stride), tuple(m.padding), tuple(m.output_padding), m.groups,
                         tuple(m.dilation))


def _settings(node: fx.Node, names: tuple[str, ...], defaults: tuple) -> list:
    values = list(node.args[1:]) + list(defaults[len(node.args) - 1:])
    for key, value in node.kwargs.items():
        values[names.index(key)] = value
    return values


def _weights(classifier, node: fx.Node, where: str, weight, bias) -> tuple[Tensor, Tensor | None]:
    w, is_param = classifier.static_value(weight, where)
    if not is_param:
        raise refuse(where, "its weight is a buffer or constant (a fixed map, whose constants go into phi); the table "
                            "reads the weights of a map as parameters", "make the weight an nn.Parameter", BUFFER)
    return w, None if bias is None else classifier.static_value(bias, where)[0]


def function_rule(classifier, node: fx.Node, where: str) -> Rule | None:
    """The rule of ``F.linear``, ``x @ W``, ``F.convNd``, ``F.conv_transposeNd`` with parameter weights, a split left
    as it was (refused), or ``None`` for other functions."""
    target = node.target
    if target in SPLITS:
        raise refuse(where, "its pieces are read at an index computed inside forward, or its sizes are",
                     "take the pieces by constant index (a, b = x.chunk(2, 1)), with sizes fixed in __init__", TRUNK,
                     linear=True)
    if target in (F.linear, torch.nn.functional.linear):
        weight, bias = _settings(node, ("weight", "bias"), (None, None))
        return Linear(where, *_weights(classifier, node, where, weight, bias))
    if target in _MATMUL and len(node.args) == 2 and isinstance(node.args[1], fx.Node) and \
            node.args[1].op == "get_attr":  # x @ W: F.linear with weight Wᵀ
        weight = _weights(classifier, node, where, node.args[1], None)[0]
        if weight.dim() == 2:
            return Linear(where, weight.T.contiguous(), None)
    if target in _CONV_FUNCTIONS:
        n = _CONV_FUNCTIONS[target]
        weight, bias, stride, padding, dilation, groups = _settings(
            node, ("weight", "bias", "stride", "padding", "dilation", "groups"), (None, None, 1, 0, 1, 1))
        settings = SimpleNamespace(stride=_tuple(stride, n), dilation=_tuple(dilation, n), groups=int(groups),
                                   padding=padding if isinstance(padding, str) else _tuple(padding, n))
        return Conv(where, settings, *_weights(classifier, node, where, weight, bias))
    if target in _CONV_T_FUNCTIONS:
        n = _CONV_T_FUNCTIONS[target]
        weight, bias, stride, padding, output_padding, groups, dilation = _settings(
            node, ("weight", "bias", "stride", "padding", "output_padding", "groups", "dilation"),
            (None, None, 1, 0, 0, 1, 1))
        return ConvTranspose(where, *_weights(classifier, node, where, weight, bias), _tuple(stride, n),
                             _tuple(padding, n), _tuple(output_padding, n), int(groups), _tuple(dilation, n))
    return None


def _tuple(value, n: int) -> tuple[int, ...]:
    return tuple(int(v) for v in value) if isinstance(value, (tuple, list)) else (int(value),) * n


# ------------------------------------------------------------------------------------------------- the rule
class ConvTranspose(Rule):
    """A transposed convolution (any stride, padding, output padding, dilation, groups): a parameter map, one
    edge per (weight, input unit, output unit) it joins (at most one weight joins two units). Pair: the channel sum
    within each group, the all-ones kernel's transposed convolution of that plane, copied to the group's output
    channels (+1 with a bias); norm: the weights squared."""

    kind, is_map = "conv", True

    def __init__(self, where: str, weight: Tensor, bias: Tensor | None, stride, padding, output_padding,
                 groups: int, dilation) -> None:
        super().__init__(where, None)
        self.weight, self.bias, self.groups = weight, bias, groups
        self.n = weight.dim() - 2
        self.stride, self.padding, self.output_padding, self.dilation = stride, padding, output_padding, dilation

    @property
    def kernel(self) -> tuple[int, ...]:
        return tuple(self.weight.shape[2:])

    def _apply(self, x: Tensor, weight: Tensor, bias: Tensor | None, groups: int) -> Tensor:
        return _CONV_T[self.n](x, weight, bias, self.stride, self.padding, self.output_padding, groups, self.dilation)

    def _ones(self, channels: int, like: Tensor) -> Tensor:
        return torch.ones(channels, 1, *self.kernel, dtype=like.dtype, device=like.device)

    def bind(self, in_shape, out_shape):
        """The all-ones kernel's map of one plane as a sparse matrix (:func:`probe_plane`), for the program."""
        from lightning_nsv.kernel.pair_probes import probe_plane

        if len(in_shape) != self.n + 2:
            raise ValueError(f"{self.where}: expects a batch of shape (n, C, ...{self.n} dims), got {in_shape}")
        ones = self._ones(1, self.weight)
        self.sparse, self.n_out = probe_plane(self.where, lambda x: self._apply(x, ones, None, 1),
                                              (1, *in_shape[2:]), (1, *out_shape[2:]), self.weight.device)

    def forward(self, args, kwargs, ctx):
        return self._apply(args[0], self.weight, self.bias, self.groups)

    def pair(self, args, kwargs, ctx):
        v, g = args[0], self.groups
        n, c_out = v.shape[0], self.weight.shape[1] * g
        if v.shape[1] > g:
            v = v.reshape(n, g, v.shape[1] // g, *v.shape[2:]).sum(2)
        v = self._apply(v, self._ones(g, v), None, g)
        if self.bias is not None:
            v = v + 1.0
        return v.unsqueeze(2).expand(n, g, c_out // g, *v.shape[2:]).reshape(n, c_out, *v.shape[2:])

    def norm(self, args, kwargs):
        return self._apply(args[0], self.weight ** 2, None if self.bias is None else self.bias ** 2, self.groups)

    def program(self, args, kwargs, ctx):
        return ctx.conv_transpose(self, args[0])
