import itertools

import numpy as np
import pytest
from sklearn.svm import SVC

from lightning_nsv.solver import NotSeparableError, max_margin

# Hand-solved: w ∝ (1, -1); the constraints of (2, 0) and (0, 2) are active, w = (1/2, -1/2), α = 1/4 each.
HAND_X = np.array([[2.0, 0.0], [0.0, 2.0], [3.0, 0.0], [0.0, 3.0], [4.0, 1.0]])
HAND_Y = np.array([1, -1, 1, -1, 1])


def separable(m, f, seed, degree=1):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(m, f))
    y = np.where(x @ rng.normal(size=f) >= 0, 1, -1)
    return (x @ x.T + (degree > 1)) ** degree, y


def enumerate_kkt(kernel, y):
    """The unique α >= 0 with Q_SS α_S = 1 on its support and Qα >= 1 everywhere, by trying every support."""
    q = kernel * np.outer(y, y)
    m = len(y)
    for size in range(1, m + 1):
        for support in map(list, itertools.combinations(range(m), size)):
            try:
                a = np.linalg.solve(q[np.ix_(support, support)], np.ones(size))
            except np.linalg.LinAlgError:
                continue
            alpha = np.zeros(m)
            alpha[support] = a
            if np.all(a > 0) and np.all(q @ alpha >= 1 - 1e-9):
                return alpha
    raise AssertionError("no KKT point")


@pytest.mark.parametrize("intercept", [False, True])
def test_hand_solved_toy(intercept):
    result = max_margin(HAND_X @ HAND_X.T, HAND_Y, intercept=intercept)
    assert result.support_.tolist() == [0, 1]
    np.testing.assert_allclose(result.alpha_, [0.25, 0.25, 0, 0, 0], atol=1e-6)
    assert result.margin == pytest.approx(np.sqrt(2), rel=1e-6)
    assert result.intercept_ == pytest.approx(0.0, abs=1e-6)
    assert result.n_margin_violations == 0
    assert result.kkt_residual < (1e-12 if not intercept else 1e-4)


@pytest.mark.parametrize("seed", range(12))
def test_matches_exhaustive_kkt_search(seed):
    kernel, y = separable(8, 5, seed)
    result = max_margin(kernel, y)
    np.testing.assert_allclose(result.alpha_, enumerate_kkt(kernel, y), rtol=1e-8, atol=1e-10)
    assert result.kkt_residual < 1e-10
    assert result.norm_v_sq == pytest.approx(result.alpha_.sum(), rel=1e-10)


@pytest.mark.parametrize("seed", range(3))
def test_matches_scikit_learn_on_symmetric_data(seed):
    # With every sample mirrored (x, y) -> (-x, -y) the best intercept is 0, so both problems coincide.
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(60, 4))
    y = np.where(x @ rng.normal(size=4) >= 0, 1, -1)
    x, y = np.vstack([x, -x]), np.concatenate([y, -y])
    kernel = (x @ x.T) * (1 + 0.5 * (x @ x.T) ** 2)  # odd in x, so mirroring is preserved
    # the kernel has rank 24 < 120, so α is not unique: compare the classifier and its margin
    assert_the_classifier_of_scikit_learn(kernel, y, max_margin(kernel, y))


def assert_the_classifier_of_scikit_learn(kernel: np.ndarray, y: np.ndarray, result) -> None:
    """``result`` gives scikit-learn's classifier and margin on mirrored data (its intercept 0): α need not be unique
    where the kernel is singular, the classifier is."""
    svc = SVC(kernel="precomputed", C=1e8, tol=1e-8, shrinking=False).fit(kernel, y)
    reference = np.zeros(len(y))
    reference[svc.support_] = np.abs(svc.dual_coef_[0])
    assert abs(svc.intercept_[0]) < 1e-4
    np.testing.assert_allclose(kernel @ (result.alpha_ * y), kernel @ (reference * y), atol=1e-4)
    assert result.norm_v_sq == pytest.approx(reference @ (kernel * np.outer(y, y)) @ reference, rel=1e-5)


def test_intercept_protocol_is_scikit_learn_on_normalised_kernel():
    kernel, y = separable(200, 6, seed=4, degree=2)
    kernel = kernel * 37.0
    result = max_margin(kernel, y, intercept=True, C=1e6)
    scale = np.diag(kernel).mean()
    svc = SVC(kernel="precomputed", C=1e6, tol=1e-5, shrinking=False).fit(kernel / scale, y)
    assert result.support_.tolist() == sorted(svc.support_.tolist())
    assert result.kernel_scale == pytest.approx(scale)
    assert result.C_effective == pytest.approx(1e6 / scale)
    np.testing.assert_allclose(result.alpha_[svc.support_], np.abs(svc.dual_coef_[0]) / scale, rtol=1e-12)
    assert result.n_margin_violations == 0 and result.n_at_bound == 0


def test_scaling_the_kernel_scales_alpha_only():
    kernel, y = separable(150, 5, seed=5, degree=3)
    base, scaled = max_margin(kernel, y), max_margin(kernel * 1e4, y)
    np.testing.assert_array_equal(base.support_, scaled.support_)
    np.testing.assert_allclose(scaled.alpha_ * 1e4, base.alpha_, rtol=1e-8)
    assert scaled.margin == pytest.approx(base.margin * 1e2, rel=1e-8)


def test_duplicated_samples_take_degenerate_steps():
    kernel, y = separable(120, 4, seed=6, degree=2)
    rows = np.concatenate([np.arange(120), np.arange(40), np.arange(40)])
    result = max_margin(kernel[np.ix_(rows, rows)], y[rows])
    unique = max_margin(kernel, y)
    assert result.kkt_residual < 1e-9
    assert result.margin == pytest.approx(unique.margin, rel=1e-9)
    merged = np.bincount(rows, weights=result.alpha_)
    np.testing.assert_allclose(merged, unique.alpha_, atol=1e-8 * unique.alpha_.max())


def test_column_function_and_initial_guess_give_the_same_solution():
    kernel, y = separable(300, 6, seed=7, degree=2)
    dense = max_margin(kernel, y)
    lazy = max_margin(lambda idx: kernel[:, idx], y, kernel_diag=np.diag(kernel), initial=np.arange(50))
    np.testing.assert_allclose(lazy.alpha_, dense.alpha_, atol=1e-9 * dense.alpha_.max())


@pytest.mark.parametrize("device", [None, "cpu"])
@pytest.mark.parametrize("block", [1, 7, None, 10_000])
def test_initial_block_sizes_give_the_dense_solution(block, device):
    kernel, y = separable(300, 6, seed=7, degree=2)
    dense = max_margin(kernel, y)
    rng = np.random.default_rng(1)
    initial = np.union1d(dense.support_[rng.random(dense.n_support_) < 0.7], rng.choice(len(y), 30, replace=False))
    lazy = max_margin(lambda idx: kernel[:, idx], y, kernel_diag=np.diag(kernel), initial=initial,
                      initial_block=block, device=device)
    np.testing.assert_array_equal(lazy.support_, dense.support_)
    np.testing.assert_allclose(lazy.alpha_, dense.alpha_, atol=1e-9 * dense.alpha_.max())
    assert lazy.kkt_residual <= 1e-10


def test_a_support_admitted_whole_needs_one_step():
    """Started from the exact support as one block, the solver only checks it; in blocks of ⌊√m⌋ it needs a step
    per block."""
    kernel, y = separable(400, 14, seed=3, degree=2)
    dense = max_margin(kernel, y)
    assert dense.n_support_ > 2 * int(np.sqrt(len(y)))  # several default blocks
    columns = dict(kernel_diag=np.diag(kernel), initial=dense.support_)
    whole = max_margin(lambda idx: kernel[:, idx], y, initial_block=dense.n_support_, **columns)
    blocks = max_margin(lambda idx: kernel[:, idx], y, **columns)
    np.testing.assert_array_equal(whole.support_, dense.support_)
    np.testing.assert_array_equal(blocks.support_, dense.support_)
    assert whole.iterations <= 2 < blocks.iterations
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="`initial_block` must be a positive integer"):
            max_margin(lambda idx: kernel[:, idx], y, initial_block=bad, **columns)


def test_not_separable_through_origin():
    x = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0]])
    with pytest.raises(NotSeparableError, match="not separable through the origin"):
        max_margin(x @ x.T, np.array([1, 1, 1]))


def test_input_validation_messages():
    kernel, y = separable(5, 3, seed=0)
    with pytest.raises(ValueError, match="must be a square matrix. Input is a \\(5, 4\\) matrix"):
        max_margin(kernel[:, :4], y)
    with pytest.raises(ValueError, match="y must have shape \\(5,\\), got \\(4,\\)"):
        max_margin(kernel, y[:4])
    with pytest.raises(ValueError, match="labels must be -1 or \\+1, got values \\[0, 1\\]"):
        max_margin(kernel, (y > 0).astype(int))
    with pytest.raises(ValueError, match="kernel_diag is required"):
        max_margin(lambda idx: kernel[:, idx], y)
    zero = kernel.copy()
    zero[0, :] = zero[:, 0] = 0
    with pytest.raises(ValueError, match="kernel diagonal must be finite and positive.*a zero sample has no margin"):
        max_margin(zero, y)
    negative = kernel.copy()
    negative[1, 1] = -1.0
    with pytest.raises(ValueError, match=r"got -1 at sample 1 .*K\(x, x\) < 0 cannot come from a kernel"):
        max_margin(negative, y)


def test_solver_progress_reports_every_iteration_and_changes_nothing():
    from lightning_nsv.solver import solver_progress

    g = np.random.default_rng(3)
    x = g.normal(size=(60, 5))
    y = np.sign(x @ g.normal(size=5))
    kernel = x @ x.T + 1.0
    seen = []
    with solver_progress(lambda iteration, free, violation: seen.append((iteration, free, violation))):
        reported = max_margin(kernel, y)
    plain = max_margin(kernel, y)
    assert [s[0] for s in seen] == list(range(1, len(seen) + 1)) and len(seen) >= 1
    assert seen[-1][1] >= reported.n_support_ and seen[-1][2] <= 1e-9
    np.testing.assert_array_equal(reported.alpha_, plain.alpha_)


@pytest.mark.parametrize("columns_moved_at_once", [1, 3, 256])
def test_updates_and_downdates_in_place_give_the_factor_of_the_members(monkeypatch, columns_moved_at_once):
    """Admitting blocks and deleting any members, in any order, leaves the Cholesky factor of the members' Gram
    matrix (the factor lives in one block of memory that grows by copies only when too small; its columns move in
    groups, several groups per move when they are small)."""
    from lightning_nsv.solver import factor
    from lightning_nsv.solver.column_store import ColumnStore as _ColumnStore
    from lightning_nsv.solver.factor import NumpyFreeSet as _FreeSet

    monkeypatch.setattr(factor, "REMOVE_COLUMNS", columns_moved_at_once)
    monkeypatch.setattr(factor, "GROW_COLUMNS", columns_moved_at_once)
    rng = np.random.default_rng(0)
    for _ in range(100):
        m = int(rng.integers(2, 60))
        a = rng.standard_normal((m, m + 5))
        gram = a @ a.T
        free = _FreeSet(_ColumnStore(lambda idx: np.asfortranarray(gram[:, idx]), m))
        for _ in range(6):
            outside = np.setdiff1d(np.arange(m), free.index)
            if len(free) and (not len(outside) or rng.random() < 0.4):
                deleted = rng.choice(len(free), int(rng.integers(1, len(free) + 1)), replace=False)
                kept = [member for k, member in enumerate(free.index) if k not in set(deleted.tolist())]
                free.remove(deleted)
                assert free.index == kept
            else:
                new = rng.choice(outside, int(rng.integers(1, len(outside) + 1)), replace=False)
                assert free.try_add(free.fetch(new))
            factor, members = free.chol, free.index
            assert factor.shape == (len(members), len(members)) and factor.flags.f_contiguous
            if members:
                assert np.all(np.triu(factor, 1) == 0) and np.all(np.diag(factor) > 0)
                np.testing.assert_allclose(factor @ factor.T, gram[np.ix_(members, members)], rtol=1e-9,
                                           atol=1e-9 * np.abs(gram).max())


def random_gram(rng, m: int) -> np.ndarray:
    """A full-rank ``m×m`` Gram matrix."""
    a = rng.standard_normal((m, 2 * m))
    return a @ a.T


def assert_q_times_exact(free, gram: np.ndarray, rng) -> None:
    """``Q[:, F] α`` of the free set equals that of ``gram`` for a random ``α >= 0``."""
    alpha = rng.random(len(free))
    np.testing.assert_allclose(free.q_times(alpha), gram[:, free.index] @ alpha, rtol=1e-12,
                               atol=1e-12 * np.abs(gram).max() * alpha.sum())


@pytest.mark.parametrize("hold_a_view", [False, True])
def test_the_factor_grows_in_its_own_memory_unless_a_view_of_it_is_held(hold_a_view):
    """Admissions that outgrow the factor's memory enlarge that memory in place (the old factor is not held twice)
    when no view of it is held elsewhere, else copy it into new memory; ``L Lᵀ = Q_FF`` either way, through
    deletions too."""
    from lightning_nsv.solver.column_store import ColumnStore as _ColumnStore
    from lightning_nsv.solver.factor import NumpyFreeSet as _FreeSet

    rng = np.random.default_rng(6)
    m = 300
    gram = random_gram(rng, m)
    free = _FreeSet(_ColumnStore(lambda idx: np.asfortranarray(gram[:, idx]), m))
    outside = list(rng.permutation(m))
    assert free.try_add(free.fetch(np.array(outside[:10])))
    del outside[:10]
    same_memory = []
    for step in range(12):
        memory = id(free._memory)  # a reference (or a weak one) would itself stop the resize
        held = free.chol if hold_a_view else None
        if step % 4 == 3:
            free.remove(rng.choice(len(free), 3, replace=False))
        assert free.try_add(free.fetch(np.array(outside[:15])))
        del outside[:15]
        same_memory.append(id(free._memory) == memory)  # a new array is made while the old one is alive
        del held
        factor = free.chol
        np.testing.assert_allclose(factor @ factor.T, gram[np.ix_(free.index, free.index)], rtol=1e-10,
                                   atol=1e-10 * np.abs(gram).max())
        assert np.array_equal(np.triu(factor, 1), np.zeros_like(factor))
        del factor
    assert all(same_memory) if not hold_a_view else not any(same_memory[k] for k in range(12) if k % 4 != 3)


@pytest.mark.parametrize("on_device", [False, True])
def test_column_store_merges_narrow_blocks_and_keeps_q_times_exact(on_device):
    """Members admitted a column or a few at a time (as on near-duplicate samples) end up in few stored blocks;
    ``Q[:, F] α`` stays that of the members through admissions, deletions and compactions."""
    import torch

    import lightning_nsv.solver.column_store as max_margin_module
    from lightning_nsv.solver.column_store import ColumnStore as _ColumnStore
    from lightning_nsv.solver.column_store import DeviceColumnStore as _DeviceColumnStore
    from lightning_nsv.solver.factor import NumpyFreeSet as _FreeSet
    from lightning_nsv.solver.factor import TorchFreeSet as _DeviceFreeSet

    rng = np.random.default_rng(2)
    m = 400
    gram = random_gram(rng, m)
    if on_device:
        store = _DeviceColumnStore(lambda idx: torch.from_numpy(gram[:, idx].copy()), m, torch.device("cpu"))
        free = _DeviceFreeSet(store)
    else:
        store = _ColumnStore(lambda idx: np.asfortranarray(gram[:, idx]), m)
        free = _FreeSet(store)
    for step in range(200):
        outside = np.setdiff1d(np.arange(m), free.index)
        if len(free) > 20 and (rng.random() < 0.3 or len(outside) < 30):
            free.remove(rng.choice(len(free), int(rng.integers(1, 4)), replace=False))
        else:
            width = 1 if rng.random() < 0.8 else int(rng.integers(2, 30))
            assert free.try_add(free.fetch(rng.choice(outside, min(width, len(outside)), replace=False)))
        narrow = sum(block.shape[1] < max_margin_module.NARROW_BLOCK for block in store._blocks)
        assert narrow < max_margin_module.NARROW_BLOCKS
        assert_q_times_exact(free, gram, rng)
    assert len(store._blocks) < 40  # without merging: one block per admission, about 140


@pytest.mark.parametrize("hold_a_view", [False, True])
def test_compaction_shrinks_blocks_it_owns_in_place_and_leaves_held_views_alone(monkeypatch, hold_a_view):
    """Columns given as the transpose of C-ordered rows (as ``PathKernelColumns.signed_columns`` gives them on the
    CPU) are compacted in their own memory, unless a view of the block is held elsewhere (e.g. a candidate's
    columns): that view keeps its values. ``Q[:, F] α`` stays exact."""
    import lightning_nsv.solver.column_store as max_margin_module
    from lightning_nsv.solver.column_store import ColumnStore as _ColumnStore
    from lightning_nsv.solver.factor import NumpyFreeSet as _FreeSet

    monkeypatch.setattr(max_margin_module, "DEAD_COLUMNS_MIN", 1)
    monkeypatch.setattr(max_margin_module, "DEAD_BYTES_MIN", 0)
    monkeypatch.setattr(max_margin_module, "DEAD_COLUMNS_SHARE", 10 ** 6)
    rng = np.random.default_rng(8)
    m = 200
    gram = random_gram(rng, m)

    def q_columns(idx):
        rows = np.empty((len(idx), m))
        rows[:] = gram[idx]
        return rows.T

    store = _ColumnStore(q_columns, m)
    free = _FreeSet(store)
    assert free.try_add(free.fetch(np.arange(30)))
    assert free.try_add(free.fetch(np.arange(30, 60)))
    ids = [id(block.base) for block in store._blocks]
    held = store._blocks[0][:, 20:21] if hold_a_view else None  # the column of sample 20, which stays
    before = None if held is None else held.copy()
    free.remove(np.array([1, 4, 5, 33]))  # samples 1, 4, 5 of the first block, 33 of the second
    assert len(store._blocks) == 2 and [block.shape[1] for block in store._blocks] == [27, 29]
    in_place = [id(block.base) == i for block, i in zip(store._blocks, ids)]
    assert in_place == ([False, True] if hold_a_view else [True, True])
    assert all(block.flags.f_contiguous for block in store._blocks)
    if hold_a_view:
        np.testing.assert_array_equal(held, before)
    assert_q_times_exact(free, gram, rng)
    np.testing.assert_array_equal(np.sort(np.concatenate(store._samples)), np.sort(free.index))


@pytest.mark.parametrize("lazy", [False, True])
def test_samples_reentering_from_their_dead_columns_do_not_pile_up_narrow_blocks(lazy):
    """A member removed and admitted again is served from its stored dead column, a block of one column: those are
    merged on the full and on the lazy route alike, and ``Q[:, F] α`` stays exact."""
    import lightning_nsv.solver.column_store as max_margin_module
    from lightning_nsv.solver.column_store import ColumnStore as _ColumnStore
    from lightning_nsv.solver.factor import NumpyFreeSet as _FreeSet

    rng = np.random.default_rng(0)
    m = 300
    gram = random_gram(rng, m)
    store = _ColumnStore(lambda idx: np.asfortranarray(gram[:, idx]), m,
                         (lambda idx: gram[np.ix_(idx, idx)]) if lazy else None)
    free = _FreeSet(store)
    assert free.try_add(free.fetch(np.arange(40)))
    for step in range(100):
        position = int(rng.integers(len(free)))
        sample = free.index[position]
        free.remove(np.array([position]))
        assert free.try_add(free.fetch(np.array([sample])))
        assert_q_times_exact(free, gram, rng)
        assert sum(block.shape[1] < max_margin_module.NARROW_BLOCK for block in store._blocks) \
            < max_margin_module.NARROW_BLOCKS
    assert store.reused >= 90


@pytest.mark.parametrize("on_device", [False, True])
def test_a_sample_that_reenters_the_free_set_reuses_its_stored_column(on_device):
    """A member removed from F keeps its column in the store until a compaction: fetched again, it is copied from
    there and not asked of ``q_columns``; the fetched columns are those of the samples, whatever their order."""
    import torch

    from lightning_nsv.solver.column_store import ColumnStore as _ColumnStore
    from lightning_nsv.solver.column_store import DeviceColumnStore as _DeviceColumnStore
    from lightning_nsv.solver.factor import NumpyFreeSet as _FreeSet
    from lightning_nsv.solver.factor import TorchFreeSet as _DeviceFreeSet

    rng = np.random.default_rng(3)
    m = 300
    gram = random_gram(rng, m)
    asked = []

    def q_columns(idx):
        asked.append(np.asarray(idx).copy())
        return torch.from_numpy(gram[:, idx].copy()) if on_device else np.asfortranarray(gram[:, idx])

    store = _DeviceColumnStore(q_columns, m, torch.device("cpu")) if on_device else _ColumnStore(q_columns, m)
    free = (_DeviceFreeSet if on_device else _FreeSet)(store)
    removed = set()
    for step in range(120):
        outside = np.setdiff1d(np.arange(m), free.index)
        if len(free) > 20 and (rng.random() < 0.4 or len(free) > m // 2):
            positions = rng.choice(len(free), int(rng.integers(1, 6)), replace=False)
            removed |= {free.index[p] for p in positions}
            free.remove(positions)
            continue
        back = sorted(removed - set(free.index))
        pool = np.array(back) if back and rng.random() < 0.5 else outside
        wanted = rng.choice(pool, min(int(rng.integers(1, 12)), len(pool)), replace=False)
        dead = set(store._dead_columns())
        asked.clear()
        columns = free.fetch(wanted)
        assert sorted(columns.new.tolist()) == sorted(wanted.tolist())
        np.testing.assert_array_equal(np.asarray(columns.cols), gram[:, columns.new])
        assert sorted(np.concatenate(asked).tolist() if asked else []) == sorted(set(wanted.tolist()) - dead)
        assert free.try_add(columns)
        assert_q_times_exact(free, gram, rng)
    assert store.reused > 20


def test_a_lazy_fetch_counts_a_reused_dead_column_only_when_it_is_admitted():
    """On the lazy route a dead column is copied at the fetch but counted in ``reused`` at the admission: a fetched
    candidate that is never admitted leaves the count alone."""
    from lightning_nsv.solver.column_store import ColumnStore as _ColumnStore
    from lightning_nsv.solver.factor import NumpyFreeSet as _FreeSet

    rng = np.random.default_rng(5)
    m = 120
    gram = random_gram(rng, m)
    store = _ColumnStore(lambda idx: np.asfortranarray(gram[:, idx]), m, lambda idx: gram[np.ix_(idx, idx)])
    free = _FreeSet(store)
    assert free.try_add(free.fetch(np.arange(10)))
    assert_q_times_exact(free, gram, rng)  # forms the members' full columns
    sample = free.index[3]
    free.remove(np.array([3]))
    free.fetch(np.array([sample]))  # fetched, not admitted
    assert store.reused == 0
    assert free.try_add(free.fetch(np.array([sample])))
    assert store.reused == 1
    assert_q_times_exact(free, gram, rng)


def test_lazy_candidates_read_their_entries_from_the_members_and_form_columns_only_for_those_kept():
    """With ``q_block`` the store fetches ``Q[F ∪ new, new]`` (members' rows from their stored columns, the block of
    the candidates from ``q_block``) and forms full columns at the next ``Q[:, F] α`` only for candidates still in
    F and without a stored dead column: one removed before it is never asked of ``q_columns``."""
    from lightning_nsv.solver.column_store import ColumnStore as _ColumnStore
    from lightning_nsv.solver.column_store import LazyColumns as _LazyColumns
    from lightning_nsv.solver.factor import NumpyFreeSet as _FreeSet

    rng = np.random.default_rng(4)
    m = 300
    gram = random_gram(rng, m)
    asked = []

    def q_columns(idx):
        asked.extend(np.asarray(idx).tolist())
        return np.asfortranarray(gram[:, idx])

    store = _ColumnStore(q_columns, m, q_block=lambda idx: gram[np.ix_(idx, idx)])
    free = _FreeSet(store)
    skipped = 0
    for step in range(80):
        outside = np.setdiff1d(np.arange(m), free.index)
        wanted = rng.choice(outside, int(rng.integers(1, 10)), replace=False)
        columns = free.fetch(wanted)
        assert isinstance(columns, _LazyColumns)
        rows = np.concatenate([np.asarray(free.index, dtype=np.int64), columns.new])
        np.testing.assert_array_equal(columns.take(rows), gram[np.ix_(rows, columns.new)])
        assert free.try_add(columns)
        just_dropped = set()
        if len(free) > 20 and (rng.random() < 0.5 or len(free) > m // 2):
            positions = rng.choice(len(free), int(rng.integers(1, 6)), replace=False)
            just_dropped = {free.index[p] for p in positions} & set(columns.new.tolist())
            free.remove(positions)
        skipped += len(just_dropped - set(columns.full))
        before = len(asked)
        assert_q_times_exact(free, gram, rng)
        # the others: in F, and not at hand as a stored dead column
        assert sorted(asked[before:]) == sorted(set(columns.new.tolist()) - just_dropped - set(columns.full))
    assert store.skipped == skipped > 0
