"""``lightning-nsv``: LightningCLI over any LightningModule and LightningDataModule.

Example::

    lightning-nsv fit --config examples/configs/digits_mlp.yaml
    lightning-nsv fit --model LeakyReLUMLP --data DigitsDataModule --trainer.callbacks+=NetworkSupportVectors
    lightning-nsv analyze --config examples/configs/digits_mlp.yaml --ckpt_path path/to/last.ckpt

``analyze`` loads a trained checkpoint and its data module and runs the configured analysis callbacks
(``NetworkSupportVectors``; ``PsiRankMonitor`` and ``LossValleyMonitor`` for skip networks) once, with the same
logs and files as during training, at the checkpoint's step, without training. The analysis stands alone (no
comparison with the analyses logged before the checkpoint was saved); the model is rebuilt from the
checkpoint's hyperparameters. It logs in a run of its own, ``<the checkpoint's run>-analysis-epoch<E>`` beside
the fit's (TensorBoard and CSV loggers whose version the config leaves unset), and says which checkpoint it
analyses again, on the console and in the Text tab (``re-analysis``). ``fit`` and ``analyze`` end by printing the
log folder and the result file. ``--threads N`` sets the torch and BLAS thread pools (one thread is often fastest
for these small networks on a shared machine). The optimizer is the model's own (``--model.optimizer``,
``--model.lr``); LightningCLI's ``--optimizer``, when given, replaces it (see ``lightning_nsv.cli_help``).

Before LightningCLI reads a ``--ckpt_path``, :func:`read_checkpoint` checks it (a whole zip archive, every CRC
right, loadable with ``weights_only=True``, a Lightning checkpoint). ``analyze`` and a resumed ``fit`` then compare
the config with what the checkpoint records: another model or data class, or a data argument that chooses the
training set (``seed``, ``m``, ...), is refused with each difference and the fix; other model arguments are named
in a warning (the checkpoint's are used). ``analyze`` also compares the training indices that the package's data
modules record in checkpoints.

The package's modules, data modules and callbacks are imported here so that their short names resolve.
"""
from __future__ import annotations

import importlib
import json
import logging
import os
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any, Optional

import torch
from jsonargparse import Namespace

import lightning_nsv.callbacks  # noqa: F401
import lightning_nsv.datamodules  # noqa: F401
from lightning_nsv.models import ConvFCNet, LeakyReLUMLP, ResNetClassifier, SkipNetwork  # noqa: F401  (short names)
from lightning_nsv.artifacts import plain
from lightning_nsv.callbacks import LossValleyMonitor, NetworkSupportVectors, PsiRankMonitor
from lightning_nsv.callbacks.sinks import FigureSink, log_directory
from lightning_nsv.cli_help import NSVArgumentParser, check_example_script_options, describe_groups
from lightning_nsv.compat import PACKAGE, LightningDataModule, LightningModule, pl, rank_zero_info, rank_zero_warn, \
    submodule
from lightning_nsv.datamodules import ClassificationDataModule

LightningCLI = submodule("cli").LightningCLI

# third-party deprecation notices and advertisements that say nothing about the user's run
_NOISE = (".*isinstance\\(treespec, LeafSpec\\).*",)
# and LightningCLI's own calls of jsonargparse APIs that newer jsonargparse deprecates (skip_none, ...)
_NOISY_MODULE = re.escape(f"{PACKAGE}.cli") + "$"


_DESCRIPTION = ("Train a LightningModule with the analysis callbacks (fit), analyse a trained checkpoint again "
                "(analyze), or compare the support sets of result files (lightning-nsv compare --help).")

# `--ckpt_path` values that Lightning resolves itself (fit, validate, test, predict; not analyze)
_LIGHTNING_CKPT_NAMES = ("best", "last", "hpc", "registry")
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


def _check_against_config(checkpoint: dict[str, Any], config: Any, ckpt_path: str, subcommand: str) -> None:
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


def _check_weights_fit(model: LightningModule, state_dict: dict[str, Any], ckpt_path: str) -> None:
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


def _name_analysis_run(config: Any, ckpt_path: Path, epoch: int) -> None:
    """Give ``analyze``'s TensorBoard and CSV loggers a run name of their own where the config sets none:
    ``<the checkpoint's run>-analysis-epoch<E>`` (``<checkpoint stem>-analysis-epoch<E>`` for a checkpoint outside
    a run's ``checkpoints/`` folder), with ``_2``, ``_3``, ... when analysed again. Lightning's default logger is
    made explicit to be named."""
    loggers = config.get("trainer.logger")
    if loggers in (None, True):
        loggers = config["trainer.logger"] = Namespace(
            class_path=f"{PACKAGE}.loggers.TensorBoardLogger",
            init_args=Namespace(save_dir=config.get("trainer.default_root_dir") or os.getcwd()))
    run = ckpt_path.parent.parent.name if ckpt_path.parent.name == "checkpoints" else ckpt_path.stem
    loggers = loggers if isinstance(loggers, list) else [loggers]
    for logger in loggers:
        if not isinstance(logger, Namespace) or logger.get("init_args.version") is not None:
            continue
        try:
            cls = getattr(importlib.import_module(logger.class_path.rpartition(".")[0]),
                          logger.class_path.rpartition(".")[2])
        except (ImportError, AttributeError, ValueError):
            continue
        if not issubclass(cls, (pl.loggers.TensorBoardLogger, pl.loggers.CSVLogger)):
            continue  # other loggers' versions are run ids (W&B, MLflow): left to them
        args = logger.get("init_args") or Namespace()
        name = args.get("name", "lightning_logs")
        root = Path(args.get("save_dir") or config.get("trainer.default_root_dir") or ".") / (name or "")
        version, again = f"{run}-analysis-epoch{epoch}", 1
        while (root / version).exists():
            again += 1
            version = f"{run}-analysis-epoch{epoch}_{again}"
        logger["init_args.version"] = version


def _raised_in_package(error: BaseException) -> bool:
    """Whether ``error`` was raised in this package's code (a model's or data module's argument check)."""
    package = Path(__file__).parent
    traceback = error.__traceback__
    while traceback is not None and traceback.tb_next is not None:
        traceback = traceback.tb_next
    return traceback is not None and package in Path(traceback.tb_frame.f_code.co_filename).parents


class _DropTips(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip")


class _AnalyzeOnValidation(pl.Callback):
    """Runs the analysis callbacks once, at the end of the validation epoch of ``Trainer.analyze``, on the
    training set the checkpoint records (where it records one), after a line (console and the loggers' Text tab,
    tag ``re-analysis``) that says which checkpoint is analysed again."""

    def __init__(self, callbacks: list[Any], epoch: int, ckpt_path: str | Path) -> None:
        self.callbacks, self.epoch, self.ckpt_path = callbacks, epoch, Path(ckpt_path)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if isinstance(trainer.datamodule, ClassificationDataModule):  # restored from the checkpoint by now
            trainer.datamodule.check_training_indices()

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        directory = log_directory(trainer)  # a collective: every rank asks
        if trainer.is_global_zero:
            line = (f"re-analysis of checkpoint {self.ckpt_path} (epoch {self.epoch}, step {trainer.global_step}), "
                    "without training")
            rank_zero_info(f"lightning-nsv analyze: {line}; logs in {directory}")
            FigureSink(trainer.loggers, directory / "figures", "lightning-nsv analyze").text(
                "re-analysis", line.replace(str(self.ckpt_path), f"`{self.ckpt_path}`"), trainer.global_step)
        for callback in self.callbacks:
            callback.analyze_now(trainer, pl_module, epoch=self.epoch)


class AnalysisTrainer(pl.Trainer):
    """A Trainer with one more entry point, :meth:`analyze`."""

    def analyze(self, model: LightningModule, datamodule: Optional[LightningDataModule] = None,
                ckpt_path: Optional[str] = None) -> None:
        """Analyse a trained checkpoint once (support vectors; Ψ and valleys for skip networks), without training.

        Args:
            model: the module the checkpoint was trained from.
            datamodule: its data module (the training set is rebuilt from its arguments).
            ckpt_path: the checkpoint to analyse.
        """
        if ckpt_path is None:
            raise ValueError("`lightning-nsv analyze` needs --ckpt_path pointing at a trained checkpoint (.ckpt)")
        checkpoint = read_checkpoint(ckpt_path)
        _check_weights_fit(model, checkpoint["state_dict"], ckpt_path)
        fit_loop = checkpoint.get("loops", {}).get("fit_loop")
        if fit_loop is not None:  # the epoch and the step of the checkpoint: logs land where the fit's did
            epoch_loop = self.fit_loop.epoch_loop
            try:
                self.fit_loop.load_state_dict(fit_loop)
                # the fit logs epoch-end metrics one step back, at the epoch's last step (Lightning's FitLoop)
                epoch_loop._batches_that_stepped = max(0, epoch_loop._batches_that_stepped - 1)
            except (KeyError, TypeError, ValueError, AttributeError) as error:
                rank_zero_warn(f"`lightning-nsv analyze`: the checkpoint's loop state could not be read ({error!r}), "
                               "so the analysis is logged at step 0 instead of the checkpoint's step")
        analysers = [cb for cb in self.callbacks
                     if isinstance(cb, (NetworkSupportVectors, PsiRankMonitor, LossValleyMonitor))]
        if not analysers:
            from lightning_nsv.models.skip import SkipNetwork

            analysers = [PsiRankMonitor(), LossValleyMonitor()] if isinstance(model, SkipNetwork) else [
                NetworkSupportVectors()]
            self.callbacks.extend(analysers)
        # the checkpoint callbacks save nothing here; given the folder their state in the checkpoint records (the
        # fit's), they restore it without Lightning's "The dirpath has changed" warning
        for callback in self.checkpoint_callbacks:
            recorded = (checkpoint.get("callbacks") or {}).get(callback.state_key) or {}
            if getattr(callback, "dirpath", None) is None and recorded.get("dirpath") is not None:
                callback.dirpath = recorded["dirpath"]
        self.callbacks.append(_AnalyzeOnValidation(analysers, int(checkpoint.get("epoch", 0)), ckpt_path))
        self.validate(model, datamodule=datamodule, ckpt_path=ckpt_path, verbose=False)


class NSVLightningCLI(LightningCLI):
    """LightningCLI with ``analyze``, ``--threads`` and no ``_instantiator`` in the logged hyperparameters."""

    _checkpoint: dict[str, Any] | None = None  # the --ckpt_path that parse_arguments read

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        return {**LightningCLI.subcommands(), "analyze": {"model", "datamodule"}}

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.add_argument("--threads", type=Optional[int], default=None,
                            help="Threads of torch and of the BLAS pools (default: leave them as they are)")
        describe_groups(parser)

    def parse_arguments(self, parser: Any, args: Any) -> None:
        """Parse, then check what LightningCLI would otherwise meet later, or never: a ``--ckpt_path`` that is
        no readable checkpoint (before LightningCLI loads it), an ``analyze`` config that does not fit its
        checkpoint, and a ``fit`` that trains nothing."""
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        if subcommand is None:
            return
        config = self.config[subcommand]
        if subcommand == "fit":
            for limit in ("max_epochs", "max_steps"):
                if config.get(f"trainer.{limit}") == 0:
                    raise ValueError(f"--trainer.{limit}=0 trains nothing; pass a positive number, or -1 for no limit")
        ckpt_path = config.get("ckpt_path")
        if subcommand == "analyze" and ckpt_path is None:
            raise ValueError("`lightning-nsv analyze` needs --ckpt_path pointing at a trained checkpoint (.ckpt)")
        if ckpt_path is None or (subcommand != "analyze" and (
                str(ckpt_path).split(":")[0] in _LIGHTNING_CKPT_NAMES or "://" in str(ckpt_path))):
            return
        checkpoint = self._checkpoint = read_checkpoint(ckpt_path)
        if subcommand in ("analyze", "fit"):  # validate and test may use other data on purpose
            _check_against_config(checkpoint, config, str(ckpt_path), subcommand)
        if subcommand == "analyze":
            _name_analysis_run(config, Path(ckpt_path), int(checkpoint.get("epoch", 0)))

    def _parse_ckpt_path(self) -> None:
        """LightningCLI reads a checkpoint's hyperparameters as the model's config; those of a fit outside the command
        line name no class, so they become init args of the model class the command names (the checkpoint as
        :meth:`parse_arguments` read it)."""
        found = self._checkpoint or {}
        hparams = {key: value for key, value in found.get("hyper_parameters", {}).items() if key != "_instantiator"}
        subcommand = self.config.get("subcommand")
        model = self.config[subcommand].get("model") if hparams and "_class_path" not in hparams else None
        if model is None or model.get("class_path") is None:
            return super()._parse_ckpt_path()
        self.config = self.parser.parse_object(
            {subcommand: {"model": {"class_path": model["class_path"], "init_args": hparams}}}, self.config)

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        threads = config.get("threads")
        if threads is not None:
            if threads < 1:
                raise ValueError(f"--threads must be a positive integer, got {threads}")
            from threadpoolctl import threadpool_limits

            torch.set_num_threads(threads)
            self._thread_limits = threadpool_limits(threads)

    def after_fit(self) -> None:
        """Say where the logs and the result files of this run are (on rank zero)."""
        directory = log_directory(self.trainer)  # a collective: every rank asks
        results = []
        for callback in self.trainer.callbacks:
            pt = callback.result_path if isinstance(callback, NetworkSupportVectors) else None
            if pt is not None and pt.is_file():  # written in this run (a resumed fit's restored state holds none)
                results.append(pt)
        if self.trainer.is_global_zero:
            print(f"logs: {directory}")
            for pt in results:
                print(f"results: {pt} (and {pt.with_suffix('.json').name}; "
                      "read with lightning_nsv.artifacts.load_support_vectors)")

    after_analyze = after_fit

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except ValueError as err:
            # jsonargparse wraps a class's own argument error in its union-type report: raise the class's own
            root = err
            while root.__cause__ is not None:
                root = root.__cause__
            raise (root if _raised_in_package(root) else err) from None
        for part in (self.model, self.datamodule):
            initial = getattr(part, "_hparams_initial", None)
            if initial is not None and "_instantiator" in initial:
                del initial["_instantiator"]  # logged hyperparameters only; checkpoints keep it


def main(args: list[str] | None = None) -> None:
    """Run the command line; ``args`` replaces ``sys.argv[1:]`` (for tests)."""
    import sys

    argv = sys.argv[1:] if args is None else list(args)
    if argv[:1] == ["compare"]:  # support sets of result files, not a Trainer command
        from lightning_nsv.analysis.stability import main as compare

        compare(argv[1:])
        return
    check_example_script_options(argv)
    tips = _DropTips()
    rank_zero_logger = logging.getLogger(f"{PACKAGE}.utilities.rank_zero")
    rank_zero_logger.addFilter(tips)
    with warnings.catch_warnings():
        for message in _NOISE:
            warnings.filterwarnings("ignore", message=message)
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=_NOISY_MODULE)
        try:
            NSVLightningCLI(
                LightningModule,
                LightningDataModule,
                trainer_class=AnalysisTrainer,
                parser_class=NSVArgumentParser,
                parser_kwargs={"description": _DESCRIPTION},
                subclass_mode_model=True,
                subclass_mode_data=True,
                save_config_kwargs={"overwrite": True},
                args=args,
            )
        finally:
            rank_zero_logger.removeFilter(tips)


if __name__ == "__main__":
    main()
