import logging
import re
from pathlib import Path

import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_nsv.artifacts import load_support_vectors
from lightning_nsv.cli import main
from lightning_nsv.compat import PACKAGE
from tests.timeouts import timeout_for

CONFIG = Path(__file__).parents[2] / "examples" / "configs" / "digits_mlp.yaml"


def test_demo_config_reaches_zero_error_and_logs_the_analysis(tmp_path, caplog, capsys):
    report_logger = logging.getLogger(f"{PACKAGE}.utilities.rank_zero")  # where rank_zero_info writes
    report_logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger=report_logger.name):
            main([
                "fit", "--config", str(CONFIG), f"--trainer.default_root_dir={tmp_path}",
                f"--trainer.logger.init_args.save_dir={tmp_path}", "--data.init_args.m=400",
            ])
    finally:
        report_logger.removeHandler(caplog.handler)
    version = next((tmp_path / "tensorboard").glob("version_*"))
    tags = EventAccumulator(str(version)).Reload().Tags()["scalars"]
    assert {"nsv/n_support", "nsv/margin_ratio", "nsv/cosine_wbar_v", "nsv/kkt_residual"} <= set(tags)
    printed = capsys.readouterr().out  # the progress bar is on: the report goes through it, on lines of its own
    assert "\nnetwork support vectors:" in printed and "of m=400" in printed
    assert "computing the path kernel columns of candidate support vectors for m = 400" in printed
    assert list((version / "nsv").glob("support_vectors_epoch*.pt"))
    config = yaml.safe_load((version / "config.yaml").read_text())
    assert config["model"]["class_path"] == "lightning_nsv.models.LeakyReLUMLP"


def test_skip_network_config_trains_with_the_valley_callbacks(tmp_path):
    config = yaml.safe_load(CONFIG.with_name("skip_digits.yaml").read_text())
    config["trainer"].update(max_epochs=2, default_root_dir=str(tmp_path))
    config["trainer"]["logger"]["init_args"]["save_dir"] = str(tmp_path)
    config["data"]["init_args"]["m"] = config["model"]["init_args"]["num_skip_units"] = 60
    for callback in config["trainer"]["callbacks"]:
        callback["init_args"]["every_n_epochs"] = 1
    config["trainer"]["callbacks"][1]["init_args"]["surface_points"] = 3
    small = tmp_path / "skip.yaml"
    small.write_text(yaml.safe_dump(config))
    main(["fit", "--config", str(small)])
    version = next((tmp_path / "tensorboard").glob("version_*"))
    tags = set(EventAccumulator(str(version)).Reload().Tags()["scalars"])
    expected = {"psi/rank", "psi/full_rank", "psi/num_samples", "psi/num_units", "valley/lemma21_certified",
                "valley/escape_applies", "valley/assumption31_m_ge_n"}
    assert expected <= tags, sorted(tags)
    values = EventAccumulator(str(version)).Reload()
    assert [e.value for e in values.Scalars("psi/num_samples")][-1] == 60
    # the same monitors once more on the trained checkpoint, without training
    checkpoint = next((version / "checkpoints").glob("*.ckpt"))
    main(["analyze", "--config", str(small), f"--ckpt_path={checkpoint}"])
    analysed = tmp_path / "tensorboard" / "version_0-analysis-epoch1"
    assert {"psi/rank", "valley/lemma21_certified"} <= set(EventAccumulator(str(analysed)).Reload().Tags()["scalars"])
    assert [e.value for e in values.Scalars("psi/num_units")][-1] == 64 + 60


def test_short_class_names_resolve_in_a_fresh_interpreter(tmp_path):
    import subprocess
    import sys

    args = ["fit", "--model=LeakyReLUMLP", "--model.widths=[8]", "--data=DigitsDataModule", "--data.m=50",
            "--trainer.callbacks+=NetworkSupportVectors", "--trainer.fast_dev_run=true",
            f"--trainer.default_root_dir={tmp_path}", "--print_config"]
    done = subprocess.run([sys.executable, "-c", f"from lightning_nsv.cli import main; main({args!r})"],
                          capture_output=True, text=True, timeout=timeout_for(6), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    config = yaml.safe_load(done.stdout)
    assert config["model"]["class_path"] == "lightning_nsv.models.LeakyReLUMLP"
    assert config["data"]["class_path"] .endswith("DigitsDataModule")
    assert config["trainer"]["callbacks"][0]["class_path"].endswith("NetworkSupportVectors")


def test_distribution_declares_the_console_script_and_dependencies():
    from importlib.metadata import distribution

    dist = distribution("lightning-nsv")
    scripts = {ep.name: ep.value for ep in dist.entry_points if ep.group == "console_scripts"}
    assert scripts["lightning-nsv"] == "lightning_nsv.cli:main"
    required = {r.split(">")[0].split("[")[0].strip().lower() for r in dist.requires if "extra ==" not in r}
    assert {"pytorch-lightning", "torch", "torchvision", "scikit-learn", "torchmetrics", "tensorboard",
            "matplotlib"} <= required


def _printed_paths(printed: str) -> tuple[Path, Path]:
    """The log folder and the result file that `lightning-nsv` prints at its end."""
    logs = re.search(r"^logs: (.+)$", printed, flags=re.M).group(1)
    return Path(logs), Path(re.search(r"^results: (\S+\.pt) \(and ", printed, flags=re.M).group(1))


def test_analyze_a_saved_checkpoint_without_training(tmp_path, capsys, recwarn):
    common = [f"--config={CONFIG}", f"--trainer.default_root_dir={tmp_path}",
              f"--trainer.logger.init_args.save_dir={tmp_path}", "--data.init_args.m=300",
              "--trainer.enable_progress_bar=false"]
    main(["fit", *common, "--threads=1"])
    fitted = tmp_path / "tensorboard" / "version_0"
    assert _printed_paths(capsys.readouterr().out) == (fitted, next((fitted / "nsv").glob("*.pt")))
    assert "_instantiator" not in (fitted / "hparams.yaml").read_text()
    checkpoint = next((fitted / "checkpoints").glob("*.ckpt"))
    recwarn.clear()
    main(["analyze", *common, f"--ckpt_path={checkpoint}"])
    lightning_said = [str(w.message) for w in recwarn if "dirpath" in str(w.message) or "Be aware" in str(w.message)]
    assert not lightning_said  # the checkpoint callback restores its state silently, saves nothing
    assert not [w for w in recwarn if "other weights" in str(w.message)]  # the checkpoint of the analysed epoch
    epoch = torch.load(checkpoint, weights_only=True)["epoch"]
    run = f"version_0-analysis-epoch{epoch}"  # a run of its own, named after the checkpoint's
    assert sorted(p.name for p in (tmp_path / "tensorboard").iterdir()) == ["version_0", run]
    assert _printed_paths(capsys.readouterr().out) == (
        tmp_path / "tensorboard" / run, tmp_path / "tensorboard" / run / "nsv" / f"support_vectors_epoch{epoch}.pt")
    trained, analysed = (load_support_vectors(next((tmp_path / "tensorboard" / v / "nsv").glob("*.pt")))
                         for v in ("version_0", run))
    assert trained.epoch == analysed.epoch
    assert torch.equal(trained.support, analysed.support)
    torch.testing.assert_close(trained.alpha, analysed.alpha, rtol=1e-9, atol=0)  # other thread counts: rounding
    fit_events, analyze_events = (EventAccumulator(str(tmp_path / "tensorboard" / v)).Reload()
                                  for v in ("version_0", run))
    said = analyze_events.Tensors("re-analysis/text_summary")
    assert [e.step for e in said] == [e.step for e in fit_events.Tensors("nsv/report/text_summary")]
    assert said[0].tensor_proto.string_val[0].decode() == \
        f"re-analysis of checkpoint `{checkpoint}` (epoch {epoch}, step {said[0].step}), without training"
    assert "re-analysis/text_summary" not in fit_events.Tags()["tensors"]
    assert "nsv/n_support" in analyze_events.Tags()["scalars"]
    # at the fit's steps; a checkpoint saved after the analysis is not compared with itself
    assert [e.step for e in analyze_events.Scalars("nsv/n_support")] == \
        [e.step for e in fit_events.Scalars("nsv/n_support")]
    assert [e.step for e in analyze_events.Tensors("nsv/report/text_summary")] == \
        [e.step for e in fit_events.Tensors("nsv/report/text_summary")]
    assert "nsv/support_jaccard_previous" not in analyze_events.Tags()["scalars"]
    assert "nsv/max_margin_approach" not in analyze_events.Tags()["images"]
    main(["analyze", *common, f"--ckpt_path={checkpoint}"])  # once more: a second run beside the first
    assert (tmp_path / "tensorboard" / f"{run}_2" / "nsv" / f"support_vectors_epoch{epoch}.pt").is_file()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_analyze_on_a_gpu_gives_the_cpu_analysis(tmp_path):
    """Trained on the CPU, analysed again on a GPU (zero-error pass, kernel columns and solver there)."""
    common = [f"--config={CONFIG}", f"--trainer.default_root_dir={tmp_path}",
              f"--trainer.logger.init_args.save_dir={tmp_path}", "--data.init_args.m=300",
              "--trainer.enable_progress_bar=false"]
    main(["fit", *common])
    checkpoint = next((tmp_path / "tensorboard" / "version_0" / "checkpoints").glob("*.ckpt"))
    main(["analyze", *common, "--trainer.accelerator=gpu", f"--ckpt_path={checkpoint}"])
    trained, analysed = (load_support_vectors(next((tmp_path / "tensorboard").glob(f"{v}/nsv/*.pt")))
                         for v in ("version_0", "version_0-analysis-*"))
    assert torch.equal(trained.support, analysed.support)
    torch.testing.assert_close(trained.alpha, analysed.alpha, rtol=1e-9, atol=0)


def test_analyze_needs_a_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="needs --ckpt_path"):
        main(["analyze", f"--config={CONFIG}", f"--trainer.default_root_dir={tmp_path}",
              f"--trainer.logger.init_args.save_dir={tmp_path}", "--data.init_args.m=50"])
    with pytest.raises(FileNotFoundError, match="no checkpoint file at --ckpt_path="):
        main(["analyze", f"--config={CONFIG}", f"--trainer.default_root_dir={tmp_path}",
              f"--trainer.logger.init_args.save_dir={tmp_path}", "--data.init_args.m=50",
              f"--ckpt_path={tmp_path / 'missing.ckpt'}"])


def test_the_multiclass_demo_config_runs_the_multiclass_analysis(tmp_path):
    config = CONFIG.with_name("digits_mlp_multiclass.yaml")
    main(["fit", f"--config={config}", f"--trainer.default_root_dir={tmp_path}",
          f"--trainer.logger.init_args.save_dir={tmp_path}", "--data.init_args.m=300",
          "--trainer.enable_progress_bar=false"])
    version = next((tmp_path / "tensorboard").glob("version_*"))
    tags = set(EventAccumulator(str(version)).Reload().Tags()["scalars"])
    assert {"nsv/n_support", "nsv/n_support_pairs", "nsv/n_support_class0", "nsv/n_support_class9",
            "nsv/margin_ratio", "nsv/val_agreement"} <= tags
    artifact = load_support_vectors(next((version / "nsv").glob("*.pt")))
    assert artifact.alpha.shape == (300, 10) and artifact.network.num_outputs == 10


def test_analysis_runs_are_named_after_their_checkpoint(tmp_path):
    from jsonargparse import Namespace

    from lightning_nsv.cli import _name_analysis_run
    from lightning_nsv.compat import PACKAGE

    def logger(cls: str, **init_args) -> Namespace:
        return Namespace(class_path=f"{PACKAGE}.loggers.{cls}", init_args=Namespace(**init_args))

    ckpt = tmp_path / "tb" / "version_3" / "checkpoints" / "epoch=7-step=70.ckpt"
    (tmp_path / "tb" / "version_3-analysis-epoch7").mkdir(parents=True)  # analysed once already
    config = Namespace(trainer=Namespace(default_root_dir=str(tmp_path), logger=[
        logger("TensorBoardLogger", save_dir=str(tmp_path), name="tb", version=None),
        logger("CSVLogger", save_dir=str(tmp_path / "csv"), name="", version=None),
        logger("TensorBoardLogger", save_dir=str(tmp_path), name="tb", version="mine"),
        logger("MLFlowLogger", run_id=None)]))
    _name_analysis_run(config, ckpt, 7)
    versions = [lg.init_args.get("version") for lg in config.trainer.logger]
    assert versions == ["version_3-analysis-epoch7_2", "version_3-analysis-epoch7", "mine", None]
    default = Namespace(trainer=Namespace(default_root_dir=str(tmp_path), logger=None))
    _name_analysis_run(default, tmp_path / "elsewhere" / "last.ckpt", 2)  # Lightning's default logger, made explicit
    assert default.trainer.logger.class_path == f"{PACKAGE}.loggers.TensorBoardLogger"
    assert default.trainer.logger.init_args.version == "last-analysis-epoch2"
