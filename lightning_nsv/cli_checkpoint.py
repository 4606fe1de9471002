"""What ``lightning-nsv`` checks of a ``--ckpt_path`` before it trusts it: that the file is a whole, loadable
Lightning checkpoint (:func:`read_checkpoint`), that the config asks for the model and the training set it was
trained with, that its weights fit the model the config builds, and which epoch's weights it holds against the
epochs the run's result files were analysed at (:func:`say_which_weights`)."""
from __future__ import annotations

import importlib
import json
import zipfile
from pathlib import Path
from typing import Any, Iterable

import torch

from lightning_nsv.artifacts import plain
from lightning_nsv.compat import LightningModule, rank_zero_warn

__all__ = ["check_against_config", "check_weights_fit", "read_checkpoint", "say_which_weights"]

# data arguments that do not change the training set, and one that may move with the data
_LOADER_ONLY = ("batch_size", "num_workers", "download")
_LOCATION = ("root",)
_DAMAGED = ("use another checkpoint of the run (its checkpoints/ folder) or train again with `lightning-nsv fit`; "
            "a file that was copied should be copied anew")


def read_checkpoint(path: str | Path, argument: str = "--ckpt_path") -> dict[str, Any]:
    """The Lightning checkpoint at ``path``, loaded with ``weights_only=True``, its tensors memory-mapped.

    Before the load: the path is a non-empty file and a whole zip archive (central directory found, every
    member's CRC-32 right: torch checks no CRC, so a damaged weight would load). That reads the file once,
    about 0.25 s for 200 MB here, less than a plain ``torch.load``. A file that fails any check, or that is no Lightning checkpoint (a result
    ``.pt`` of the callback, a pickled model), is refused by name; an unsafe load is never suggested.

    Raises:
        FileNotFoundError: No file at ``path``.
        ValueError: A directory, an empty, truncated or corrupt file, or no Lightning checkpoint.
    """
    path = Path(path)
    where = f"{argument}={path}"
    if path.is_dir():
        inside = sorted(str(p) for p in path.rglob("*.ckpt"))[:3]
        hint = f" (it holds {', '.join(inside)})" if inside else ""
        raise ValueError(f"{where} is a directory{hint}; pass the checkpoint file itself (a .ckpt)")
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint file at {where}; pass a .ckpt that a fit wrote (its checkpoints/ "
                                "folder)")
    size = path.stat().st_size
    if size == 0:
        raise ValueError(f"{where} is an empty file (0 bytes: an interrupted save or copy); {_DAMAGED}")
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{where} is truncated or corrupt: {size:,} bytes without the zip directory that ends "
                         f"every checkpoint torch.save writes (or not a checkpoint at all); {_DAMAGED}")
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as err:
        raise ValueError(f"{where} is truncated or corrupt ({type(err).__name__}: {err}); {_DAMAGED}") from None
    if damaged is not None:
        raise ValueError(f"{where} is corrupt: its member {damaged} does not match its CRC-32 checksum; {_DAMAGED}")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # what torch.load raises varies; its advice (an unsafe load) is not passed on
        raise ValueError(
            f"{where} cannot be loaded as a checkpoint with weights_only=True ({type(err).__name__}): a damaged "
            f"file, or one that holds Python objects besides tensors (a pickled model), which is not loaded; "
            f"{_DAMAGED}"
        ) from None
    if isinstance(checkpoint, dict) and {"support", "alpha", "module_state"} <= checkpoint.keys():
        raise ValueError(
            f"{where} is a result file of NetworkSupportVectors (support vectors and α), not a training checkpoint; "
            "read it with `lightning_nsv.artifacts.load_support_vectors`, or pass the run's .ckpt (its checkpoints/ "
            "folder) to analyse the network again"
        )
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        found = sorted(map(str, checkpoint))[:8] if isinstance(checkpoint, dict) else type(checkpoint).__name__
        raise ValueError(f"{where} is not a Lightning checkpoint (no state_dict; it holds {found}); pass a .ckpt "
                         "that a fit wrote (its checkpoints/ folder)")
    return checkpoint


def _resolves_to(first: str | None, second: str | None) -> bool:
    """Whether two class paths name the same class (``a.b.C`` and its re-export ``a.C`` do)."""
    def resolve(name: str | None) -> Any:
        module, _, attribute = (name or "").rpartition(".")
        try:
            return getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError, ValueError):
            return name

    return first == second or resolve(first) is resolve(second)


def _differences(recorded: dict[str, Any], configured: Any) -> list[tuple[str, Any, Any]]:
    """``(argument, checkpoint value, config value)`` for each init argument both name that differs."""
    recorded = plain(recorded)
    configured = plain(configured.as_dict() if hasattr(configured, "as_dict") else dict(configured or {}))
    return [(key, recorded[key], configured[key]) for key in recorded
            if key in configured and recorded[key] != configured[key]]


def _cli_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def check_against_config(checkpoint: dict[str, Any], config: Any, ckpt_path: str, subcommand: str) -> None:
    """Refuse an ``analyze`` or a resumed ``fit`` whose model class, data class, or data arguments that choose the
    training set differ from the checkpoint's (another training set: errors counted on samples the network never
    saw, support vectors of other samples); warn on other differences. Each is named with both values."""
    run_config = Path(ckpt_path).resolve().parent.parent / "config.yaml"  # <log_dir>/checkpoints/<file>.ckpt
    use = ("use the config the checkpoint was trained with "
           f"({run_config if run_config.is_file() else 'the config.yaml of its run'})")
    run = "analysis" if subcommand == "analyze" else "resumed fit"
    for key, recorded_key in (("model", "hyper_parameters"), ("data", "datamodule_hyper_parameters")):
        recorded, configured = checkpoint.get(recorded_key) or {}, config.get(key)
        if "_class_path" not in recorded or configured is None:
            continue  # not trained through the command line: nothing recorded to compare
        if not _resolves_to(recorded["_class_path"], configured.get("class_path")):
            raise ValueError(
                f"`lightning-nsv {subcommand}`: --ckpt_path={ckpt_path} was trained with {key} "
                f"{recorded['_class_path']}, the config asks for {configured.get('class_path')}; {use}"
            )
        differences = [(arg, a, b) for arg, a, b in _differences(recorded, configured.get("init_args"))
                       if not (key == "data" and arg in _LOADER_ONLY)
                       and not (key == "data" and arg in _LOCATION and Path(a).resolve() == Path(b).resolve())]
        refused = [(arg, a, b) for arg, a, b in differences if key == "data" and arg not in _LOCATION]
        if refused:
            flags = " ".join(f"--data.init_args.{arg}={_cli_value(a)}" for arg, a, _ in refused)
            raise ValueError(
                f"`lightning-nsv {subcommand}`: the config's data module differs from the one --ckpt_path="
                f"{ckpt_path} was trained with, so the {run} would see another training set:\n"
                f"{_listed(key, refused)}\n{use[0].upper()}{use[1:]}, or pass {flags}"
            )
        if differences:
            rank_zero_warn(
                f"`lightning-nsv {subcommand}`: the config's model arguments differ from the checkpoint's; the "
                f"network is rebuilt from the checkpoint's:\n{_listed(key, differences)}" if key == "model" else
                f"`lightning-nsv {subcommand}`: the data is read from another place than in training:\n"
                f"{_listed(key, differences)}\nThe checkpoint's training indices, where it records them, are "
                "compared with the data's once it is loaded"
            )


def _listed(key: str, differences: list[tuple[str, Any, Any]]) -> str:
    return "\n".join(f"  {key}.{arg}: checkpoint {_cli_value(a)}, config {_cli_value(b)}" for arg, a, b in differences)


def check_weights_fit(model: LightningModule, state_dict: dict[str, Any], ckpt_path: str) -> None:
    """Refuse a checkpoint whose weights are not those of ``model`` (another class or other sizes), by name."""
    expected = {name: tuple(value.shape) for name, value in model.state_dict().items()}
    found = {name: tuple(getattr(value, "shape", ())) for name, value in state_dict.items()}
    missing, unexpected = sorted(expected.keys() - found.keys()), sorted(found.keys() - expected.keys())
    problems = [f"{name} of shape {found[name]}, the model's {shape}" for name, shape in expected.items()
                if name in found and found[name] != shape]
    problems += [f"missing {', '.join(missing[:5])}"] if missing else []
    problems += [f"unexpected {', '.join(unexpected[:5])}"] if unexpected else []
    if problems:
        raise ValueError(
            f"`lightning-nsv analyze`: the weights in --ckpt_path={ckpt_path} do not fit the {type(model).__name__} "
            f"the config builds ({'; '.join(problems[:5])}): the checkpoint holds another model; use the config it "
            "was trained with"
        )


def _run_results(ckpt_path: Path, folders: Iterable[Path]) -> list[tuple[Path, int, int]]:
    """``(result file, epoch, step)`` of the support-vector results beside a run's checkpoint (``<log_dir>/nsv`` for
    ``<log_dir>/checkpoints/<file>.ckpt``) and in ``folders``, by step; summaries that cannot be read are left out."""
    ckpt_path = Path(ckpt_path).resolve()
    places = {*(Path(folder).resolve() for folder in folders)}
    if ckpt_path.parent.name == "checkpoints":
        places.add(ckpt_path.parent.parent / "nsv")
    found = set()
    for summary in (s for place in places for s in place.glob("support_vectors_epoch*.json")):
        try:
            record = json.loads(summary.read_text())
            found.add((summary.with_suffix(".pt"), int(record["epoch"]), int(record["global_step"])))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return sorted(found, key=lambda result: (result[2], result[1], str(result[0])))


def say_which_weights(checkpoint: dict[str, Any], ckpt_path: str | Path, folders: Iterable[Path] = ()) -> None:
    """Warn when the run's support-vector results (beside the checkpoint, or in ``folders``) were all analysed at
    another epoch or step than the one whose weights the checkpoint holds: ``analyze`` would describe other weights
    than the fit's analysis, and nothing else says so (the fit writes checkpoints when it validates, every
    ``check_val_every_n_epoch`` epochs, so the epoch of an analysis may have none)."""
    epoch, step = int(checkpoint.get("epoch", 0)), int(checkpoint.get("global_step", 0))
    results = _run_results(Path(ckpt_path), folders)
    if not results or any((e, s) == (epoch, step) for _, e, s in results):
        return
    shown = "; ".join(f"{pt} (epoch {e}, step {s})" for pt, e, s in results[-3:])
    latest = results[-1][0]
    rank_zero_warn(
        f"`lightning-nsv analyze`: --ckpt_path={ckpt_path} holds the weights of epoch {epoch} (step {step}), but the "
        f"run's support-vector analysis was of other weights: {shown}. This analysis describes the network of epoch "
        f"{epoch}, not the one analysed during the fit (a fit writes checkpoints when it validates, every "
        "`check_val_every_n_epoch` epochs, so the epoch of an analysis may have none). The result file holds the "
        f"analysed weights: `lightning_nsv.artifacts.reproduce('{latest}')` recomputes that analysis; to keep a "
        "checkpoint of the last epoch, add `ModelCheckpoint(save_on_train_epoch_end=True)` to the trainer's callbacks")
