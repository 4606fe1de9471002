"""The whole-network analysis on held-out samples (DESIGN.md §2): the kernel between validation samples and the
support by the pair network, a chunk of validation samples at a time, and the SVM's decision against the network's."""
from __future__ import annotations

import math

import torch
from torch import Tensor
from torchmetrics.functional.classification import binary_accuracy, multiclass_accuracy

from lightning_nsv.kernel import Gates, PairNetworkColumns, PiecewiseGraph, compute_gates, unique_patterns

__all__ = ["VALIDATION_CHUNK", "held_out"]

# validation samples whose kernel against the support is formed at once (see _cross_kernel)
VALIDATION_CHUNK = 2048


def _slice_gates(gates: Gates, idx: Tensor) -> Gates:
    return Gates(gates.output[idx], {k: v[idx] for k, v in gates.bits.items()},
                 {k: v[idx] for k, v in gates.selections.items()})


def _cat_gates(first: Gates, second: Gates) -> Gates:
    return Gates(torch.cat([first.output, second.output]),
                 {k: torch.cat([v, second.bits[k]]) for k, v in first.bits.items()},
                 {k: torch.cat([v, second.selections[k]]) for k, v in first.selections.items()})


def _cross_kernel(graph: PiecewiseGraph, x_support: Tensor, gates_support: Gates, x_val: Tensor, gates_val: Gates,
                  block_bytes: int, on_pairs=None) -> Tensor:
    """``K(x_val, x_support)``, ``(n, s)`` float64 on the graph's device, from a :class:`PairNetworkColumns` over the
    support followed by a chunk of ``c`` validation samples (memory ``8·(s + c)·(f + s)`` bytes plus their gates):
    the pair network on the ``c×s`` pairs only, or for a Linear chain the first ``s`` columns by §1's GEMMs."""
    s = len(x_support)
    parts = []
    for lo in range(0, len(x_val), VALIDATION_CHUNK):
        idx = torch.arange(lo, min(len(x_val), lo + VALIDATION_CHUNK), device=graph.device)
        both = torch.cat([x_support.to(graph.device, torch.float64),
                          x_val[lo:lo + len(idx)].to(graph.device, torch.float64)])
        columns = PairNetworkColumns(graph, both, _cat_gates(gates_support, _slice_gates(gates_val, idx)),
                                     memory_bytes=block_bytes, cache_bytes=0)
        columns.on_pairs = on_pairs
        parts.append(columns.columns_tensor(torch.arange(s, device=graph.device), part=slice(s, None)))
    return torch.cat(parts) if parts else torch.zeros(0, s, dtype=torch.float64, device=graph.device)


def held_out(graph, columns, gates, svm, y, x_val, y_val, binary: bool, block_bytes: int, on_pairs) -> dict:
    """The SVM's decision on the validation samples (the kernel against the support) against the network's."""
    val_gates = compute_gates(graph, x_val, memory_bytes=block_bytes)
    support = torch.as_tensor(svm.support_, dtype=torch.long, device=graph.device)
    kernel = _cross_kernel(graph, columns.x[support], _slice_gates(gates, support), x_val, val_gates, block_bytes,
                           on_pairs)
    coef = torch.from_numpy(svm.alpha_[svm.support_]) * y[svm.support_] if binary else \
        torch.from_numpy(svm.beta_[svm.support_])
    return _validation(kernel @ coef.to(kernel.device, torch.float64), val_gates, y_val, graph.num_outputs)


def _validation(decision: Tensor, val_gates: Gates, y_val: Tensor | None, num_outputs: int) -> dict:
    """The SVM's decision ``f = K(x_val, x_support) · coefficients`` against the network on the validation set:
    ``sign`` (``>= 0``: +1, as ``sign(0) = +1``) of one output, else ``argmax`` (first maximum on ties); ``y_val``
    already as ±1 or class indices."""
    decision, outputs = decision.cpu(), val_gates.output.reshape(len(val_gates), num_outputs).cpu()
    n = len(outputs)
    if num_outputs == 1:
        net_pred = torch.where(outputs[:, 0] >= 0, 1.0, -1.0).to(torch.float64)
        svm_pred = torch.where(decision >= 0, 1.0, -1.0).to(torch.float64)
        agreement = float(binary_accuracy((svm_pred > 0).long(), (net_pred > 0).long())) if n else math.nan
    else:
        net_pred, svm_pred = outputs.argmax(1), decision.argmax(1)
        agreement = float(multiclass_accuracy(svm_pred, net_pred, num_classes=num_outputs, average="micro")) \
            if n else math.nan
    result = {"unique_patterns_val": unique_patterns(val_gates), "val_agreement": agreement,
              "val_predictions": (net_pred, svm_pred)}
    if y_val is not None:
        net_wrong, svm_wrong = net_pred != y_val, svm_pred != y_val
        result.update(val_errors_network=int(net_wrong.sum()), val_errors_svm=int(svm_wrong.sum()),
                      val_errors_both=int((net_wrong & svm_wrong).sum()))
    return result
