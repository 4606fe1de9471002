"""The cost of a whole-network analysis said before it is paid: the estimate, its bound, the budget, the bar and the
callback's check before training (issue 40 item 4)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from lightning_nsv.analysis import TimeBudgetError, whole_network_cost, whole_network_support_vectors
from lightning_nsv.analysis import whole_network_budget as cost_module
from lightning_nsv.analysis.whole_network_budget import CostEstimate, PairBar, kernel_pairs
from lightning_nsv.models.residual import SmallResNet
from tests.kernel.test_pair_network import inputs, randomise_bn


def two_class_resnet(n: int, classes: int = 1, seed: int = 0):
    """A SmallResNet on random 8×8 inputs, its last bias shifted so that its own labels hold every class."""
    torch.manual_seed(seed)
    net = randomise_bn(SmallResNet(2, classes, 3, (1, 1)), seed).double()
    x = inputs((2, 8, 8), n=n, seed=seed)
    with torch.no_grad():
        out = net(x.double())
        if classes == 1:
            middle = out.sort().values[n // 2 - 1:n // 2 + 1]
            net.fc.bias -= middle.mean()  # between two outputs: none on the boundary
            y = (net(x.double()) > 0).long()
        else:
            net.fc.bias -= out.mean(0)
            y = net(x.double()).argmax(1)
    return net, x, y


@pytest.fixture
def always_said(monkeypatch):
    """Every analysis counts as long enough to say its estimate and show its bar."""
    monkeypatch.setattr(cost_module, "SAY_ABOVE_SECONDS", -1.0)


def test_the_estimate_is_said_and_bounds_the_pairs_run(always_said):
    net, x, y = two_class_resnet(40)
    said, counted = [], []

    class Counting(PairBar):
        def __init__(self, total, enabled):
            super().__init__(total, enabled=False)
            self.total, self.shown = total, enabled

        def __call__(self, pairs):
            counted.append(pairs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cost_module, "PairBar", Counting)
        analysis = whole_network_support_vectors(net, x[:30], y[:30], x[30:], y[30:], say=said.append)
    estimate = analysis.estimate
    assert len(said) == 1 and said[0].startswith("lightning_nsv: the whole-network analysis of m = 30: up to ")
    assert f"{estimate.seconds_per_pair * 1e6:.2f} µs a pair" in said[0] and estimate.engine in said[0]
    assert estimate.m == 30 and estimate.n_val == 10
    assert estimate.pairs == kernel_pairs(30, 30, 16) + 10 * 30 == 30 * 46 // 2 + 30 + 300
    assert 0 < estimate.calibration_pairs <= 30 * 30 and estimate.seconds_per_pair > 0
    assert sum(counted) == analysis.kernel_pairs <= estimate.pairs  # training, diagonal and validation kernels
    assert f"kernel: fused pair program (numba); {analysis.kernel_pairs:,} pairs" in analysis.report()


def test_a_short_analysis_says_nothing():
    net, x, y = two_class_resnet(20)
    said = []
    analysis = whole_network_support_vectors(net, x, y, say=said.append)
    assert said == [] and analysis.estimate is not None and analysis.estimate.seconds < 10


def test_above_the_budget_is_refused_before_the_solver_with_what_fits(monkeypatch):
    net, x, y = two_class_resnet(30, classes=3)
    import lightning_nsv.analysis.whole_network as whole

    def no_solver(*args, **kwargs):
        raise AssertionError("the solver was reached")

    monkeypatch.setattr(whole, "multiclass_max_margin", no_solver)
    with pytest.raises(TimeBudgetError, match=r"whole-network analysis of m = 30: up to [\d,]+ pairs .* above "
                                              r"time_budget=1e-06 s\. Within it fit about m = 0 training samples "
                                              r"\(a random subsample\) or its head after a fixed embedding"):
        whole_network_support_vectors(net, x, y, time_budget=1e-6, say=None)


@pytest.mark.parametrize("budget", [0, -1.0, float("nan"), float("inf") * 0, "60", True])
def test_a_budget_that_is_no_positive_number_is_refused(budget):
    net, x, y = two_class_resnet(10)
    with pytest.raises(ValueError, match="`time_budget` must be a positive number of seconds or None"):
        whole_network_support_vectors(net, x, y, time_budget=budget)


def test_what_fits_fits_and_one_more_sample_does_not():
    estimate = CostEstimate(m=50_000, n_val=1000, pairs=0, seconds_per_pair=3e-6, calibration_pairs=4096,
                            solver_seconds=0.0, spent_seconds=0.0, before_solve_bytes=0, memory_bytes=0,
                            engine="fused", flops_per_second=3e10)

    def cost(m):
        return (m * m / 2 + m + 1000 * m) * 3e-6 + m ** 3 / 3 / 3e10

    for budget in (1.0, 60.0, 600.0, 3600.0):
        fits = estimate.affordable_m(budget)
        assert cost(fits) <= budget < cost(fits + 1)


def test_the_cost_before_training_matches_the_analysis_rate():
    """The rate measured on a few inputs of an untrained network is the trained one's (the same program)."""
    net, x, y = two_class_resnet(40)
    before = whole_network_cost(net, x[:16], m=2000, n_val=100)
    assert before.m == 2000 and before.pairs == kernel_pairs(2000, 2000, 16) + 100 * 2000
    assert before.memory_bytes == before.before_solve_bytes + 16 * 2000 ** 2
    analysis = whole_network_support_vectors(net, x, y, say=None)
    ratio = before.seconds_per_pair / analysis.estimate.seconds_per_pair
    assert 0.2 < ratio < 5, ratio  # the same program on a shared machine: within a factor of a few


def test_without_room_for_every_column_each_entry_counts():
    assert kernel_pairs(1000, 1000, 16) == 1000 * 1016 // 2 + 1000
    assert kernel_pairs(1000, 999, 16) == 1000 * 1000 + 1000


def test_the_callback_refuses_a_fit_over_budget_before_training(tmp_path):
    from lightning_nsv.callbacks import NetworkSupportVectors
    from lightning_nsv.compat import pl
    from lightning_nsv.models.resnet import ResNetClassifier

    model = ResNetClassifier(in_channels=1, width=4, blocks=[1, 1])
    data = torch.utils.data.TensorDataset(torch.rand(64, 1, 8, 8), torch.arange(64) % 2)
    callback = NetworkSupportVectors(time_budget=1e-6, save_dir=str(tmp_path / "nsv"))
    trainer = pl.Trainer(max_epochs=3, callbacks=[callback], accelerator="cpu", enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, logger=False)
    with pytest.raises(TimeBudgetError, match=r"NetworkSupportVectors: the whole-network analysis of m = 64: .* "
                                              r"above time_budget=1e-06 s\. Within it fit about m = 0 .* or a smaller "
                                              r"network \(this module has no Linear/Leaky-ReLU head"):
        trainer.fit(model, DataLoader(data, batch_size=16))
    assert trainer.global_step == 0 and not (tmp_path / "nsv").exists()


@pytest.mark.parametrize("budget", [0, -5, "1h", True])
def test_the_callback_checks_its_budget(budget):
    from lightning_nsv.callbacks import NetworkSupportVectors

    with pytest.raises(ValueError, match="`time_budget` must be a positive number of seconds or None"):
        NetworkSupportVectors(time_budget=budget)


def test_a_linear_chain_needs_no_estimate():
    net = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 1)).double()
    x = torch.randn(30, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        net[2].bias -= net(x)[:, 0].sort().values[14:16].mean()  # between two outputs: none on the boundary
        y = (net(x)[:, 0] > 0).long()
    analysis = whole_network_support_vectors(net, x, y, time_budget=1e-9)
    assert analysis.estimate is None and analysis.kernel_pairs == 0
    assert "kernel:" not in analysis.report() and np.isfinite(analysis.margin_ratio)
