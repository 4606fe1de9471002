"""``lightning-nsv``: LightningCLI over any LightningModule and LightningDataModule.

Example::

    lightning-nsv fit --config examples/configs/digits_mlp.yaml
    lightning-nsv fit --model LeakyReLUMLP --data DigitsDataModule --trainer.callbacks+=NetworkSupportVectors
    lightning-nsv analyze --config examples/configs/digits_mlp.yaml --ckpt_path path/to/last.ckpt

``profile`` (``lightning-nsv profile --ckpt_path ... [--cuts a,b]``, :mod:`lightning_nsv.cli_profile`) analyses a
trained checkpoint from every valid cut, input to head: the table, CSV, figure and TensorBoard run of s/m along depth.

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

Before LightningCLI reads a ``--ckpt_path``, :func:`~lightning_nsv.cli_checkpoint.read_checkpoint` checks it (a
whole zip archive, every CRC right, loadable with ``weights_only=True``, a Lightning checkpoint). ``analyze`` and a
resumed ``fit`` then compare the config with what the checkpoint records: another model or data class, or a data
argument that chooses the training set (``seed``, ``m``, ...), is refused with each difference and the fix; other
model arguments are named in a warning (the checkpoint's are used). ``analyze`` also compares the training indices
that the package's data modules record in checkpoints.

The package's modules, data modules and callbacks are imported here so that their short names resolve.
"""
from __future__ import annotations

import importlib
import logging
import os
import re
import warnings
from pathlib import Path
from typing import Any, Optional

import torch
from jsonargparse import Namespace

import lightning_nsv.callbacks  # noqa: F401
import lightning_nsv.datamodules  # noqa: F401
from lightning_nsv.models import ConvFCNet, LeakyReLUMLP, ResNetClassifier, SkipNetwork  # noqa: F401  (short names)
from lightning_nsv.callbacks import LossValleyMonitor, NetworkSupportVectors, PsiRankMonitor
from lightning_nsv.callbacks.sinks import FigureSink, log_directory
from lightning_nsv.cli_checkpoint import check_against_config, check_weights_fit, read_checkpoint, say_which_weights
from lightning_nsv.cli_help import NSVArgumentParser, add_compare_entry, check_example_script_options, describe_groups
from lightning_nsv.compat import PACKAGE, LightningDataModule, LightningModule, pl, rank_zero_info, rank_zero_warn, \
    submodule
from lightning_nsv.datamodules import ClassificationDataModule

LightningCLI = submodule("cli").LightningCLI

# third-party deprecation notices and advertisements that say nothing about the user's run
_NOISE = (".*isinstance\\(treespec, LeafSpec\\).*",)
# and LightningCLI's own calls of jsonargparse APIs that newer jsonargparse deprecates (skip_none, ...)
_NOISY_MODULE = re.escape(f"{PACKAGE}.cli") + "$"


_DESCRIPTION = ("Train a LightningModule with the analysis callbacks (fit), analyse a trained checkpoint again "
                "(analyze) or from every cut, input to head (lightning-nsv profile --help), or compare the support "
                "sets of result files (lightning-nsv compare --help).")

# `--ckpt_path` values that Lightning resolves itself (fit, validate, test, predict; not analyze)
_LIGHTNING_CKPT_NAMES = ("best", "last", "hpc", "registry")


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
        check_weights_fit(model, checkpoint["state_dict"], ckpt_path)
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
        say_which_weights(checkpoint, ckpt_path, [Path(cb.save_dir) for cb in analysers
                                                  if isinstance(cb, NetworkSupportVectors) and cb.save_dir])
        self.callbacks.append(_AnalyzeOnValidation(analysers, int(checkpoint.get("epoch", 0)), ckpt_path))
        self.validate(model, datamodule=datamodule, ckpt_path=ckpt_path, verbose=False)


class NSVLightningCLI(LightningCLI):
    """LightningCLI with ``analyze``, ``--threads`` and no ``_instantiator`` in the logged hyperparameters."""

    _checkpoint: dict[str, Any] | None = None  # the --ckpt_path that parse_arguments read

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        return {**LightningCLI.subcommands(), "analyze": {"model", "datamodule"}}

    def _add_subcommands(self, parser: Any, **kwargs: Any) -> None:
        super()._add_subcommands(parser, **kwargs)
        add_compare_entry(parser)

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
            check_against_config(checkpoint, config, str(ckpt_path), subcommand)
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
        from lightning_nsv.compare import main as compare

        compare(argv[1:])
        return
    if argv[:1] == ["profile"]:  # the support vectors of a checkpoint from every cut, not a Trainer command
        from lightning_nsv.cli_profile import main as profile

        profile(argv[1:])
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
