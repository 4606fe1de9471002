"""The solver's one interface (``KernelColumns``), its adapters, and the options that decide how a problem is solved."""
import warnings

import numpy as np
import pytest
import torch

from lightning_nsv.kernel import PathKernelColumns, forward_with_slopes, path_kernel, path_kernel_diagonal
from lightning_nsv.solver import KernelColumns, max_margin
from lightning_nsv.solver.options import SolverOptions, plan
from lightning_nsv.solver.protocol import CallableColumns, DenseColumns, DenseTensorColumns, as_kernel_columns
from tests.kernel.test_path_space import random_net
from tests.analysis.test_support_vectors import self_labelled


def _problem(bias=True, beta=0.1, m=200):
    net = random_net((6, 5), in_features=5, beta=beta, bias=bias, seed=4)
    x, y = self_labelled(net, m, seed=5)
    x = x.reshape(len(x), -1).double()
    slopes = forward_with_slopes(net, x)[1]
    return net, x, np.where(y.numpy() > 0, 1.0, -1.0), slopes


@pytest.mark.parametrize("bias, beta", [(False, 0.0), (True, 0.1)])
def test_a_provider_gives_its_own_diagonal_and_the_solution_of_the_dense_kernel(bias, beta):
    net, x, y, slopes = _problem(bias, beta)
    columns = PathKernelColumns(x, slopes, net.betas, net.gammas, bias=bias)
    assert isinstance(columns, KernelColumns) and columns.offers_block
    np.testing.assert_array_equal(columns.diagonal(), path_kernel_diagonal(x, slopes, bias=bias).numpy())
    own = max_margin(columns, y)
    given = max_margin(columns, y, kernel_diag=path_kernel_diagonal(x, slopes, bias=bias).numpy())
    np.testing.assert_array_equal(own.alpha_, given.alpha_)
    dense = max_margin(path_kernel(x, slopes, bias=bias), y)
    np.testing.assert_array_equal(own.support_, dense.support_)
    np.testing.assert_allclose(own.alpha_, dense.alpha_, rtol=1e-9, atol=1e-9 * dense.alpha_.max())


def test_adapters_give_the_same_signed_columns_rows_and_kernel_columns():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((30, 40))
    kernel = a @ a.T
    y = np.where(rng.random(30) < 0.5, -1.0, 1.0)
    idx = np.array([4, 0, 29, 4])
    expected = kernel[:, idx] * y[:, None] * y[idx][None, :] / 2.5
    wrapped = [as_kernel_columns(kernel)[0], as_kernel_columns(kernel, tensor=True)[0],
               as_kernel_columns(torch.from_numpy(kernel), tensor=True)[0],
               as_kernel_columns(lambda i: kernel[:, i], np.diag(kernel))[0],
               as_kernel_columns(lambda i: torch.from_numpy(kernel[:, i]), np.diag(kernel))[0]]
    assert [type(w) for w in wrapped] == [DenseColumns, DenseTensorColumns, DenseTensorColumns, CallableColumns,
                                          CallableColumns]
    for columns in wrapped:
        np.testing.assert_array_equal(columns.diagonal(), np.diag(kernel))
        np.testing.assert_array_equal(np.asarray(columns.columns(idx)), kernel[:, idx])
        signed = columns.signed_columns(idx, y, 2.5)
        assert signed.flags.f_contiguous and signed.dtype == np.float64
        np.testing.assert_allclose(signed, expected, rtol=1e-15)
        np.testing.assert_allclose(columns.signed_rows(idx, y, 2.5).T.numpy(), expected, rtol=1e-15)
    provider = wrapped[0]
    assert as_kernel_columns(provider)[0] is provider  # a provider is not wrapped again
    with pytest.raises(NotImplementedError, match="offers no signed_block"):
        provider.signed_block(idx, y, 2.5)


def test_a_provider_must_implement_the_protocol():
    class Partial(KernelColumns):
        def __len__(self):
            return 3

    with pytest.raises(TypeError, match="abstract"):
        Partial()


def test_options_are_validated_once_with_what_was_expected_what_came_and_how_to_fix_it():
    with pytest.raises(ValueError, match="`solver` can be auto, numpy, torch, got 'cuda': 'torch' solves on"):
        SolverOptions(solver="cuda")
    with pytest.raises(ValueError, match="`kernel` can be auto, dense, columns, got 'sparse': 'columns'"):
        SolverOptions(kernel="sparse")
    with pytest.raises(ValueError, match="`max_iter` must be a positive integer or None, got 0"):
        max_margin(np.eye(3), np.ones(3), max_iter=0)
    with pytest.raises(ValueError, match="`tol` must be finite and >= 0, got -1"):
        max_margin(np.eye(3), np.ones(3), tol=-1.0)
    with pytest.raises(ValueError, match="`C` must be positive, got 0"):
        max_margin(np.eye(3), np.ones(3), intercept=True, C=0.0)


@pytest.mark.parametrize("device, solver, expected_device, expected_solver", [
    ("cpu", "auto", "cpu", None), ("cpu", "numpy", "cpu", None), ("cpu", "torch", "cpu", "cpu"),
    ("cuda:1", "auto", "cuda:1", "cuda:1"), ("cuda:1", "numpy", "cuda:1", None), ("mps", "torch", "cpu", "cpu"),
    ("meta", "auto", "cpu", None),
])
def test_the_plan_decides_device_and_backend_in_one_place(device, solver, expected_device, expected_solver):
    decided = plan(SolverOptions(solver=solver), device)
    assert decided.device == torch.device(expected_device)
    assert decided.solver_device == (None if expected_solver is None else torch.device(expected_solver))
    assert decided.backend == ("numpy" if expected_solver is None else f"torch ({expected_solver})")
    assert not decided.dense and plan(SolverOptions(kernel="dense"), device).dense
    assert plan(SolverOptions(intercept=True), device).dense


def test_multiclass_says_when_it_cannot_honour_the_torch_solver():
    from lightning_nsv.analysis import multiclass_support_vectors
    from tests.analysis.test_multiclass import random_net as multiclass_net
    from tests.analysis.test_multiclass import self_labelled as multiclass_labelled

    net = multiclass_net((6, 5), 3, in_features=5, seed=3)
    x, y = multiclass_labelled(net, 60, seed=4)
    with pytest.warns(UserWarning, match="solver='torch' is not available for multi-class heads"):
        torch_run = multiclass_support_vectors(net, x, y, solver="torch")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plain = multiclass_support_vectors(net, x, y)
    np.testing.assert_array_equal(torch_run.svm.alpha_, plain.svm.alpha_)
    assert plan(SolverOptions(solver="auto"), "cuda:0", multiclass=True).solver_device is None
