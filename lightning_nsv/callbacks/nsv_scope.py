"""What :class:`~lightning_nsv.callbacks.NetworkSupportVectors` analyses (its ``scope``): the whole module, traced
into the pair network of DESIGN.md §2c (:func:`~lightning_nsv.analysis.whole_network_support_vectors`), or the
Linear/Leaky-ReLU head that :func:`~lightning_nsv.extract.find_path_part` finds after a trunk treated as a fixed
embedding (paper 000's CNN + FC protocol); how it is chosen, evaluated, fitted, compared between analyses and said."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from lightning_nsv.callbacks.nsv_data import _analysis_device, _module_inputs, _split_batch, _val_dataset
from lightning_nsv.compat import rank_zero_info
from lightning_nsv.extract import PathPart, UnsupportedNetworkError, find_path_part
from lightning_nsv.kernel import NotPiecewiseLinearError, PiecewiseGraph, ScopeSummary, compute_gates, scope_summary, \
    trace
from lightning_nsv.kernel.graph import run
from lightning_nsv.kernel.pair_network import MEMORY_BYTES
from lightning_nsv.models.layers import eval_mode
from lightning_nsv.analysis.binary import network_support_vectors
from lightning_nsv.analysis.multiclass import multiclass_support_vectors
from lightning_nsv.analysis.whole_network import whole_network_cost
from lightning_nsv.analysis.whole_network_budget import SAY_ABOVE_SECONDS, TimeBudgetError
from lightning_nsv.kernel.formulas import forward_with_slopes
from lightning_nsv.kernel.network import PathNetwork

SCOPES = ("auto", "whole", "head")
#: Training samples the module is traced on (shapes, and the check that the graph reproduces the module).
EXAMPLE_SAMPLES = 8
COST_SAMPLES = 32  # training inputs that the pair network's rate is measured on before training
HEAD_CHOICE = ("In NetworkSupportVectors: `scope='head'` (with `embedding=`/`path_module=` naming the trunk and the "
               "head where the module has several) analyses the Linear/Leaky-ReLU head after the rest as a fixed "
               "embedding.")


class NoAnalysableScopeError(UnsupportedNetworkError, NotPiecewiseLinearError):
    """Neither the whole module is piecewise linear nor does it have a head the analysis can read."""


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
        """``N(x)`` in float64, ``(n,)`` or ``(n, K)``, a block of rows at a time; NaN stays NaN (said by the pass)."""
        step = max(1, MEMORY_BYTES // (8 * max(1, self.graph.peak_elements)))
        parts = [run(self.graph, x[lo:lo + step].to(self.graph.device, torch.float64), "forward", _Discard())
                 for lo in range(0, len(x), step)]
        out = torch.cat(parts).reshape(len(x), -1) if parts else torch.zeros(0, self.num_outputs, dtype=torch.float64)
        return out[:, 0] if self.num_outputs == 1 else out


@dataclass(frozen=True)
class WholeNetwork:
    """The whole module as the analysed part, in the place of a :class:`~lightning_nsv.extract.PathPart`: its inputs
    are the raw ones (``embed`` leaves them as they are) and ``path_network()`` traces the current weights."""

    name: str
    num_outputs: int
    summary: ScopeSummary
    module: nn.Module
    example: Tensor
    embedding: None = None

    def embed(self, x: Tensor) -> Tensor:
        return x

    def path_network(self) -> TracedNetwork:
        with eval_mode(self.module), torch.no_grad():
            return TracedNetwork(trace(self.module, self.example), self.module)


def network_outputs64(net: PathNetwork | TracedNetwork, x: Tensor) -> Tensor:
    """``N(x)`` in float64 of the analysed function: the head's path network, or the whole traced module."""
    return net.outputs(x) if isinstance(net, TracedNetwork) else forward_with_slopes(net, x)[0]


def _example_inputs(dataset: Dataset, count: int = EXAMPLE_SAMPLES) -> Tensor:
    """The first ``count`` training inputs (their labels are checked with the first batch)."""
    tensors = getattr(dataset, "tensors", None)
    if isinstance(tensors, (tuple, list)) and tensors:
        return tensors[0][:count]
    return torch.stack([torch.as_tensor(_split_batch(dataset[i])[0]) for i in range(min(count, len(dataset)))])


def _kinds(module: nn.Module) -> str:
    counts = Counter(type(m).__name__ for m in module.modules()
                     if not list(m.children()) and not isinstance(m, (nn.Identity, nn.Dropout)))
    return ", ".join(f"{n} {kind}" if n > 1 else kind for kind, n in counts.items())


def _parameter_free(module: nn.Module | None) -> bool:
    return module is None or not any(True for _ in module.parameters())


def head_scope_line(part: PathPart, embedding: str | None = None) -> str:
    """``head only: …; trunk … is a fixed embedding (paper 000's CNN + FC)``, from the head ``part``."""
    sizes = "→".join(str(n) for n in [part.linears[0].in_features, *(lin.out_features for lin in part.linears)])
    slopes = sorted({(b, g) for b, g in zip(part.betas, part.gammas)})
    gates = "; ".join(f"β = {b:g}, γ = {g:g}" for b, g in slopes)
    count = f"{len(part.linears)} Linear layer{'s' * (len(part.linears) > 1)}"
    line = f"head only: {count} of {part.name} ({sizes}{', gates ' + gates if gates else ''})"
    if _parameter_free(part.embedding):
        return f"{line}; no trunk, so the head is the whole network"
    named = f"`{embedding}` " if embedding else ""
    return f"{line}; trunk {named}({_kinds(part.embedding)}) is a fixed embedding (paper 000's CNN + FC)"


def _is_the_head(part: PathPart | None, summary: ScopeSummary) -> bool:
    """Whether the traced module is no more than the head (a Linear/Leaky-ReLU chain after reshapes)."""
    return (part is not None and _parameter_free(part.embedding) and summary.max_pools == 0
            and summary.maps == len(part.linears) and summary.gate_layers == len(part.linears) - 1)


class ScopeChoice:
    """How :class:`NetworkSupportVectors` decides and states what it analyses, a part of it (which holds ``scope``,
    ``path_module``, ``embedding``, ``intercept``, ``multiclass``, ``kernel`` and ``_path``, ``_module_mismatch``)."""

    def _find_head(self, pl_module: nn.Module) -> None:
        """At ``setup``: the head (``scope="head"``: refused here without one, as before scopes)."""
        self._head, self._head_error, self._scope_text = None, None, None
        if self.scope == "head" or self.path_module is not None or self.embedding is not None:
            self._head = find_path_part(pl_module, self.path_module, self.embedding)
        else:
            try:
                self._head = find_path_part(pl_module)
            except UnsupportedNetworkError as err:
                self._head_error = str(err)
        self._path = self._head

    def _choose_scope(self, pl_module: nn.Module, example: Tensor) -> None:
        """Decide the scope on ``example`` inputs, once: ``"whole"`` traces the module; ``"auto"`` takes the head where
        ``path_module``/``embedding`` name one, or the head analysis needs an option (``intercept``, ``"ovr"``), or
        the module is not piecewise linear (said), else the whole module — by the head's code path (same kernel,
        its fast path) where the module is no more than its head."""
        if self._scope_text is not None:
            return
        if self.scope == "head" or (self.scope == "auto" and (self.path_module or self.embedding)):
            return self._use_head(head_scope_line(self._head, self.embedding))
        example = example[:EXAMPLE_SAMPLES].detach()
        try:
            with eval_mode(pl_module), torch.no_grad():
                graph = trace(pl_module, example)
        except (NotPiecewiseLinearError, ValueError) as err:  # ValueError: e.g. a graph that is not the module's
            if self.scope == "whole":
                raise type(err)(f"NetworkSupportVectors(scope='whole'): {err} {HEAD_CHOICE}") from None
            how = "is not piecewise linear" if isinstance(err, NotPiecewiseLinearError) else "could not be traced"
            return self._fall_back(pl_module, f"it {how} as a whole: {str(err).rstrip('.')}")
        summary = scope_summary(graph)
        if self.scope == "auto" and _is_the_head(self._head, summary):
            self._path = self._head
            if self._module_mismatch(pl_module, example, "the example inputs") is None:
                return self._use_head(f"path kernel of the {summary} (a Linear/Leaky-ReLU chain: the head's kernel)")
        if self.scope == "auto" and (self.intercept or (self.multiclass == "ovr" and graph.num_outputs > 1)):
            option = "`intercept=True` (the paper's SVC protocol)" if self.intercept else "`multiclass='ovr'`"
            return self._fall_back(pl_module, f"{option} is an analysis of the head")
        self._path = WholeNetwork(f"{type(pl_module).__name__} (whole network)", graph.num_outputs, summary,
                                  pl_module, example.cpu())
        self._scope_text = f"path kernel of the {summary}"
        if self.kernel == "dense":
            rank_zero_info("NetworkSupportVectors: `kernel='dense'` does not apply to the whole network: its kernel "
                           "columns come from the pair network, for candidate support vectors only")

    def _check_cost(self, trainer, pl_module: nn.Module, dataset: Dataset) -> None:
        """Before training: what the whole-network analysis at zero training error will cost (the pair network's
        rate on a few training inputs, the architecture's, not the weights'), said when long, and refused above
        ``time_budget`` (every rank takes rank 0's verdict); refused on every rank where the estimate refuses on one
        (the memory the analysis allocates before its solver, checked on each)."""
        sample = _module_inputs(pl_module, _example_inputs(dataset, COST_SAMPLES))
        if not bool(torch.isfinite(sample).all()):
            return  # the first batch's check names the data
        refusal, here = None, None
        try:
            estimate = whole_network_cost(pl_module, sample, len(dataset), len(_val_dataset(trainer) or ()))
        except ValueError as err:  # e.g. the memory it allocates before its solver does not fit this rank
            here = f"NetworkSupportVectors: before training, for the analysis at zero training error: {err}"
        else:
            if estimate.seconds > SAY_ABOVE_SECONDS:
                self._say(trainer, f"NetworkSupportVectors: at zero training error, the {estimate.describe()}")
            try:
                estimate.check(self.time_budget, self._budget_advice)
            except TimeBudgetError as err:
                refusal = f"NetworkSupportVectors: {err}"
        refusal = trainer.strategy.broadcast(refusal, src=0)  # rank 0's rate decides
        fits = trainer.strategy.reduce_boolean_decision(here is None, all=True)  # no rank raises alone
        if refusal is not None:
            raise TimeBudgetError(refusal)
        if not fits:
            raise ValueError(here or "NetworkSupportVectors: before training, another rank refused the analysis at "
                             "zero training error (see that rank's error, e.g. its memory)")

    @property
    def _budget_advice(self) -> str:
        """What a time-budget refusal suggests besides a subsample: the head where the module has one."""
        if self._head is not None:
            return f"its head (NetworkSupportVectors(scope='head'): {head_scope_line(self._head, self.embedding)})"
        return "a smaller network (this module has no Linear/Leaky-ReLU head after an nn.Flatten to analyse instead)"

    def _use_head(self, text: str) -> None:
        self._path, self._scope_text = self._head, text

    def _fall_back(self, pl_module: nn.Module, why: str) -> None:
        name = type(pl_module).__name__
        if self._head is None:
            raise NoAnalysableScopeError(
                f"NetworkSupportVectors: {name} has nothing the analysis can read: the whole module is not "
                f"analysed because {why}; and it has no head: {self._head_error}")
        line = head_scope_line(self._head, self.embedding)
        rank_zero_info(f"NetworkSupportVectors: the whole of {name} is not analysed because {why}. Analysing its head "
                       f"instead ({line}); pass `scope='head'` to choose it without this message.")
        self._use_head(line)

    @property
    def _whole(self) -> bool:
        return isinstance(self._path, WholeNetwork)

    @property
    def _scope_label(self) -> str:
        """What was analysed, in a few words (the summary card's heading)."""
        if self._whole or (self._head is not None and _parameter_free(self._head.embedding)):
            return "whole network"
        return "head only (trunk fixed)"

    def _report_of(self, analysis: Any) -> str:
        """The analysis' report, its first line saying what was analysed."""
        report = analysis.report()
        return report if self._whole or self._scope_text is None else f"{self._scope_text}\n{report}"

    def _embedded_training_set(self, dataset: Dataset, pl_module) -> tuple[Tensor, Tensor]:
        """The analysed part's training inputs (the head's: the trunk's outputs, flattened; the whole network's: the
        raw inputs), kept from the zero-error pass where it kept them."""
        kept, self._kept = self._kept, []
        if kept:
            return torch.cat([b[0] for b in kept]), torch.cat([b[1] for b in kept])
        return self._embed_all(dataset, pl_module)

    def _embed_all(self, dataset: Dataset, pl_module) -> tuple[Tensor, Tensor]:
        # an own generator: iterating a DataLoader would otherwise draw from the global RNG of training
        loader = DataLoader(dataset, batch_size=self.batch_size, shuffle=False, generator=torch.Generator())
        with eval_mode(pl_module), torch.no_grad():
            device = _analysis_device(pl_module)
            parts = [(self._path.embed(_module_inputs(pl_module, x)).to(device), y) for x, y in map(_split_batch, loader)]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    def _fit_max_margin(self, net, x_train, y_train, x_val, y_val, sharing=None, say=None, progress=False):
        if isinstance(net, TracedNetwork):  # under DDP with `sharing`: the other ranks compute shards of the rows
            from lightning_nsv.analysis import whole_network_support_vectors

            return whole_network_support_vectors(net.module, x_train, y_train, x_val, y_val, delta=self.delta,
                                                 initial=self._previous_support or None, solver=self.solver,
                                                 sharing=sharing, time_budget=self.time_budget, say=say,
                                                 progress=progress, budget_advice=self._budget_advice)
        if net.num_outputs == 1:
            return network_support_vectors(
                net, x_train, y_train, x_val, y_val, intercept=self.intercept, C=self.C, delta=self.delta,
                kernel=self.kernel, max_dense_bytes=self.max_dense_bytes,
                initial=self._previous_support or None, sharing=sharing, solver=self.solver,
                cache=None if self.stop_on_zero_error else self._gram_cache,  # rows kept for the next analysis only
            )
        return multiclass_support_vectors(net, x_train, y_train, x_val, y_val, method=self.multiclass,
                                          delta=self.delta, solver=self.solver)  # on the CPU: warns for "torch"

    def _patterns_changed(self, net, x_train: Tensor) -> int | None:
        """Training samples whose activation pattern (every slope bit; max-pool selections of the whole network)
        changed since the last analysis (None at the first). A per-sample comparison:
        ``unique_patterns`` counts distinct patterns, which does not give it."""
        packed = _patterns(net, x_train)
        if packed is None:
            return None
        previous, self._previous_patterns = self._previous_patterns, packed
        if previous is None or previous.shape != packed.shape:
            return None
        return int((previous != packed).any(1).sum())


def _patterns(net, x_train: Tensor) -> Tensor | None:
    """Each sample's gates packed in bytes, ``(m, bytes)``; ``None`` for a network without gates."""
    if isinstance(net, TracedNetwork):
        gates = compute_gates(net.graph, x_train)
        m = len(gates)
        bits = [b.reshape(m, -1).cpu() for b in gates.bits.values()]
        parts = [np.packbits(torch.cat(bits, 1).numpy(), axis=1)] if bits else []
        parts += [s.reshape(m, -1).cpu().contiguous().numpy().view(np.uint8) for s in gates.selections.values()]
        return torch.from_numpy(np.concatenate(parts, axis=1)) if parts else None
    slopes = forward_with_slopes(net.to(x_train.device), x_train)[1]
    if not slopes:
        return None
    bits = torch.cat([s == g for s, g in zip(slopes, net.gammas)], dim=1).cpu().numpy()
    return torch.from_numpy(np.packbits(bits, axis=1))


__all__ = ["NoAnalysableScopeError", "SCOPES", "ScopeChoice", "TracedNetwork", "WholeNetwork", "head_scope_line",
           "network_outputs64"]
