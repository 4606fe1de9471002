"""Loss-valley certificates of skip-to-output networks (Nguyen, Mukkamala & Hein, ICLR 2019).

A skip network wires M hidden units straight to the K outputs, ``G = Ψ V`` with ``Ψ`` the N×M matrix of
those units' post-activation values on the N training samples (no bias column, never centred). With
``rank Ψ = N`` the cross-entropy landscape has no bad local valley (Lemma 3.2, Theorem 3.4); the rank of Ψ
is :mod:`lightning_nsv.analysis.psi`. This module holds the certificates as pure functions (torch only) that return
frozen dataclasses with ``to_metrics()``; ``lightning_nsv.callbacks`` decides when to run them and where the
numbers go. All of them are about the mean cross-entropy loss.

- :func:`lemma21_certificate`: ``Φ < log(2)/N`` ⇒ zero training error.
- :func:`escape_path`: the path of the proof of Theorem 3.4 from ``V`` to ``V*`` with ``Ψ V* = Y t*``.
- :func:`assumption31_checks`: activation class, ``M ≥ N``, distinct training inputs.
- :func:`loss_surface_2d`: loss on a plane through the weights along two filter-normalised directions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_nsv.analysis.psi import as_matrix64, check_finite
from lightning_nsv.analysis.result import AnalysisResult
from lightning_nsv.validate import check_positive, check_whole

LOG2 = math.log(2.0)
#: Assumption 3.1.1: real analytic and strictly increasing.
ANALYTIC_INCREASING = ("sigmoid", "softplus", "tanh", "linear")
#: Assumption 3.1.2 (activation part): bounded with limit 0 at -inf (sigmoid), or softplus.
SKIP_ACTIVATIONS = ("sigmoid", "softplus")
_WHY_NOT_ANALYTIC = {
    "relu": "relu is not real analytic (kink at 0) and not strictly increasing (flat below 0)",
    "leaky_relu": "leaky_relu is not real analytic (kink at 0)",
    "abs": "abs is neither real analytic (kink at 0) nor increasing",
}


# ------------------------------------------------------------------------------------------------ Lemma 2.1
@dataclass(frozen=True)
class Lemma21Certificate(AnalysisResult):
    """Lemma 2.1: a mean cross-entropy ``Φ < log(2)/N`` implies zero training error.

    ``certified`` is that sufficient condition. ``per_sample_certified`` is the weaker sufficient condition
    the proof goes through: every per-sample loss ``< log 2`` (the true class then has the largest output).
    """

    num_samples: int
    mean_loss: float
    max_loss: float
    threshold: float
    num_at_least_log2: int

    @property
    def certified(self) -> bool:
        return self.mean_loss < self.threshold

    @property
    def per_sample_certified(self) -> bool:
        return self.num_at_least_log2 == 0

    def to_metrics(self) -> dict[str, float]:
        return {
            "mean_loss": self.mean_loss,
            "max_loss": self.max_loss,
            "lemma21_threshold": self.threshold,
            "num_losses_ge_log2": float(self.num_at_least_log2),
            "lemma21_certified": float(self.certified),
            "per_sample_certified": float(self.per_sample_certified),
        }


def lemma21_certificate(per_sample_losses: Any) -> Lemma21Certificate:
    """Lemma 2.1 certificate from the N per-sample cross-entropy losses of the training set.

    Args:
        per_sample_losses: 1-D tensor/array of the N losses (``reduction="none"``), all ``>= 0``.

    Raises:
        ValueError: If the losses are not a non-empty 1-D vector of finite, non-negative numbers.

    Example::

        >>> c = lemma21_certificate([0.5, 0.6])
        >>> c.certified, c.per_sample_certified  # mean 0.55 >= log(2)/2, but every loss < log 2
        (False, True)
    """
    loss = torch.as_tensor(per_sample_losses).detach().to(torch.float64)
    if loss.dim() != 1 or loss.numel() == 0:
        raise ValueError(f"`per_sample_losses` must be a non-empty 1-D vector, got shape {tuple(loss.shape)}")
    if not torch.isfinite(loss).all() or (loss < -1e-12).any():
        raise ValueError(
            f"`per_sample_losses` must be finite and >= 0 (cross-entropy), got min {float(loss.min())}; "
            "pass reduction='none' losses, not logits"
        )
    n = loss.numel()
    return Lemma21Certificate(n, float(loss.mean()), float(loss.max()), LOG2 / n, int((loss >= LOG2).sum()))


# ------------------------------------------------------------------------------------------ escape path
@dataclass(frozen=True)
class EscapePath(AnalysisResult):
    """The path of the proof of Theorem 3.4: ``V(λ) = (1-λ)V + λV*`` with ``Ψ V* = Y t*``.

    ``target_loss`` is ``ε/2`` when the system is solved exactly; ``applies`` says whether it was
    (relative residual ``||Ψ V* + 1bᵀ - Y t*||_F / ||Y t*||_F`` at most the tolerance; in exact arithmetic
    that needs rank Ψ = N). Since Φ is convex in V, the loss on the segment stays at or below the chord,
    hence below ``max(start_loss, target_loss)``: ``in_sublevel_set`` checks that, ``max_convexity_gap``
    (≤ 0 up to rounding) is the largest excess of the curve over the straight chord.
    """

    lambdas: Tensor
    losses: Tensor
    eps: float
    t_star: float
    residual: float
    residual_tol: float
    target_norm: float

    @property
    def start_loss(self) -> float:
        return float(self.losses[0])

    @property
    def target_loss(self) -> float:
        return float(self.losses[-1])

    @property
    def max_loss(self) -> float:
        return float(self.losses.max())

    @property
    def applies(self) -> bool:
        return self.residual <= self.residual_tol

    @property
    def max_convexity_gap(self) -> float:
        chord = (1 - self.lambdas) * self.losses[0] + self.lambdas * self.losses[-1]
        return float((self.losses - chord).max())

    @property
    def in_sublevel_set(self) -> bool:
        top = max(self.start_loss, self.target_loss)
        return self.max_loss <= top + 1e-12 * max(1.0, top)

    def to_metrics(self) -> dict[str, float]:
        return {
            "escape_start_loss": self.start_loss,
            "escape_target_loss": self.target_loss,
            "escape_max_loss": self.max_loss,
            "escape_residual": self.residual,
            "escape_applies": float(self.applies),
            "escape_in_sublevel_set": float(self.in_sublevel_set),
            "escape_convexity_gap": self.max_convexity_gap,
            "escape_target_norm": self.target_norm,
        }
    def plot(self, ax: Any = None) -> tuple[Any, Any]:
        """Loss along the segment, the current loss and ε/2; returns ``(fig, ax)``
        (:func:`~lightning_nsv.plotting.plot_escape_path`)."""
        from lightning_nsv.plotting import plot_escape_path  # matplotlib only where a figure is drawn

        return plot_escape_path(self, ax)


def escape_path(
    psi: Any,
    V: Any,
    targets: Any,
    eps: float,
    num_points: int = 51,
    bias: Any = None,
    residual_tol: float = 1e-6,
) -> EscapePath:
    """Escape-path certificate of Theorem 3.4 at the current output weights ``V``.

    Solves ``Ψ V* = Y t* - 1bᵀ`` (Y one-hot, ``t* = log((K-1)/(e^{ε/2} - 1))``) by float64 least squares,
    minimum-norm when Ψ has more columns than rows, so that the outputs at ``V*`` are ``t*`` on the true
    class and 0 elsewhere and every per-sample loss is exactly ``ε/2``. Then evaluates the mean
    cross-entropy of ``G(λ) = Ψ V(λ) + 1bᵀ`` on ``num_points`` values of λ in [0, 1]. When rank Ψ < N the
    system is in general not solvable: the residual says so and ``applies`` is False (the curve is still
    reported, to the least-squares ``V*``). Cost: one least-squares solve, O(N·M·min(N, M)).

    Args:
        psi: N×M skip-unit outputs on the training set.
        V: M×K output weights (``head.weight.T``).
        targets: N class labels in ``0..K-1``.
        eps: ε > 0; the loss at ``V*`` is ε/2. ``log(2)/N`` makes ``V*`` certified by Lemma 2.1.
        num_points: Points on the segment, endpoints included (>= 2).
        bias: Optional K output biases, held fixed along the path.
        residual_tol: Largest relative residual for which the certificate applies.

    Raises:
        ValueError: On shapes that do not fit together, K < 2, labels that are not integers in ``0..K-1``, ``eps``
            outside ``(0, inf)``, ``num_points < 2`` or ``residual_tol`` outside ``[0, inf)``.
        NonFiniteError: If ``psi``, ``V`` or ``bias`` hold NaN or inf (a ValueError).
        TypeError: If ``eps`` is not a real number or ``num_points`` not an integer.

    Example::

        >>> p = escape_path(torch.eye(4), torch.zeros(4, 3), torch.tensor([0, 1, 2, 0]), eps=0.1)
        >>> round(p.target_loss, 6), p.applies, p.in_sublevel_set
        (0.05, True, True)
    """
    psi, V, y, b = _escape_inputs(psi, V, targets, bias, eps, num_points, residual_tol)
    k = V.shape[1]
    t_star = math.log(k - 1) - eps / 2 - math.log(-math.expm1(-eps / 2))  # log((K-1)/expm1(ε/2)), no overflow
    target = F.one_hot(y, k).to(torch.float64) * t_star
    V_star = torch.linalg.lstsq(psi, target - b, driver="gelsd").solution
    residual = float(torch.linalg.norm(psi @ V_star + b - target) / torch.linalg.norm(target))
    g0, g1 = psi @ V + b, psi @ V_star + b
    lambdas = torch.linspace(0, 1, num_points, dtype=torch.float64)
    losses = torch.stack([F.cross_entropy(g0 + t * (g1 - g0), y) for t in lambdas])
    return EscapePath(lambdas, losses, eps, t_star, residual, residual_tol, float(torch.linalg.norm(V_star)))


def _escape_inputs(psi: Any, V: Any, targets: Any, bias: Any, eps: float, num_points: int,
                   residual_tol: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Ψ, V, the labels and the biases of :func:`escape_path`, checked to fit together and to be finite (and the
    scalar arguments), on the CPU (float64 and int64)."""
    psi, V = as_matrix64(psi, "psi"), as_matrix64(V, "V")
    n, m = psi.shape
    k = V.shape[1]
    labels = torch.as_tensor(targets).detach().cpu()
    y = labels.to(torch.int64)
    if V.shape[0] != m:
        raise ValueError(f"`V` must be M x K with M = {m} (the columns of psi), got {tuple(V.shape)}")
    if k < 2:
        raise ValueError(f"the cross-entropy needs K >= 2 outputs, got V of shape {tuple(V.shape)}")
    if y.shape != (n,):
        raise ValueError(f"`targets` must hold N = {n} labels (the rows of psi), got shape {tuple(y.shape)}")
    if not bool((y == labels).all()):
        raise ValueError(f"`targets` must be integer class labels in 0..{k - 1}, got {labels[y != labels][0].item():g}")
    if (y < 0).any() or (y >= k).any():
        raise ValueError(f"`targets` must be class indices in 0..{k - 1}, got range [{int(y.min())}, {int(y.max())}]")
    check_positive("eps", eps, " (the loss at V* is eps/2)")
    check_whole("num_points", num_points, 2, ">= 2 (both endpoints) and an integer")
    if not 0 <= residual_tol < math.inf:
        raise ValueError(f"`residual_tol` must be a relative residual in [0, inf), got {residual_tol}")
    b = torch.zeros(k, dtype=torch.float64) if bias is None else torch.as_tensor(bias).detach().to(torch.float64)
    if b.shape != (k,):
        raise ValueError(f"`bias` must hold K = {k} values, got shape {tuple(b.shape)}")
    for name, values in (("psi", psi), ("V", V), ("bias", b.reshape(-1, 1))):
        check_finite(values, name)  # lstsq on NaN fails inside LAPACK
    return psi, V, y, b.cpu()



# ----------------------------------------------------------------------------------------- Assumption 3.1
@dataclass(frozen=True)
class Assumption31Checks(AnalysisResult):
    """The checkable parts of Assumption 3.1, each with a reason when it fails.

    - ``analytic_increasing`` (3.1.1): every hidden activation is real analytic and strictly increasing.
    - ``skip_activation`` (3.1.2, activation part): the skip units are sigmoid-like (bounded, limit 0 at
      -inf) or softplus. Checked as a sufficient condition on all skip units; the softplus backward-path
      condition is not checked.
    - ``m_ge_n``: M ≥ N skip units (rank N needs it).
    - ``distinct_inputs`` (3.1.3): no two training inputs are equal. For a convolutional first layer the
      assumption asks every input patch to differ; only whole inputs are compared (necessary, not
      sufficient).
    """

    activations: tuple[str, ...]
    num_samples: int
    num_units: int
    num_duplicates: int
    reasons: tuple[str, ...] = field(default=())

    @property
    def analytic_increasing(self) -> bool:
        return all(a in ANALYTIC_INCREASING for a in self.activations)

    @property
    def skip_activation(self) -> bool:
        return all(a in SKIP_ACTIVATIONS for a in self.activations)

    @property
    def m_ge_n(self) -> bool:
        return self.num_units >= self.num_samples

    @property
    def distinct_inputs(self) -> bool:
        return self.num_duplicates == 0

    @property
    def satisfied(self) -> bool:
        return self.analytic_increasing and self.skip_activation and self.m_ge_n and self.distinct_inputs

    def to_metrics(self) -> dict[str, float]:
        return {
            "assumption31_analytic_increasing": float(self.analytic_increasing),
            "assumption31_skip_activation": float(self.skip_activation),
            "assumption31_m_ge_n": float(self.m_ge_n),
            "assumption31_num_duplicates": float(self.num_duplicates),
            "assumption31_satisfied": float(self.satisfied),
        }

    def report(self) -> str:
        """The metrics, then each reason that a condition fails."""
        return "\n".join([super().report(), *(f"- {reason}" for reason in self.reasons)])


def count_duplicates(inputs: Any) -> int:
    """Number of training inputs equal to an earlier one (N minus the number of distinct inputs)."""
    x = torch.as_tensor(inputs).detach()
    if x.dim() < 1 or x.shape[0] == 0:
        raise ValueError(f"`inputs` must hold N >= 1 samples along dim 0, got shape {tuple(x.shape)}")
    return x.shape[0] - torch.unique(x.reshape(x.shape[0], -1), dim=0).shape[0]


def assumption31_checks(activations: Sequence[str], num_units: int, inputs: Any) -> Assumption31Checks:
    """Checks Assumption 3.1 of the paper for a skip network and its training inputs.

    Args:
        activations: A sequence of names of the hidden activations (``"sigmoid"``, ``"softplus"``, ``"tanh"``,
            ``"relu"``, ``"leaky_relu"``, ...; any case, so ``"Sigmoid"`` too), one per hidden layer or one for all.
        num_units: M, the number of skip units.
        inputs: The N training inputs, samples along dim 0.

    Raises:
        TypeError: If ``activations`` is a single string, not a sequence of names, or ``num_units`` no integer.
        ValueError: If ``activations`` is empty, ``num_units < 1`` or ``inputs`` holds no sample.

    Example::

        >>> c = assumption31_checks(["relu"], num_units=3, inputs=torch.eye(4))
        >>> c.analytic_increasing, c.m_ge_n, c.distinct_inputs, len(c.reasons)
        (False, False, True, 2)
    """
    if isinstance(activations, (str, bytes)):
        raise TypeError(f"`activations` must be a sequence of names, e.g. [{activations!r}], not a string")
    names = tuple(dict.fromkeys(str(a).lower() for a in activations))
    if not names:
        raise ValueError("`activations` must name at least one hidden activation, got none")
    check_whole("num_units", num_units, 1, "a positive integer (M, the skip units)")
    dup = count_duplicates(inputs)
    n = torch.as_tensor(inputs).shape[0]
    reasons = []
    for a in names:
        if a not in ANALYTIC_INCREASING:
            why = _WHY_NOT_ANALYTIC.get(a, f"{a!r} is not among the known real-analytic, strictly increasing "
                                           f"activations {', '.join(ANALYTIC_INCREASING)}")
            reasons.append(f"Assumption 3.1.1: {why}; ReLU/Leaky-ReLU networks are outside Theorem 3.4 "
                           "(Ψ and its rank are still computed)")
        elif a not in SKIP_ACTIVATIONS:
            reasons.append(f"Assumption 3.1.2: {a} skip units are neither sigmoid-like (bounded, limit 0 at -inf) "
                           "nor softplus, so Lemma 3.2's full-rank argument does not cover them"
                           + (" (tanh tends to -1)" if a == "tanh" else ""))
    if num_units < n:
        reasons.append(f"M >= N: only M = {num_units} skip units for N = {n} training samples, so rank Ψ <= "
                       f"{num_units} < N; add at least {n - num_units} skip units")
    if dup:
        reasons.append(f"Assumption 3.1.3: {dup} of the N = {n} training inputs repeat an earlier one, so Ψ has "
                       "equal rows and rank < N; drop the duplicates")
    return Assumption31Checks(names, n, int(num_units), dup, tuple(reasons))


# ------------------------------------------------------------------------------------------ 2-D loss slice
@dataclass(frozen=True)
class LossSurface(AnalysisResult):
    """Loss on ``θ + t₁ d₁ + t₂ d₂`` over a square grid; ``losses[i, j]`` is at ``(t1[i], t2[j])``.

    ``d₁``, ``d₂`` are the two filter-normalised directions, ``t₁``, ``t₂`` the steps along them.
    """

    t1: Tensor
    t2: Tensor
    losses: Tensor
    center_loss: float

    def to_metrics(self) -> dict[str, float]:
        return {
            "surface_center_loss": self.center_loss,
            "surface_min_loss": float(self.losses.min()),
            "surface_max_loss": float(self.losses.max()),
        }
    def plot(self, ax: Any = None) -> tuple[Any, Any]:
        """Filled contour of ``log10`` of the loss, the current weights marked; returns ``(fig, ax)``
        (:func:`~lightning_nsv.plotting.plot_loss_surface`)."""
        from lightning_nsv.plotting import plot_loss_surface  # matplotlib only where a figure is drawn

        return plot_loss_surface(self, ax)


def filter_normalised_direction(param: Tensor, generator: torch.Generator) -> Tensor:
    """Gaussian direction shaped like ``param``, each filter (slice along dim 0) rescaled to the norm of
    the parameter's filter (Li et al., 2018). 1-D parameters (biases, norms' scales) get direction 0."""
    if param.dim() <= 1:
        return torch.zeros_like(param)
    d = torch.randn(param.shape, generator=generator, dtype=torch.float64)
    p = param.detach().to(device="cpu", dtype=torch.float64)
    dims = tuple(range(1, param.dim()))
    norm_d = torch.linalg.vector_norm(d, dim=dims, keepdim=True).clamp_min(1e-12)
    d = d * (torch.linalg.vector_norm(p, dim=dims, keepdim=True) / norm_d)
    return d.to(device=param.device, dtype=param.dtype)


def loss_surface_2d(
    loss_fn: Callable[[], Any], params: Sequence[Tensor], span: float = 1.0, num_points: int = 11, seed: int = 0
) -> LossSurface:
    """Loss on a plane through the current parameters along two filter-normalised random directions.

    Sets each parameter to ``θ + t₁ d₁ + t₂ d₂`` for t₁, t₂ on a ``num_points`` grid over ``[-span, span]``,
    calls ``loss_fn()`` and restores the parameters exactly afterwards (also on error). Cost:
    ``num_points²`` calls of ``loss_fn``.

    Args:
        loss_fn: Returns the loss (a number or 0-d tensor) at the current parameter values.
        params: The parameters to move (e.g. ``list(module.parameters())``).
        span: Half-width of the grid in units of the normalised directions.
        num_points: Grid points per axis (>= 2; odd puts 0 on the grid).
        seed: Seed of the two directions (drawn on the CPU, so device-independent).

    Raises:
        ValueError: If ``params`` is empty, ``span`` is not in (0, inf) or ``num_points < 2``.
        TypeError: If ``span`` is not a number or ``num_points`` not an integer.
    """
    params = list(params)
    if not params:
        raise ValueError("`params` must hold at least one parameter tensor, got none")
    check_positive("span", span)
    check_whole("num_points", num_points, 2, "an integer >= 2")
    g = torch.Generator().manual_seed(seed)
    d1, d2 = ([filter_normalised_direction(p, g) for p in params] for _ in range(2))
    grid = torch.linspace(-span, span, num_points, dtype=torch.float64)
    saved = [p.detach().clone() for p in params]
    losses = torch.empty(num_points, num_points, dtype=torch.float64)
    with torch.no_grad():
        center = float(loss_fn())
        try:
            for i, t1 in enumerate(grid.tolist()):
                for j, t2 in enumerate(grid.tolist()):
                    for p, p0, u, v in zip(params, saved, d1, d2):
                        p.copy_(p0 + t1 * u + t2 * v)
                    losses[i, j] = float(loss_fn())
        finally:
            for p, p0 in zip(params, saved):
                p.copy_(p0)
    return LossSurface(grid, grid.clone(), losses, center)
