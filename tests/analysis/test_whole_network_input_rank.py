"""Training and validation inputs of a shape the module does not take are refused by name before any tracing,
with the per-sample shape given and the one the module's first layer takes."""
import pytest
import torch
from torch import nn

import lightning_nsv.analysis.whole_network as whole_network
from lightning_nsv.analysis import whole_network_support_vectors
from lightning_nsv.analysis.whole_network import serve_whole_network_columns
from lightning_nsv.analysis.whole_network_checks import check_input_shape

RESHAPE = r"; pass the inputs in the module's input shape, \(n, \*input_shape\)"


def cnn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(18, 1))


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))


class CustomCnn(nn.Module):  # not an nn.Sequential: its first registered layer is not the first it runs
    def __init__(self):
        super().__init__()
        self.head, self.conv = nn.Linear(18, 1), nn.Conv2d(1, 2, 3)

    def forward(self, x):
        return self.head(nn.functional.max_pool2d(self.conv(x).relu(), 2).flatten(1))


@pytest.fixture
def no_trace(monkeypatch):
    def trace(*args, **kwargs):
        raise AssertionError("traced before the inputs were checked")

    monkeypatch.setattr(whole_network, "trace", trace)


def test_flat_images_for_a_cnn_are_refused_before_tracing(no_trace):
    x, y = torch.randn(20, 1, 8, 8), torch.randint(0, 2, (20,))
    with pytest.raises(ValueError, match=r"x_train of shape \(20, 64\): inputs of shape \(64,\) per sample, but the "
                                         r"module's first layer \(Conv2d\) takes \(1, H, W\)" + RESHAPE):
        whole_network_support_vectors(cnn(), x.reshape(20, -1), y)
    with pytest.raises(ValueError, match=r"x_train of shape \(20, 64\)"):
        serve_whole_network_columns(cnn(), x.reshape(20, -1))


def test_inputs_without_a_sample_axis_are_refused(no_trace):
    with pytest.raises(ValueError, match=r"x_train of shape \(4,\): the inputs need a batch axis and a per-sample "
                                         r"shape" + RESHAPE):
        whole_network_support_vectors(mlp(), torch.randn(4), torch.randint(0, 2, (4,)))


def test_features_that_the_first_linear_does_not_take_are_refused(no_trace):
    with pytest.raises(ValueError, match=r"x_train of shape \(6, 3\): inputs of shape \(3,\) per sample, but the "
                                         r"module's first layer \(Linear\) takes \(\.\.\., 4\)"):
        whole_network_support_vectors(mlp(), torch.randn(6, 3), torch.randint(0, 2, (6,)))


@pytest.mark.parametrize("x", [torch.randn(6, 64), torch.randn(6, 8, 8)], ids=["flat", "no channel axis"])
def test_a_module_that_does_not_run_on_the_inputs_names_its_error(no_trace, x):
    with pytest.raises(ValueError, match=rf"x_train of shape \(6, {x.shape[1]}.*\): CustomCnn does not run on inputs "
                                         r"of shape \(.*\) per sample \(RuntimeError: .*\)" + RESHAPE):
        whole_network_support_vectors(CustomCnn(), x, torch.randint(0, 2, (6,)))


def test_a_module_that_mixes_the_samples_is_refused(no_trace):
    module = nn.Sequential(nn.Flatten(0), nn.Linear(8, 1))  # (2, 4) → (8,) → one output
    with pytest.raises(ValueError, match=r"x_train of shape \(6, 4\): Sequential returns shape \(1,\) for 2 samples of "
                                         r"shape \(4,\), not one output per sample"):
        whole_network_support_vectors(module, torch.randn(6, 4), torch.randint(0, 2, (6,)))


def test_validation_inputs_of_another_shape_are_refused_before_tracing(no_trace):
    x, y = torch.randn(6, 1, 8, 8), torch.randint(0, 2, (6,))
    with pytest.raises(ValueError, match=r"x_val of shape \(3, 64\): inputs of shape \(64,\) per sample, x_train's "
                                         r"are \(1, 8, 8\)"):
        whole_network_support_vectors(cnn(), x, y, x[:3].reshape(3, -1))


@pytest.mark.parametrize("module, x", [
    (cnn(), torch.randn(5, 1, 8, 8)), (CustomCnn(), torch.randn(5, 1, 8, 8)), (mlp(), torch.randn(5, 4)),
    (nn.Sequential(nn.Flatten(), nn.Linear(4, 1)), torch.randn(5, 4)),
    (nn.Sequential(nn.Flatten(), nn.Linear(4, 1)), torch.randn(5, 2, 2)),
    (nn.Sequential(nn.Linear(4, 2), nn.Flatten(), nn.Linear(6, 1)), torch.randn(5, 3, 4)),
    (nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1)), torch.randn(1, 4)),
], ids=["cnn", "custom cnn", "mlp", "flatten flat", "flatten images", "linear on rows", "batchnorm, one sample"])
def test_inputs_the_module_takes_pass_and_its_mode_is_kept(module, x):
    module.train()
    check_input_shape(module, x, x[:2])
    assert all(m.training for m in module.modules())
