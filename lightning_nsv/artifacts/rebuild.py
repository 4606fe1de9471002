"""Recompute the analysis of a result file: rebuild its module and data module from what the file records, check
that the rebuilt network computes the saved outputs, and fit the max-margin classifier again."""
from __future__ import annotations

import importlib
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor

from lightning_nsv.artifacts.format import ArtifactMismatchError, SupportVectorArtifact
from lightning_nsv.artifacts.store import load_support_vectors

def _import(dotted: str) -> Any:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def rebuild_module(artifact: SupportVectorArtifact) -> torch.nn.Module:
    """The analysed module, from its class, init arguments and state dict."""
    if artifact.module_class is None or artifact.module_hparams is None:
        raise ValueError(
            f"{artifact.path} records no init arguments for {artifact.module_class}; pass `module=` to reproduce() "
            "(an instance of your module; its weights are loaded from the file)"
        )
    module = _import(artifact.module_class)(**artifact.module_hparams)
    load_saved_weights(artifact, module, given=False)
    return module


def reproduce(artifact: SupportVectorArtifact | str | Path, module: torch.nn.Module | None = None,
              datamodule: Any = None, batch_size: int = 1024, output_rtol: float = 1e-6):
    """Recompute the analysis of a result file from what it holds; returns a fresh analysis.

    The module is rebuilt from its class and init arguments (or ``module``, whose weights are replaced by the
    saved ones), the training set from the data module's class and init arguments (or ``datamodule``), and the
    max-margin classifier is fitted again by the scope the file records (:func:`~lightning_nsv.scope.scope_of_result`:
    the head it names, or the whole module) with the saved solver settings (validation included, where the data
    module has a validation set): a ``SupportVectorAnalysis`` (or its multi-class kind) for a head, a
    ``WholeNetworkAnalysis`` (or ``WholeNetworkMulticlassAnalysis``) for the whole network.

    Before fitting, the rebuilt network's outputs on the saved samples (the head's; the whole module's own) are
    compared with the saved outputs: they must agree to ``output_rtol · max(1, max |saved output|)`` (float64; the
    default 1e-6 allows the rounding of a float32 trunk run with other batch sizes; a trunk run in TF32 on a GPU may
    need 1e-3).

    Raises:
        ArtifactMismatchError: when the rebuilt training set, labels or network outputs differ from the saved ones,
            or a whole module traces to another graph.
    """
    from lightning_nsv.scope import AnalysisOptions, module_device, scope_of_result

    if not isinstance(artifact, SupportVectorArtifact):
        artifact = load_support_vectors(artifact)
    module = _rebuilt(artifact, module)
    datamodule = _rebuild_datamodule(artifact, datamodule)
    device = module_device(module)
    train = datamodule.train_dataset
    scope = scope_of_result(module, artifact.scope, train[:8][0].to(device), path_module=artifact.path_module,
                            embedding=artifact.embedding, summary=artifact.scope_summary)

    def embedded(dataset):
        return collect(dataset, module, lambda x: scope.embed(x.to(device)), batch_size)

    x_train, y_train = embedded(train)
    frozen = scope.freeze()
    check_labels(artifact, y_train, frozen.num_outputs)
    if artifact.outputs is not None:
        compare_outputs(artifact, x_train, lambda x: scope.saved_outputs(frozen, x, batch_size), output_rtol)
    else:
        warnings.warn(f"{artifact.path} holds no network outputs (saved before format 3): nothing shows whether the "
                      "rebuilt network computes what the analysed one did", UserWarning, stacklevel=2)
    val = getattr(datamodule, "val_dataset", None)
    x_val, y_val = embedded(val) if val is not None and len(val) else (None, None)
    analysis = scope.analyse(frozen, x_train, y_train, x_val, y_val, AnalysisOptions.from_saved(artifact.solver),
                             progress=True)
    problem = scope.check_reproduced(analysis, artifact.scope_summary)
    if problem is not None:
        raise ArtifactMismatchError(f"{artifact.path}: {problem}")
    return analysis


def _rebuilt(artifact: SupportVectorArtifact, module: torch.nn.Module | None) -> torch.nn.Module:
    """``module`` with the saved weights, or the module rebuilt from the file."""
    if module is None:
        return rebuild_module(artifact)
    load_saved_weights(artifact, module)
    return module


def load_saved_weights(artifact: SupportVectorArtifact, module: torch.nn.Module, given: bool = True) -> None:
    """The saved weights into ``module``; a module of other parameter names or shapes is refused with them (torch's
    own "Error(s) in loading state_dict" said neither that it is not the analysed module nor what to pass)."""
    saved, own = artifact.module_state, module.state_dict()
    differences = [f"{key}: {tuple(own[key].shape)} here, {tuple(saved[key].shape)} saved" for key in own
                   if key in saved and tuple(own[key].shape) != tuple(saved[key].shape)]
    for keys, what in (([k for k in saved if k not in own], "saved, not in this module"),
                       ([k for k in own if k not in saved], "in this module, not saved")):
        if keys:
            differences.append(f"{what}: {', '.join(keys[:5])}{f', … ({len(keys)} in all)' if len(keys) > 5 else ''}")
    if not differences:
        module.load_state_dict(saved)
        return
    source = "the `module=` passed" if given else f"the module rebuilt from {artifact.module_class}"
    hparams = artifact.module_hparams
    arguments = "" if hparams is None else ", ".join(f"{key}={value!r}" for key, value in hparams.items())
    recorded = "" if hparams is None else (f", as recorded: {artifact.module_class.rpartition('.')[2]}({arguments}), "
                                           "or module=None to rebuild it from the file")
    fix = (f"pass a {type(module).__name__} built with the analysed run's init arguments{recorded}" if given
           else "its code has changed since the analysis; use the code of the analysed run")
    raise ArtifactMismatchError(
        f"{source} ({type(module).__name__}) differs from the module analysed in {artifact.path} "
        f"({artifact.module_class}): {'; '.join(differences[:6])}. Its weights cannot be loaded; {fix}")


def collect(dataset, module: torch.nn.Module, transform: Callable[[Tensor], Tensor],
            batch_size: int) -> tuple[Tensor, Tensor]:
    """``(transform(x), y)`` over a dataset sliced in batches (a ``TensorDataset``), ``module`` in eval mode."""
    from lightning_nsv.models.layers import eval_mode

    with eval_mode(module), torch.no_grad():
        batches = (dataset[i:i + batch_size] for i in range(0, len(dataset), batch_size))
        parts = [(transform(x), y) for x, y in batches]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def check_labels(artifact: SupportVectorArtifact, y_train: Tensor, num_outputs: int) -> None:
    """The rebuilt training labels (±1 for one output, class indices for K) must be the saved ones."""
    from lightning_nsv.analysis.binary import signed_labels

    labels = signed_labels(y_train) if num_outputs == 1 else y_train.to(torch.int64)
    if not torch.equal(labels, artifact.labels):
        raise ArtifactMismatchError("the rebuilt training labels differ from the saved ones")


def _rebuild_datamodule(artifact: SupportVectorArtifact, datamodule: Any) -> Any:
    """``datamodule`` (or the one the file records, rebuilt from its class and init arguments), set up for fitting
    and checked to draw the saved training samples."""
    if datamodule is None:
        if artifact.data_class is None:
            raise ValueError(f"{artifact.path} records no data module; pass `datamodule=`")
        datamodule = _import(artifact.data_class)(**(artifact.data_hparams or {}))
    datamodule.setup("fit")
    indices = getattr(datamodule, "train_indices", None)
    if artifact.train_indices is not None and indices is not None and not torch.equal(
            torch.as_tensor(indices), artifact.train_indices):
        raise ArtifactMismatchError("the rebuilt data module draws other training samples than the saved ones")
    return datamodule


def compare_outputs(artifact: SupportVectorArtifact, x_train: Tensor, outputs: Callable[[Tensor], Tensor],
                    rtol: float) -> None:
    """``outputs`` of the rebuilt network (float64) on the saved samples of ``x_train`` against the saved ones:
    they must agree to ``rtol · max(1, max |saved output|)``; the refusal names the largest difference and where."""
    indices, saved = artifact.outputs["indices"], artifact.outputs["values"].to(torch.float64)
    if len(x_train) != artifact.m or (len(indices) and int(indices.max()) >= len(x_train)):
        raise ArtifactMismatchError(f"the rebuilt training set has {len(x_train)} samples, {artifact.path} "
                                    f"was analysed on {artifact.m}")
    now = outputs(x_train[indices.to(x_train.device)])
    if now.shape != saved.shape:
        raise ArtifactMismatchError(f"the rebuilt network has outputs of shape {tuple(now.shape)}, {artifact.path} "
                                    f"saved {tuple(saved.shape)}")
    gap = (now - saved).abs().reshape(len(indices), -1)
    tolerance = rtol * max(1.0, float(saved.abs().max()) if saved.numel() else 1.0)
    worst = float(gap.max()) if gap.numel() else 0.0
    if not worst <= tolerance:  # NaN fails too
        row = int(gap.max(1).values.argmax())
        saved_row, now_row = (v.reshape(len(indices), -1)[row].tolist() for v in (saved, now))
        raise ArtifactMismatchError(
            f"the rebuilt network computes other outputs than the analysed one in {artifact.path}: largest "
            f"difference {worst:.3g} at training sample {int(indices[row])} (saved {saved_row}, now {now_row}), "
            f"tolerance {tolerance:.3g} (output_rtol={rtol:g}). The "
            "module's code, its weights or the data differ from the analysed run; the refit would describe "
            "another network. Pass the module and data module of that run, or a larger output_rtol if the "
            "difference is rounding (e.g. TF32 on a GPU)")
