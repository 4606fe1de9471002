"""Which scope an analysis has, chosen once by a pure function of the module, an example batch, the request and the
options (:func:`choose_scope`), or read back from a result file (:func:`scope_of_result`)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lightning_nsv.extract import PathPart, UnsupportedNetworkError, find_path_part
from lightning_nsv.kernel import NotPiecewiseLinearError, PiecewiseGraph, ScopeSummary, scope_summary, trace
from lightning_nsv.models.layers import eval_mode
from lightning_nsv.scope.base import AnalysisOptions, Scope
from lightning_nsv.scope.cut import CUT_PREFIX, CutScope, cut_name
from lightning_nsv.scope.head import HeadScope, head_scope_line, parameter_free
from lightning_nsv.scope.whole import WholeScope

__all__ = ["EXAMPLE_SAMPLES", "HEAD_CHOICE", "NoAnalysableScopeError", "RESULT_SCOPES", "SCOPES", "ScopeDecision", "ScopeRequest",
           "check_request", "check_scope", "choose_scope", "find_head", "scope_of_result"]

SCOPES = ("auto", "whole", "head", f"{CUT_PREFIX}NAME")
#: The scopes a result file records, by its ``scope``.
RESULT_SCOPES: dict[str, type[Scope]] = {HeadScope.kind: HeadScope, WholeScope.kind: WholeScope,
                                         CutScope.kind: CutScope}
#: Inputs the module is traced on (shapes, and the check that the graph reproduces the module).
EXAMPLE_SAMPLES = 8
BUDGET_CUT_ADVICE = "a later cut (scope='from:NAME' nearer the output)"
HEAD_CHOICE = ("In NetworkSupportVectors: `scope='head'` (with `embedding=`/`path_module=` naming the trunk and the "
               "head where the module has several) analyses the Linear/Leaky-ReLU head after the rest as a fixed "
               "embedding.")


class NoAnalysableScopeError(UnsupportedNetworkError, NotPiecewiseLinearError):
    """Neither the whole module is piecewise linear nor does it have a head the analysis can read."""


@dataclass(frozen=True)
class ScopeRequest:
    """What the user asked for: ``scope`` (``"auto"``, ``"whole"``, ``"head"``, or ``"from:NAME"``: the cut at the
    input of submodule ``NAME``) and the names of a head and its trunk."""

    scope: str = "auto"
    path_module: str | None = None
    embedding: str | None = None

    @property
    def names_head(self) -> bool:
        return self.scope == "head" or self.path_module is not None or self.embedding is not None


@dataclass(frozen=True)
class ScopeDecision:
    """The chosen scope, with what the caller says about the choice: ``fallback`` (why the whole module is not
    analysed, with ``"auto"``) and ``note`` (an option that does not apply to it)."""

    scope: Scope
    fallback: str | None = None
    note: str | None = None


def find_head(module: nn.Module, request: ScopeRequest) -> tuple[PathPart | None, str | None]:
    """The head, and why there is none: refused (``UnsupportedNetworkError``) where the request names one."""
    if request.names_head:
        return find_path_part(module, request.path_module, request.embedding), None
    try:
        return find_path_part(module), None
    except UnsupportedNetworkError as err:
        return None, str(err)


def _trace(module: nn.Module, example: Tensor) -> PiecewiseGraph:
    with eval_mode(module), torch.no_grad():
        return trace(module, example[:EXAMPLE_SAMPLES].detach())


def _traces(module: nn.Module, example: Tensor) -> bool:
    try:
        _trace(module, example)
    except (NotPiecewiseLinearError, ValueError, TypeError, RuntimeError):
        return False
    return True


def _is_the_head(part: PathPart | None, summary: ScopeSummary) -> bool:
    """Whether the traced module (``summary``) is no more than the head (a Linear/Leaky-ReLU chain after reshapes)."""
    return (part is not None and parameter_free(part.embedding) and summary.max_pools == 0
            and summary.maps == len(part.linears) and summary.gate_layers == len(part.linears) - 1)


def choose_scope(module: nn.Module, example: Tensor, request: ScopeRequest = ScopeRequest(),
                 options: AnalysisOptions = AnalysisOptions()) -> ScopeDecision:
    """The scope of an analysis of ``module`` on inputs like ``example`` (a few, in the module's dtype and device).

    ``"from:NAME"``: the cut at the input of submodule ``NAME`` (:class:`~lightning_nsv.scope.cut.CutScope`),
    refused where a skip connection crosses it. ``"head"`` (or a head named by ``path_module``/``embedding``): that
    head. ``"whole"``: the whole module, refused with the operation named where it is not piecewise linear.
    ``"auto"``: the whole module, unless the head analysis needs an option (``intercept``, ``multiclass="ovr"``) or
    the module is not piecewise linear (the decision's ``fallback`` says why; refused without a head) — by the head's
    code path where the module is no more than its head (the same kernel, with its fast path).
    """
    if cut_name(request.scope) is not None:
        return ScopeDecision(CutScope.build(module, example[:EXAMPLE_SAMPLES].detach(), cut_name(request.scope),
                                            budget_advice=BUDGET_CUT_ADVICE))
    head, head_error = find_head(module, request)

    def head_scope(line: str | None = None, whole_traces: bool = False) -> HeadScope:
        return HeadScope(head, path_module=request.path_module, embedding=request.embedding, line=line,
                         whole_traces=whole_traces)

    def fall_back(why: str, whole_traces: bool) -> ScopeDecision:
        name = type(module).__name__
        if head is None:
            raise NoAnalysableScopeError(
                f"NetworkSupportVectors: {name} has nothing the analysis can read: the whole module is not "
                f"analysed because {why}; and it has no head: {head_error}")
        chosen = head_scope(whole_traces=whole_traces)
        return ScopeDecision(chosen, fallback=(
            f"NetworkSupportVectors: the whole of {name} is not analysed because {why}. Analysing its head instead "
            f"({chosen.line}); pass `scope='head'` to choose it without this message."))

    if request.scope == "head" or (request.scope == "auto" and request.names_head):
        return ScopeDecision(head_scope(whole_traces=_traces(module, example)))
    try:
        graph = _trace(module, example)
    except (NotPiecewiseLinearError, ValueError) as err:  # ValueError: e.g. a graph that is not the module's
        if request.scope == "whole":
            raise type(err)(f"NetworkSupportVectors(scope='whole'): {err} {HEAD_CHOICE}") from None
        how = "is not piecewise linear" if isinstance(err, NotPiecewiseLinearError) else "could not be traced"
        return fall_back(f"it {how} as a whole: {str(err).rstrip('.')}", whole_traces=False)
    summary = scope_summary(graph)
    if request.scope == "auto" and _is_the_head(head, summary):
        chain = head_scope(f"path kernel of the {summary} (a Linear/Leaky-ReLU chain: the head's kernel)", True)
        if chain.output_mismatch(module, example[:EXAMPLE_SAMPLES], "the example inputs") is None:
            return ScopeDecision(chain)
    if request.scope == "auto" and (options.intercept or (options.multiclass == "ovr" and graph.num_outputs > 1)):
        option = "`intercept=True` (the paper's SVC protocol)" if options.intercept else "`multiclass='ovr'`"
        return fall_back(f"{option} is an analysis of the head", whole_traces=True)
    advice = (f"its head (NetworkSupportVectors(scope='head'): {head_scope_line(head, request.embedding)})"
              if head is not None else "a smaller network (this module has no Linear/Leaky-ReLU head after an "
              "nn.Flatten to analyse instead)")
    note = ("NetworkSupportVectors: `kernel='dense'` does not apply to the whole network: its kernel columns come "
            "from the pair network, for candidate support vectors only") if options.kernel == "dense" else None
    scope = WholeScope(module, example[:EXAMPLE_SAMPLES].detach().cpu(), summary, graph.num_outputs,
                       budget_advice=advice)
    return ScopeDecision(scope, note=note)


def check_scope(scope: object) -> None:
    """Refuse a ``scope`` that is none of :data:`SCOPES`, saying what each is."""
    name = cut_name(scope)
    if name is not None and not name:
        raise ValueError(f"`scope={scope!r}` names no module: pass e.g. 'from:layer3' (a name of named_modules()) "
                         "or 'from:input'")
    if name is None and scope not in SCOPES[:3]:
        raise ValueError(f"`scope` can be {', '.join(SCOPES)}, got {scope!r}: 'whole' analyses the whole module, "
                         "'head' its Linear/Leaky-ReLU head after a fixed embedding (paper 000's CNN + FC), "
                         f"'{CUT_PREFIX}NAME' everything from the input of submodule NAME on (what comes before it a "
                         "fixed embedding), 'auto' the whole module unless `path_module`/`embedding` name a head or it "
                         "is not piecewise linear")


def check_request(request: ScopeRequest, options: AnalysisOptions) -> None:
    """Refuse a request that contradicts itself or the options (before any module is seen)."""
    check_scope(request.scope)
    if cut_name(request.scope) is not None and (request.path_module is not None or request.embedding is not None
                                                or options.intercept or options.multiclass == "ovr"):
        raise ValueError(f"scope={request.scope!r} cuts the module at the input of `{cut_name(request.scope)}` and "
                         "analyses the rest through the origin (binary, or the exact K-class problem): "
                         "`path_module`/`embedding`, `intercept=True` and `multiclass='ovr'` are options of "
                         "scope='head'; drop them")
    if request.scope == "whole" and (request.path_module is not None or request.embedding is not None):
        raise ValueError("`path_module`/`embedding` name a head and its trunk, but scope='whole' analyses the whole "
                         "module: pass scope='head' (or leave scope out) to analyse that head, or drop them")
    if request.scope == "whole" and (options.intercept or options.multiclass == "ovr"):
        option = "intercept=True` (the paper's SVC protocol)" if options.intercept else "multiclass='ovr'`"
        raise ValueError(f"`{option} is an analysis of the head; the whole network is analysed through the origin "
                         "(binary, or the exact K-class problem): pass scope='head' for it, or leave it out")


def scope_of_result(module: nn.Module, kind: str, example: Tensor, *, path_module: str | None = None,
                    embedding: str | None = None, summary: str | None = None) -> Scope:
    """The scope a result file records (``kind`` ``"head"``, ``"whole"`` or ``"cut"``, whose ``path_module`` names the
    cut), on the rebuilt ``module``."""
    if RESULT_SCOPES[kind] is CutScope:
        return CutScope.build(module, example[:EXAMPLE_SAMPLES].detach(), path_module)
    if RESULT_SCOPES[kind] is WholeScope:
        graph = _trace(module, example)
        scope_name = (summary or "whole network").rpartition(": ")[0] or "whole network"
        return WholeScope(module, example[:EXAMPLE_SAMPLES].detach().cpu(), scope_summary(graph, scope_name),
                          graph.num_outputs, scope_name=scope_name)
    return HeadScope(find_path_part(module, path_module, embedding), path_module=path_module, embedding=embedding,
                     line=summary)
