"""The network-support-vector analysis against the paper's method, and how it scales with m (DESIGN.md §6).

Default: one run compares, at m = 20,000, the paper's method (dense float64 path kernel, then scikit-learn
``SVC(kernel="precomputed")``) with the package's ``network_support_vectors`` end to end, checks exactness
against an exact dense solve, measures a warm-started repeat, near-degenerate data at m = 10,000 and the
package at m = 60,000 (see :func:`compare_main`; ``benchmarks/README.md``).

With ``--scaling``, for each m of ``--sizes``: train a 784-16-16-16-1 ReLU MLP with the paper's SGD recipe (lr 0.01, momentum 0.05, batch
100, no biases) until zero training error (``y·N(x) > 0`` on every sample, float64, weights frozen), then
time

  (a) the dense float64 path kernel (``path_kernel``),
  (b) the exact no-intercept active-set solver on that dense kernel (``max_margin``),
  (d) scikit-learn ``SVC(kernel="precomputed", tol=1e-5, shrinking=False, C=1e7)`` through
      ``max_margin(..., intercept=True)`` (the paper's protocol, with an intercept),
  (c) the active-set solver fed kernel *columns* on demand (no dense kernel), with ``initial=`` the samples
      of the k smallest network margins ``y·N(x)``: k = the number of support vectors found in (b) (an
      oracle count), k = ⌊√m⌋ (what ``network_support_vectors(kernel="columns")`` uses), and no
      ``initial``; the kernel columns it asked for are counted.

Peak memory of each step is the process's peak resident set size (``VmHWM``, reset before the step by
writing ``5`` to ``/proc/self/clear_refs``, after ``malloc_trim`` gave freed heap back; falls back to
``resource.getrusage`` where that is refused), and "own" that peak less the resident size at the step's start.
It counts numpy, torch and libsvm allocations alike, which ``tracemalloc`` would not.

Data: binary MNIST (0-4 vs 5-9) from ``--mnist-root`` (torchvision layout, ``<root>/MNIST/raw``) when
given; otherwise an MNIST-shaped stand-in built deterministically from scikit-learn's bundled
``load_digits`` (see :func:`digits_standin`). The results file says which.

Run ``python benchmarks/nsv_scale.py --help``; see ``benchmarks/README.md``.
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import gc
import math
import os
import platform
import resource
import shlex
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import sklearn
import torch
import torch.nn.functional as F

from lightning_nsv.analysis import network_support_vectors
from lightning_nsv.extract import find_path_part
from lightning_nsv.kernel import (InputGramCache, PathKernelColumns, PathNetwork, forward_with_slopes, path_kernel,
                                  path_kernel_diagonal)
from lightning_nsv.kernel.formulas import path_norm_squared
from lightning_nsv.models import LeakyReLUMLP
from lightning_nsv.solver import max_margin, solver_device
from threadpoolctl import threadpool_limits

DEFAULT_SIZES = (2_000, 5_000, 10_000, 20_000)
WIDTHS = (16, 16, 16)


# --------------------------------------------------------------------------------------------- data
def digits_standin(n: int, seed: int, chunk: int = 1000, *, digit_labels: bool = False
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` MNIST-shaped samples ``(n, 1, 28, 28)`` in [0, 1] and labels 0/1 (digit >= 5), or the digits 0-9
    with ``digit_labels``; deterministic (the images do not depend on ``digit_labels``).

    Each sample is one of scikit-learn's 1,797 8×8 digits (drawn uniformly with replacement), upsampled
    bilinearly to 28×28, shifted by a random integer (dx, dy) in [-2, 2]² (zero fill), its intensity
    multiplied by a factor uniform in [0.7, 1.3], plus Gaussian pixel noise (sd 0.1), clipped to [0, 1].
    Samples are drawn in chunks of ``chunk``, each from its own generator seeded by ``(seed, chunk index)``,
    so the first ``k`` samples do not depend on ``n``: the training sets of different sizes are nested.
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    base = torch.from_numpy(digits.images).to(torch.float32).unsqueeze(1) / 16.0
    base = F.interpolate(base, size=(28, 28), mode="bilinear", align_corners=False).clamp(0, 1)
    labels = torch.from_numpy(digits.target if digit_labels else digits.target >= 5).long()
    padded = F.pad(base, (2, 2, 2, 2))
    xs, ys = [], []
    for c in range(math.ceil(n / chunk)):
        g = torch.Generator().manual_seed(seed * 1_000_003 + c)
        pick = torch.randint(len(base), (chunk,), generator=g)
        shifts = torch.randint(-2, 3, (chunk, 2), generator=g)
        gain = 0.7 + 0.6 * torch.rand(chunk, 1, 1, 1, generator=g)
        noise = 0.1 * torch.randn(chunk, 1, 28, 28, generator=g)
        x = torch.stack([padded[i, :, 2 + dy:30 + dy, 2 + dx:30 + dx]
                         for i, (dy, dx) in zip(pick.tolist(), shifts.tolist())])
        xs.append((gain * x + noise).clamp(0, 1))
        ys.append(labels[pick])
    return torch.cat(xs)[:n], torch.cat(ys)[:n]


def mnist(root: str, m: int, seed: int, val_size: int = 0) -> tuple[torch.Tensor, ...]:
    """``m`` seeded training samples of MNIST's 60,000 and the first ``val_size`` of its official test set."""
    from lightning_nsv.datamodules.mnist import BinaryMNISTDataModule

    dm = BinaryMNISTDataModule(root=root, m=m, seed=seed)
    dm.setup("fit")
    x_val, y_val = (t[:val_size] for t in dm.val_dataset.tensors)
    return (*dm.train_dataset.tensors, x_val, y_val)


# ----------------------------------------------------------------------------------------- memory
class PeakRSS:
    """Peak resident set size (bytes) of this process during a ``with`` block, and at its start."""

    def __enter__(self) -> "PeakRSS":
        gc.collect()
        _trim_heap()
        try:
            Path("/proc/self/clear_refs").write_text("5")
            self.resettable = True
        except OSError:
            self.resettable = False
        self.start = _status_kb("VmRSS") * 1024
        return self

    def __exit__(self, *exc) -> None:
        if self.resettable:
            self.peak = _status_kb("VmHWM") * 1024
        else:  # lifetime maximum of the process: an upper bound of the step's peak
            self.peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    @property
    def extra(self) -> int:
        """Peak above the RSS at the start of the block: what the step itself needed."""
        return max(0, self.peak - self.start)


def _trim_heap() -> None:
    """Give freed heap pages back to the OS (glibc ``malloc_trim``) so that the RSS at a step's start counts live
    data, not what earlier steps freed."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.2f}"


# --------------------------------------------------------------------------------------- training
def train_to_zero_error(x, y01, args, seed):
    """Plain-torch loop with the paper's recipe; returns the model, epochs, seconds and remaining errors.

    The network is :class:`LeakyReLUMLP`'s ``nn.Sequential`` and its own optimiser (SGD, lr 0.01, momentum
    0.05) and loss (logistic loss on one logit). Zero error is checked after every epoch on the whole
    training set in float64 through the path network, as the analysis sees it.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(args.train_threads)
    torch.manual_seed(seed)
    model = LeakyReLUMLP(in_features=784, widths=list(WIDTHS), beta=0.0, bias=args.bias, optimizer="sgd",
                         lr=args.lr, momentum=args.momentum)
    optimizer = model.configure_optimizers()
    part = find_path_part(model)
    x_flat, target = x.reshape(len(x), -1), y01.to(torch.float32)
    y_pm = torch.where(y01 > 0, 1.0, -1.0).to(torch.float64)
    g = torch.Generator().manual_seed(seed)
    start, errors, epoch = time.perf_counter(), len(x), 0
    while epoch < args.max_epochs and time.perf_counter() - start < args.max_train_seconds:
        epoch += 1
        for batch in torch.randperm(len(x), generator=g).split(args.batch_size):
            loss = F.binary_cross_entropy_with_logits(model(x_flat[batch]), target[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            out, _ = forward_with_slopes(part.path_network(), x_flat)
        errors = int((y_pm * out <= 0).sum())
        if errors == 0:
            break
    torch.set_num_threads(threads)
    return model, epoch, time.perf_counter() - start, errors


# --------------------------------------------------------------------------------------- analysis
class ColumnOracle:
    """``K[:, idx]`` computed on demand from the factorised kernel; counts the columns asked for."""

    def __init__(self, x: torch.Tensor, slopes: list[torch.Tensor], bias: bool) -> None:
        self.x, self.slopes, self.bias = x, slopes, bias
        self.columns = self.calls = 0
        self.seconds = 0.0

    def __call__(self, idx: np.ndarray) -> np.ndarray:
        start = time.perf_counter()
        t = torch.from_numpy(np.asarray(idx, dtype=np.int64))
        block = path_kernel(self.x, self.slopes, self.x[t], [s[t] for s in self.slopes], bias=self.bias)
        self.columns += len(t)
        self.calls += 1
        self.seconds += time.perf_counter() - start
        return block.numpy()


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    a, b = set(a.tolist()), set(b.tolist())
    return len(a & b) / max(len(a | b), 1)


def timed(fn, *a, blas_threads=None, **kw):
    with threadpool_limits(blas_threads, user_api="blas"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with PeakRSS() as mem:
            start = time.perf_counter()
            out = fn(*a, **kw)
            seconds = time.perf_counter() - start
    return out, seconds, mem, [str(w.message) for w in caught]


def run_size(m, x_all, y_all, args, log):
    row = {"m": m}
    x, y01 = x_all[:m], y_all[:m]
    model, epochs, train_s, errors = train_to_zero_error(x, y01, args, args.seed)
    row.update(epochs=epochs, train_s=train_s, train_errors=errors)
    log(f"m={m}: trained {epochs} epochs in {train_s:.1f} s, {errors} training errors (float64 check)")
    if errors:
        row["skipped"] = f"no zero training error after {epochs} epochs ({errors} errors)"
        return row

    net: PathNetwork = find_path_part(model).path_network()
    x64 = x.reshape(m, -1).to(torch.float64)
    y = torch.where(y01 > 0, 1.0, -1.0).to(torch.float64)
    with torch.no_grad():
        outputs, slopes = forward_with_slopes(net, x64)
    net_margins = (y * outputs).numpy()
    bias = net.biases is not None

    kernel, row["kernel_s"], mem, _ = timed(path_kernel, x64, slopes, bias=bias)
    row["kernel_mem"] = mem
    log(f"  (a) dense path kernel: {row['kernel_s']:.1f} s, peak +{gib(mem.extra)} GiB")

    bt = args.blas_threads
    dense, row["dense_s"], row["dense_mem"], row["dense_warn"] = timed(max_margin, kernel, y, blas_threads=bt)
    log(f"  (b) active set on dense K: {row['dense_s']:.1f} s, s={dense.n_support_}, "
        f"KKT {dense.kkt_residual:.1e}, {dense.iterations} iterations")

    svc, row["svc_s"], row["svc_mem"], row["svc_warn"] = timed(max_margin, kernel, y, intercept=True,
                                                                    blas_threads=bt)
    log(f"  (d) SVC with intercept: {row['svc_s']:.1f} s, s={svc.n_support_}, KKT {svc.kkt_residual:.1e}")
    del kernel
    gc.collect()

    diag = path_kernel_diagonal(x64, slopes, bias=bias).numpy()
    order = np.argsort(net_margins, kind="stable")
    k, k_sqrt = dense.n_support_, int(math.sqrt(m))
    row["initial_hit"] = len(np.intersect1d(order[:k], dense.support_)) / k
    row["sqrt_hit"] = len(np.intersect1d(order[:k_sqrt], dense.support_)) / k_sqrt
    for name, init in (("cols", order[:k]), ("colsq", order[:k_sqrt]), ("cols0", None)):
        oracle = ColumnOracle(x64, slopes, bias)
        res, row[f"{name}_s"], row[f"{name}_mem"], row[f"{name}_warn"] = timed(
            max_margin, oracle, y, kernel_diag=diag, initial=init, blas_threads=bt)
        row[name] = res
        row[f"{name}_columns"], row[f"{name}_col_s"] = oracle.columns, oracle.seconds
        row[f"{name}_calls"], row[f"{name}_iters"] = oracle.calls, res.iterations
        row[f"{name}_jaccard"] = jaccard(res.support_, dense.support_)
        log(f"  (c) columns on demand, initial={'none' if init is None else len(init)}: {row[f'{name}_s']:.1f} s "
            f"({oracle.seconds:.1f} s in kernel columns), {oracle.columns} columns in {oracle.calls} calls, "
            f"{res.iterations} iterations, s={res.n_support_}, "
            f"KKT {res.kkt_residual:.1e}, Jaccard with (b) {row[f'{name}_jaccard']:.4f}")

    wbar_norm = math.sqrt(path_norm_squared(net))
    alpha = dense.alpha_
    row.update(
        dense=dense, svc=svc,
        jaccard=jaccard(dense.support_, svc.support_),
        min_net_margin=float(net_margins.min()),
        margin_ratio=float(net_margins.min()) / wbar_norm / dense.margin,
        cosine=float(alpha @ (y.numpy() * outputs.numpy())) / (wbar_norm * math.sqrt(dense.norm_v_sq)),
    )
    log(f"  Jaccard(no-intercept, SVC) {row['jaccard']:.4f}; margin ratio {row['margin_ratio']:.4f}; "
        f"cosine(wbar, v) {row['cosine']:.4f}")
    return row


# ---------------------------------------------------------------------------------------- report
def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor() or "unknown")
    ram = _status_meminfo_gib()
    env = ", ".join(f"{k}={os.environ[k]}" for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "OPENBLAS_NUM_THREADS",
                                                     "MKL_NUM_THREADS") if k in os.environ)
    return (f"{model}; {len(os.sched_getaffinity(0))} cores usable, torch threads "
            f"{torch.get_num_threads()}; {ram} GiB RAM; Python {platform.python_version()}, torch "
            f"{torch.__version__}, numpy {np.__version__}, scipy {__import__('scipy').__version__}, "
            f"scikit-learn {sklearn.__version__}" + (f"; environment: {env}" if env else ""))


def _status_meminfo_gib() -> str:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return f"{int(line.split()[1]) / 2**20:.0f}"
    return "?"


VARIANTS = (("cols", "(c) initial k=s"), ("colsq", "(c√) initial k=√m"), ("cols0", "(c0) no initial"))


def markdown(rows, args, data_desc, total_s, notes) -> str:
    done = [r for r in rows if "skipped" not in r]
    blas = "library default (all cores)" if args.blas_threads is None else str(args.blas_threads)
    out = [
        "# Network support vectors: scaling with m",
        "",
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- command: `{' '.join(shlex.quote(a) for a in [sys.executable.rsplit('/', 1)[-1], *sys.argv])}`",
        f"- machine: {machine()}; BLAS threads in the solvers: {blas}; torch threads while training: "
        f"{args.train_threads}",
        f"- data: {data_desc}",
        f"- network: 784-{'-'.join(map(str, WIDTHS))}-1 ReLU, {'with' if args.bias else 'no'} biases; "
        f"SGD lr {args.lr}, momentum {args.momentum}, batch {args.batch_size}, logistic loss, PyTorch default "
        f"init, seed {args.seed}; trained until y·N(x) > 0 on every training sample (float64, path network), "
        f"at most {args.max_epochs} epochs / {args.max_train_seconds:.0f} s",
        f"- total wall time: {total_s:.0f} s ({total_s / 60:.1f} min); load average (1 min) at start "
        f"{args.load_start}, at end {os.getloadavg()[0]:.1f} — the cores are shared, so timings are noisy",
        "",
        "## Training",
        "",
        "| m | epochs | train s | training errors (float64) | min y·N(x) | note |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if "train_errors" not in r:
            out.append(f"| {r['m']:,} | – | – | – | – | {r['skipped']} |")
            continue
        mn = f"{r['min_net_margin']:.3g}" if "min_net_margin" in r else "–"
        out.append(f"| {r['m']:,} | {r['epochs']} | {r['train_s']:.1f} | {r['train_errors']} | {mn} | "
                   f"{r.get('skipped', '')} |")
    out += [
        "",
        "## Time (seconds)",
        "",
        "(a) dense float64 path kernel; (b) exact no-intercept active set on the dense kernel; (c) the same "
        "solver fed kernel columns on demand (no dense kernel) with `initial=` the k smallest network margins "
        "y·N(x), k = s of (b) (an oracle count); (c√) the same with k = ⌊√m⌋ (what "
        "`network_support_vectors(kernel=\"columns\")` does); (c0) without `initial`. In brackets: seconds "
        "spent computing kernel columns. (d) scikit-learn `SVC(kernel=\"precomputed\", tol=1e-5, "
        "shrinking=False, C=1e7)` with intercept, via `max_margin(..., intercept=True)`. (a)+(b) and (a)+(d) "
        "are the dense pipelines; (c*) include everything after the forward pass (plus `path_kernel_diagonal`, "
        "well under 1 s).",
        "",
        "| m | (a) kernel | (b) active set, dense | (a)+(b) | "
        + " | ".join(label for _, label in VARIANTS) + " | (d) SVC | (a)+(d) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in done:
        cols = " | ".join(f"{r[f'{v}_s']:.1f} ({r[f'{v}_col_s']:.1f})" for v, _ in VARIANTS)
        out.append(
            f"| {r['m']:,} | {r['kernel_s']:.1f} | {r['dense_s']:.1f} | {r['kernel_s'] + r['dense_s']:.1f} | "
            f"{cols} | {r['svc_s']:.1f} | {r['kernel_s'] + r['svc_s']:.1f} |")
    out += [
        "",
        "## Support vectors and exactness",
        "",
        "s = number of support vectors; KKT = largest violation of the optimality conditions in functional-"
        "margin units (`MaxMarginResult.kkt_residual`); J = Jaccard overlap of support sets; hit = fraction of "
        "the k smallest-network-margin samples that are support vectors of (b). Margin ratio = "
        "(min y·N(x)/‖w̄‖)/(1/‖v‖) and cosine(w̄, v) use the no-intercept max-margin direction v of (b).",
        "",
        "| m | s (b) | s/m | KKT (b) | iterations (b) | s (d) SVC | KKT (d) | J (b,d) | margin ratio | cosine(w̄,v) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in done:
        d, sv = r["dense"], r["svc"]
        out.append(
            f"| {r['m']:,} | {d.n_support_:,} | {d.n_support_ / r['m']:.3f} | {d.kkt_residual:.1e} | "
            f"{d.iterations} | {sv.n_support_:,} | {sv.kkt_residual:.1e} | {r['jaccard']:.4f} | "
            f"{r['margin_ratio']:.4f} | {r['cosine']:.4f} |")
    out += [
        "",
        "Kernel columns on demand: columns computed (of m) / calls of the column function / solver iterations; "
        "s, KKT and J with (b).",
        "",
        "| m | variant | k | hit | columns / calls / iterations | s | KKT | J with (b) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in done:
        for v, label in VARIANTS:
            res = r[v]
            k, hit = {"cols": (r["dense"].n_support_, f"{r['initial_hit']:.3f}"),
                      "colsq": (int(math.sqrt(r["m"])), f"{r['sqrt_hit']:.3f}"), "cols0": (0, "–")}[v]
            out.append(
                f"| {r['m']:,} | {label} | {k:,} | {hit} | {r[f'{v}_columns']:,} / {r[f'{v}_calls']} / "
                f"{r[f'{v}_iters']} | {res.n_support_:,} | {res.kkt_residual:.1e} | {r[f'{v}_jaccard']:.4f} |")
    out += [
        "",
        "## Peak memory (GiB)",
        "",
        "Peak resident set size of the process during each step (VmHWM, reset before the step), and in "
        "brackets the part above the resident size at the step's start (what the step itself needed). The "
        "dense kernel is resident during (b) and (d), not during (c*). 8·m² bytes = one dense float64 kernel.",
        "",
        "| m | 8·m² | (a) kernel | (b) active set, dense | "
        + " | ".join(label for _, label in VARIANTS) + " | (d) SVC |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in done:
        cells = [f"{gib(r[k].peak)} (+{gib(r[k].extra)})" for k in
                 ("kernel_mem", "dense_mem", *(f"{v}_mem" for v, _ in VARIANTS), "svc_mem")]
        out.append(f"| {r['m']:,} | {gib(8 * r['m'] ** 2)} | " + " | ".join(cells) + " |")
    warns = [(r["m"], k, w) for r in done for k in ("dense", "svc", *(v for v, _ in VARIANTS))
             for w in r[f"{k}_warn"]]
    if warns or notes:
        out += ["", "## Notes", ""]
        out += [f"- {n}" for n in notes]
        out += [f"- m={m}, {k}: warning: {w}" for m, k, w in warns]
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------ package against the paper
def cached_model(x, y01, args, key):
    """Train to zero error (the recipe of :func:`train_to_zero_error`), or load the model a previous run saved
    under ``--cache-dir`` for the same data, recipe and seed."""
    path = Path(args.cache_dir) / f"{key}.pt" if args.cache_dir else None
    if path is not None and path.exists():
        saved = torch.load(path, weights_only=True)
        model = _model(args)
        model.load_state_dict(saved["state"])
        return model, int(saved["epochs"]), float(saved["seconds"]), int(saved["errors"]), True
    model, epochs, seconds, errors = train_to_zero_error(x, y01, args, args.seed)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"state": model.state_dict(), "epochs": epochs, "seconds": seconds, "errors": errors}, path)
    return model, epochs, seconds, errors, False


def _model(args):
    return LeakyReLUMLP(in_features=784, widths=list(WIDTHS), beta=0.0, bias=args.bias, optimizer="sgd",
                        lr=args.lr, momentum=args.momentum)


def train_more(model, x, y01, args, epochs):
    """``epochs`` more epochs of the same recipe from the current weights (a fresh optimiser state)."""
    torch.set_num_threads(args.train_threads)
    optimizer = model.configure_optimizers()
    x_flat, target = x.reshape(len(x), -1), y01.to(torch.float32)
    g = torch.Generator().manual_seed(args.seed + 1)
    for _ in range(epochs):
        for batch in torch.randperm(len(x), generator=g).split(args.batch_size):
            loss = F.binary_cross_entropy_with_logits(model(x_flat[batch]), target[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    torch.set_num_threads(args.analysis_threads)
    return model


def measured(fn, *a, **kw):
    """Result, wall seconds, CPU seconds (all threads of the process), peak memory and warnings of one call."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with PeakRSS() as mem:
            wall, cpu = time.perf_counter(), time.process_time()
            out = fn(*a, **kw)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"out": out, "wall": wall, "cpu": cpu, "mem": mem, "warnings": [str(w.message) for w in caught]}


def median_of(records: list[dict]) -> dict:
    """Repeated calls of one step as one record: that of the call of median wall time (of an even count the slower
    middle one), the last call's result and keyword arguments, every call's wall time (``walls``), the largest
    peak and all warnings."""
    median = sorted(records, key=lambda r: r["wall"])[len(records) // 2]
    result = dict(median, out=records[-1].get("out"), kwargs=records[-1].get("kwargs"))
    result["walls"] = [r["wall"] for r in records]
    result["mem"] = max((r["mem"] for r in records), key=lambda mem: mem.peak)
    result["warnings"] = sorted({w for r in records for w in r["warnings"]})
    return result


def alternating(steps, repeats: int) -> list[dict]:
    """Steps ``(fn, args, kwargs, fresh)`` called in turn, ``repeats`` rounds, each step's calls as one record
    (:func:`median_of`): a slow spell of the shared machine then falls on every step alike. ``fresh``: ``None`` or
    a function giving more keyword arguments for each call, made before its timing (e.g. a new copy of a cache).
    Only the last round's results are kept."""
    runs = [[] for _ in steps]
    for k in range(repeats):
        for (fn, a, kw, fresh), records in zip(steps, runs):
            extra = fresh() if fresh is not None else {}
            r = measured(fn, *a, **kw, **extra)
            if k < repeats - 1:
                r.pop("out")
            else:
                r["kwargs"] = extra
            del extra
            records.append(r)
            gc.collect()
    return [median_of(records) for records in runs]


def researcher_kernel(x64, slopes):
    """The dense float64 path kernel as the paper's method computes it: ``(X Xᵀ) ∘ Π_l (S_l S_lᵀ)``."""
    kernel = x64 @ x64.T
    for s in slopes:
        kernel *= s @ s.T
    return kernel


def support_gemm(x64, support):
    """The yardstick of the analysis (issue 31): one plain float64 GEMM of the support columns, ``X X[support]ᵀ``
    (``m × s``), in torch."""
    return torch.mm(x64, x64[torch.as_tensor(support)].T)


def svc_fit(kernel, y, **options):
    from sklearn.svm import SVC

    svc = SVC(kernel="precomputed", C=1e7, **options).fit(kernel.numpy(), y.numpy())
    return svc


def kkt_all(kernel_columns, y, svm):
    """KKT residual recomputed over all m from fresh kernel columns of the support (independent of the solver)."""
    sv = svm.support_
    f = np.zeros(len(y))
    for start in range(0, len(sv), 512):
        block = sv[start:start + 512]
        f += kernel_columns(block) @ (svm.alpha_[block] * y[block])
    margins = y * f
    return max(float(np.max(np.clip(1 - margins, 0, None))), float(np.max(np.abs(margins[sv] - 1), initial=0)))


def compare_main(args, log):
    device = torch.device(args.device)
    rows, facts = [], {}

    def row(step, r, svm=None, reference=None, note=""):
        entry = {"step": step, "wall": r["wall"], "cpu": r["cpu"], "peak": r["mem"].peak, "own": r["mem"].extra,
                 "note": note, "warnings": r["warnings"], "walls": r.get("walls")}
        if svm is not None:
            entry.update(s=svm.n_support_, kkt=svm.kkt_residual)
            if reference is not None:
                entry.update(jaccard=jaccard(svm.support_, reference.support_),
                             margin_rel=abs(svm.margin - reference.margin) / reference.margin)
        rows.append(entry)
        log(f"  {step}: {r['wall']:.2f} s wall, {r['cpu']:.2f} s CPU, peak {gib(r['mem'].peak)} GiB"
            + (f", s={svm.n_support_}, KKT {svm.kkt_residual:.1e}" if svm is not None else "")
            + (f", Jaccard {entry['jaccard']:.4f}, margin rel. diff {entry['margin_rel']:.1e}" if "jaccard" in entry else ""))
        return entry

    # ---- m = 20,000: the paper's method, the exact dense reference, the package
    m = args.compare_m
    x_all, y_all, x_val, y_val = load_data(args, max(m, args.large_m if args.large_m else 0))
    x, y01 = x_all[:m], y_all[:m]
    model, epochs, train_s, errors, cached = cached_model(x, y01, args, f"{args.data_key}_m{m}_seed{args.seed}")
    facts["train"] = f"m={m:,}: {epochs} epochs, {train_s:.0f} s{' (loaded from --cache-dir)' if cached else ''}, {errors} errors"
    log(facts["train"])
    if errors:
        raise SystemExit(f"no zero training error at m={m}")
    torch.set_num_threads(args.analysis_threads)
    net = find_path_part(model).path_network()
    x64 = x.reshape(m, -1).to(torch.float64)
    y = torch.where(y01 > 0, 1.0, -1.0).to(torch.float64)
    with torch.no_grad():
        outputs, slopes = forward_with_slopes(net, x64)

    # rounds of every step at m: the paper's (one dense kernel per round, freed after it) and the package's
    n = args.repeats
    net_dev, x_dev, xv_dev = net.to(device), x.to(device), x_val.to(device)
    inputs = (net_dev, x_dev, y01.to(device), xv_dev, y_val.to(device))
    other = "numpy" if solver_device(args.solver, device) is not None else "torch"
    keys = ("kernel", "exact", "gemm", "svc_default", "svc_strict", "first", "second", "tracked")
    runs = {key: [] for key in keys}
    for k in range(n):
        log(f"m={m:,}: round {k + 1} of {n}: the paper's method, the exact reference, the package")
        r = measured(researcher_kernel, x64, slopes)
        kernel = r.pop("out")  # no record keeps the 3.2 GB kernel alive
        runs["kernel"].append(r)
        runs["exact"].append(measured(max_margin, kernel, y))
        runs["gemm"].append(measured(support_gemm, x64, runs["exact"][-1]["out"].support_))
        runs["svc_default"].append(measured(svc_fit, kernel, y))
        runs["svc_strict"].append(measured(svc_fit, kernel, y, tol=1e-5, shrinking=False))
        del kernel
        gc.collect()
        # the callback's default (stop_on_zero_error=True): one analysis, no input-Gram rows kept for another
        runs["first"].append(measured(network_support_vectors, *inputs, solver=args.solver))
        runs["second"].append(measured(network_support_vectors, *inputs, solver=other))
        # what the callback keeps between analyses with stop_on_zero_error=False
        cache = InputGramCache()
        runs["tracked"].append(dict(measured(network_support_vectors, *inputs, solver=args.solver, cache=cache),
                                    kwargs={"cache": cache}))
        del cache
        if k < n - 1:
            for key in keys:
                runs[key][-1].pop("out", None)
                runs[key][-1].pop("kwargs", None)
        gc.collect()
    kernel_run, exact, gemm, svc_default, svc_strict, first, second, tracked = (median_of(runs[key]) for key in keys)
    reference = exact["out"]
    facts["rounds"] = [(runs["kernel"][k]["wall"] + runs["svc_default"][k]["wall"]) / runs["first"][k]["wall"]
                       for k in range(n)]
    facts["gemm_rounds"] = [runs["first"][k]["wall"] / runs["gemm"][k]["wall"] for k in range(n)]
    row("paper: dense float64 path kernel", kernel_run)
    for name, r in (("SVC default (tol 1e-3, shrinking)", svc_default), ("SVC tol 1e-5, shrinking=False", svc_strict)):
        svc = r["out"]
        rows.append({"step": f"paper: {name}", "wall": r["wall"], "cpu": r["cpu"], "peak": r["mem"].peak,
                     "own": r["mem"].extra,
                     "s": len(svc.support_), "jaccard": jaccard(np.sort(svc.support_), reference.support_),
                     "note": "with intercept (a different problem)", "warnings": r["warnings"], "walls": r["walls"]})
        rows.append({"step": f"paper total: kernel + {name}", "wall": kernel_run["wall"] + r["wall"],
                     "cpu": kernel_run["cpu"] + r["cpu"], "peak": max(kernel_run["mem"].peak, r["mem"].peak),
                     "own": max(kernel_run["mem"].extra, r["mem"].extra),
                     "note": "", "warnings": [],
                     "walls": [k + w for k, w in zip(kernel_run["walls"], r["walls"])]})
    row("exact dense reference: active set on the dense kernel", exact, reference, reference)
    row(f"yardstick: one float64 GEMM of the support columns, X X[support]ᵀ ({m:,} × {len(reference.support_):,}, "
        "torch)", gemm)

    pkg = row("package: network_support_vectors, end to end (validation on "
              f"{args.val_size:,} samples), as the callback runs it by default", first, first["out"].svm, reference)
    row(f"package, solver='{other}' (the {'CPU' if other == 'numpy' else 'GPU'} default, here on "
        f"{device.type}); otherwise as above", second, second["out"].svm, reference)
    gram_cache = tracked["kwargs"]["cache"]
    row("package, tracking (stop_on_zero_error=False): the first analysis, keeping its support's X Xᵀ rows "
        "(cache=InputGramCache())", tracked, tracked["out"].svm, reference)
    facts["cache"] = f"{len(gram_cache):,} input-Gram rows, {gib(gram_cache.nbytes)} GiB kept after the first analysis"
    facts["gemm"] = (pkg["wall"] / gemm["wall"], pkg["cpu"] / gemm["cpu"])
    facts["speedup"] = [(name, rows[i]["wall"] / pkg["wall"], rows[i]["cpu"] / pkg["cpu"])
                        for i, name in ((2, "kernel + SVC default"), (4, "kernel + SVC tol 1e-5"))]
    columns = PathKernelColumns(x64, slopes, net.betas, net.gammas, bias=net.biases is not None)
    facts["kkt_independent"] = kkt_all(columns.numpy, y.numpy(), first["out"].svm)

    # ---- warm starts: more epochs, each re-analysed from the previous analysis's support (as the callback does)
    facts["cache_warm"] = []
    for more in args.more_epochs:
        model = train_more(model, x, y01, args, more)
        net2 = find_path_part(model).path_network()
        out2 = forward_with_slopes(net2, x64)[0]
        if not bool((y * out2 > 0).all()):
            facts["warm"] = f"{more} more epochs broke zero training error; no further warm start measured"
            break
        log(f"m={m:,}: {more} more epoch(s), warm start from the previous support")
        net2_dev = net2.to(device)
        inputs2 = (net2_dev, x_dev, y01.to(device), xv_dev, y_val.to(device))
        misses, previous = gram_cache.misses, gram_cache.samples.cpu().numpy()
        copies, gram_cache = _copies_of(gram_cache), None  # each warm start reads its own copy; none held beside
        warm, cold = alternating(
            [(network_support_vectors, inputs2, {"solver": args.solver}, copies),
             (network_support_vectors, inputs2, {"solver": args.solver}, None)], n)
        gram_cache = warm["kwargs"]["cache"]
        kept = np.intersect1d(previous, warm["out"].svm.support_)
        facts["cache_warm"].append(
            f"after {more} more epoch(s): {len(kept):,} of the previous {len(previous):,} support vectors are support "
            f"vectors again, of {warm['out'].svm.n_support_:,}; the warm start computed "
            f"{gram_cache.misses - misses:,} input-Gram rows afresh")
        e = row(f"package, {more} more epoch(s): warm start (cache = the previous analysis's InputGramCache: its "
                "support's X Xᵀ rows and initial support)", warm, warm["out"].svm, cold["out"].svm)
        e["note"] = f"{100 * warm['wall'] / tracked['wall']:.0f}% of the tracking mode's first analysis (wall)"
        e = row(f"package, {more} more epoch(s): cold start (reference for the warm one)", cold, cold["out"].svm)

    # ---- near-degenerate data at m = 10,000: 5,000 samples and their copies perturbed by 1e-7
    half = args.degenerate_m // 2
    g = torch.Generator().manual_seed(7)
    xd = torch.cat([x64[:half], x64[:half] + 1e-7 * torch.randn(half, x64.shape[1], generator=g, dtype=torch.float64)])
    yd = torch.cat([y[:half], y[:half]])
    od, sd = forward_with_slopes(net, xd)
    if bool((yd * od > 0).all()):
        log(f"m={len(yd):,} near-degenerate (pairs 1e-7 apart)")
        kernel = path_kernel(xd, sd)
        near = measured(max_margin, kernel, yd)
        del kernel
        row(f"near-degenerate m={len(yd):,}: exact active set on the dense kernel", near, near["out"])
        lazy = measured(network_support_vectors, net, xd, yd)
        row(f"near-degenerate m={len(yd):,}: package (columns)", lazy, lazy["out"].svm, near["out"])

    # ---- m = 60,000
    if args.large_m:
        mL = args.large_m
        xL, yL = x_all[:mL], y_all[:mL]
        modelL, epochs, train_s, errors, cached = cached_model(xL, yL, args, f"{args.data_key}_m{mL}_seed{args.seed}")
        facts["train_large"] = (f"m={mL:,}: {epochs} epochs, {train_s:.0f} s"
                                f"{' (loaded from --cache-dir)' if cached else ''}, {errors} errors")
        log(facts["train_large"])
        if not errors:
            runs = [large_in_fresh_process(args, modelL, xL, yL, x_val, y_val) for _ in range(args.repeats)]
            large = dict(median_of(runs), kkt_fresh=runs[-1]["kkt_fresh"])
            e = row(f"package m={mL:,}: network_support_vectors, end to end (a fresh process: imports, data, "
                    "network, then the call)", large, large["out"])
            e["note"] = (f"{gib(large['mem'].start)} GiB resident before the call (interpreter, torch, Lightning, "
                         f"the data); dense float64 kernel would need {8 * mL * mL / 1e9:.1f} GB")
            facts["kkt_large"] = large["kkt_fresh"]
            facts["peak_large"] = large["mem"].peak
    return rows, facts


def _copies_of(cache: InputGramCache):
    """A function giving ``{"cache": c}`` with ``c`` a new copy of ``cache`` as it is now, read from a file: every
    repeat of a warm start starts from the same cache, and no second copy is held in memory while one runs."""
    import tempfile

    handle = tempfile.TemporaryFile()
    torch.save(cache, handle)

    def fresh():
        handle.seek(0)
        return {"cache": torch.load(handle, weights_only=False)}

    return fresh


def large_in_fresh_process(args, model, x, y, x_val, y_val) -> dict:
    """The analysis of ``model`` on ``(x, y)`` in a new process that holds only what a user's would (imports,
    the data, the network): its peak memory is the process's, not this benchmark's leftovers."""
    import multiprocessing
    import tempfile
    from queue import Empty

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "large.pt"
        torch.save({"state": model.state_dict(), "x": x, "y": y, "x_val": x_val, "y_val": y_val}, path)
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        child = context.Process(target=_large_child, args=(str(path), vars(args), queue))
        child.start()
        while True:
            try:
                result = queue.get(timeout=10)
                break
            except Empty:
                if not child.is_alive():  # killed (e.g. out of memory) before it could report, or just done
                    try:
                        result = queue.get(timeout=5)
                    except Empty:
                        result = {"error": f"the process exited with code {child.exitcode}"}
                    break
        child.join()
    if "error" in result:
        raise RuntimeError(f"the m={len(y):,} analysis failed in its process: {result['error']}")
    result["mem"] = argparse.Namespace(**result["mem"])
    result["out"] = argparse.Namespace(**result["out"])
    return result


def _large_child(path: str, arguments: dict, queue) -> None:
    try:
        args = argparse.Namespace(**arguments)
        saved = torch.load(path, weights_only=True)
        Path(path).unlink()
        model = _model(args)
        model.load_state_dict(saved["state"])
        torch.set_num_threads(args.analysis_threads)
        net = find_path_part(model).path_network()
        device = torch.device(args.device)
        x, y = saved["x"], saved["y"]
        del saved["x"], saved["y"]
        r = measured(network_support_vectors, net.to(device), x.to(device), y.to(device),
                     saved["x_val"].to(device), saved["y_val"].to(device), solver=args.solver)
        svm = r["out"].svm
        x64 = x.reshape(len(x), -1).to(torch.float64)
        columns = PathKernelColumns(x64, forward_with_slopes(net, x64)[1], net.betas, net.gammas,
                                    bias=net.biases is not None)
        queue.put({"wall": r["wall"], "cpu": r["cpu"], "warnings": r["warnings"],
                   "mem": {"peak": r["mem"].peak, "start": r["mem"].start, "extra": r["mem"].extra},
                   "out": {"n_support_": svm.n_support_, "kkt_residual": svm.kkt_residual},
                   "kkt_fresh": kkt_all(columns.numpy, torch.where(y > 0, 1.0, -1.0).double().numpy(), svm)})
    except Exception as error:  # reported by the parent
        queue.put({"error": repr(error)})


def load_data(args, n):
    """``n`` training samples and ``--val-size`` held-out ones: MNIST's training and test splits, or the last
    ``--val-size`` of ``n + --val-size`` stand-in samples."""
    if args.mnist_root:
        x, y, x_val, y_val = mnist(args.mnist_root, n, args.seed, args.val_size)
        images = lambda t: t.reshape(len(t), 1, 28, 28).to(torch.float32)  # noqa: E731
        return images(x), y, images(x_val), y_val
    x, y = digits_standin(n + args.val_size, args.seed)
    return x[:n], y[:n], x[n:], y[n:]


def compare_markdown(rows, facts, args, data_desc, total_s) -> str:
    fmt = lambda v, f: "–" if v is None else format(v, f)  # noqa: E731
    out = [
        "# Network support vectors: the package against the paper's method",
        "",
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- command: `{' '.join(shlex.quote(a) for a in [sys.executable.rsplit('/', 1)[-1], *sys.argv])}`",
        f"- machine: {machine()}; analysis device: {args.device}; torch threads in the analysis: "
        f"{args.analysis_threads}",
        f"- data: {data_desc}; validation: {args.val_size:,} held-out samples ({'the first of MNIST’s test set' if args.mnist_root else 'the last of the generated set, not in training'})",
        f"- network: 784-{'-'.join(map(str, WIDTHS))}-1 ReLU, {'with' if args.bias else 'no'} biases; SGD lr {args.lr}, "
        f"momentum {args.momentum}, batch {args.batch_size}, logistic loss, seed {args.seed}, trained until "
        f"y·N(x) > 0 on every training sample (float64); {facts['train']}"
        + (f"; {facts['train_large']}" if "train_large" in facts else ""),
        f"- total wall time {total_s:.0f} s; load average (1 min) at start {args.load_start}, at end "
        f"{os.getloadavg()[0]:.1f} (the cores are shared: timings are noisy)",
        "",
        "The paper's method: the dense float64 path kernel `(X Xᵀ) ∘ Π_l (S_l S_lᵀ)` in torch, then scikit-learn "
        "`SVC(kernel=\"precomputed\", C=1e7)` with its defaults and with `tol=1e-5, shrinking=False` (an intercept: "
        "a different problem, Jaccard against the exact no-intercept solution shown for information). The package: "
        "`network_support_vectors(net, x, y, x_val, y_val)` with its defaults (`kernel=\"auto\"`: kernel columns on "
        "demand), from the frozen network and data to the fitted result, validation included, as the callback runs "
        "it by default (one analysis, no input-Gram cache); in tracking mode (`stop_on_zero_error=False`) the callback "
        "passes an `InputGramCache` that keeps the support's X Xᵀ rows for the next analysis. The exact reference: "
        "`max_margin` (active set) on the dense kernel. CPU s = process CPU time over all threads; peak = the "
        "process's peak resident set size during the step (freed heap given back to the OS before it); own = that peak less the "
        "resident size at the step's start (the interpreter, torch, scikit-learn and the data sets), i.e. "
        "what the step itself needed. Jaccard, margin rel. diff. against the exact dense "
        "reference (the warm start against the cold start on the same network). "
        + (f"The steps at m={args.compare_m:,} ran in {args.repeats} rounds (`--repeats`), each step once a round "
           "in turn (the paper's kernel, the exact reference, the two SVC fits, the package's three first analyses; "
           "then the warm start and its cold start, alternating), so that a slow spell of the shared machine falls "
           "on both methods: wall s and CPU s are those of the step's call of median wall time, each call's wall "
           "time is in the note, peak is the largest; the support vectors, agreement and KKT are the last round's; "
           "every warm start begins from a copy of the same cache. "
           + (f"m={args.large_m:,} ran {args.repeats} times too, a fresh process each time; the " if args.large_m
              else "The ")
           + "near-degenerate set ran once."
           if args.repeats > 1 else "Each step ran once."),
        "",
        "| step | wall s | CPU s | peak GiB | own GiB | support vectors | Jaccard | margin rel. diff | KKT | note |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        walls = r.get("walls") or []
        if len(walls) > 1:
            spread = f"walls of the {len(walls)} calls {', '.join(f'{w:.2f}' for w in walls)} s"
            r = dict(r, note=f"{r['note']}; {spread}" if r["note"] else spread)
        out.append(f"| {r['step']} | {r['wall']:.2f} | {r['cpu']:.2f} | {gib(r['peak'])} | {gib(r['own'])} | "
                   f"{fmt(r.get('s'), ',')} | "
                   f"{fmt(r.get('jaccard'), '.4f')} | {fmt(r.get('margin_rel'), '.1e')} | {fmt(r.get('kkt'), '.1e')} | "
                   f"{r['note']} |")
    out += ["", "## Summary", ""]
    for name, wall, cpu in facts["speedup"]:
        out.append(f"- the package against the paper's {name}: {wall:.1f}× less wall time, {cpu:.1f}× less CPU time")
    if len(facts.get("rounds", [])) > 1:
        out.append("- the same (kernel + SVC default against the package), wall, round by round: "
                   + ", ".join(f"{ratio:.1f}×" for ratio in facts["rounds"]))
    if "gemm" in facts:
        out.append(f"- the package against one float64 GEMM of its support columns: {facts['gemm'][0]:.2f}× its wall "
                   f"time, {facts['gemm'][1]:.2f}× its CPU time; wall, round by round: "
                   + ", ".join(f"{ratio:.2f}×" for ratio in facts["gemm_rounds"]))
    out.append(f"- KKT residual of the package's m={args.compare_m:,} solution recomputed over all m from fresh "
               f"kernel columns: {facts['kkt_independent']:.1e}")
    if "kkt_large" in facts:
        out.append(f"- KKT residual of the m={args.large_m:,} solution recomputed over all m from fresh kernel columns: "
                   f"{facts['kkt_large']:.1e}; the dense float64 kernel would need {8 * args.large_m ** 2 / 1e9:.1f} GB")
        out.append(f"- peak resident memory of the m={args.large_m:,} analysis (the process's, largest of its "
                   f"{args.repeats} runs): {gib(facts['peak_large'])} GiB = {facts['peak_large'] / 1e9:.2f} GB")
    for key in ("cache", "cache_warm", "warm"):
        for fact in ([facts[key]] if isinstance(facts.get(key), str) else facts.get(key, [])):
            out.append(f"- {fact}")
    warns = [(r["step"], w) for r in rows for w in r["warnings"]]
    out += [f"- warning in {s}: {w}" for s, w in warns] or ["- no warnings were raised in any step"]
    return "\n".join(out) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES), help="training-set sizes m")
    parser.add_argument("--mnist-root", default=None,
                        help="directory holding MNIST/raw (torchvision layout); default: the load_digits stand-in")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bias", action="store_true", help="Linear layers with biases (the paper's MNIST nets have none)")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.05)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--max-epochs", type=int, default=500, help="cap on training epochs per size")
    parser.add_argument("--max-train-seconds", type=float, default=300.0, help="cap on training time per size")
    parser.add_argument("--train-threads", type=int, default=1,
                        help="torch threads while training (a 16-wide MLP on 100-sample batches is fastest on one)")
    parser.add_argument("--blas-threads", type=int, default=None,
                        help="limit BLAS threads (threadpoolctl) during the solvers; default: no limit, as users run it")
    parser.add_argument("--threads", type=int, default=None, help="torch threads for the analysis (default: torch's)")
    parser.add_argument("--budget-minutes", type=float, default=25.0,
                        help="skip a size whose projected time (m² scaling of the previous size) would overrun this")
    parser.add_argument("--output", default=None,
                        help="report file (default: results/nsv_scale.md, with --scaling results/nsv_scale_sizes.md)")
    parser.add_argument("--scaling", action="store_true",
                        help="the scaling study over --sizes (dense kernel, solvers, column variants) instead of the "
                             "comparison of the package with the paper's method")
    parser.add_argument("--compare-m", type=int, default=20_000, help="training-set size of the comparison")
    parser.add_argument("--large-m", type=int, default=60_000, help="the large run (0: skip)")
    parser.add_argument("--degenerate-m", type=int, default=10_000, help="size of the near-degenerate set")
    parser.add_argument("--val-size", type=int, default=2_000, help="validation samples given to the analysis")
    parser.add_argument("--more-epochs", type=int, nargs="+", default=[1, 5],
                        help="epochs before each warm-started analysis, each from the one before (the callback's "
                             "every_n_epochs; its default is 1)")
    parser.add_argument("--device", default="cpu", help="device of the package's analysis (e.g. cuda)")
    parser.add_argument("--solver", default="auto", choices=("auto", "numpy", "torch"),
                        help="network_support_vectors(solver=...) of the package's steps; the other backend is "
                             "timed once beside the first analysis")
    parser.add_argument("--cache-dir", default=None, help="save trained networks here and reuse them in later runs")
    parser.add_argument("--repeats", type=int, default=3,
                        help="rounds of the steps at --compare-m (the paper's and the package's, each once a round "
                             "in turn) and runs at --large-m: the median call of each step is reported, every "
                             "call's wall time beside it (the cores are shared: timings are noisy)")
    args = parser.parse_args(argv)
    args.analysis_threads = args.threads or torch.get_num_threads()
    if args.output is None:
        args.output = str(Path(__file__).parent / "results" / ("nsv_scale_sizes.md" if args.scaling else "nsv_scale.md"))
    sizes = sorted(set(args.sizes))
    if args.threads:
        torch.set_num_threads(args.threads)
    if min(sizes) < 2:
        parser.error(f"--sizes must be at least 2, got {sizes}")
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    if min(args.more_epochs) < 0:
        parser.error(f"--more-epochs must be at least 0, got {args.more_epochs}")

    args.load_start = f"{os.getloadavg()[0]:.1f}"
    t0 = time.perf_counter()
    log = lambda msg: print(f"[{time.perf_counter() - t0:7.1f} s] {msg}", flush=True)  # noqa: E731
    if args.mnist_root:
        data_desc = f"binary MNIST (0-4 vs 5-9) from `{args.mnist_root}`, seeded random training subsets (seed {args.seed})"
    else:
        data_desc = ("**not MNIST** (no MNIST on this machine): an MNIST-shaped stand-in — scikit-learn `load_digits` "
                     "(1,797 8×8 images) upsampled bilinearly to 28×28, random integer shifts in [-2, 2] px (zero "
                     "fill), intensity ×U[0.7, 1.3], Gaussian pixel noise sd 0.1, clipped to [0, 1]; labels 0-4 → 0, "
                     f"5-9 → 1; generator seed {args.seed}; the sets of different m are nested (first m samples)")
    args.data_key = "mnist" if args.mnist_root else "standin"
    if not args.scaling:
        rows, facts = compare_main(args, log)
        text = compare_markdown(rows, facts, args, data_desc, time.perf_counter() - t0)
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(text)
        print(text)
        log(f"wrote {args.output}")
        return
    if not args.mnist_root:
        x_all, y_all = digits_standin(max(sizes), args.seed)

    rows, notes, previous = [], [], None
    for m in sizes:
        elapsed = time.perf_counter() - t0
        if previous is not None:
            projected = previous[1] * (m / previous[0]) ** 2
            if elapsed + projected > 60 * args.budget_minutes:
                note = (f"m={m:,} skipped: projected {projected / 60:.1f} min (m² scaling of m={previous[0]:,}) "
                        f"after {elapsed / 60:.1f} min would overrun the {args.budget_minutes:g}-min budget")
                log(note)
                notes.append(note)
                rows.append({"m": m, "skipped": note})
                continue
        if args.mnist_root:
            x_all, y_all = mnist(args.mnist_root, m, args.seed)[:2]
        start = time.perf_counter()
        rows.append(run_size(m, x_all, y_all, args, log))
        previous = (m, time.perf_counter() - start)
        gc.collect()

    total = time.perf_counter() - t0
    text = markdown(rows, args, data_desc, total, notes)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(text)
    print(text)
    log(f"wrote {args.output}")


if __name__ == "__main__":
    main()
