"""The operation table of DESIGN.md §2c as a classifier of torch.fx nodes: each call gets its rule of
:mod:`lightning_nsv.kernel.rules`, or :class:`NotPiecewiseLinearError` naming it, saying why and giving the choices.
"""
from __future__ import annotations

import math
import operator
import sys
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_nsv.kernel import linear_vocabulary as V
from lightning_nsv.kernel import choice_rules as C
from lightning_nsv.kernel import rules as R
from lightning_nsv.kernel.piece_table import check_readers, module_piece, vocabulary_rule
from lightning_nsv.kernel.refusals import BUFFER, EVAL, REWRITE, TRUNK, NotPiecewiseLinearError, refuse, why_not

__all__ = ["NotPiecewiseLinearError", "refuse"]


_ADD = {operator.add, operator.iadd, torch.add, "add", "add_", "__add__", "__radd__", "__iadd__"}
_SUB = {operator.sub, operator.isub, torch.sub, "sub", "sub_", "__sub__", "__isub__"}
_MUL = {operator.mul, operator.imul, torch.mul, "mul", "mul_", "__mul__", "__rmul__", "__imul__"}
_DIV = {operator.truediv, operator.itruediv, torch.div, "div", "div_", "__truediv__", "__itruediv__"}
_NEG = {operator.neg, torch.neg, "neg", "__neg__"}
_PLAIN = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv}
_SHAPE_METHODS = {"view", "reshape", "flatten", "unflatten", "squeeze", "unsqueeze", "permute", "transpose",
                  "contiguous", "clone", "view_as", "reshape_as"}
_SHAPE_FUNCTIONS = {torch.flatten, torch.reshape, torch.squeeze, torch.unsqueeze, torch.permute, torch.transpose,
                    torch.unflatten, operator.getitem}
_META_METHODS = {"size", "dim", "numel"}
_MAX_POOLS = {F.max_pool1d: 1, F.max_pool2d: 2, F.max_pool3d: 3, torch.max_pool1d: 1, torch.max_pool2d: 2,
              torch.max_pool3d: 3}
_ADAPTIVE_MAX = {F.adaptive_max_pool1d: 1, F.adaptive_max_pool2d: 2, F.adaptive_max_pool3d: 3}
_AVG_POOLS = {F.avg_pool1d, F.avg_pool2d, F.avg_pool3d, F.adaptive_avg_pool1d, F.adaptive_avg_pool2d,
              F.adaptive_avg_pool3d}
_AVG_MODULES = (nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d,
                nn.AdaptiveAvgPool3d)
_PLANE_MODULES = (nn.Upsample, nn.UpsamplingNearest2d, nn.UpsamplingBilinear2d, nn.ReflectionPad1d, nn.ReflectionPad2d,
                  nn.ReflectionPad3d, nn.ReplicationPad1d, nn.ReplicationPad2d, nn.ReplicationPad3d, nn.ZeroPad1d,
                  nn.ZeroPad2d, nn.ZeroPad3d, nn.CircularPad1d, nn.CircularPad2d, nn.CircularPad3d)
_SELECTIONS = {torch.maximum, torch.minimum, torch.max, torch.min, "maximum", "minimum", "max", "min"}
_PLANE_FUNCTIONS = {F.interpolate, F.upsample, F.upsample_nearest, F.upsample_bilinear, F.pad}
_DROPOUTS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)


def is_leaky_family(m: nn.Module) -> bool:
    """The package's ``LeakyReLUFamily``, without importing ``lightning_nsv.models`` (which imports Lightning): an
    instance exists only once that module is imported."""
    layers = sys.modules.get("lightning_nsv.models.layers")
    return layers is not None and isinstance(m, layers.LeakyReLUFamily)


def _where(node: fx.Node, gm: fx.GraphModule) -> str:
    if node.op == "call_module":
        return f"{node.target}: {type(gm.get_submodule(node.target)).__name__}"
    stack = node.meta.get("nn_module_stack") or {}
    prefix = f"{next(reversed(stack))}." if stack else ""
    target = node.target
    name = target if isinstance(target, str) else f"{getattr(target, '__module__', None) or 'torch'}." \
                                                  f"{getattr(target, '__name__', repr(target))}"
    return f"{prefix}{node.name}: {name}"


def _caller(node: fx.Node, gm: fx.GraphModule):
    """The call as written, out of place."""
    target = node.target
    if node.op == "call_module":
        module = gm.get_submodule(target)
        return lambda args, kwargs: module(*args, **kwargs)
    if node.op == "call_method":
        name = target.strip("_") if target.startswith("__") else target.rstrip("_")
        if name.startswith("i") and name[1:] in _PLAIN:
            name = name[1:]
        if name in _PLAIN:
            return lambda args, kwargs: _PLAIN[name](*args)
        if name.startswith("r") and name[1:] in _PLAIN:
            return lambda args, kwargs: _PLAIN[name[1:]](args[1], args[0])
        return lambda args, kwargs: getattr(args[0], name)(*args[1:], **kwargs)
    plain = {operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
             operator.itruediv: operator.truediv}.get(target, target)
    return lambda args, kwargs: plain(*args, **kwargs)


def _name(node: fx.Node, gm: fx.GraphModule) -> str:
    if node.op == "call_module":
        return type(gm.get_submodule(node.target)).__name__
    return node.target if isinstance(node.target, str) else getattr(node.target, "__name__", repr(node.target))


def _arg(node: fx.Node, index: int, key: str, default=None):
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(key, default)


def _holds_node(obj) -> bool:
    """Whether ``obj`` holds a value computed inside forward (a parameter or buffer read as it is does not count)."""
    found = []
    fx.node.map_arg(obj, lambda a: found.append(a))
    return any(a.op != "get_attr" for a in found)


def _tuple(value, n: int) -> tuple[int, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (int(value),) * n


def _norm_dim(dim: int, ndim: int) -> int:
    return dim + ndim if dim < 0 else dim


class Classifier:
    """Gives each fx node its rule; tracks which nodes depend on the input (dynamic) and which are sizes (meta)."""

    def __init__(self, gm: fx.GraphModule, device: torch.device) -> None:
        self.gm, self.device = gm, device
        self.dynamic: set[fx.Node] = set()
        self.meta: set[fx.Node] = set()
        self.consts: dict[str, Any] = {}
        self.params: set[str] = set()
        self.gates: list = []
        self.pools: list = []  # max pools and the other choices recorded as an index (pieces, maxes over a dim)
        self.conditions: set[fx.Node] = set()  # comparisons, read only by a torch.where gate
        self.with_indices: set[fx.Node] = set()  # max(dim) calls that return (values, indices)
        self.overrides: dict[str, R.Rule] = {}  # rules that a later call replaces (a where gate's scaled copy)

    def where_of(self, node: fx.Node) -> str:
        return _where(node, self.gm)

    def caller(self, node: fx.Node):
        return _caller(node, self.gm)

    def const(self, target: str):
        value = _attr(self.gm, target)
        if isinstance(value, Tensor):
            if isinstance(value, nn.Parameter):
                self.params.add(target)
            value = value.detach().to(self.device, torch.float64).clone()
        self.consts[target] = value
        return value

    def static_value(self, arg, where: str):
        """``(value, is_parameter)`` of an operand that does not depend on the input."""
        if isinstance(arg, fx.Node):
            if arg.op != "get_attr":
                raise refuse(where, f"its operand {arg.name} is computed inside forward from parameters, "
                                    "constants or sizes, which the operation table does not follow", BUFFER)
            return self.consts[arg.target], arg.target in self.params
        if isinstance(arg, (int, float)) and not isinstance(arg, bool):
            return float(arg), False
        raise refuse(where, f"its operand {arg!r} is not a number, parameter or buffer", BUFFER)

    def classify(self, node: fx.Node) -> R.Rule | None:
        inputs = node.all_input_nodes
        if not any(n in self.dynamic or n in self.meta for n in inputs):
            raise refuse(_where(node, self.gm), "it computes a tensor from parameters or constants inside forward",
                         BUFFER)
        if not any(n in self.dynamic for n in inputs):  # arithmetic on sizes
            self.meta.add(node)
            return R.Meta(_where(node, self.gm), _caller(node, self.gm))
        if node.target in _META_METHODS or node.target is len or (
                node.target is getattr and node.args[1] in ("shape", "ndim")):
            self.meta.add(node)
            return R.Meta(_where(node, self.gm), _caller(node, self.gm))
        self.dynamic.add(node)
        check_readers(self, node, _where(node, self.gm))
        if node.op == "call_module":
            return self.module_rule(node, self.gm.get_submodule(node.target))
        return self.function_rule(node)

    def module_rule(self, node: fx.Node, m: nn.Module) -> R.Rule:
        where = _where(node, self.gm)
        slopes = _leaky_slopes(m) or (self.prelu_slopes(m.weight) if isinstance(m, nn.PReLU) else None)
        if slopes is not None:
            self.gates.append((node.name, where, *slopes))
            return R.Gate(where, node.name, *slopes)
        piece = module_piece(self, node, where, m)
        if piece is not None:
            return piece
        if isinstance(m, nn.Linear):
            return R.Linear(where, *self.weights(m))
        if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            if m.padding_mode != "zeros":  # its padding is the F.pad node before it (linear_vocabulary.rewrite)
                if not node.meta.get(V.UNPADDED):
                    raise refuse(where, f"padding_mode={m.padding_mode!r} with arguments other than the input",
                                 "call it on the input alone", TRUNK, linear=True)
                return R.Conv(where, V.unpadded(m), *self.weights(m))
            return R.Conv(where, m, *self.weights(m))
        transposed = V.module_rule(self, node, where, m)
        if transposed is not None:
            return transposed
        if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)):
            return self.batchnorm(where, m)
        if isinstance(m, (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d)):
            if m.return_indices:
                raise refuse(where, "return_indices=True returns the indices as a second output", "pass return_indices=False")
            n = int(type(m).__name__[-2])
            return self.max_pool(node, where, n, m.kernel_size, m.stride, m.padding, m.dilation, m.ceil_mode)
        if isinstance(m, (nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d)):
            if m.return_indices:
                raise refuse(where, "return_indices=True returns the indices as a second output", "pass return_indices=False")
            return self.adaptive_max_pool(node, where, int(type(m).__name__[-2]), m.output_size)
        if isinstance(m, _AVG_MODULES):
            return self.average_pool(where, _caller(node, self.gm), lambda x: m(x))
        if isinstance(m, _PLANE_MODULES) or (isinstance(m, (nn.ConstantPad1d, nn.ConstantPad2d, nn.ConstantPad3d))
                                             and m.value == 0):
            return R.PlaneMap(where, _caller(node, self.gm), lambda x: m(x), self.device)
        if isinstance(m, (nn.Flatten, nn.Unflatten)):
            return R.Passthrough(where, _caller(node, self.gm), "view", node.name)
        if isinstance(m, nn.Identity):
            return R.Identity(where)
        if isinstance(m, _DROPOUTS):
            if m.training and m.p > 0:
                raise refuse(where, "dropout in training mode is random", EVAL)
            return R.Identity(where)
        known = why_not(type(m).__name__)
        if known:
            raise refuse(where, known[0], *known[1])
        raise refuse(where, f"{type(m).__name__} is not in the operation table (the README lists it); unknown modules "
                            "are refused, never skipped", TRUNK, REWRITE)

    def prelu_slopes(self, weight: Tensor) -> tuple[Any, float]:
        """A PReLU's learned slopes below 0 (float64, one number or one per channel) and 1 above."""
        weight = weight.detach().to(self.device, torch.float64).reshape(-1).clone()
        return (float(weight[0]) if weight.numel() == 1 else weight), 1.0

    def weights(self, m: nn.Module) -> tuple[Tensor, Tensor | None]:
        cast = lambda t: None if t is None else t.detach().to(self.device, torch.float64).clone()  # noqa: E731
        return cast(m.weight), cast(m.bias)

    def batchnorm(self, where: str, m: nn.Module) -> R.BatchNorm:
        if m.training:
            raise refuse(where, "BatchNorm in training mode normalises by the statistics of the batch", EVAL)
        if m.running_var is None:
            raise refuse(where, "BatchNorm without running statistics normalises by the batch even in eval mode",
                         "keep running statistics (track_running_stats=True)", TRUNK)
        var = m.running_var.detach().to(self.device, torch.float64)
        mean = m.running_mean.detach().to(self.device, torch.float64)
        gamma, beta = self.weights(m) if m.affine else (torch.ones_like(var), torch.zeros_like(var))
        scale = gamma / torch.sqrt(var + m.eps)
        return R.BatchNorm(where, scale, beta - scale * mean)

    def max_pool(self, node, where, n, kernel, stride, padding, dilation, ceil_mode) -> C.MaxPool:
        k = _tuple(kernel, n)
        s = k if stride is None or (isinstance(stride, (tuple, list)) and not stride) else _tuple(stride, n)
        p, d = _tuple(padding, n), _tuple(dilation, n)
        pool = _MAX_FN[n]
        self.pools.append((node.name, where))
        return C.MaxPool(where, node.name,
                         lambda x: pool(x, k, s, p, d, ceil_mode=ceil_mode, return_indices=True),
                         lambda x, out: R.box_sum(x, k, s, p, d, out[2:]))

    def adaptive_max_pool(self, node, where, n, output_size) -> C.MaxPool:
        pool, average = _ADAPTIVE_MAX_FN[n], _ADAPTIVE_AVG_FN[n]
        self.pools.append((node.name, where))
        rule = C.MaxPool(where, node.name, lambda x: pool(x, output_size, return_indices=True),
                         lambda x, out: average(x, output_size) / rule.coefficient)
        bind = rule.bind

        def bind_with_counts(in_shape, out_shape):  # norm: window sums = mean × window size
            bind(in_shape, out_shape)
            rule.coefficient = R.window_coefficient(lambda x: average(x, output_size), in_shape, self.device)
        rule.bind = bind_with_counts
        return rule

    def average_pool(self, where: str, call, pool) -> R.FixedMap:
        return R.FixedMap(where, call, lambda in_shape, out_shape: R.window_coefficient(pool, in_shape, self.device))

    def function_rule(self, node: fx.Node) -> R.Rule:
        where, target, name = _where(node, self.gm), node.target, _name(node, self.gm)
        dyn = [isinstance(a, fx.Node) and a in self.dynamic for a in node.args]
        known = why_not(name)
        if known:
            raise refuse(where, known[0], *known[1])
        rule = vocabulary_rule(self, node, where, target, dyn)
        if rule is not None:
            return rule
        if target in _SELECTIONS and sum(dyn) == 2 and len(node.args) == 2 and not node.kwargs:
            self.gates.append((node.name, where, 0.0, 1.0))  # bit: the first branch is chosen
            return C.Select(where, node.name, minimum=name in ("minimum", "min"))
        if sum(dyn) >= 2 and target not in _ADD | _SUB | {torch.cat, torch.concat, torch.stack}:
            raise refuse(where, f"{name} of two input-dependent tensors multiplies paths of both (a product is not "
                                "linear in path space)")
        fixed_settings = target not in _ADD | _SUB | _MUL | _DIV | _NEG | _SHAPE_METHODS | _SHAPE_FUNCTIONS | {
            torch.cat, torch.concat, torch.stack}
        if fixed_settings and _holds_node([node.args[1:], node.kwargs]):
            raise refuse(where, "its settings (slope, kernel size, dims) are computed inside forward; the table "
                                "needs them fixed when the module is traced", "compute them in __init__")
        if target in (F.relu, torch.relu, F.relu_, torch.relu_, "relu", "relu_") or \
                target in (F.leaky_relu, F.leaky_relu_, "leaky_relu") or target in (torch.abs, "abs"):
            slope = _arg(node, 1, "negative_slope", 0.01)
            slope = self.static_value(slope, where)[0] if isinstance(slope, fx.Node) else slope
            beta = -1.0 if target in (torch.abs, "abs") else float(slope) if "leaky" in name else 0.0
            self.gates.append((node.name, where, beta, 1.0))
            return R.Gate(where, node.name, beta, 1.0)
        if target in (F.prelu, torch.prelu, "prelu"):
            weight, _ = self.static_value(node.args[1], where)
            beta, gamma = self.prelu_slopes(torch.as_tensor(weight))
            self.gates.append((node.name, where, beta, gamma))
            return R.Gate(where, node.name, beta, gamma)
        if target in _ADD | _SUB | _MUL | _DIV | _NEG:
            return self.arithmetic(node, where, target, dyn)
        if target in _SHAPE_METHODS or target in _SHAPE_FUNCTIONS:
            return self.shape(node, where, target)
        if target in (torch.cat, torch.concat, torch.stack):
            return self.concatenate(node, where, target)
        if target in ("mean", "sum", torch.mean, torch.sum):
            return self.reduce(node, where, name)
        if target in _MAX_POOLS:
            kw = dict(zip(["kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices"],
                          node.args[1:]), **node.kwargs)
            if kw.get("return_indices"):
                raise refuse(where, "return_indices=True returns the indices as a second output", "pass return_indices=False")
            return self.max_pool(node, where, _MAX_POOLS[target], kw["kernel_size"], kw.get("stride"),
                                 kw.get("padding", 0), kw.get("dilation", 1), kw.get("ceil_mode", False))
        if target in _ADAPTIVE_MAX:
            if _arg(node, 2, "return_indices", False):
                raise refuse(where, "return_indices=True returns the indices as a second output", "pass return_indices=False")
            return self.adaptive_max_pool(node, where, _ADAPTIVE_MAX[target], _arg(node, 1, "output_size"))
        if target in _PLANE_FUNCTIONS:  # interpolation, padding: fixed linear maps of each channel's plane
            static_args, static_kwargs = node.args[1:], dict(node.kwargs)
            if target is F.pad and _arg(node, 2, "mode", "constant") == "constant" and _arg(node, 3, "value", 0):
                raise refuse(where, "padding with a non-zero constant adds that constant at the border (an affine "
                                    "map of the input)", "pad with 0 (F.pad's default)", TRUNK)
            return R.PlaneMap(where, _caller(node, self.gm), lambda x: target(x, *static_args, **static_kwargs),
                              self.device)
        if target in _AVG_POOLS:
            static_args, static_kwargs = node.args[1:], dict(node.kwargs)
            return self.average_pool(where, _caller(node, self.gm),
                                     lambda x: target(x, *static_args, **static_kwargs))
        if target is F.dropout or target in ("dropout",):
            if _arg(node, 2, "training", True) and _arg(node, 1, "p", 0.5) > 0:
                raise refuse(where, "dropout in training mode is random",
                             f"pass training=self.training and {EVAL}")
            return R.Identity(where)
        parameter_map = V.function_rule(self, node, where)  # F.linear, F.convNd, F.conv_transposeNd; splits left
        if parameter_map is not None:
            return parameter_map
        raise refuse(where, f"{name} is not in the operation table (the README lists it); unknown functions are "
                            "refused, never skipped", TRUNK, REWRITE)

    def arithmetic(self, node, where, target, dyn) -> R.Rule:
        call = _caller(node, self.gm)
        if node.kwargs:
            raise refuse(where, f"keyword arguments {sorted(node.kwargs)} are not in the table",
                         "pass the operands by position")
        if target in _NEG:
            return R.FixedMap(where, call, lambda i, o: -1.0)
        if sum(dyn) == 2:
            if target in _ADD | _SUB:
                return R.BranchSum(where, call)
            raise refuse(where, "a product or quotient of two input-dependent tensors is not linear in path "
                                "space (it multiplies paths of both factors)")
        position = dyn.index(True)
        value, is_param = self.static_value(node.args[1 - position], where)
        if target in _ADD | _SUB:
            return R.Shift(where, call, position, value)
        if target in _DIV and position == 1:
            raise refuse(where, "division by an input-dependent tensor is not linear")
        divide = target in _DIV
        if is_param:
            return R.ParamScale(where, call, position, value, divide)
        return R.FixedMap(where, call, lambda i, o: 1.0 / value if divide else value)

    def shape(self, node, where, target) -> R.Rule:
        call = _caller(node, self.gm)
        if target in ("squeeze", torch.squeeze) and len(node.args) == 1 and not node.kwargs:
            return R.Squeeze(where)
        rule = R.Passthrough(where, call, _shape_kind(target), node.name)
        rule.bind = lambda in_shape, out_shape: _check_batch_axis(node, where, target, in_shape, out_shape)
        return rule

    def concatenate(self, node, where, target) -> R.Rule:
        tensors = node.args[0]
        if not all(isinstance(t, fx.Node) and t in self.dynamic for t in tensors):
            raise refuse(where, "it joins input-dependent tensors with constants", "add constants as a shift instead")
        dim = _arg(node, 1, "dim", 0)
        rule = R.Passthrough(where, _caller(node, self.gm), "stack" if target is torch.stack else "join", node.name)

        def bind(in_shape, out_shape):
            if _norm_dim(dim, len(out_shape)) == 0:
                raise refuse(where, "it joins along the batch dim", "join along dims >= 1")
        rule.bind = bind
        return rule

    def reduce(self, node, where, name) -> R.Rule:
        dims = _arg(node, 1, "dim")
        if dims is None:
            raise refuse(where, f"{name} over every dim mixes the samples of the batch", "reduce over dims >= 1")
        dims = _tuple(dims, 1)
        average = name == "mean"

        def coefficient(in_shape, out_shape):
            reduced = {_norm_dim(d, len(in_shape)) for d in dims}
            if 0 in reduced:
                raise refuse(where, f"{name} over the batch dim mixes samples", "reduce over dims >= 1")
            return 1.0 / math.prod(in_shape[d] for d in reduced) if average else 1.0
        return R.FixedMap(where, _caller(node, self.gm), coefficient)


_MAX_FN = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_ADAPTIVE_MAX_FN = {1: F.adaptive_max_pool1d, 2: F.adaptive_max_pool2d, 3: F.adaptive_max_pool3d}
_ADAPTIVE_AVG_FN = {1: F.adaptive_avg_pool1d, 2: F.adaptive_avg_pool2d, 3: F.adaptive_avg_pool3d}


def _attr(module: nn.Module, target: str):
    for part in target.split("."):
        module = getattr(module, part)
    return module


def _leaky_slopes(m: nn.Module) -> tuple[float, float] | None:
    if isinstance(m, nn.ReLU):
        return 0.0, 1.0
    if isinstance(m, nn.LeakyReLU):
        return float(m.negative_slope), 1.0
    if is_leaky_family(m):
        return m.beta, m.gamma
    return None


def _shape_kind(target) -> str:
    """What a shape operation does to the entries: ``view`` (same order), ``permute``, ``select`` (indexing)."""
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    return "select" if target is operator.getitem else "permute" if name in ("permute", "transpose") else "view"


def _check_batch_axis(node, where, target, in_shape, out_shape) -> None:
    """Reshapes must keep each sample in its row of the batch."""
    ndim = len(in_shape)
    args = node.args
    moved = False
    if target in ("permute", torch.permute):
        dims = args[1] if len(args) == 2 and isinstance(args[1], (tuple, list)) else args[1:]
        moved = _norm_dim(dims[0], ndim) != 0
    elif target in ("transpose", torch.transpose):
        moved = 0 in (_norm_dim(args[1], ndim), _norm_dim(args[2], ndim))
    elif target in ("flatten", torch.flatten):
        moved = _norm_dim(_arg(node, 1, "start_dim", 0), ndim) == 0
    elif target in ("unsqueeze", torch.unsqueeze, "squeeze", torch.squeeze, "unflatten", torch.unflatten):
        dims = _tuple(_arg(node, 1, "dim"), 1)
        moved = any(_norm_dim(d, len(out_shape) if "unsq" in str(target) else ndim) == 0 for d in dims)
    elif target is operator.getitem:
        index = args[1] if isinstance(args[1], tuple) else (args[1],)
        simple = all(isinstance(i, (int, slice, type(None), type(Ellipsis))) for i in index)
        first = index[0] if index else slice(None)
        moved = not simple or not (first == slice(None) or (first is Ellipsis and len(index) - 1 < ndim))
    if moved or len(out_shape) == 0 or out_shape[0] != in_shape[0]:
        raise refuse(where, f"it moves, mixes or indexes the batch dim (shape {tuple(in_shape)} -> "
                            f"{tuple(out_shape)}); only reshapes that keep each sample in its row are linear maps "
                            "of one sample", "keep dim 0 the batch (x.view(x.size(0), -1), x.flatten(1))")
