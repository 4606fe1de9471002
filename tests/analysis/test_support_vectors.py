import math

import numpy as np
import pytest
import torch

from lightning_nsv.analysis import compression_bound, network_support_vectors
from lightning_nsv.kernel import PathNetwork, forward_with_slopes, signed_labels
from lightning_nsv.solver import NotSeparableError, max_margin
from tests.reference import materialise_phi, materialise_wbar
from tests.kernel.test_path_space import random_net


def self_labelled(net: PathNetwork, n: int, seed: int):
    """Samples labelled by the network's own sign (zero training error), less those with ``N(x) = 0``."""
    x = torch.randn(n, net.in_features, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    outputs = forward_with_slopes(net, x)[0]
    return x[outputs != 0], (outputs[outputs != 0] > 0).long()


def test_compression_bound_by_hand():
    m, s, n, delta = 100, 10, 5, 0.05
    expected = (n * s * math.log(2) + math.log(math.comb(m, s)) + math.log(m / delta)) / (m - s)
    assert compression_bound(m, s, n, delta) == pytest.approx(expected, rel=1e-12)
    assert compression_bound(m, m, n) == math.inf
    assert compression_bound(1000, 0, 10, 0.1) == pytest.approx(math.log(1000 / 0.1) / 1000)
    with pytest.raises(ValueError, match="need 0 <= s <= m"):
        compression_bound(10, 11, 3)
    with pytest.raises(ValueError, match="`delta` must be in \\(0, 1\\), got 1.5"):
        compression_bound(10, 1, 3, delta=1.5)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("beta", [0.0, 0.1, -1.0])
def test_analysis_against_materialised_path_space(bias, beta):
    net = random_net((3, 2), in_features=3, beta=beta, bias=bias, seed=30)  # both classes for every beta, bias
    x, y = self_labelled(net, 40, seed=1)
    x_val, y_val = self_labelled(net, 25, seed=2)
    y_val[:3] = 1 - y_val[:3]
    analysis = network_support_vectors(net, x, y, x_val, y_val)

    phi, wbar, ys = materialise_phi(net, x), materialise_wbar(net), signed_labels(y)
    alpha = torch.from_numpy(analysis.svm.alpha_)
    v = phi.T @ (alpha * ys)
    assert analysis.cosine == pytest.approx(float(wbar @ v / (wbar.norm() * v.norm())), rel=1e-8)
    assert analysis.wbar_norm == pytest.approx(float(wbar.norm()), rel=1e-10)
    assert analysis.svm.margin == pytest.approx(1 / float(v.norm()), rel=1e-8)
    assert float((ys * (phi @ v)).min()) == pytest.approx(1.0, rel=1e-8)  # v has functional margin 1
    assert analysis.network_margin == pytest.approx(float((ys * (phi @ wbar)).min() / wbar.norm()), rel=1e-10)
    assert 0 < analysis.margin_ratio <= 1 + 1e-9

    svm_val = torch.where(materialise_phi(net, x_val) @ v >= 0, 1.0, -1.0)
    net_val = torch.where(forward_with_slopes(net, x_val)[0] >= 0, 1.0, -1.0)
    assert analysis.val_agreement == pytest.approx(float((svm_val == net_val).double().mean()))
    target = signed_labels(y_val)
    assert analysis.val_errors_network == int((net_val != target).sum()) == 3
    assert analysis.val_errors_svm == int((svm_val != target).sum())
    assert analysis.val_errors_both == int(((svm_val != target) & (net_val != target)).sum())
    metrics = analysis.to_metrics()
    assert metrics["n_support"] == len(analysis.svm.support_) == int((alpha > 0).sum())
    assert metrics["support_fraction"] == pytest.approx(analysis.n_support / len(y))
    assert metrics["path_positive_count_fraction"] == pytest.approx(float((wbar > 0).double().mean()))


def test_kernel_columns_on_demand_give_the_dense_solution():
    net = random_net((5, 4), in_features=6, beta=0.1, bias=True, seed=8)
    x, y = self_labelled(net, 300, seed=9)
    dense = network_support_vectors(net, x, y, kernel="dense")
    lazy = network_support_vectors(net, x, y, kernel="auto", max_dense_bytes=8 * 299**2)
    np.testing.assert_array_equal(lazy.svm.support_, dense.svm.support_)
    np.testing.assert_allclose(lazy.svm.alpha_, dense.svm.alpha_, rtol=1e-8, atol=1e-12 * dense.svm.alpha_.max())
    assert lazy.to_metrics()["cosine_wbar_v"] == pytest.approx(dense.to_metrics()["cosine_wbar_v"], rel=1e-9)
    with pytest.raises(ValueError, match="`kernel` can be auto, dense, columns, got 'sparse'"):
        network_support_vectors(net, x, y, kernel="sparse")


def test_max_margin_network_has_ratio_and_cosine_one():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(30, 4, dtype=torch.float64, generator=gen)
    y = torch.where(x @ torch.randn(4, dtype=torch.float64, generator=gen) >= 0, 1.0, -1.0)
    svm = max_margin(x @ x.T, y)
    v = x.T @ (torch.from_numpy(svm.alpha_) * y)
    linear = PathNetwork((3.0 * v[None, :],), None, (), ())  # a network with no hidden layer, scaled
    analysis = network_support_vectors(linear, x, y)
    assert analysis.margin_ratio == pytest.approx(1.0, rel=1e-9)
    assert analysis.cosine == pytest.approx(1.0, rel=1e-9)
    assert analysis.unique_patterns_train == 1


def test_intercept_protocol_and_report():
    net = random_net((4,), in_features=3, beta=0.1, bias=True, seed=3)
    x, y = self_labelled(net, 60, seed=4)
    analysis = network_support_vectors(net, x, y, x, y, intercept=True)
    assert analysis.svm.method == "libsvm"
    assert analysis.svm.n_margin_violations == 0
    assert analysis.val_agreement == 1.0 and analysis.val_errors_svm == 0
    report = analysis.report()
    assert f"{analysis.n_support} of m=60" in report and "libsvm" in report and "compression bound" in report


def test_misclassified_training_sample_is_refused():
    net = random_net((3,), in_features=3, seed=0)
    x, y = self_labelled(net, 20, seed=0)
    y[4] = 1 - y[4]
    with pytest.raises(NotSeparableError, match=f"misclassifies 1 of {len(y)} training samples \\(0 of them"):
        network_support_vectors(net, x, y)
    dead = PathNetwork((torch.ones(2, 3, dtype=torch.float64), torch.ones(1, 2, dtype=torch.float64)), None,
                       (0.0,), (1.0,))
    with pytest.raises(NotSeparableError, match="2 of them with N\\(x\\) = 0"):
        network_support_vectors(dead, -torch.tensor([[1.0, 1, 1], [2, 2, 2]]), torch.tensor([1, 0]))
    with pytest.raises(ValueError, match="binary labels must be 0/1 or -1/\\+1, got values \\[0, 1, 2\\]"):
        network_support_vectors(net, x, torch.arange(20) % 3)
    np.testing.assert_array_equal(signed_labels(torch.tensor([0, 1, -1, 1])).numpy(), [-1, 1, -1, 1])


def test_labels_as_arrays_or_lists_give_the_tensor_analysis():
    from lightning_nsv.kernel import max_margin_decision

    net = random_net((6, 4), in_features=4, seed=21)
    x, y = self_labelled(net, 120, seed=21)
    fit = network_support_vectors(net, x, y)
    for labels in (y.numpy(), y.tolist()):
        np.testing.assert_array_equal(network_support_vectors(net, x, labels).svm.support_, fit.svm.support_)
        torch.testing.assert_close(signed_labels(labels), signed_labels(y))
    sv = fit.svm.support_
    alpha = fit.svm.alpha_[sv]
    expected = max_margin_decision(net, x[sv], y[sv], torch.from_numpy(alpha), x)
    torch.testing.assert_close(max_margin_decision(net, x[sv], y[sv].numpy(), alpha, x), expected)
    torch.testing.assert_close(max_margin_decision(net, x[sv], y[sv].tolist(), alpha.tolist(), x), expected)


@pytest.mark.parametrize("outputs", [1, 3])
def test_an_analysis_that_cannot_fit_in_memory_is_refused_before_allocating(outputs):
    """A 50,000-wide layer at m = 100,000: 40 GB of slopes; refused with the bytes and their use, before any."""
    from lightning_nsv.analysis import multiclass_support_vectors

    net = PathNetwork.from_tensors([torch.randn(50_000, 2), torch.randn(outputs, 50_000)], None, [0.0], [1.0])
    x, y = torch.randn(100_000, 2), torch.arange(100_000) % 2
    analyse = network_support_vectors if outputs == 1 else multiclass_support_vectors
    with pytest.raises(ValueError, match=r"the support-vector analysis needs about \d+\.\d GB for m=100,000 training "
                                         r"samples: the activation slopes of every sample \(50,000 hidden units, 40.0 "
                                         r"GB.*more than the .* GB of memory available; analyse fewer samples"):
        analyse(net, x, y)


def test_labels_of_shape_n_by_1_are_one_label_per_sample():
    """(n, 1) labels times (n,) outputs broadcast to (n, n): a separable network was reported not separable."""
    net = PathNetwork.from_tensors([torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([[1.0, -1.0]])], None,
                                   [0.0], [1.0])
    x = torch.tensor([[2.0, 0.0], [0.0, 2.0], [3.0, 1.0], [1.0, 3.0]])
    y = torch.tensor([1, 0, 1, 0])
    flat = network_support_vectors(net, x, y)
    column = network_support_vectors(net, x, y[:, None])
    np.testing.assert_array_equal(column.svm.support_, flat.svm.support_)
    with pytest.raises(ValueError, match=r"binary labels need one label per sample, shape \(n,\) or \(n, 1\), got "
                                         r"\(4, 2\)"):
        signed_labels(torch.nn.functional.one_hot(y, 2))


def test_report_marks_a_compression_bound_above_one_as_vacuous():
    """A bound above 1 (or inf) says nothing about an error rate: the report says so; one below 1 is left plain."""
    import dataclasses

    from lightning_nsv.analysis import multiclass_support_vectors
    from tests.analysis.test_multiclass import random_net as multiclass_net, self_labelled as multiclass_labelled

    net = random_net((5, 4), in_features=3, seed=3)
    x, y = self_labelled(net, 60, seed=4)
    binary = network_support_vectors(net, x, y)
    net3 = multiclass_net((5,), 3, seed=5)
    x3, y3 = multiclass_labelled(net3, 60, seed=6)
    multi = multiclass_support_vectors(net3, x3, y3)
    for analysis in (binary, multi):
        assert analysis.bound > 1  # few samples, many bits per support vector
        line = analysis.report().splitlines()[-1]
        assert line.startswith("compression bound") and f"{analysis.bound:.4g} — vacuous (above 1" in line
        assert dataclasses.replace(analysis, bound=0.25).report().splitlines()[-1].endswith(": 0.25")
        infinite = dataclasses.replace(analysis, bound=math.inf).report().splitlines()[-1]
        assert infinite.endswith("): inf — vacuous (s = m: every sample is a support vector, says nothing about "
                                 "the error)")


def test_reports_print_tiny_ratios_and_cosines_with_significant_digits():
    """A whole CIFAR network's margin ratio 2.4e-9 and cosine 9e-8 printed as "ratio 0.0000" and "0.0001"."""
    import dataclasses

    from lightning_nsv.analysis import multiclass_support_vectors
    from tests.analysis.test_multiclass import random_net as multiclass_net, self_labelled as multiclass_labelled

    net = random_net((3, 2), in_features=3, seed=30)
    x, y = self_labelled(net, 40, seed=1)
    binary = dataclasses.replace(network_support_vectors(net, x, y), margin_ratio=2.4e-9, cosine=9e-8)
    assert "(ratio 2.4e-09); cosine(wbar, v) = 9e-08" in binary.report()
    three = multiclass_net((4,), num_outputs=3, seed=51)
    x3, y3 = multiclass_labelled(three, 30, seed=52)
    for method in ("exact", "ovr"):
        analysis = multiclass_support_vectors(three, x3, y3, method=method)
        tiny = dataclasses.replace(analysis, margin_ratio=None if method == "ovr" else 2.4e-9, cosine=9e-8,
                                   per_class_margin_ratio=analysis.per_class_margin_ratio and (3e-9,) * 3,
                                   per_class_cosine=analysis.per_class_cosine and (4e-8,) * 3)
        report = tiny.report()
        assert "cosine(Wc, V) = 9e-08" in report
        assert ("(ratio 2.4e-09)" in report) if method == "exact" else ("(ratio 3e-09), cosine 4e-08" in report)
