"""The paper's own protocol: scikit-learn ``SVC(kernel="precomputed")`` with an intercept and a large ``C``."""
from __future__ import annotations

import warnings

import numpy as np

from lightning_nsv.solver.result import MaxMarginResult, make_result

__all__ = ["LIBSVM_TOL", "svc_with_intercept"]

LIBSVM_TOL = 1e-5


def svc_with_intercept(kernel_n: np.ndarray, y: np.ndarray, scale: float, C: float) -> MaxMarginResult:
    from sklearn.svm import SVC

    svc = SVC(kernel="precomputed", C=C, tol=LIBSVM_TOL, shrinking=False, max_iter=-1)
    svc.fit(kernel_n, y)
    alpha_n = np.zeros(y.shape[0])
    alpha_n[svc.support_] = np.abs(svc.dual_coef_[0])
    b = float(svc.intercept_[0])
    margins = y * (kernel_n[:, svc.support_] @ svc.dual_coef_[0] + b)
    at_bound = alpha_n >= C * (1 - 1e-8)
    free = (alpha_n > 0) & ~at_bound
    kkt = max(
        float(np.max(np.clip(1 - margins, 0, None))),
        float(np.max(np.abs(margins[free] - 1), initial=0.0)),
        abs(float(alpha_n @ y)) / max(float(alpha_n.sum()), 1e-300),
    )
    if at_bound.any():
        warnings.warn(
            f"{int(at_bound.sum())} support vectors reached C={C} on the normalised kernel: the solution is "
            "soft-margin. Increase C.",
            stacklevel=3,
        )
    return make_result(alpha_n, y, margins, scale, b, kkt, int(at_bound.sum()), C / scale, 0, "libsvm",
                   slack=10 * LIBSVM_TOL)
