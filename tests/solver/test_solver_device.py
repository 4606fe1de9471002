"""The active-set solver's torch backend (``device=...``, ``solver="torch"``), run on the CPU: the same solutions
as the numpy backend, to rounding. On an accelerator the same torch calls run on its device."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_nsv.analysis import network_support_vectors
from lightning_nsv.kernel import InputGramCache, PathKernelColumns, PathNetwork, forward_with_slopes
from lightning_nsv.solver import max_margin
from lightning_nsv.solver.column_store import (DeviceColumnStore as _DeviceColumnStore,
                                               device_q_columns as _device_q_columns)
from lightning_nsv.solver.factor import TorchFreeSet as _DeviceFreeSet
from tests.analysis.test_multiclass import random_net as random_multiclass_net
from tests.analysis.test_multiclass import self_labelled as multiclass_labelled
from tests.kernel.test_path_space import random_net
from tests.analysis.test_support_vectors import self_labelled


def _assert_same_solution(a, b, tol=1e-10):
    np.testing.assert_array_equal(a.support_, b.support_)
    np.testing.assert_allclose(b.alpha_, a.alpha_, rtol=0, atol=tol * a.alpha_.max())
    assert abs(b.margin - a.margin) <= tol * a.margin
    np.testing.assert_allclose(b.functional_margins, a.functional_margins, rtol=0, atol=tol * 10)
    assert b.kkt_residual <= 1e-10 and a.kkt_residual <= 1e-10


def _separable(rng, m, f, duplicates=0):
    x = rng.standard_normal((m, f))
    if duplicates:  # pairs 1e-7 apart: a nearly singular Q_FF, steps that drop and re-admit members
        x[-duplicates:] = x[:duplicates] + 1e-7 * rng.standard_normal((duplicates, f))
    y = np.sign(x @ rng.standard_normal(f))
    return x, np.where(y == 0, 1.0, y)


@pytest.mark.parametrize("seed, m, f, duplicates, degree", [
    (0, 120, 8, 0, 3), (1, 400, 20, 0, 2), (2, 300, 6, 60, 3), (3, 250, 3, 0, 5),
])
def test_torch_backend_gives_the_numpy_solution_on_dense_kernels(seed, m, f, duplicates, degree):
    rng = np.random.default_rng(seed)
    x, y = _separable(rng, m, f, duplicates)
    kernel = (x @ x.T + 1.0) ** degree
    reference = max_margin(kernel, y)
    on_device = max_margin(kernel, y, device="cpu")
    _assert_same_solution(reference, on_device)
    assert on_device.iterations == reference.iterations


def test_torch_backend_takes_a_dense_tensor_kernel_in_place():
    rng = np.random.default_rng(9)
    x, y = _separable(rng, 200, 5)
    kernel = (x @ x.T + 1.0) ** 3
    _assert_same_solution(max_margin(kernel, y), max_margin(torch.from_numpy(kernel), torch.from_numpy(y),
                                                               device="cpu"))


def test_torch_backend_with_column_functions_and_a_warm_start():
    rng = np.random.default_rng(4)
    x, y = _separable(rng, 300, 10)
    kernel = (x @ x.T + 1.0) ** 3
    diag = np.diag(kernel).copy()
    reference = max_margin(kernel, y)
    initial = reference.support_[::2]
    for columns in (lambda idx: kernel[:, idx], lambda idx: torch.from_numpy(kernel[:, idx])):
        _assert_same_solution(reference, max_margin(columns, y, kernel_diag=diag, device="cpu"))
        _assert_same_solution(reference, max_margin(columns, y, kernel_diag=diag, device="cpu", initial=initial))


@pytest.mark.parametrize("device", [None, "cpu"])
def test_compacting_the_column_store_leaves_the_solution(monkeypatch, device):
    """Dead columns dropped at every chance (the defaults keep them up to 64 MiB): the same solution."""
    import lightning_nsv.solver.column_store as max_margin_module

    rng = np.random.default_rng(12)
    x, y = _separable(rng, 300, 6, duplicates=40)
    kernel = (x @ x.T + 1.0) ** 3
    reference = max_margin(kernel, y, device=device)
    compactions = []
    original = max_margin_module.ColumnStore._compact
    monkeypatch.setattr(max_margin_module.ColumnStore, "_compact",
                        lambda store, *args: (compactions.append(len(store._where)), original(store, *args)))
    monkeypatch.setattr(max_margin_module, "DEAD_COLUMNS_MIN", 1)
    monkeypatch.setattr(max_margin_module, "DEAD_BYTES_MIN", 0)
    monkeypatch.setattr(max_margin_module, "DEAD_COLUMNS_SHARE", 10 ** 6)
    _assert_same_solution(reference, max_margin(kernel, y, device=device))
    assert len(compactions) >= 3


def test_torch_backend_names_a_non_finite_column():
    rng = np.random.default_rng(5)
    x, y = _separable(rng, 50, 4)
    kernel = x @ x.T + 1.0
    kernel[7, :] = kernel[:, 7] = np.nan
    diag = np.ones(50)
    with pytest.raises(ValueError, match="row 7"):
        max_margin(lambda idx: kernel[:, idx], y, kernel_diag=diag, device="cpu")


@pytest.mark.parametrize("group", [1, 3, 50])
def test_device_factor_stays_the_cholesky_factor_of_the_free_set(group):
    """Random admissions and deletions (several at once, anywhere): ``L Lᵀ = Q_FF`` with ``L`` lower triangular."""
    rng = np.random.default_rng(group)
    for _ in range(60):
        m = int(rng.integers(2, 70))
        a = rng.standard_normal((m, m + 5))
        gram = a @ a.T
        store = _DeviceColumnStore(lambda idx: torch.from_numpy(gram[:, idx]), m, torch.device("cpu"))
        free = _DeviceFreeSet(store)
        for _ in range(6):
            outside = np.setdiff1d(np.arange(m), free.index)
            if len(free) and (not len(outside) or rng.random() < 0.4):
                deleted = rng.choice(len(free), int(rng.integers(1, min(group, len(free)) + 1)), replace=False)
                kept = [member for k, member in enumerate(free.index) if k not in set(deleted.tolist())]
                free.remove(deleted)
                assert free.index == kept
            else:
                new = rng.choice(outside, int(rng.integers(1, min(group, len(outside)) + 1)), replace=False)
                assert free.try_add(free.fetch(new))
            factor, members = free.chol.numpy(), free.index
            assert factor.shape == (len(members), len(members))
            if members:
                assert np.all(np.triu(factor, 1) == 0) and np.all(np.diag(factor) > 0)
                np.testing.assert_allclose(factor @ factor.T, gram[np.ix_(members, members)], rtol=1e-9,
                                           atol=1e-9 * np.abs(gram).max())
                alpha = rng.standard_normal(len(members))
                np.testing.assert_allclose(free.q_times(alpha), gram[:, members] @ alpha, rtol=1e-12,
                                           atol=1e-12 * np.abs(gram).max() * np.abs(alpha).sum())
                rhs = rng.standard_normal(len(members))
                np.testing.assert_allclose(gram[np.ix_(members, members)] @ free.solve(rhs), rhs, rtol=0,
                                           atol=1e-6 * np.abs(rhs).max())


def test_signed_rows_hand_the_solver_its_columns():
    rng = np.random.default_rng(6)
    net = random_net((5, 4), in_features=6, beta=0.0, bias=False, seed=6)
    x = torch.from_numpy(rng.standard_normal((80, 6)))
    _, slopes = forward_with_slopes(net, x)
    columns = PathKernelColumns(x, slopes, net.betas, net.gammas)
    y = np.where(rng.random(80) < 0.5, -1.0, 1.0)
    idx = np.array([3, 17, 42])
    q = _device_q_columns(columns, y, 2.5, torch.device("cpu"))(idx)
    np.testing.assert_allclose(q.numpy(), columns.signed_columns(idx, y, 2.5), rtol=0, atol=0)


@pytest.mark.parametrize("bias, beta", [(False, 0.0), (True, 0.2)])
def test_network_support_vectors_same_with_either_solver(bias, beta):
    net = random_net((8, 6), in_features=5, beta=beta, bias=bias, seed=7)
    x, y = self_labelled(net, 400, seed=8)
    x_val = torch.randn(60, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    results = {}
    for solver in ("numpy", "torch"):
        cache = InputGramCache()
        first = network_support_vectors(net, x, y, x_val, (net_output(net, x_val) > 0).long(), cache=cache,
                                        solver=solver, kernel="columns")
        again = network_support_vectors(net, x, y, cache=cache, solver=solver, kernel="columns")  # warm start
        dense = network_support_vectors(net, x, y, solver=solver, kernel="dense")
        results[solver] = first, again, dense
    for a, b in zip(results["numpy"], results["torch"]):
        _assert_same_solution(a.svm, b.svm)
        assert abs(a.cosine - b.cosine) <= 1e-10
        assert (a.solver_backend, b.solver_backend) == ("numpy", "torch (cpu)")
    assert results["torch"][0].val_agreement == results["numpy"][0].val_agreement
    with_intercept = network_support_vectors(net, x, y, intercept=True, solver="torch")
    assert with_intercept.solver_backend == "libsvm"  # the intercept protocol is scikit-learn's, on the CPU


def test_solver_choice_reaches_the_solver(monkeypatch):
    """``"torch"`` runs the device backend; ``"numpy"`` and ``"auto"`` on CPU inputs do not."""
    import lightning_nsv.solver.factor as max_margin_module

    built = []
    original = max_margin_module.TorchFreeSet.__init__

    def spy(self, store):
        built.append(store.device)
        original(self, store)

    monkeypatch.setattr(max_margin_module.TorchFreeSet, "__init__", spy)
    net = random_net((5,), in_features=4, beta=0.0, bias=False, seed=10)
    x, y = self_labelled(net, 80, seed=10)
    for solver, expected in (("numpy", 0), ("auto", 0), ("torch", 1)):
        built.clear()
        for kernel in ("columns", "dense"):
            network_support_vectors(net, x, y, solver=solver, kernel=kernel)
        assert built == [torch.device("cpu")] * (2 * expected), solver


def test_path_network_moves_between_devices():
    net = random_net((5, 3), in_features=4, beta=0.1, bias=True, seed=11)
    assert net.to("cpu") is net and net.to(torch.device("cpu")) is net
    moved = net.to("meta")
    assert moved.device.type == "meta" and moved.dtype == net.dtype
    assert [w.shape for w in moved.weights] == [w.shape for w in net.weights]
    assert [b.shape for b in moved.biases] == [b.shape for b in net.biases]
    assert (moved.betas, moved.gammas) == (net.betas, net.gammas)


def test_callback_analyses_on_cuda_or_else_on_the_cpu():
    from types import SimpleNamespace

    from lightning_nsv.callbacks.nsv_data import module_analysis_device

    for device, expected in (("cuda:1", "cuda:1"), ("cpu", "cpu"), ("mps", "cpu"), ("meta", "cpu")):
        assert module_analysis_device(SimpleNamespace(device=torch.device(device))) == torch.device(expected)


def test_unknown_solver_is_refused():
    net = random_net((4,), in_features=3, beta=0.0, bias=False, seed=8)
    x, y = self_labelled(net, 20, seed=8)
    with pytest.raises(ValueError, match="`solver` can be"):
        network_support_vectors(net, x, y, solver="cuda")


def net_output(net: PathNetwork, x: torch.Tensor) -> torch.Tensor:
    return forward_with_slopes(net, x)[0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_analysis_equals_the_cpu_one():
    net = random_net((8, 6), in_features=5, beta=0.0, bias=False, seed=13)
    x, y = self_labelled(net, 600, seed=13)
    x_val = torch.randn(80, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(14))
    y_val = (net_output(net, x_val) > 0).long()
    cpu = network_support_vectors(net, x, y, x_val, y_val)
    cache = InputGramCache()
    for kernel in ("columns", "dense"):
        gpu = network_support_vectors(net.to("cuda"), x.cuda(), y.cuda(), x_val.cuda(), y_val.cuda(), kernel=kernel,
                                      cache=cache if kernel == "columns" else None)
        _assert_same_solution(cpu.svm, gpu.svm)
        assert abs(gpu.cosine - cpu.cosine) <= 1e-10 and gpu.val_agreement == cpu.val_agreement
    assert len(cache)  # the support's rows, kept on the device
    again = network_support_vectors(net.to("cuda"), x.cuda(), y.cuda(), cache=cache)  # warm start from them
    _assert_same_solution(cpu.svm, again.svm)
    single = network_support_vectors(net.to("cuda"), x.float().cuda(), y.cuda())  # float32 inputs
    _assert_same_solution(network_support_vectors(net, x.float(), y).svm, single.svm)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_public_helpers_take_cuda_tensors():
    from lightning_nsv.analysis import multiclass_decision, multiclass_support_vectors
    from lightning_nsv.kernel import max_margin_decision, path_signs
    from lightning_nsv.kernel.formulas import output_gram, path_norm_squared

    net = random_net((8, 6), in_features=5, beta=0.1, bias=True, seed=17)
    x, y = self_labelled(net, 300, seed=17)
    on_gpu = net.to("cuda")
    assert path_norm_squared(on_gpu) == pytest.approx(path_norm_squared(net), rel=1e-12)
    for got, expected in zip(vars(path_signs(on_gpu)).values(), vars(path_signs(net)).values()):
        assert got == pytest.approx(expected, rel=1e-12)
    fit = network_support_vectors(net, x, y)
    sv = fit.svm.support_
    alpha = torch.from_numpy(fit.svm.alpha_[sv])
    on_cpu = max_margin_decision(net, x[sv], y[sv], alpha, x)
    for model in (net, on_gpu):  # a CPU network (e.g. a loaded artifact's) with CUDA inputs, and one on the GPU
        gpu = max_margin_decision(model, x[sv].cuda(), y[sv].cuda(), alpha.cuda(), x.cuda())
        torch.testing.assert_close(gpu.cpu(), on_cpu, rtol=1e-10, atol=1e-12)
    cache = InputGramCache()
    network_support_vectors(on_gpu, x.cuda(), y.cuda(), cache=cache)
    cache.keep(torch.as_tensor(sv[:3]).cuda())
    assert sorted(cache.samples.tolist()) == sorted(sv[:3].tolist())
    three = random_multiclass_net((8, 6), 3, in_features=5, seed=18)
    xs, labels = multiclass_labelled(three, 200, seed=18)
    cpu_fit = multiclass_support_vectors(three, xs, labels)
    gpu_fit = multiclass_support_vectors(three.to("cuda"), xs.cuda(), labels.cuda())
    np.testing.assert_array_equal(gpu_fit.svm.support_, cpu_fit.svm.support_)
    np.testing.assert_allclose(output_gram(three.to("cuda")), output_gram(three), rtol=1e-12)
    beta = torch.randn(5, 3, dtype=torch.float64)
    torch.testing.assert_close(multiclass_decision(three, xs[:5].cuda(), beta.cuda(), xs.cuda()).cpu(),
                               multiclass_decision(three, xs[:5], beta, xs), rtol=1e-10, atol=1e-12)
