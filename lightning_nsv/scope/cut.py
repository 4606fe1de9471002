"""A cut as the analysed part (issue 44): everything before the input of a named module is a fixed embedding ``h(x)``,
computed in float64 on a copy of its current weights; everything after it is analysed in path space on ``h(x)``. The
whole network is the cut at the input, the head the cut at its first Linear layer; a cut that a skip connection
crosses (a value from before it read after it) is refused, naming the connection."""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import torch
from torch import Tensor, nn

from lightning_nsv.analysis.whole_network_budget import CostEstimate
from lightning_nsv.extract import PathPart
from lightning_nsv.kernel import scope_summary, trace
from lightning_nsv.kernel.cut import Cut, Float64Embedding, cut_network
from lightning_nsv.kernel.graph import PiecewiseGraph
from lightning_nsv.kernel.sharded import ColumnSharing
from lightning_nsv.models.layers import eval_mode
from lightning_nsv.scope.base import AnalysisOptions, Frozen, Scope
from lightning_nsv.scope.head import HeadScope
from lightning_nsv.scope.outputs import module_inputs, output_indices
from lightning_nsv.scope.whole import WholeScope

__all__ = ["CUT_PREFIX", "CutScope", "cut_name"]

CUT_PREFIX = "from:"  # the callback's scope="from:NAME"


def cut_name(scope: Any) -> str | None:
    """``NAME`` of a scope ``"from:NAME"``, else ``None``."""
    return scope[len(CUT_PREFIX):] if isinstance(scope, str) and scope.startswith(CUT_PREFIX) else None


def _head_part(after: nn.Module, graph: PiecewiseGraph, name: str) -> PathPart | None:
    """The Linear/Leaky-ReLU chain after the cut as a head without trunk, where the traced part is one."""
    if graph.chain is None:
        return None
    linears = [after.get_submodule(n.target) for n in after.graph.nodes if n.op == "call_module"
               and isinstance(after.get_submodule(n.target), nn.Linear)]
    if (len(linears) != len(graph.chain[0]) or len(graph.gates) != len(linears) - 1
            or linears[-1].out_features != graph.num_outputs):
        return None  # a functional Linear, an output picked from several: the whole-network machinery reads it
    return PathPart(f"layers from `{name}`", None, tuple(linears), tuple(float(g.beta) for g in graph.gates),
                    tuple(float(g.gamma) for g in graph.gates))


class CutScope(Scope):
    """``module`` cut at ``cut``: inputs ``h(x)`` (:class:`Float64Embedding`), analysed by ``inner``, the scope of
    the part after the cut on those inputs (a :class:`HeadScope` where it is a Linear/Leaky-ReLU chain, the head's
    code path and fast kernel; else a :class:`WholeScope`). Its result file records the cut name as ``path_module``."""

    kind = "cut"

    def __init__(self, module: nn.Module, cut: Cut, inner: Scope) -> None:
        self.module, self.cut, self.inner = module, cut, inner
        self.embedding = Float64Embedding(cut.before)

    @classmethod
    def build(cls, module: nn.Module, example: Tensor, name: str, budget_advice: str | None = None) -> CutScope:
        """The scope of ``module`` cut at ``name``, traced on ``example`` inputs (a few, as the module takes them)."""
        cut = cut_network(module, name)
        h = Float64Embedding(cut.before)(example)
        with eval_mode(cut.after), torch.no_grad():
            graph = trace(cut.after, h)
        scope_name = f"layers from `{name}`"
        part = _head_part(cut.after, graph, name)
        fixed = "nothing before it" if cut.node == next(iter(cut.before.graph.nodes)).name else \
            "everything before it is a fixed float64 embedding"
        if part is not None:
            summary = scope_summary(graph, scope_name)
            inner: Scope = HeadScope(part, line=f"path kernel of the {summary} (a Linear/Leaky-ReLU chain: the "
                                                 f"head's kernel); {fixed}")
        else:
            inner = WholeScope(cut.after, h.detach().cpu(), scope_summary(graph, scope_name), graph.num_outputs,
                               scope_name=scope_name, budget_advice=budget_advice)
        scope = cls(module, cut, inner)
        scope._check_outputs(example)
        return scope

    def _check_outputs(self, example: Tensor) -> None:
        """The analysed function on ``h(example)`` is the module's own output (its forward, not fx's reading of it),
        up to the rounding of the module's dtype."""
        with eval_mode(self.module), torch.no_grad():
            theirs = self.module(module_inputs(self.module, example)).to("cpu", torch.float64).reshape(len(example), -1)
            ours = self.outputs(self.freeze(), self.embed(example))[0].to("cpu", torch.float64)
        ours = ours.reshape(len(example), -1)
        dtype = next((p.dtype for p in self.module.parameters() if p.is_floating_point()), torch.float32)
        tolerance = 10 * torch.finfo(dtype).eps ** 0.5 * (1 + float(theirs.abs().max()))
        if theirs.shape != ours.shape or not float((theirs - ours).abs().max()) <= tolerance:
            raise ValueError(
                f"{type(self.module).__name__}: the part after `{self.cut.name}` on the embedding before it does not "
                f"give the module's output (shapes {tuple(ours.shape)} and {tuple(theirs.shape)}); in-place "
                "operations whose effect fx does not see, or state that changes between calls, can cause this")

    @property
    def name(self) -> str:
        return f"{type(self.module).__name__} from `{self.cut.name}`"

    @property
    def num_outputs(self) -> int:
        return self.inner.num_outputs

    @property
    def line(self) -> str:
        return self.inner.line

    @property
    def label(self) -> str:
        return f"from `{self.cut.name}`"

    @property
    def budget_advice(self) -> str:
        return self.inner.budget_advice

    def embed(self, x: Tensor) -> Tensor:
        return self.inner.embed(self.embedding(x))

    def freeze(self) -> Frozen:
        return self.inner.freeze()

    def outputs(self, frozen: Frozen, x: Tensor, keep_gates: bool = False) -> tuple[Tensor, Any]:
        return self.inner.outputs(frozen, x, keep_gates)

    def join_gates(self, parts: Sequence[Any]) -> Any:
        return self.inner.join_gates(parts)

    def estimate_cost(self, sample: Tensor, m: int, n_val: int) -> CostEstimate | None:
        return self.inner.estimate_cost(self.embed(sample), m, n_val)

    def fitting_text(self, options: AnalysisOptions) -> str:
        return self.inner.fitting_text(options)

    def analyse(self, frozen: Frozen, x: Tensor, y: Tensor, x_val: Tensor | None, y_val: Tensor | None,
                options: AnalysisOptions, sharing: ColumnSharing | None = None, *, initial: Sequence[int] | None = None,
                cache: Any = None, gates: Any = None, say: Callable[[str], None] | None = None,
                progress: bool = False) -> Any:
        return self.inner.analyse(frozen, x, y, x_val, y_val, options, sharing, initial=initial, cache=cache,
                                  gates=gates, say=say, progress=progress)

    def serve(self, frozen: Frozen, x: Tensor) -> int:
        return self.inner.serve(frozen, x)

    def shares_columns(self, options: AnalysisOptions) -> bool:
        return self.inner.shares_columns(options)

    def report(self, analysis: Any) -> str:
        return self.inner.report(analysis)

    def payload(self, analysis: Any, frozen: Frozen, x: Tensor, y: Tensor, options: AnalysisOptions) -> dict[str, Any]:
        """The inner scope's keys, with ``scope`` ``"cut"``, the cut's name as ``path_module`` and the outputs of
        the analysed float64 function on the embedded samples."""
        indices = output_indices(len(x))
        return {**self.inner.payload(analysis, frozen, x, y, options), "scope": self.kind, "path_part": self.name,
                "path_module": self.cut.name, "embedding": None, "scope_summary": self.line,
                "outputs": {"indices": indices, "values": self.saved_outputs(frozen, x[indices.to(x.device)])}}

    @staticmethod
    def payload_problems(payload: Mapping[str, Any]) -> list[str]:
        problems = [] if isinstance(payload.get("path_module"), str) and payload["path_module"] else [
            "a cut result must name its cut in 'path_module' (the module at whose input the analysis starts)"]
        if payload["embedding"] is not None:
            problems.append("a cut result computes its embedding from the cut: 'embedding' must be None")
        if not isinstance(payload.get("scope_summary"), str) or payload.get("outputs") is None:
            problems.append("a cut result must hold 'scope_summary' and 'outputs', which reproduce() compares")
        return problems

    def saved_outputs(self, frozen: Frozen, x: Tensor, batch_size: int = 1024) -> Tensor:
        parts = [self.inner.outputs(frozen, x[i:i + batch_size])[0].detach().to("cpu", torch.float64)
                 for i in range(0, len(x), batch_size)]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)

    def check_reproduced(self, analysis: Any, saved_summary: str | None) -> str | None:
        return None if saved_summary is None or saved_summary == self.line else (
            f"the rebuilt module cut at `{self.cut.name}` reads {self.line!r}, saved {saved_summary!r}; its code "
            "differs from the analysed run's")

    def patterns(self, frozen: Frozen, x: Tensor, gates: Any = None) -> Tensor | None:
        return self.inner.patterns(frozen, x, gates)

    def figures(self, frozen: Frozen, x: Tensor, y: Tensor, analysis: Any) -> list[tuple[str, Any]]:
        return self.inner.figures(frozen, x, y, analysis)

