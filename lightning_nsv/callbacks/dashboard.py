"""TensorBoard that shows the answer: one custom-scalars layout of the analyses, HParams with the analysis metrics
first, and the analyses' scalars against the epoch.

TensorBoard loggers are told apart by what their ``experiment`` can do (``add_custom_scalars``, ``add_scalar``), so
the ``TensorBoardLogger`` of either Lightning package is served; other loggers get the scalars through their
``log_metrics``. Call the writers on the rank that logs (rank 0).

- :func:`write_layout`: the Custom Scalars tab, one category per analysis callback of the Trainer ("support
  vectors", "Ψ", "valley"), each chart naming the tags the callbacks log (anchored regular expressions, the
  plugin's syntax). Written once per writer: the plugin reads one layout per run.
- :func:`log_scalars`: the analyses' numbers under their own tags with the **epoch** as TensorBoard's step, so that
  repeated analyses draw a curve over epochs; the callbacks log them with ``pl_module.log(..., logger=False)`` for
  ``callback_metrics`` only, so each number reaches TensorBoard once (no second dot at the global step).
  Loggers without a ``SummaryWriter`` (CSV, W&B, MLflow) get them at the global step, as before: W&B refuses a step
  below one it has seen.
- :func:`register_hparams`: the HParams tab. See :func:`select_hparams` for which hyperparameters are shown.
- :func:`with_log10`: numbers that span decades (σ_min of Ψ, its condition number, the escape path's residual; 1e-15
  to 1e18) also as ``log10_<key>``, which the layout draws: on a linear axis they run off TensorBoard's charts.

TensorBoard's Smoothing slider (0.6 by default, in the Scalars and the Custom Scalars tabs) draws each series as an
exponential moving average of its points, ``s_t = w·s_{t−1} + (1 − w)·x_t`` with ``w`` the slider's value, divided
by ``1 − w^t``, with the raw points faint behind it: a 0/1 verdict series (``psi/full_rank``,
``valley/escape_applies``, …) is drawn between 0 and 1 (a 1 after a 0 reads 0.63, the next 1 0.82). The layout
therefore gives each verdict its own chart, titled with what 1 means and "read with Smoothing 0": the slider at 0
draws the verdicts as they were logged.
"""
from __future__ import annotations

import inspect
import math
import weakref
from typing import Any, Iterable, Sequence

from lightning_nsv.compat import rank_zero_warn

__all__ = ["HEADLINE", "hparams_metrics", "log_scalars", "nsv_charts", "psi_charts", "register_hparams",
           "select_hparams", "tensorboard_writers", "valley_charts", "with_log10", "write_layout"]

#: The numbers a researcher reads first, in this order: the first columns of the HParams table (it shows five by
#: default) and the rows of the summary card.
HEADLINE = ("n_support", "support_fraction", "margin_ratio", "cosine_wbar_v", "val_agreement", "kkt_residual",
            "compression_bound")

_LAYOUT_WRITTEN: weakref.WeakSet = weakref.WeakSet()  # writers that hold a layout (the plugin reads one per run)
_HPARAMS_WRITTEN: weakref.WeakSet = weakref.WeakSet()  # writers that hold an HParams session


def _tags(prefix: str, *keys: str) -> list[str]:
    """Anchored regular expressions of ``prefix + key`` (the plugin matches charts' tags as regular expressions)."""
    return [f"^{_escape(prefix + key)}$" for key in keys]


def _escape(tag: str) -> str:
    return "".join(f"\\{c}" if c in ".^$*+?()[]{}|\\" else c for c in tag)


def nsv_charts(prefix: str = "nsv/", per_class: bool = False,
               repeated: bool = False) -> tuple[str, dict[str, list[Any]]]:
    """The "support vectors" category: s, s/m, margin ratio, cosine, agreement, KKT residual and bound; s per class
    for a K-class head (``per_class``), the overlap with the previous support set for repeated analyses."""
    charts = {
        "s: network support vectors": ["Multiline", _tags(prefix, "n_support")],
        "s/m": ["Multiline", _tags(prefix, "support_fraction")],
        "margin ratio: network margin / max margin (1 = max margin)": ["Multiline", _tags(prefix, "margin_ratio")],
        "cosine(w̄, v) in path space (1 = max-margin direction)": ["Multiline", _tags(prefix, "cosine_wbar_v")],
        "validation agreement of network and SVM": ["Multiline", _tags(prefix, "val_agreement")],
        "KKT residual of the max-margin solve (≈ 0 = solved)": ["Multiline", _tags(prefix, "kkt_residual")],
        "compression bound (vacuous above 1)": ["Multiline", _tags(prefix, "compression_bound")],
    }
    if per_class:
        charts["s per class"] = ["Multiline", [f"^{_escape(prefix)}n_support_class\\d+$"]]
    if repeated:
        charts["support set against the previous analysis (Jaccard)"] = [
            "Multiline", _tags(prefix, "support_jaccard_previous")]
    return "support vectors", charts


def with_log10(metrics: dict[str, float], keys: Sequence[str]) -> dict[str, float]:
    """``metrics`` and ``log10_<key>`` of each of ``keys`` that is finite and positive (at an epoch where it is 0 or
    inf, e.g. σ_min of a singular Ψ, that point is left out of the log10 series; the plain one has it)."""
    logged = dict(metrics)
    for key in keys:
        value = metrics.get(key)
        if value is not None and math.isfinite(value) and value > 0:
            logged[f"log10_{key}"] = math.log10(value)
    return logged


def _verdicts(prefix: str, meanings: dict[str, str]) -> dict[str, list[Any]]:
    """One chart per 0/1 verdict (six to a chart, smoothed, read as 0.6–0.9 without a legend), titled with what 1
    means and the smoothing that shows it as logged."""
    return {f"{key}: 1 = {meaning} (0/1; read with Smoothing 0)": ["Multiline", _tags(prefix, key)]
            for key, meaning in meanings.items()}


PSI_LOG_SCALE = ("sigma_min", "condition_number")
VALLEY_LOG_SCALE = ("escape_residual",)


def psi_charts(prefix: str = "psi/") -> tuple[str, dict[str, list[Any]]]:
    """The "Ψ" category: its rank against N, log10 of σ_min and of the condition number, the full-rank verdict."""
    return "Ψ", {
        "rank of Ψ against N (equal = the no-bad-valley condition holds)": [
            "Multiline", _tags(prefix, "rank", "num_samples")],
        "log10 σ_min of Ψ": ["Multiline", _tags(prefix, "log10_sigma_min")],
        "log10 condition number of Ψ": ["Multiline", _tags(prefix, "log10_condition_number")],
        **_verdicts(prefix, {"full_rank": "rank Ψ = N"}),
    }


def valley_charts(prefix: str = "valley/") -> tuple[str, dict[str, list[Any]]]:
    """The "valley" category: each verdict on its own chart, the mean loss against Lemma 2.1's threshold and log10
    of the escape path's residual."""
    return "valley", {
        **_verdicts(prefix, {"lemma21_certified": "mean loss < log(2)/N (Lemma 2.1)",
                             "per_sample_certified": "every per-sample loss < log 2",
                             "escape_applies": "the escape-path certificate applies",
                             "escape_in_sublevel_set": "the escape path stays in the sublevel set",
                             "assumption31_satisfied": "Assumption 3.1 holds",
                             "cross_entropy_model": "the model trains with the cross-entropy"}),
        "mean cross-entropy against log(2)/N (Lemma 2.1)": ["Multiline", _tags(prefix, "mean_loss",
                                                                                "lemma21_threshold")],
        "escape path: log10 relative residual of Ψ V* = Y t*": ["Multiline", _tags(prefix, "log10_escape_residual")],
    }


def tensorboard_writers(loggers: Iterable[Any]) -> list[Any]:
    """The ``SummaryWriter`` (torch's or tensorboardX's) of each logger that has one."""
    writers = []
    for logger in loggers:
        experiment = getattr(logger, "experiment", None)
        if all(callable(getattr(experiment, name, None)) for name in ("add_custom_scalars", "add_scalar")):
            writers.append(experiment)
    return writers


def write_layout(trainer: Any) -> None:
    """The custom-scalars layout of every analysis callback of ``trainer`` (those with a ``dashboard_charts()``
    method), written once to each TensorBoard writer; call on rank 0."""
    writers = [w for w in tensorboard_writers(trainer.loggers) if w not in _LAYOUT_WRITTEN]
    if not writers:
        return
    layout: dict[str, dict[str, list[Any]]] = {}
    for callback in trainer.callbacks:
        charts = getattr(callback, "dashboard_charts", None)
        if callable(charts):
            category, content = charts()
            layout.setdefault(category, {}).update(content)
    if not layout:
        return
    for writer in writers:
        writer.add_custom_scalars(layout)
        _LAYOUT_WRITTEN.add(writer)


def log_scalars(trainer: Any, metrics: dict[str, float], epoch: int) -> None:
    """``metrics`` to every logger: TensorBoard at step ``epoch``, the others at the global step. Rank 0 only."""
    if not trainer.is_global_zero or not metrics:
        return
    writers = tensorboard_writers(trainer.loggers)
    for writer in writers:
        for tag, value in metrics.items():
            writer.add_scalar(tag, float(value), epoch)
    served = {id(w) for w in writers}
    for logger in trainer.loggers:
        if id(getattr(logger, "experiment", None)) not in served:
            logger.log_metrics({tag: float(value) for tag, value in metrics.items()}, step=trainer.global_step)


def hparams_metrics(trainer: Any, tags: Sequence[str] = ()) -> list[str]:
    """The metric columns of the HParams table: the headline tags of every analysis callback of ``trainer``
    (``dashboard_headline()``), then ``tags`` not among them, in their order."""
    first: list[str] = []
    for callback in trainer.callbacks:
        headline = getattr(callback, "dashboard_headline", None)
        if callable(headline):
            first += [tag for tag in headline() if tag not in first]
    return first + [tag for tag in tags if tag not in first]


def _defaults(obj: Any) -> dict[str, Any]:
    try:
        parameters = inspect.signature(type(obj).__init__).parameters.values()
    except (TypeError, ValueError):
        return {}
    return {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}


def _same(value: Any, default: Any) -> bool:
    if isinstance(value, bool) or isinstance(default, bool):  # True == 1 in Python
        return value is default
    try:
        return bool(value == default)
    except Exception:  # an array-like comparison: not a plain default
        return False


def select_hparams(sources: dict[str, Any], keys: Sequence[str] | None = None) -> tuple[dict[str, Any], list[str]]:
    """The hyperparameters of the HParams table and those shown first.

    Which hyperparameters vary can only be known across runs, while each run writes its own HParams session (and
    TensorBoard takes the columns from one of them); so the columns are those a run can tell: ``keys`` when given
    (the user knows what the runs vary), else the values that differ from their class's default, and arguments
    without one (a value left at its default is, in a family of runs, most often left there in all of them: the
    batch size, the label noise of a data module). Every hyperparameter that is set (not None) is returned, as
    ``<source>/<name>`` (``model/lr``, ``data/batch_size``). The limit: a run that keeps a default another run
    changes (``lr`` in one run only) has no column for it when TensorBoard takes the first run's; pass ``keys``.

    Args:
        sources: ``{"model": module, "data": datamodule}``; objects with ``hparams`` (None ones skipped).
        keys: names to flag, as ``"model/lr"``; an unknown one is refused with the known ones.

    Returns:
        ``(params, flagged)``: plain values (bool, int, float, str; others as their ``str``), the flagged names.
    """
    params: dict[str, Any] = {}
    varying: list[str] = []
    for prefix, obj in sources.items():
        if obj is None:
            continue
        defaults = _defaults(obj)
        for key, value in dict(getattr(obj, "hparams", None) or {}).items():
            if str(key).startswith("_") or value is None:
                continue
            name = f"{prefix}/{key}"
            params[name] = value if isinstance(value, (bool, int, float, str)) else str(value)
            if key not in defaults or not _same(value, defaults[key]):
                varying.append(name)
    if keys is None:
        return params, varying
    unknown = [key for key in keys if key not in params]
    if unknown:
        raise ValueError(f"hparams {unknown} are not among this run's hyperparameters; choose from "
                         f"{sorted(params)} (None values are not registered)")
    return params, list(keys)


def register_hparams(trainer: Any, sources: dict[str, Any], metric_tags: Sequence[str],
                     keys: Sequence[str] | None = None) -> bool:
    """One HParams session per TensorBoard writer: the flagged hyperparameters of :func:`select_hparams` as the
    table's columns (every one that is set is in the session's record), and ``metric_tags`` as the metric columns in
    their order (the table reads each one's last scalar). TensorBoard shows five hyperparameter columns, then five
    metric columns: with only the flagged ones, the headline metrics are on screen.

    Written through the writer's event file, not through the public routes, which each break one of these:
    ``SummaryWriter.add_hparams`` writes a separate run next to the logger's, and ``log_hyperparams(params, metrics)``
    of the Lightning loggers writes the metrics again as scalars (a second dot per analysis), registers every
    hyperparameter alike (sorted by name, ``data/*`` first) and adds the prefixed names to ``hparams.yaml``.
    Returns whether a session was written. Call on rank 0.
    """
    writers = [w for w in tensorboard_writers(trainer.loggers) if w not in _HPARAMS_WRITTEN]
    if not writers or not metric_tags:
        return False
    for logger in trainer.loggers:
        # Lightning logs the hyperparameters at the start of fit; with default_hp_metric as an hp_metric session
        if getattr(logger, "_default_hp_metric", False) and getattr(logger, "hparams", None) \
                and logger.experiment in writers:
            rank_zero_warn(f"{type(logger).__name__}(default_hp_metric=True) registered its own HParams session "
                           "(`hp_metric`) at the start of training, and TensorBoard shows the first one: pass "
                           "default_hp_metric=False to the logger to see the analysis metrics in the HParams tab")
    from torch.utils.tensorboard.summary import hparams

    params, flagged = select_hparams(sources, keys)
    metrics = {tag: 0.0 for tag in metric_tags}  # names only: the table reads the values from the scalars
    experiment = hparams({name: params[name] for name in flagged}, metrics)[0]
    start, end = hparams(params, metrics)[1:]
    for writer in writers:
        file_writer = getattr(writer, "file_writer", None) or writer._get_file_writer()
        for summary in (experiment, start, end):
            file_writer.add_summary(summary)
        _HPARAMS_WRITTEN.add(writer)
    return True
