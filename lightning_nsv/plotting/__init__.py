"""Every figure of the package, for TensorBoard, the examples and papers; plots return ``(fig, ax)``.

- :func:`image_grid` and :func:`alpha_histogram`: the support vectors and their dual coefficients.
- Figure 7: :func:`decision_grid` evaluates the network and its max-margin classifier over a 2-D grid (the
  classifier through the kernel between grid points and the support vectors only), :func:`plot_decision_boundaries`
  draws them side by side.
- Figures 8-9: :func:`plot_path_weights`, the weights of a small network drawn as a graph coloured by sign, next to
  the signs of the path weights ``wbar`` (:func:`~lightning_nsv.kernel.path_signs`, no path materialised).
- Table II: :func:`agreement_counts` and :func:`plot_agreement`, validation samples misclassified by the network
  only, the SVM only, or both.
- Table 6: :func:`plot_unique_patterns`; Figures 1-5 and 10: :func:`plot_sweep`, error bars captioned by
  :func:`error_bar_caption`.
- Support sets of several runs (:mod:`lightning_nsv.compare`): :func:`plot_jaccard_matrix`, and
  :func:`plot_support_stability`, the matrix beside how many samples are support vectors in exactly c runs.
- Ψ and the loss-valley certificates of skip networks (DESIGN §3): :func:`plot_psi_spectrum`,
  :func:`plot_escape_path`, :func:`plot_loss_surface` (the results' ``plot(ax)`` methods).
- :func:`plot_depth_profile`: s/m and the compression bound at each cut from the input to the head
  (:func:`~lightning_nsv.scope.profile.support_vector_profile`).
- :func:`plot_summary_card`: the numbers of one analysis read first (TensorBoard's ``nsv/summary`` image), under
  the verdict line of :func:`summary_verdict`.

Single-panel figures are :data:`CARD_WIDTH` (4.5 inches) wide: one column of a two-column paper with little
scaling, and at matplotlib's 100 dpi about the 330-500 pixels that TensorBoard's image cards show, so their text
stays readable there.

The modules: :mod:`~lightning_nsv.plotting.base` (what every figure shares, :func:`plot_axes`),
:mod:`~lightning_nsv.plotting.support` (one analysis), :mod:`~lightning_nsv.plotting.summary` (its card), :mod:`~lightning_nsv.plotting.runs` (sweeps, agreement,
stability across runs), :mod:`~lightning_nsv.plotting.certificates` (Ψ and the valley certificates).
"""
from __future__ import annotations

import matplotlib.pyplot as plt  # for the examples; the package's figures never touch pyplot's state

from lightning_nsv.plotting.base import (CARD_WIDTH, LEGEND_SIZE, NEGATIVE, POSITIVE, REGION_NEGATIVE,
                                         REGION_POSITIVE, error_bar_caption, plot_axes, short_number)
from lightning_nsv.plotting.certificates import plot_escape_path, plot_loss_surface, plot_psi_spectrum
from lightning_nsv.plotting.profile import plot_depth_profile
from lightning_nsv.plotting.runs import (agreement_counts, plot_agreement, plot_jaccard_matrix, plot_support_stability,
                                         plot_sweep, plot_unique_patterns)
from lightning_nsv.plotting.support import (GridDecisions, alpha_histogram, data_extent, decision_grid, image_grid,
                                            plot_decision_boundaries, plot_max_margin_approach, plot_path_weights)
from lightning_nsv.plotting.summary import plot_summary_card, summary_verdict

__all__ = ["CARD_WIDTH", "GridDecisions", "LEGEND_SIZE", "agreement_counts", "alpha_histogram", "data_extent",
           "decision_grid", "error_bar_caption", "image_grid", "plot_agreement", "plot_axes",
           "plot_decision_boundaries", "plot_depth_profile", "plot_escape_path", "plot_jaccard_matrix", "plot_loss_surface",
           "plot_max_margin_approach", "plot_path_weights", "plot_psi_spectrum", "plot_summary_card",
           "plot_support_stability", "plot_sweep", "plot_unique_patterns", "short_number", "summary_verdict"]
