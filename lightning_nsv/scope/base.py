"""What an analysis of a network looks at, as a type: a :class:`Scope` embeds the inputs, freezes the analysed
function at the current weights, fits the max-margin classifier on its path kernel, says what it is and writes its
part of the result file. Three implementations: :class:`~lightning_nsv.scope.head.HeadScope` (a Linear/Leaky-ReLU
head after a fixed embedding), :class:`~lightning_nsv.scope.whole.WholeScope` (the whole traced module) and
:class:`~lightning_nsv.scope.cut.CutScope` (everything from a cut on, after a fixed float64 embedding)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, Protocol, Sequence

import torch
from torch import Tensor, nn

from lightning_nsv.analysis.whole_network_budget import DEFAULT_TIME_BUDGET, CostEstimate
from lightning_nsv.kernel.sharded import ColumnSharing

__all__ = ["AnalysisOptions", "Frozen", "Scope"]


@dataclass(frozen=True)
class AnalysisOptions:
    """How the max-margin classifier is fitted, whatever the scope (each scope reads what applies to it).

    Attributes:
        intercept, C: the paper's ``SVC`` protocol with an intercept and its penalty (the head, binary).
        delta: confidence of the compression bound.
        kernel, max_dense_bytes: the head's dense kernel or columns on demand, and the largest dense kernel.
        multiclass: ``"exact"`` or ``"ovr"`` for a head with K >= 2 outputs.
        solver: where the binary active-set solver keeps its columns (``"auto"``, ``"numpy"``, ``"torch"``).
        tol: optimality tolerance of the whole network's solver.
        time_budget: seconds a whole-network analysis may take (``None``: no limit).
    """

    intercept: bool = False
    C: float = 1e7
    delta: float = 0.05
    kernel: str = "auto"
    max_dense_bytes: int = 4 << 30
    multiclass: str = "exact"
    solver: str = "auto"
    tol: float = 1e-10
    time_budget: float | None = DEFAULT_TIME_BUDGET

    @classmethod
    def from_saved(cls, solver: dict[str, Any], delta: float | None = None) -> AnalysisOptions:
        """The options a result file's ``solver`` record holds (the defaults for what it does not)."""
        known = {key: solver[key] for key in ("intercept", "C", "delta", "kernel", "max_dense_bytes", "multiclass",
                                              "tol") if solver.get(key) is not None}
        return cls(**known) if delta is None else cls(**{**known, "delta": delta})


class Frozen(Protocol):
    """The analysed function at the weights of one analysis, in float64."""

    @property
    def num_outputs(self) -> int: ...

    def to(self, device: torch.device) -> Frozen: ...

    def outputs(self, x: Tensor) -> Tensor:
        """``N(x)``, ``(n,)`` for one output or ``(n, K)``; NaN stays NaN."""


class Scope(ABC):
    """What is analysed: its inputs (:meth:`embed`), its float64 function (:meth:`freeze`), its analysis
    (:meth:`analyse`), how it is said (:attr:`line`, :attr:`label`, :meth:`report`) and saved (:meth:`payload`)."""

    #: recorded in the result file as ``scope``
    kind: ClassVar[str]

    @property
    @abstractmethod
    def name(self) -> str:
        """Where the analysed part is, for messages (``"CNN.net"``, ``"CNN (whole network)"``)."""

    @property
    @abstractmethod
    def num_outputs(self) -> int:
        """1 for a binary network (its logit), K for a K-class one."""

    @property
    def subject(self) -> str:
        """The analysed part in a sentence (``"the head CNN.net"``)."""
        return self.name

    @property
    @abstractmethod
    def line(self) -> str:
        """The report's first line: what is analysed (``"head only: …"``, ``"path kernel of the whole network: …"``)."""

    @property
    @abstractmethod
    def label(self) -> str:
        """What was analysed in a few words (the summary card's heading)."""

    @property
    def budget_advice(self) -> str:
        """What a refusal for time suggests besides a subsample."""
        return "a smaller network"

    @abstractmethod
    def embed(self, x: Tensor) -> Tensor:
        """The inputs of path space for module inputs ``x`` (the module in eval mode, without gradients)."""

    @abstractmethod
    def freeze(self) -> Frozen:
        """The analysed function with the current weights."""

    @abstractmethod
    def outputs(self, frozen: Frozen, x: Tensor, keep_gates: bool = False) -> tuple[Tensor, Any]:
        """``N(x)`` in float64 of the embedded ``x`` (``(n,)`` or ``(n, K)``; NaN stays NaN), with what the analysis of
        these samples can reuse where ``keep_gates`` (the whole network's gates; else ``None``)."""

    def join_gates(self, parts: Sequence[Any]) -> Any:
        """The gates of consecutive blocks kept by :meth:`outputs`, as one (``None`` where there are none)."""
        return None

    def output_mismatch(self, module: nn.Module, x: Tensor, where: str, indices: Sequence[int] | None = None,
                        scale: float = 0.0, warn: Callable[[str], None] | None = None) -> str | None:
        """Why ``module``'s output on ``x`` is not the analysed function's, or ``None`` when it is."""
        return None

    def estimate_cost(self, sample: Tensor, m: int, n_val: int) -> CostEstimate | None:
        """What the analysis of ``m`` samples will cost, measured on ``sample``; ``None`` where it is small."""
        return None

    @abstractmethod
    def fitting_text(self, options: AnalysisOptions) -> str:
        """What the fit computes, for the line said before it (``"dense path kernel"``, …)."""

    @abstractmethod
    def analyse(self, frozen: Frozen, x: Tensor, y: Tensor, x_val: Tensor | None, y_val: Tensor | None,
                options: AnalysisOptions, sharing: ColumnSharing | None = None, *, initial: Sequence[int] | None = None,
                cache: Any = None, gates: Any = None, say: Callable[[str], None] | None = None,
                progress: bool = False) -> Any:
        """The max-margin classifier on the path kernel of ``frozen`` over the embedded ``x``, compared with the
        network. ``initial``: indices tried first; ``cache``: rows kept between analyses (the head's);
        ``gates``: the gates of ``x`` computed already (the whole network's zero-error pass)."""

    @abstractmethod
    def serve(self, frozen: Frozen, x: Tensor) -> int:
        """The other ranks' side of :meth:`analyse` with ``sharing``: their shards of the kernel columns."""

    @abstractmethod
    def shares_columns(self, options: AnalysisOptions) -> bool:
        """Whether the ranks compute the kernel columns together under DDP."""

    def report(self, analysis: Any) -> str:
        """The analysis' report, its first line saying what was analysed."""
        return f"{self.line}\n{analysis.report()}"

    @abstractmethod
    def payload(self, analysis: Any, frozen: Frozen, x: Tensor, y: Tensor, options: AnalysisOptions) -> dict[str, Any]:
        """This scope's keys of a result file (with ``scope``, ``scope_summary`` and ``outputs``)."""

    @abstractmethod
    def saved_outputs(self, frozen: Frozen, x: Tensor, batch_size: int = 1024) -> Tensor:
        """The outputs a result file records on every sample of ``x`` (what ``reproduce`` compares)."""

    @staticmethod
    @abstractmethod
    def payload_problems(payload: Mapping[str, Any]) -> list[str]:
        """What is wrong with this scope's keys of a loaded result file (empty where nothing is)."""

    def check_reproduced(self, analysis: Any, saved_summary: str | None) -> str | None:
        """Why a fresh analysis is not of the saved scope, or ``None``."""
        return None

    @abstractmethod
    def patterns(self, frozen: Frozen, x: Tensor, gates: Any = None) -> Tensor | None:
        """Each sample's activation pattern packed in bytes, ``(m, bytes)``; ``None`` without gates. ``gates``: those
        of ``x`` computed already (:meth:`outputs`), read instead of a new forward."""

    def figures(self, frozen: Frozen, x: Tensor, y: Tensor, analysis: Any) -> list[tuple[str, Any]]:
        """The scope's own figures, ``(tag, matplotlib figure)``."""
        return []
