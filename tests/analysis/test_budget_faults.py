"""Bad and unusual input to the cost said before it is paid (analysis/whole_network_budget.py, whole_network_cost,
whole_network_support_vectors' time_budget/say/progress, the callback's check before training): each gets a message
that names the problem and the fix, or the right number (issue 43).

Decided here: ``time_budget=inf`` means no limit, as ``None`` does, for the analysis and the callback alike (it was
taken by one and refused by the other); ``time_budget`` is configuration, not state: ``state_dict`` leaves it out, so
a run resumed with another budget keeps the one it was given."""
from __future__ import annotations

import math
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from lightning_nsv.analysis import TimeBudgetError, whole_network_cost, whole_network_support_vectors
from lightning_nsv.analysis.whole_network_budget import CostEstimate, kernel_pairs
from lightning_nsv.errors import NonFiniteError
from lightning_nsv.kernel import NotPiecewiseLinearError
from tests.analysis.test_whole_network_cost import two_class_resnet

BUDGET = re.escape("`time_budget` must be a positive number of seconds or None (no limit; inf means the same)")


@pytest.fixture(scope="module")
def resnet():
    return two_class_resnet(20)


def estimate(**changes) -> CostEstimate:
    values = dict(m=2000, n_val=0, pairs=kernel_pairs(2000, 2000, 16), seconds_per_pair=3e-6, calibration_pairs=4096,
                  solver_seconds=0.1, spent_seconds=0.5, before_solve_bytes=100 << 20, memory_bytes=164 << 20,
                  engine="fused pair program (numba)", flops_per_second=3e10)
    return CostEstimate(**{**values, **changes})


# ------------------------------------------------------------------------------------------- whole_network_cost


@pytest.mark.parametrize("m", [0, -5, 2.5, 10.0, True, "100", None])
def test_a_number_of_training_samples_that_is_no_positive_integer_is_refused(resnet, m):
    """(0, -5, 2.5 and True gave estimates of m = 0, -5 (-13 pairs), 2.5 and True; '100' and None raw TypeErrors.)"""
    net, x, _ = resnet
    with pytest.raises(ValueError, match=re.escape(f"`m` must be an integer >= 1 (the training samples the analysis "
                                                   f"will take), got {m!r} ({type(m).__name__})")):
        whole_network_cost(net, x[:4], m)


@pytest.mark.parametrize("n_val", [-1, 1.5, True, None])
def test_a_number_of_validation_samples_that_is_no_integer_is_refused(resnet, n_val):
    net, x, _ = resnet
    with pytest.raises(ValueError, match=re.escape(f"`n_val` must be an integer >= 0 (the validation samples the "
                                                   f"analysis will take), got {n_val!r}")):
        whole_network_cost(net, x[:4], 100, n_val)


def test_numpy_integers_count_as_python_integers(resnet):
    """(n_val = np.int32(3) overflowed in n_val·m: OverflowError; m = np.int64 stayed numpy in the estimate.)"""
    net, x, _ = resnet
    cost = whole_network_cost(net, x[:4], np.int64(100_000), np.int32(30_000), memory_bytes=1 << 45)
    assert type(cost.m) is int and type(cost.n_val) is int and type(cost.pairs) is int
    assert cost.pairs == kernel_pairs(100_000, 0, 16) + 30_000 * 100_000  # no room for every column: m² + m


@pytest.mark.parametrize("x_sample, got", [(torch.zeros(0, 2, 8, 8), r"a tensor of shape \(0, 2, 8, 8\)"),
                                           (np.zeros((4, 2, 8, 8)), "ndarray")])
def test_no_samples_to_measure_on_is_refused(resnet, x_sample, got):
    """(An empty tensor said 'trace needs at least one example input', a numpy array raised an AttributeError.)"""
    net, *_ = resnet
    with pytest.raises(ValueError, match=r"`x_sample` must be a few training inputs, a tensor \(n, \*input_shape\) with "
                                         rf"n >= 1 \(e.g. x_train\[:32\]\), got {got}"):
        whole_network_cost(net, x_sample, 100)


def test_non_finite_samples_are_named(resnet):
    """(It said 'SmallResNet: the float64 forward of the example inputs is not finite'.)"""
    net, x, _ = resnet
    bad = x[:6].clone()
    bad[4, 1, 0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match=r"x_sample inputs are not finite at sample 4 \(1 samples in all\): the "
                                             "data hold NaN or inf"):
        whole_network_cost(net, bad, 100)


@pytest.mark.parametrize("options, message", [
    (dict(block_bytes=0), "`block_bytes` must be a positive integer (bytes), got 0"),
    (dict(memory_bytes="1G"), "`memory_bytes` must be a positive integer (bytes), got '1G' (str)"),
    (dict(memory_bytes=-1), "`memory_bytes` must be a positive integer (bytes), got -1"),
])
def test_byte_budgets_of_the_estimate_are_checked_as_the_analysis_checks_them(resnet, options, message):
    """(block_bytes=0 was taken; memory_bytes='1G' raised "Cannot specify ',' with 's'.", -1 was refused as memory
    that does not fit, advising fewer samples.)"""
    net, x, y = resnet
    with pytest.raises(ValueError, match=re.escape(message)):
        whole_network_cost(net, x[:4], 100, **options)
    if "memory_bytes" in options:
        with pytest.raises(ValueError, match=re.escape(message)):
            whole_network_support_vectors(net, x, y, **options)


class HeadOnly(nn.Module):
    """A GELU trunk and a ReLU head: only the head is analysable."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Conv2d(2, 3, 3), nn.GELU(), nn.Flatten())
        self.head = nn.Sequential(nn.Linear(3 * 36, 4), nn.ReLU(), nn.Linear(4, 1))

    def forward(self, x):
        return self.head(self.trunk(x))


@pytest.mark.parametrize("module, where", [(nn.Sequential(nn.Flatten(), nn.Linear(128, 5), nn.GELU(), nn.Linear(5, 1)),
                                            "2: GELU"), (HeadOnly(), "trunk.1: GELU")])
def test_a_module_that_is_not_piecewise_linear_is_named(resnet, module, where):
    _, x, _ = resnet
    with pytest.raises(NotPiecewiseLinearError, match=f"{where} is not piecewise linear .* Choices: move it into a "
                                                      "trunk that is treated as a fixed embedding"):
        whole_network_cost(module, x[:4], 100)


def test_fewer_training_samples_than_measured_on(resnet):
    net, x, _ = resnet
    cost = whole_network_cost(net, x[:16], 4)
    assert cost.m == 4 and cost.pairs == kernel_pairs(4, 4, 16) == 4 * 20 // 2 + 4


# ------------------------------------------------------------------------------ whole_network_support_vectors


@pytest.mark.parametrize("budget", [math.inf, np.float64(60.0), np.int64(600), 3600, 10 ** 400])
def test_budgets_of_any_real_type_and_inf_are_taken(resnet, budget):
    """(np.int64(600) was refused as 'no positive number'; 10**400, beyond a float, raised an OverflowError.)"""
    net, x, y = resnet
    analysis = whole_network_support_vectors(net, x, y, time_budget=budget, say=None, progress=False)
    assert analysis.m == 20 and analysis.estimate.seconds < budget


@pytest.mark.parametrize("budget", [-math.inf, math.nan, 0.0, "60", True])
def test_budgets_that_are_no_positive_number_are_refused(resnet, budget):
    net, x, y = resnet
    with pytest.raises(ValueError, match=BUDGET + re.escape(f", got {budget!r} ({type(budget).__name__}); e.g. "
                                                            "time_budget=3600 for an hour")):
        whole_network_support_vectors(net, x, y, time_budget=budget)


@pytest.mark.parametrize("options, error, message", [
    (dict(say=1), TypeError, "`say` must be a function that takes the estimate's text (e.g. print, or a logger's "
                             "info) or None (not said), got 1 (int)"),
    (dict(say="stderr"), TypeError, "`say` must be a function"),
    (dict(progress="no"), TypeError, "`progress` must be True or False, got 'no' (str); a string such as 'no' would "
                                     "count as True"),
    (dict(progress=None), TypeError, "`progress` must be True or False, got None"),
    (dict(budget_advice=""), ValueError, "`budget_advice` must be a non-empty string"),
])
def test_say_progress_and_advice_are_checked_before_any_work(resnet, monkeypatch, options, error, message):
    """(All were taken: say=1 failed only once an analysis was long, deep inside; progress='no' showed the bar.)"""
    import lightning_nsv.analysis.whole_network as whole

    def no_trace(*args, **kwargs):
        raise AssertionError("the module was traced")

    monkeypatch.setattr(whole, "_trace", no_trace)
    net, x, y = resnet
    with pytest.raises(error, match=re.escape(message)):
        whole_network_support_vectors(net, x, y, **options)


# -------------------------------------------------------------------------------------------------- CostEstimate


@pytest.mark.parametrize("budget", ["60", math.nan, -1.0, 0])
def test_the_estimate_checks_a_budget_it_is_given(budget):
    """(check('60') raised a raw TypeError, check(nan) refused the analysis as 'above time_budget=nan s';
    affordable_m(nan) and affordable_m(-1) said 0 samples fit.)"""
    with pytest.raises(ValueError, match=BUDGET):
        estimate().check(budget, "its head")
    with pytest.raises(ValueError, match=BUDGET):
        estimate().affordable_m(budget)


def test_no_limit_fits_every_sample_and_a_budget_below_what_is_spent_counts_what_is_to_come():
    e = estimate(spent_seconds=100.0)
    assert e.affordable_m(math.inf) == e.affordable_m(None) == 2000
    e.check(math.inf, "its head")
    fits = e.affordable_m(1.0)  # below the 100 s spent: the budget is for what is still to come
    assert 0 < fits < 2000
    with pytest.raises(TimeBudgetError, match=f"Within it fit about m = {fits:,} training samples"):
        e.check(1.0, "its head")


def test_the_estimate_of_one_sample_and_of_a_billion_reads_in_units():
    """(m = 1: 'measured on 1 pairs', '0.0 GiB'; m = 10⁹: '1000000000.00 G pairs', '3087253086419.8 h', '14901161193.8
    GiB'.)"""
    one = estimate(m=1, pairs=kernel_pairs(1, 1, 16), calibration_pairs=1, solver_seconds=0.0, before_solve_bytes=0,
                   memory_bytes=16).describe()
    assert "up to 9 pairs" in one and "measured on 1 pair," in one and "up to 16 B (0 B before the solver" in one
    m = 10 ** 9
    huge = estimate(m=m, pairs=kernel_pairs(m, 0, 16), solver_seconds=m ** 3 / 3 / 3e10, memory_bytes=16 * m * m,
                    before_solve_bytes=40 * 2 ** 40).describe()
    assert "up to 1.00e+18 pairs" in huge and "up to 3.5e+08 years more (the solver 3.5e+08 years of it)" in huge
    assert "up to 1.46e+07 TiB (40.0 TiB before the solver starts" in huge
    assert "G pairs" not in huge and " h " not in huge and "GiB" not in huge
    day = estimate(seconds_per_pair=0.0, solver_seconds=3 * 86400.0).describe()
    assert "up to 3 days more (the solver 3 days of it)" in day
    assert "at 50.00 ms a pair" in estimate(seconds_per_pair=0.05).describe()  # (was '50000.00 µs a pair')


def test_a_zero_pair_rate_fits_every_sample_and_no_gemm_rate_is_refused():
    """(flops_per_second=0 made affordable_m divide by zero.)"""
    assert estimate(seconds_per_pair=0.0, solver_seconds=0.0).affordable_m(1.0) == 2000  # the solver: 0.09 s
    with pytest.raises(ValueError, match=r"a cost estimate needs m >= 1 .* a GEMM rate > 0, got m=2000, .*"
                                         r"flops_per_second=0\.0"):
        estimate(flops_per_second=0.0)
    with pytest.raises(ValueError, match="a cost estimate needs m >= 1"):
        estimate(m=0)


# ---------------------------------------------------------------------------------------------------- callback


def _fit(tmp_path, callback, logger=False, checkpointing=False, max_epochs=1):
    from lightning_nsv.compat import pl
    from lightning_nsv.models.resnet import ResNetClassifier

    torch.manual_seed(0)
    model = ResNetClassifier(in_channels=1, width=4, blocks=[1, 1])
    data = torch.utils.data.TensorDataset(torch.rand(64, 1, 8, 8), torch.arange(64) % 2)
    trainer = pl.Trainer(max_epochs=max_epochs, callbacks=[callback], accelerator="cpu", enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=checkpointing, logger=logger,
                         default_root_dir=tmp_path)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(workers|log_every_n_steps|LeafSpec|val_dataloader).*")
        trainer.fit(model, DataLoader(data, batch_size=16))
    return trainer


@pytest.mark.parametrize("budget", [math.inf, np.float64(60.0), np.int64(60), None, 10 ** 400])
def test_the_callback_takes_what_the_analysis_takes(tmp_path, budget):
    """(inf was refused by the callback and taken by the analysis.)"""
    from lightning_nsv.callbacks import NetworkSupportVectors

    callback = NetworkSupportVectors(time_budget=budget, save_dir=str(tmp_path / "nsv"))
    if budget is math.inf:
        assert _fit(tmp_path, callback).global_step > 0  # trained: no limit


@pytest.mark.parametrize("budget", [math.nan, "60", -1, True, -math.inf])
def test_the_callback_refuses_what_the_analysis_refuses(budget):
    from lightning_nsv.callbacks import NetworkSupportVectors

    with pytest.raises(ValueError, match=BUDGET):
        NetworkSupportVectors(time_budget=budget)


def test_a_refusal_under_fit_leaves_no_result_checkpoint_or_logged_metric(tmp_path):
    """What a refused fit leaves: the logger's own folder (its hparams and an event file without an ``nsv/`` key),
    nothing of the callback's, no checkpoint."""
    from lightning_nsv.callbacks import NetworkSupportVectors
    from lightning_nsv.compat import pl

    callback = NetworkSupportVectors(time_budget=1e-9, save_dir=str(tmp_path / "nsv"))
    with pytest.raises(TimeBudgetError, match="NetworkSupportVectors: the whole-network analysis of m = 64"):
        _fit(tmp_path, callback, logger=pl.loggers.CSVLogger(tmp_path), checkpointing=True)
    files = sorted(p.relative_to(tmp_path).as_posix() for p in Path(tmp_path).rglob("*") if p.is_file())
    assert files == ["lightning_logs/version_0/hparams.yaml"], files
    assert not (tmp_path / "nsv").exists() and callback.result_path is None and callback.metrics == {}


def test_memory_that_does_not_fit_is_refused_by_the_callback_before_training(tmp_path, monkeypatch):
    """(The analysis' raw memory error came out of on_train_start without naming the callback; under DDP a rank
    short of memory raised alone while the others waited at the verdict's broadcast.)"""
    from lightning_nsv.analysis import whole_network_memory
    from lightning_nsv.callbacks import NetworkSupportVectors

    monkeypatch.setattr(whole_network_memory, "available_memory_bytes", lambda: 1 << 20)
    callback = NetworkSupportVectors(time_budget=None, save_dir=str(tmp_path / "nsv"))
    with pytest.raises(ValueError, match=r"^NetworkSupportVectors: before training, for the analysis at zero training "
                                         r"error: the whole-network analysis needs at least [\d.]+ MiB before its "
                                         r"solver starts .* above the 1.0 MiB of memory available"):
        _fit(tmp_path, callback)
    assert not (tmp_path / "nsv").exists()


def test_the_budget_is_configuration_not_state():
    from lightning_nsv.callbacks import NetworkSupportVectors

    saved = NetworkSupportVectors(time_budget=60).state_dict()
    assert "time_budget" not in saved
    resumed = NetworkSupportVectors(time_budget=None)
    resumed.load_state_dict(saved)
    assert resumed.time_budget is None
