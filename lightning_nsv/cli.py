"""``lightning-nsv``: LightningCLI over any LightningModule and LightningDataModule.

Example::

    lightning-nsv fit --config examples/configs/digits_mlp.yaml
    lightning-nsv fit --model LeakyReLUMLP --data DigitsDataModule --trainer.callbacks+=NetworkSupportVectors
    lightning-nsv analyze --config examples/configs/digits_mlp.yaml --ckpt_path path/to/last.ckpt

``analyze`` loads a trained checkpoint and its data module and runs the configured analysis callbacks
(``NetworkSupportVectors``; ``PsiRankMonitor`` and ``LossValleyMonitor`` for skip networks) once, with the same
logs and files as during training, at the checkpoint's step, without training. The analysis stands alone (no
comparison with the analyses logged before the checkpoint was saved); the model is rebuilt from the
checkpoint's hyperparameters. ``--threads N`` sets the torch and BLAS thread pools (one
thread is often fastest for these small networks on a shared machine).

The package's modules, data modules and callbacks are imported here so that their short names resolve.
"""
from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any, Optional

import torch

import lightning_nsv.callbacks  # noqa: F401
import lightning_nsv.datamodules  # noqa: F401
import lightning_nsv.models  # noqa: F401
from lightning_nsv.callbacks import LossValleyMonitor, NetworkSupportVectors, PsiRankMonitor
from lightning_nsv.compat import PACKAGE, LightningDataModule, LightningModule, pl, rank_zero_warn, submodule

LightningCLI = submodule("cli").LightningCLI

# third-party deprecation notices and advertisements that say nothing about the user's run
_NOISE = (".*isinstance\\(treespec, LeafSpec\\).*", ".*skip_none parameter was deprecated.*")


class _DropTips(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip")


class _AnalyzeOnValidation(pl.Callback):
    """Runs the analysis callbacks once, at the end of the validation epoch of ``Trainer.analyze``."""

    def __init__(self, callbacks: list[Any], epoch: int) -> None:
        self.callbacks, self.epoch = callbacks, epoch

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
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
        if not Path(ckpt_path).is_file():
            raise FileNotFoundError(f"`lightning-nsv analyze`: no checkpoint file at --ckpt_path={ckpt_path}")
        checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=True)
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
        self.callbacks.append(_AnalyzeOnValidation(analysers, epoch=int(checkpoint.get("epoch", 0))))
        self.validate(model, datamodule=datamodule, ckpt_path=ckpt_path, verbose=False)


class NSVLightningCLI(LightningCLI):
    """LightningCLI with ``analyze``, ``--threads`` and no ``_instantiator`` in the logged hyperparameters."""

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        return {**LightningCLI.subcommands(), "analyze": {"model", "datamodule"}}

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.add_argument("--threads", type=Optional[int], default=None,
                            help="Threads of torch and of the BLAS pools (default: leave them as they are)")

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        threads = config.get("threads")
        if threads is not None:
            if threads < 1:
                raise ValueError(f"--threads must be a positive integer, got {threads}")
            from threadpoolctl import threadpool_limits

            torch.set_num_threads(threads)
            self._thread_limits = threadpool_limits(threads)

    def instantiate_classes(self) -> None:
        super().instantiate_classes()
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
    tips = _DropTips()
    rank_zero_logger = logging.getLogger(f"{PACKAGE}.utilities.rank_zero")
    rank_zero_logger.addFilter(tips)
    with warnings.catch_warnings():
        for message in _NOISE:
            warnings.filterwarnings("ignore", message=message)
        try:
            NSVLightningCLI(
                LightningModule,
                LightningDataModule,
                trainer_class=AnalysisTrainer,
                subclass_mode_model=True,
                subclass_mode_data=True,
                save_config_kwargs={"overwrite": True},
                args=args,
            )
        finally:
            rank_zero_logger.removeFilter(tips)


if __name__ == "__main__":
    main()
