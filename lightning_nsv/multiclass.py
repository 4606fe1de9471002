"""Network support vectors of multi-class heads (DESIGN.md §2b): the names of :mod:`lightning_nsv.analysis.multiclass`
(the analysis) and :mod:`lightning_nsv.solver.multiclass` (the K-class max-margin problem), kept for existing imports.
Nothing here imports Lightning.
"""
from lightning_nsv.analysis.multiclass import (
    METHODS,
    MulticlassSupportVectorAnalysis,
    _check_zero_error,
    _one_vs_rest_comparison,
    _validation,
    centred_gram,
    multiclass_decision,
    multiclass_support_vectors,
)
from lightning_nsv.kernel.formulas import output_gram
from lightning_nsv.solver.multiclass import (
    MulticlassMaxMarginResult,
    OneVsRestResult,
    SampleColumns,
    _generic_pair_problem,
    _pair_result,
    _pairs,
    _smallest,
    class_labels,
    multiclass_max_margin,
    one_vs_rest_max_margin,
    pair_margins,
)

__all__ = [
    "MulticlassMaxMarginResult",
    "MulticlassSupportVectorAnalysis",
    "OneVsRestResult",
    "centred_gram",
    "class_labels",
    "multiclass_decision",
    "multiclass_max_margin",
    "multiclass_support_vectors",
    "one_vs_rest_max_margin",
    "output_gram",
    "pair_margins",
]
