"""The loss-valley certificates of lightning_nsv.analysis.valley against direct computations and hand-made cases."""
import math

import pytest
import torch
import torch.nn.functional as F

from lightning_nsv.analysis import (assumption31_checks, count_duplicates, escape_path, filter_normalised_direction,
                                    lemma21_certificate, loss_surface_2d, psi_spectrum)


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
    assert s.losses.shape == (5, 5) and s.t1[2] == 0 == s.t2[2]
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
    with pytest.raises(ValueError, match=r"`span` must be > 0, got 0"):
        loss_surface_2d(lambda: 0.0, [w], span=0, num_points=3)


def test_plots_return_figure_and_axes():
    g = torch.Generator().manual_seed(0)
    spec = psi_spectrum(torch.randn(20, 7, generator=g, dtype=torch.float64) @ torch.randn(7, 45, generator=g,
                                                                                             dtype=torch.float64))
    path = escape_path(torch.eye(3), torch.zeros(3, 2), torch.tensor([0, 1, 1]), 0.1)
    w = torch.nn.Parameter(torch.randn(2, 2))
    surface = loss_surface_2d(lambda: (w ** 2).sum(), [w], num_points=3)
    for result in (spec, path, surface):
        fig, ax = result.plot()
        assert ax.figure is fig and ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    assert surface.plot()[1].get_xlabel() == "step along direction 1 (t₁)"


def test_every_result_has_metrics_and_a_report_on_one_base():
    from lightning_nsv.analysis import AnalysisResult

    results = [lemma21_certificate([0.1, 0.2]), psi_spectrum(torch.eye(3)),
               escape_path(torch.eye(4), torch.zeros(4, 3), torch.tensor([0, 1, 2, 0]), eps=0.1),
               assumption31_checks(["relu"], num_units=3, inputs=torch.eye(4))]
    for result in results:
        assert isinstance(result, AnalysisResult)
        metrics, report = result.to_metrics(), result.report()
        assert metrics and all(isinstance(v, float) for v in metrics.values()) and report
    assert all(key in results[0].report() for key in results[0].to_metrics())
    assert results[1].report() == results[1].summary()
    assert "Assumption 3.1.1: relu is not real analytic" in results[3].report()
