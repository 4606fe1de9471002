"""The written protocols beneath ``KernelColumns``: every column store and batch of candidates satisfies its protocol
and its contract (shapes, dtypes, where tensors live), and a store written only against the protocol drives the
active-set solver to the solution of the real one."""
import numpy as np
import pytest
import torch

from lightning_nsv.solver import max_margin, pair_max_margin
from lightning_nsv.solver.active_set import active_set
from lightning_nsv.solver.column_store import (
    ColumnStore,
    DeviceColumnStore,
    DeviceFullColumns,
    FullColumns,
    LazyColumns,
)
from lightning_nsv.solver.factor import FreeSet, NumpyFreeSet, TorchFreeSet
from lightning_nsv.solver.pair_store import PairColumns, PairStore, SampleRows
from lightning_nsv.solver.protocol import DenseColumns, KernelColumns
from lightning_nsv.solver.store_protocol import Candidates, DeviceStore, Store, StoredCandidates
from tests.solver.test_max_margin import assert_the_classifier_of_scikit_learn, enumerate_kkt, separable

M = 40


def _q(rng, m=M):
    """A full-rank ``Q`` with labels folded in (symmetric, positive definite)."""
    a = rng.standard_normal((m, 2 * m))
    return a @ a.T / (2 * m)


def _pair_q(kernel, labels, num_classes, scale):
    """``Q`` of the pair problem, formed densely: ``K(x_i, x_j) <d_p, d_q> / scale``, ``d_p = e_{y_i} − e_k``."""
    pairs = [(i, k) for i in range(len(labels)) for k in range(num_classes) if k != labels[i]]
    d = np.zeros((len(pairs), num_classes))
    for p, (i, k) in enumerate(pairs):
        d[p, labels[i]], d[p, k] = 1.0, -1.0
    samples = np.array([i for i, _ in pairs])
    return kernel[np.ix_(samples, samples)] * (d @ d.T) / scale


def _stores(rng):
    """``(store, dense Q)`` for each store of the solver, each answering for ``Q`` in its own way."""
    q = _q(rng)
    numpy = ColumnStore(lambda idx: np.asfortranarray(q[:, idx]), M)
    lazy = ColumnStore(lambda idx: np.asfortranarray(q[:, idx]), M, lambda idx: q[np.ix_(idx, idx)])
    device = DeviceColumnStore(lambda idx: torch.from_numpy(q[:, idx].copy()), M, torch.device("cpu"))
    kernel = _q(rng, M // 2) * 30  # M pairs
    labels = rng.integers(0, 3, M // 2)
    pairs = PairStore(DenseColumns(kernel), labels, 3, 2.5)
    return [(numpy, q), (lazy, q), (device, q), (pairs, _pair_q(kernel, labels, 3, 2.5))]


@pytest.mark.parametrize("store, batch, protocols", [
    (ColumnStore, FullColumns, (Store,)), (ColumnStore, LazyColumns, (Store,)),
    (DeviceColumnStore, DeviceFullColumns, (Store, DeviceStore)), (PairStore, PairColumns, (Store,))])
def test_every_store_and_batch_declares_its_protocol(store, batch, protocols):
    assert all(protocol in store.__mro__ for protocol in protocols)
    assert Candidates in batch.__mro__
    assert (StoredCandidates in batch.__mro__) == (store is not PairStore)
    assert FreeSet in NumpyFreeSet.__mro__ and FreeSet in TorchFreeSet.__mro__


def _as_numpy(values):
    return values.numpy() if isinstance(values, torch.Tensor) else values


def test_every_store_and_its_batches_keep_the_contract():
    rng = np.random.default_rng(0)
    for store, q in _stores(rng):
        m = q.shape[0]
        assert isinstance(store, Store)
        on_device = isinstance(store, DeviceStore)
        array = torch.Tensor if on_device else np.ndarray
        members: list[int] = []
        for new in (np.array([3, 17, 8]), np.array([25, 0]), np.array([31, 12, 9, 2])):
            batch = store.fetch(new, members)
            assert isinstance(batch, Candidates)
            assert isinstance(batch, StoredCandidates) == isinstance(store, ColumnStore)
            assert batch.new.dtype == np.int64 and batch.new.shape == new.shape
            assert sorted(batch.new.tolist()) == sorted(new.tolist())
            rows = np.array(members + batch.new.tolist(), dtype=np.int64)
            taken = batch.take(rows)
            assert isinstance(taken, array) and taken.dtype in (np.float64, torch.float64)
            assert taken.shape == (len(rows), len(new))
            np.testing.assert_allclose(_as_numpy(taken), q[np.ix_(rows, batch.new)], rtol=1e-13, atol=1e-15)
            one = batch.single(1)
            assert isinstance(one, Candidates) and one.new.tolist() == [batch.new[1]]
            np.testing.assert_allclose(_as_numpy(one.take(rows)), q[np.ix_(rows, one.new)], rtol=1e-13, atol=1e-15)
            store.admit(batch)
            members += batch.new.tolist()
            alpha = rng.random(len(members))
            product = store.q_times(members, alpha)
            assert isinstance(product, np.ndarray) and product.dtype == np.float64 and product.shape == (m,)
            np.testing.assert_allclose(product, q[:, members] @ alpha, rtol=1e-12, atol=1e-14)
            kept = np.array([k for k in range(len(members)) if k % 3 != 1], dtype=np.int64)
            store.keep(kept, len(kept))
            members = [members[k] for k in kept]
        if on_device:
            assert store.device == torch.device("cpu")


def test_the_sample_rows_of_the_pair_store_keep_the_kernel_columns_contract():
    kernel = _q(np.random.default_rng(5))
    rows = SampleRows(DenseColumns(kernel), M)
    assert isinstance(rows, KernelColumns) and len(rows) == M
    idx, signs = np.array([7, 3, 7]), np.where(np.arange(M) % 3, 1.0, -1.0)
    diagonal, columns, signed = rows.diagonal(), rows.columns(idx), rows.signed_columns(idx, signs, 2.0)
    assert diagonal.dtype == columns.dtype == signed.dtype == np.float64
    assert diagonal.shape == (M,) and columns.shape == signed.shape == (M, 3) and signed.flags.f_contiguous
    np.testing.assert_array_equal(columns, kernel[:, idx])
    np.testing.assert_allclose(signed, kernel[:, idx] * np.outer(signs, signs[idx]) / 2.0, rtol=1e-15)
    assert rows.signed_rows(idx, signs, 2.0).shape == (3, M) and rows.device == torch.device("cpu")


def test_lazy_batches_refuse_rows_they_were_not_formed_for():
    q = _q(np.random.default_rng(1))
    store = ColumnStore(lambda idx: np.asfortranarray(q[:, idx]), M, lambda idx: q[np.ix_(idx, idx)])
    batch = store.fetch(np.array([1, 2]), [])
    with pytest.raises(RuntimeError, match="outside the members"):
        batch.take(np.array([5]))


class _DenseCandidates:
    """Candidates of :class:`_DenseStore`: full columns, no other behaviour."""

    def __init__(self, q, new):
        self.q, self.new = q, np.asarray(new, dtype=np.int64)

    def take(self, rows):
        return self.q[np.asarray(rows, dtype=np.int64)][:, self.new]

    def single(self, k):
        return _DenseCandidates(self.q, self.new[k:k + 1])


class _DenseStore:
    """The least a store must be, written from the protocol's docstrings alone: ``Q`` held whole, nothing kept."""

    def __init__(self, q):
        self.q = self.dense = q

    def fetch(self, new, members=None):
        return _DenseCandidates(self.q, new)

    def admit(self, columns):
        pass

    def q_times(self, index, alpha):
        return self.dense[:, index] @ alpha

    def keep(self, kept, members):
        pass


class _DeviceDenseStore(_DenseStore):
    """:class:`_DenseStore` whose batches give tensors on ``device``."""

    def __init__(self, q, device):
        super().__init__(q)
        self.q, self.device = torch.from_numpy(q).to(device), device


def _fake_solution(kernel, y, device=None):
    scale = float(np.diag(kernel).mean())
    q = kernel * np.outer(y, y) / scale
    store = _DenseStore(q) if device is None else _DeviceDenseStore(q, device)
    assert isinstance(store, Store) and isinstance(store.fetch(np.array([0])), Candidates)
    assert isinstance(store, DeviceStore) == (device is not None)
    return active_set(store, y.astype(np.float64), scale, 1e-10, None, None,
                      NumpyFreeSet if device is None else TorchFreeSet)


@pytest.mark.parametrize("device", [None, torch.device("cpu")])
@pytest.mark.parametrize("seed", range(4))
def test_a_store_written_against_the_protocol_gives_the_solution_of_the_real_one(seed, device):
    kernel, y = separable(8, 5, seed)
    fake = _fake_solution(kernel, y, device)
    real = max_margin(kernel, y)
    np.testing.assert_array_equal(fake.support_, real.support_)
    np.testing.assert_allclose(fake.alpha_, real.alpha_, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(fake.alpha_, enumerate_kkt(kernel, y), rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("device", [None, torch.device("cpu")])
def test_a_store_written_against_the_protocol_gives_the_support_of_the_real_one_on_a_larger_problem(device):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((120, 150))
    kernel, y = a @ a.T, np.where(rng.random(120) < 0.5, -1, 1)
    fake, real = _fake_solution(kernel, y, device), max_margin(kernel, y)
    assert real.n_support_ > 40
    np.testing.assert_array_equal(fake.support_, real.support_)
    np.testing.assert_allclose(fake.alpha_, real.alpha_, rtol=1e-8, atol=1e-12 * real.alpha_.max())


def test_a_store_written_against_the_protocol_matches_scikit_learn():
    # every sample mirrored (x, y) -> (-x, -y): the best intercept is 0, so SVC's problem is the one through the origin
    rng = np.random.default_rng(3)
    x = rng.normal(size=(50, 60))
    y = np.where(x @ rng.normal(size=60) >= 0, 1, -1)
    x, y = np.vstack([x, -x]), np.concatenate([y, -y])
    kernel = x @ x.T
    fake = _fake_solution(kernel, y)
    # a sample and its mirror have one signed feature, so α is not unique: compare the classifier and its margin
    assert_the_classifier_of_scikit_learn(kernel, y, fake)


def test_a_store_written_against_the_protocol_solves_the_pair_problem():
    rng = np.random.default_rng(4)
    a = rng.standard_normal((12, 30))
    kernel, labels = a @ a.T, rng.integers(0, 3, 12)
    real = pair_max_margin(kernel, labels, 3)
    pair_diag = 2.0 * np.repeat(np.diag(kernel), 2)
    scale = float(pair_diag.mean())
    ones = np.ones(len(pair_diag))
    fake = active_set(_DenseStore(_pair_q(kernel, labels, 3, scale)), ones, scale, 1e-10, None, None)
    np.testing.assert_array_equal(fake.support_, real.support_)
    np.testing.assert_allclose(fake.alpha_, real.alpha_, rtol=1e-9, atol=1e-12 * real.alpha_.max())
