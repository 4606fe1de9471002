"""Ψ's spectrum and rank (lightning_nsv.analysis.psi): the full SVD, the streaming R factor and the fast route
against torch.linalg.svdvals / matrix_rank on hand-made and known-spectrum matrices."""
import math

import numpy as np
import pytest
import torch

from lightning_nsv.analysis.psi import matrix_with_singular_values, psi_spectrum, psi_spectrum_streaming, r_factor
from lightning_nsv.analysis.psi_fast import GRAM_SHIFT
from lightning_nsv.analysis.psi_result import EPS64, spectrum_summary
from lightning_nsv.analysis.psi_ritz import _TransposedProducts
from lightning_nsv.errors import NonFiniteError


def _low_rank(n, m, r, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, r, generator=g, dtype=torch.float64) @ torch.randn(r, m, generator=g, dtype=torch.float64)


CASES = {
    "full_wide": (_low_rank(20, 45, 20), 20),
    "full_tall": (_low_rank(30, 12, 12), 12),
    "deficient_wide": (_low_rank(20, 45, 7), 7),
    "deficient_tall": (_low_rank(30, 12, 5), 5),
    "duplicate_rows": (torch.cat([_low_rank(10, 25, 10)] * 2), 10),
    "zero_column": (torch.cat([_low_rank(8, 9, 8), torch.zeros(8, 1, dtype=torch.float64)], 1), 8),
}


@pytest.mark.parametrize("name", CASES)
def test_psi_spectrum_matches_matrix_rank_and_svd(name):
    psi, rank = CASES[name]
    spec = psi_spectrum(psi.to(torch.float32).numpy() if name == "full_wide" else psi, "full")
    psi = psi.to(torch.float32).to(torch.float64) if name == "full_wide" else psi
    assert spec.rank == rank == int(torch.linalg.matrix_rank(psi))
    s = torch.linalg.svdvals(psi)
    assert spec.sigma_max == pytest.approx(float(s[0]), rel=1e-12)
    assert spec.sigma_min == pytest.approx(float(s[-1]), abs=1e-12 * float(s[0]))
    assert spec.tolerance == pytest.approx(float(s[0]) * max(psi.shape) * torch.finfo(torch.float64).eps)
    assert spec.full_rank == (rank == psi.shape[0])
    metrics = spec.to_metrics()
    assert set(metrics) == {"rank", "sigma_min", "sigma_max", "condition_number", "num_samples", "num_units",
                            "full_rank"}
    assert (metrics["num_samples"], metrics["num_units"]) == tuple(float(d) for d in psi.shape)
    assert all(isinstance(v, float) for v in metrics.values())


def test_psi_spectrum_is_not_centred_and_condition_number():
    psi = torch.ones(3, 2, dtype=torch.float64)  # centring would make it zero
    spec = psi_spectrum(psi)
    assert spec.rank == 1 and not spec.full_rank
    assert spec.sigma_max == pytest.approx(math.sqrt(6))
    assert spec.condition_number > 1e12 or spec.condition_number == math.inf
    assert psi_spectrum(torch.diag(torch.tensor([4.0, 2.0]))).condition_number == pytest.approx(2.0)


def test_psi_spectrum_errors():
    with pytest.raises(ValueError, match=r"`psi` must be a non-empty 2-D matrix, got shape \(3,\)"):
        psi_spectrum(torch.ones(3))
    with pytest.raises(ValueError, match=r"got shape \(0, 3\)"):
        psi_spectrum(torch.ones(0, 3))


def _ill_conditioned(n, m, seed=0):
    """Singular values 1 .. 1e-12 (rank min(n, m) at the float64 tolerance): a Gram matrix would lose the tail."""
    g = torch.Generator().manual_seed(seed)
    k = min(n, m)
    u = torch.linalg.qr(torch.randn(n, k, generator=g, dtype=torch.float64)).Q
    v = torch.linalg.qr(torch.randn(m, k, generator=g, dtype=torch.float64)).Q
    return u @ torch.diag(torch.logspace(0, -12, k, dtype=torch.float64)) @ v.T


CASES["ill_wide"] = (_ill_conditioned(15, 40), 15)
CASES["ill_tall"] = (_ill_conditioned(40, 15), 15)


@pytest.mark.parametrize("rows", [1, 5, 100])
@pytest.mark.parametrize("name", ["full_tall", "deficient_tall", "ill_tall", "duplicate_rows"])
def test_r_factor_has_the_singular_values_of_the_stacked_matrix(name, rows):
    psi, rank = CASES[name]
    r = r_factor((psi[i:i + 3] for i in range(0, len(psi), 3)), rows_per_qr=rows)
    assert r.shape == (min(psi.shape), psi.shape[1])
    direct = torch.linalg.svdvals(psi)
    torch.testing.assert_close(torch.linalg.svdvals(r), direct, rtol=1e-9, atol=1e-13 * float(direct[0]))
    with pytest.raises(ValueError, match="`blocks` yielded no block"):
        r_factor([], 4)


@pytest.mark.parametrize("name", ["full_wide", "full_tall", "deficient_wide", "deficient_tall", "ill_wide", "ill_tall"])
@pytest.mark.parametrize("limit", ["direct", "streaming"])
def test_streaming_routes_agree_with_direct_svd(name, limit):
    psi, rank = CASES[name]
    n, m = psi.shape
    k, calls = min(n, m), []

    def blocks(cols):
        calls.append(cols)
        return (psi[i:i + 7, cols] for i in range(0, n, 7))

    max_bytes = 8 * n * m if limit == "direct" else 8 * k * k + 8 * k * k  # R plus k buffered rows
    spec, direct = psi_spectrum_streaming(blocks, n, m, max_bytes), psi_spectrum(psi)
    assert spec.method == ("svd" if limit == "direct" else "qr")
    assert spec.rank == direct.rank == rank
    assert spec.tolerance == pytest.approx(direct.tolerance, rel=1e-9)
    s0 = float(direct.singular_values[0])  # singular values are accurate to about eps·σ_max in absolute terms
    torch.testing.assert_close(spec.singular_values[:rank], direct.singular_values[:rank], rtol=1e-8, atol=1e-14 * s0)
    if limit == "streaming" and m > n:  # the rows of Ψᵀ come from column chunks of width k
        assert len(calls) == math.ceil(m / k) and calls[0] == slice(0, k)


def test_streaming_errors():
    psi = _low_rank(10, 12, 10)
    with pytest.raises(ValueError, match=r"even its 10x10 R factor with as many buffered rows .* exceeds "
                                         r"max_memory_bytes=100; raise the limit"):
        psi_spectrum_streaming(lambda cols: [psi[:, cols]], 10, 12, 100)
    with pytest.raises(ValueError, match=r"the blocks of Ψ add up to \(5, 12\), expected N x M = 10x12"):
        psi_spectrum_streaming(lambda cols: [psi[:5, cols]], 10, 12, 10**6)
    with pytest.raises(ValueError, match=r"the streamed rows have 12 columns, expected min\(N, M\) = 10"):
        psi_spectrum_streaming(lambda cols: [psi[:, cols]], 40, 10, 2000)  # claims N = 40, M = 10




@pytest.mark.parametrize("spectrum", ["fast", "full"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_psi_is_an_error_naming_its_first_row(spectrum, value, monkeypatch):
    monkeypatch.setattr("lightning_nsv.analysis.psi.SMALL_SIDE", 0)
    psi = _low_rank(20, 30, 20)
    psi[7, 3] = psi[12, 0] = value
    with pytest.raises(NonFiniteError, match=r"`psi` has non-finite values \(NaN or inf\) in 2 of its 20 rows, "
                                             r"the first row 7: a diverged network"):
        psi_spectrum(psi, spectrum)
    for limit in (8 * 20 * 30, 2 * 8 * 20 * 20):  # assembled, and streamed through its R factor
        with pytest.raises(NonFiniteError, match="non-finite values"):
            psi_spectrum_streaming(lambda cols: (psi[i:i + 7, cols] for i in range(0, 20, 7)), 20, 30, limit, spectrum)


# ------------------------------------------------------------------------------------------------ fast route
def _known(kind, k):
    r, gap = int(0.7 * k), k // 10
    return {
        "full": np.logspace(0, -6, k),
        "deficient": np.concatenate([np.logspace(0, -4, r), np.zeros(k - r)]),
        "near_deficient": np.concatenate([np.logspace(0, -3, k - gap), np.full(gap, 1e-8)]),
    }[kind]


@pytest.fixture
def fast_everywhere(monkeypatch):
    monkeypatch.setattr("lightning_nsv.analysis.psi.SMALL_SIDE", 0)  # small matrices take the fast route too


@pytest.mark.parametrize("kind", ["full", "deficient", "near_deficient"])
@pytest.mark.parametrize("shape", [(120, 150), (150, 120), (100, 100)])
def test_fast_route_matches_svdvals(kind, shape, fast_everywhere):
    n, m = shape
    s = _known(kind, min(n, m))
    psi = matrix_with_singular_values(s, n, m, seed=n + m)
    exact = torch.linalg.svdvals(psi)
    fast = psi_spectrum(psi)
    assert fast.method == "gram" and fast.singular_values is None
    assert fast.rank == int(torch.linalg.matrix_rank(psi)) == int((s > s[0] * max(n, m) * EPS64).sum())
    assert fast.sigma_max == pytest.approx(float(exact[0]), rel=1e-9)
    assert fast.tolerance == pytest.approx(float(exact[0]) * max(n, m) * EPS64, rel=1e-12)
    if s[-1] > 0:
        assert fast.sigma_min == pytest.approx(s[-1], rel=1e-6) and fast.sigma_min == pytest.approx(float(exact[-1]),
                                                                                                    rel=1e-6)
        torch.testing.assert_close(fast.bottom, exact[-len(fast.bottom):], rtol=1e-6, atol=0)
    else:
        assert fast.sigma_min < fast.tolerance and float(exact[-1]) < fast.tolerance
    torch.testing.assert_close(fast.top, exact[:len(fast.top)], rtol=1e-6, atol=0)
    assert fast.full_rank == (fast.rank == n)


@pytest.mark.parametrize("factor", [0.3, 3.0])
def test_fast_route_falls_back_near_the_tolerance(factor, fast_everywhere):
    n, m = 90, 110
    tol = m * EPS64
    s = np.concatenate([np.logspace(0, -2, 85), np.full(5, factor * tol)])
    psi = matrix_with_singular_values(s, n, m, seed=3)
    fast, full = psi_spectrum(psi), psi_spectrum(psi, "full")
    assert fast.method == "svd" and fast.rank == full.rank == int(torch.linalg.matrix_rank(psi))
    assert fast.rank == (90 if factor > 1 else 85)


def test_matrix_with_singular_values_and_errors():
    s = np.array([3.0, 2.0, 0.5])
    a = matrix_with_singular_values(s, 5, 7, seed=1)
    assert a.shape == (5, 7) and a.dtype == torch.float64
    torch.testing.assert_close(torch.linalg.svdvals(a)[:3], torch.from_numpy(s))
    assert float((a == 0).sum()) == 0  # dense
    with pytest.raises(ValueError, match=r"at most min\(rows, cols\) = 2 singular values, got shape \(3,\)"):
        matrix_with_singular_values(s, 2, 7)
    with pytest.raises(ValueError, match="`spectrum` can be fast, full, got 'exact'"):
        psi_spectrum(torch.eye(3), "exact")


def test_threads_restored_summary_and_fast_plot(fast_everywhere):
    threads = torch.get_num_threads()
    psi = matrix_with_singular_values(_known("deficient", 40), 40, 50, seed=0)
    spec = psi_spectrum(psi, torch_threads=1, num_extremes=4)
    assert torch.get_num_threads() == threads
    # rank-deficient: ``bottom`` is one number, a bound on σ_{rank+1}, ..., σ_min below the tolerance
    assert spec.method == "gram" and len(spec.top) == 4 and len(spec.bottom) == 1 and spec.sigma_min < spec.tolerance
    assert spec.summary() == spectrum_summary(spec.to_metrics())
    assert spec.summary().startswith("Ψ: N=40, M=50, rank 28 < N (σ_min ")
    assert spec.summary().endswith("): the no-bad-valley condition does not hold")
    full = psi_spectrum(torch.eye(3))
    assert full.summary() == "Ψ: N=3, M=3, rank 3 = N (σ_min 1, cond 1): the no-bad-valley condition holds"
    for result in (spec, full):
        fig, ax = result.plot()
        assert ax.get_xlabel() == "index i (descending order)" and ax.get_ylabel() == "singular value σᵢ of Ψ"
    assert [line.get_label() for line in spec.plot()[1].get_lines()][:2] == ["largest 4", "smallest 1"]


@pytest.mark.parametrize("kappa", [1e4, 1e6, 1e7])
@pytest.mark.parametrize("shape", [(300, 360), (360, 300)])
def test_fast_route_full_rank_up_to_kappa_1e7(kappa, shape, fast_everywhere):
    n, m = shape
    s = np.logspace(0, -math.log10(kappa), min(n, m))
    psi = matrix_with_singular_values(s, n, m, seed=7)
    fast, exact = psi_spectrum(psi), torch.linalg.svdvals(psi)
    assert fast.method == "gram"  # certified
    assert fast.rank == min(n, m) == int(torch.linalg.matrix_rank(psi))
    assert fast.full_rank == (n <= m)
    assert fast.sigma_min == pytest.approx(s[-1], rel=1e-6) and fast.sigma_max == pytest.approx(1.0, rel=1e-6)
    assert fast.condition_number == pytest.approx(float(exact[0] / exact[-1]), rel=1e-6)
    if fast.method == "gram":  # the certified bounds hold and meet CERT_RTOL
        assert abs(fast.sigma_min - s[-1]) <= fast.sigma_min_error <= 1e-6 * fast.sigma_min
        assert abs(fast.sigma_max - 1.0) <= fast.sigma_max_error <= 1e-6
    else:
        assert fast.sigma_min_error is None and fast.singular_values is not None


def test_fast_route_clustered_spectrum(fast_everywhere):
    # 60 equal smallest values, 40 equal largest ones: no gap inside either cluster for Krylov to use
    s = np.concatenate([np.full(40, 2.0), np.logspace(0, -2, 200), np.full(60, 3e-5)])
    psi = matrix_with_singular_values(s, 300, 330, seed=11)
    fast = psi_spectrum(psi)
    assert fast.method == "gram" and fast.rank == 300
    assert fast.sigma_min == pytest.approx(3e-5, rel=1e-6) and fast.sigma_max == pytest.approx(2.0, rel=1e-6)
    torch.testing.assert_close(fast.bottom, torch.full_like(fast.bottom, 3e-5), rtol=1e-6, atol=0)


@pytest.mark.parametrize("cluster", [60, 100])
def test_fast_route_certifies_a_cluster_at_the_gram_matrix_rounding(cluster):
    # σ² = 1e-16 of `cluster` equal values is below the Gram matrix's rounding, and more of them than the default
    # window of Ritz pairs: only a window over the whole cluster, bounded through its gap to 1e-3, certifies them
    n, m = 600, 720
    s = np.concatenate([np.logspace(0, -3, n - cluster), np.full(cluster, 1e-8)])
    fast = psi_spectrum(matrix_with_singular_values(s, n, m, seed=cluster))
    assert fast.method == "gram" and fast.rank == n
    assert fast.sigma_min == pytest.approx(1e-8, rel=1e-6) and fast.sigma_min_error <= 1e-6 * fast.sigma_min
    torch.testing.assert_close(fast.bottom, torch.full_like(fast.bottom, 1e-8), rtol=1e-6, atol=0)


@pytest.fixture
def gram_not_positive_definite(monkeypatch):
    """The unshifted Cholesky factorisation fails, as it does on some machines when σ_min² is at the Gram matrix's
    rounding: the shifted one must answer."""
    import lightning_nsv.analysis.psi_fast as psi_fast

    calls, cholesky = [], psi_fast._cholesky

    def failing_unshifted(gram, shift=0.0):
        calls.append(shift)
        return (None, gram.shape[0]) if shift == 0.0 else cholesky(gram, shift)  # fails at the last row

    monkeypatch.setattr(psi_fast, "_cholesky", failing_unshifted)
    return calls


def test_reported_smallest_values_certified_sigma_min_tighter_than_the_rest():
    from lightning_nsv.analysis.psi_ritz import CERT_RTOL, EXTREMES_RTOL, _Ritz

    values = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    ritz = lambda *errors: _Ritz(values, torch.tensor(errors, dtype=torch.float64), torch.empty(0))  # noqa: E731
    assert ritz(0.5 * CERT_RTOL, 2 * 0.5 * EXTREMES_RTOL, 3 * 0.5 * EXTREMES_RTOL).extremes_certified(3, CERT_RTOL)
    assert not ritz(2 * CERT_RTOL, 0.0, 0.0).extremes_certified(3, CERT_RTOL)  # σ_min decides
    assert not ritz(0.0, 0.0, 3 * 2 * EXTREMES_RTOL).extremes_certified(3, CERT_RTOL)
    assert ritz(0.0, 0.0, 3 * 2 * EXTREMES_RTOL).extremes_certified(2, CERT_RTOL)
    assert ritz(0.4, 0.0, 0.0).extremes_certified(3, 0.5)  # a looser rtol applies to all


def test_shifted_cholesky_leaves_the_gram_matrix_as_it_was():
    from lightning_nsv.analysis.psi_fast import _cholesky

    b = matrix_with_singular_values(np.concatenate([np.ones(5), np.zeros(3)]), 8, 10, seed=1)
    # rank 5 of 8, its null space pushed to -1e-6: indefinite with a margin far above rounding (b bᵀ alone has
    # eigenvalues ±2e-16 there, and whether its Cholesky fails depends on the LAPACK path); the leading 5×5
    # block stays positive definite (smallest eigenvalue 0.11)
    gram = b @ b.T - 1e-6 * torch.eye(8, dtype=torch.float64)
    saved = gram.clone()
    factor, failed_at = _cholesky(gram)
    assert factor is None and 5 < failed_at <= 8
    factor, failed_at = _cholesky(gram, 1e-3)
    assert failed_at == 0
    assert torch.equal(gram, saved)
    torch.testing.assert_close(factor @ factor.T, saved + 1e-3 * torch.eye(8, dtype=torch.float64), rtol=0, atol=1e-14)


@pytest.mark.parametrize("cluster", [60, 100])
def test_shifted_factor_certifies_a_cluster_below_the_gram_matrix_rounding(cluster, gram_not_positive_definite):
    n, m = 600, 720
    s = np.concatenate([np.logspace(0, -3, n - cluster), np.full(cluster, 1e-8)])
    psi = matrix_with_singular_values(s, n, m, seed=cluster)
    fast, exact = psi_spectrum(psi), torch.linalg.svdvals(psi)
    assert gram_not_positive_definite[:2] == [0.0, pytest.approx(GRAM_SHIFT * n * EPS64, rel=1e-6)]  # σ_max = 1
    assert fast.method == "gram" and fast.rank == n
    assert abs(fast.sigma_min - float(exact[-1])) <= fast.sigma_min_error <= 1e-6 * fast.sigma_min
    torch.testing.assert_close(fast.bottom, torch.full_like(fast.bottom, 1e-8), rtol=1e-6, atol=0)


@pytest.mark.parametrize("kind", ["full", "deficient", "near_deficient"])
def test_shifted_factor_gives_the_svd_rank(kind, fast_everywhere, gram_not_positive_definite):
    s = _known(kind, 150)
    psi = matrix_with_singular_values(s, 150, 180, seed=4)
    fast = psi_spectrum(psi)
    assert fast.rank == int(torch.linalg.matrix_rank(psi)) == int((s > fast.tolerance).sum())
    if s[-1] > 0:
        assert fast.sigma_min == pytest.approx(float(torch.linalg.svdvals(psi)[-1]), rel=1e-6)
    else:
        assert fast.sigma_min < fast.tolerance


def test_cluster_window_spans_a_cluster_only_past_a_wide_gap():
    from lightning_nsv.analysis.psi_fast import _cluster_window

    def spectrum(cluster, below, rest=300):
        return torch.cat([torch.full((cluster,), 1e-16), torch.logspace(below, 0, rest, dtype=torch.float64)])

    assert _cluster_window(torch.logspace(-12, 0, 400, dtype=torch.float64), 8, 32, 1.0) is None  # no gap
    assert _cluster_window(spectrum(100, -6), 8, 32, 1.0) == 101  # the cluster and the first value past its gap
    assert _cluster_window(spectrum(100, -15), 8, 32, 1.0) is None  # a gap of 10 in σ², not CLUSTER_GAP
    assert _cluster_window(spectrum(10, -6), 8, 32, 1.0) is None  # the gap lies inside the default window
    assert _cluster_window(spectrum(100, -6)[:30], 8, 32, 1.0) is None  # no more pairs than the default window
    assert _cluster_window(spectrum(300, -6), 8, 32, 1.0) is None  # beyond 8 default windows (too costly, unconverged)
    flat = torch.full((200,), 1e-16, dtype=torch.float64)
    for outside in (-1e-20, 2.0):  # an estimate below 0 or above σ_max² ends the estimates looked at
        spoiled = torch.cat([flat[:100], torch.tensor([outside], dtype=torch.float64), flat[100:]])
        assert _cluster_window(spoiled, 8, 32, 1.0) is None


def test_fast_route_falls_back_beyond_the_gram_matrix(fast_everywhere):
    # κ = 1e11: the Gram matrix (κ² = 1e22) cannot resolve the tail; rank 300 nonetheless, by the exact route
    s = np.logspace(0, -11, 300)
    psi = matrix_with_singular_values(s, 300, 340, seed=5)
    fast, full = psi_spectrum(psi), psi_spectrum(psi, "full")
    assert fast.method == "svd" and fast.rank == full.rank == int(torch.linalg.matrix_rank(psi)) == 300
    assert fast.sigma_min == pytest.approx(1e-11, rel=1e-3)


def test_fast_route_deficient_bound_is_below_tolerance_and_above_the_truth(fast_everywhere):
    s = np.concatenate([np.logspace(0, -4, 500), np.zeros(100)])
    psi = matrix_with_singular_values(s, 600, 700, seed=2)
    fast, exact = psi_spectrum(psi), torch.linalg.svdvals(psi)
    assert fast.method == "gram" and fast.rank == 500 == int(torch.linalg.matrix_rank(psi))
    assert float(exact[500]) <= fast.sigma_min < fast.tolerance


@pytest.mark.parametrize("smallest", [1e-5, 1e-6])
def test_fast_route_certifies_a_deficient_rank_under_an_ill_conditioned_head(smallest, fast_everywhere):
    # the head rows' σ_min is 7e-7 / 1e-7: projecting by x = ω − B_headᵀ y (y ~ ‖ω‖/σ_min) left B_head x far
    # above its rounding and the remainder bound at 4.8e-12 / 3.9e-10, 30× / 2,500× the tolerance 1.6e-13 (the SVD)
    s = np.concatenate([np.logspace(0, np.log10(smallest), 420), np.zeros(180)])
    psi = matrix_with_singular_values(s, 600, 720, seed=0)
    fast, exact = psi_spectrum(psi), torch.linalg.svdvals(psi)
    assert fast.method == "gram" and fast.rank == 420 == int(torch.linalg.matrix_rank(psi))
    assert float(exact[420]) <= fast.sigma_min < fast.tolerance
    assert fast.sigma_max == pytest.approx(float(exact[0]), rel=1e-9)


@pytest.mark.parametrize("exponent", [-900, -300, -120, -33, 33, 120, 300, 900])
@pytest.mark.parametrize("kind", ["full", "deficient"])
def test_fast_route_of_a_matrix_scaled_far_from_one_is_the_scaled_spectrum(exponent, kind, fast_everywhere):
    # its residual Gram matrices hold σ⁴: unscaled, they overflowed or underflowed (a LinAlgError from eigh, or
    # σ_max off by 2e-4 at 1e-142); Ψ is scaled by a power of two, exactly: the answer is the scaled one bit for bit
    n, m = 90, 110
    psi = matrix_with_singular_values(_known(kind, n), n, m, seed=5)
    one, far = psi_spectrum(psi), psi_spectrum(psi * 2.0**exponent)
    factor = 2.0**exponent
    assert far.method == one.method == "gram" and far.rank == one.rank
    torch.testing.assert_close(far.top, one.top * factor, rtol=0, atol=0)
    torch.testing.assert_close(far.bottom, one.bottom * factor, rtol=0, atol=0)
    assert far.tolerance == one.tolerance * factor
    assert far.sigma_max_error == one.sigma_max_error * factor
    assert (far.sigma_min_error is None) == (one.sigma_min_error is None)
    if one.sigma_min_error is not None:
        assert far.sigma_min_error == one.sigma_min_error * factor
    exact = torch.linalg.svdvals(psi * factor)
    assert far.sigma_max == pytest.approx(float(exact[0]), rel=1e-9)


def test_transposed_products_multiply_only_the_new_columns_of_a_growing_basis():
    g = torch.Generator().manual_seed(0)
    b = torch.randn(30, 40, generator=g, dtype=torch.float64)
    x = torch.randn(30, 12, generator=g, dtype=torch.float64)
    rows = torch.tensor([0, 1, 2, 4, 5, 7, 9, 11, 13, 17, 20, 22, 25, 29])
    for chosen, basis in ((None, x), (rows, x[:14])):
        reference = (b if chosen is None else b[chosen]).T
        products, widths = _TransposedProducts(b, chosen), []
        products._of = lambda v, of=products._of: widths.append(v.shape[1]) or of(v)
        for cols in (4, 8, 8, 12):
            torch.testing.assert_close(products(basis[:, :cols]), reference @ basis[:, :cols], rtol=1e-14, atol=1e-14)
        assert widths == [4, 4, 0, 4]
        other = basis[:, :8].clone()
        other[0, 0] += 1.0  # not the basis seen before: all of it again
        torch.testing.assert_close(products(other), reference @ other, rtol=1e-14, atol=1e-14)
        assert widths[-1] == 8
        first, calls = products.rayleigh_ritz(other), len(widths)  # X, and the SVD of W = Bᵀ X
        assert widths[-1] == 0  # the columns of `other` were multiplied before
        assert products.rayleigh_ritz(other) is first and len(widths) == calls  # the same space again: nothing new
        q, left, mu, right_t = first
        torch.testing.assert_close(q.T @ q, torch.eye(8, dtype=torch.float64), rtol=0, atol=1e-14)
        torch.testing.assert_close(left * mu @ right_t, reference @ q, rtol=1e-13, atol=1e-13)


def _random_psi(kind, n, m, g):
    k = min(n, m)
    if kind == "gauss":
        return torch.randn(n, m, generator=g, dtype=torch.float64)
    if kind == "low_rank":
        r = int(torch.randint(1, k + 1, (1,), generator=g))
        return torch.randn(n, r, generator=g, dtype=torch.float64) @ torch.randn(r, m, generator=g, dtype=torch.float64)
    if kind == "duplicate_rows":
        return torch.randn(n, m, generator=g, dtype=torch.float64)[torch.randint(0, n, (n,), generator=g)]
    if kind == "zero_rows":
        a = torch.randn(n, m, generator=g, dtype=torch.float64)
        a[torch.rand(n, generator=g) < 0.3] = 0
        return a
    if kind == "integer":
        return torch.randint(0, 3, (n, m), generator=g).double()
    exponent = int(torch.randint(-1000, 1000, (1,), generator=g))  # "scaled": log-spaced σ, far from 1
    s = np.logspace(0, -float(torch.rand(1, generator=g)) * 6, k) * 2.0**exponent
    return matrix_with_singular_values(s, n, m, seed=int(torch.randint(1 << 30, (1,), generator=g)))


@pytest.mark.parametrize("kind", ["gauss", "low_rank", "duplicate_rows", "zero_rows", "integer", "scaled"])
def test_fast_route_agrees_with_the_svd_on_random_matrices(kind, fast_everywhere):
    g = torch.Generator().manual_seed(len(kind))
    for _ in range(12):
        n, m = (int(v) for v in torch.randint(10, 160, (2,), generator=g))
        psi = _random_psi(kind, n, m, g)
        fast, full = psi_spectrum(psi), psi_spectrum(psi, "full")
        assert fast.rank == full.rank, (kind, n, m, fast.method)
        assert fast.sigma_max == pytest.approx(full.sigma_max, rel=1e-9)
        if full.rank == min(n, m):  # σ_min to 1e-6, or to the SVD's own accuracy (eps·σ_max absolute)
            slack = max(1e-6, 50 * EPS64 * full.sigma_max / full.sigma_min)
            assert fast.sigma_min == pytest.approx(full.sigma_min, rel=slack)
        else:
            assert fast.sigma_min < fast.tolerance

