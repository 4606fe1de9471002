"""Fast paths of the analysis against the dense reference, accuracy on near-degenerate data, and bad input."""
import warnings

import numpy as np
import pytest
import torch

from lightning_nsv.analysis import network_support_vectors
from lightning_nsv.errors import NonFiniteError
from lightning_nsv.kernel import (InputGramCache, PathKernelColumns, PathNetwork, forward_with_slopes, path_kernel,
                                  path_kernel_diagonal, signed_labels)
from lightning_nsv.solver import NotSeparableError, max_margin
from lightning_nsv.solver.protocol import KernelColumns
from tests.kernel.test_path_space import random_net
from tests.analysis.test_support_vectors import self_labelled


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("beta", [0.0, 0.1, -1.0])
def test_kernel_columns_equal_the_dense_kernel(bias, beta):
    net = random_net((5, 4, 3), in_features=6, beta=beta, bias=bias, gamma=1.0 if beta else 1.5, seed=2)
    x = torch.randn(80, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    _, layer_slopes = forward_with_slopes(net, x)
    dense = path_kernel(x, layer_slopes, bias=bias)
    columns = PathKernelColumns(x, layer_slopes, net.betas, net.gammas, bias=bias)
    idx = np.array([5, 0, 79, 5])
    np.testing.assert_allclose(columns.numpy(idx), dense[:, idx].numpy(), rtol=1e-14, atol=1e-14 * float(dense.max()))


@pytest.mark.parametrize("chunk_rows", [None, 7])
@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("bias, beta, gamma", [(False, 0.0, 1.0), (False, 0.0, 1.5), (True, 0.0, 1.0),
                                               (False, 0.1, 1.0), (True, -1.0, 1.0)])
def test_signed_solver_columns_equal_the_dense_kernel_and_leave_the_cache_intact(monkeypatch, bias, beta, gamma,
                                                                                  cached, chunk_rows):
    if chunk_rows:  # columns formed 7 samples at a time (the last chunk narrower): kept rows gathered per chunk
        monkeypatch.setattr("lightning_nsv.kernel.inputs.INPUT_CHUNK_BYTES", chunk_rows * 6 * 8)
    net = random_net((5, 4, 3), in_features=6, beta=beta, bias=bias, gamma=gamma, seed=2)
    x = torch.randn(80, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    _, layer_slopes = forward_with_slopes(net, x)
    dense = path_kernel(x, layer_slopes, bias=bias).numpy()
    cache = InputGramCache() if cached else None
    columns = PathKernelColumns(x, layer_slopes, net.betas, net.gammas, bias=bias, input_gram_cache=cache)
    y = np.where(np.random.default_rng(4).random(80) < 0.5, -1.0, 1.0)
    scale = 3.7
    # new rows (the cache's own block), the same rows again, some of them in another order and repeated, rows from
    # several blocks, one of them new, then one kept row among nine new ones (recomputed with them)
    for idx in (np.array([5, 0, 79]), np.array([5, 0, 79]), np.array([79, 5, 79]), np.array([79, 12, 5, 40, 0]),
                np.array([60, 61, 62, 63, 64, 65, 66, 67, 68, 12])):
        expected = dense[:, idx] * y[:, None] * y[idx][None, :] / scale
        got = columns.signed_columns(idx, y, scale)
        assert got.flags.f_contiguous and got.dtype == np.float64
        np.testing.assert_allclose(got, expected, rtol=1e-14, atol=1e-14 * np.abs(dense).max() / scale)
    if cached:
        held = cache.samples
        np.testing.assert_allclose(cache.rows(x, held).numpy(), (x[held] @ x.T).numpy(), rtol=1e-15, atol=1e-15)
        assert sorted(held.tolist()) == sorted([0, 5, 12, 40, 79, *range(60, 69)]) and cache.misses == 14
        assert len(cache) == 14  # sample 12, recomputed with the new rows, counts once


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("beta", [0.0, 0.1, -1.0])
def test_columns_path_gives_the_dense_solution(bias, beta):
    net = random_net((6, 5), in_features=5, beta=beta, bias=bias, seed=4)
    x, y = self_labelled(net, 400, seed=5)
    dense = network_support_vectors(net, x, y, kernel="dense").svm
    lazy = network_support_vectors(net, x, y, kernel="columns").svm
    assert lazy.method == dense.method == "active-set"
    np.testing.assert_array_equal(lazy.support_, dense.support_)
    np.testing.assert_allclose(lazy.alpha_, dense.alpha_, rtol=1e-9, atol=1e-9 * dense.alpha_.max())
    assert lazy.margin == pytest.approx(dense.margin, rel=1e-9)
    assert lazy.kkt_residual <= 1e-10 and dense.kkt_residual <= 1e-10


def test_warm_start_from_a_previous_support_gives_the_same_solution():
    net = random_net((6, 5), in_features=5, beta=0.0, bias=False, seed=6)
    x, y = self_labelled(net, 400, seed=7)
    cold = network_support_vectors(net, x, y).svm
    rng = np.random.default_rng(0)
    previous = np.union1d(cold.support_[rng.random(cold.n_support_) < 0.8], rng.choice(len(y), 20, replace=False))
    warm = network_support_vectors(net, x, y, initial=previous).svm
    np.testing.assert_array_equal(warm.support_, cold.support_)
    np.testing.assert_allclose(warm.alpha_, cold.alpha_, rtol=1e-9, atol=1e-9 * cold.alpha_.max())
    with pytest.raises(ValueError, match="`initial` must hold sample indices in \\[0, "):
        network_support_vectors(net, x, y, initial=[len(y)])
    with pytest.raises(ValueError, match="`initial` must hold integer sample indices, got \\[1.5\\]"):
        network_support_vectors(net, x, y, initial=[1.5])  # not truncated to sample 1
    np.testing.assert_array_equal(network_support_vectors(net, x, y, initial=np.array([3.0, 7.0])).svm.support_,
                                  cold.support_)


def a_network_and_a_nearby_one(beta, bias, step, seed):
    """A network, its weights moved by ``step``-sized noise ("a few more epochs"), and the samples the first labels
    that the second still classifies alike."""
    first = random_net((6, 5), in_features=5, beta=beta, bias=bias, seed=6)
    x, y = self_labelled(first, 400, seed=7)
    second = random_net((6, 5), in_features=5, beta=beta, bias=bias, seed=6)
    for w in second.weights:
        w.add_(step * torch.randn(w.shape, dtype=w.dtype, generator=torch.Generator().manual_seed(seed)))
    keep = torch.sign(forward_with_slopes(second, x)[0]) == torch.where(y > 0, 1.0, -1.0)
    return first, second, x[keep], y[keep]


@pytest.mark.parametrize("bias, beta", [(False, 0.0), (True, 0.1)])
def test_input_gram_cache_between_analyses_gives_the_cold_solution(bias, beta):
    first, second, x, y = a_network_and_a_nearby_one(beta, bias, step=0.01, seed=1)
    cache = InputGramCache()
    network_support_vectors(first, x, y, cache=cache)
    first_support = cache.samples.clone()
    assert len(cache) > 0 and cache.nbytes == 8 * len(x) * len(cache)
    np.testing.assert_allclose(cache.rows(x.double(), first_support).numpy(), (x[first_support] @ x.T).numpy(),
                               rtol=1e-14, atol=1e-14)
    misses = cache.misses
    warm = network_support_vectors(second, x, y, cache=cache).svm
    cold = network_support_vectors(second, x, y, kernel="dense").svm
    np.testing.assert_array_equal(warm.support_, cold.support_)
    np.testing.assert_allclose(warm.alpha_, cold.alpha_, rtol=1e-9, atol=1e-9 * cold.alpha_.max())
    assert warm.kkt_residual <= 1e-10
    assert cache.misses - misses < len(first_support)  # most rows came from the cache
    np.testing.assert_array_equal(np.sort(cache.samples.numpy()), warm.support_)
    # other inputs empty the cache instead of reusing its rows
    shifted = x + 1e-3
    assert not cache.attach(shifted) and len(cache) == 0


@pytest.mark.parametrize("explicit", [False, True])
def test_a_warm_start_reads_the_previous_support_from_the_cache(monkeypatch, explicit):
    """The previous support (given as ``initial`` in any order, or taken from the cache) is fetched in the order of
    the cache's rows, which serves it as its own block (read in place, none computed again); the cold solution."""
    net = random_net((6, 5), in_features=5, beta=0.0, bias=False, seed=6)
    x, y = self_labelled(net, 400, seed=7)
    cache = InputGramCache()
    first = network_support_vectors(net, x, y, cache=cache).svm
    cache.keep(torch.from_numpy(first.support_[::-1].copy()))  # rows kept in another order than the indices
    served = []
    row_sources = InputGramCache.row_sources

    def recording(self, chunks, idx):
        misses = self.misses
        sources = row_sources(self, chunks, idx)
        served.append(self.misses == misses and len(sources) == 1 and sources[0][2] is None)
        return sources

    monkeypatch.setattr(InputGramCache, "row_sources", recording)
    initial = np.random.default_rng(0).permutation(first.support_) if explicit else None
    warm = network_support_vectors(net, x, y, cache=cache, initial=initial).svm
    assert served[0]  # the whole previous support, straight from the cache's block
    np.testing.assert_array_equal(warm.support_, first.support_)
    np.testing.assert_allclose(warm.alpha_, first.alpha_, rtol=1e-9, atol=1e-9 * first.alpha_.max())
    assert warm.iterations <= 2


@pytest.mark.parametrize("compact_rows", [2, 64])
def test_keep_compacts_the_rows_in_the_first_blocks_memory_when_they_fill_half_of_it(monkeypatch, compact_rows):
    monkeypatch.setattr("lightning_nsv.kernel.gram_cache.COMPACT_ROWS", compact_rows)  # 2: chunks, some rows in place
    x = torch.randn(60, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    gram = x @ x.T
    cache = InputGramCache()
    cache.attach(x)
    first = torch.tensor([3, 8, 14, 20, 27, 33, 41, 45, 50, 58])
    cache.rows(x, first)
    cache.keep(first)  # one block of 10 rows
    memory = cache._blocks[0].data_ptr()
    cache.rows(x, torch.tensor([1, 2, 44]))  # a second block
    kept = torch.tensor([44, 3, 8, 20, 33, 41, 50, 58, 1])  # rows 0, 1 stay where they are, the rest move up
    cache.keep(kept)
    assert len(cache) == 9 and cache._blocks[0].data_ptr() == memory  # the first block's memory, 9 of its 10 rows
    assert cache.nbytes == 10 * 60 * 8  # the memory it holds
    samples = cache.samples
    assert samples.tolist() == [3, 8, 20, 33, 41, 50, 58, 1, 44]  # the first block's rows first, then the others
    np.testing.assert_allclose(cache.rows(x, samples).numpy(), gram[samples].numpy(), rtol=0, atol=1e-13)
    hits = cache.hits
    cache.rows(x, samples)
    assert cache.hits == hits + 9
    for few in (torch.tensor([3, 8]), torch.tensor([]).long()):  # under half of the block: new memory, or none
        cache.keep(few)
        assert len(cache) == len(few) and cache.nbytes == 8 * 60 * len(few)
        if len(few):
            np.testing.assert_allclose(cache.rows(x, few).numpy(), gram[few].numpy(), rtol=0, atol=1e-13)


def test_in_slot_order_puts_kept_samples_first_in_row_order():
    x = torch.randn(10, 3, dtype=torch.float64)
    cache = InputGramCache()
    assert list(cache.in_slot_order(np.array([3, 1]))) == [3, 1]  # nothing kept yet
    cache.attach(x)
    cache.rows(x, torch.tensor([7, 2, 5]))
    assert list(cache.in_slot_order(np.array([5, 0, 2, 9, 7]))) == [7, 2, 5, 0, 9]
    assert list(cache.in_slot_order(np.array([4, 10]))) == [4, 10]  # out of range: left to the solver's check


def test_zero_one_and_signed_labels_give_identical_results():
    net = random_net((4, 3), in_features=4, beta=0.1, seed=8)
    x, y01 = self_labelled(net, 200, seed=9)
    a = network_support_vectors(net, x, y01).svm
    b = network_support_vectors(net, x, 2 * y01 - 1).svm
    np.testing.assert_array_equal(a.alpha_, b.alpha_)


def test_near_degenerate_data_reach_kkt_without_warnings():
    net = random_net((8, 6), in_features=6, beta=0.0, bias=False, seed=10)
    x, y = self_labelled(net, 300, seed=11)
    noise = 1e-9 * torch.randn(x.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(12))
    x2, y2 = torch.cat([x, x + noise, x - noise]), torch.cat([y, y, y])
    assert bool((signed_labels(y2) * forward_with_slopes(net, x2)[0] > 0).all())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dense = network_support_vectors(net, x2, y2, kernel="dense").svm
        lazy = network_support_vectors(net, x2, y2, kernel="columns").svm
    assert dense.kkt_residual <= 1e-10 and lazy.kkt_residual <= 1e-10
    assert lazy.margin == pytest.approx(dense.margin, rel=1e-9)


def test_non_finite_network_and_data_are_named():
    net = random_net((3, 2), in_features=3, bias=True, seed=0)
    x, y = self_labelled(net, 30, seed=1)
    bad_weights = list(net.weights)
    bad_weights[1] = bad_weights[1].clone()
    bad_weights[1][0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match="weights\\[1\\] holds NaN: the network has diverged"):
        network_support_vectors(PathNetwork(tuple(bad_weights), net.biases, net.betas, net.gammas), x, y)
    bad_biases = list(net.biases)
    bad_biases[0] = torch.full_like(bad_biases[0], float("inf"))
    with pytest.raises(NonFiniteError, match="biases\\[0\\] holds inf"):
        network_support_vectors(PathNetwork(net.weights, tuple(bad_biases), net.betas, net.gammas), x, y)
    x_bad = x.clone()
    x_bad[7, 1] = float("nan")
    with pytest.raises(NonFiniteError, match="training inputs are not finite at sample 7 .*data hold NaN or inf"):
        network_support_vectors(net, x_bad, y)
    huge = PathNetwork(tuple(w * 1e120 for w in net.weights), None, net.betas, net.gammas)
    with pytest.raises(NonFiniteError, match="network outputs are not finite at sample 0 .*diverged"):
        network_support_vectors(huge, x, y)
    assert issubclass(NonFiniteError, ValueError)


def test_nan_sample_reaching_max_margin_is_named():
    kernel = np.eye(4) + 0.1
    kernel[2, 2] = np.nan
    with pytest.raises(ValueError, match="kernel diagonal is NaN or inf at sample 2"):
        max_margin(kernel, np.array([1, -1, 1, -1]))
    columns = lambda idx: np.where(np.arange(4)[:, None] == 3, np.nan, (np.eye(4) + 0.1)[:, idx])  # noqa: E731
    with pytest.raises(ValueError, match="kernel columns hold NaN or inf in row 3"):
        max_margin(columns, np.array([1, -1, 1, -1]), kernel_diag=np.full(4, 1.1))


def test_dense_kernel_that_cannot_fit_is_refused_before_allocating():
    net = random_net((3,), in_features=3, seed=0)
    x, y = self_labelled(net, 50, seed=1)
    with pytest.raises(ValueError, match="needs 0.0 GB for m=50, above max_dense_bytes=100; .*use intercept=False with kernel='columns'"):
        network_support_vectors(net, x, y, kernel="auto", intercept=True, max_dense_bytes=100)
    with pytest.raises(ValueError, match="`max_dense_bytes` must be at least 1, got 0"):
        network_support_vectors(net, x, y, max_dense_bytes=0)
    from lightning_nsv import memory

    original = memory.available_memory_bytes
    memory.available_memory_bytes = lambda: 1000
    try:
        with pytest.raises(ValueError, match="more than the 0.0 GB of memory available; use kernel='columns'"):
            network_support_vectors(net, x, y, kernel="dense")
    finally:
        memory.available_memory_bytes = original


def test_dense_kernel_on_cuda_must_fit_in_its_free_memory(monkeypatch):
    from lightning_nsv.analysis.checks import check_dense_fits

    monkeypatch.setattr("lightning_nsv.memory.available_memory_bytes", lambda: 100 * 10**9)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2 * 10**9, 80 * 10**9))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 5 * 10**8)  # held by torch, unused
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 0)
    check_dense_fits(2 * 10**9, 16_000, None, False, torch.device("cuda:0"))  # fits in free + unused reserved
    with pytest.raises(ValueError, match=r"needs 3.0 GB for m=19,000, more than the 2.5 GB free on cuda:0; use "
                                         r"kernel='columns'"):
        check_dense_fits(3 * 10**9, 19_000, None, False, torch.device("cuda:0"))
    check_dense_fits(3 * 10**9, 19_000, None, False)  # on the CPU the host's memory counts


def test_labels_intercept_and_duplicates_are_refused_clearly():
    net = random_net((3,), in_features=3, seed=0)
    x, y = self_labelled(net, 30, seed=1)
    with pytest.raises(ValueError, match="binary labels must be 0/1 or -1/\\+1, got values \\[0.0, 0.5, 1.0\\]"):
        signed_labels(torch.tensor([0.0, 0.5, 1.0]))
    positive = forward_with_slopes(net, x)[0] > 0
    with pytest.raises(ValueError, match=r"every training label is positive \(1\): with one class"):
        network_support_vectors(net, x[positive], torch.ones(int(positive.sum())), intercept=True)
    x_dup, y_dup = torch.cat([x, x[:1]]), torch.cat([y, 1 - y[:1]])
    with pytest.raises(NotSeparableError, match=f"samples 0 and {len(y)} have the same input and opposite labels"):
        network_support_vectors(net, x_dup, y_dup)
    with pytest.raises(ValueError, match="x_train holds no samples"):
        network_support_vectors(net, x[:0], y[:0])
    with pytest.raises(ValueError, match="x_val holds no samples: pass x_val=None"):
        network_support_vectors(net, x, y, x[:0], y[:0])


def test_solver_on_duplicates_with_opposite_labels_says_not_separable():
    x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    with pytest.raises(NotSeparableError, match="not separable through the origin"):
        max_margin(x @ x.T, np.array([1, 1, -1]))


@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("bias, beta", [(False, 0.0), (True, 0.1)])
def test_the_converted_copy_leaves_out_features_zero_in_every_sample(bias, beta, cached):
    """Features zero in every training sample (an image's border) are left out of the float64 copy; the columns,
    blocks and shards of rows equal the dense kernel's, with and without an input-Gram cache."""
    from lightning_nsv.kernel import inputs

    rng = torch.Generator().manual_seed(7)
    x32 = torch.rand(60, 9, generator=rng)
    x32[:, [0, 4, 8]] = 0.0  # never lit
    x32[torch.rand(60, generator=rng) < 0.5, 5] = 0.0  # lit in some samples only: kept
    net = random_net((5, 4), in_features=9, beta=beta, bias=bias, seed=3)
    slopes = forward_with_slopes(net, x32)[1]
    dense = path_kernel(x32.double(), slopes, bias=bias).numpy()
    columns = PathKernelColumns(x32, slopes, net.betas, net.gammas, bias=bias,
                                input_gram_cache=InputGramCache() if cached else None, dtype=torch.float64)
    torch.testing.assert_close(columns._chunks.x, x32[:, [1, 2, 3, 5, 6, 7]].double(), rtol=0, atol=0)
    y = np.where(np.random.default_rng(1).random(60) < 0.5, -1.0, 1.0)
    scale = np.abs(dense).max()
    for idx in (np.array([4, 0, 59]), np.array([59, 12, 4, 33, 0, 7])):
        expected = dense * y[:, None] * y[None, :] / 2.0
        np.testing.assert_allclose(columns.signed_columns(idx, y, 2.0), expected[:, idx], rtol=1e-14,
                                   atol=1e-14 * scale)
        np.testing.assert_allclose(columns.signed_block(idx, y, 2.0), expected[np.ix_(idx, idx)], rtol=1e-14,
                                   atol=1e-14 * scale)
        np.testing.assert_allclose(columns.signed_rows(idx, y, 2.0, part=slice(10, 25)).numpy(),
                                   expected[10:25, idx].T, rtol=1e-14, atol=1e-14 * scale)
    few = x32.clone()
    few[:, [0, 4, 8]] = 1.0  # no feature is zero everywhere: no copy of a subset
    assert inputs.used_features(few) is few
    assert inputs.used_features(torch.zeros(3, 4)).shape == (3, 4)  # nothing lit: left as is
    x64 = x32.double()  # float64 inputs are not copied, so keep their width
    kept = PathKernelColumns(x64, slopes, net.betas, net.gammas, bias=bias)._chunks.x
    assert kept.data_ptr() == x64.data_ptr() and kept.shape == x64.shape


@pytest.mark.parametrize("copied", [False, True])
@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("bias, beta", [(False, 0.0), (True, 0.1)])
def test_float32_inputs_are_converted_in_chunks_exactly(monkeypatch, bias, beta, cached, copied):
    """Narrower inputs stay as given (above INPUT_COPY_BYTES no float64 copy of the training set): every chunk of
    rows is converted exactly, so the columns and the diagonal equal those of the float64 inputs."""
    from lightning_nsv.kernel import inputs

    monkeypatch.setattr("lightning_nsv.kernel.inputs.INPUT_CHUNK_BYTES", 7 * 6 * 8)  # chunks of 7 rows: many, one of them short
    monkeypatch.setattr("lightning_nsv.kernel.columns.INPUT_COPY_BYTES", 80 * 6 * 8 if copied else 80 * 6 * 8 - 1)
    net = random_net((5, 4), in_features=6, beta=beta, bias=bias, seed=2)
    x32 = torch.randn(80, 6, generator=torch.Generator().manual_seed(3))
    x64 = x32.double()
    outputs, layer_slopes = forward_with_slopes(net, x32)  # in chunks of 7 rows
    outputs64, slopes64 = forward_with_slopes(net, x64)
    np.testing.assert_allclose(outputs.numpy(), outputs64.numpy(), rtol=1e-13, atol=1e-13)
    assert all(torch.equal(a, b) for a, b in zip(layer_slopes, slopes64)) and len(outputs) == 80
    projection = inputs.random_projection(x32, torch.Generator().manual_seed(0))
    np.testing.assert_allclose(projection.numpy(), inputs.random_projection(x64, torch.Generator().manual_seed(0)).numpy(),
                               rtol=1e-13, atol=1e-13)
    dense = path_kernel(x64, layer_slopes, bias=bias).numpy()
    cache = InputGramCache() if cached else None
    columns = PathKernelColumns(x32, layer_slopes, net.betas, net.gammas, bias=bias, input_gram_cache=cache,
                                dtype=torch.float64)
    assert columns.x.dtype == torch.float32 and columns.x.data_ptr() == x32.data_ptr() and columns._chunks.step == 7
    assert columns._chunks.x.dtype == (torch.float64 if copied else torch.float32)
    y = np.where(np.random.default_rng(4).random(80) < 0.5, -1.0, 1.0)
    for idx in (np.array([5, 0, 79]), np.array([79, 12, 5, 40, 0])):
        got = columns.signed_columns(idx, y, 2.0)
        np.testing.assert_allclose(got, dense[:, idx] * y[:, None] * y[idx][None, :] / 2.0, rtol=1e-14,
                                   atol=1e-14 * np.abs(dense).max())
    part = slice(9, 30)  # a shard of rows, as DDP ranks compute it
    np.testing.assert_allclose(columns.signed_rows(np.array([3, 4]), y, 1.0, part=part).numpy(),
                               (dense[part, [3, 4]] * y[part, None] * y[[3, 4]][None, :]).T, rtol=1e-14,
                               atol=1e-14 * np.abs(dense).max())
    np.testing.assert_allclose(path_kernel_diagonal(x32, layer_slopes, bias=bias).numpy(), np.diag(dense),
                               rtol=1e-15)
    with pytest.raises(ValueError, match="`part` must be a range of consecutive samples, got a step of 2"):
        columns.signed_rows(np.array([3]), y, 1.0, part=slice(0, 40, 2))
    assert columns.signed_rows(torch.tensor([3]), torch.from_numpy(y), 1.0, part=slice(30, 20)).shape == (1, 0)
    assert path_kernel_diagonal(x64, [s.float() for s in layer_slopes], bias=bias).dtype == torch.float64
    no_hidden = path_kernel_diagonal(x32, [], dtype=torch.float64)  # a linear network: no slopes
    assert no_hidden.dtype == torch.float64 and torch.equal(no_hidden, (x64 * x64).sum(1))
    with pytest.raises(ValueError, match="not exact in the analysis dtype torch.float32"):
        PathKernelColumns(x64, layer_slopes, net.betas, net.gammas, dtype=torch.float32)


def test_float32_inputs_give_the_float64_analysis(monkeypatch):
    monkeypatch.setattr("lightning_nsv.kernel.inputs.INPUT_CHUNK_BYTES", 50 * 5 * 8)
    net = random_net((6, 5), in_features=5, beta=0.0, bias=False, seed=4)
    x, y = self_labelled(net, 400, seed=5)
    x32 = x.float()
    keep = torch.sign(forward_with_slopes(net, x32)[0]) == torch.where(y > 0, 1.0, -1.0)
    x32, y = x32[keep], y[keep]
    reference = network_support_vectors(net, x32.double(), y, kernel="dense").svm
    cache = InputGramCache()
    for kernel in ("dense", "columns"):
        got = network_support_vectors(net, x32, y, kernel=kernel, cache=cache if kernel == "columns" else None).svm
        np.testing.assert_array_equal(got.support_, reference.support_)
        np.testing.assert_allclose(got.alpha_, reference.alpha_, rtol=1e-9, atol=1e-9 * reference.alpha_.max())
        assert got.kkt_residual <= 1e-10
    held = cache.samples
    assert cache.nbytes == 8 * len(y) * len(cache)  # float64 rows of float32 inputs
    expected = (x32[held].double() @ x32.double().T).numpy()
    for rows in (cache.rows(x32, held, torch.float64), cache.rows(x32, held)):  # default: the attached dtype
        assert rows.dtype == torch.float64
        np.testing.assert_allclose(rows.numpy(), expected, rtol=1e-15, atol=1e-15)
    with pytest.raises(ValueError, match="the cache holds rows in torch.float64, asked for torch.float32"):
        cache.rows(x32, held, torch.float32)
    np.testing.assert_allclose(cache.rows(x32, held).numpy(), expected, rtol=1e-15, atol=1e-15)  # left intact


def test_finite_check_passes_overflowing_sums_and_names_every_kind_of_bad_value():
    from lightning_nsv.analysis.checks import check_finite_samples

    check_finite_samples(torch.full((3, 4), 3e38), "training inputs")  # finite values whose float32 sum overflows
    for bad in (float("nan"), float("inf"), -float("inf")):
        x = torch.full((3, 4), 3e38)
        x[2, 1] = bad
        with pytest.raises(NonFiniteError, match="training inputs are not finite at sample 2 \\(1 samples in all\\)"):
            check_finite_samples(x, "training inputs")
    x = torch.zeros(5, 2, dtype=torch.float64)
    x[1, 0], x[3, 1] = float("inf"), -float("inf")  # their sum is NaN
    with pytest.raises(NonFiniteError, match="at sample 1 \\(2 samples in all\\)"):
        check_finite_samples(x, "training inputs")


def test_gram_among_reads_the_input_gram_of_kept_samples_from_several_blocks():
    x = torch.randn(50, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    cache = InputGramCache()
    cache.attach(x)
    cache.rows(x, torch.tensor([3, 7, 11]))
    cache.rows(x, torch.tensor([20, 1, 44, 7]))  # a second block (7 is served from the first)
    hits, misses = cache.hits, cache.misses
    samples = torch.tensor([44, 3, 1, 11, 20, 7])
    np.testing.assert_allclose(cache.gram_among(samples).numpy(), (x[samples] @ x[samples].T).numpy(),
                               rtol=1e-15, atol=1e-15)
    assert (cache.hits, cache.misses) == (hits, misses)
    with pytest.raises(ValueError, match="kept rows of every sample"):
        cache.gram_among(torch.tensor([3, 5]))


@pytest.mark.parametrize("bias, beta", [(False, 0.0), (True, 0.1)])
def test_pruned_support_is_the_support_of_the_previous_supports_own_problem(monkeypatch, bias, beta):
    from lightning_nsv.analysis import warm_start as sv

    net = random_net((6, 5), in_features=5, beta=beta, bias=bias, seed=6)
    x, y = self_labelled(net, 400, seed=7)
    x = x.double()
    signs = signed_labels(y)
    slopes = forward_with_slopes(net, x)[1]
    previous = torch.from_numpy(np.random.default_rng(1).choice(len(x), 120, replace=False))
    expected = max_margin(path_kernel(x[previous], [s[previous] for s in slopes], bias=bias), signs[previous])
    cache = InputGramCache()
    cache.attach(x)
    cache.rows(x, previous)
    for kept in (sv.pruned_support(net, x, slopes, signs, previous),
                 sv.pruned_support(net, x, slopes, signs, previous, cache=cache)):
        np.testing.assert_array_equal(kept, previous.numpy()[expected.support_])
        assert 0 < len(kept) < len(previous)
    monkeypatch.setattr(sv, "PRUNE_MAX_BYTES", 8 * 120 * 120 - 1)  # too large a sub-problem: no pruning
    np.testing.assert_array_equal(sv.pruned_support(net, x, slopes, signs, previous), previous.numpy())
    monkeypatch.setattr(sv, "PRUNE_MAX_BYTES", 8 * 120 * 120)

    def failing(*args, **kwargs):
        raise NotSeparableError("the sub-problem failed")

    monkeypatch.setattr(sv, "max_margin", failing)  # a failed sub-problem: the previous support as it was
    np.testing.assert_array_equal(sv.pruned_support(net, x, slopes, signs, previous, cache=cache), previous.numpy())


@pytest.mark.parametrize("solver", ["numpy", "torch"])
def test_a_warm_start_admits_the_previous_support(monkeypatch, solver):
    """The numpy solver admits the whole previous support (candidates from ``Q[F ∪ new, new]``: the members it drops
    never have full columns formed); the torch solver, which forms every admitted member's full column, admits only
    the members the new network still needs. The solution is the cold one either way."""
    from lightning_nsv.analysis import binary as sv

    first, second, x, y = a_network_and_a_nearby_one(0.0, False, step=0.05, seed=2)
    cache = InputGramCache()
    network_support_vectors(first, x, y, cache=cache)
    previous = cache.samples.clone()
    admitted = []
    active_set = sv.max_margin

    def recording(kernel, labels, **kwargs):
        if callable(kernel):  # the whole problem (the sub-problem's kernel is a dense tensor)
            admitted.append(np.asarray(kwargs["initial"]))
        return active_set(kernel, labels, **kwargs)

    monkeypatch.setattr(sv, "max_margin", recording)
    warm = network_support_vectors(second, x, y, cache=cache, solver=solver).svm
    cold = network_support_vectors(second, x, y, kernel="dense").svm
    np.testing.assert_array_equal(warm.support_, cold.support_)
    np.testing.assert_allclose(warm.alpha_, cold.alpha_, rtol=1e-9, atol=1e-9 * cold.alpha_.max())
    assert not set(previous.tolist()) <= set(cold.support_.tolist())  # some previous members are no longer needed
    if solver == "numpy":
        assert sorted(admitted[0].tolist()) == sorted(previous.tolist())
    else:
        assert set(admitted[0]) < set(previous.tolist())  # pruned: a proper subset


@pytest.mark.parametrize("bias, beta", [(True, -1.0), (True, 0.1), (False, 0.0)])
def test_float32_columns_take_full_fetches_and_keep_duplicates_out(monkeypatch, bias, beta):
    """A float32 network's columns and a block of them round apart by about 1e-7, enough for a duplicate of a member
    to pass for an independent sample: the solver then fetches full columns (no ``signed_block``), and no duplicate
    pair ends in the free set, without a KKT warning."""
    import lightning_nsv.solver.factor as max_margin_module

    blocks, free_sets = [], []
    original_block, original_init = PathKernelColumns.signed_block, max_margin_module.NumpyFreeSet.__init__
    monkeypatch.setattr(PathKernelColumns, "signed_block",
                        lambda self, *args: (blocks.append(1), original_block(self, *args))[1])
    monkeypatch.setattr(max_margin_module.NumpyFreeSet, "__init__",
                        lambda self, store: (original_init(self, store), free_sets.append(self))[0])
    for seed in range(3):
        net64 = random_net((6, 5), in_features=5, beta=beta, bias=bias, seed=4 + seed)
        net = PathNetwork(tuple(w.float() for w in net64.weights),
                          None if net64.biases is None else tuple(b.float() for b in net64.biases),
                          net64.betas, net64.gammas)
        x, y = self_labelled(net64, 300, seed=5 + seed)
        x = x.reshape(len(x), -1).float()
        right = torch.sign(forward_with_slopes(net, x)[0]) == torch.where(y > 0, 1.0, -1.0)
        x, y = x[right], y[right]
        m = len(y)
        x, y = torch.cat([x, x[:15]]), torch.cat([y, y[:15]])  # samples m.. repeat samples 0..14
        free_sets.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            svm = network_support_vectors(net, x, y, kernel="columns").svm
        members = set(free_sets[0].index)
        assert not any(k in members and m + k in members for k in range(15))
        assert svm.kkt_residual <= 1e-10
    assert not blocks
    x64 = torch.randn(40, 5, dtype=torch.float64)
    net64 = random_net((6, 5), in_features=5, beta=beta, bias=bias, seed=1)
    columns = PathKernelColumns(x64, forward_with_slopes(net64, x64)[1], net64.betas, net64.gammas, bias=bias)
    assert columns.signed_block(np.zeros(0, dtype=np.int64), np.ones(40), 1.0).shape == (0, 0)
    cached = PathKernelColumns(x64, forward_with_slopes(net64, x64)[1], net64.betas, net64.gammas, bias=bias,
                               input_gram_cache=InputGramCache())  # attached, nothing kept yet
    assert cached.signed_block(np.zeros(0, dtype=np.int64), np.ones(40), 1.0).shape == (0, 0)


@pytest.mark.parametrize("bias, beta, warm", [(False, 0.0, False), (True, 0.1, False), (False, 0.0, True)])
def test_compactions_in_place_and_panelled_downdates_leave_the_solution(monkeypatch, bias, beta, warm):
    """Dead columns dropped at every chance from the kernel columns' own blocks (shrunk in place) and downdates
    in panels of 3 rows: the dense solve's support and α, cold and warm started."""
    import lightning_nsv.solver.column_store as max_margin_module
    from lightning_nsv.solver import factor

    first, second, x, y = a_network_and_a_nearby_one(beta, bias, step=0.05, seed=3)
    cache = InputGramCache() if warm else None
    if warm:
        network_support_vectors(first, x, y, cache=cache)
    reference = network_support_vectors(second, x, y, kernel="dense").svm
    shrunk = []
    original = max_margin_module.ColumnStore._without_dead
    monkeypatch.setattr(max_margin_module.ColumnStore, "_without_dead",
                        lambda store, b, columns: shrunk.append(store._blocks[b].base is not None)
                        or original(store, b, columns))
    monkeypatch.setattr(max_margin_module, "DEAD_COLUMNS_MIN", 1)
    monkeypatch.setattr(max_margin_module, "DEAD_BYTES_MIN", 0)
    monkeypatch.setattr(max_margin_module, "DEAD_COLUMNS_SHARE", 10 ** 6)
    monkeypatch.setattr(factor, "REMOVE_COLUMNS", 3)
    svm = network_support_vectors(second, x, y, kernel="columns", cache=cache).svm
    np.testing.assert_array_equal(svm.support_, reference.support_)
    np.testing.assert_allclose(svm.alpha_, reference.alpha_, rtol=1e-8, atol=1e-8 * reference.alpha_.max())
    assert svm.kkt_residual <= 1e-10
    if not warm:  # (the warm start's dropped members were admitted lazily: no column of theirs was stored)
        assert shrunk and any(shrunk)  # blocks of PathKernelColumns' own rows were compacted


@pytest.mark.parametrize("bias, beta, cached", [(False, 0.0, False), (True, 0.1, False), (False, 0.0, True)])
def test_lazy_candidates_give_the_solution_of_full_columns_with_fewer_columns(bias, beta, cached):
    """The solver fetches candidates through ``signed_block`` and forms full columns only for those the descent
    keeps: the same support and α as full columns for every candidate, and fewer columns formed."""
    net = random_net((6, 5), in_features=5, beta=beta, bias=bias, seed=4)
    x, y = self_labelled(net, 400, seed=5)
    x = x.reshape(len(x), -1).to(torch.float64)
    signs = signed_labels(y).numpy()
    slopes = forward_with_slopes(net, x)[1]

    class Counted(KernelColumns):
        """A provider of the protocol that counts the full columns asked of it; ``lazy``: it offers blocks too."""

        def __init__(self, lazy):
            self.columns_ = PathKernelColumns(x, slopes, net.betas, net.gammas, bias=bias,
                                              input_gram_cache=InputGramCache() if cached else None)
            self.asked = 0
            self.offers_block = lazy

        def __len__(self):
            return len(self.columns_)

        dtype = property(lambda self: self.columns_.dtype)
        device = property(lambda self: self.columns_.device)

        def diagonal(self):
            return self.columns_.diagonal()

        def columns(self, idx):
            return self.columns_.columns(idx)

        def signed_columns(self, idx, s, scale):
            self.asked += len(idx)
            return self.columns_.signed_columns(idx, s, scale)

        def signed_block(self, idx, s, scale):
            return self.columns_.signed_block(idx, s, scale)

    diag = np.diag(path_kernel(x, slopes, bias=bias).numpy())
    full, lazy = Counted(False), Counted(True)
    reference = max_margin(full, signs, kernel_diag=diag)
    result = max_margin(lazy, signs, kernel_diag=diag)
    np.testing.assert_array_equal(result.support_, reference.support_)
    np.testing.assert_allclose(result.alpha_, reference.alpha_, rtol=1e-9, atol=1e-9 * reference.alpha_.max())
    assert result.kkt_residual <= 1e-10
    assert 0 < lazy.asked < full.asked
    dense = max_margin(path_kernel(x, slopes, bias=bias), signs)
    np.testing.assert_array_equal(result.support_, dense.support_)


@pytest.mark.parametrize("solver, dtype, whole", [("numpy", torch.float64, True), ("torch", torch.float64, False),
                                                 ("numpy", torch.float32, False)])
def test_a_cold_start_admits_its_guess_whole_where_candidates_are_admitted_lazily(monkeypatch, solver, dtype, whole):
    """The cold start's guess (the smallest network margins) is admitted as one block where the solver admits
    candidates lazily (numpy, float64 blocks: members the descent drops at once never have full columns formed),
    else ⌊√m⌋ at a time; the solution is the dense one either way."""
    import math

    from lightning_nsv.analysis import binary as sv
    from lightning_nsv.analysis.warm_start import INITIAL_MARGINS

    net = random_net((6, 5), in_features=5, beta=0.0, bias=False, seed=4)
    x, y = self_labelled(net, 400, seed=5)
    if dtype == torch.float32:
        net = PathNetwork(tuple(w.float() for w in net.weights), None, net.betas, net.gammas)
        x = x.float()
        right = torch.sign(forward_with_slopes(net, x)[0]) == signed_labels(y)
        x, y = x[right], y[right]
    calls = []
    original = sv.max_margin

    def recording(kernel, labels, **kwargs):
        calls.append(kwargs)
        return original(kernel, labels, **kwargs)

    monkeypatch.setattr(sv, "max_margin", recording)
    svm = network_support_vectors(net, x, y, kernel="columns", solver=solver).svm
    guess = calls[0]["initial"]
    assert len(guess) == INITIAL_MARGINS * int(math.sqrt(len(y)))
    assert calls[0]["initial_block"] == (len(guess) if whole else None)
    monkeypatch.setattr(sv, "max_margin", original)
    reference = network_support_vectors(net, x, y, kernel="dense").svm
    np.testing.assert_array_equal(svm.support_, reference.support_)
    tol = 1e-4 if dtype == torch.float32 else 1e-9  # float32 columns and the float32 dense kernel round apart
    np.testing.assert_allclose(svm.alpha_, reference.alpha_, rtol=tol, atol=tol * reference.alpha_.max())


def test_admits_lazily_only_on_the_cpu_solver_with_float64_blocks():
    from lightning_nsv.solver.column_store import admits_lazily

    x = torch.randn(30, 5, dtype=torch.float64)
    net = random_net((6, 5), in_features=5, beta=0.0, bias=False, seed=1)
    slopes = forward_with_slopes(net, x)[1]
    columns = PathKernelColumns(x, slopes, net.betas, net.gammas)
    assert admits_lazily(columns)
    assert not admits_lazily(columns, torch.device("cpu"))  # the torch solver forms full columns on admission
    assert not admits_lazily(PathKernelColumns(x.float(), slopes, net.betas, net.gammas, dtype=torch.float32))
