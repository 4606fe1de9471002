"""The support-vector result files: what one analysis saves, how to load it and how to recompute it.

An analysis writes a pair ``<stem>.pt`` (everything, loadable with ``torch.load(weights_only=True)``) and
``<stem>.json`` (the numbers, for people and other tools, derived from the ``.pt``). Both carry the same ``id``.
The ``.pt`` records the SHA-256 of its own content, so a file changed after saving is refused; the pair is
replaced as one change (a failed or killed save leaves the previous pair loadable).

The ``.pt`` holds what reproduces the result: support indices, α, labels, kernel scale, solver settings and
tolerance, the state dict of the whole module (trunk included) with its class and init arguments, the data
module's class and init arguments with the training indices, the network's outputs on up to 4096 training
samples (which :func:`reproduce` compares), the package and torch versions, epoch and step.

Example::

    >>> from lightning_nsv.artifacts import load_support_vectors, reproduce  # doctest: +SKIP
    >>> result = load_support_vectors("runs/digits_mlp/tensorboard/version_0/nsv/support_vectors_epoch28.pt")
    >>> again = reproduce(result)          # rebuilds module and data, refits: same support and α
    >>> (again.svm.support_ == result.support.numpy()).all()
    True
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import importlib
import io
import json
import math
import pickle
import struct
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from torch import Tensor

from lightning_nsv import __version__
from lightning_nsv.atomic import backup_path, locked, make_directory, replace_together, resolve_interrupted
from lightning_nsv.path_space import PathNetwork, forward_with_slopes

__all__ = ["ArtifactCorruptError", "ArtifactMismatchError", "SupportVectorArtifact", "content_sha256",
           "load_support_vectors", "network_outputs", "reproduce", "save_support_vectors"]

FORMAT_VERSION = 3  # 3: the .pt carries the SHA-256 of its content and the network's outputs; 2: neither
OLDEST_READABLE = 2
OUTPUT_SAMPLES = 4096  # network outputs saved on at most this many training samples (evenly spaced)


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
    "id": (str,), "format_version": (int,), "support": (Tensor,), "alpha": (Tensor,), "intercept": (int, float), "labels": (Tensor,), "network": (dict,),
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
    network = payload["network"]
    if not (isinstance(network.get("weights"), (list, tuple)) and network["weights"]
            and all(isinstance(w, Tensor) for w in network["weights"])):
        problems.append("'network' must hold 'weights', a list of tensors")
    outputs = payload.get("outputs")
    if outputs is not None and not (
            isinstance(outputs, Mapping) and isinstance(outputs.get("indices"), Tensor)
            and isinstance(outputs.get("values"), Tensor) and outputs["values"].shape[:1] == outputs["indices"].shape
            and (not len(outputs["indices"]) or int(outputs["indices"].max()) < m)):
        problems.append("'outputs' must be a dict of 'indices' (n,) into the training set and 'values' (n,) or (n, K)")
    return problems


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
            flat = value.detach().cpu().contiguous().reshape(-1)
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


def network_outputs(net: PathNetwork, x: Tensor, max_samples: int = OUTPUT_SAMPLES) -> dict[str, Tensor]:
    """The network's outputs ``N(x_j)`` (float64) on at most ``max_samples`` evenly spaced training samples, with
    their indices: saved with a result, so :func:`reproduce` notices a network that computes something else."""
    m = len(x)
    indices = torch.linspace(0, m - 1, min(m, max_samples)).round().to(torch.int64).unique()
    with torch.no_grad():
        values = forward_with_slopes(net.to(x.device), x[indices.to(x.device)])[0]
    return {"indices": indices, "values": values.detach().to("cpu", torch.float64)}


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
    })))


def _check_stem(stem: Any) -> None:
    if not isinstance(stem, str) or not stem or stem in (".", "..") or any(c in stem for c in "/\\\0") \
            or stem.endswith((".pt", ".json")):
        raise ValueError(f"`stem` must be a file name without folder and suffix (e.g. 'support_vectors_epoch3'), "
                         f"got {stem!r}")


def _save_advice(error: OSError) -> str:
    return {errno.ENOSPC: "free space on that disk or pass another save_dir",
            errno.EDQUOT: "the disk quota is used up: free space or pass another save_dir",
            errno.EFBIG: "the file is larger than the file-size limit of this process (ulimit -f): raise the "
                         "limit or save elsewhere",
            errno.EACCES: "make the folder writable or pass another save_dir",
            errno.EPERM: "make the folder writable or pass another save_dir",
            errno.EROFS: "the file system is read-only: pass another save_dir"}.get(error.errno, "")


def save_support_vectors(directory: str | Path, stem: str, payload: dict[str, Any], report: str = "") -> Path:
    """Write ``<stem>.pt`` and ``<stem>.json`` with one id, as one change; returns the ``.pt`` path.

    ``payload`` must hold the keys of :class:`SupportVectorArtifact` (see :func:`load_support_vectors`); it may
    hold ``outputs`` (:func:`network_outputs`), which :func:`reproduce` compares. The ``.pt`` records the
    SHA-256 of its content (:func:`content_sha256`); the ``.json`` is derived from the ``.pt``.

    The ``.json`` is renamed into place first, the ``.pt`` last (see :func:`lightning_nsv.atomic.replace_together`):
    a failure at any step, raised or a kill, leaves the previous pair loadable.

    Raises:
        ValueError, TypeError: when ``stem`` or ``payload`` is not what a result needs (nothing is written).
        OSError: when a write fails; names the file and the step; the previous result is unchanged.
    """
    _check_stem(stem)
    directory = Path(directory)
    pt, summary = directory / f"{stem}.pt", directory / f"{stem}.json"
    payload = _portable({**payload, "id": uuid.uuid4().hex, "format_version": FORMAT_VERSION, "report": report,
                         "versions": {"lightning_nsv": __version__, "torch": str(torch.__version__)}}, "payload")
    problems = _payload_problems(payload)
    if problems:
        raise ValueError(f"cannot save {pt}, the payload is not a support-vector result: " + "; ".join(problems))
    payload["sha256"] = content_sha256(payload)
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    summary_text = json.dumps(_summary(payload), indent=2).encode("utf-8")
    try:
        make_directory(directory)
        with locked(directory):
            resolve_interrupted([summary, pt], keep_previous=lambda: _fits(*_previous_pair(pt, summary)))
            replace_together([(summary, summary_text), (pt, buffer.getbuffer())])
    except OSError as error:
        if not directory.is_dir():
            outcome = f"The folder {directory} is gone (removed during the save?): nothing was saved"
        else:
            outcome = "The previous result there, if any, is unchanged"
        advice = _save_advice(error)
        raise OSError(error.errno, f"could not save the support-vector result {pt}: {error.strerror}"
                                   f"{'; ' + advice if advice else ''}. {outcome}", str(pt)) from error
    return pt


# ---- loading --------------------------------------------------------------------------------------------------

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
        outputs: the network's outputs on evenly spaced training samples (``indices``, ``values``), which
            :func:`reproduce` compares; ``None`` in files of format 2.
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
    outputs: dict | None = field(default=None, repr=False)

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
    recorded, actual = payload.get("sha256"), content_sha256(payload)
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


@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _load_pair(pt: Path, summary: Path) -> dict:
    if not pt.is_file():
        if pt.is_dir():
            raise ArtifactMismatchError(f"{pt} is a folder, not a support-vector result file")
        if summary.is_file():
            raise FileNotFoundError(
                f"no support-vector result at {pt}: {summary.name} is there without its .pt (a first save that "
                "was interrupted, or the .pt was moved or removed); put the .pt back or rerun the analysis")
        raise FileNotFoundError(f"no support-vector result at {pt}")
    payload = _read_pt(pt)
    version = _check_format(payload, pt)
    if version >= 3:
        _check_content(payload, pt, summary)
    else:
        warnings.warn(f"{pt} was saved in result format {version}, without a checksum of its content: it loads, "
                      "but nothing shows whether it was changed after saving; rerun the analysis for a file that "
                      "can be verified", UserWarning, stacklevel=3)
    problems = _payload_problems(payload)
    if problems:
        raise ArtifactMismatchError(f"{pt} is not a support-vector result: " + "; ".join(problems))
    if summary.is_file():
        _check_summary(payload, version, pt, summary)
    return payload


def _fits(pt: Path, summary: Path) -> bool:
    """Whether ``pt`` and ``summary`` load as one result."""
    try:
        with _quiet():
            _load_pair(pt, summary)
    except (ArtifactMismatchError, OSError):
        return False
    return True


def _previous_pair(pt: Path, summary: Path) -> tuple[Path, Path]:
    """The pair as it was before an interrupted save; ``(pt, summary)`` when there are no backups.

    :func:`~lightning_nsv.atomic.replace_together` links the ``.json``'s backup before the ``.pt``'s and removes
    them in the opposite order, so a ``.pt`` backup without a ``.json`` backup means there was no ``.json``.
    """
    if backup_path(pt).exists():
        return backup_path(pt), backup_path(summary)
    return pt, backup_path(summary) if backup_path(summary).exists() else summary


def _pair_paths(path: Path) -> tuple[Path, Path]:
    if path.suffix == ".json":
        pt = path.with_suffix(".pt")
    elif path.suffix == ".pt":
        pt = path
    else:  # a stem, which may hold dots of its own ("run.v2")
        pt = path.with_name(path.name + ".pt")
    return pt, pt.with_suffix(".json")


def load_support_vectors(path: str | Path) -> SupportVectorArtifact:
    """Load a result saved by :class:`~lightning_nsv.callbacks.NetworkSupportVectors`.

    The ``.pt`` is read with ``weights_only=True`` and its content checked against the SHA-256 it records; its
    ``.json``, where present, must be the one derived from it. When a save of this result was interrupted (the
    previous versions, ``.<name>.prev``, are still beside the files and fit together), the previous result is
    loaded, with a warning.

    Args:
        path: the ``.pt`` or ``.json`` file, or their common stem.

    Raises:
        FileNotFoundError: when the ``.pt`` file is missing.
        ArtifactCorruptError: when a file is damaged or truncated, or was changed after it was saved.
        ArtifactMismatchError: when the file is not a result file (or of a newer format), or its ``.json``
            belongs to another save.
    """
    pt, summary = _pair_paths(Path(path))
    with locked(pt.parent, shared=True):
        previous_pt, previous_summary = _previous_pair(pt, summary)
        if (previous_pt, previous_summary) != (pt, summary) and _fits(previous_pt, previous_summary):
            warnings.warn(f"a save of {pt} was interrupted: its previous version is still beside it "
                          f"({', '.join(p.name for p in (previous_pt, previous_summary) if p.name.endswith('.prev'))}) "
                          "and is loaded. The next save of this result cleans up", UserWarning, stacklevel=2)
            pt, summary = previous_pt, previous_summary
        payload = _load_pair(pt, summary)
    net = payload["network"]
    try:
        network = PathNetwork.from_tensors(net["weights"], net.get("biases"), net.get("betas"), net.get("gammas"))
    except (TypeError, ValueError, KeyError) as error:
        raise ArtifactMismatchError(f"{pt}: its 'network' does not describe a path network ({error})") from None
    return SupportVectorArtifact(
        path=pt, id=payload["id"], support=payload["support"], alpha=payload["alpha"],
        intercept=float(payload["intercept"]), labels=payload["labels"], network=network,
        path_module=payload["path_module"], embedding=payload["embedding"], path_part=payload["path_part"],
        module_class=payload["module_class"], module_hparams=payload["module_hparams"],
        module_state=payload["module_state"], data_class=payload["data_class"],
        data_hparams=payload["data_hparams"], train_indices=payload["train_indices"], solver=payload["solver"],
        metrics=payload["metrics"], epoch=int(payload["epoch"]), global_step=int(payload["global_step"]),
        versions=payload.get("versions", {}), outputs=payload.get("outputs"),
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
              datamodule: Any = None, batch_size: int = 1024, output_rtol: float = 1e-6):
    """Recompute the analysis of a result file from what it holds; returns a fresh ``SupportVectorAnalysis``.

    The module is rebuilt from its class and init arguments (or ``module``, whose weights are replaced by the
    saved ones), the training set from the data module's class and init arguments (or ``datamodule``), and the
    max-margin classifier is fitted again with the saved solver settings (validation included, where the data
    module has a validation set).

    Before fitting, the rebuilt network's outputs on the saved samples are compared with the saved outputs: they
    must agree to ``output_rtol · max(1, max |saved output|)`` (float64; the default 1e-6 allows the rounding of
    a float32 trunk run with other batch sizes; a trunk run in TF32 on a GPU may need 1e-3).

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
    if artifact.outputs is not None:
        _check_outputs(artifact, net, x_train, output_rtol)
    else:
        warnings.warn(f"{artifact.path} holds no network outputs (saved before format 3): nothing shows whether the "
                      "rebuilt network computes what the analysed one did", UserWarning, stacklevel=2)
    val = getattr(datamodule, "val_dataset", None)
    x_val, y_val = embedded(val) if val is not None and len(val) else (None, None)
    solver = artifact.solver
    if net.num_outputs > 1:
        return multiclass_support_vectors(net, x_train, y_train, x_val, y_val, method=solver["multiclass"])
    return network_support_vectors(
        net, x_train, y_train, x_val, y_val, intercept=solver["intercept"], C=solver["C"],
        kernel=solver["kernel"], max_dense_bytes=solver["max_dense_bytes"],
    )


def _check_outputs(artifact: SupportVectorArtifact, net: PathNetwork, x_train: Tensor, rtol: float) -> None:
    indices, saved = artifact.outputs["indices"], artifact.outputs["values"].to(torch.float64)
    if len(x_train) != artifact.m or (len(indices) and int(indices.max()) >= len(x_train)):
        raise ArtifactMismatchError(f"the rebuilt training set has {len(x_train)} samples, {artifact.path} "
                                    f"was analysed on {artifact.m}")
    now = network_outputs(net, x_train[indices], max_samples=len(indices))["values"]
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
