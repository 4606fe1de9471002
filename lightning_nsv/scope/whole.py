"""The whole module as the analysed part: traced into the pair network of DESIGN.md §2c
(:func:`~lightning_nsv.analysis.whole_network_support_vectors`); its inputs are the raw ones."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from lightning_nsv.analysis.whole_network import (BUDGET_ADVICE, serve_whole_network_columns, whole_network_cost,
                                                  whole_network_support_vectors)
from lightning_nsv.analysis.whole_network_budget import CostEstimate
from lightning_nsv.kernel import Gates, PiecewiseGraph, ScopeSummary, compute_gates, trace
from lightning_nsv.errors import NonFiniteError
from lightning_nsv.kernel.graph import run
from lightning_nsv.kernel.pair_network import MEMORY_BYTES
from lightning_nsv.kernel.sharded import ColumnSharing
from lightning_nsv.models.layers import eval_mode
from lightning_nsv.scope.base import AnalysisOptions, Scope
from lightning_nsv.scope.outputs import module_outputs

__all__ = ["TracedNetwork", "WholeScope", "whole_network_payload"]


class _Discard:
    """Forward-mode context of :func:`~lightning_nsv.kernel.graph.run` that keeps no gates."""

    watch_ties = False

    def record(self, name: str, value: Tensor) -> None:
        pass

    def tie(self, samples: Tensor) -> None:
        pass


@dataclass(frozen=True)
class TracedNetwork:
    """The whole module with the weights it had when traced: its float64 forward and the module for the analysis."""

    graph: PiecewiseGraph
    module: nn.Module

    @property
    def num_outputs(self) -> int:
        return self.graph.num_outputs

    def to(self, device: torch.device) -> TracedNetwork:
        return self  # the graph lives on the module's device

    def outputs(self, x: Tensor) -> Tensor:
        """``N(x)`` in float64, ``(n,)`` or ``(n, K)``, a block of rows at a time; NaN stays NaN."""
        step = max(1, MEMORY_BYTES // (8 * max(1, self.graph.peak_elements)))
        parts = [run(self.graph, x[lo:lo + step].to(self.graph.device, torch.float64), "forward", _Discard())
                 for lo in range(0, len(x), step)]
        out = torch.cat(parts).reshape(len(x), -1) if parts else torch.zeros(0, self.num_outputs, dtype=torch.float64)
        return out[:, 0] if self.num_outputs == 1 else out



class WholeScope(Scope):
    """The whole ``module`` (traced on ``example`` inputs to ``summary``, ``num_outputs`` outputs), named ``scope_name`` in the scope line;
    ``budget_advice``: what a refusal for time suggests besides a subsample (its head, where it has one)."""

    kind = "whole"

    def __init__(self, module: nn.Module, example: Tensor, summary: ScopeSummary, num_outputs: int, *,
                 scope_name: str = "whole network", budget_advice: str | None = None) -> None:
        self.module, self.example, self.summary, self._outputs = module, example.detach(), summary, num_outputs
        self.scope_name = scope_name
        self._advice = budget_advice

    @property
    def name(self) -> str:
        return f"{type(self.module).__name__} (whole network)"

    @property
    def num_outputs(self) -> int:
        return self._outputs

    @property
    def line(self) -> str:
        return f"path kernel of the {self.summary}"

    @property
    def label(self) -> str:
        return "whole network"

    @property
    def budget_advice(self) -> str:
        return self._advice or BUDGET_ADVICE

    def embed(self, x: Tensor) -> Tensor:
        return x

    def freeze(self) -> TracedNetwork:
        with eval_mode(self.module), torch.no_grad():
            return TracedNetwork(trace(self.module, self.example), self.module)

    def outputs(self, frozen: TracedNetwork, x: Tensor, keep_gates: bool = False) -> tuple[Tensor, Gates | None]:
        """With ``keep_gates``: the gates of ``x`` as the analysis fixes them (one float64 forward, the same for any
        split of the samples), their ``output`` the outputs; non-finite values keep none (the pass names them)."""
        if keep_gates:
            try:
                gates = compute_gates(frozen.graph, x)
            except NonFiniteError:
                pass
            else:
                out = gates.output.reshape(len(x), -1)
                return (out[:, 0] if self.num_outputs == 1 else out), gates
        return frozen.outputs(x), None

    def join_gates(self, parts: Sequence[Gates | None]) -> Gates | None:
        if not parts or any(part is None for part in parts):
            return None
        return Gates(torch.cat([p.output for p in parts]),
                     {name: torch.cat([p.bits[name] for p in parts]) for name in parts[0].bits},
                     {name: torch.cat([p.selections[name] for p in parts]) for name in parts[0].selections})

    def estimate_cost(self, sample: Tensor, m: int, n_val: int) -> CostEstimate:
        return whole_network_cost(self.module, sample, m, n_val)

    def fitting_text(self, options: AnalysisOptions) -> str:
        return "path kernel columns of candidate support vectors (of the whole network, by the pair network)"

    def analyse(self, frozen: TracedNetwork, x: Tensor, y: Tensor, x_val: Tensor | None, y_val: Tensor | None,
                options: AnalysisOptions, sharing: ColumnSharing | None = None, *, initial: Sequence[int] | None = None,
                cache: Any = None, gates: Gates | None = None, say: Callable[[str], None] | None = None,
                progress: bool = False) -> Any:
        """:func:`~lightning_nsv.analysis.whole_network_support_vectors` on the graph ``frozen`` traced (and the gates
        of ``x`` where given): under DDP with ``sharing`` the other ranks compute shards of the rows."""
        extra = {} if say is None else {"say": say}
        return whole_network_support_vectors(
            frozen.module, x, y, x_val, y_val, delta=options.delta, initial=initial, solver=options.solver,
            tol=options.tol, scope_name=self.scope_name, sharing=sharing, time_budget=options.time_budget,
            progress=progress, budget_advice=self.budget_advice, traced=frozen.graph, gates=gates, **extra)

    def serve(self, frozen: TracedNetwork, x: Tensor) -> int:
        return serve_whole_network_columns(frozen.module, x)

    def shares_columns(self, options: AnalysisOptions) -> bool:
        return True

    def report(self, analysis: Any) -> str:
        return analysis.report()  # its first line is the scope's

    def payload(self, analysis: Any, frozen: TracedNetwork, x: Tensor, y: Tensor,
                options: AnalysisOptions) -> dict[str, Any]:
        return whole_network_payload(analysis, frozen.module, x, y, tol=options.tol)

    @staticmethod
    def payload_problems(payload: Mapping[str, Any]) -> list[str]:
        """A whole-network result holds no path network, but its scope line and outputs."""
        problems = [] if payload["network"] is None else [
            "a whole-network result holds no 'network' (its module_state holds every weight): set it to None"]
        problems += [f"a whole-network result analyses the whole module on its inputs: '{k}' must be None"
                     for k in ("path_module", "embedding") if payload[k] is not None]
        if not isinstance(payload.get("scope_summary"), str):
            problems.append("a whole-network result must hold 'scope_summary', the scope line of its analysis")
        if payload.get("outputs") is None:
            problems.append("a whole-network result must hold 'outputs' (artifacts.module_outputs), which "
                            "reproduce() compares")
        return problems

    def saved_outputs(self, frozen: TracedNetwork, x: Tensor, batch_size: int = 1024) -> Tensor:
        return module_outputs(frozen.module, x, len(x), batch_size)["values"]

    def check_reproduced(self, analysis: Any, saved_summary: str | None) -> str | None:
        if saved_summary is None or analysis.scope == saved_summary:
            return None
        return (f"the rebuilt module traces to another graph than the analysed one: {analysis.scope!r}, saved "
                f"{saved_summary!r}; its code differs from the analysed run's")

    def patterns(self, frozen: TracedNetwork, x: Tensor, gates: Gates | None = None) -> Tensor | None:
        """Every slope bit and max-pool selection, packed (from ``gates`` where given, else one float64 forward)."""
        gates = compute_gates(frozen.graph, x) if gates is None else gates
        m = len(gates)
        bits = [b.reshape(m, -1).cpu() for b in gates.bits.values()]
        parts = [np.packbits(torch.cat(bits, 1).numpy(), axis=1)] if bits else []
        parts += [s.reshape(m, -1).cpu().contiguous().numpy().view(np.uint8) for s in gates.selections.values()]
        return torch.from_numpy(np.concatenate(parts, axis=1)) if parts else None


def whole_network_payload(analysis: Any, module: nn.Module, x_train: Tensor, labels: Tensor | np.ndarray,
                          *, tol: float = 1e-10) -> dict[str, Any]:
    """The keys of a result file that a whole-network analysis fills (for
    :func:`~lightning_nsv.artifacts.save_support_vectors`, with the keys every result shares: ``module_class``,
    ``module_hparams``, ``module_state``, ``data_class``, ``data_hparams``, ``train_indices``, ``epoch``,
    ``global_step``, ``metrics``).

    Args:
        analysis: what :func:`~lightning_nsv.analysis.whole_network_support_vectors` returned for ``module`` on
            ``x_train`` (a ``WholeNetworkAnalysis`` or ``WholeNetworkMulticlassAnalysis``).
        module: the analysed module (the whole LightningModule; the one ``reproduce`` rebuilds).
        x_train: the training inputs it was analysed on, in its input shape (not embedded).
        labels: the training labels given to the analysis (0/1 or ±1 for one output, ``0..K−1`` for ``K``).
        tol: the solver tolerance given to the analysis (its default 1e-10), used again by ``reproduce``.

    Returns:
        ``scope`` ``"whole"``, ``scope_summary`` (``analysis.scope``), ``support``, ``alpha``, ``intercept`` (0),
        ``labels`` (±1 float64, or class indices int64), ``num_outputs``, ``network`` ``None``, ``path_part`` (the
        module's class name), ``path_module`` and ``embedding`` ``None``, ``solver`` (what reproduces the fit:
        ``delta``, ``tol``; and ``method``, ``backend``, ``kkt_residual``, ``iterations``) and ``outputs``
        (:func:`~lightning_nsv.scope.outputs.module_outputs` on ``x_train``).
    """
    from lightning_nsv.analysis.binary import signed_labels

    scope = getattr(analysis, "scope", None)
    if not isinstance(scope, str) or not scope:
        raise TypeError(f"`analysis` must be the result of whole_network_support_vectors (a scope line), got a "
                        f"{type(analysis).__name__}; a head analysis is saved with the head payload")
    outputs = module_outputs(module, x_train)
    num_outputs = 1 if outputs["values"].dim() == 1 else int(outputs["values"].shape[1])
    labels = labels if isinstance(labels, Tensor) else torch.as_tensor(np.asarray(labels))
    labels = (signed_labels(labels) if num_outputs == 1 else labels).to("cpu", torch.float64 if num_outputs == 1
                                                                           else torch.int64)
    svm = analysis.svm
    return {
        "scope": "whole", "scope_summary": scope,
        "support": torch.from_numpy(np.asarray(svm.support_)), "alpha": torch.from_numpy(np.asarray(svm.alpha_)),
        "intercept": 0.0, "labels": labels, "num_outputs": num_outputs, "network": None,
        "path_part": type(module).__name__, "path_module": None, "embedding": None,
        "solver": {"delta": float(analysis.delta), "tol": float(tol), "method": svm.method,
                   "backend": getattr(analysis, "solver_backend", "numpy"), "kkt_residual": svm.kkt_residual,
                   "iterations": getattr(svm, "iterations", 0)},
        "outputs": outputs,
    }
