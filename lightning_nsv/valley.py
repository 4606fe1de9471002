"""The old import path of the loss-valley certificates of skip networks (DESIGN §3), kept working: the code lives in
:mod:`lightning_nsv.analysis.valley`."""
from lightning_nsv.analysis.valley import (ANALYTIC_INCREASING, LOG2, SKIP_ACTIVATIONS, Assumption31Checks, EscapePath,
                                           Lemma21Certificate, LossSurface, assumption31_checks, count_duplicates,
                                           escape_path, filter_normalised_direction, lemma21_certificate,
                                           loss_surface_2d)

__all__ = ["ANALYTIC_INCREASING", "LOG2", "SKIP_ACTIVATIONS", "Assumption31Checks", "EscapePath", "Lemma21Certificate",
           "LossSurface", "assumption31_checks", "count_duplicates", "escape_path", "filter_normalised_direction",
           "lemma21_certificate", "loss_surface_2d"]
