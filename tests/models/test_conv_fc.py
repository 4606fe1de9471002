"""ConvFCNet: shapes, the head the callback reads, its path kernel against brute force, and the callback end to end."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from lightning_nsv.callbacks import NetworkSupportVectors
from lightning_nsv.compat import pl, submodule
from lightning_nsv.datamodules import DigitsDataModule
from lightning_nsv.extract import find_path_part
from lightning_nsv.kernel import forward_with_slopes, path_kernel
from lightning_nsv.models.conv_fc import ConvFCNet
from tests.reference import materialise_phi, materialise_wbar

CONFIGS = Path(__file__).resolve().parents[2] / "examples" / "configs"


@pytest.mark.parametrize("channels, size, features", [(1, 8, 256), (1, 28, 3136), (3, 32, 4096), (1, (8, 12), 384)])
def test_shapes_on_digits_mnist_cifar(channels, size, features):
    model = ConvFCNet(in_channels=channels, image_size=size, fc_depth=2)
    h, w = (size, size) if isinstance(size, int) else size
    assert model.embedding_features == features
    assert model(torch.zeros(3, channels, h, w)).shape == (3,)


def test_find_path_part_reads_the_head_after_the_trunk():
    torch.manual_seed(0)
    model = ConvFCNet(in_channels=1, image_size=8, fc_depth=3, fc_width=5, conv_channels=4, beta=0.2)
    part = find_path_part(model)
    assert [layer.out_features for layer in part.linears] == [5, 5, 5, 1]
    assert part.betas == (0.2, 0.2, 0.2) and part.gammas == (1.0, 1.0, 1.0)
    assert part.has_bias and part.num_hidden_units == 15
    convs = [m for m in part.embedding.modules() if isinstance(m, nn.Conv2d)]
    pools = [m for m in part.embedding.modules() if isinstance(m, nn.MaxPool2d)]
    assert len(convs) == 3 and len(pools) == 2 and all(c.kernel_size == (3, 3) and c.stride == (1, 1) for c in convs)
    x = torch.randn(6, 1, 8, 8)
    embedded = part.embed(x)
    assert embedded.shape == (6, model.embedding_features)
    output, _ = forward_with_slopes(part.path_network(), embedded)
    torch.testing.assert_close(output, model(x).double(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("beta", [0.0, 0.1, -1.0])
def test_head_path_kernel_equals_brute_force_on_trunk_output(bias, beta):
    torch.manual_seed(1)
    model = ConvFCNet(in_channels=1, image_size=8, fc_depth=2, fc_width=3, conv_channels=2, beta=beta, bias=bias)
    part = find_path_part(model)
    net = part.path_network()
    with torch.no_grad():
        embedded = part.embed(torch.randn(5, 1, 8, 8)).double()  # 2 channels × 2 × 2 = 8 path-space inputs
    phi = materialise_phi(net, embedded)
    outputs, slopes = forward_with_slopes(net, embedded)
    torch.testing.assert_close(path_kernel(embedded, slopes, bias=bias), phi @ phi.T, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(phi @ materialise_wbar(net), outputs, rtol=1e-10, atol=1e-12)


def test_invalid_sizes_are_rejected():
    with pytest.raises(ValueError, match="leaves no pixels"):
        ConvFCNet(image_size=8, padding=0)
    with pytest.raises(ValueError, match="sizes must be positive"):
        ConvFCNet(fc_width=0)


def test_hyperparameters_rebuild_the_model_and_multiclass_trains():
    model = ConvFCNet(in_channels=3, image_size=32, fc_depth=1, conv_channels=4, num_classes=10, lr=0.1)
    assert "in_features" not in model.hparams and "widths" not in model.hparams
    again = ConvFCNet(**model.hparams)
    assert [p.shape for p in again.parameters()] == [p.shape for p in model.parameters()]
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 3, 9, 1])
    assert model(x).shape == (4, 10)
    model.log = lambda *args, **kwargs: None
    loss = model.training_step((x, y), 0)
    torch.testing.assert_close(loss, nn.functional.cross_entropy(model(x), y))


@pytest.mark.parametrize("scope, gates", [("head", 32), ("auto", 8 * 64 + 8 * 16 + 8 * 16 + 8 * 4 + 8 * 4 + 2 * 16)])
def test_callback_runs_on_conv_fc_end_to_end(tmp_path, scope, gates):
    """``scope="head"``: the paper's protocol (FC head after the conv trunk as a fixed embedding); by default the whole
    network, whose compression bound counts every gate (conv, FC and max-pool selections)."""
    pl.seed_everything(0, verbose=False)
    torch.set_num_threads(1)
    datamodule = DigitsDataModule(m=40, batch_size=10, seed=0)
    model = ConvFCNet(in_channels=1, image_size=8, fc_depth=2, fc_width=16, conv_channels=8, optimizer="adam",
                      lr=0.005)
    callback = NetworkSupportVectors(save_dir=str(tmp_path / "nsv"), scope=scope)
    trainer = pl.Trainer(max_epochs=40, callbacks=[callback], logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0,
                         limit_val_batches=0)
    trainer.fit(model, datamodule=datamodule)
    assert callback.analysis is not None, "the tiny CNN should reach zero training error"
    analysis = callback.analysis
    assert analysis.m == 40 and 0 < analysis.n_support <= 40
    assert analysis.n_hidden == gates  # conv gates, max-pool selections, conv gates, …, FC gates; or the FC gates
    report = json.loads(next((tmp_path / "nsv").glob("*.json")).read_text())["report"]
    assert report.startswith("head only: 3 Linear layers of ConvFCNet.net" if scope == "head" else
                             "path kernel of the whole network: 6 maps, 5 gate layers, 2 max-pools, 864 gates")
    assert analysis.svm.kkt_residual < 1e-6 and analysis.svm.n_margin_violations == 0
    assert analysis.margin_ratio <= 1 + 1e-9
    assert analysis.val_agreement is not None and analysis.val_errors_both <= analysis.val_errors_network
    assert callback.metrics["n_support"] == analysis.n_support
    assert list((tmp_path / "nsv").glob("*.json"))


def test_digits_cnn_config_builds_model_and_data():
    LightningCLI = submodule("cli").LightningCLI

    cli = LightningCLI(pl.LightningModule, pl.LightningDataModule, subclass_mode_model=True,
                       subclass_mode_data=True, run=False, save_config_callback=None,
                       args=["--config", str(CONFIGS / "digits_cnn.yaml"), "--trainer.logger", "false"])
    assert isinstance(cli.model, ConvFCNet) and isinstance(cli.datamodule, DigitsDataModule)
    nsv = [c for c in cli.trainer.callbacks if isinstance(c, NetworkSupportVectors)]
    assert len(nsv) == 1 and nsv[0].scope == "head"  # the paper's protocol, kept explicitly


def test_the_paper_cnn_configs_keep_the_head_scope():
    import yaml

    for name in ("digits_cnn.yaml", "cifar_frogs_ships_cnn.yaml"):
        config = yaml.safe_load((CONFIGS / name).read_text())
        assert config["trainer"]["callbacks"][0]["init_args"]["scope"] == "head", name
