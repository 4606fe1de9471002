"""The figure helpers against direct computations with materialised path features."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_nsv.kernel import PathNetwork, forward_with_slopes, path_kernel, path_signs
from lightning_nsv.kernel.decision import max_margin_decision
from lightning_nsv.plotting import (CARD_WIDTH, agreement_counts, alpha_histogram, data_extent, decision_grid,
                                    error_bar_caption, image_grid, plot_agreement, plot_decision_boundaries,
                                    plot_path_weights, plot_sweep, plot_unique_patterns, plt, short_number)
from lightning_nsv.solver import max_margin
from lightning_nsv.ticks import power_of_ten
from tests.reference import materialise_phi
from tests.timeouts import timeout_for


def _network(bias: bool, seed: int = 0, widths=(4, 3), in_features: int = 2) -> PathNetwork:
    g = torch.Generator().manual_seed(seed)
    sizes = [in_features, *widths, 1]
    weights = [torch.randn(sizes[k + 1], sizes[k], generator=g, dtype=torch.float64) for k in range(len(sizes) - 1)]
    biases = [0.3 * torch.randn(n, generator=g, dtype=torch.float64) for n in sizes[1:]] if bias else None
    return PathNetwork(tuple(weights), None if biases is None else tuple(biases), (0.1,) * len(widths),
                       (1.0,) * len(widths))


def _separable_by_network(net: PathNetwork, n: int = 40, seed: int = 1):
    """Points labelled by the network's own sign: zero training error by construction."""
    x = torch.randn(n, net.in_features, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    outputs, slopes = forward_with_slopes(net, x)
    y = torch.where(outputs >= 0, 1.0, -1.0).to(torch.float64)
    svm = max_margin(path_kernel(x, slopes, bias=net.biases is not None), y)
    return x, y, svm


@pytest.mark.parametrize("bias", [False, True])
def test_max_margin_decision_equals_materialised_features(bias):
    net = _network(bias)
    x, y, svm = _separable_by_network(net)
    sv = svm.support_
    query = torch.randn(7, 2, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    got = max_margin_decision(net, x[sv], y[sv], svm.alpha_[sv], query, intercept=0.25)
    v = (torch.from_numpy(svm.alpha_) * y) @ materialise_phi(net, x)  # v = Σ α_i y_i phi(x_i)
    torch.testing.assert_close(got, materialise_phi(net, query) @ v + 0.25, rtol=1e-9, atol=1e-10)
    # on the training set the decision function is y_i times the solver's functional margins
    on_train = max_margin_decision(net, x[sv], y[sv], svm.alpha_[sv], x)
    np.testing.assert_allclose((y * on_train).numpy(), svm.functional_margins, rtol=1e-7, atol=1e-8)


def test_max_margin_decision_rejects_mismatched_support():
    net = _network(False)
    with pytest.raises(ValueError, match="one entry per support vector"):
        max_margin_decision(net, torch.zeros(3, 2), torch.ones(2), np.ones(3), torch.zeros(1, 2))


@pytest.mark.parametrize("bias", [False, True])
def test_decision_grid_against_direct_computation(bias):
    net = _network(bias, seed=3)
    x, y, svm = _separable_by_network(net, seed=4)
    sv = svm.support_
    extent = data_extent(x)
    grid = decision_grid(net, x[sv], y[sv], svm.alpha_[sv], svm.intercept_, extent=extent, resolution=9)
    assert grid.network.shape == grid.svm.shape == (9, 9)
    gx, gy = np.meshgrid(np.linspace(extent[0], extent[1], 9), np.linspace(extent[2], extent[3], 9))
    points = torch.from_numpy(np.stack([gx.ravel(), gy.ravel()], 1))
    np.testing.assert_allclose(grid.network.ravel(), forward_with_slopes(net, points)[0].numpy(), rtol=1e-12)
    _, slopes_points = forward_with_slopes(net, points)
    _, slopes_train = forward_with_slopes(net, x)
    full = path_kernel(points, slopes_points, x, slopes_train, bias=bias) @ (torch.from_numpy(svm.alpha_) * y)
    np.testing.assert_allclose(grid.svm.ravel(), full.numpy() + svm.intercept_, rtol=1e-9, atol=1e-10)
    assert grid.agreement == np.mean((grid.network >= 0) == (grid.svm >= 0))
    fig, axes = plot_decision_boundaries(grid, x, (y > 0).long(), sv)
    assert len(axes) == 2 and all(ax.collections for ax in axes)
    assert all(ax.get_xlabel() == "input x₁" and ax.get_ylabel() == "input x₂" for ax in axes)
    legend = [t.get_text() for t in axes[0].get_legend().get_texts()]
    assert {"class −1", "class +1", f"{len(sv)} support vectors"} <= set(legend)
    plt.close(fig)


def test_data_extent_pads_and_needs_two_features():
    assert data_extent(np.array([[0.0, -1.0], [2.0, 1.0]]), pad=0.5) == (-1.0, 3.0, -2.0, 2.0)
    with pytest.raises(ValueError, match="2-D inputs"):
        data_extent(np.zeros((4, 3)))


def test_plot_path_weights_draws_every_weight_and_reports_signs():
    positive = PathNetwork((torch.ones(3, 2, dtype=torch.float64), -torch.ones(2, 3, dtype=torch.float64),
                            -torch.ones(1, 2, dtype=torch.float64)), None, (0.1, 0.1), (1.0, 1.0))
    signs = path_signs(positive)
    assert signs.positive_count_fraction == 1.0  # two negative weights on every path
    fig, (graph, bars) = plot_path_weights(positive, signs)
    assert len(graph.lines) == 6 + 6 + 2 + 2  # one line per weight, two legend handles
    assert "100.0% of paths" in bars.get_title()
    plt.close(fig)


def test_agreement_counts_and_plot():
    counts = agreement_counts({"val_errors_network": 7.0, "val_errors_svm": 5.0, "val_errors_both": 4.0,
                               "val_agreement": 0.99})
    assert counts == {"network_only": 3.0, "svm_only": 1.0, "both": 4.0, "agreement": 0.99}
    fig, ax = plot_agreement([3, 4], [counts, counts])
    assert len(ax.patches) == 6
    plt.close(fig)


def test_sweep_and_pattern_plots():
    rows = [{"m": m, "support_fraction": 0.2, "support_fraction_std": 0.01, "unique_patterns_train": m / 10,
             "unique_patterns_val": 30.0} for m in (100, 200, 400)]
    fig, ax = plot_sweep(rows, "m", {"support_fraction": "s/m"}, xlabel="m", ylabel="s/m", logx=True)
    assert ax.get_xscale() == "log" and len(ax.containers) == 1
    plt.close(fig)
    fig, ax = plot_unique_patterns(rows, n_test=359)
    assert ax.get_yscale() == "log" and len(ax.get_legend().get_texts()) == 4
    plt.close(fig)


def test_image_grid_shows_few_large_tiles_and_says_how_many():
    fig, axes = image_grid(torch.rand(64, 1, 8, 8), [f"α={k}" for k in range(64)], total=148)
    shown = [ax for ax in axes.flat if ax.images]
    assert len(shown) == 16 and axes.shape == (4, 4)
    assert fig._suptitle.get_text() == "top 16 of 148 support vectors by α"
    assert shown[0].title.get_fontsize() == 10
    fig.canvas.draw()
    boxes = [ax.title.get_window_extent() for ax in axes[0]]
    assert all(left.x1 < right.x0 for left, right in zip(boxes, boxes[1:])), "titles overlap"
    plt.close(fig)
    fig, axes = image_grid(torch.rand(40, 1, 8, 8), [f"y=1 α={k / 7:.2g}" for k in range(40)], max_images=32)
    assert axes.shape[1] == 6 and fig._suptitle.get_text() == "top 32 of 40 support vectors by α"
    fig.canvas.draw()
    boxes = [ax.title.get_window_extent() for ax in axes[0]]
    assert all(left.x1 < right.x0 for left, right in zip(boxes, boxes[1:])), "titles overlap"
    assert fig.get_figwidth() == CARD_WIDTH and shown[0].get_title() == "α=0"
    plt.close(fig)
    fig, axes = image_grid(torch.rand(10, 3, 4, 4))
    assert axes.shape == (3, 4) and fig._suptitle.get_text() == "all 10 support vectors by α"
    plt.close(fig)
    with pytest.raises(ValueError, match="max_images"):
        image_grid(torch.rand(2, 1, 4, 4), max_images=0)


@pytest.mark.parametrize("low, high", [(1e-7, 30.0), (0.41, 0.93), (2e-3, 2.5e-3)])
def test_alpha_histogram_labels_few_decades_without_overlap(low, high):
    alpha = np.geomspace(low, high, 50)
    fig, ax = alpha_histogram(alpha)
    fig.canvas.draw()
    assert ax.get_xscale() == "log" and ax.get_title() == "α of 50 support vectors"
    labels = [t for t in ax.get_xticklabels() if t.get_text() and t.get_visible()
              and ax.get_xlim()[0] <= t.get_position()[0] <= ax.get_xlim()[1]]
    assert 2 <= len(labels) <= 6
    assert not [t for t in ax.get_xticklabels(minor=True) if t.get_text()]
    boxes = sorted((t.get_window_extent() for t in labels), key=lambda box: box.x0)
    assert all(left.x1 < right.x0 for left, right in zip(boxes, boxes[1:]))
    for label in labels:  # Unicode powers of ten where matplotlib writes mathtext, at the tick's value
        assert _label_value(label.get_text()) == pytest.approx(label.get_position()[0])
    plt.close(fig)


def _label_value(text: str) -> float:
    """The number a ``c×10ᵏ`` / ``10ᵏ`` label stands for."""
    coefficient, _, power = text.rpartition("10")
    exponent = power.translate(str.maketrans("⁻⁰¹²³⁴⁵⁶⁷⁸⁹", "-0123456789"))
    return float(coefficient.rstrip("×") or 1) * 10.0 ** int(exponent)


@pytest.mark.parametrize("value, text", [(1e-3, "10⁻³"), (1.0, "10⁰"), (10.0, "10¹"), (1e12, "10¹²"),
                                         (2e-3, "2×10⁻³"), (2.5e-7, "2.5×10⁻⁷"), (0.999999999e-3, "10⁻³"),
                                         (5.0, "5×10⁰"), (1e-300, "10⁻³⁰⁰")])
def test_power_of_ten_labels(value, text):
    assert power_of_ten(value) == text


def test_log_axes_of_the_figures_need_no_mathtext():
    from lightning_nsv.analysis import psi_spectrum
    from lightning_nsv.plotting import plot_max_margin_approach

    spectrum = psi_spectrum(torch.randn(40, 60, dtype=torch.float64) @ torch.diag(
        torch.logspace(0, -6, 60, dtype=torch.float64)), spectrum="full")
    for (fig, ax), axis in ((spectrum.plot(), "y"), (plot_max_margin_approach([1, 10, 30], [0.1] * 3, [0.2] * 3), "x")):
        fig.canvas.draw()
        ticks = ax.get_yticklabels() if axis == "y" else ax.get_xticklabels()
        minor = ax.get_yticklabels(minor=True) if axis == "y" else ax.get_xticklabels(minor=True)
        texts = [t.get_text() for t in [*ticks, *minor] if t.get_text()]
        assert texts and not [t for t in texts if "$" in t]
        assert any("10" in t for t in texts)
        plt.close(fig)


def test_max_margin_approach_within_a_decade_has_a_linear_axis_of_whole_epochs():
    from lightning_nsv.plotting import plot_max_margin_approach

    fig, ax = plot_max_margin_approach([23, 27, 31, 35, 39], [0.1] * 5, [0.2] * 5)
    fig.canvas.draw()
    assert ax.get_xscale() == "linear" and ax.get_xlabel() == "epoch"
    labels = [t.get_text() for t in ax.get_xticklabels(minor=True) if t.get_text()]
    assert not labels  # no minor labels to crowd the major ones
    assert all(float(t.get_text().replace("−", "-")).is_integer() for t in ax.get_xticklabels() if t.get_text())
    plt.close(fig)


def test_short_number_and_error_bar_caption():
    assert [short_number(v) for v in (0.00123, 0.5, 12.0, 4.6e5, 0.0)] == ["1.2e-3", "0.5", "12", "4.6e5", "0"]
    rows = [{"m": 100, "reached": 3}, {"m": 200, "reached": 2}, {"m": 400, "reached": 3}]
    assert error_bar_caption(rows, "m") == "mean ± 1 sd over 3 seeds (2 at m = 200)"
    assert error_bar_caption(rows[:1]) == "mean ± 1 sd over 3 seeds"
    assert error_bar_caption([{"reached": 1}, {"reached": 1}]) == "one seed, no error bars"  # not "sd over 1 seed"
    fig, ax = plot_sweep(rows, "m", {"reached": "seeds"}, xlabel="m", ylabel="seeds", logx=True)
    assert ax.get_legend().get_title().get_text() == "mean ± 1 sd over 3 seeds (2 at m = 200)"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["100", "200", "400"]
    plt.close(fig)


def test_save_figures_writes_every_format_at_the_resolution(tmp_path):
    from PIL import Image

    from lightning_nsv.experiments import save_figures

    fig, _ = plot_sweep([{"m": 1, "s": 2.0}, {"m": 2, "s": 3.0}], "m", {"s": "s"}, xlabel="m", ylabel="s")
    paths = save_figures(fig, tmp_path / "sweep", formats=("png", "pdf", "svg"), dpi=180)
    assert [p.name for p in paths] == ["sweep.png", "sweep.pdf", "sweep.svg"]
    assert paths[1].read_bytes().startswith(b"%PDF") and b"<svg" in paths[2].read_bytes()[:2000]
    with Image.open(paths[0]) as image:
        assert image.mode == "RGBA" and round(image.info["dpi"][0]) == 180
        assert image.width > 0.8 * CARD_WIDTH * 180
    assert not list(tmp_path.glob(".*.tmp"))
    plt.close(fig)


def test_importing_the_package_leaves_the_matplotlib_backend_and_pyplot_alone(tmp_path):
    import subprocess
    import sys

    script = (
        "import matplotlib; matplotlib.use('svg')\n"
        "import numpy as np, matplotlib.pyplot as plt\n"
        "import lightning_nsv.plotting as plotting, lightning_nsv.callbacks\n"
        "fig, ax = plotting.alpha_histogram(np.linspace(1e-3, 1, 20))\n"
        "fig.savefig(r'%s')\n"
        "print(matplotlib.get_backend(), plt.get_fignums())\n" % (tmp_path / "alpha.png")
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout_for(6))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["svg", "[]"]  # not switched to Agg; no figure left open in pyplot
    assert (tmp_path / "alpha.png").read_bytes()[:4] == b"\x89PNG"


def test_figures_render_to_rgb_for_image_loggers():
    from lightning_nsv.callbacks.sinks import _rgb

    fig, _ = alpha_histogram(np.linspace(1e-3, 1, 20))
    image = _rgb(fig)
    assert image.ndim == 3 and image.shape[2] == 3 and image.dtype == np.uint8 and image.std() > 0


def test_every_legend_is_large_enough_to_read():
    """Legends of 7-8 points could not be read on TensorBoard's image card."""
    from lightning_nsv.analysis import psi_spectrum
    from lightning_nsv.analysis.valley import escape_path, loss_surface_2d
    from lightning_nsv.plotting import LEGEND_SIZE, plot_max_margin_approach

    net = _network(True, seed=3)
    x, y, svm = _separable_by_network(net, seed=4)
    sv = svm.support_
    grid = decision_grid(net, x[sv], y[sv], svm.alpha_[sv], svm.intercept_, extent=data_extent(x), resolution=5)
    counts = agreement_counts({"val_errors_network": 7.0, "val_errors_svm": 5.0, "val_errors_both": 4.0,
                               "val_agreement": 0.99})
    rows = [{"m": m, "support_fraction": 0.2, "support_fraction_std": 0.01, "unique_patterns_train": m / 10,
             "unique_patterns_val": 30.0, "reached": 3} for m in (100, 200, 400)]
    psi = torch.randn(6, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    weight = torch.ones(3, requires_grad=True)
    figures = [plot_decision_boundaries(grid, x, (y > 0).long(), sv), plot_agreement([3, 4], [counts, counts]),
               plot_path_weights(net, path_signs(net)), plot_max_margin_approach([1, 10, 30], [0.1] * 3, [0.2] * 3),
               plot_sweep(rows, "m", {"support_fraction": "s/m"}, xlabel="m", ylabel="s/m"),
               plot_unique_patterns(rows, n_test=359), psi_spectrum(psi, spectrum="full").plot(),
               escape_path(psi, torch.zeros(8, 3), torch.tensor([0, 1, 2, 0, 1, 2]), eps=0.1).plot(),
               loss_surface_2d(lambda: (weight ** 2).sum(), [weight], span=1.0, num_points=3, seed=0).plot()]
    legends = [ax.get_legend() for fig, _ in figures for ax in fig.axes if ax.get_legend() is not None]
    assert len(legends) >= len(figures)
    for legend in legends:
        sizes = [t.get_fontsize() for t in legend.get_texts()] + [legend.get_title().get_fontsize()] * bool(
            legend.get_title().get_text())
        assert min(sizes) >= LEGEND_SIZE >= 10, [t.get_text() for t in legend.get_texts()]
    for fig, _ in figures:
        plt.close(fig)
