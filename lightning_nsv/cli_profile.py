"""``lightning-nsv profile --ckpt_path RUN/checkpoints/X.ckpt [--cuts a,b] [--out DIR]``: the support vectors of a
trained checkpoint from every valid cut (or the ones given), from the input to the head
(:func:`~lightning_nsv.scope.profile.support_vector_profile`), with each cut's cost said first. Writes the table
(``profile.md``), ``profile.csv``, each cut's support vectors (``profile_supports.json``), the figure of s/m and the
bound against depth (``profile.png``) and a TensorBoard run (``tensorboard/``) to ``--out`` (default
``<the checkpoint's run>/profile-epoch<E>``).

The model and the data module are rebuilt from the classes and init arguments the checkpoint records (a fit by
``lightning-nsv fit``), or from ``--config`` (default: the run's ``config.yaml`` beside ``checkpoints/``); the weights
are the checkpoint's. Parsed before LightningCLI (nothing is trained)."""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any, Sequence

import torch
import yaml

from lightning_nsv.cli_checkpoint import check_weights_fit, read_checkpoint
from lightning_nsv.scope import AnalysisOptions
from lightning_nsv.scope.profile import DepthProfile, support_vector_profile

__all__ = ["main"]

_SHORT_HOMES = ("lightning_nsv.models", "lightning_nsv.datamodules")


def _class(path: str) -> type:
    module, _, name = path.rpartition(".")
    for home in ([module] if module else list(_SHORT_HOMES)):
        found = getattr(importlib.import_module(home), name, None)
        if found is not None:
            return found
    raise ValueError(f"no class {path!r}: give its dotted path (e.g. lightning_nsv.models.ConvFCNet)")


def _part(checkpoint: dict, config: dict, key: str, recorded_key: str, ckpt_path: Path) -> Any:
    """The model or data module the checkpoint records (class and init arguments), else the config's."""
    recorded = dict(checkpoint.get(recorded_key) or {})
    configured = config.get(key) or {}
    class_path = recorded.pop("_class_path", None) or configured.get("class_path")
    if class_path is None:
        raise ValueError(f"--ckpt_path={ckpt_path} records no {key} class, and no config names one: pass --config "
                         "with the run's config.yaml (`lightning-nsv fit` writes it beside checkpoints/)")
    arguments = {k: v for k, v in recorded.items() if not k.startswith("_")} or dict(configured.get("init_args")
                                                                                     or {})
    return _class(class_path)(**arguments)


def _tensors(dataset: Any) -> tuple[torch.Tensor, torch.Tensor]:
    tensors = getattr(dataset, "tensors", None)
    if tensors is not None:
        return tensors[0], tensors[1]
    xs, ys = zip(*(dataset[i][:2] for i in range(len(dataset))))
    return torch.stack(xs), torch.as_tensor([int(v) for v in ys])


def profile_checkpoint(ckpt_path: str | Path, cuts: Sequence[str] | None = None, config: str | Path | None = None,
                       out: str | Path | None = None, time_budget: float | None = None, tensorboard: bool = True,
                       every: bool = False) -> tuple[DepthProfile, dict[str, Path]]:
    """The profile of the checkpoint's network on its training set (validation included), written to ``out``."""
    ckpt_path = Path(ckpt_path)
    checkpoint = read_checkpoint(ckpt_path)
    run = ckpt_path.resolve().parent.parent if ckpt_path.resolve().parent.name == "checkpoints" else None
    config_path = Path(config) if config is not None else (run / "config.yaml" if run is not None else None)
    settings = yaml.safe_load(config_path.read_text()) if config_path is not None and config_path.is_file() else {}
    model = _part(checkpoint, settings, "model", "hyper_parameters", ckpt_path)
    check_weights_fit(model, checkpoint["state_dict"], str(ckpt_path))
    model.load_state_dict(checkpoint["state_dict"])
    model.eval()
    data = _part(checkpoint, settings, "data", "datamodule_hyper_parameters", ckpt_path)
    data.setup("fit")
    x, y = _tensors(data.train_dataset)
    val = getattr(data, "val_dataset", None)
    x_val, y_val = _tensors(val) if val is not None and len(val) else (None, None)
    options = AnalysisOptions() if time_budget is None else AnalysisOptions(time_budget=time_budget)
    profile = support_vector_profile(model, x, y, x_val, y_val, cuts, every=every, options=options)
    epoch = int(checkpoint.get("epoch", 0))
    out = Path(out) if out is not None else (run or ckpt_path.parent) / f"profile-epoch{epoch}"
    return profile, profile.write(out, tensorboard=tensorboard)


def main(argv: Sequence[str] | None = None) -> DepthProfile:
    parser = argparse.ArgumentParser(prog="lightning-nsv profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt_path", required=True, help="a checkpoint that `lightning-nsv fit` wrote (.ckpt)")
    parser.add_argument("--cuts", default=None, metavar="A,B",
                        help="module names (named_modules()) or 'input', comma-separated; default: every valid cut")
    parser.add_argument("--every_cut", action="store_true",
                        help="every module whose input is a cut (activations and pools too), not only layers and "
                             "blocks")
    parser.add_argument("--config", default=None, help="the run's config.yaml (default: beside checkpoints/)")
    parser.add_argument("--out", default=None, metavar="DIR", help="where the table, CSV, figure and run go")
    parser.add_argument("--time_budget", type=float, default=None,
                        help="seconds one cut may take (default an hour); cuts above it are left out with a note")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cuts = None if args.cuts is None else [c.strip() for c in args.cuts.split(",") if c.strip()]
    try:
        profile, paths = profile_checkpoint(args.ckpt_path, cuts, args.config, args.out, args.time_budget,
                                            every=args.every_cut)
    except (ValueError, FileNotFoundError) as err:
        print(f"lightning-nsv profile: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    print(f"{profile.network}\n\n{profile.table()}\n")
    print("written: " + ", ".join(str(p) for p in paths.values()))
    return profile
