"""Analyses across result files of the support-vector callback (no Lightning import).

- :mod:`~lightning_nsv.analysis.stability`: support sets of several runs on one training set compared — s per
  run, pairwise Jaccard, the core, how many runs share each sample (``lightning-nsv compare``).
"""
from lightning_nsv.analysis.stability import (
    ImagesUnavailable,
    IncomparableRunsError,
    SupportSetComparison,
    compare_support_sets,
    write_comparison,
)

__all__ = ["ImagesUnavailable", "IncomparableRunsError", "SupportSetComparison", "compare_support_sets",
           "write_comparison"]
