"""Network support vectors: the max-margin classifier in path space of a network at zero training error.

Pure functions over a :class:`~lightning_nsv.path_space.PathNetwork` and tensors (DESIGN.md §2).
"""
from __future__ import annotations

import hashlib
import math
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
import torch
from torch import Tensor
from torchmetrics.functional.classification import binary_accuracy

from lightning_nsv.errors import NonFiniteError
from lightning_nsv.path_space import (
    InputGramCache,
    PathKernelColumns,
    PathNetwork,
    PathSigns,
    _combine,
    analysis_inputs,
    as_tensor_on,
    forward_with_slopes,
    path_kernel,
    path_kernel_diagonal,
    path_norm_squared,
    path_signs,
    unique_patterns,
)
from lightning_nsv.sharded import ColumnSharing, serve
from lightning_nsv.solver import MaxMarginResult, NotSeparableError, max_margin, sample_indices
from lightning_nsv.solver.options import (  # noqa: F401 (KERNEL_MODES, SOLVERS, analysis_device: for callers)
    KERNEL_MODES,
    SOLVERS,
    SolverOptions,
    analysis_device,
    plan,
    solver_device,
)

__all__ = [
    "NonFiniteError",
    "SupportVectorAnalysis",
    "check_analysis_memory",
    "compression_bound",
    "conflicting_duplicates",
    "max_margin_decision",
    "network_support_vectors",
    "serve_kernel_columns",
    "signed_labels",
]

# the cold start tries the INITIAL_MARGINS·⌊√m⌋ smallest network margins first: at m = 20,000 (60,000) the solver
# then fetches 1,589 (4,174) columns for 1,183 (3,047) support vectors, against 1,777 (4,785) from ⌊√m⌋
INITIAL_MARGINS = 4


def signed_labels(y: Tensor | np.ndarray | Sequence[int]) -> Tensor:
    """Labels in ``{-1, +1}`` (float64, shape ``(n,)``) from ``{0, 1}``, booleans or ``{-1, +1}`` (a tensor, an array or
    a list, of shape ``(n,)`` or ``(n, 1)``)."""
    y = y if isinstance(y, Tensor) else torch.as_tensor(np.asarray(y))
    if y.dim() > 1:  # (n, 1) times outputs (n,) would broadcast to (n, n)
        if y.dim() != 2 or y.shape[1] != 1:
            raise ValueError(f"binary labels need one label per sample, shape (n,) or (n, 1), got {tuple(y.shape)}")
        y = y[:, 0]
    values = set(torch.unique(y).tolist())
    if not values <= {0, 1, -1}:
        raise ValueError(f"binary labels must be 0/1 or -1/+1, got values {sorted(values)[:10]}: class labels, "
                         "not scores or probabilities (threshold those first)")
    return torch.where(y > 0, 1.0, -1.0).to(torch.float64)


def compression_bound(m: int, s: int, n_hidden: int, delta: float = 0.05) -> float:
    """Sample-compression bound on the test error, holding with probability ``>= 1 − delta``.

    ``(n·s·ln 2 + ln C(m, s) + ln(m/δ)) / (m − s)``: a compression set of ``s`` samples with ``n`` bits of
    side information each (the activation pattern of the ``n`` hidden neurons). Returned even when above 1;
    ``inf`` when ``s == m``.
    """
    if not 0 <= s <= m or m < 1:
        raise ValueError(f"need 0 <= s <= m and m >= 1, got s={s}, m={m}")
    if not 0 < delta < 1:
        raise ValueError(f"`delta` must be in (0, 1), got {delta}")
    if s == m:
        return math.inf
    log_binom = math.lgamma(m + 1) - math.lgamma(s + 1) - math.lgamma(m - s + 1)
    return (n_hidden * s * math.log(2) + log_binom + math.log(m / delta)) / (m - s)


def max_margin_decision(
    net: PathNetwork,
    x_support: Tensor,
    y_support: Tensor,
    alpha_support: np.ndarray | Tensor,
    x: Tensor,
    intercept: float = 0.0,
    block_size: int | None = None,
    slopes_support: Sequence[Tensor] | None = None,
    slopes_x: Sequence[Tensor] | None = None,
) -> Tensor:
    """Decision function of the max-margin classifier, ``f(x) = Σ_i α_i y_i K(x, x_i) + b`` over support vectors.

    Cost: the path kernel between the ``n`` query points and the ``s`` support vectors, ``O(n·s·(f + Σ Ω_l))``.

    Args:
        net: the path part at the weights the SVM was fitted for.
        x_support, y_support, alpha_support: the support vectors (path-space inputs), their labels (0/1 or ±1)
            and dual coefficients (``svm.alpha_[svm.support_]``).
        x: query points, ``(n, f)`` path-space inputs.
        intercept: ``svm.intercept_``.
        slopes_support, slopes_x: the slopes of both sets, when known (otherwise computed).
    """
    if not len(x_support) == len(y_support) == len(alpha_support):
        raise ValueError(
            f"x_support, y_support and alpha_support must have one entry per support vector, got "
            f"{len(x_support)}, {len(y_support)} and {len(alpha_support)}"
        )
    net = net.to(x.device)
    x_support = x_support.to(x.device, net.dtype).reshape(len(x_support), -1)
    x = x.to(net.dtype).reshape(len(x), -1)
    if slopes_support is None:
        slopes_support = forward_with_slopes(net, x_support)[1]
    if slopes_x is None:
        slopes_x = forward_with_slopes(net, x)[1]
    kernel = path_kernel(x, slopes_x, x_support, slopes_support, bias=net.biases is not None, block_size=block_size)
    coef = as_tensor_on(alpha_support, net.dtype, kernel.device)
    coef = coef * signed_labels(y_support).to(kernel.device, net.dtype)
    return kernel @ coef + intercept


@dataclass(frozen=True)
class SupportVectorAnalysis:
    """What the max-margin classifier in path space says about a network at zero training error.

    Attributes:
        svm: the max-margin solution (α, support vectors, KKT residual).
        m: training samples.
        network_margin: ``min_j y_j N(x_j) / ||wbar||``.
        margin_ratio: ``network_margin / svm.margin`` (≤ 1; 1 iff the network is the max-margin classifier).
        cosine: cosine of ``wbar`` and the max-margin direction ``v`` in path space.
        wbar_norm: ``||wbar||``.
        unique_patterns_train / unique_patterns_val: distinct activation patterns.
        val_agreement: fraction of validation samples where ``sign N(x)`` equals the SVM's prediction.
        val_errors_network / val_errors_svm / val_errors_both: misclassified validation samples.
        bound: sample-compression bound with ``n_hidden`` bits per support vector.
        signs: signs of the path weights ``wbar`` (fractions of paths and of path mass that are positive).
        val_predictions: ``(network, svm)`` predictions in ``{-1, +1}`` on the validation set.
        solver_backend: where the solver ran: ``"numpy"`` (the CPU), ``"torch (DEVICE)"`` or ``"libsvm"``.
    """

    svm: MaxMarginResult
    m: int
    n_hidden: int
    network_margin: float
    margin_ratio: float
    cosine: float
    wbar_norm: float
    unique_patterns_train: int
    bound: float
    delta: float
    signs: PathSigns
    unique_patterns_val: int | None = None
    val_agreement: float | None = None
    val_errors_network: int | None = None
    val_errors_svm: int | None = None
    val_errors_both: int | None = None
    val_predictions: tuple[Tensor, Tensor] | None = field(default=None, repr=False)
    solver_backend: str = "numpy"

    @property
    def n_support(self) -> int:
        return self.svm.n_support_

    def to_metrics(self) -> dict[str, float]:
        metrics = {
            **self.svm.to_metrics(),
            "network_margin": self.network_margin,
            "margin_ratio": self.margin_ratio,
            "cosine_wbar_v": self.cosine,
            "unique_patterns_train": float(self.unique_patterns_train),
            "compression_bound": self.bound,
            **self.signs.to_metrics(),
        }
        metrics.update(validation_metrics(self))
        return metrics

    def report(self) -> str:
        """A short human-readable summary."""
        lines = [
            f"network support vectors: {self.n_support} of m={self.m} (s/m = {self.n_support / self.m:.4f}), "
            f"solver {self.svm.method}, KKT residual {self.svm.kkt_residual:.1e}",
            f"max margin 1/||v|| = {self.svm.margin:.4g}; network margin = {self.network_margin:.4g} "
            f"(ratio {self.margin_ratio:.4f}); cosine(wbar, v) = {self.cosine:.4f}",
            f"activation patterns: {self.unique_patterns_train} unique on train"
            + ("" if self.unique_patterns_val is None else f", {self.unique_patterns_val} on validation"),
        ]
        if self.val_agreement is not None:
            lines.append(
                f"validation: network and SVM agree on {100 * self.val_agreement:.2f}%; errors network "
                f"{self.val_errors_network}, SVM {self.val_errors_svm}, both {self.val_errors_both}"
            )
        lines.append(
            f"compression bound (delta={self.delta}, {self.n_hidden} bits per support vector): {self.bound:.4g}"
        )
        return "\n".join(lines)


VALIDATION_KEYS = ("unique_patterns_val", "val_agreement", "val_errors_network", "val_errors_svm", "val_errors_both")


def validation_metrics(analysis) -> dict[str, float]:
    """The validation numbers of a binary or multi-class analysis that were computed (``None`` ones left out)."""
    values = {key: getattr(analysis, key) for key in VALIDATION_KEYS}
    return {key: float(value) for key, value in values.items() if value is not None}


def uses_dense_kernel(kernel: str, intercept: bool) -> bool:
    """Whether :func:`network_support_vectors` builds the dense ``m×m`` kernel (else columns on demand):
    :attr:`~lightning_nsv.solver.options.SolverOptions.dense`."""
    return SolverOptions(kernel=kernel, intercept=intercept).dense


def network_support_vectors(
    net: PathNetwork,
    x_train: Tensor,
    y_train: Tensor,
    x_val: Tensor | None = None,
    y_val: Tensor | None = None,
    *,
    intercept: bool = False,
    C: float = 1e7,
    delta: float = 0.05,
    kernel: str = "auto",
    max_dense_bytes: int = 4 << 30,
    block_size: int | None = None,
    initial: Sequence[int] | np.ndarray | Tensor | None = None,
    cache: InputGramCache | None = None,
    sharing: ColumnSharing | None = None,
    solver: str = "auto",
) -> SupportVectorAnalysis:
    """Fit the max-margin classifier on the path kernel of ``net`` and compare it with the network.

    Cost: with ``kernel="columns"`` only the kernel columns of samples that enter the solver's free set
    (``8·m·s'`` bytes for ``s'`` of them, ``O(m·s'·(f + Σ Ω_l))`` time); with ``kernel="dense"`` the ``m×m``
    path kernel in float64 (``8·m²`` bytes, m = 60,000: 28.8 GB; ``O(m²·(f + Σ Ω_l))`` time). ``"auto"`` takes
    columns for the problem through the origin (faster at every size measured) and the dense kernel for the
    intercept protocol, which needs it, up to ``max_dense_bytes``. Validation needs the kernel between validation
    samples and support vectors only. Computations run on the device of ``x_train`` when it is the CPU or CUDA
    (inputs elsewhere, e.g. on MPS, which has no float64, are moved to the CPU), the solver's too unless
    ``solver="numpy"`` (see ``solver``).

    Args:
        net: the path part at the frozen weights.
        x_train, y_train: path-space inputs ``(m, f)`` and labels (0/1 or ±1).
        x_val, y_val: optional held-out samples for agreement and pattern counts.
        intercept: ``True`` for the paper's ``SVC`` protocol with an intercept.
        C: penalty of the intercept protocol on the normalised kernel.
        delta: confidence of the compression bound.
        kernel: ``"auto"``, ``"dense"`` or ``"columns"`` (see Cost).
        max_dense_bytes: largest dense kernel ``"auto"`` builds.
        block_size: rows per block of the dense kernel computation.
        initial: sample indices to try first as support vectors, e.g. the support of a previous analysis
            (a warm start), admitted to the solver's free set as one block (those that violate the margin); default:
            the support kept in ``cache`` for these inputs (with ``solver`` torch less the members that the
            max-margin problem on that support alone no longer needs, :func:`pruned_support`), else the
            ``4·⌊√m⌋`` smallest network margins ``y·N(x)``, admitted ``⌊√m⌋`` at a time, most violated first,
            while they violate the margin. The solution does not depend on it; the time does.
        cache: an :class:`~lightning_nsv.path_space.InputGramCache` to pass to every analysis of the same
            training inputs (e.g. after more epochs): rows of ``X Xᵀ`` it holds are not recomputed, and it keeps
            those of this analysis's support (``8·m·s`` bytes; up to ``8·m·s'`` during the analysis) and warm
            starts the next one from that support. Used with kernel columns only.
        sharing: a :class:`~lightning_nsv.sharded.ColumnSharing` of the root rank of a ``torch.distributed``
            group: the kernel columns are computed by every rank of the group on its shard of the rows (the other
            ranks run :func:`serve_kernel_columns` on the same inputs meanwhile); ``cache`` is then not used.
        solver: where the active-set solver of the problem through the origin keeps its columns and factor:
            ``"torch"`` on the device of ``x_train``, ``"numpy"`` on the CPU; ``"auto"`` (default) takes torch for
            CUDA inputs and numpy otherwise (less CPU time there). Same solution either way, to rounding.

    Raises:
        NonFiniteError: when weights, biases, inputs or outputs hold NaN or inf.
        NotSeparableError: when ``y·N(x) <= 0`` for a training sample (Assumption 1 fails). A sample with
            ``N(x) = 0`` counts as an error here: it has no margin, whatever ``sign(0)`` says.
        ValueError: on labels, options or a dense kernel that does not fit in memory.
    """
    options = SolverOptions(kernel=kernel, solver=solver, intercept=intercept, C=C, max_dense_bytes=max_dense_bytes)
    _check_finite_network(net)
    check_samples(x_train, x_val)
    decided = plan(options, x_train.device)
    device, solver_device = decided.device, decided.solver_device
    x_train = x_train.to(device)  # x_val too, below
    x_train = x_train.reshape(len(x_train), -1)
    _check_finite_samples(x_train, "training inputs")
    y = signed_labels(y_train).to(device)
    if len(y) != len(x_train):
        raise ValueError(f"x_train has {len(x_train)} samples and y_train {len(y)}")
    if intercept and len(torch.unique(y)) < 2:
        raise ValueError(f"intercept=True needs samples of both classes, got only label {int(y[0])} in all "
                         f"{len(y)} samples; use intercept=False (the hyperplane through the origin)")
    on_device = net.to(device)
    x_train = analysis_inputs(x_train, net.dtype)  # float32 inputs stay float32: the kernels convert them exactly
    m = len(y)
    dense = decided.dense
    dense_bytes = m * m * torch.finfo(net.dtype).bits // 8
    if dense:  # before anything of size m is allocated
        _check_dense_fits(dense_bytes, m, max_dense_bytes if kernel == "auto" else None, intercept, device)
    check_analysis_memory(net, m, 0 if x_val is None else len(x_val),
                          0 if dense else min(m, INITIAL_MARGINS * int(math.sqrt(m))), device)
    outputs, slopes_train = forward_with_slopes(on_device, x_train)
    _check_finite_samples(outputs[:, None], "network outputs")
    errors = int((y * outputs <= 0).sum())
    if errors:
        raise NotSeparableError(_misclassified_message(x_train, y, outputs, errors))
    bias = net.biases is not None
    if dense:
        svm = max_margin(path_kernel(x_train.to(net.dtype), slopes_train, bias=bias, block_size=block_size), y,
                         intercept=intercept, C=C, device=solver_device)
    else:
        if sharing is not None:
            cache = None
        columns = _kernel_columns(on_device, x_train, slopes_train, cache)
        if initial is None and cache is not None and len(cache):
            # the previous support (the cache holds these inputs' rows); the torch solver forms every member's
            # full column on admission, so it starts from those that the support's own problem still needs
            # (numpy's admits candidates from Q[F ∪ new, new] and forms full columns only for those kept)
            initial = cache.samples if solver_device is None else pruned_support(
                on_device, x_train, slopes_train, y, cache.samples, cache=cache)
        initial_block = None  # a guess from the margins: admitted ⌊√m⌋ at a time (ties at the start: index order)
        if initial is None:
            initial = np.sort(torch.argsort(y * outputs)[: INITIAL_MARGINS * int(math.sqrt(m))].cpu().numpy())
        else:  # a previous support: admitted whole
            initial_block = max(1, len(initial))
        initial = sample_indices(initial)
        if cache is not None:
            initial = cache.in_slot_order(initial)
        diag = path_kernel_diagonal(x_train, slopes_train, bias=bias, dtype=net.dtype)
        svm = max_margin(columns if sharing is None else sharing.columns(columns), y, kernel_diag=diag.cpu().numpy(),
                         initial=initial, initial_block=initial_block, device=solver_device)
        if cache is not None:
            cache.keep(svm.support_)

    net = net.to("cpu")  # the scalar summaries below
    wbar_norm = math.sqrt(path_norm_squared(net))
    y_cpu, outputs_cpu = y.cpu(), outputs.cpu().to(torch.float64)
    alpha = torch.from_numpy(svm.alpha_)
    wbar_dot_v = float((alpha * y_cpu * outputs_cpu).sum())
    cosine = wbar_dot_v / (wbar_norm * math.sqrt(svm.norm_v_sq))
    network_margin = float((y_cpu * outputs_cpu).min()) / wbar_norm
    n_hidden = sum(net.hidden_widths)
    analysis = dict(
        svm=svm,
        m=m,
        n_hidden=n_hidden,
        network_margin=network_margin,
        margin_ratio=network_margin / svm.margin,
        cosine=cosine,
        wbar_norm=wbar_norm,
        unique_patterns_train=unique_patterns(slopes_train, gammas=net.gammas),
        bound=compression_bound(m, svm.n_support_, n_hidden, delta),
        delta=delta,
        signs=path_signs(net),
        solver_backend=svm.method if svm.method != "active-set" else decided.backend,
    )
    if x_val is not None:
        _check_finite_samples(x_val.reshape(len(x_val), -1), "validation inputs")
        analysis.update(_validation(on_device, x_train, slopes_train, y, svm, x_val.to(device), y_val, block_size))
    return SupportVectorAnalysis(**analysis)


def serve_kernel_columns(net: PathNetwork, x_train: Tensor, *, group: Any = None, root: int = 0) -> int:
    """The other ranks' side of :func:`network_support_vectors` with ``sharing``: compute the kernel columns the
    root asks for, on this rank's shard of the rows of the same ``net`` and ``x_train``, until the root's
    :class:`~lightning_nsv.sharded.ColumnSharing` block ends; the number of column blocks computed."""
    x_train = analysis_inputs(x_train.reshape(len(x_train), -1), net.dtype)
    on_device = net.to(x_train.device)
    return serve(_kernel_columns(on_device, x_train, forward_with_slopes(on_device, x_train)[1]), group, root)


# largest kernel of a previous support that a warm start solves on its own first (5,792 samples in float64)
PRUNE_MAX_BYTES = 256 << 20


def pruned_support(net: PathNetwork, x_train: Tensor, slopes_train: Sequence[Tensor], y: Tensor,
                   previous: Tensor | np.ndarray, *, cache: InputGramCache | None = None) -> np.ndarray:
    """The members of a previous support ``previous`` that are support vectors of the max-margin problem on those
    samples alone, on the current ``net`` (``slopes_train`` its slopes on ``x_train``, ``y`` in ±1): what a warm
    start admits first. Members the new network no longer needs then never have their full kernel columns formed
    nor leave the solver's factor one downdate at a time; any that the whole training set does need re-enter as
    violators. ``previous`` itself when its kernel exceeds :data:`PRUNE_MAX_BYTES` or the sub-problem fails.
    ``cache``: an :class:`~lightning_nsv.path_space.InputGramCache` attached to ``x_train`` in the dtype of ``net``
    that keeps the rows of ``previous`` (their input Gram is read from it instead of computed).

    Cost: the ``b×b`` kernel of the ``b`` members and an active-set solve on it."""
    samples = np.asarray(previous.cpu() if isinstance(previous, Tensor) else previous, dtype=np.int64)
    if not len(samples) or len(samples) ** 2 * torch.finfo(net.dtype).bits // 8 > PRUNE_MAX_BYTES:
        return samples
    idx = torch.from_numpy(samples).to(x_train.device)
    if cache is not None:
        kernel = _combine(cache.gram_among(idx),
                          [(s[idx] @ s[idx].T).to(net.dtype) for s in slopes_train], net.biases is not None)
    else:
        kernel = _kernel_columns(net, x_train[idx], [s[idx] for s in slopes_train]).rows(
            torch.arange(len(idx), device=x_train.device))
    try:
        with warnings.catch_warnings():  # a guess: the solve of the whole problem reports on its own accuracy
            warnings.simplefilter("ignore")
            sub = max_margin(kernel.to(torch.float64), y[idx], initial=np.arange(len(idx)), initial_block=len(idx))
    except (NotSeparableError, ValueError, np.linalg.LinAlgError):
        return samples
    kept = samples[sub.support_]
    return kept if len(kept) else samples


def _kernel_columns(net: PathNetwork, x_train: Tensor, slopes_train: Sequence[Tensor],
                    cache: InputGramCache | None = None) -> PathKernelColumns:
    """The kernel columns of ``x_train`` (as :func:`analysis_inputs` keeps it) that the root and the serving ranks
    compute alike."""
    return PathKernelColumns(x_train, slopes_train, net.betas, net.gammas, bias=net.biases is not None,
                             input_gram_cache=cache, dtype=net.dtype)


# the decisions, made in lightning_nsv.solver.options; kept under these names for existing callers
solver_backend_device = solver_device


def check_samples(x_train: Tensor, x_val: Tensor | None = None) -> None:
    """Refuse an empty training set, and an empty validation set passed instead of ``None``."""
    if not len(x_train):
        raise ValueError("x_train holds no samples: the analysis needs the training set the network reached zero "
                         "training error on")
    if x_val is not None and not len(x_val):
        raise ValueError("x_val holds no samples: pass x_val=None (and y_val=None) to analyse without validation")


def _check_finite_network(net: PathNetwork) -> None:
    for name, tensors in (("weights", net.weights), ("biases", net.biases or ())):
        for k, t in enumerate(tensors):
            if not bool(torch.isfinite(t).all()):
                kind = "NaN" if bool(torch.isnan(t).any()) else "inf"
                raise NonFiniteError(f"{name}[{k}] holds {kind}: the network has diverged (lower the learning "
                                     "rate or clip gradients); no support-vector analysis of non-finite weights")


def _check_finite_samples(values: Tensor, what: str) -> None:
    if values.numel() and bool(torch.isfinite(values.sum()).item()):
        return  # a finite sum has no NaN or inf among its terms (one pass; overflow falls through to the full check)
    finite = torch.isfinite(values).all(1)
    if not bool(finite.all()):
        first = int(torch.nonzero(~finite)[0, 0])
        cause = ("the data hold NaN or inf" if what.endswith("inputs")
                 else "the network overflows on it (has it diverged?) or the data hold NaN or inf")
        raise NonFiniteError(f"{what} are not finite at sample {first} ({int((~finite).sum())} samples in all): "
                             f"{cause}")


def _misclassified_message(x: Tensor, y: Tensor, outputs: Tensor, errors: int) -> str:
    on_boundary = int((outputs == 0).sum())
    message = (f"the network misclassifies {errors} of {len(y)} training samples ({on_boundary} of them with "
               "N(x) = 0, e.g. all units of a layer inactive): the support-vector analysis needs y·N(x) > 0 on "
               "every training sample (Assumption 1)")
    pairs = conflicting_duplicates([(x, y)], limit=1)
    if pairs:
        i, j = pairs[0]
        return (f"samples {i} and {j} have the same input and opposite labels: no classifier separates "
                f"them, the data are not separable (remove or relabel the duplicates); {message}")
    return message


def conflicting_duplicates(batches: Iterable[tuple[Tensor, Tensor]], limit: int = 5) -> list[tuple[int, int]]:
    """The first ``limit`` pairs ``(i, j)``, ``i < j``, of samples with the same input and different labels, numbered
    in the order of ``batches`` (``(inputs, labels)``). Cost: one pass, each input row hashed once (16 bytes kept
    per distinct row)."""
    first: dict[bytes, tuple[int, float]] = {}
    pairs: list[tuple[int, int]] = []
    start = 0
    for x, y in batches:
        rows = (x.detach().reshape(len(x), -1).cpu() + 0.0).contiguous().numpy()  # + 0.0: -0.0 is 0.0
        for i, (row, label) in enumerate(zip(rows, y.reshape(-1).tolist()), start=start):
            seen = first.setdefault(hashlib.blake2b(row.tobytes(), digest_size=16).digest(), (i, label))
            if seen[1] != label and len(pairs) < limit:
                pairs.append((seen[0], i))
        start += len(rows)
    return pairs


def _check_dense_fits(nbytes: int, m: int, limit: int | None, intercept: bool,
                      device: torch.device = torch.device("cpu")) -> None:
    fix = ("use kernel='columns' (the problem through the origin)" if not intercept
           else "the intercept protocol needs the dense kernel; use intercept=False with kernel='columns'")
    check_memory(nbytes, f"the dense kernel needs {nbytes / 1e9:.1f} GB for m={m:,}", fix, device, limit=limit,
                 limit_name="max_dense_bytes")


def check_memory(nbytes: int, need: str, fix: str, device: torch.device = torch.device("cpu"),
                 limit: int | None = None, limit_name: str = "") -> None:
    """Refuse, before allocating it, ``nbytes`` above ``limit`` or above the memory available (on ``device`` for
    CUDA). ``need`` says what the bytes are for, ``fix`` what to do."""
    if limit is not None and nbytes > limit:
        raise ValueError(f"{need}, above {limit_name}={limit:,}; {fix} or raise {limit_name}")
    available = available_memory_bytes()
    if available is not None and nbytes > available:
        raise ValueError(f"{need}, more than the {available / 1e9:.1f} GB of memory available; {fix}")
    if device.type == "cuda":  # formed there; torch's allocator reuses what it holds unused
        unused = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        free = torch.cuda.mem_get_info(device)[0] + unused
        if nbytes > free:
            raise ValueError(f"{need}, more than the {free / 1e9:.1f} GB free on {device}; {fix}")


def check_analysis_memory(net: PathNetwork, m: int, n_val: int = 0, columns: int = 0,
                          device: torch.device = torch.device("cpu")) -> None:
    """Refuse an analysis whose per-sample arrays do not fit, before any of them is allocated: the activation slopes
    of all ``m`` training and ``n_val`` validation samples (one float per hidden unit, plus the widest layer's
    pre-activations during the forward pass), their 0/1 patterns (float32) and a first block of ``columns`` kernel
    columns (``m`` floats each)."""
    units, widest = sum(net.hidden_widths), max(net.hidden_widths, default=0)
    item = torch.finfo(net.dtype).bits // 8
    slopes = (m + n_val) * units * item
    transient = 2 * max(m, n_val) * widest * item
    patterns = m * units * 4
    block = m * columns * item
    total = slopes + transient + patterns + block
    what = (f"the support-vector analysis needs about {total / 1e9:.1f} GB for m={m:,} training"
            + (f" and {n_val:,} validation" if n_val else "") + f" samples: the activation slopes of every sample "
            f"({units:,} hidden units, {slopes / 1e9:.1f} GB, and {transient / 1e9:.1f} GB during the forward pass), "
            f"their activation patterns ({patterns / 1e9:.1f} GB)"
            + (f" and a first block of {columns:,} kernel columns ({block / 1e9:.1f} GB)" if columns else ""))
    check_memory(total, what, "analyse fewer samples (a data module with a smaller `m`, fewer validation samples) "
                 "or a narrower network", device)


def available_memory_bytes() -> int | None:
    """Memory available to new allocations (``MemAvailable`` of ``/proc/meminfo``, else physical pages)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _validation(net, x_train, slopes_train, y, svm, x_val, y_val, block_size) -> dict:
    val_outputs, slopes_val = forward_with_slopes(net, x_val)
    sv = torch.from_numpy(svm.support_)
    decision = max_margin_decision(net, x_train[sv], y[sv], svm.alpha_[svm.support_], x_val, svm.intercept_,
                                   block_size=block_size, slopes_support=[s[sv] for s in slopes_train],
                                   slopes_x=slopes_val)
    svm_pred = torch.where(decision >= 0, 1.0, -1.0).to("cpu", torch.float64)
    net_pred = torch.where(val_outputs >= 0, 1.0, -1.0).to("cpu", torch.float64)
    result = {
        "unique_patterns_val": unique_patterns(slopes_val, gammas=net.gammas),
        "val_agreement": float(binary_accuracy((svm_pred > 0).long(), (net_pred > 0).long()))
        if len(net_pred) else float("nan"),
        "val_predictions": (net_pred, svm_pred),
    }
    if y_val is not None:
        target = signed_labels(y_val).cpu()
        net_wrong, svm_wrong = net_pred != target, svm_pred != target
        result.update(
            val_errors_network=int(net_wrong.sum()),
            val_errors_svm=int(svm_wrong.sum()),
            val_errors_both=int((net_wrong & svm_wrong).sum()),
        )
    return result
