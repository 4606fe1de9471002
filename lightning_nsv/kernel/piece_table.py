"""The operation table's entries for the rest of the vocabulary (:mod:`lightning_nsv.kernel.piece_rules`): which fx
calls are a saturating piece (Hardtanh, ReLU6, clamp), a gate written with ``torch.where``, or a max over a dim, and
the refusals of their other uses, each in its own terms."""
from __future__ import annotations

import operator

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from lightning_nsv.kernel import piece_rules as P
from lightning_nsv.kernel.refusals import BUFFER, REWRITE, TRUNK, refuse

__all__ = ["check_readers", "module_piece", "vocabulary_rule"]

_HARDTANH = {F.hardtanh, F.hardtanh_, "hardtanh", "hardtanh_"}
_RELU6 = {F.relu6, "relu6"}
_CLAMP = {torch.clamp, torch.clip, torch.clamp_, torch.clip_, "clamp", "clip", "clamp_", "clip_"}
_CLAMP_MIN = {torch.clamp_min, torch.clamp_min_, "clamp_min", "clamp_min_"}
_CLAMP_MAX = {torch.clamp_max, torch.clamp_max_, "clamp_max", "clamp_max_"}
_ABOVE = {operator.gt, operator.ge, torch.gt, torch.ge, torch.greater, torch.greater_equal, "gt", "ge", "greater",
          "greater_equal", "__gt__", "__ge__"}
_BELOW = {operator.lt, operator.le, torch.lt, torch.le, torch.less, torch.less_equal, "lt", "le", "less",
          "less_equal", "__lt__", "__le__"}
_LINE_MAX = {torch.max: False, "max": False, torch.min: True, "min": True}
_LINE_AMAX = {torch.amax: False, "amax": False, torch.amin: True, "amin": True}
_MUL = {operator.mul, torch.mul, "mul", "__mul__", "__rmul__"}
WHERE_FORM = "torch.where(z > 0, z, a * z) (or z >= 0; z < 0 or z <= 0 with the branches swapped; a a number or " \
             "a buffer of one value)"


def _arg(node: fx.Node, index: int, key: str, default=None):
    return node.args[index] if len(node.args) > index else node.kwargs.get(key, default)


def _bound(classifier, value, where: str) -> float | None:
    """A clamp bound: ``None``, a number, or a buffer of one value."""
    if value is None:
        return None
    if isinstance(value, fx.Node):
        value, learned = classifier.static_value(value, where)
        if learned:
            raise refuse(where, "its bound is a learned parameter: the flat value of a saturated unit is a fixed "
                                "constant in phi, a learned one would belong to wbar", BUFFER, TRUNK)
    value = torch.as_tensor(value, dtype=torch.float64)
    if value.numel() != 1:
        raise refuse(where, "its bounds are tensors of several values (a bound per unit)",
                     "clamp with numbers, or write the bound as a shift around a clamp with numbers", TRUNK)
    return float(value)


def _piece(node: fx.Node, where: str, lo: float | None, hi: float | None, classifier,
           inplace: bool = False) -> P.PieceGate:
    source = node.args[0] if node.args else None
    if inplace and isinstance(source, fx.Node) and len(source.users) > 1:  # the graph reads it unchanged: refuse
        raise refuse(where, f"it clamps {source.name} in place, which another operation also reads (torch.fx does "
                            "not see the change)", "clamp out of place (inplace=False, x.clamp instead of x.clamp_)")
    if lo is not None and hi is not None and lo > hi:
        raise refuse(where, f"its lower bound {lo} exceeds its upper bound {hi} (every unit is the upper bound)",
                     "give bounds lo <= hi")
    classifier.pools.append((node.name, where))  # the piece of each unit, a choice of the forward
    return P.PieceGate(where, node.name, lo, hi)


def module_piece(classifier, node: fx.Node, where: str, m: nn.Module) -> P.PieceGate | None:
    """``nn.Hardtanh`` and ``nn.ReLU6`` (a Hardtanh of bounds 0 and 6)."""
    if isinstance(m, nn.Hardtanh):
        return _piece(node, where, float(m.min_val), float(m.max_val), classifier, m.inplace)
    return None


def check_readers(classifier, node: fx.Node, where: str) -> None:
    """A comparison is read only by a ``torch.where`` gate, a ``max(dim)``'s pair only through ``.values``/``[0]``."""
    for source in node.all_input_nodes:
        if source in classifier.conditions and node.target is not torch.where:
            raise refuse(where, f"it reads the comparison {source.name}, which the table reads only as the condition "
                                f"of a gate {WHERE_FORM}", REWRITE)
        if source in classifier.with_indices and not (
                (node.target is operator.getitem and node.args[1] in (0, 1)) or
                (node.target is getattr and node.args[1] in ("values", "indices"))):
            raise refuse(where, f"it reads the (values, indices) pair of {source.name} as a whole",
                         f"take {source.name}.values or {source.name}[0]")


def vocabulary_rule(classifier, node: fx.Node, where: str, target, dyn: list[bool]):
    """The rule of a call of the rest of the vocabulary, a refusal in its own terms, or ``None`` (not one)."""
    inplace = (isinstance(target, str) and target.endswith("_")) or getattr(target, "__name__", "").endswith("_")
    if target in _HARDTANH:
        return _piece(node, where, _bound(classifier, _arg(node, 1, "min_val", -1.0), where),
                      _bound(classifier, _arg(node, 2, "max_val", 1.0), where), classifier,
                      inplace or _arg(node, 3, "inplace", False) is True)
    if target in _RELU6:
        return _piece(node, where, 0.0, 6.0, classifier, inplace or _arg(node, 1, "inplace", False) is True)
    if target in _CLAMP | _CLAMP_MIN | _CLAMP_MAX:
        bounds = [*node.args[1:], *node.kwargs.values()]
        if not dyn[0] or any(isinstance(b, fx.Node) and b in classifier.dynamic for b in bounds):
            raise refuse(where, "it clamps by a bound that depends on the input (a selection between two "
                                "input-dependent values)", "write torch.maximum / torch.minimum of the two branches")
        if target in _CLAMP_MIN:
            lo, hi = _arg(node, 1, "min"), None
        elif target in _CLAMP_MAX:
            lo, hi = None, _arg(node, 1, "max")
        else:
            lo, hi = _arg(node, 1, "min"), _arg(node, 2, "max")
        if lo is None and hi is None:
            raise refuse(where, "it clamps without a bound", "give a bound or drop the clamp")
        return _piece(node, where, _bound(classifier, lo, where), _bound(classifier, hi, where), classifier, inplace)
    if target in _ABOVE | _BELOW:
        return _condition(classifier, node, where, target)
    if target is torch.where:
        return _where_gate(classifier, node, where)
    if target is operator.getitem and node.args[0] in classifier.with_indices:
        if node.args[1] != 0:
            raise refuse(where, "it reads the indices of a max, integers that are not a value of the network",
                         REWRITE)
        return P.TakeValues(where)
    if target is getattr and node.args[0] in classifier.with_indices:
        if node.args[1] != "values":
            raise refuse(where, f"it reads .{node.args[1]} of a max, not its values", REWRITE)
        return P.TakeValues(where)
    if (target in _LINE_MAX and sum(dyn) == 1) or target in _LINE_AMAX:  # of two branches: a Select
        return _line_max(classifier, node, where, target, dyn)
    return None


def _condition(classifier, node: fx.Node, where: str, target) -> P.ForwardOnly:
    """``z > 0`` and the like: the condition of a :class:`~lightning_nsv.kernel.piece_rules.WhereGate` (its reader
    checks the form)."""
    classifier.conditions.add(node)
    return P.ForwardOnly(where, classifier.caller(node))


def _where_gate(classifier, node: fx.Node, where: str) -> P.WhereGate:
    """``torch.where(z > 0, z, a·z)`` and its mirrored forms: a gate of slopes ``(a, 1)`` on ``z``; anything else
    is refused."""
    if len(node.args) != 3 or node.kwargs:
        raise refuse(where, f"torch.where is in the table only as a gate {WHERE_FORM}", REWRITE)
    condition, first, second = node.args
    if condition not in classifier.conditions or len(condition.args) != 2 or condition.kwargs:
        raise refuse(where, f"its condition is not a comparison of a value with 0; torch.where is in the table only "
                            f"as a gate {WHERE_FORM}", REWRITE)
    z, zero = condition.args
    above = condition.target in _ABOVE
    if not isinstance(z, fx.Node) or isinstance(zero, fx.Node) or zero != 0:
        raise refuse(where, f"its condition compares with {zero!r}, not with 0 (a breakpoint elsewhere is a "
                            "shifted gate: subtract the breakpoint, gate, add it back)", REWRITE)
    identity, scaled = (first, second) if above else (second, first)
    position = 1 if above else 2
    slope = _scaled_copy(classifier, scaled, z) if identity is z else None
    if slope is None:
        raise refuse(where, f"its branches are not the compared value and a copy of it times a constant; torch.where "
                            f"is in the table only as a gate {WHERE_FORM}", REWRITE)
    if isinstance(scaled, fx.Node) and len(scaled.users) == 1:  # read by this gate alone: nothing in the pair network
        classifier.overrides[scaled.name] = P.ForwardOnly(classifier.where_of(scaled), classifier.caller(scaled))
    classifier.gates.append((node.name, where, slope, 1.0))
    return P.WhereGate(where, node.name, slope, position)


def _scaled_copy(classifier, branch, z: fx.Node) -> float | None:
    """``a`` where ``branch`` is ``a * z`` or ``z * a`` (``a`` a number or a buffer of one value), 0.0 where it is
    the number 0; else ``None``."""
    if not isinstance(branch, fx.Node):
        return 0.0 if isinstance(branch, (int, float)) and not isinstance(branch, bool) and branch == 0 else None
    if branch.target not in _MUL or len(branch.args) != 2 or branch.kwargs or z not in branch.args:
        return None
    other = branch.args[1] if branch.args[0] is z else branch.args[0]
    if other is z or (isinstance(other, fx.Node) and other.op != "get_attr"):
        return None
    value, _ = classifier.static_value(other, classifier.where_of(branch))
    value = torch.as_tensor(value, dtype=torch.float64)
    return float(value) if value.numel() == 1 else None


def _line_max(classifier, node: fx.Node, where: str, target, dyn: list[bool]) -> P.LineMax:
    """``x.max(dim)``, ``torch.max(x, dim)``, ``amax(x, dim)`` (and the minima), one dim ``>= 1``."""
    with_indices = target in _LINE_MAX
    minimum = (_LINE_MAX if with_indices else _LINE_AMAX)[target]
    name = "min" if minimum else "max"
    if sum(dyn) != 1 or not dyn[0]:
        raise refuse(where, f"{name} of an input-dependent tensor and another tensor is in the table only between two "
                            "input-dependent branches (torch.maximum/minimum) or over one dim of one tensor",
                     f"write torch.maximum / torch.minimum, or {name} over a dim")
    dim = _arg(node, 1, "dim")
    if isinstance(dim, fx.Node):
        raise refuse(where, f"{name} of an input-dependent tensor and a constant tensor is an elementwise clamp by "
                            "per-unit bounds", "clamp with numbers (x.clamp(min=c)), or write torch.maximum / "
                            "torch.minimum of two input-dependent branches")
    if isinstance(dim, (tuple, list)) and len(dim) == 1:
        dim = dim[0]
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise refuse(where, f"{name} over every dim (or several) mixes the samples of the batch or several lines",
                     f"take the {name} over one dim >= 1 (x.amax(dim=1))")
    if isinstance(_arg(node, 2, "keepdim", False), fx.Node):
        raise refuse(where, "its keepdim is computed inside forward", BUFFER)
    rule = P.LineMax(where, node.name, dim, bool(_arg(node, 2, "keepdim", False)), minimum, with_indices)
    bind = rule.bind

    def bind_checked(in_shape, out_shape):
        if (dim + len(in_shape) if dim < 0 else dim) == 0:
            raise refuse(where, f"{name} over the batch dim mixes samples", f"take the {name} over a dim >= 1")
        bind(in_shape, out_shape)
    rule.bind = bind_checked
    if with_indices:
        classifier.with_indices.add(node)
    classifier.pools.append((node.name, where))
    return rule
