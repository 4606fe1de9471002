"""Support sets of several runs on one training set, compared (the core of :mod:`lightning_nsv.compare`).

Runs of one network on one training set that differ in their initialisation (or optimiser, width, …) can have
support sets of similar size that share few samples. :func:`compare_support_sets` loads result files
(``<log_dir>/nsv/support_vectors_epoch<E>.pt``), checks that they are runs on the same training samples, and
returns a :class:`SupportSetComparison`: s and s/m per run, the pairwise Jaccard matrix, the core (the samples
that are support vectors in every run) and, per training sample, in how many runs it is a support vector.

A result's support indices are positions in its training set; they are compared as dataset indices, through the
training indices the file records, so runs whose data modules list the same samples in another order compare
correctly. Multi-class results count a sample as a support vector when any of its pairs has ``α > 0``.

Cost: the files are loaded whole (module weights included); the comparison itself takes O(k·m) time and memory
for k runs of m training samples (a k×m membership table).

Files, figures and the image grid: :mod:`~lightning_nsv.compare.outputs`; the command line:
:mod:`~lightning_nsv.compare.cli`. No Lightning import here.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from lightning_nsv.analysis.result import AnalysisResult
from lightning_nsv.artifacts import ArtifactMismatchError, SupportVectorArtifact, load_support_vectors
from lightning_nsv.experiment_io import write_csv

# data-module arguments that decide how samples are loaded, not which: they may differ between compared runs
LOADER_ARGS = ("batch_size", "num_workers", "download", "root")
IMAGE_COUNT = 16


class IncomparableRunsError(ValueError):
    """Two result files are not runs on the same training samples."""


class ImagesUnavailable(ValueError):
    """The support vectors cannot be shown as images; the message says why, in one line."""


@dataclass(frozen=True, eq=False)
class SupportSetComparison(AnalysisResult):
    """Support sets of k runs on one training set of m samples.

    Samples are in the order of their dataset indices (``train_indices``, sorted); where the files record no
    training indices (a data module without ``train_indices``) these are positions in the training set.

    Attributes:
        paths: the ``.pt`` files, in the order given.
        names: a short name per run (``"run 1"``, … unless given).
        epochs: the epoch of each analysis.
        train_indices: ``(m,)`` dataset indices of the training samples, sorted.
        labels: ``(m,)`` their training labels (±1 binary, 0..K-1 multi-class).
        membership: ``(k, m)`` bool, ``membership[r, j]``: sample j is a support vector of run r.
        data_class, data_hparams: the data module of the runs (of the first run, where ignored arguments differ).
        indices_recorded: whether the files record training indices (else positions are compared).
        notes: differences that were allowed (arguments of :data:`LOADER_ARGS`, another sample order).
    """

    paths: tuple[str, ...]
    names: tuple[str, ...]
    epochs: tuple[int, ...]
    train_indices: np.ndarray
    labels: np.ndarray
    membership: np.ndarray
    data_class: str | None = None
    data_hparams: dict | None = None
    indices_recorded: bool = True
    notes: tuple[str, ...] = ()

    @property
    def k(self) -> int:
        """Number of runs."""
        return int(self.membership.shape[0])

    @property
    def m(self) -> int:
        """Training samples of each run."""
        return int(self.membership.shape[1])

    @property
    def n_support(self) -> tuple[int, ...]:
        """s of each run."""
        return tuple(int(n) for n in self.membership.sum(1))

    @property
    def support_fraction(self) -> tuple[float, ...]:
        """s/m of each run."""
        return tuple(n / self.m for n in self.n_support)

    @property
    def support(self) -> tuple[np.ndarray, ...]:
        """Dataset indices of each run's support vectors, sorted."""
        return tuple(self.train_indices[row] for row in self.membership)

    @property
    def frequency(self) -> np.ndarray:
        """``(m,)``: in how many runs each training sample is a support vector."""
        return self.membership.sum(0)

    @property
    def core(self) -> np.ndarray:
        """Dataset indices of the samples that are support vectors in every run."""
        return self.train_indices[self.membership.all(0)]

    @property
    def union(self) -> np.ndarray:
        """Dataset indices of the samples that are support vectors in some run."""
        return self.train_indices[self.membership.any(0)]

    @property
    def in_runs(self) -> np.ndarray:
        """``(k + 1,)``: ``in_runs[c]`` training samples are support vectors in exactly c runs."""
        return np.bincount(self.frequency, minlength=self.k + 1)

    @property
    def jaccard(self) -> np.ndarray:
        """``(k, k)``: ``|A ∩ B| / |A ∪ B|`` of the support sets of each pair of runs (1 for two empty sets)."""
        member = self.membership.astype(np.int64)
        both = member @ member.T
        sizes = member.sum(1)
        either = sizes[:, None] + sizes[None, :] - both
        return np.where(either > 0, both / np.maximum(either, 1), 1.0)

    @property
    def jaccard_chance(self) -> np.ndarray:
        """``(k, k)``: the overlap of random sets of the same sizes, ``E|A ∩ B| / (|A| + |B| − E|A ∩ B|)`` with
        ``E|A ∩ B| = |A|·|B|/m`` (a ratio of expectations), 1 on the diagonal."""
        sizes = np.asarray(self.n_support, dtype=float)
        both = np.outer(sizes, sizes) / self.m
        either = sizes[:, None] + sizes[None, :] - both
        chance = np.where(either > 0, both / np.where(either > 0, either, 1.0), 1.0)
        np.fill_diagonal(chance, 1.0)
        return chance

    @property
    def core_chance(self) -> float:
        """Expected core size of k independent random sets of the same sizes: ``m · Π (s_r / m)``."""
        return float(self.m * np.prod(np.asarray(self.n_support, dtype=float) / self.m))

    def most_frequent(self, n: int = IMAGE_COUNT) -> np.ndarray:
        """Dataset indices of up to ``n`` support vectors, most runs first (then by dataset index)."""
        order = np.lexsort((self.train_indices, -self.frequency))
        order = order[self.frequency[order] > 0]
        return self.train_indices[order[:n]]

    def _pairs(self) -> np.ndarray:
        return self.jaccard[np.triu_indices(self.k, 1)]

    def to_metrics(self) -> dict[str, float]:
        """The numbers as a flat dict of floats: per run ``n_support_run<r>`` and ``support_fraction_run<r>``
        (r = 1..k), ``jaccard_<r>_<q>`` per pair, their mean/min/max, ``jaccard_chance_mean``, ``core_size``,
        ``core_chance``, ``union_size`` and ``in_runs_<c>`` (samples that are support vectors in exactly c runs)."""
        pairs, chance = self._pairs(), self.jaccard_chance[np.triu_indices(self.k, 1)]
        metrics: dict[str, float] = {"runs": float(self.k), "m": float(self.m)}
        for r, (n, f) in enumerate(zip(self.n_support, self.support_fraction), 1):
            metrics[f"n_support_run{r}"], metrics[f"support_fraction_run{r}"] = float(n), f
        jaccard = self.jaccard
        for r, q in zip(*np.triu_indices(self.k, 1)):
            metrics[f"jaccard_{r + 1}_{q + 1}"] = float(jaccard[r, q])
        metrics.update(jaccard_mean=float(pairs.mean()), jaccard_min=float(pairs.min()),
                       jaccard_max=float(pairs.max()), jaccard_chance_mean=float(chance.mean()),
                       core_size=float(self.core.size), core_chance=self.core_chance, union_size=float(self.union.size))
        metrics.update({f"in_runs_{c}": float(n) for c, n in enumerate(self.in_runs) if c > 0})
        return metrics

    def report(self) -> str:
        """Markdown: the runs (file, epoch, s, s/m, the share of their support vectors in the core and in no other
        run), the Jaccard matrix, core and union, and the samples by the number of runs that share them."""
        k, m, jaccard = self.k, self.m, self.jaccard
        data = (self.data_class or "data module not recorded").rpartition(".")[2]
        where = ("the same training indices" if self.indices_recorded
                 else "no training indices recorded: positions compared")
        lines = [f"Support sets of {k} runs on one training set ({data}, m = {m}, {where}).", ""]
        lines += ["| run | file | epoch | s | s/m | in the core | in this run only |", "|---|---|---|---|---|---|---|"]
        alone = self.membership & (self.frequency == 1)[None, :]
        for r in range(k):
            s = self.n_support[r]
            lines.append(f"| {self.names[r]} | {self.paths[r]} | {self.epochs[r]} | {s} | {s / m:.4f} | "
                         f"{_share(self.core.size, s)} | {_share(int(alone[r].sum()), s)} |")
        lines += ["", "Jaccard overlap |A ∩ B| / |A ∪ B| of the support sets:", "",
                  "| | " + " | ".join(self.names) + " |", "|---|" + "---|" * k]
        lines += [f"| {self.names[r]} | " + " | ".join(f"{v:.3f}" for v in jaccard[r]) + " |" for r in range(k)]
        pairs, chance = self._pairs(), self.jaccard_chance[np.triu_indices(k, 1)]
        lines += ["", f"Pairwise Jaccard: mean {pairs.mean():.3f}, from {pairs.min():.3f} to {pairs.max():.3f}; "
                      f"random sets of the same sizes would overlap about {chance.mean():.3f}.",
                  f"Core (a support vector in {'both' if k == 2 else f'all {k}'} runs): {_samples(self.core.size)} "
                  f"(random sets of these sizes: about {self.core_chance:.1f}); union (in any run): "
                  f"{_samples(self.union.size)}.", "",
                  f"| support vector in c of the {k} runs | training samples |", "|---|---|"]
        lines += [f"| {c} | {n} |" for c, n in enumerate(self.in_runs)]
        if self.notes:
            lines += ["", *(f"Note: {note}" for note in self.notes)]
        return "\n".join(lines)

    def to_csv(self, path: str | Path) -> Path:
        """One row per run: ``run``, ``path``, ``epoch``, ``m``, ``n_support``, ``support_fraction``,
        ``in_core`` and ``only_this_run`` (support vectors of the run that are in the core, in no other run) and
        the run's row of the Jaccard matrix, ``jaccard_1`` … ``jaccard_k``. Written atomically."""
        jaccard, alone = self.jaccard, self.membership & (self.frequency == 1)[None, :]
        rows = [{"run": self.names[r], "path": self.paths[r], "epoch": self.epochs[r], "m": self.m,
                 "n_support": self.n_support[r], "support_fraction": self.support_fraction[r],
                 "in_core": int(self.core.size), "only_this_run": int(alone[r].sum()),
                 **{f"jaccard_{q + 1}": float(jaccard[r, q]) for q in range(self.k)}} for r in range(self.k)]
        return write_csv(rows, path)

    def samples_to_csv(self, path: str | Path) -> Path:
        """One row per training sample: ``dataset_index`` (a position where no indices are recorded), ``label``,
        ``frequency`` (runs where it is a support vector) and one 0/1 column per run. Written atomically."""
        columns = {f"sv_{name}".replace(" ", "_"): row for name, row in zip(self.names, self.membership)}
        rows = [{"dataset_index": int(index), "label": _label(self.labels[j]), "frequency": int(self.frequency[j]),
                 **{key: int(row[j]) for key, row in columns.items()}} for j, index in enumerate(self.train_indices)]
        return write_csv(rows, path)


def _share(n: int, of: int) -> str:
    return f"{n} ({100 * n / of:.0f}%)" if of else str(n)


def _samples(n: int) -> str:
    return f"{n} sample{'' if n == 1 else 's'}"


def _label(value: float) -> int:
    return int(round(float(value)))


def compare_support_sets(
    runs: Sequence[SupportVectorArtifact | str | Path],
    names: Sequence[str] | None = None,
    ignore_data_args: Iterable[str] = LOADER_ARGS,
) -> SupportSetComparison:
    """Compare the support sets of several result files of one training set.

    Args:
        runs: at least two result files (``.pt``, ``.json`` or their stem) or loaded artifacts.
        names: a short name per run for tables and figures (default ``"run 1"``, ``"run 2"``, …).
        ignore_data_args: data-module arguments that may differ between the runs (by default those that decide
            how samples are loaded, not which: :data:`LOADER_ARGS`); every other argument must be equal.

    Returns:
        A :class:`SupportSetComparison`.

    Raises:
        ValueError: fewer than two runs, one result given twice, or names that do not match the runs.
        FileNotFoundError, ArtifactMismatchError: a file is missing or is not a result file
            (:func:`~lightning_nsv.artifacts.load_support_vectors`).
        IncomparableRunsError: two runs are not on the same training samples; the message names both files and
            every difference (data-module class, arguments, m, training indices, labels).
    """
    runs = [runs] if isinstance(runs, (str, Path, SupportVectorArtifact)) else list(runs)
    if len(runs) < 2:
        given = f" ({runs[0].path if isinstance(runs[0], SupportVectorArtifact) else runs[0]})" if runs else ""
        raise ValueError(f"comparing support sets needs at least 2 result files, got {len(runs)}{given}")
    artifacts = [run if isinstance(run, SupportVectorArtifact) else _load(run) for run in runs]
    names = tuple(f"run {r}" for r in range(1, len(artifacts) + 1)) if names is None else tuple(names)
    if len(names) != len(artifacts) or len(set(names)) != len(names):
        raise ValueError(f"`names` must be {len(artifacts)} distinct names, one per run, got {list(names)}")
    seen: dict[str, Path] = {}
    for artifact in artifacts:
        if artifact.id in seen:
            raise ValueError(f"{seen[artifact.id]} and {artifact.path} are the same result (id {artifact.id}): "
                             "pass each run once")
        seen[artifact.id] = artifact.path
    ignored = frozenset(ignore_data_args)
    first = artifacts[0]
    notes: list[str] = []
    for other in artifacts[1:]:
        problems, allowed = _differences(first, other, ignored)
        if problems:
            raise IncomparableRunsError(
                f"{first.path} and {other.path} are not runs on the same training samples: {'; '.join(problems)}. "
                "Compare results of one data module with the same arguments (initialisation, model and training "
                "may differ)")
        notes += [f"{other.path} against {first.path}: {text}" for text in allowed]
    recorded = first.train_indices is not None
    base = np.sort(_dataset_indices(first))
    membership = np.zeros((len(artifacts), first.m), dtype=bool)
    for r, artifact in enumerate(artifacts):
        membership[r, np.searchsorted(base, _dataset_indices(artifact)[_support_positions(artifact)])] = True
    labels = first.labels.numpy()[np.argsort(_dataset_indices(first), kind="stable")]
    return SupportSetComparison(
        paths=tuple(str(a.path) for a in artifacts), names=names, epochs=tuple(a.epoch for a in artifacts),
        train_indices=base, labels=labels, membership=membership, data_class=first.data_class,
        data_hparams=first.data_hparams, indices_recorded=recorded, notes=tuple(notes),
    )


def _load(path: str | Path) -> SupportVectorArtifact:
    try:
        return load_support_vectors(path)
    except (OSError, ArtifactMismatchError):
        raise
    except Exception as error:  # torch.load of a file that is no torch file: KeyError, UnpicklingError, …
        raise ArtifactMismatchError(f"{path} cannot be read as a support-vector result "
                                    f"({type(error).__name__}: {error})") from error


def _same(a: Any, b: Any) -> bool:
    """Equality of recorded arguments, tensors included."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and bool(
            torch.equal(a, b))
    return a == b


def _dataset_indices(artifact: SupportVectorArtifact) -> np.ndarray:
    """Dataset index of each training position (the position itself where none are recorded)."""
    if artifact.train_indices is None:
        return np.arange(artifact.m)
    indices = np.asarray(artifact.train_indices, dtype=np.int64).reshape(-1)
    if indices.shape[0] != artifact.m:
        raise ValueError(f"{artifact.path} records {indices.shape[0]} training indices for m = {artifact.m} labels")
    if np.unique(indices).shape[0] != indices.shape[0]:
        raise ValueError(f"{artifact.path} records repeated training indices: samples cannot be told apart")
    return indices


def _support_positions(artifact: SupportVectorArtifact) -> np.ndarray:
    """Training positions of the support vectors: ``support`` (binary), samples with some pair ``α > 0``
    (multi-class, ``alpha`` of shape ``(m, K)``)."""
    alpha = artifact.alpha
    if alpha.dim() == 2:
        positions = np.flatnonzero((alpha > 0).any(1).numpy())
    else:
        positions = np.unique(np.asarray(artifact.support, dtype=np.int64).reshape(-1))
    bad = positions[(positions < 0) | (positions >= artifact.m)]
    if bad.size:
        raise ValueError(f"{artifact.path}: support index {int(bad[0])} outside the training set of m = {artifact.m}")
    return positions


def _differences(a: SupportVectorArtifact, b: SupportVectorArtifact,
                 ignored: frozenset[str]) -> tuple[list[str], list[str]]:
    """What makes ``b``'s training set another than ``a``'s, and what differs without doing so."""
    problems, allowed = [], []
    if a.data_class != b.data_class:
        problems.append(f"data module {a.data_class} vs {b.data_class}")
    args_a, args_b = a.data_hparams or {}, b.data_hparams or {}
    for key in sorted(set(args_a) | set(args_b)):
        if not _same(args_a.get(key, "(not set)"), args_b.get(key, "(not set)")):
            text = f"{key}={args_a.get(key, '(not set)')!r} vs {args_b.get(key, '(not set)')!r}"
            (allowed if key in ignored else problems).append(
                f"data-module argument {text}" + (" (allowed: it does not change the samples)" if key in ignored
                                                  else ""))
    if a.m != b.m:
        problems.append(f"m = {a.m} vs {b.m} training samples")
        return problems, allowed
    if (a.train_indices is None) != (b.train_indices is None):
        problems.append(f"training indices recorded in {(a if b.train_indices is None else b).path} only")
        return problems, allowed
    index_a, index_b = _dataset_indices(a), _dataset_indices(b)
    only_a, only_b = np.setdiff1d(index_a, index_b), np.setdiff1d(index_b, index_a)
    if only_a.size:
        problems.append(f"{only_a.size} of the m = {a.m} training indices differ (dataset index {int(only_a[0])} "
                        f"only in the first, {int(only_b[0])} only in the second)")
        return problems, allowed
    if not np.array_equal(index_a, index_b):
        allowed.append("the same training samples in another order (compared by dataset index)")
    labels_a = a.labels.numpy()[np.argsort(index_a)]
    labels_b = b.labels.numpy()[np.argsort(index_b)]
    if labels_a.shape != labels_b.shape or not np.array_equal(labels_a, labels_b):
        differ = np.flatnonzero(labels_a != labels_b) if labels_a.shape == labels_b.shape else np.arange(1)
        j = int(differ[0])
        problems.append(f"training labels differ at {differ.size} samples (dataset index {int(np.sort(index_a)[j])}: "
                        f"{labels_a[j]:g} vs {labels_b[j]:g})")
    return problems, allowed
