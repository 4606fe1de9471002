"""`lightning-nsv analyze` on a checkpoint written by a plain `Trainer.fit` (its hyperparameters name no class)."""
import warnings

import pytest

from lightning_nsv.cli import main
from lightning_nsv.compat import pl
from lightning_nsv.datamodules import DigitsDataModule
from lightning_nsv.models import LeakyReLUMLP


@pytest.fixture
def plain_checkpoint(tmp_path):
    """A checkpoint of a LeakyReLUMLP of non-default widths, fitted in Python (no `_class_path` recorded)."""
    pl.seed_everything(0)
    trainer = pl.Trainer(max_epochs=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp_path, accelerator="cpu")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(workers|log_every_n_steps|LeafSpec).*")
        trainer.fit(LeakyReLUMLP(widths=[8, 8]), datamodule=DigitsDataModule(m=60, batch_size=30))
    path = tmp_path / "plain.ckpt"
    trainer.save_checkpoint(path)
    return path


def test_analyze_reads_a_plain_checkpoints_hyperparameters_into_the_named_model(tmp_path, plain_checkpoint, capsys):
    """The widths come from the checkpoint (the defaults' weights would not fit it); one epoch is no zero error."""
    main(["analyze", "--model=LeakyReLUMLP", "--data=DigitsDataModule", "--data.m=60", "--threads=1",
          f"--trainer.default_root_dir={tmp_path}", "--trainer.enable_progress_bar=false",
          f"--ckpt_path={plain_checkpoint}"])
    assert "logs:" in capsys.readouterr().out


def test_analyze_asks_for_the_model_of_a_plain_checkpoint(tmp_path, plain_checkpoint, capsys):
    with pytest.raises(SystemExit):
        main(["analyze", "--data=DigitsDataModule", "--data.m=60", f"--trainer.default_root_dir={tmp_path}",
              f"--ckpt_path={plain_checkpoint}"])
    assert "the following arguments are required: analyze.model" in capsys.readouterr().err
