"""Arguments that escape_path, assumption31_checks and the two skip-network monitors refuse, each with a message that
names the argument."""
import numpy as np
import pytest
import torch

from lightning_nsv.analysis import assumption31_checks, escape_path, loss_surface_2d, psi_spectrum
from lightning_nsv.callbacks import LossValleyMonitor, PsiRankMonitor
from lightning_nsv.errors import NonFiniteError

PSI, V, Y = torch.rand(6, 10), torch.randn(10, 3), torch.tensor([0, 1, 2, 0, 1, 2])


# ------------------------------------------------------------------------------------------------ escape_path
def test_escape_path_refuses_nan_psi_as_psi_spectrum_does():
    psi = PSI.clone()
    psi[2, 3] = float("nan")
    message = r"`psi` has non-finite values \(NaN or inf\) in 1 of its 6 rows, the first row 2"
    with pytest.raises(NonFiniteError, match=message):
        psi_spectrum(psi)
    with pytest.raises(NonFiniteError, match=message):
        escape_path(psi, V, Y, eps=0.1)


@pytest.mark.parametrize("name", ["V", "bias"])
def test_escape_path_refuses_non_finite_weights(name):
    kwargs = {"V": V.clone(), "bias": torch.zeros(3)}
    kwargs[name][1] = float("inf")
    with pytest.raises(NonFiniteError, match=f"`{name}` has non-finite values"):
        escape_path(PSI, kwargs["V"], Y, eps=0.1, bias=kwargs["bias"])


def test_escape_path_refuses_non_integer_targets_and_accepts_integral_floats():
    with pytest.raises(ValueError, match=r"`targets` must be integer class labels in 0\.\.2, got 0\.2"):
        escape_path(PSI, V, torch.tensor([0.2, 1.7, 2.9, 0.0, 1.0, 2.0]), eps=0.1)
    with pytest.raises(ValueError, match="`targets` must be integer class labels"):
        escape_path(PSI, V, torch.tensor([0.0, 1.0, float("nan"), 0.0, 1.0, 2.0]), eps=0.1)
    as_floats = escape_path(PSI, V, Y.double(), eps=0.1)
    assert torch.equal(as_floats.losses, escape_path(PSI, V, Y, eps=0.1).losses)


@pytest.mark.parametrize("eps", [float("inf"), float("nan"), -1.0])
def test_escape_path_refuses_eps_outside_its_range(eps):
    with pytest.raises(ValueError, match=rf"`eps` must be > 0 .*, got {eps}; valid: 0 < eps < inf"):
        escape_path(PSI, V, Y, eps=eps)


def test_escape_path_refuses_other_scalar_arguments():
    with pytest.raises(TypeError, match="`eps` must be a real number, got '0.1' \\(str\\)"):
        escape_path(PSI, V, Y, eps="0.1")
    with pytest.raises(TypeError, match=r"`num_points` must be >= 2 \(both endpoints\) and an integer, got 2\.5"):
        escape_path(PSI, V, Y, eps=0.1, num_points=2.5)
    for tol in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"`residual_tol` must be a relative residual in \[0, inf\)"):
            escape_path(PSI, V, Y, eps=0.1, residual_tol=tol)


def test_escape_path_takes_a_large_finite_eps():
    p = escape_path(torch.eye(4), torch.zeros(4, 3), torch.tensor([0, 1, 2, 0]), eps=1500.0)  # e^750 overflows
    assert p.applies and p.target_loss == pytest.approx(750.0)


# ------------------------------------------------------------------------------------------ assumption31_checks
def test_assumption31_refuses_a_bare_string():
    with pytest.raises(TypeError, match=r"`activations` must be a sequence of names, e\.g\. \['sigmoid'\]"):
        assumption31_checks("sigmoid", 100, torch.randn(5, 3))


@pytest.mark.parametrize("num_units, error", [(-1, ValueError), (0, ValueError), (2.5, TypeError), (True, TypeError)])
def test_assumption31_refuses_a_unit_count_that_is_no_positive_integer(num_units, error):
    with pytest.raises(error, match=r"`num_units` must be a positive integer \(M, the skip units\)"):
        assumption31_checks(["sigmoid"], num_units, torch.randn(5, 3))
    assert assumption31_checks(["sigmoid"], np.int64(5), torch.randn(5, 3)).m_ge_n


@pytest.mark.parametrize("options, error, message", [
    (dict(span=float("inf")), ValueError, r"`span` must be > 0, got inf"),
    (dict(span=0.0), ValueError, r"`span` must be > 0, got 0.0"),
    (dict(span="1"), TypeError, r"`span` must be a real number"),
    (dict(num_points=2.5), TypeError, r"`num_points` must be an integer >= 2, got 2.5"),
    (dict(num_points=1), ValueError, r"`num_points` must be an integer >= 2, got 1"),
])
def test_loss_surface_2d_refuses_a_grid_it_cannot_draw(options, error, message):
    weight = torch.nn.Parameter(torch.randn(3))
    with pytest.raises(error, match=message):
        loss_surface_2d(lambda: float((weight ** 2).sum()), [weight], **options)


def test_assumption31_names_are_case_insensitive():
    x = torch.randn(5, 3)
    upper = assumption31_checks(["Sigmoid", "SOFTPLUS"], 100, x)
    assert upper.satisfied and upper.reasons == ()
    assert upper == assumption31_checks(["sigmoid", "softplus"], 100, x)
    assert "relu is not real analytic" in assumption31_checks(["ReLU"], 100, x).reasons[0]


# ------------------------------------------------------------------------------------------------ the monitors
@pytest.mark.parametrize("kwargs, error, message", [
    ({"path_points": 2.5}, TypeError, r"`path_points` must be an integer, got 2\.5 \(float\); pass e\.g\. "
                                      "path_points=2"),
    ({"surface_points": 3.5}, TypeError, r"`surface_points` must be an integer, got 3\.5 \(float\)"),
    ({"seed": "a"}, TypeError, r"`seed` must be an integer, got 'a' \(str\)"),
    ({"eps": float("inf")}, ValueError, r"`eps` must be > 0 .* or None for log\(2\)/N, got inf; valid: 0 < eps < inf"),
    ({"eps": float("nan")}, ValueError, r"`eps` must be > 0 .*, got nan"),
    ({"eps": "0.1"}, TypeError, r"`eps` must be a real number, got '0\.1' \(str\)"),
    ({"surface_span": float("inf")}, ValueError, r"`surface_span` must be > 0, got inf; valid: 0 < surface_span < inf"),
    ({"log_figure": "no"}, TypeError, r"`log_figure` must be True or False, got 'no' \(str\)"),
    ({"prefix": 5}, TypeError, r"`prefix` must be a string, .* got 5"),
], ids=["path_points", "surface_points", "seed", "eps_inf", "eps_nan", "eps_str", "surface_span", "log_figure",
        "prefix"])
def test_loss_valley_monitor_refuses_at_construction(kwargs, error, message):
    with pytest.raises(error, match=message):
        LossValleyMonitor(**kwargs)


@pytest.mark.parametrize("monitor", [PsiRankMonitor, LossValleyMonitor])
def test_monitors_take_numpy_integers_and_refuse_bools(monitor):
    assert monitor(every_n_epochs=np.int64(5)).every_n_epochs == 5
    with pytest.raises(TypeError, match=r"`every_n_epochs` must be an integer, got True \(bool\)"):
        monitor(every_n_epochs=True)
    with pytest.raises(TypeError, match=r"`batch_size` must be an integer, got 1\.5 \(float\)"):
        monitor(batch_size=1.5)


def test_valid_arguments_still_construct():
    m = LossValleyMonitor(every_n_epochs=2, eps=np.float64(0.1), path_points=np.int32(3), surface_points=0,
                          surface_span=2, seed=np.int64(7), log_figure=np.bool_(False), prefix="v/")
    assert (m.eps, m.path_points, m.surface_points, m.surface_span, m.seed) == (0.1, 3, 0, 2.0, 7)
    assert m.log_figure is False and m.prefix == "v/" and LossValleyMonitor().eps is None
    assert PsiRankMonitor(log_figure=False, prefix="p/", spectrum="full").prefix == "p/"
