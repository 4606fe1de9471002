"""Both Lightning packages: the choice in ``lightning_nsv.compat``, and the Lightning tests run again under the
package this process did not choose (``LIGHTNING_NSV_PACKAGE``)."""
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lightning_nsv.compat import PACKAGE
from tests.timeouts import timeout_for

ROOT = Path(__file__).parents[2]
OTHER = {"pytorch_lightning": "lightning", "lightning.pytorch": "pytorch_lightning"}[PACKAGE]
# The Lightning-facing tests run again under the other package: not all ~165 of them (about 130 s on a quiet machine,
# killed by its 1,200 s timeout on a loaded one), but one of each path whose classes or calls come from the chosen
# package: the callback's fit, its loggers and checkpointed state, the refusal of a Trainer of the other package,
# a one-class warning through rank_zero_warn, the command line's fit, analyze, help and a refused checkpoint, the
# skip-network monitors through the CLI and across a resume, an error on rank 0 broadcast to every rank, the models'
# manual optimisation and resumed batches, and two DDP ranks. About 40 s on a quiet machine.
LIGHTNING_TESTS = [
    "tests/callbacks/test_nsv_callback.py::test_reaches_zero_error_and_stops",
    "tests/callbacks/test_nsv_callback.py::test_tensorboard_has_metrics_and_figures",
    "tests/callbacks/test_callback_bad_input.py::test_a_trainer_of_the_other_lightning_package_is_refused_with_the_fix",
    "tests/callbacks/test_callback_bad_input.py::test_every_training_label_of_one_class_is_said_and_not_analysed",
    "tests/cli/test_cli.py::test_demo_config_reaches_zero_error_and_logs_the_analysis",
    "tests/cli/test_cli.py::test_analyze_a_saved_checkpoint_without_training",
    "tests/cli/test_cli.py::test_skip_network_config_trains_with_the_valley_callbacks",
    "tests/cli/test_cli_faults.py::test_analyze_refuses_weights_of_another_model",
    "tests/cli/test_cli_help.py::test_fit_help_has_no_markup_and_says_which_optimizer_applies",
    "tests/callbacks/test_valley_callbacks.py::test_resume_from_checkpoint_matches_an_uninterrupted_run",
    "tests/callbacks/test_valley_callbacks.py::test_an_error_on_rank_0_reaches_every_rank_instead_of_hanging_them",
    "tests/models/test_models.py::test_manual_optimization_gives_the_automatic_weights_bit_for_bit",
    "tests/models/test_models.py::test_resumed_run_sees_the_batches_of_an_uninterrupted_run",
    "tests/callbacks/test_ddp.py::test_two_ranks_agree_and_only_rank_zero_fits_the_svm[mlp]",
]


def _python(code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != "LIGHTNING_NSV_PACKAGE"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env={**environment, **env},
                          capture_output=True, text=True, timeout=timeout_for(8))


@pytest.mark.skipif(os.environ.get("LIGHTNING_NSV_PACKAGE") is not None, reason="runs from the outer test run only")
def test_the_lightning_tests_pass_under_the_other_package():
    pytest.importorskip({"lightning": "lightning.pytorch"}.get(OTHER, OTHER))
    environment = {**os.environ, "LIGHTNING_NSV_PACKAGE": OTHER}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                           *LIGHTNING_TESTS], cwd=ROOT, env=environment, capture_output=True, text=True,
                          timeout=timeout_for(40))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    passed = re.search(r"(\d+) passed", done.stdout)
    assert passed and int(passed[1]) >= len(LIGHTNING_TESTS) and " failed" not in done.stdout, done.stdout[-2000:]


def test_a_program_that_imported_lightning_first_gets_lightning_pytorch(tmp_path):
    pytest.importorskip("lightning.pytorch")
    done = _python("""
        import lightning.pytorch as L
        import torch
        from lightning_nsv import compat
        from lightning_nsv.callbacks import NetworkSupportVectors
        from lightning_nsv.datamodules import DigitsDataModule
        from lightning_nsv.models import LeakyReLUMLP
        assert compat.PACKAGE == "lightning.pytorch", compat.PACKAGE
        assert issubclass(LeakyReLUMLP, L.LightningModule) and issubclass(NetworkSupportVectors, L.Callback)
        L.seed_everything(0)
        callback = NetworkSupportVectors()
        trainer = L.Trainer(max_epochs=60, callbacks=[callback], enable_progress_bar=False,
                            enable_checkpointing=False, logger=L.loggers.TensorBoardLogger("out", name="tb"),
                            default_root_dir="out")
        trainer.fit(LeakyReLUMLP(widths=[32, 32], optimizer="adam", lr=0.01),
                    datamodule=DigitsDataModule(m=200, batch_size=50))
        assert callback.zero_error_epoch is not None
        print("OK", callback.metrics["n_support"])
    """, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "OK" in done.stdout


@pytest.mark.parametrize("package, module", [("lightning", "lightning.pytorch"),
                                             ("pytorch_lightning", "pytorch_lightning")])
def test_the_environment_variable_chooses(package, module, tmp_path):
    pytest.importorskip(module)
    done = _python("from lightning_nsv import compat; print(compat.PACKAGE)", tmp_path, LIGHTNING_NSV_PACKAGE=package)
    assert done.returncode == 0 and done.stdout.strip() == module


def test_an_unknown_choice_is_refused(tmp_path):
    done = _python("import lightning_nsv.compat", tmp_path, LIGHTNING_NSV_PACKAGE="lightning_fabric")
    assert done.returncode != 0
    assert "LIGHTNING_NSV_PACKAGE can be lightning or pytorch_lightning, got 'lightning_fabric'" in done.stderr
