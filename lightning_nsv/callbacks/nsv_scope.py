"""The scope of :class:`~lightning_nsv.callbacks.NetworkSupportVectors` over a fit: chosen once on the first training
samples (:func:`~lightning_nsv.scope.choose_scope`), its cost said and checked before training, the data embedded for
it, its patterns compared between analyses."""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from lightning_nsv.analysis.whole_network_budget import SAY_ABOVE_SECONDS, TimeBudgetError
from lightning_nsv.callbacks.nsv_data import module_analysis_device, split_batch
from lightning_nsv.compat import pl, rank_zero_info
from lightning_nsv.models.layers import eval_mode
from lightning_nsv.scope import EXAMPLE_SAMPLES, AnalysisOptions, Scope, ScopeRequest, choose_scope, module_inputs

__all__ = ["COST_SAMPLES", "check_cost", "choose", "embed_all", "example_inputs", "patterns_changed"]

COST_SAMPLES = 32  # training inputs that the pair network's rate is measured on before training


def example_inputs(dataset: Dataset, count: int = EXAMPLE_SAMPLES) -> Tensor:
    """The first ``count`` training inputs (their labels are checked with the first batch)."""
    tensors = getattr(dataset, "tensors", None)
    if isinstance(tensors, (tuple, list)) and tensors:
        return tensors[0][:count]
    return torch.stack([torch.as_tensor(split_batch(dataset[i])[0]) for i in range(min(count, len(dataset)))])


def choose(pl_module: nn.Module, dataset: Dataset, request: ScopeRequest, options: AnalysisOptions) -> Scope:
    """The scope, decided on the first training samples; a fallback to the head and an option that does not apply
    are said."""
    decision = choose_scope(pl_module, module_inputs(pl_module, example_inputs(dataset)).detach(), request, options)
    for line in (decision.fallback, decision.note):
        if line is not None:
            rank_zero_info(line)
    return decision.scope


def check_cost(trainer: pl.Trainer, scope: Scope, pl_module: nn.Module, dataset: Dataset, n_val: int,
               time_budget: float | None, say: Callable[[str], None]) -> None:
    """Before training: what the analysis at zero training error will cost where the scope estimates it (the whole
    network: the pair network's rate on a few training inputs, the architecture's, not the weights'), said when long,
    and refused above ``time_budget`` (every rank takes rank 0's verdict); refused on every rank where the estimate
    refuses on one (the memory the analysis allocates before its solver, checked on each)."""
    sample = module_inputs(pl_module, example_inputs(dataset, COST_SAMPLES))
    if not bool(torch.isfinite(sample).all()):
        return  # the first batch's check names the data
    refusal, here = None, None
    try:
        estimate = scope.estimate_cost(sample, len(dataset), n_val)
    except ValueError as err:  # e.g. the memory it allocates before its solver does not fit this rank
        here = f"NetworkSupportVectors: before training, for the analysis at zero training error: {err}"
    else:
        if estimate is not None and estimate.seconds > SAY_ABOVE_SECONDS:
            say(f"NetworkSupportVectors: at zero training error, the {estimate.describe()}")
        try:
            if estimate is not None:
                estimate.check(time_budget, scope.budget_advice)
        except TimeBudgetError as err:
            refusal = f"NetworkSupportVectors: {err}"
    refusal = trainer.strategy.broadcast(refusal, src=0)  # rank 0's rate decides
    fits = trainer.strategy.reduce_boolean_decision(here is None, all=True)  # no rank raises alone
    if refusal is not None:
        raise TimeBudgetError(refusal)
    if not fits:
        raise ValueError(here or "NetworkSupportVectors: before training, another rank refused the analysis at "
                         "zero training error (see that rank's error, e.g. its memory)")


def embed_all(scope: Scope, dataset: Dataset, pl_module: nn.Module, batch_size: int) -> tuple[Tensor, Tensor]:
    """The analysed part's inputs of every sample of ``dataset`` (the head's: the trunk's outputs, flattened; the whole
    network's: the raw inputs), on the analysis device, with the labels."""
    # an own generator: iterating a DataLoader would otherwise draw from the global RNG of training
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, generator=torch.Generator())
    with eval_mode(pl_module), torch.no_grad():
        device = module_analysis_device(pl_module)
        parts = [(scope.embed(module_inputs(pl_module, x)).to(device), y) for x, y in map(split_batch, loader)]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def patterns_changed(previous: Tensor | None, packed: Tensor | None) -> int | None:
    """Training samples whose activation pattern (every slope bit; max-pool selections of the whole network) changed
    between two analyses (``None`` at the first). A per-sample comparison: ``unique_patterns`` counts distinct
    patterns, which does not give it."""
    if previous is None or packed is None or previous.shape != packed.shape:
        return None
    return int((previous != packed).any(1).sum())
