"""What a support-vector result file holds and how it is checked: the payload's keys and types, its portable form,
the SHA-256 of its content, the ``.json`` summary derived from it, and the checks that a loaded pair passes (format,
checksum, summary). Reading and writing the pair: :mod:`~lightning_nsv.artifacts.store`."""
from __future__ import annotations

import hashlib
import io
import json
import math
import pickle
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from torch import Tensor

from lightning_nsv import __version__
from lightning_nsv.kernel.network import PathNetwork
from lightning_nsv.scope.choice import RESULT_SCOPES

FORMAT_VERSION = 4  # 4: a 'scope' ("head" or "whole"; older files are "head"); 3: the .pt carries the SHA-256 of
OLDEST_READABLE = 2  # its content and the network's outputs; 2: neither
SCOPES = tuple(RESULT_SCOPES)  # a head after a fixed embedding; the whole traced module; a cut (its name: path_module)


class ArtifactMismatchError(ValueError):
    """The ``.pt`` and ``.json`` of one result do not belong together, or a file is not a result file."""


class ArtifactCorruptError(ArtifactMismatchError):
    """A result file is damaged, truncated, or was changed after it was saved."""


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
        return _json_value(value.tolist())
    if isinstance(value, Mapping):
        return {k: _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    return value


# ---- what a result holds --------------------------------------------------------------------------------------

_OPTIONAL_STR, _OPTIONAL_DICT = (str, type(None)), (dict, type(None))
REQUIRED_KEYS: dict[str, tuple[type, ...]] = {
    "id": (str,), "format_version": (int,), "support": (Tensor,), "alpha": (Tensor,), "intercept": (int, float), "labels": (Tensor,),
    "network": _OPTIONAL_DICT,  # None in a whole-network result (its module_state holds every weight)
    "path_part": (str,), "path_module": _OPTIONAL_STR, "embedding": _OPTIONAL_STR, "module_class": _OPTIONAL_STR,
    "module_hparams": _OPTIONAL_DICT, "module_state": (dict,), "data_class": _OPTIONAL_STR,
    "data_hparams": _OPTIONAL_DICT, "train_indices": (Tensor, type(None)), "epoch": (int,), "global_step": (int,),
    "solver": (dict,), "metrics": (dict,),
}


def _is_a(value: Any, types: tuple[type, ...]) -> bool:
    return isinstance(value, types) and not (isinstance(value, bool) and bool not in types)  # bool subclasses int


def _payload_problems(payload: Any) -> list[str]:
    """What makes ``payload`` not a result: missing keys, wrong types, shapes that do not fit together."""
    if not isinstance(payload, Mapping):
        return [f"it holds a {type(payload).__name__}, not a dict of the result's keys"]
    problems = [f"key {k!r} is missing" for k in REQUIRED_KEYS if k not in payload]
    problems += [f"key {k!r} holds a {type(payload[k]).__name__} where "
                 f"{' or '.join('None' if t is type(None) else t.__name__ for t in types)} is expected"
                 for k, types in REQUIRED_KEYS.items() if k in payload and not _is_a(payload[k], types)]
    if problems:
        return problems
    labels, alpha, support = payload["labels"], payload["alpha"], payload["support"]
    m = labels.shape[0] if labels.dim() else 0
    if alpha.dim() == 0 or alpha.shape[0] != m:
        problems.append(f"'alpha' has shape {tuple(alpha.shape)}, but there are {m} labels")
    if support.dtype.is_floating_point or support.dim() != 1 or len(support) and not (
            0 <= int(support.min()) and int(support.max()) < m):
        problems.append(f"'support' must be indices in [0, {m}) (shape (s,), an integer dtype), "
                        f"got {support.dtype} of shape {tuple(support.shape)}")
    problems += _scope_problems(payload)
    outputs = payload.get("outputs")
    if outputs is not None and not (
            isinstance(outputs, Mapping) and isinstance(outputs.get("indices"), Tensor)
            and isinstance(outputs.get("values"), Tensor) and outputs["values"].shape[:1] == outputs["indices"].shape
            and (not len(outputs["indices"]) or int(outputs["indices"].max()) < m)):
        problems.append("'outputs' must be a dict of 'indices' (n,) into the training set and 'values' (n,) or (n, K)")
    return problems


def _scope_problems(payload: Mapping[str, Any]) -> list[str]:
    """The problems of the part of ``payload`` that its scope writes (:meth:`~lightning_nsv.scope.Scope.payload`)."""
    scope = payload.get("scope", "head")
    if scope not in SCOPES:
        return [f"'scope' must be one of {', '.join(map(repr, SCOPES))}, got {scope!r}"]
    if not isinstance(payload.get("scope_summary"), (str, type(None))):
        return [f"'scope_summary' must be text, got a {type(payload['scope_summary']).__name__}"]
    return RESULT_SCOPES[scope].payload_problems(payload)


def _portable(value: Any, where: str) -> Any:
    """``value`` with every tensor a compact CPU copy (a view would save its whole storage) and numpy values as
    tensors or Python numbers: what ``torch.load(weights_only=True)`` reads on any machine."""
    if isinstance(value, Tensor):
        if value.is_meta:
            raise ValueError(f"payload key {where} is a tensor without data (device 'meta'): "
                             "save the materialised tensor")
        if value.layout != torch.strided:
            value = value.to_dense()
        return value.detach().to("cpu").resolve_conj().resolve_neg().contiguous().clone()
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.copy())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {k: _portable(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_portable(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    raise TypeError(f"payload key {where} holds a {type(value).__name__}, which a safe load (weights_only=True) "
                    "cannot read: pass tensors, numbers, strings, lists or dicts (artifacts.plain converts)")


def content_sha256(payload: Mapping[str, Any]) -> str:
    """SHA-256 of a canonical serialisation of ``payload`` without its ``sha256`` key: every tensor as its
    dtype, shape and bytes (contiguous), dicts in key order, every value with its type. Independent of how
    ``torch.save`` lays out the file."""
    digest = hashlib.sha256()

    def feed(value: Any) -> None:
        if isinstance(value, Tensor):
            flat = value.detach().cpu().reshape(-1)
            if flat.numel() and flat.stride(0) != 1:  # one element under any stride (e.g. 0): no byte view of it
                flat = flat.clone(memory_format=torch.contiguous_format)
            data = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
            header = f"{value.dtype}{tuple(value.shape)}".encode()
            digest.update(b"T" + struct.pack("<QQ", len(header), len(data)) + header + data)
        elif isinstance(value, Mapping):
            digest.update(b"D" + struct.pack("<Q", len(value)))
            for key in sorted(value, key=lambda k: (type(k).__name__, str(k))):
                feed(key)
                feed(value[key])
        elif isinstance(value, (list, tuple)):
            digest.update((b"L" if isinstance(value, list) else b"U") + struct.pack("<Q", len(value)))
            for item in value:
                feed(item)
        else:
            text = value.hex() if isinstance(value, float) else repr(value)
            tag = type(value).__name__.encode()
            digest.update(b"V" + struct.pack("<QQ", len(tag), len(text)) + tag + text.encode())

    feed({k: v for k, v in payload.items() if k != "sha256"})
    return digest.hexdigest()


def _summary(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The ``.json``: derived from the ``.pt``'s payload alone, as JSON values."""
    return json.loads(json.dumps(_json_value({
        "id": payload["id"],
        "sha256": payload["sha256"],
        "format_version": payload["format_version"],
        "epoch": payload["epoch"],
        "global_step": payload["global_step"],
        "m": int(payload["labels"].shape[0]),
        "metrics": payload["metrics"],
        "support": payload["support"].tolist(),
        "alpha_support": payload["alpha"][payload["support"]].tolist(),
        "solver": payload["solver"],
        "data": {"class": payload["data_class"], "init_args": payload["data_hparams"]},
        "module": {"class": payload["module_class"], "path_part": payload["path_part"]},
        "versions": payload.get("versions"),
        "report": payload.get("report", ""),
        **({"scope": payload["scope"], "scope_summary": payload.get("scope_summary")} if "scope" in payload else {}),
    })))


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
        network: the path part at the analysed weights (float64); ``None`` in a whole-network result.
        module_state: state dict of the whole module (trunk included).
        module_class, module_hparams: how to rebuild the module (``None`` when it records no init arguments).
        data_class, data_hparams, train_indices: how to rebuild the training set.
        solver: settings (intercept, C, kernel mode, tolerance, kernel scale, method).
        metrics: the logged numbers.
        outputs: the network's outputs on evenly spaced training samples (``indices``, ``values``), which
            :func:`reproduce` compares; ``None`` in files of format 2. A whole-network result holds the
            module's own outputs (:func:`~lightning_nsv.artifacts.whole.module_outputs`).
        scope: ``"head"`` (the path part after a fixed embedding; files before format 4), ``"whole"`` (the whole
            traced module, :func:`~lightning_nsv.analysis.whole_network_support_vectors`) or ``"cut"`` (everything from
            the input of the submodule ``path_module`` names on, :class:`~lightning_nsv.scope.CutScope`).
        scope_summary: the scope line of the analysis ("whole network: 5 maps, 4 gate layers, …"); ``None`` where
            the file records none.
    """

    path: Path
    id: str
    support: Tensor
    alpha: Tensor
    intercept: float
    labels: Tensor
    network: PathNetwork | None
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
    outputs: dict | None = field(default=None, repr=False)
    scope: str = "head"
    scope_summary: str | None = None

    @property
    def m(self) -> int:
        return int(self.labels.shape[0])


_REMEDY = "restore the file from a copy or rerun the analysis"


def _read_pt(pt: Path) -> Any:
    """The payload of ``pt``, read with ``weights_only=True``; a damaged file is named as such (never with
    torch's advice to load it unsafely)."""
    try:
        data = pt.read_bytes()
    except OSError as error:
        raise OSError(error.errno, f"reading {pt} failed: {error.strerror}", str(pt)) from error
    if not data:
        raise ArtifactCorruptError(f"{pt} is empty (0 bytes): it is truncated; {_REMEDY}")
    if not data.startswith(b"PK\x03\x04"):
        raise ArtifactCorruptError(
            f"{pt} is not a torch archive ({len(data)} bytes that do not start like one): it is not a result "
            f"file, or it was overwritten; {_REMEDY}")
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise ArtifactCorruptError(
            f"{pt} holds Python objects other than tensors and plain values, which a safe load refuses: it is not "
            f"a support-vector result file (those hold only tensors and plain values); {_REMEDY}") from None
    except Exception as error:  # torch's reader: RuntimeError, OSError(EINVAL), EOFError, ... on a cut archive
        raise ArtifactCorruptError(
            f"{pt} is damaged or truncated ({len(data)} bytes; its torch archive cannot be read: "
            f"{type(error).__name__}); {_REMEDY}") from None


def _read_summary(summary: Path) -> dict:
    try:
        recorded = json.loads(summary.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ArtifactCorruptError(
            f"{summary} is damaged (not valid JSON: {error}); the .pt beside it holds the result: remove the "
            "damaged .json to load the .pt alone (its checksum is still verified), or rerun the analysis") from None
    if not isinstance(recorded, dict):
        raise ArtifactCorruptError(f"{summary} holds a JSON {type(recorded).__name__}, not a result summary; remove "
                                   "it to load the .pt alone, or rerun the analysis")
    return recorded


def _differences(recorded: Any, expected: Any, where: str = "") -> list[str]:
    """Dotted keys at which two JSON values differ."""
    if isinstance(recorded, dict) and isinstance(expected, dict):
        return [d for k in sorted(set(recorded) | set(expected), key=str)
                for d in _differences(recorded.get(k), expected.get(k), f"{where}.{k}" if where else str(k))]
    return [] if recorded == expected else [where or "(the whole file)"]


def _describe(keys: list[str], limit: int = 6) -> str:
    return ", ".join(keys[:limit]) + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def _check_format(payload: Any, pt: Path) -> int:
    version = payload.get("format_version") if isinstance(payload, dict) else None
    if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
        raise ArtifactMismatchError(
            f"{pt} was written in result format {version} by a newer lightning_nsv "
            f"({payload.get('versions', {}).get('lightning_nsv', 'version unknown')}); this one ({__version__}) "
            f"reads formats {OLDEST_READABLE}–{FORMAT_VERSION}: upgrade lightning_nsv to load it")
    if not isinstance(version, int) or isinstance(version, bool) or version < OLDEST_READABLE:
        raise ArtifactMismatchError(
            f"{pt} is not a support-vector result of format {OLDEST_READABLE}–{FORMAT_VERSION} (format "
            f"{version if isinstance(payload, dict) else type(payload).__name__})")
    return version


def _check_content(payload: dict, pt: Path, summary: Path) -> None:
    """The checksum that the ``.pt`` records against its content (format 3); a mismatch says what differs."""
    try:
        recorded, actual = payload.get("sha256"), content_sha256(payload)
    except Exception as error:  # values that no intact file holds (e.g. a tensor of a damaged layout)
        raise ArtifactCorruptError(f"{pt} is damaged or truncated (its content cannot be checked: "
                                   f"{type(error).__name__}: {error}); {_REMEDY}") from error
    if recorded == actual:
        return
    changed = ""
    if summary.is_file() and not _payload_problems(payload):
        try:
            differing = _differences(_read_summary(summary), _summary({**payload, "sha256": recorded}))
        except (ArtifactMismatchError, KeyError, TypeError, IndexError):  # nothing to compare with
            differing = []
        if differing:
            changed = f"; it differs from {summary.name} at {_describe(differing)}"
    raise ArtifactCorruptError(
        f"{pt} was changed after it was saved: the SHA-256 of its content is {actual[:16]}…, the file records "
        f"{str(recorded)[:16]}…{changed}. Do not use it: {_REMEDY}")


def _check_summary(payload: dict, version: int, pt: Path, summary: Path) -> None:
    recorded = _read_summary(summary)
    if recorded.get("id") != payload["id"]:
        raise ArtifactMismatchError(
            f"{summary} describes the result {str(recorded.get('id'))[:12]}…, but {pt} holds the result "
            f"{payload['id'][:12]}…: the two files come from two saves (two runs, or one file copied over); keep "
            "the .pt and .json of one save together, or remove the .json to load the .pt alone")
    if version < 3:  # format 2: the .json records the hash of the .pt's bytes
        if recorded.get("pt_sha256") != hashlib.sha256(pt.read_bytes()).hexdigest():
            raise ArtifactCorruptError(f"{pt} differs from the file that {summary.name} describes (same id, other "
                                       f"bytes): it was changed after it was saved; {_REMEDY}")
        return
    differing = _differences(recorded, _summary(payload))
    if differing:
        raise ArtifactCorruptError(
            f"{summary} differs from {pt} at {_describe(differing)}: the .json was changed after it was saved; the "
            ".pt's own checksum verifies, so the .pt is intact: remove or restore the .json")
