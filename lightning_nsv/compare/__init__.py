"""Stability of the network support vectors across runs: several result files of one training set, compared.
It reads result files, so it lies above :mod:`lightning_nsv.artifacts` (and the analysis beneath both).

Runs of one network on one training set that differ in their initialisation can have support sets of similar size
that share few samples: :func:`compare_support_sets` returns a :class:`SupportSetComparison` (s and s/m per run,
pairwise Jaccard, the core, how often each sample is a support vector); what it compares and what it costs:
:mod:`~lightning_nsv.compare.support_sets`.

The command line, ``lightning-nsv compare ART.pt ART.pt ... [--out DIR]``, is :func:`main`. No Lightning import
here; only the image grid rebuilds a data module (see :func:`support_images`).

The package gathers the public names of three modules: :mod:`~lightning_nsv.compare.support_sets` (the comparison),
:mod:`~lightning_nsv.compare.outputs` (files, figures, images), :mod:`~lightning_nsv.compare.cli`
(:func:`main`).

Example::

    >>> from lightning_nsv.compare import compare_support_sets  # doctest: +SKIP
    >>> runs = "runs/support_stability/tensorboard/seed={}/nsv/support_vectors_epoch{}.pt"
    >>> comparison = compare_support_sets([runs.format(0, 54), runs.format(1, 42), runs.format(2, 45)])
    >>> comparison.n_support, round(float(comparison.jaccard[0, 1]), 3), comparison.core.size
    ((84, 97, 122), 0.146, 13)
    >>> print(comparison.report())                    # markdown: runs, Jaccard matrix, core, frequencies
"""
from lightning_nsv.compare.cli import main
from lightning_nsv.compare.outputs import image_titles, support_images, write_comparison
from lightning_nsv.compare.support_sets import (IMAGE_COUNT, LOADER_ARGS, ImagesUnavailable, IncomparableRunsError,
                                                 SupportSetComparison, compare_support_sets)

__all__ = ["IMAGE_COUNT", "LOADER_ARGS", "ImagesUnavailable", "IncomparableRunsError", "SupportSetComparison",
           "compare_support_sets", "image_titles", "main", "support_images", "write_comparison"]
