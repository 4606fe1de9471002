"""What :class:`~lightning_nsv.callbacks.NetworkSupportVectors` analyses (its ``scope``): the whole module, traced
into the pair network of DESIGN.md §2c (:func:`~lightning_nsv.analysis.whole_network_support_vectors`), or the
Linear/Leaky-ReLU head that :func:`~lightning_nsv.extract.find_path_part` finds after a trunk treated as a fixed
embedding (paper 000's CNN + FC protocol); how it is chosen, evaluated, fitted, compared between analyses and said."""
from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from lightning_nsv.callbacks.nsv_data import _analysis_device, _split_batch, _val_dataset
from lightning_nsv.scope.outputs import module_inputs
from lightning_nsv.compat import rank_zero_info
from lightning_nsv.models.layers import eval_mode
from lightning_nsv.analysis.whole_network_budget import SAY_ABOVE_SECONDS, TimeBudgetError
from lightning_nsv.scope import EXAMPLE_SAMPLES, ScopeRequest, choose_scope, find_head

COST_SAMPLES = 32  # training inputs that the pair network's rate is measured on before training


class ScopeChoice:
    """How :class:`NetworkSupportVectors` decides what it analyses (a :class:`~lightning_nsv.scope.Scope`, chosen once
    on the first training samples by :func:`~lightning_nsv.scope.choose_scope`) and reads the data for it, a part of
    it (which holds ``scope``, ``path_module``, ``embedding``, ``options`` and ``_scope``)."""

    @property
    def _request(self) -> ScopeRequest:
        return ScopeRequest(self.scope, self.path_module, self.embedding)

    def _check_head_named(self, pl_module: nn.Module) -> None:
        """At ``setup``: a head the request names must be there (refused here, before any data)."""
        self._scope = None
        if self._request.names_head:
            find_head(pl_module, self._request)

    def _choose_scope(self, pl_module: nn.Module, example: Tensor) -> None:
        """Decide the scope on ``example`` inputs, once, saying a fallback to the head and an option that does not
        apply."""
        if self._scope is not None:
            return
        decision = choose_scope(pl_module, example.detach(), self._request, self.options)
        for line in (decision.fallback, decision.note):
            if line is not None:
                rank_zero_info(line)
        self._scope = decision.scope

    def _check_cost(self, trainer, pl_module: nn.Module, dataset: Dataset) -> None:
        """Before training: what the analysis at zero training error will cost where the scope says (the whole
        network: the pair network's rate on a few training inputs, the architecture's, not the weights'), said when
        long, and refused above ``time_budget`` (every rank takes rank 0's verdict); refused on every rank where the
        estimate refuses on one (the memory the analysis allocates before its solver, checked on each)."""
        sample = module_inputs(pl_module, _example_inputs(dataset, COST_SAMPLES))
        if not bool(torch.isfinite(sample).all()):
            return  # the first batch's check names the data
        refusal, here = None, None
        try:
            estimate = self._scope.estimate_cost(sample, len(dataset), len(_val_dataset(trainer) or ()))
        except ValueError as err:  # e.g. the memory it allocates before its solver does not fit this rank
            here = f"NetworkSupportVectors: before training, for the analysis at zero training error: {err}"
        else:
            if estimate is not None and estimate.seconds > SAY_ABOVE_SECONDS:
                self._say(trainer, f"NetworkSupportVectors: at zero training error, the {estimate.describe()}")
            try:
                if estimate is not None:
                    estimate.check(self.time_budget, self._scope.budget_advice)
            except TimeBudgetError as err:
                refusal = f"NetworkSupportVectors: {err}"
        refusal = trainer.strategy.broadcast(refusal, src=0)  # rank 0's rate decides
        fits = trainer.strategy.reduce_boolean_decision(here is None, all=True)  # no rank raises alone
        if refusal is not None:
            raise TimeBudgetError(refusal)
        if not fits:
            raise ValueError(here or "NetworkSupportVectors: before training, another rank refused the analysis at "
                             "zero training error (see that rank's error, e.g. its memory)")

    def _embedded_training_set(self, dataset: Dataset, pl_module) -> tuple[Tensor, Tensor, object]:
        """The analysed part's training inputs (the head's: the trunk's outputs, flattened; the whole network's: the
        raw inputs) and the gates the zero-error pass kept with them (the whole network's; else ``None``)."""
        kept, self._kept = self._kept, []
        if kept:
            gates = self._scope.join_gates([b[2] for b in kept])
            return torch.cat([b[0] for b in kept]), torch.cat([b[1] for b in kept]), gates
        return (*self._embed_all(dataset, pl_module), None)

    def _embed_all(self, dataset: Dataset, pl_module) -> tuple[Tensor, Tensor]:
        # an own generator: iterating a DataLoader would otherwise draw from the global RNG of training
        loader = DataLoader(dataset, batch_size=self.batch_size, shuffle=False, generator=torch.Generator())
        with eval_mode(pl_module), torch.no_grad():
            device = _analysis_device(pl_module)
            parts = [(self._scope.embed(module_inputs(pl_module, x)).to(device), y)
                     for x, y in map(_split_batch, loader)]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    def _patterns_changed(self, frozen, x_train: Tensor) -> int | None:
        """Training samples whose activation pattern (every slope bit; max-pool selections of the whole network)
        changed since the last analysis (None at the first). A per-sample comparison:
        ``unique_patterns`` counts distinct patterns, which does not give it."""
        packed = self._scope.patterns(frozen, x_train)
        if packed is None:
            return None
        previous, self._previous_patterns = self._previous_patterns, packed
        if previous is None or previous.shape != packed.shape:
            return None
        return int((previous != packed).any(1).sum())


def _example_inputs(dataset: Dataset, count: int = EXAMPLE_SAMPLES) -> Tensor:
    """The first ``count`` training inputs (their labels are checked with the first batch)."""
    tensors = getattr(dataset, "tensors", None)
    if isinstance(tensors, (tuple, list)) and tensors:
        return tensors[0][:count]
    return torch.stack([torch.as_tensor(_split_batch(dataset[i])[0]) for i in range(min(count, len(dataset)))])


__all__ = ["ScopeChoice"]
