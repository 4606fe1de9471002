"""Property-based tests (hypothesis) of path space and of the max-margin solver on random small networks.

Architectures: depth 0–3, widths 1–6, 1–5 input features, per-layer negative slope β in {0, 0.1, −1, 1} or a
float in [−1, 1], positive slope γ in {1, 0.5, 2} or a float in [0.05, 2] (a γ of 1e-308 underflows the kernel),
with and without biases; weights either Gaussian (moderate magnitudes) or on a coarse grid (exact zeros and exact
ties ``z = 0``); 1–10 samples, some of them duplicated. Everything in float64.
Brute-force references: ``tests/reference.py``.
"""
from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, event, given, note, settings
from hypothesis import strategies as st

from lightning_nsv.analysis import network_support_vectors
from lightning_nsv.kernel import (PathNetwork, forward_with_slopes, max_margin_decision, path_kernel,
                                  path_kernel_diagonal, path_signs, signed_labels)
from lightning_nsv.kernel.formulas import path_norm_squared, unique_patterns
from lightning_nsv.solver import max_margin
from tests.reference import exhaustive_max_margin, materialise_phi, materialise_wbar, reference_forward

# Reproducible by default (derandomized, no example database). NSV_PROPERTY_SCALE=k runs k times as many
# examples from random seeds, for a longer hunt outside CI.
SCALE = int(os.environ.get("NSV_PROPERTY_SCALE", "1"))
PROFILE = dict(deadline=None, derandomize=SCALE == 1, database=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])




def examples(n: int) -> int:
    return n * SCALE


REL = 1e-10  # path-space identities
KKT = 1e-8  # solver

betas = st.one_of(st.sampled_from([0.0, 0.1, -1.0, 1.0]),
                  st.floats(-1.0, 1.0, allow_nan=False, allow_subnormal=False))
gammas = st.one_of(st.sampled_from([1.0, 0.5, 2.0]),
                   st.floats(0.05, 2.0, allow_nan=False))
# the solver's problems keep |β| >= 0.01 (or β = 0): a β of 1e-33 gives samples whose kernel entries differ by
# 1e67, where (Qα)_i itself cannot be evaluated to 1e-8 in float64 (catastrophic cancellation), whatever α is
solver_betas = st.one_of(st.sampled_from([0.0, 0.1, -1.0, 1.0]),
                         st.floats(-1.0, 1.0, allow_nan=False).filter(lambda b: b == 0 or abs(b) >= 0.01))


def _values(rng: np.random.Generator, kind: str, shape, scale: float) -> torch.Tensor:
    if kind == "grid":  # exact zeros, exact ties z = 0, exact arithmetic
        values = rng.integers(-2, 3, size=shape) / 2.0
    else:
        values = rng.normal(size=shape) * scale
    return torch.from_numpy(np.asarray(values, dtype=np.float64).reshape(shape))


@st.composite
def networks(draw, bias=None, slopes=betas) -> PathNetwork:
    depth = draw(st.integers(0, 3))
    f = draw(st.integers(1, 5))
    widths = draw(st.lists(st.integers(1, 6), min_size=depth, max_size=depth))
    has_bias = draw(st.booleans()) if bias is None else bias
    kind = draw(st.sampled_from(["gauss", "grid"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    sizes = [f, *widths, 1]
    scale = draw(st.sampled_from([0.5, 1.0, 2.0]))
    weights = tuple(_values(rng, kind, (sizes[k + 1], sizes[k]), scale / math.sqrt(sizes[k]))
                    for k in range(len(sizes) - 1))
    biases = tuple(_values(rng, kind, (s,), scale) for s in sizes[1:]) if has_bias else None
    layer_betas = tuple(draw(slopes) for _ in widths)
    layer_gammas = tuple(draw(gammas) for _ in widths)
    event(f"depth {depth}, {'with' if has_bias else 'no'} biases, {kind} weights")
    event(f"paths {'<= 20' if math.prod([f, *widths]) <= 20 else '> 20'}")
    return PathNetwork(weights, biases, layer_betas, layer_gammas)


@st.composite
def inputs(draw, f: int, min_size: int = 1, max_size: int = 10) -> torch.Tensor:
    """``m`` samples, possibly on a grid (zero rows and ties), possibly with duplicated rows."""
    m = draw(st.integers(min_size, max_size) | st.integers((min_size + max_size) // 2, max_size))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = _values(rng, draw(st.sampled_from(["gauss", "grid"])), (m, f), 1.0)
    if m > 1 and draw(st.booleans()):
        rows = draw(st.lists(st.integers(0, m - 1), min_size=m, max_size=m))
        x = x[rows]
    return x


@st.composite
def net_and_inputs(draw, bias=None):
    net = draw(networks(bias=bias))
    return net, draw(inputs(net.in_features))


def _close(actual, expected, scale, rel=REL) -> None:
    """``|actual − expected| <= rel·scale`` elementwise, ``scale`` the sum of absolute terms (cancellation-safe)."""
    actual, expected, scale = (torch.as_tensor(t, dtype=torch.float64) for t in (actual, expected, scale))
    err = (actual - expected).abs()
    bound = rel * scale + 1e-300
    worst = int(torch.argmax(err - bound)) if err.numel() else 0
    assert bool((err <= bound).all()), (
        f"error {err.reshape(-1)[worst]:.3e} > {bound.reshape(-1)[worst]:.3e} at flat index {worst}: "
        f"{actual.reshape(-1)[worst]!r} vs {expected.reshape(-1)[worst]!r}")


# --------------------------------------------------------------------------------------------- path space

@settings(max_examples=examples(100), **PROFILE)
@given(net_and_inputs())
def test_forward_matches_plain_python_network(case):
    net, x = case
    outputs, layer_slopes = forward_with_slopes(net, x)
    ref_out, ref_pre, ref_slopes = reference_forward(net, x)
    assert outputs.dtype == torch.float64 and outputs.shape == (x.shape[0],)
    assert len(layer_slopes) == net.depth
    _close(outputs, ref_out, 1 + torch.as_tensor(ref_out).abs())  # ordering of sums only
    for k, s in enumerate(layer_slopes):
        pre = torch.tensor(ref_pre[k], dtype=torch.float64).reshape(s.shape)
        clear = pre.abs() > 1e-9  # away from z = 0 the slope cannot depend on summation order
        expected = torch.tensor(ref_slopes[k], dtype=torch.float64).reshape(s.shape)
        assert torch.equal(s[clear], expected[clear])
        assert set(s.unique().tolist()) <= {net.betas[k], net.gammas[k]}
        exact_zero = pre == 0
        assert bool((s[exact_zero] == net.gammas[k]).all())  # convention: slope gamma at z = 0


@settings(max_examples=examples(100), **PROFILE)
@given(net_and_inputs())
def test_phi_dot_wbar_is_network_output(case):
    net, x = case
    outputs, _ = forward_with_slopes(net, x)
    phi, wbar = materialise_phi(net, x), materialise_wbar(net)
    assert phi.shape == (x.shape[0], net.num_paths) and wbar.shape == (net.num_paths,)
    _close(phi @ wbar, outputs, (phi.abs() @ wbar.abs()))


@settings(max_examples=examples(100), **PROFILE)
@given(net_and_inputs(), st.sampled_from([None, 1, 2, 3]))
def test_kernel_is_gram_of_materialised_phi(case, block_size):
    net, x = case
    bias = net.biases is not None
    _, layer_slopes = forward_with_slopes(net, x)
    phi = materialise_phi(net, x)
    expected, scale = phi @ phi.T, phi.abs() @ phi.abs().T
    kernel = path_kernel(x, layer_slopes, bias=bias, block_size=block_size)
    assert kernel.dtype == torch.float64 and kernel.shape == (x.shape[0], x.shape[0])
    _close(kernel, expected, scale)
    assert torch.equal(kernel, kernel.T)  # one set: upper blocks mirrored, exactly symmetric
    diagonal = path_kernel_diagonal(x, layer_slopes, bias=bias)
    _close(diagonal, (phi * phi).sum(1), scale.diagonal())
    _close(diagonal, kernel.diagonal(), scale.diagonal())


@settings(max_examples=examples(50), **PROFILE)
@given(networks(), st.data(), st.sampled_from([None, 1, 2, 4]))
def test_cross_kernel_is_product_of_materialised_phis(net, data, block_size):
    x_a, x_b = data.draw(inputs(net.in_features)), data.draw(inputs(net.in_features))
    bias = net.biases is not None
    _, s_a = forward_with_slopes(net, x_a)
    _, s_b = forward_with_slopes(net, x_b)
    phi_a, phi_b = materialise_phi(net, x_a), materialise_phi(net, x_b)
    cross = path_kernel(x_a, s_a, x_b, s_b, bias=bias, block_size=block_size)
    assert cross.shape == (x_a.shape[0], x_b.shape[0])
    _close(cross, phi_a @ phi_b.T, phi_a.abs() @ phi_b.abs().T)
    # the cross kernel of a set with itself is its own kernel
    _close(path_kernel(x_a, s_a, x_a, s_a, bias=bias, block_size=block_size), path_kernel(x_a, s_a, bias=bias),
           phi_a.abs() @ phi_a.abs().T)


@settings(max_examples=examples(100), **PROFILE)
@given(networks())
def test_path_norm_and_signs_by_enumeration(net):
    wbar = materialise_wbar(net)
    assert wbar.shape == (net.num_paths,)
    assert path_norm_squared(net) == pytest.approx(float(wbar @ wbar), rel=REL, abs=1e-300)
    signs = path_signs(net)
    assert signs.num_paths == net.num_paths
    assert signs.positive_count == int((wbar > 0).sum())
    assert signs.negative_count == int((wbar < 0).sum())
    assert signs.positive_mass == pytest.approx(float(wbar.clamp(min=0).sum()), rel=REL, abs=1e-300)
    assert signs.negative_mass == pytest.approx(float((-wbar).clamp(min=0).sum()), rel=REL, abs=1e-300)
    metrics = signs.to_metrics()
    assert metrics["path_zero_count"] == int((wbar == 0).sum())
    assert metrics["path_positive_count_fraction"] == pytest.approx(float((wbar > 0).double().mean()), rel=1e-12)


@settings(max_examples=examples(100), **PROFILE)
@given(networks(), st.data())
def test_unique_patterns_by_enumeration(net, data):
    x_a, x_b = data.draw(inputs(net.in_features)), data.draw(inputs(net.in_features))
    _, s_a = forward_with_slopes(net, x_a)
    _, s_b = forward_with_slopes(net, x_b)

    def rows(layer_slopes, n):
        return {tuple(v for s in layer_slopes for v in s[i].tolist()) for i in range(n)}

    if net.depth == 0:
        assert unique_patterns(s_a, gammas=net.gammas) == 1
        return
    expected_a = rows(s_a, x_a.shape[0])
    assert unique_patterns(s_a, gammas=net.gammas) == len(expected_a)
    assert unique_patterns(s_a, s_b, gammas=net.gammas) == len(expected_a | rows(s_b, x_b.shape[0]))


# ----------------------------------------------------------------------------------- separable problems

@st.composite
def separable_problems(draw, max_m: int = 10, duplicates: bool = True):
    """A network, ``m`` samples far from a separating hyperplane through the origin in path space, ``y`` in ±1.

    Labels: the sign of ``N(x)`` (``wbar`` separates) or of a random path-space direction ``u``; only samples
    with ``|<phi, u>| >= 0.05·||phi||·||u||`` are kept, so the margin and the conditioning stay moderate.
    """
    net = draw(networks(slopes=solver_betas))
    m = draw(st.integers(1, max_m) | st.integers(max_m // 2, max_m))  # hypothesis favours small integers
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    pool = _values(rng, draw(st.sampled_from(["gauss", "grid"])), (6 * max_m, net.in_features), 1.0)
    phi = materialise_phi(net, pool)
    if draw(st.sampled_from(["network", "random"])) == "network":
        u = materialise_wbar(net)
        assume(float(u.norm()) > 0)
    else:
        u = torch.from_numpy(rng.normal(size=net.num_paths))
    score = phi @ u
    keep = score.abs() >= 0.05 * phi.norm(dim=1) * u.norm()
    keep &= (phi.norm(dim=1) > 0) & (score != 0)
    index = torch.nonzero(keep).flatten()[:m]
    assume(len(index) >= 1)
    if duplicates and len(index) > 1 and draw(st.booleans()):
        index = index[draw(st.lists(st.integers(0, len(index) - 1), min_size=len(index), max_size=len(index)))]
    x = pool[index]
    y = torch.where(score[index] >= 0, 1.0, -1.0).to(torch.float64)
    _, layer_slopes = forward_with_slopes(net, x)
    kernel = path_kernel(x, layer_slopes, bias=net.biases is not None).numpy()
    rank = np.linalg.matrix_rank(kernel)
    event(f"m = {len(index)}")
    event("rank-deficient kernel" if rank < len(index) else "full-rank kernel")
    note(f"m={len(index)} depth={net.depth} widths={net.hidden_widths} bias={net.biases is not None} "
         f"betas={net.betas} gammas={net.gammas} rank={np.linalg.matrix_rank(kernel)}")
    return net, x, y.numpy(), kernel, phi[index]


def _check_kkt(result, kernel, y, phi=None) -> None:
    alpha = result.alpha_
    q = kernel * np.outer(y, y)
    functional = q @ alpha
    assert alpha.shape == y.shape and np.all(alpha >= 0)
    assert result.support_.tolist() == np.flatnonzero(alpha > 0).tolist()
    assert np.all(functional >= 1 - KKT), functional
    assert np.all(np.abs(functional[result.support_] - 1) <= KKT), functional[result.support_]
    np.testing.assert_allclose(result.functional_margins, functional, rtol=0, atol=KKT)
    assert result.kkt_residual <= KKT and result.n_margin_violations == 0
    quad = float(alpha @ q @ alpha)
    assert result.norm_v_sq == pytest.approx(alpha.sum(), rel=KKT)
    assert quad == pytest.approx(alpha.sum(), rel=KKT)
    assert result.margin == pytest.approx(1 / math.sqrt(alpha.sum()), rel=KKT)
    assert result.intercept_ == 0.0 and result.method == "active-set"
    if phi is not None:  # ||v||² in path space, v = Σ α_i y_i phi(x_i)
        v = torch.from_numpy(alpha * y) @ phi
        assert float(v @ v) == pytest.approx(alpha.sum(), rel=KKT)


@settings(max_examples=examples(150), **PROFILE)
@given(separable_problems())
def test_solver_satisfies_kkt_conditions(problem):
    _, _, y, kernel, phi = problem
    result = max_margin(kernel, y)
    _check_kkt(result, kernel, y, phi)
    # the column-callable form asks for the same columns and must take the same steps
    lazy = max_margin(lambda idx: kernel[:, idx], y, kernel_diag=np.diag(kernel))
    np.testing.assert_allclose(lazy.alpha_, result.alpha_, rtol=0, atol=1e-12 * result.alpha_.max())
    assert lazy.support_.tolist() == result.support_.tolist()
    assert lazy.norm_v_sq == pytest.approx(result.norm_v_sq, rel=1e-12)
    # torch inputs are accepted as well
    as_torch = max_margin(torch.from_numpy(kernel), torch.from_numpy(y))
    np.testing.assert_array_equal(as_torch.alpha_, result.alpha_)


@settings(max_examples=examples(150), **PROFILE)
@given(separable_problems(max_m=8))
def test_solver_matches_exhaustive_search(problem):
    _, _, y, kernel, _ = problem
    result = max_margin(kernel, y)
    found = exhaustive_max_margin(kernel, y, feasibility_tol=KKT)
    assert found, "the exhaustive search found no KKT point"
    sums = np.array([s for _, _, s in found])
    best = float(sums.min())
    # every KKT point has the same Σα = ||v||² (v is unique); the solver's dual objective is −½Σα
    assert float(sums.max()) == pytest.approx(best, rel=KKT)
    assert result.alpha_.sum() == pytest.approx(best, rel=KKT)
    objective = 0.5 * result.alpha_ @ (kernel * np.outer(y, y)) @ result.alpha_ - result.alpha_.sum()
    assert objective == pytest.approx(-0.5 * best, rel=KKT)
    assert result.margin == pytest.approx(1 / math.sqrt(best), rel=KKT)
    eig = np.linalg.eigvalsh(kernel)
    if eig.min() > 1e-6 * eig.max():  # Q positive definite: α is unique, so is the support
        # significant α only: a sample exactly on the margin may keep an α of rounding size, in the solver (see
        # test_degenerate_margin_sample_is_not_a_support_vector) as in the search
        condition = eig.max() / eig.min()

        def significant(alpha):  # rounding errors in α are of order cond(K)·eps·max α
            return tuple(np.flatnonzero(alpha > 1e-13 * condition * alpha.max()).tolist())

        supports = {significant(alpha) for _, alpha, _ in found}
        assert supports == {significant(result.alpha_)}
        for _, alpha, _ in found:
            np.testing.assert_allclose(result.alpha_, alpha, rtol=1e-6, atol=1e-9 * alpha.max())


@settings(max_examples=examples(80), **PROFILE)
@given(separable_problems(duplicates=False), st.data())
def test_duplicates_permutations_and_scaling(problem, data):
    _, _, y, kernel, _ = problem
    m = len(y)
    unique = max_margin(kernel, y)
    # permuting the samples permutes the solution
    perm = np.asarray(data.draw(st.permutations(range(m))))
    permuted = max_margin(kernel[np.ix_(perm, perm)], y[perm])
    assert permuted.alpha_.sum() == pytest.approx(unique.alpha_.sum(), rel=KKT)
    # scaling the kernel by c divides α by c
    c = data.draw(st.sampled_from([1e-3, 0.5, 3.0, 1e4]))
    scaled = max_margin(c * kernel, y)
    assert scaled.alpha_.sum() == pytest.approx(unique.alpha_.sum() / c, rel=KKT)
    _check_kkt(scaled, c * kernel, y)
    # duplicating samples: same margin; the duplicates' α sum to the α of the original
    rows = np.asarray(data.draw(st.lists(st.integers(0, m - 1), min_size=1, max_size=m)))
    rows = np.concatenate([np.arange(m), rows])
    data.draw(st.just(rows.tolist()), label="rows")
    dup = max_margin(kernel[np.ix_(rows, rows)], y[rows])
    _check_kkt(dup, kernel[np.ix_(rows, rows)], y[rows])
    assert dup.alpha_.sum() == pytest.approx(unique.alpha_.sum(), rel=KKT)
    assert dup.margin == pytest.approx(unique.margin, rel=KKT)
    eig = np.linalg.eigvalsh(kernel)
    if eig.min() > 1e-6 * eig.max():
        np.testing.assert_allclose(permuted.alpha_, unique.alpha_[perm], rtol=1e-6, atol=1e-9 * unique.alpha_.max())
        merged = np.bincount(rows, weights=dup.alpha_, minlength=m)
        np.testing.assert_allclose(merged, unique.alpha_, rtol=1e-6, atol=1e-9 * unique.alpha_.max())


@settings(max_examples=examples(30), **PROFILE)
@given(separable_problems(duplicates=False), st.sampled_from([None, 0, 1, 3]))
def test_initial_guess_does_not_change_the_solution(problem, n_initial):
    _, _, y, kernel, _ = problem
    result = max_margin(kernel, y)
    initial = None if n_initial is None else np.arange(min(n_initial, len(y)))
    guessed = max_margin(lambda idx: kernel[:, idx], y, kernel_diag=np.diag(kernel), initial=initial)
    _check_kkt(guessed, kernel, y)
    assert guessed.alpha_.sum() == pytest.approx(result.alpha_.sum(), rel=KKT)


# --------------------------------------------------------------------------------------- label conventions

@st.composite
def network_separated(draw):
    """A network and samples of both classes that it classifies with ``|N(x)|`` bounded away from 0 (Assumption 1;
    the analysis refuses one class)."""
    net = draw(networks(slopes=solver_betas))
    assume(path_norm_squared(net) > 0)
    m = draw(st.integers(2, 10))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    pool = _values(rng, "gauss", (60, net.in_features), 1.0)
    outputs, _ = forward_with_slopes(net, pool)
    phi = materialise_phi(net, pool)
    keep = outputs.abs() >= 0.05 * phi.norm(dim=1) * math.sqrt(path_norm_squared(net))
    keep &= outputs != 0
    index = torch.nonzero(keep).flatten()[:m]
    labels = torch.where(outputs[index] >= 0, 1, -1)
    assume(len(torch.unique(labels)) == 2)
    return net, pool[index], labels


@settings(max_examples=examples(30), **PROFILE)
@given(network_separated(), st.sampled_from(["dense", "columns"]))
def test_zero_one_labels_give_the_same_analysis_as_signed_labels(case, kernel_mode):
    net, x, y_pm = case
    y01 = (y_pm > 0).to(torch.int64)
    assert torch.equal(signed_labels(y01), y_pm.to(torch.float64))
    assert torch.equal(signed_labels(y01.bool()), y_pm.to(torch.float64))
    assert torch.equal(signed_labels(y_pm), y_pm.to(torch.float64))
    a = network_support_vectors(net, x, y_pm, x, y_pm, kernel=kernel_mode)
    b = network_support_vectors(net, x, y01, x, y01, kernel=kernel_mode)
    np.testing.assert_array_equal(a.svm.alpha_, b.svm.alpha_)
    assert a.svm.support_.tolist() == b.svm.support_.tolist()
    for name in ("margin_ratio", "cosine", "network_margin", "val_agreement", "val_errors_network",
                 "val_errors_svm", "bound"):
        assert getattr(a, name) == getattr(b, name), name
    # against the materialised path space: ||v||², the cosine and the margin ratio
    phi, wbar = materialise_phi(net, x), materialise_wbar(net)
    yf = y_pm.to(torch.float64)
    kernel = (phi @ phi.T).numpy()
    _check_kkt(a.svm, kernel, yf.numpy(), phi)
    v = torch.from_numpy(a.svm.alpha_) * yf @ phi
    assert a.cosine == pytest.approx(float(v @ wbar / (v.norm() * wbar.norm())), rel=1e-8, abs=1e-12)
    assert a.cosine <= 1 + 1e-9 and a.margin_ratio <= 1 + 1e-8
    assert a.val_errors_network == 0 and a.val_errors_svm == 0 and a.val_agreement == 1.0
    # the decision function with 0/1 or ±1 support labels
    sv = torch.from_numpy(a.svm.support_)
    d_pm = max_margin_decision(net, x[sv], y_pm[sv], a.svm.alpha_[a.svm.support_], x)
    d01 = max_margin_decision(net, x[sv], y01[sv], a.svm.alpha_[a.svm.support_], x)
    assert torch.equal(d_pm, d01)
    np.testing.assert_allclose((yf * d_pm).numpy(), a.svm.functional_margins, rtol=0, atol=KKT)


# --------------------------------------------------------------------------------------------- regressions

def test_degenerate_margin_sample_is_not_a_support_vector():
    # Found by test_solver_matches_exhaustive_search (grid inputs, depth 0). K is positive definite, so α is
    # unique: α = (4/15, 0, 0, 8/15); sample 2 lies exactly on the margin (y f = 1) with α_2 = 0.
    x = np.array([[0.5, 1, 1, 0], [1, 1, 1, -1], [0.5, 1, 0, -1], [0.5, 1, -0.5, 0]])
    result = max_margin(x @ x.T, np.ones(4))
    np.testing.assert_allclose(result.alpha_, [4 / 15, 0, 0, 8 / 15], rtol=1e-12, atol=1e-12)
    assert result.support_.tolist() == [0, 3]  # it reported [0, 2, 3] with alpha_[2] = 2.2e-16 (rounding)


@settings(max_examples=examples(60), **PROFILE)
@given(st.data(), st.sampled_from([1, 2, 3, 64]), st.sampled_from([3, 7, None]))
def test_input_gram_cache_serves_exact_rows_through_requests_and_keeps(data, compact_rows, chunk_rows):
    """Random requests (repeats, orders, kept and new rows) and keeps: every row served equals ``X Xᵀ``, kernel
    rows through the cache equal those without it, and a keep holds at most twice the kept rows' memory."""
    from lightning_nsv.kernel import InputGramCache, PathKernelColumns, gram_cache, inputs

    m, f = data.draw(st.integers(5, 30), label="m"), 3
    x = torch.randn(m, f, dtype=torch.float64, generator=torch.Generator().manual_seed(data.draw(st.integers(0, 99))))
    gram = (x @ x.T).numpy()
    slopes = [(torch.arange(m * 2).reshape(m, 2) % 3 == 0).double()]  # one layer of 2 ReLU-type units
    old_compact, old_chunk = gram_cache.COMPACT_ROWS, inputs.INPUT_CHUNK_BYTES
    gram_cache.COMPACT_ROWS = compact_rows
    if chunk_rows:
        inputs.INPUT_CHUNK_BYTES = chunk_rows * f * 8
    try:
        cache = InputGramCache()
        cached = PathKernelColumns(x, slopes, [0.0], [1.0], input_gram_cache=cache)
        plain = PathKernelColumns(x, slopes, [0.0], [1.0])
        samples = st.lists(st.integers(0, m - 1), max_size=2 * m)
        for _ in range(data.draw(st.integers(1, 6), label="steps")):
            idx = torch.tensor(data.draw(samples, label="request"), dtype=torch.long)
            np.testing.assert_allclose(cache.rows(x, idx).numpy(), gram[idx.numpy()], rtol=0, atol=1e-12)
            np.testing.assert_allclose(cached.rows(idx).numpy(), plain.rows(idx).numpy(), rtol=0, atol=1e-12)
            if data.draw(st.booleans(), label="keep"):
                kept = torch.tensor(data.draw(samples, label="kept"), dtype=torch.long)
                expected = sorted(set(kept.tolist()) & set(cache.samples.tolist()))
                cache.keep(kept)
                assert sorted(cache.samples.tolist()) == expected and len(cache) == len(expected)
                assert cache.nbytes <= 8 * m * 2 * len(expected)
                held = cache.samples
                np.testing.assert_allclose(cache.rows(x, held).numpy(), gram[held.numpy()], rtol=0, atol=1e-12)
    finally:
        gram_cache.COMPACT_ROWS, inputs.INPUT_CHUNK_BYTES = old_compact, old_chunk
