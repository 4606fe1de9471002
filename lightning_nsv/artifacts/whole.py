"""Result files of whole-network analyses (issue 32): what
:func:`~lightning_nsv.analysis.whole_network_support_vectors` adds to a payload, and how :func:`reproduce` recomputes
it.

A whole-network result (``scope == "whole"``) holds no path network: the module's state dict holds every weight, and
its outputs (the module's own forward in eval mode, as float64) on up to
:data:`~lightning_nsv.artifacts.format.OUTPUT_SAMPLES` evenly spaced training samples show whether a rebuilt module
computes what the analysed one did. Its summary line ("whole network: 5 maps, 4 gate layers, …") is saved too.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from lightning_nsv.artifacts.format import OUTPUT_SAMPLES, ArtifactMismatchError, SupportVectorArtifact, output_indices
from lightning_nsv.artifacts.rebuild import _rebuild_datamodule, _rebuilt, check_labels, collect, compare_outputs
from lightning_nsv.models.layers import eval_mode

__all__ = ["module_outputs", "reproduce_whole", "whole_network_payload"]


def _device(module: nn.Module) -> torch.device:
    tensor = next(iter(module.parameters()), None)
    if tensor is None:
        tensor = next(iter(module.buffers()), None)
    return torch.device("cpu") if tensor is None else tensor.device


def module_outputs(module: nn.Module, x: Tensor, max_samples: int = OUTPUT_SAMPLES,
                   batch_size: int = 1024) -> dict[str, Tensor]:
    """``module``'s outputs (its own forward in eval mode, on its device, as float64 on the CPU) on at most
    ``max_samples`` evenly spaced samples of ``x``, with their indices: ``values`` is ``(n,)`` for one output (``(n,)``
    or ``(n, 1)`` logits), ``(n, K)`` for ``K``. The module's mode is restored afterwards."""
    indices, device = output_indices(len(x), max_samples), _device(module)
    with eval_mode(module), torch.no_grad():
        parts = [module(x[indices[i:i + batch_size].to(x.device)].to(device)) for i in range(0, len(indices),
                                                                                              batch_size)]
    values = torch.cat(parts).detach().to("cpu", torch.float64) if parts else torch.zeros(0, dtype=torch.float64)
    values = values.reshape(len(indices), -1)
    return {"indices": indices, "values": values[:, 0] if values.shape[1] == 1 else values}


def whole_network_payload(analysis: Any, module: nn.Module, x_train: Tensor, labels: Tensor | np.ndarray,
                          *, tol: float = 1e-10) -> dict[str, Any]:
    """The keys of a result file that a whole-network analysis fills (for
    :func:`~lightning_nsv.artifacts.save_support_vectors`, with the keys every result shares: ``module_class``,
    ``module_hparams``, ``module_state``, ``data_class``, ``data_hparams``, ``train_indices``, ``epoch``,
    ``global_step``, ``metrics``).

    Args:
        analysis: what :func:`~lightning_nsv.analysis.whole_network_support_vectors` returned for ``module`` on
            ``x_train`` (a ``WholeNetworkAnalysis`` or ``WholeNetworkMulticlassAnalysis``).
        module: the analysed module (the whole LightningModule; the one :func:`reproduce` rebuilds).
        x_train: the training inputs it was analysed on, in its input shape (not embedded).
        labels: the training labels given to the analysis (0/1 or ±1 for one output, ``0..K−1`` for ``K``).
        tol: the solver tolerance given to the analysis (its default 1e-10), used again by :func:`reproduce`.

    Returns:
        ``scope`` ``"whole"``, ``scope_summary`` (``analysis.scope``), ``support``, ``alpha``, ``intercept`` (0),
        ``labels`` (±1 float64, or class indices int64), ``num_outputs``, ``network`` ``None``, ``path_part`` (the
        module's class name), ``path_module`` and ``embedding`` ``None``, ``solver`` (what reproduces the fit:
        ``delta``, ``tol``; and ``method``, ``backend``, ``kkt_residual``, ``iterations``) and ``outputs``
        (:func:`module_outputs` on ``x_train``).
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


def reproduce_whole(artifact: SupportVectorArtifact, module: nn.Module | None = None, datamodule: Any = None,
                    batch_size: int = 1024, output_rtol: float = 1e-6):
    """:func:`~lightning_nsv.artifacts.reproduce` of a whole-network result: the module rebuilt (or ``module`` with
    the saved weights) and the data module, the module's outputs compared with the saved ones (tolerance as there),
    then :func:`~lightning_nsv.analysis.whole_network_support_vectors` on the raw training inputs (and the validation
    set, where the data module has one) with the saved ``delta`` and ``tol``. Returns the fresh analysis.

    Raises:
        ArtifactMismatchError: when the training set, the labels, the module's outputs or the scope of the fresh
            analysis (the traced graph) differ from the saved ones.
    """
    from lightning_nsv.analysis import whole_network_support_vectors

    module = _rebuilt(artifact, module)
    datamodule = _rebuild_datamodule(artifact, datamodule)
    device = _device(module)

    def inputs(dataset):
        return collect(dataset, module, lambda x: x.to(device), batch_size)

    x_train, y_train = inputs(datamodule.train_dataset)
    outputs = artifact.outputs["values"]
    check_labels(artifact, y_train, 1 if outputs.dim() == 1 else int(outputs.shape[1]))
    compare_outputs(artifact, x_train, lambda x: module_outputs(module, x, len(x), batch_size)["values"],
                    output_rtol)
    val = getattr(datamodule, "val_dataset", None)
    x_val, y_val = inputs(val) if val is not None and len(val) else (None, None)
    solver, scope_name = artifact.solver, (artifact.scope_summary or "whole network").rpartition(": ")[0]
    analysis = whole_network_support_vectors(module, x_train, y_train, x_val, y_val, delta=solver.get("delta", 0.05),
                                             tol=solver.get("tol", 1e-10), scope_name=scope_name or "whole network")
    if artifact.scope_summary is not None and analysis.scope != artifact.scope_summary:
        raise ArtifactMismatchError(
            f"the rebuilt module traces to another graph than the analysed one in {artifact.path}: "
            f"{analysis.scope!r}, saved {artifact.scope_summary!r}; its code differs from the analysed run's")
    return analysis
