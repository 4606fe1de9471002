"""The benchmarks' data on real-format files: MNIST's 60,000 training images are enough for m = 60,000."""
from __future__ import annotations

import importlib.util
from argparse import Namespace
from pathlib import Path

import torch

from tests.fake_datasets import write_fake_mnist

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _nsv_scale():
    spec = importlib.util.spec_from_file_location("nsv_scale", BENCHMARKS / "nsv_scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_nsv_scale_takes_validation_from_the_test_split(tmp_path):
    written = write_fake_mnist(tmp_path, n_train=60, n_test=20)
    args = Namespace(mnist_root=str(tmp_path), seed=0, val_size=10)
    x, y, x_val, y_val = _nsv_scale().load_data(args, 60)  # the whole training split, as --large-m 60000 asks
    assert x.shape == (60, 1, 28, 28) and x_val.shape == (10, 1, 28, 28)
    test_images = torch.from_numpy(written["test"][0][:10]).to(torch.float32) / 255
    torch.testing.assert_close(x_val[:, 0], test_images)
    assert torch.equal(y_val, (torch.from_numpy(written["test"][1][:10]).long() >= 5).long())


def test_nsv_scale_stand_in_holds_out_the_last_samples():
    module = _nsv_scale()
    x, y, x_val, y_val = module.load_data(Namespace(mnist_root=None, seed=0, val_size=5), 30)
    x_all, y_all = module.digits_standin(35, 0)
    assert torch.equal(x, x_all[:30]) and torch.equal(x_val, x_all[30:]) and torch.equal(y_val, y_all[30:])
