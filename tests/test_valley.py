"""The Ψ and loss-valley maths of lightning_nsv.valley against direct computations and hand-made cases."""
import math

import pytest
import torch
import torch.nn.functional as F

from lightning_nsv.valley import (
    assumption31_checks,
    count_duplicates,
    escape_path,
    filter_normalised_direction,
    lemma21_certificate,
    loss_surface_2d,
    psi_spectrum,
    psi_spectrum_streaming,
    r_factor,
)


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
    spec = psi_spectrum(psi.to(torch.float32).numpy() if name == "full_wide" else psi)
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


# ------------------------------------------------------------------------------------------------ Lemma 2.1
def test_lemma21_hand_made():
    c = lemma21_certificate([0.1, 0.2])  # mean 0.15 < log(2)/2 = 0.347
    assert c.certified and c.per_sample_certified and c.threshold == pytest.approx(math.log(2) / 2)
    c = lemma21_certificate(torch.tensor([0.5, 0.6]))  # mean 0.55 >= 0.347, but each < log 2
    assert not c.certified and c.per_sample_certified and c.num_at_least_log2 == 0
    c = lemma21_certificate([math.log(2), 0.0, 1.0, 0.1])
    assert c.num_at_least_log2 == 2 and not c.per_sample_certified
    assert c.mean_loss == pytest.approx((math.log(2) + 1.1) / 4) and c.max_loss == 1.0
    assert c.to_metrics()["num_losses_ge_log2"] == 2.0


def test_lemma21_certified_implies_zero_error():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        logits, y = 8 * torch.randn(16, 3, generator=g, dtype=torch.float64), torch.randint(3, (16,), generator=g)
        c = lemma21_certificate(F.cross_entropy(logits, y, reduction="none"))
        if c.certified or c.per_sample_certified:
            assert bool((logits.argmax(1) == y).all())


def test_lemma21_errors():
    with pytest.raises(ValueError, match=r"non-empty 1-D vector, got shape \(2, 2\)"):
        lemma21_certificate(torch.ones(2, 2))
    with pytest.raises(ValueError, match=r"non-empty 1-D vector, got shape \(0,\)"):
        lemma21_certificate([])
    with pytest.raises(ValueError, match=r"finite and >= 0 \(cross-entropy\), got min -1.0; pass reduction='none'"):
        lemma21_certificate([0.5, -1.0])
    with pytest.raises(ValueError, match="finite and >= 0"):
        lemma21_certificate([0.5, math.nan])


# ------------------------------------------------------------------------------------------------ escape path
@pytest.mark.parametrize("k", [2, 3, 10])
@pytest.mark.parametrize("with_bias", [False, True])
def test_escape_path_target_loss_is_half_eps(k, with_bias):
    g = torch.Generator().manual_seed(k)
    n, m, eps = 12, 20, 0.01
    psi = torch.rand(n, m, generator=g, dtype=torch.float64)  # full row rank almost surely
    V = torch.randn(m, k, generator=g, dtype=torch.float64)
    y = torch.randint(k, (n,), generator=g)
    b = torch.randn(k, generator=g, dtype=torch.float64) if with_bias else None
    p = escape_path(psi, V, y, eps, num_points=21, bias=b)
    assert p.t_star == pytest.approx(math.log((k - 1) / (math.exp(eps / 2) - 1)))
    assert p.target_loss == pytest.approx(eps / 2, rel=1e-8)  # every per-sample loss is log(1 + (K-1)e^-t*) = ε/2
    assert p.applies and p.residual < 1e-10
    g0 = psi @ V + (0 if b is None else b)
    assert p.start_loss == pytest.approx(float(F.cross_entropy(g0, y)), rel=1e-12)
    assert p.in_sublevel_set and p.max_loss == pytest.approx(p.start_loss) and p.max_convexity_gap <= 1e-12
    assert p.lambdas.shape == p.losses.shape == (21,)
    assert p.to_metrics()["escape_applies"] == 1.0


def test_escape_path_minimum_norm_and_doc_case():
    p = escape_path(torch.eye(4), torch.zeros(4, 3), torch.tensor([0, 1, 2, 0]), eps=0.1)
    assert p.target_loss == pytest.approx(0.05) and p.start_loss == pytest.approx(math.log(3))
    assert p.target_norm == pytest.approx(p.t_star * 2)  # V* = Y t*, one entry t* per row
    wide = torch.cat([torch.eye(2), torch.zeros(2, 3)], 1)  # min-norm: no weight on the zero columns
    assert escape_path(wide, torch.zeros(5, 2), torch.tensor([0, 1]), 0.2).target_norm == pytest.approx(
        math.sqrt(2) * math.log(1 / math.expm1(0.1)))


def test_escape_path_does_not_apply_when_rank_deficient():
    psi = torch.tensor([[1.0, 2.0], [1.0, 2.0], [0.0, 1.0]], dtype=torch.float64)  # equal rows, other labels
    p = escape_path(psi, torch.zeros(2, 2), torch.tensor([0, 1, 1]), eps=0.1)
    assert not p.applies and p.residual > 0.1
    assert p.target_loss > 0.05 + 0.1  # the least-squares V* cannot give ε/2 on the duplicated pair
    assert p.in_sublevel_set  # convexity in V still holds along the segment


def test_escape_path_errors():
    psi, V, y = torch.rand(4, 5), torch.zeros(5, 3), torch.tensor([0, 1, 2, 0])
    with pytest.raises(ValueError, match=r"`V` must be M x K with M = 5 \(the columns of psi\), got \(4, 3\)"):
        escape_path(psi, torch.zeros(4, 3), y, 0.1)
    with pytest.raises(ValueError, match=r"needs K >= 2 outputs, got V of shape \(5, 1\)"):
        escape_path(psi, torch.zeros(5, 1), torch.zeros(4, dtype=torch.long), 0.1)
    with pytest.raises(ValueError, match=r"`targets` must hold N = 4 labels \(the rows of psi\), got shape \(3,\)"):
        escape_path(psi, V, y[:3], 0.1)
    with pytest.raises(ValueError, match=r"class indices in 0..2, got range \[0, 3\]"):
        escape_path(psi, V, torch.tensor([0, 1, 3, 0]), 0.1)
    with pytest.raises(ValueError, match=r"`eps` must be > 0 \(the loss at V\* is eps/2\), got 0"):
        escape_path(psi, V, y, 0)
    with pytest.raises(ValueError, match="`num_points` must be >= 2"):
        escape_path(psi, V, y, 0.1, num_points=1)
    with pytest.raises(ValueError, match=r"`bias` must hold K = 3 values, got shape \(2,\)"):
        escape_path(psi, V, y, 0.1, bias=torch.zeros(2))


# ------------------------------------------------------------------------------------------------ Assumption 3.1
def test_assumption31_satisfied_for_sigmoid_and_softplus():
    c = assumption31_checks(["sigmoid", "softplus", "sigmoid"], num_units=5, inputs=torch.eye(5))
    assert c.satisfied and c.reasons == () and c.activations == ("sigmoid", "softplus")
    assert c.to_metrics() == {"assumption31_analytic_increasing": 1.0, "assumption31_skip_activation": 1.0,
                              "assumption31_m_ge_n": 1.0, "assumption31_num_duplicates": 0.0,
                              "assumption31_satisfied": 1.0}


@pytest.mark.parametrize("name, part, text", [
    ("relu", "3.1.1", "relu is not real analytic"),
    ("leaky_relu", "3.1.1", "leaky_relu is not real analytic"),
    ("abs", "3.1.1", "abs is neither real analytic"),
    ("gelu", "3.1.1", "'gelu' is not among the known"),
    ("tanh", "3.1.2", r"tanh skip units are neither sigmoid-like .* \(tanh tends to -1\)"),
    ("linear", "3.1.2", "linear skip units are neither"),
])
def test_assumption31_activation_reasons(name, part, text):
    c = assumption31_checks([name], num_units=3, inputs=torch.eye(3))
    assert not c.satisfied and len(c.reasons) == 1
    assert c.reasons[0].startswith(f"Assumption {part}: ")
    assert __import__("re").search(text, c.reasons[0])
    assert c.analytic_increasing == (part == "3.1.2") and not c.skip_activation
    if part == "3.1.1":
        assert "outside Theorem 3.4" in c.reasons[0]


def test_assumption31_counts_and_duplicates():
    x = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [2.0, 2.0]])
    assert count_duplicates(x) == 2 and count_duplicates(x.reshape(5, 1, 2)) == 2
    c = assumption31_checks(["sigmoid"], num_units=3, inputs=x)
    assert not c.m_ge_n and not c.distinct_inputs and c.num_duplicates == 2
    assert c.reasons == (
        "M >= N: only M = 3 skip units for N = 5 training samples, so rank Ψ <= 3 < N; add at least 2 skip units",
        "Assumption 3.1.3: 2 of the N = 5 training inputs repeat an earlier one, so Ψ has equal rows and rank < N; "
        "drop the duplicates",
    )
    with pytest.raises(ValueError, match="`activations` must name at least one hidden activation"):
        assumption31_checks([], 3, x)
    with pytest.raises(ValueError, match=r"`inputs` must hold N >= 1 samples along dim 0, got shape \(0, 2\)"):
        count_duplicates(torch.zeros(0, 2))


# ------------------------------------------------------------------------------------------------ 2-D slice
def test_filter_normalised_direction():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(4, 3, 2, 2)
    d = filter_normalised_direction(w, g)
    torch.testing.assert_close(d.flatten(1).norm(dim=1), w.flatten(1).norm(dim=1))
    assert not torch.equal(d, w)
    assert torch.equal(filter_normalised_direction(torch.ones(5), g), torch.zeros(5))


def test_loss_surface_quadratic_restores_parameters():
    w, b = torch.nn.Parameter(torch.randn(3, 4)), torch.nn.Parameter(torch.randn(3))
    w0, b0 = w.detach().clone(), b.detach().clone()

    def loss():
        return (w ** 2).sum() + (b ** 2).sum()

    s = loss_surface_2d(loss, [w, b], span=1.0, num_points=5, seed=3)
    assert torch.equal(w, w0) and torch.equal(b, b0)
    assert s.losses.shape == (5, 5) and s.alphas[2] == 0 == s.betas[2]
    assert s.losses[2, 2] == pytest.approx(s.center_loss, rel=1e-6)
    assert s.center_loss == pytest.approx(float(loss().detach()))
    # ||w + a d1 + b d2||² with ||d_i|| = ||w|| per row: at (±1, 0) the loss is ||w||²(1 ± 2cos + 1) + ||b||²
    assert float(s.losses.min()) >= 0 and s.to_metrics()["surface_max_loss"] == float(s.losses.max())
    again = loss_surface_2d(loss, [w, b], span=1.0, num_points=5, seed=3)
    assert torch.equal(again.losses, s.losses)


def test_loss_surface_restores_on_error_and_validates():
    w = torch.nn.Parameter(torch.ones(2, 2))
    calls = iter(range(100))

    def failing():
        if next(calls) == 3:
            raise RuntimeError("boom")
        return w.sum()

    with pytest.raises(RuntimeError, match="boom"):
        loss_surface_2d(failing, [w], num_points=3)
    assert torch.equal(w, torch.ones(2, 2))
    with pytest.raises(ValueError, match="`params` must hold at least one parameter tensor"):
        loss_surface_2d(lambda: 0.0, [])
    with pytest.raises(ValueError, match=r"`span` must be > 0 and `num_points` >= 2, got span=0, num_points=3"):
        loss_surface_2d(lambda: 0.0, [w], span=0, num_points=3)


def test_plots_return_figure_and_axes():
    spec = psi_spectrum(CASES["deficient_wide"][0])
    path = escape_path(torch.eye(3), torch.zeros(3, 2), torch.tensor([0, 1, 1]), 0.1)
    w = torch.nn.Parameter(torch.randn(2, 2))
    surface = loss_surface_2d(lambda: (w ** 2).sum(), [w], num_points=3)
    for result in (spec, path, surface):
        fig, ax = result.plot()
        assert ax.figure is fig and ax.get_title()
