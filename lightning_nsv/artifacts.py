"""The support-vector result files: what one analysis saves, how to load it and how to recompute it.

An analysis writes a pair ``<stem>.pt`` (everything, loadable with ``torch.load(weights_only=True)``) and
``<stem>.json`` (the numbers, for people and other tools), each atomically. Both carry the same ``id``; the
``.json`` also holds the SHA-256 of the ``.pt``, so a pair from two runs is detected.

The ``.pt`` holds what reproduces the result: support indices, α, labels, kernel scale, solver settings and
tolerance, the state dict of the whole module (trunk included) with its class and init arguments, the data
module's class and init arguments with the training indices, the package and torch versions, epoch and step.

Example::

    >>> from lightning_nsv.artifacts import load_support_vectors, reproduce  # doctest: +SKIP
    >>> result = load_support_vectors("runs/digits_mlp/tensorboard/version_0/nsv/support_vectors_epoch28.pt")
    >>> again = reproduce(result)          # rebuilds module and data, refits: same support and α
    >>> (again.svm.support_ == result.support.numpy()).all()
    True
"""
from __future__ import annotations

import hashlib
import importlib
import json
import math
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import Tensor

from lightning_nsv import __version__
from lightning_nsv.atomic import torch_save, write_text
from lightning_nsv.path_space import PathNetwork

__all__ = ["ArtifactMismatchError", "SupportVectorArtifact", "load_support_vectors", "reproduce",
           "save_support_vectors"]

FORMAT_VERSION = 2


class ArtifactMismatchError(ValueError):
    """The ``.pt`` and ``.json`` of one result do not belong together, or a file is not a result file."""


def plain(value: Any) -> Any:
    """``value`` as plain Python (and tensors) that ``torch.load(weights_only=True)`` and JSON accept."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items() if not str(k).startswith("_")}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, Tensor):
        return value.detach().cpu()
    if isinstance(value, Path):
        return str(value)
    return repr(value)


def class_path(obj: Any) -> str | None:
    return None if obj is None else f"{type(obj).__module__}.{type(obj).__qualname__}"


def _json_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Tensor):
        return value.tolist()
    if isinstance(value, Mapping):
        return {k: _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    return value


def save_support_vectors(directory: str | Path, stem: str, payload: dict[str, Any], report: str = "") -> Path:
    """Write ``<stem>.pt`` and ``<stem>.json`` atomically with one id; returns the ``.pt`` path.

    ``payload`` must hold the keys of :class:`SupportVectorArtifact` (see :func:`load_support_vectors`).
    """
    directory = Path(directory)
    payload = {**payload, "id": uuid.uuid4().hex, "format_version": FORMAT_VERSION,
               "versions": {"lightning_nsv": __version__, "torch": str(torch.__version__)}}
    pt = torch_save(payload, directory / f"{stem}.pt")
    summary = {
        "id": payload["id"],
        "pt_sha256": hashlib.sha256(pt.read_bytes()).hexdigest(),
        "epoch": payload["epoch"],
        "global_step": payload["global_step"],
        "m": int(payload["labels"].shape[0]),
        "metrics": payload["metrics"],
        "support": payload["support"].tolist(),
        "alpha_support": payload["alpha"][payload["support"]].tolist(),
        "solver": payload["solver"],
        "data": {"class": payload["data_class"], "init_args": payload["data_hparams"]},
        "module": {"class": payload["module_class"], "path_part": payload["path_part"]},
        "versions": payload["versions"],
        "report": report,
    }
    write_text(directory / f"{stem}.json", json.dumps(_json_value(summary), indent=2))
    return pt


@dataclass(frozen=True)
class SupportVectorArtifact:
    """A loaded result file (see the module docstring for what it holds).

    Attributes:
        path: the ``.pt`` file.
        id: shared by the ``.pt`` and its ``.json``.
        support: indices of the support vectors in the training set (the order of ``train_indices``).
        alpha: dual coefficients for the raw kernel, ``(m,)`` (binary) or ``(m, K)`` (multi-class, per pair
            ``(i, k)``), zero off the support.
        labels: training labels, in ``{-1, +1}`` for a binary head, ``0..K-1`` for a K-class head.
        network: the path part at the analysed weights (float64).
        module_state: state dict of the whole module (trunk included).
        module_class, module_hparams: how to rebuild the module (``None`` when it records no init arguments).
        data_class, data_hparams, train_indices: how to rebuild the training set.
        solver: settings (intercept, C, kernel mode, tolerance, kernel scale, method).
        metrics: the logged numbers.
    """

    path: Path
    id: str
    support: Tensor
    alpha: Tensor
    intercept: float
    labels: Tensor
    network: PathNetwork
    path_module: str | None
    embedding: str | None
    path_part: str
    module_class: str | None
    module_hparams: dict | None
    module_state: dict = field(repr=False)
    data_class: str | None = None
    data_hparams: dict | None = None
    train_indices: Tensor | None = None
    solver: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)
    epoch: int = 0
    global_step: int = 0
    versions: dict = field(default_factory=dict)

    @property
    def m(self) -> int:
        return int(self.labels.shape[0])


def load_support_vectors(path: str | Path) -> SupportVectorArtifact:
    """Load a result saved by :class:`~lightning_nsv.callbacks.NetworkSupportVectors`.

    Args:
        path: the ``.pt`` or ``.json`` file, or their common stem.

    Raises:
        FileNotFoundError: when the ``.pt`` file is missing.
        ArtifactMismatchError: when the file is not a result file, or its ``.json`` belongs to another run.
    """
    path = Path(path)
    pt = path.with_suffix(".pt") if path.suffix in (".json", "") else path
    if not pt.is_file():
        raise FileNotFoundError(f"no support-vector result at {pt}")
    payload = torch.load(pt, map_location="cpu", weights_only=True)
    if not isinstance(payload, dict) or payload.get("format_version") != FORMAT_VERSION:
        raise ArtifactMismatchError(
            f"{pt} is not a support-vector result of format {FORMAT_VERSION} (format "
            f"{payload.get('format_version') if isinstance(payload, dict) else type(payload).__name__})"
        )
    summary = pt.with_suffix(".json")
    if summary.is_file():
        recorded = json.loads(summary.read_text())
        digest = hashlib.sha256(pt.read_bytes()).hexdigest()
        if recorded.get("id") != payload["id"] or recorded.get("pt_sha256") != digest:
            raise ArtifactMismatchError(
                f"{summary} (id {recorded.get('id')}) does not belong to {pt} (id {payload['id']}): the pair comes "
                "from two runs; rerun the analysis or keep the files of one run together"
            )
    net = payload["network"]
    network = PathNetwork.from_tensors(net["weights"], net["biases"], net["betas"], net["gammas"])
    return SupportVectorArtifact(
        path=pt, id=payload["id"], support=payload["support"], alpha=payload["alpha"],
        intercept=float(payload["intercept"]), labels=payload["labels"], network=network,
        path_module=payload["path_module"], embedding=payload["embedding"], path_part=payload["path_part"],
        module_class=payload["module_class"], module_hparams=payload["module_hparams"],
        module_state=payload["module_state"], data_class=payload["data_class"],
        data_hparams=payload["data_hparams"], train_indices=payload["train_indices"], solver=payload["solver"],
        metrics=payload["metrics"], epoch=int(payload["epoch"]), global_step=int(payload["global_step"]),
        versions=payload["versions"],
    )


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
    module.load_state_dict(artifact.module_state)
    return module


def reproduce(artifact: SupportVectorArtifact | str | Path, module: torch.nn.Module | None = None,
              datamodule: Any = None, batch_size: int = 1024):
    """Recompute the analysis of a result file from what it holds; returns a fresh ``SupportVectorAnalysis``.

    The module is rebuilt from its class and init arguments (or ``module``, whose weights are replaced by the
    saved ones), the training set from the data module's class and init arguments (or ``datamodule``), and the
    max-margin classifier is fitted again with the saved solver settings (validation included, where the data
    module has a validation set).

    Raises:
        ArtifactMismatchError: when the rebuilt training set or network outputs differ from the saved ones.
    """
    from lightning_nsv.extract import find_path_part
    from lightning_nsv.models.layers import eval_mode
    from lightning_nsv.multiclass import multiclass_support_vectors
    from lightning_nsv.support_vectors import network_support_vectors, signed_labels

    if not isinstance(artifact, SupportVectorArtifact):
        artifact = load_support_vectors(artifact)
    if module is None:
        module = rebuild_module(artifact)
    else:
        module.load_state_dict(artifact.module_state)
    if datamodule is None:
        if artifact.data_class is None:
            raise ValueError(f"{artifact.path} records no data module; pass `datamodule=`")
        datamodule = _import(artifact.data_class)(**(artifact.data_hparams or {}))
    datamodule.setup("fit")
    indices = getattr(datamodule, "train_indices", None)
    if artifact.train_indices is not None and indices is not None and not torch.equal(
            torch.as_tensor(indices), artifact.train_indices):
        raise ArtifactMismatchError("the rebuilt data module draws other training samples than the saved ones")
    path = find_path_part(module, artifact.path_module, artifact.embedding)

    def embedded(dataset):
        with eval_mode(module), torch.no_grad():
            batches = (dataset[i:i + batch_size] for i in range(0, len(dataset), batch_size))
            parts = [(path.embed(x), y) for x, y in batches]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    x_train, y_train = embedded(datamodule.train_dataset)
    net = path.path_network()
    labels = signed_labels(y_train) if net.num_outputs == 1 else y_train.to(torch.int64)
    if not torch.equal(labels, artifact.labels):
        raise ArtifactMismatchError("the rebuilt training labels differ from the saved ones")
    val = getattr(datamodule, "val_dataset", None)
    x_val, y_val = embedded(val) if val is not None and len(val) else (None, None)
    solver = artifact.solver
    if net.num_outputs > 1:
        return multiclass_support_vectors(net, x_train, y_train, x_val, y_val, method=solver["multiclass"])
    return network_support_vectors(
        net, x_train, y_train, x_val, y_val, intercept=solver["intercept"], C=solver["C"],
        kernel=solver["kernel"], max_dense_bytes=solver["max_dense_bytes"],
    )
