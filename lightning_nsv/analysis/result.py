"""The one base of the analysis results (DESIGN §4): numbers for loggers, text for people."""
from __future__ import annotations


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
