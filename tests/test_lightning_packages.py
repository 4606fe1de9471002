"""Both Lightning packages: the choice in ``lightning_nsv.compat``, and the Lightning tests run again under the
package this process did not choose (``LIGHTNING_NSV_PACKAGE``)."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lightning_nsv.compat import PACKAGE

ROOT = Path(__file__).parents[1]
OTHER = {"pytorch_lightning": "lightning", "lightning.pytorch": "pytorch_lightning"}[PACKAGE]
# the Lightning-facing tests: callbacks, loggers and figures, CLI, data modules, models
LIGHTNING_TESTS = ["tests/test_nsv_callback.py", "tests/test_callback_bad_input.py", "tests/test_cli.py",
                   "tests/test_cli_faults.py", "tests/test_cli_help.py", "tests/test_valley_callbacks.py",
                   "tests/test_models.py", "tests/test_ddp.py"]


def _python(code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != "LIGHTNING_NSV_PACKAGE"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env={**environment, **env},
                          capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(os.environ.get("LIGHTNING_NSV_PACKAGE") is not None, reason="runs from the outer test run only")
def test_the_lightning_tests_pass_under_the_other_package():
    pytest.importorskip({"lightning": "lightning.pytorch"}.get(OTHER, OTHER))
    environment = {**os.environ, "LIGHTNING_NSV_PACKAGE": OTHER}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *LIGHTNING_TESTS],
                          cwd=ROOT, env=environment, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and " failed" not in done.stdout


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
