"""The pair ``<stem>.pt`` + ``<stem>.json`` on disk: saved as one change (:mod:`lightning_nsv.atomic`), loaded with
every check of :mod:`~lightning_nsv.artifacts.format`, and the previous pair recovered after an interrupted save."""
from __future__ import annotations

import contextlib
import errno
import io
import json
import uuid
import warnings
from pathlib import Path
from typing import Any

import torch

from lightning_nsv import __version__
from lightning_nsv.artifacts.format import (FORMAT_VERSION, ArtifactMismatchError, SupportVectorArtifact,
                                            _check_content, _check_format, _check_summary, _payload_problems,
                                            _portable, _read_pt, _summary, content_sha256)
from lightning_nsv.atomic import backup_path, locked, make_directory, replace_together, resolve_interrupted
from lightning_nsv.kernel.network import PathNetwork

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
    hold ``outputs`` (:func:`network_outputs`), which :func:`reproduce` compares, and ``scope`` (``"head"``, the
    default, or ``"whole"``: :func:`~lightning_nsv.artifacts.whole.whole_network_payload`). The ``.pt`` records the
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
    payload = _portable({"scope": "head", **payload, "id": uuid.uuid4().hex, "format_version": FORMAT_VERSION, "report": report,
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
    net, network = payload["network"], None
    try:
        if net is not None:
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
        scope=payload.get("scope", "head"), scope_summary=payload.get("scope_summary"),
    )
