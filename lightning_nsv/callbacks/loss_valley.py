"""Evidence about the loss landscape of a skip network: Lemma 2.1, the escape path, a 2-D slice, Assumption 3.1."""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_nsv.analysis import (Assumption31Checks, LossSurface, assumption31_checks, escape_path,
                                    lemma21_certificate, loss_surface_2d)
from lightning_nsv.analysis.psi import check_finite
from lightning_nsv.analysis.valley import LOG2
from lightning_nsv.callbacks.dashboard import VALLEY_LOG_SCALE, valley_charts, with_log10
from lightning_nsv.callbacks.psi_rank import SkipNetworkMonitor, training_loader
from lightning_nsv.compat import pl, rank_zero_warn
from lightning_nsv.errors import NonFiniteError
from lightning_nsv.models.layers import eval_mode
from lightning_nsv.models.skip import SkipNetwork
from lightning_nsv.validate import check_choice, check_integer, check_positive, is_count


_CROSS_ENTROPY_NAMES = ("cross_entropy", "crossentropy", "ce", "cross-entropy", "nll", "log_loss")


def declared_loss(pl_module: pl.LightningModule) -> str | None:
    """A description of the training loss ``pl_module`` declares when it is not the cross-entropy, else None.

    Looked up: the attributes ``loss``, ``loss_fn``, ``criterion`` (a module, a function or a name) and
    ``hparams["loss"]``. A module that overrides ``training_step`` of :class:`SkipNetwork` and declares no
    loss is reported too (its loss cannot be told)."""
    hparams = getattr(pl_module, "hparams", {}) or {}
    declared = [(f"hparams['{key}']", hparams[key]) for key in ("loss", "loss_fn", "criterion") if key in hparams]
    declared += [(name, getattr(pl_module, name)) for name in ("loss", "loss_fn", "criterion")
                 if name in vars(pl_module) or name in getattr(pl_module, "_modules", {})]
    for where, loss in declared:
        if isinstance(loss, nn.CrossEntropyLoss) or loss is F.cross_entropy:
            continue
        name = loss if isinstance(loss, str) else getattr(loss, "__name__", type(loss).__name__)
        if str(name).lower().replace(" ", "_") not in _CROSS_ENTROPY_NAMES:
            return f"{where} = {name}"
    if not declared and type(pl_module).training_step is not SkipNetwork.training_step:
        return f"{type(pl_module).__name__} overrides training_step and declares no loss"
    return None


class LossValleyMonitor(SkipNetworkMonitor):
    """Certificates of Nguyen, Mukkamala & Hein (2019) on a :class:`~lightning_nsv.models.skip.SkipNetwork`.

    Every ``every_n_epochs`` training epochs, on the whole training set (rank 0 computes, the numbers are
    broadcast, every rank logs the same keys; skipped during sanity checking and ``fast_dev_run``):

    - **Lemma 2.1**: mean cross-entropy Φ against ``log(2)/N`` (Φ below it ⇒ zero training error) and the
      number of per-sample losses ``>= log 2`` (none ⇒ zero training error). The losses come from the float64
      Ψ and the output weights, ``G = Ψ V (+ b)``.
    - **Escape path** (proof of Theorem 3.4): ``V*`` with ``Ψ V* = Y t*`` (loss ``ε/2``), the loss along
      ``V(λ) = (1-λ)V + λV*`` and its maximum against the current loss. When rank Ψ < N the system is not
      solvable in general: the residual is logged, ``escape_applies`` is 0 and a warning says the
      certificate does not apply.
    - **2-D slice** of the loss of the whole network (all parameters, U and V, moved in place and restored)
      along two filter-normalised random directions (Li et al., 2018), seeded.
    - **Assumption 3.1**, checked once at the start of training: activation class (ReLU/Leaky-ReLU are outside
      the theory), ``M >= N``, duplicate training inputs. A failing check is logged as 0 and reported once
      in a rank-zero warning with its reason.

    The certificates are about the mean **cross-entropy** (the loss of :class:`SkipNetwork`). A model that
    declares another training loss (:func:`declared_loss`: ``loss``/``loss_fn``/``criterion`` attributes or
    hyperparameters, or an overridden ``training_step`` without one) gets a rank-zero warning at the start,
    ``valley/cross_entropy_model`` = 0 and the caveat in the end-of-fit summary; ``other_loss="error"``
    refuses such a model instead.

    At each analysis the verdicts (one line each: Lemma 2.1, the escape path, Assumption 3.1) go to TensorBoard's
    Text tab (``valley/report``; a ``.md`` file for other loggers), and at the end of fit rank zero prints them
    (``rank_zero_info``).

    A Ψ or outputs ``Ψ V + b`` with NaN or inf (a diverged network) have no certificates: as in
    :class:`~lightning_nsv.callbacks.psi_rank.PsiRankMonitor`, that analysis logs nothing, one warning says why,
    training goes on and the end-of-fit summary says so.

    Memory and time: Ψ (``8·N·M`` bytes) is held for the least-squares solve, so ``N·M·8`` must fit
    ``max_memory_bytes`` (checked at the start); the solve costs O(N·M·min(N, M)); the slice costs
    ``surface_points²`` passes over the training set.

    **Logged metrics** (``prefix`` defaults to ``"valley/"``), at the end of a training epoch, to
    ``callback_metrics`` and to the loggers once, TensorBoard's against the epoch (as for ``PsiRankMonitor``; the
    "valley" category of its Custom Scalars tab draws the verdicts together):

    - ``valley/mean_loss``, ``valley/max_loss``: mean and largest per-sample cross-entropy.
    - ``valley/lemma21_threshold``: ``log(2)/N``.
    - ``valley/num_losses_ge_log2``: per-sample losses ``>= log 2``.
    - ``valley/lemma21_certified``: 1.0 if the mean loss ``< log(2)/N``.
    - ``valley/per_sample_certified``: 1.0 if every per-sample loss ``< log 2``.
    - ``valley/escape_start_loss``, ``valley/escape_target_loss``, ``valley/escape_max_loss``: loss at V, at
      V* (ε/2 when exact) and the maximum along the segment.
    - ``valley/escape_residual``: relative residual of ``Ψ V* = Y t*``; ``valley/log10_escape_residual`` its log10,
      where positive (the Custom Scalars tab draws it).
    - ``valley/escape_applies``: 1.0 if the residual is within tolerance (the certificate holds).
    - ``valley/escape_in_sublevel_set``: 1.0 if the maximum along the path is ``<= max(start, target)``.
    - ``valley/escape_convexity_gap``: largest excess of the curve over its chord (≤ 0 up to rounding).
    - ``valley/escape_target_norm``: Frobenius norm of V*, only where the certificate applies: otherwise V* is a
      least-squares answer to an unsolvable system and its norm (1e11 for a near-singular Ψ) only says how near
      singular Ψ is; the Text tab's verdict gives it with that reason.
    - ``valley/surface_center_loss``, ``valley/surface_min_loss``, ``valley/surface_max_loss`` (when
      ``surface_points > 0``).
    - ``valley/assumption31_analytic_increasing``, ``valley/assumption31_skip_activation``,
      ``valley/assumption31_m_ge_n``, ``valley/assumption31_num_duplicates``, ``valley/assumption31_satisfied``.
    - ``valley/cross_entropy_model``: 1.0 if the model trains with the cross-entropy the certificates are about.

    Figures (TensorBoard, an image-logging logger, or PNG files under ``<log_dir>/figures``): ``valley/escape_path`` and ``valley/loss_surface``.

    Args:
        every_n_epochs: Run after every n-th training epoch.
        eps: ε of the escape path (loss ``ε/2`` at V*); None takes ``log(2)/N``, so that V* is certified by
            Lemma 2.1.
        path_points: Points on the escape path, endpoints included (>= 2).
        surface_points: Grid points per axis of the 2-D slice; 0 turns the slice off.
        surface_span: Half-width of the slice in units of the normalised directions.
        seed: Seed of the slice's directions.
        batch_size: Samples per forward pass.
        max_memory_bytes: Largest Ψ (``8·N·M`` bytes) the callback may hold.
        log_figure: Send the figures to the loggers (or files).
        prefix: Prefix of the logged keys and figure tags.
        other_loss: ``"warn"`` or ``"error"``: what to do with a model trained with another loss than the
            cross-entropy.

    Raises:
        ValueError: On arguments out of range here (``eps`` and ``surface_span`` must be finite); from
            ``on_train_start`` when Ψ exceeds ``max_memory_bytes``, or when the model declares another loss and
            ``other_loss="error"``.
        TypeError: On arguments of the wrong type here (a float or a bool for an integer, a string for a number, a
            non-bool ``log_figure``, a non-string ``prefix``); from ``setup`` when the LightningModule is not a
            ``SkipNetwork``.

    Example::

        >>> monitor = LossValleyMonitor(every_n_epochs=10, surface_points=9)
        >>> trainer = pl.Trainer(callbacks=[monitor], max_epochs=50)  # doctest: +SKIP
    """

    _figures = ("escape_path", "loss_surface")
    _headline = ("lemma21_certified", "escape_applies", "assumption31_satisfied")

    def __init__(
        self,
        every_n_epochs: int = 1,
        eps: float | None = None,
        path_points: int = 51,
        surface_points: int = 11,
        surface_span: float = 1.0,
        seed: int = 0,
        batch_size: int = 1024,
        max_memory_bytes: int = 2**30,
        log_figure: bool = True,
        prefix: str = "valley/",
        other_loss: str = "warn",
    ) -> None:
        super().__init__(every_n_epochs, batch_size, max_memory_bytes, log_figure, prefix)
        check_choice("other_loss", other_loss, ("warn", "error"))
        self.other_loss = other_loss
        self.other_loss_found: str | None = None
        if eps is not None:
            check_positive("eps", eps, " (the loss at V* is eps/2) or None for log(2)/N")
        for name, value, low in (("path_points", path_points, 2), ("surface_points", surface_points, 2),
                                 ("seed", seed, None)):
            if not is_count(value):
                check_integer(name, value, low)  # a TypeError; the ranges follow
        if path_points < 2:
            raise ValueError(f"`path_points` must be >= 2 (both ends of the path), got {path_points}")
        if surface_points < 0 or surface_points == 1:
            raise ValueError(f"`surface_points` must be 0 (no slice) or >= 2, got {surface_points}")
        check_positive("surface_span", surface_span)
        self.eps, self.path_points, self.seed = None if eps is None else float(eps), int(path_points), int(seed)
        self.surface_points, self.surface_span = int(surface_points), float(surface_span)
        self.checks: Assumption31Checks | None = None
        self._targets: Tensor | None = None
        self._warned_escape = False

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        loader = training_loader(self, trainer, self.batch_size)
        n, m = len(loader.dataset), pl_module.num_units
        if 8 * n * m > self.max_memory_bytes:  # checked on every rank, so that all of them stop
            raise ValueError(
                f"{type(self).__name__} holds Ψ ({n}x{m}, {8 * n * m / 2**20:.1f} MiB in float64), more than "
                f"max_memory_bytes={self.max_memory_bytes}; raise the limit or train on fewer samples"
            )
        self._check_loss(pl_module)
        if trainer.is_global_zero:
            self._check_assumptions(loader, pl_module)

    def _check_loss(self, pl_module: pl.LightningModule) -> None:
        self.other_loss_found = declared_loss(pl_module)
        if self.other_loss_found is None:
            return
        message = (f"{type(self).__name__}: the certificates of Nguyen et al. (2019) are about the mean cross-entropy, "
                   f"but the model trains with another loss ({self.other_loss_found}); they describe the "
                   "cross-entropy of the model's outputs, not its training objective")
        if self.other_loss == "error":
            raise ValueError(message + "; pass other_loss='warn' to compute them anyway")
        rank_zero_warn(message)

    def _check_assumptions(self, loader: Any, pl_module: SkipNetwork) -> None:
        batches = list(loader)
        inputs, self._targets = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches]).long()
        self.checks = assumption31_checks(pl_module.activations, pl_module.num_units, inputs)
        if self.checks.reasons:
            rank_zero_warn(
                f"{type(self).__name__}: Assumption 3.1 of Nguyen et al. (2019) does not hold for this "
                f"{type(pl_module).__name__} (mode {pl_module.mode!r}), so Theorem 3.4 does not apply:\n- "
                + "\n- ".join(self.checks.reasons)
            )

    def _compute(self, trainer: pl.Trainer, pl_module: SkipNetwork) -> dict[str, Any]:
        loader = training_loader(self, trainer, self.batch_size)
        psi, y = pl_module.psi(loader), self._targets.to(pl_module.device)
        check_finite(psi, "psi")
        V, b = (t.detach().to(torch.float64) if t is not None else None for t in pl_module.output_weights())
        logits = psi @ V + (0 if b is None else b)
        if not bool(torch.isfinite(logits).all()):
            raise NonFiniteError("the outputs Ψ V + b are not finite while Ψ is: the output weights have diverged")
        path = escape_path(psi, V, y, self.eps or math.log(2) / len(y), self.path_points, bias=b)
        if not path.applies and not self._warned_escape:
            self._warned_escape = True
            rank_zero_warn(
                f"{type(self).__name__}: the escape-path certificate does not apply: Ψ V* = Y t* has relative "
                f"residual {path.residual:.2e} (Ψ is {psi.shape[0]}x{psi.shape[1]}; it needs rank Ψ = N)"
            )
        results = {
            "loss": _LossKind(self.other_loss_found is None),
            "assumption31": self.checks,
            "lemma21": lemma21_certificate(F.cross_entropy(logits, y, reduction="none")),
            "escape_path": path,
        }
        if self.surface_points:
            results["loss_surface"] = self._surface(pl_module, loader)
        return results

    def _surface(self, pl_module: SkipNetwork, loader: Any) -> LossSurface:
        n = len(loader.dataset)

        def loss() -> float:
            total = sum(F.cross_entropy(pl_module(x.to(pl_module.device)), t.to(pl_module.device), reduction="sum")
                        for x, t, *_ in loader)
            return float(total) / n

        with eval_mode(pl_module):
            return loss_surface_2d(loss, list(pl_module.parameters()), self.surface_span, self.surface_points,
                                   self.seed)

    def _summary(self) -> list[str]:
        m = self.last_metrics
        lines = []
        if not m.get("cross_entropy_model", 1.0):
            lines.append(f"the model trains with another loss ({self.other_loss_found or 'not cross-entropy'}): the "
                         "verdicts below are about the cross-entropy of its outputs, not its training objective")
        n = round(LOG2 / m["lemma21_threshold"])
        lemma = "certified: zero training error" if m["lemma21_certified"] else "not certified"
        per_sample = ("every per-sample loss < log 2: zero training error" if m["per_sample_certified"] else
                      f"{int(m['num_losses_ge_log2'])} per-sample losses >= log 2")
        lines.append(f"Lemma 2.1: mean cross-entropy {m['mean_loss']:.3g} vs log(2)/N = {m['lemma21_threshold']:.3g} "
                     f"(N={n}): {lemma}; {per_sample}")
        if m["escape_applies"]:
            path = ("stays in the sublevel set of the current loss" if m["escape_in_sublevel_set"] else
                    "leaves the sublevel set (rounding?)")
            lines.append(f"escape path (Theorem 3.4): applies, the path to a loss of {m['escape_target_loss']:.3g} "
                         f"{path} (max {m['escape_max_loss']:.3g}, current {m['escape_start_loss']:.3g})")
        else:
            norm = m.get("escape_target_norm")
            lines.append(f"escape path (Theorem 3.4): does not apply, Ψ V* = Y t* has relative residual "
                         f"{m['escape_residual']:.2e} (it needs rank Ψ = N)"
                         + ("" if norm is None else f"; the least-squares V* (norm {norm:.2g}) solves nothing, so its "
                            "norm, which only says how near singular Ψ is, is not logged"))
        if m["assumption31_satisfied"]:
            lines.append("Assumption 3.1: satisfied")
        else:
            failed = [name for key, name in (("assumption31_analytic_increasing", "analytic increasing activations"),
                                             ("assumption31_skip_activation", "sigmoid-like or softplus skip units"),
                                             ("assumption31_m_ge_n", "M >= N")) if not m[key]]
            if m["assumption31_num_duplicates"]:
                failed.append(f"distinct inputs ({int(m['assumption31_num_duplicates'])} duplicates)")
            lines.append(f"Assumption 3.1: does not hold ({', '.join(failed)}): Theorem 3.4 does not apply")
        return lines

    def _logged(self, metrics: dict[str, float]) -> dict[str, float]:
        """All metrics but the norm of V* where the certificate does not apply (the summary says why), and the escape
        residual also as log10 (it spans decades)."""
        if not metrics.get("escape_applies", 1.0):
            metrics = {key: value for key, value in metrics.items() if key != "escape_target_norm"}
        return with_log10(metrics, VALLEY_LOG_SCALE)

    def dashboard_charts(self) -> tuple[str, dict[str, list[Any]]]:
        return valley_charts(self.prefix)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "warned_escape": self._warned_escape}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._warned_escape = state_dict.get("warned_escape", self._warned_escape)


class _LossKind:
    """Whether the model trains with the cross-entropy, as a logged result."""

    def __init__(self, cross_entropy: bool) -> None:
        self.cross_entropy = cross_entropy

    def to_metrics(self) -> dict[str, float]:
        return {"cross_entropy_model": float(self.cross_entropy)}
