"""The active-set solver's block steps against brute force: the descent's path (members held at zero solved for in
blocks of ``Q_FF⁻¹`` columns) and the columns themselves."""
import sys

import numpy as np
import pytest

import lightning_nsv.solver  # noqa: F401  (the package's ``active_set`` name is the function: the module from sys)
from lightning_nsv.solver.column_store import ColumnStore
from lightning_nsv.solver.factor import NumpyFreeSet

active_set_module = sys.modules["lightning_nsv.solver.active_set"]


def free_set_of(q: np.ndarray) -> NumpyFreeSet:
    """A free set holding every sample of the dense ``q``, admitted as one block."""
    free = NumpyFreeSet(ColumnStore(lambda idx: np.asfortranarray(q[:, idx]), len(q)))
    assert free.try_add(free.fetch(np.arange(len(q))))
    return free


def mixed_signs_q(n: int, seed: int) -> np.ndarray:
    """``Q = y yᵀ ∘ G Gᵀ`` of random features with random labels: ``Q⁻¹ 1`` has many negative entries."""
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((n, n + 5))
    y = rng.choice([-1.0, 1.0], n)
    return np.outer(y, y) * (g @ g.T) / n


def reference_descent(q: np.ndarray, alpha: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The descent's path by brute force: each step's target ``x_K = Q_KK⁻¹ 1`` on the members K not dropped, the
    same ratio test; ``(α on the kept members, kept members)``."""
    n = len(alpha)
    dropped = np.zeros(n, dtype=bool)
    while True:
        keep = ~dropped
        target = np.zeros(n)
        target[keep] = np.linalg.solve(q[np.ix_(keep, keep)], np.ones(keep.sum()))
        blocking = (target <= 0) & keep
        if not blocking.any():
            return target[keep], np.flatnonzero(keep)
        # the longest step towards the target that keeps α >= 0, member by member
        steps = {k: (alpha[k] / (alpha[k] - target[k]) if alpha[k] > target[k] else 0.0)
                 for k in np.flatnonzero(blocking)}
        first = min(steps, key=lambda k: (steps[k], k))
        alpha = alpha + min(steps[first], 1.0) * (target - alpha)
        alpha[first] = 0.0
        new = [k for k in steps if alpha[k] <= 1e-14 * alpha.max(initial=1.0)]
        alpha[new] = 0.0
        alpha[keep] = np.maximum(alpha[keep], 0.0)
        dropped[new] = True


@pytest.mark.parametrize("n, seed, drop_batch", [(40, 0, 64), (60, 1, 64), (60, 2, 5), (90, 3, 7)])
def test_descent_follows_the_brute_force_path(monkeypatch, n, seed, drop_batch):
    monkeypatch.setattr(active_set_module, "DROP_BATCH", drop_batch)  # downdates in between, too
    q = mixed_signs_q(n, seed)
    free = free_set_of(q)
    solves = []
    for name in ("solve", "lower_solve", "lower_t_solve"):  # every solve with the factor
        method = getattr(free, name)
        monkeypatch.setattr(free, name, lambda rhs, method=method: solves.append(rhs.shape) or method(rhs))
    start = np.random.default_rng(seed).uniform(0.5, 1.0, n) / n  # positive: members reach zero one at a time
    alpha = active_set_module._descend(free, start.copy())
    expected, kept = reference_descent(q, start)
    assert n - len(kept) > 10  # the case drops members
    np.testing.assert_array_equal(free.index, kept)
    np.testing.assert_allclose(alpha, expected, rtol=1e-10, atol=1e-12 * expected.max())
    # the factor is solved with far fewer times than members are dropped: in blocks, not one per dropped member
    assert len(solves) < (n - len(kept)) / 2


def test_inverse_columns_are_those_of_the_inverse_and_solved_in_blocks(monkeypatch):
    q = mixed_signs_q(30, 4)
    free = free_set_of(q)
    calls = []
    solve = free.solve
    monkeypatch.setattr(free, "solve", lambda rhs: calls.append(rhs.shape[1]) or solve(rhs))
    inverse = active_set_module._InverseColumns(free)
    inverse.solve_for(np.array([3]), np.array([7, 3, 12]))
    inverse.solve_for(np.array([7, 12]), np.array([], dtype=np.int64))  # at hand: no solve
    inverse.solve_for(np.array([20]), np.array([], dtype=np.int64))
    assert calls == [3, 1]
    exact = np.linalg.inv(q)
    members = [12, 3, 20, 7]
    np.testing.assert_allclose(inverse.columns(members), exact[:, members], rtol=1e-9, atol=1e-9 * abs(exact).max())
    np.testing.assert_allclose(inverse.rows(members), exact[np.ix_(members, members)], rtol=1e-9,
                               atol=1e-9 * abs(exact).max())
