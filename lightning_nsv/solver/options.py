"""The solver's options, validated once, and the one place that decides how a max-margin problem is solved.

Every choice that used to be made by each caller — dense kernel or columns on demand, numpy or torch, which device —
is made by :func:`plan` from a :class:`SolverOptions` and the device the data live on (scikit-learn's
``fit = self._sparse_fit if self._sparse else self._dense_fit``, once).
:func:`~lightning_nsv.analysis.network_support_vectors`, :func:`~lightning_nsv.analysis.multiclass_support_vectors`
and the :class:`~lightning_nsv.callbacks.NetworkSupportVectors` callback call it instead of deciding themselves.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch

from lightning_nsv.validate import check_choice, is_count

__all__ = ["KERNEL_MODES", "SOLVERS", "Plan", "SolverOptions", "analysis_device", "plan", "solver_device"]

KERNEL_MODES = ("auto", "dense", "columns")
SOLVERS = ("auto", "numpy", "torch")


@dataclass(frozen=True)
class SolverOptions:
    """How to solve a max-margin problem, validated when it is made.

    Attributes:
        kernel: ``"columns"`` (kernel columns on demand), ``"dense"`` (the ``m×m`` kernel) or ``"auto"`` (columns
            for the problem through the origin, the dense kernel for the intercept protocol, which needs it).
        solver: where the active-set solver keeps its columns and factor: ``"torch"`` on the data's device,
            ``"numpy"`` on the CPU, ``"auto"`` torch for CUDA data and numpy otherwise.
        intercept: the paper's ``SVC`` protocol with an intercept (scikit-learn, dense kernel, CPU).
        C: penalty of the intercept protocol on the normalised kernel.
        tol: optimality tolerance of the active-set solver.
        max_iter: bound on active-set iterations (``None``: ``10·m``).
        initial_block: members of ``initial`` admitted at a time (``None``: ``⌊√m⌋``).
        max_dense_bytes: largest dense kernel ``kernel="auto"`` builds.
    """

    kernel: str = "auto"
    solver: str = "auto"
    intercept: bool = False
    C: float = 1e7
    tol: float = 1e-10
    max_iter: int | None = None
    initial_block: int | None = None
    max_dense_bytes: int = 4 << 30

    def __post_init__(self) -> None:
        check_choice("kernel", self.kernel, KERNEL_MODES, "'columns' computes kernel columns on demand")
        check_choice("solver", self.solver, SOLVERS, "'torch' solves on the data's device, 'numpy' on the CPU")
        if not self.max_dense_bytes >= 1:
            raise ValueError(f"`max_dense_bytes` must be at least 1, got {self.max_dense_bytes}: the largest dense "
                             "kernel in bytes")
        if not self.C > 0:
            raise ValueError(f"`C` must be positive, got {self.C}: a large C (1e7) is the hard margin")
        if not (self.tol >= 0 and math.isfinite(self.tol)):
            raise ValueError(f"`tol` must be finite and >= 0, got {self.tol}: 1e-10 is exact to rounding")
        if self.max_iter is not None and not (is_count(self.max_iter) and self.max_iter >= 1):
            raise ValueError(f"`max_iter` must be a positive integer or None, got {self.max_iter!r}")
        if self.initial_block is not None and not (is_count(self.initial_block) and self.initial_block >= 1):
            raise ValueError(f"`initial_block` must be a positive integer, got {self.initial_block!r}: the number "
                             "of `initial` samples admitted at a time (None: ⌊√m⌋)")

    @property
    def dense(self) -> bool:
        """Whether the problem is solved on the dense ``m×m`` kernel (else on columns computed on demand)."""
        return self.intercept or self.kernel == "dense"


@dataclass(frozen=True)
class Plan:
    """Where a max-margin analysis runs, as :func:`plan` decided it.

    Attributes:
        device: where the analysis's tensors (inputs, network, kernel columns) live.
        solver_device: where the active-set solver runs (torch, float64); ``None``: numpy on the CPU.
        dense: the dense ``m×m`` kernel (else columns on demand).
    """

    device: torch.device
    solver_device: torch.device | None
    dense: bool

    @property
    def backend(self) -> str:
        """``"numpy"`` or ``"torch (DEVICE)"``: where the active-set solver runs."""
        return "numpy" if self.solver_device is None else f"torch ({self.solver_device})"


def analysis_device(device: torch.device | str) -> torch.device:
    """Where a float64 analysis of tensors on ``device`` runs: there for CUDA, else the CPU (MPS has no float64)."""
    device = torch.device(device)
    return device if device.type == "cuda" else torch.device("cpu")


def solver_device(solver: str, device: torch.device) -> torch.device | None:
    """The device the ``solver`` option runs the active-set solver on for an analysis on ``device`` (``None``: numpy
    on the CPU)."""
    return device if solver == "torch" or (solver == "auto" and device.type == "cuda") else None


def plan(options: SolverOptions, data_device: torch.device | str, *, multiclass: bool = False) -> Plan:
    """The one decision: dense or columns, numpy or torch, which device, for data on ``data_device``.

    Multi-class problems are solved on the CPU with numpy (the pair store has no torch backend): there
    ``solver="torch"`` cannot be honoured and a warning says so."""
    if multiclass:
        if options.solver == "torch":
            warnings.warn("solver='torch' is not available for multi-class heads: their pair problem is solved on "
                          "the CPU with numpy (use solver='auto' or 'numpy' to silence this)", stacklevel=3)
        return Plan(torch.device("cpu"), None, False)
    device = analysis_device(data_device)
    return Plan(device, solver_device(options.solver, device), options.dense)
