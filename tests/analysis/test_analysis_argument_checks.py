"""Arguments the binary and multi-class analyses refuse before any solve, and the warm start of the dense route."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

import lightning_nsv.analysis.binary as binary
from lightning_nsv.analysis.binary import network_support_vectors
from lightning_nsv.analysis.multiclass import multiclass_support_vectors
from lightning_nsv.errors import NonFiniteError
from lightning_nsv.kernel.formulas import forward_with_slopes, path_kernel
from tests.analysis.test_multiclass import random_net, self_labelled


def binary_problem(seed: int = 3):
    net = random_net((5, 4), num_outputs=1, in_features=3, seed=seed)
    x = torch.randn(40, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 1))
    outputs = forward_with_slopes(net, x)[0]
    keep = outputs != 0
    x_val = torch.randn(12, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 2))
    return net, x[keep], (outputs[keep] > 0).long(), x_val, (forward_with_slopes(net, x_val)[0] > 0).long()


@pytest.fixture
def no_solve(monkeypatch):
    """Fails a test whose call reaches the solver: a refusal must come first."""
    def refuse(*args, **kwargs):
        raise AssertionError("the analysis reached the solver")
    monkeypatch.setattr(binary, "max_margin", refuse)
    monkeypatch.setattr(binary, "_solve_on_columns", refuse)


def test_binary_validation_labels_must_pair_with_inputs(no_solve):
    net, x, y, x_val, y_val = binary_problem()
    with pytest.raises(ValueError, match="x_val has 12 samples and y_val 1"):
        network_support_vectors(net, x, y, x_val, y_val[:1])  # one label would broadcast over all
    with pytest.raises(ValueError, match="x_val has 6 samples and y_val 5"):
        network_support_vectors(net, x, y, x_val[:6], y_val[:5])
    with pytest.raises(ValueError, match="y_val without x_val"):
        network_support_vectors(net, x, y, None, y_val)
    bad = x_val.clone()
    bad[4, 2] = math.nan
    with pytest.raises(NonFiniteError, match="validation inputs are not finite at sample 4"):
        network_support_vectors(net, x, y, bad, y_val)


@pytest.mark.parametrize("block_size", [-1, 0, 2.5, True, "8"])
def test_block_size_must_be_a_positive_integer(block_size, no_solve):
    net, x, y, x_val, y_val = binary_problem()
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        network_support_vectors(net, x, y, x_val, y_val, block_size=block_size)
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        path_kernel(x, forward_with_slopes(net, x)[1], block_size=block_size)


def test_a_block_size_gives_the_same_validation_as_the_default():
    net, x, y, x_val, y_val = binary_problem()
    default = network_support_vectors(net, x, y, x_val, y_val)
    blocked = network_support_vectors(net, x, y, x_val, y_val, block_size=np.int64(5))
    assert (default.val_agreement, default.val_errors_svm) == (blocked.val_agreement, blocked.val_errors_svm)


@pytest.mark.parametrize("route", [dict(kernel="dense"), dict(kernel="dense", intercept=True), dict()])
def test_initial_out_of_range_is_refused_on_every_route(route, no_solve):
    net, x, y, _, _ = binary_problem()
    with pytest.raises(ValueError, match=rf"`initial` must hold sample indices in \[0, {len(x)}\)"):
        network_support_vectors(net, x, y, initial=[0, len(x)], **route)


def test_the_dense_route_warm_starts_from_initial_to_the_same_solution(monkeypatch):
    net, x, y, _, _ = binary_problem()
    cold = network_support_vectors(net, x, y, kernel="dense")
    seen = {}
    solve = binary.max_margin

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return solve(*args, **kwargs)
    monkeypatch.setattr(binary, "max_margin", spy)
    warm = network_support_vectors(net, x, y, kernel="dense", initial=cold.svm.support_[::-1].copy())
    assert sorted(seen["initial"]) == sorted(cold.svm.support_) and seen["initial_block"] == cold.n_support
    np.testing.assert_array_equal(warm.svm.support_, cold.svm.support_)
    np.testing.assert_allclose(warm.svm.alpha_, cold.svm.alpha_, rtol=1e-9, atol=1e-12)


def test_multiclass_refuses_what_the_binary_analysis_refuses():
    net = random_net((4,), num_outputs=3, seed=51)
    x, y = self_labelled(net, 30, seed=52)
    x_val, y_val = self_labelled(net, 12, seed=53)
    bad = x_val.clone()
    bad[3] = math.nan
    with pytest.raises(NonFiniteError, match="validation inputs are not finite at sample 3"):
        multiclass_support_vectors(net, x, y, bad, y_val)
    with pytest.raises(ValueError, match=f"x_val has {len(x_val)} samples and y_val 2"):
        multiclass_support_vectors(net, x, y, x_val, y_val[:2])
    with pytest.raises(ValueError, match="y_val without x_val"):
        multiclass_support_vectors(net, x, y, None, y_val)
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        multiclass_support_vectors(net, x, y, x_val, y_val, block_size=-1)
    diverged = random_net((4,), num_outputs=3, seed=51)
    diverged.weights[0][1, 2] = math.nan
    with pytest.raises(NonFiniteError, match=r"weights\[0\] holds NaN"):
        multiclass_support_vectors(diverged, x, y)


@pytest.mark.parametrize("options, message", [
    (dict(block_bytes=0), "`block_bytes` must be a positive integer"),
    (dict(block_bytes=-5), "`block_bytes` must be a positive integer"),
    (dict(block_bytes=1.5e6), "`block_bytes` must be a positive integer"),
    (dict(initial=[0, 40]), r"`initial` must hold sample indices in \[0, 40\)"),
])
def test_whole_network_refuses_bad_options_before_tracing(options, message, monkeypatch):
    import lightning_nsv.analysis.whole_network as whole

    def refuse(*args, **kwargs):
        raise AssertionError("the analysis traced the module")
    if "block_bytes" in options:
        monkeypatch.setattr(whole, "_trace", refuse)
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1)).double()
    x = torch.randn(40, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        y = (module(x)[:, 0] > 0).long()
    with pytest.raises(ValueError, match=message):
        whole.whole_network_support_vectors(module, x, y, **options)


ONE_CLASS = (r"every training label is {}: with one class, zero training error only asks the network to give every "
             r"sample that class.*needs training samples of at least two classes")


def test_a_training_set_of_one_class_is_refused_by_every_analysis(no_solve):
    """As NetworkSupportVectors refuses it: the max margin of one class describes no decision boundary."""
    from lightning_nsv.analysis import whole_network_support_vectors

    net, x, y, _, _ = binary_problem()
    positive = y == 1
    with pytest.raises(ValueError, match=ONE_CLASS.format(r"positive \(1\)")):
        network_support_vectors(net, x[positive], y[positive])
    three = random_net((4,), num_outputs=3, seed=51)
    x3, y3 = self_labelled(three, 30, seed=52)
    with pytest.raises(ValueError, match=ONE_CLASS.format("class 1")):
        multiclass_support_vectors(three, x3[y3 == 1], y3[y3 == 1])
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3)).double()
    with torch.no_grad():
        module[2].bias.copy_(torch.tensor([0.0, 100.0, 0.0]))  # every sample is class 1: zero training error
    with pytest.raises(ValueError, match=ONE_CLASS.format("class 1")):
        whole_network_support_vectors(module, x, torch.ones(len(x), dtype=torch.long))


def test_a_single_sample_is_refused_with_m_1_named(no_solve):
    from lightning_nsv.analysis import whole_network_support_vectors

    net, x, y, _, _ = binary_problem()
    first = ONE_CLASS.format(r"positive \(1\)" if int(y[0]) == 1 else r"negative \(0 or -1\)")
    with pytest.raises(ValueError, match=r"x_train holds one sample \(m = 1\), so " + first):
        network_support_vectors(net, x[:1], y[:1])
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1)).double()
    with torch.no_grad():
        label = (module(x[:1])[:, 0] > 0).long()
    with pytest.raises(ValueError, match=r"x_train holds one sample \(m = 1\), so every training label"):
        whole_network_support_vectors(module, x[:1], label)


def test_a_module_or_data_on_the_meta_device_is_named_before_any_value_is_read():
    from lightning_nsv.analysis import whole_network_support_vectors
    from lightning_nsv.errors import NoDataError
    from lightning_nsv.extract import find_path_part

    with torch.device("meta"):
        empty = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    _, x, y, _, _ = binary_problem()
    fix = r"give it its values first, e.g. `module.to_empty\(device='cpu'\)` then `module.load_state_dict"
    with pytest.raises(NoDataError, match=r"the module \(Sequential\) is on the meta device \(0.weight, 0.bias, "
                                          r"2.weight, … \(4 in all\): shapes without values.*" + fix):
        whole_network_support_vectors(empty, x, y)
    with pytest.raises(NoDataError, match=r"the network's head is on the meta device \(weights\[0\].*" + fix):
        find_path_part(empty).path_network()
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1)).double()
    with pytest.raises(NoDataError, match=r"the data is on the meta device \(x_train: .*pass the inputs themselves"):
        whole_network_support_vectors(module, x.to("meta"), y)


@pytest.mark.parametrize("scope_name", [None, "", "  ", 3])
def test_a_scope_name_that_is_no_text_is_refused(scope_name):
    from lightning_nsv.analysis.whole_network_checks import check_scope_name

    with pytest.raises(ValueError, match=r"`scope_name` must be a non-empty string that says what the module is, "
                                         rf"for the report's first line .*got {re.escape(repr(scope_name))}$"):
        check_scope_name(scope_name)
    check_scope_name("layers after the trunk `features`")


def test_whole_network_support_vectors_refuses_scope_name_none():
    from lightning_nsv.analysis import whole_network_support_vectors

    _, x, y, _, _ = binary_problem()
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1)).double()
    with torch.no_grad():
        y = (module(x)[:, 0] > 0).long()
    assert whole_network_support_vectors(module, x, y).report().startswith("path kernel of the whole network: ")
    with pytest.raises(ValueError, match="`scope_name` must be a non-empty string"):
        whole_network_support_vectors(module, x, y, scope_name=None)
