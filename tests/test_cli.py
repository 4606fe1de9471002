import logging
from pathlib import Path

import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_nsv.cli import main

CONFIG = Path(__file__).parents[1] / "examples" / "configs" / "digits_mlp.yaml"


def test_demo_config_reaches_zero_error_and_logs_the_analysis(tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        main([
            "fit", "--config", str(CONFIG), f"--trainer.default_root_dir={tmp_path}",
            f"--trainer.logger.init_args.save_dir={tmp_path}", "--data.init_args.m=400",
        ])
    version = next((tmp_path / "tensorboard").glob("version_*"))
    tags = EventAccumulator(str(version)).Reload().Tags()["scalars"]
    assert {"nsv/n_support", "nsv/margin_ratio", "nsv/cosine_wbar_v", "nsv/kkt_residual"} <= set(tags)
    assert "network support vectors:" in caplog.text and "of m=400" in caplog.text
    assert list((version / "nsv").glob("support_vectors_epoch*.pt"))
    config = yaml.safe_load((version / "config.yaml").read_text())
    assert config["model"]["class_path"] == "lightning_nsv.models.LeakyReLUMLP"
