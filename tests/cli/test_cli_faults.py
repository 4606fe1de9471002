"""`lightning-nsv` on bad input: damaged or wrong checkpoints, configs that do not fit their checkpoint, arguments
out of range. Each error names the problem, the file or argument and what to do, and leaves nothing on disk."""
import contextlib
import os
import re
import struct
import zipfile
from pathlib import Path

import pytest
import torch

from lightning_nsv.artifacts import load_support_vectors
from lightning_nsv.cli import main

pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")  # pytest's own argv

CONFIG = Path(__file__).parents[2] / "examples" / "configs" / "digits_mlp.yaml"
DAMAGED = "use another checkpoint of the run"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A checkpoint of the demo config on 200 samples, saved at zero training error."""
    root = tmp_path_factory.mktemp("trained")
    main(["fit", f"--config={CONFIG}", f"--trainer.default_root_dir={root}",
          f"--trainer.logger.init_args.save_dir={root}", "--data.init_args.m=200",
          "--trainer.enable_progress_bar=false", "--threads=1"])
    version = root / "tensorboard" / "version_0"
    return next((version / "checkpoints").glob("*.ckpt")), next((version / "nsv").glob("*.pt"))


def _args(run_dir: Path, *extra: str) -> list[str]:
    return [f"--config={CONFIG}", f"--trainer.default_root_dir={run_dir}",
            f"--trainer.logger.init_args.save_dir={run_dir}", "--data.init_args.m=200",
            "--trainer.enable_progress_bar=false", *extra]


def _analyze(run_dir: Path, ckpt_path, *extra: str) -> None:
    main(["analyze", *_args(run_dir, *extra), f"--ckpt_path={ckpt_path}"])


def _flip_a_weight_byte(source: Path, target: Path) -> None:
    """Copy with one byte of the first tensor's data changed: a valid zip whose member fails its CRC-32."""
    data = bytearray(source.read_bytes())
    with zipfile.ZipFile(source) as archive:
        offset = next(info for info in archive.infolist() if "/data/" in info.filename).header_offset
    name_length, extra_length = struct.unpack("<HH", data[offset + 26: offset + 30])  # local file header
    data[offset + 30 + name_length + extra_length] ^= 0xFF
    target.write_bytes(bytes(data))


def _damaged(kind: str, checkpoint: Path, result: Path, folder: Path) -> Path:
    path = folder / f"{kind}.ckpt"
    if kind == "truncated":
        path.write_bytes(checkpoint.read_bytes()[: checkpoint.stat().st_size // 2])
    elif kind == "random_bytes":
        path.write_bytes(os.urandom(4096))
    elif kind == "empty":
        path.touch()
    elif kind == "directory":
        path.mkdir()
    elif kind == "flipped_weight_byte":
        _flip_a_weight_byte(checkpoint, path)
    elif kind == "result_file":
        path = folder / result.name
        path.write_bytes(result.read_bytes())
    elif kind == "pickled_module":
        torch.save(torch.nn.Linear(2, 1), path)  # loads only with weights_only=False: never suggested
    return path


@pytest.mark.parametrize("kind, match", [
    ("truncated", f"is truncated or corrupt: .* bytes without the zip directory.*{DAMAGED}"),
    ("random_bytes", f"is truncated or corrupt: 4,096 bytes.*{DAMAGED}"),
    ("empty", f"is an empty file \\(0 bytes: an interrupted save or copy\\); {DAMAGED}"),
    ("directory", "is a directory; pass the checkpoint file itself"),
    ("flipped_weight_byte", f"is corrupt: its member .*/data/0 does not match its CRC-32 checksum; {DAMAGED}"),
    ("result_file", "is a result file of NetworkSupportVectors .*artifacts.load_support_vectors"),
    ("pickled_module", f"cannot be loaded as a checkpoint with weights_only=True .*pickled model.*{DAMAGED}"),
])
def test_a_damaged_or_wrong_checkpoint_is_named_before_lightning_loads_it(trained, tmp_path, kind, match):
    path = _damaged(kind, *trained, tmp_path)
    for subcommand in ("analyze", "fit"):  # fit: resuming from it
        with pytest.raises(ValueError, match=f"--ckpt_path={re.escape(str(path))} {match}") as info:
            main([subcommand, *_args(tmp_path / "run"), f"--ckpt_path={path}"])
        assert "weights_only set to False" not in str(info.value) and "arbitrary code" not in str(info.value)
    assert not (tmp_path / "run").exists()


def test_a_missing_checkpoint_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"no checkpoint file at --ckpt_path={tmp_path / 'gone.ckpt'}; pass"):
        _analyze(tmp_path / "run", tmp_path / "gone.ckpt")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("flags, listed, fix", [
    (["--data.init_args.seed=1"], ["data.seed: checkpoint 0, config 1"], "--data.init_args.seed=0"),
    (["--data.init_args.m=150", "--data.init_args.val_fraction=0.3", "--data.init_args.batch_size=10"],
     ["data.m: checkpoint 200, config 150", "data.val_fraction: checkpoint 0.2, config 0.3"],
     "--data.init_args.m=200 --data.init_args.val_fraction=0.2"),
])
def test_analyze_refuses_a_config_with_other_data_than_the_checkpoint(trained, tmp_path, flags, listed, fix):
    checkpoint, _ = trained
    for subcommand in ("analyze", "fit"):
        with pytest.raises(ValueError) as info:
            main([subcommand, *_args(tmp_path / "run", *flags), f"--ckpt_path={checkpoint}"])
        message = str(info.value)
        assert "differs from the one --ckpt_path=" in message and "would see another training set" in message
        assert all(line in message for line in listed), message
        assert "batch_size" not in message  # the loader's arguments do not change the training set
        assert str(checkpoint.parents[1] / "config.yaml") in message and message.endswith(f"or pass {fix}")
    assert not (tmp_path / "run").exists()


def test_analyze_refuses_another_data_or_model_class(trained, tmp_path):
    checkpoint, _ = trained
    with pytest.raises(ValueError, match="was trained with data lightning_nsv.datamodules.DigitsDataModule, the "
                                         "config asks for lightning_nsv.datamodules.QuadrantDataModule; use the config"):
        _analyze(tmp_path / "run", checkpoint, "--data=QuadrantDataModule", "--data.dim=64")
    other = torch.load(checkpoint, weights_only=True)
    other["hyper_parameters"]["_class_path"] = "lightning_nsv.models.ConvFCNet"
    torch.save(other, tmp_path / "conv.ckpt")
    with pytest.raises(ValueError, match="was trained with model lightning_nsv.models.ConvFCNet, the config asks for "
                                         "lightning_nsv.models.LeakyReLUMLP; use the config"):
        _analyze(tmp_path / "run", tmp_path / "conv.ckpt")
    assert not (tmp_path / "run").exists()


def test_analyze_refuses_weights_of_another_model(trained, tmp_path):
    """A checkpoint written outside the command line (no recorded class) whose weights are another model's."""
    checkpoint, _ = trained
    foreign = torch.load(checkpoint, weights_only=True)
    del foreign["hyper_parameters"], foreign["datamodule_hyper_parameters"]
    foreign["state_dict"] = {"layer.weight": torch.zeros(1, 64), "layer.bias": torch.zeros(1)}
    torch.save(foreign, tmp_path / "foreign.ckpt")
    with pytest.raises(ValueError, match=r"the weights in --ckpt_path=.*foreign.ckpt do not fit the LeakyReLUMLP the "
                                         r"config builds \(missing net.1.bias.*unexpected layer.bias, layer.weight\)"):
        _analyze(tmp_path / "run", tmp_path / "foreign.ckpt", "--trainer.logger=false")
    assert not list(tmp_path.rglob("*.pt"))


def test_analyze_names_other_model_arguments_and_uses_the_checkpoints(trained, tmp_path):
    checkpoint, result = trained
    with pytest.warns(UserWarning, match=r"model arguments differ from the checkpoint's; the network is rebuilt from "
                                         r"the checkpoint's:\n  model.widths: checkpoint \[64, 64\], config \[16\]"):
        _analyze(tmp_path, checkpoint, "--model.init_args.widths=[16]")
    analysed = load_support_vectors(next(tmp_path.rglob("support_vectors_epoch*.pt")))
    assert torch.equal(analysed.support, load_support_vectors(result).support)


def test_the_checkpoint_records_the_training_indices_and_analyze_compares_them(trained, tmp_path):
    """Arguments equal, data not: the recorded training indices catch it (a `root` moved to other data)."""
    checkpoint, result = trained
    recorded = torch.load(checkpoint, weights_only=True)["DigitsDataModule"]["train_indices"]
    assert torch.equal(recorded, load_support_vectors(result).train_indices)
    shifted = torch.load(checkpoint, weights_only=True)
    shifted["DigitsDataModule"]["train_indices"] = recorded + 1
    torch.save(shifted, tmp_path / "shifted.ckpt")
    with pytest.raises(ValueError, match="DigitsDataModule: the training subset is not the one the checkpoint records "
                                         r"\(200 samples here, 200 there; the first difference is at position 0\)"):
        _analyze(tmp_path, tmp_path / "shifted.ckpt")
    assert not list(tmp_path.rglob("*.pt"))


@pytest.mark.parametrize("flag, match", [
    ("--data.init_args.m=0", "^`m` must be a positive integer or None"),
    ("--data.init_args.val_fraction=1.5", r"^`val_fraction` must be in \[0, 1\), got 1.5"),
    ("--data.init_args.seed=-1", "^`seed` must be a non-negative integer, got -1"),
    ("--trainer.max_epochs=0", "^--trainer.max_epochs=0 trains nothing; pass a positive number, or -1 for no limit"),
    ("--trainer.max_steps=0", "^--trainer.max_steps=0 trains nothing"),
])
def test_fit_arguments_out_of_range_are_named(tmp_path, flag, match):
    with pytest.raises(ValueError, match=match):
        main(["fit", *_args(tmp_path / "run", flag)])
    assert not (tmp_path / "run").exists()


def test_analyze_without_a_checkpoint_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(ValueError, match="needs --ckpt_path pointing at a trained checkpoint"):
        main(["analyze", *_args(tmp_path / "run")])
    assert not (tmp_path / "run").exists()


def test_a_missing_or_unreadable_config_is_named(tmp_path, capsys):
    (tmp_path / "binary.yaml").write_bytes(b"\x00\x01model: [\n")
    for config, said in ((tmp_path / "absent.yaml", "File does not exist"),
                         (tmp_path / "binary.yaml", "Problems parsing config")):
        with pytest.raises(SystemExit):
            main(["fit", f"--config={config}"])
        assert said in capsys.readouterr().err


def test_data_read_from_another_root_is_named_and_checked_by_its_training_indices(tmp_path):
    """A moved copy of the data is analysed (with a warning); other data under the new root is refused."""
    import shutil

    from tests.fake_datasets import write_fake_mnist

    write_fake_mnist(tmp_path / "data", n_train=40, n_test=10)
    args = ["--model=LeakyReLUMLP", "--model.in_features=784", "--model.widths=[8]", "--data=BinaryMNISTDataModule",
            "--trainer.callbacks+=NetworkSupportVectors", "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false", "--trainer.log_every_n_steps=1", "--seed_everything=0"]
    with pytest.warns(UserWarning, match="zero training error was not reached within max_epochs=2"):  # random labels
        main(["fit", *args, f"--data.root={tmp_path / 'data'}", "--trainer.max_epochs=2",
              f"--trainer.default_root_dir={tmp_path / 'fit'}"])
    checkpoint = next((tmp_path / "fit").rglob("*.ckpt"))
    shutil.copytree(tmp_path / "data", tmp_path / "moved")
    write_fake_mnist(tmp_path / "other", n_train=45, n_test=10)
    for root in ("moved", "other"):
        moved = rf"the data is read from another place than in training:\n  data.root: checkpoint " \
            rf"{re.escape(str(tmp_path / 'data'))}, config .*{root}"
        analysed = contextlib.nullcontext() if root == "other" else \
            pytest.warns(UserWarning, match=r"the checkpoint's network misclassifies \d+ of 40 training samples")
        with pytest.warns(UserWarning, match=moved), analysed:
            try:
                main(["analyze", *args, f"--data.root={tmp_path / root}", f"--ckpt_path={checkpoint}",
                      f"--trainer.default_root_dir={tmp_path / root}_analysis"])
            except ValueError as error:
                assert root == "other" and "the training subset is not the one the checkpoint records (45 samples " \
                    "here, 40 there" in str(error)
            else:
                assert root == "moved"
    assert not list((tmp_path / "other_analysis").rglob("*.pt"))


def test_analyze_of_a_checkpoint_of_another_epoch_than_the_runs_analysis_says_so(tmp_path):
    """Validation every 4 epochs: the fit's analysis runs at its zero-error epoch, the only checkpoint is of the last
    validation before it. analyze analyses that checkpoint's weights and says that they are not the analysed ones."""
    common = [*_args(tmp_path, "--threads=1"), "--data.init_args.m=300", "--trainer.check_val_every_n_epoch=4"]
    main(["fit", *common])
    version = tmp_path / "tensorboard" / "version_0"
    (checkpoint,), (result,) = (version / "checkpoints").glob("*.ckpt"), (version / "nsv").glob("*.pt")
    held, analysed = torch.load(checkpoint, weights_only=True), load_support_vectors(result)
    assert (held["epoch"], held["global_step"]) != (analysed.epoch, analysed.global_step), "the case to check"
    with pytest.warns(UserWarning, match=(
            rf"--ckpt_path={re.escape(str(checkpoint))} holds the weights of epoch {held['epoch']} \(step "
            rf"{held['global_step']}\), but the run's support-vector analysis was of other weights: "
            rf"{re.escape(str(result))} \(epoch {analysed.epoch}, step {analysed.global_step}\)\. This analysis "
            rf"describes the network of epoch {held['epoch']}, not the one analysed during the fit.*"
            rf"`lightning_nsv.artifacts.reproduce\('{re.escape(str(result))}'\)` recomputes that analysis")):
        main(["analyze", *common, f"--ckpt_path={checkpoint}"])
