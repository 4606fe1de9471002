"""The one base of the analysis results (DESIGN §4): numbers for loggers, text for people; what the binary and
K-class support-vector results share."""
from __future__ import annotations

from typing import Callable

from torch import Tensor

from lightning_nsv.analysis.bounds import bound_text


class AnalysisResult:
    """What every result of :mod:`lightning_nsv.analysis` offers: :meth:`to_metrics`, its numbers as a flat dict of
    floats (what the callbacks log), and :meth:`report`, Markdown for people. The results are frozen dataclasses; this
    base has no fields (``__slots__ = ()``), so their fields, equality and pickling stay as they are."""

    __slots__ = ()

    def to_metrics(self) -> dict[str, float]:
        raise NotImplementedError(f"{type(self).__name__} must define to_metrics()")

    def report(self) -> str:
        """Markdown: one row per metric of :meth:`to_metrics`; results with more to say override it."""
        rows = [f"| {key} | {value:.6g} |" for key, value in self.to_metrics().items()]
        return "\n".join([f"{type(self).__name__}:", "", "| metric | value |", "|---|---|", *rows])


VALIDATION_KEYS = ("unique_patterns_val", "val_agreement", "val_errors_network", "val_errors_svm", "val_errors_both")


def validation_metrics(analysis) -> dict[str, float]:
    """The validation numbers of a binary or multi-class analysis that were computed (``None`` ones left out)."""
    values = {key: getattr(analysis, key) for key in VALIDATION_KEYS}
    return {key: float(value) for key, value in values.items() if value is not None}


def validation_fields(net_pred: Tensor, svm_pred: Tensor, target: Tensor | None, agreement: Callable[[], float],
                      patterns: int) -> dict:
    """The validation fields of a support-vector analysis from the network's and the SVM's predictions on the
    validation set (``target`` its labels, or ``None``): ``agreement()`` computes their agreement (``nan`` on an
    empty set)."""
    result = {
        "unique_patterns_val": patterns,
        "val_agreement": agreement() if len(net_pred) else float("nan"),
        "val_predictions": (net_pred, svm_pred),
    }
    if target is not None:
        net_wrong, svm_wrong = net_pred != target, svm_pred != target
        result.update(
            val_errors_network=int(net_wrong.sum()),
            val_errors_svm=int(svm_wrong.sum()),
            val_errors_both=int((net_wrong & svm_wrong).sum()),
        )
    return result


class SupportVectorResult(AnalysisResult):
    """What the binary and the K-class support-vector analyses share: their common metrics and the end of their
    reports (activation patterns, validation, compression bound). Expects the fields ``svm``, ``network_margin``,
    ``unique_patterns_train``, ``unique_patterns_val``, ``bound``, ``delta`` and the validation fields."""

    __slots__ = ()

    def _support_metrics(self, **between: float) -> dict[str, float]:
        """The solver's metrics, the network margin, ``between``, the patterns and the bound."""
        return {
            **self.svm.to_metrics(),
            "network_margin": self.network_margin,
            **between,
            "unique_patterns_train": float(self.unique_patterns_train),
            "compression_bound": self.bound,
        }

    def _report_end(self, bits: int) -> list[str]:
        """The last lines of :meth:`report`: patterns, validation (when computed) and the bound with ``bits`` of side
        information per support vector, marked vacuous above 1."""
        lines = [
            f"activation patterns: {self.unique_patterns_train} unique on train"
            + ("" if self.unique_patterns_val is None else f", {self.unique_patterns_val} on validation")
        ]
        if self.val_agreement is not None:
            lines.append(
                f"validation: network and SVM agree on {100 * self.val_agreement:.2f}%"
                + ("" if self.val_errors_network is None else
                   f"; errors network {self.val_errors_network}, SVM {self.val_errors_svm}, both {self.val_errors_both}")
            )
        lines.append(f"compression bound (delta={self.delta}, {bits} bits per support vector): {bound_text(self.bound)}")
        return lines
