"""Network support vectors of a Leaky-ReLU-family classifier, as soon as it reaches zero training error."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from lightning_nsv.callbacks.sinks import FigureSink
from lightning_nsv.compat import Callback, pl, rank_zero_info, rank_zero_warn
from lightning_nsv.extract import PathPart, find_path_part
from lightning_nsv.models.layers import eval_mode
from lightning_nsv.path_space import forward_with_slopes
from lightning_nsv.support_vectors import (
    KERNEL_MODES,
    SupportVectorAnalysis,
    network_support_vectors,
    signed_labels,
)

__all__ = ["NetworkSupportVectors"]


def _split_batch(batch: Any) -> tuple[Tensor, Tensor]:
    if isinstance(batch, (tuple, list)) and len(batch) >= 2:
        return batch[0], batch[1]
    raise TypeError(
        f"batches must be (inputs, labels) tuples for the support-vector analysis, got {type(batch).__name__}"
    )


class NetworkSupportVectors(Callback):
    """Fits the max-margin classifier in path space once the network reaches zero training error.

    At the end of every ``every_n_epochs``-th training epoch the callback checks Assumption 1 of Snyder &
    Vishwanath (``y·N(x) > 0`` for every training sample, weights frozen, in float64) on the whole
    training set. The check is cheap while the network is far from zero error: samples misclassified at the
    last check and a random probe of ``probe_size`` samples are tried first, and the full pass stops at the
    first misclassified batch. At the first zero-error epoch the activation patterns are frozen, the path
    kernel is computed, the max-margin SVM is fitted (exactly, without intercept, or scikit-learn's ``SVC``
    with ``intercept=True``), results are logged and saved, and training stops if ``stop_on_zero_error``.

    The network is found with :func:`~lightning_nsv.extract.find_path_part`: the module's ``nn.Sequential``
    of Linear and ReLU/LeakyReLU layers (after an optional trunk ending with ``nn.Flatten``), or the
    submodules named by ``path_module``/``embedding``. The module's output must be that head's logit; this is
    checked on the first batch. Batches must be ``(inputs, labels)`` with labels 0/1 or ±1.

    Cost: the dense float64 path kernel, ``8·m²`` bytes (m = 20,000: 3.2 GB), computed on the CPU, or with
    ``kernel="columns"`` only the ``m×s'`` columns of the ``s'`` samples that enter the solver's free set.

    Args:
        every_n_epochs: check zero training error every this many epochs.
        probe_size: random training samples tried before a full pass.
        stop_on_zero_error: stop training once the analysis ran. With ``False`` training goes on and the
            analysis is repeated every ``every_n_epochs`` epochs while the training error stays zero, so that
            TensorBoard shows how the network approaches (or not) the max-margin classifier.
        intercept: fit the SVM with an intercept (the paper's ``SVC`` protocol) instead of through the origin.
        C: penalty of the intercept protocol on the kernel normalised by its mean diagonal.
        delta: confidence of the compression bound.
        kernel: ``"dense"`` path kernel, ``"columns"`` computed on demand for candidate support vectors
            only, or ``"auto"``: dense up to ``max_dense_bytes`` (default 4 GiB, m ≈ 23,000), columns above.
        max_dense_bytes: see ``kernel``.
        path_module: dotted name of the ``nn.Sequential`` head, when the module has several.
        embedding: dotted name of a trunk applied before the head.
        batch_size: batch size of the callback's own passes over the data.
        save_dir: where results go; default ``<log_dir>/nsv``.
        max_images: support vectors shown in the image grid.
        seed: seed of the random probe.

    Raises:
        ValueError: on arguments out of range.
        UnsupportedNetworkError: at ``setup`` when the module has no supported path part.

    Logged metrics (``nsv/`` prefix, at each analysis, plus ``nsv/zero_error_epoch``, the first such epoch):
        ``n_support``, ``support_fraction`` (s/m), ``svm_margin`` (1/||v||), ``network_margin``
        (min y N(x) / ||w̄||), ``margin_ratio``, ``cosine_wbar_v``, ``kkt_residual``, ``svm_margin_violations``,
        ``svm_alpha_at_bound``, ``unique_patterns_train``, ``unique_patterns_val``, ``val_agreement``,
        ``val_errors_network``, ``val_errors_svm``, ``val_errors_both``, ``compression_bound``,
        ``path_positive_mass_fraction``, ``path_positive_count_fraction``, ``path_negative_count``,
        ``path_zero_count``. Figures: ``nsv/support_vectors`` (image data), ``nsv/alpha`` (histogram of α
        over the support vectors), ``nsv/decision_boundaries`` (2-D inputs: network and SVM side by side),
        ``nsv/path_weights`` (networks of at most 400 weights, coloured by sign).
        When zero training error is never reached, ``nsv/zero_error_reached`` = 0 is written to the logger and
        a warning gives the number of training samples still misclassified.

    Example::

        >>> from lightning_nsv.callbacks import NetworkSupportVectors
        >>> callback = NetworkSupportVectors(every_n_epochs=5, intercept=False)
    """

    def __init__(
        self,
        every_n_epochs: int = 1,
        probe_size: int = 512,
        stop_on_zero_error: bool = True,
        intercept: bool = False,
        C: float = 1e7,
        delta: float = 0.05,
        kernel: str = "auto",
        max_dense_bytes: int = 4 << 30,
        path_module: str | None = None,
        embedding: str | None = None,
        batch_size: int = 1024,
        save_dir: str | None = None,
        max_images: int = 64,
        seed: int = 0,
    ) -> None:
        for name, value in (("every_n_epochs", every_n_epochs), ("batch_size", batch_size)):
            if value < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {value}")
        if probe_size < 0 or max_images < 0:
            raise ValueError(f"`probe_size` and `max_images` must be >= 0, got {probe_size} and {max_images}")
        if C <= 0:
            raise ValueError(f"`C` must be positive, got {C}")
        if not 0 < delta < 1:
            raise ValueError(f"`delta` must be in (0, 1), got {delta}")
        if kernel not in KERNEL_MODES:
            raise ValueError(f"`kernel` can be {', '.join(KERNEL_MODES)}, got {kernel!r}")
        self.kernel = kernel
        self.max_dense_bytes = max_dense_bytes
        self.every_n_epochs = every_n_epochs
        self.probe_size = probe_size
        self.stop_on_zero_error = stop_on_zero_error
        self.intercept = intercept
        self.C = C
        self.delta = delta
        self.path_module = path_module
        self.embedding = embedding
        self.batch_size = batch_size
        self.save_dir = save_dir
        self.max_images = max_images
        self.seed = seed
        self.zero_error_epoch: int | None = None
        self.metrics: dict[str, float] = {}
        self.analysis: SupportVectorAnalysis | None = None
        self._hard: list[int] = []
        self._path: PathPart | None = None

    @property
    def state_key(self) -> str:
        return self._generate_state_key(intercept=self.intercept, path_module=self.path_module)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._path = find_path_part(pl_module, self.path_module, self.embedding)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if trainer.global_step == 0 and batch_idx == 0:
            self._check_head_is_output(pl_module, batch)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._should_skip(trainer):
            return
        self._run_check(trainer, pl_module)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.zero_error_epoch is not None or trainer.fast_dev_run:
            return
        dataset = self._train_dataset(trainer)
        with eval_mode(pl_module), torch.no_grad():
            errors = self._errors(dataset, list(range(len(dataset))), self._path.path_network(), pl_module,
                                  stop_early=False)
        rank_zero_warn(
            f"NetworkSupportVectors: zero training error was never reached ({len(errors)} of {len(dataset)} "
            "training samples misclassified at the end), so there are no network support vectors. Train "
            "longer, raise the learning rate or widen the network."
        )
        for logger in trainer.loggers:
            logger.log_metrics({"nsv/zero_error_reached": 0.0}, step=trainer.global_step)

    def state_dict(self) -> dict[str, Any]:
        return {
            "zero_error_epoch": self.zero_error_epoch,
            "metrics": dict(self.metrics),
            "hard": list(self._hard),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.zero_error_epoch = state_dict.get("zero_error_epoch")
        self.metrics = dict(state_dict.get("metrics", {}))
        self._hard = list(state_dict.get("hard", []))

    def _should_skip(self, trainer: pl.Trainer) -> bool:
        return (
            trainer.sanity_checking
            or bool(trainer.fast_dev_run)
            or (self.zero_error_epoch is not None and self.stop_on_zero_error)
            or (trainer.current_epoch + 1) % self.every_n_epochs != 0
        )

    def _check_head_is_output(self, pl_module: pl.LightningModule, batch: Any) -> None:
        x, y = _split_batch(batch)
        signed_labels(y)
        with eval_mode(pl_module), torch.no_grad():
            x = x[:8]
            output = pl_module(x).reshape(len(x), -1)
            head = _head_forward(self._path, x)
        if output.shape[1] != 1 or not torch.allclose(output[:, 0].double().cpu(), head, rtol=1e-4, atol=1e-5):
            raise ValueError(
                f"the output of {type(pl_module).__name__} is not the logit of its path part {self._path.name}; "
                "the support-vector analysis reads that head, so the module must return it unchanged "
                "(no sigmoid, no extra layers). Pass `path_module`/`embedding` naming the right submodules."
            )

    def _train_dataset(self, trainer: pl.Trainer) -> Dataset:
        datamodule = trainer.datamodule
        dataset = getattr(datamodule, "train_dataset", None) if datamodule is not None else None
        if dataset is None:
            loader = trainer.train_dataloader
            dataset = getattr(loader, "dataset", None)
        if dataset is None:
            raise RuntimeError(
                "NetworkSupportVectors needs the training set: give the datamodule a `train_dataset` attribute "
                "or train with a single DataLoader"
            )
        return dataset

    def _val_dataset(self, trainer: pl.Trainer) -> Dataset | None:
        datamodule = trainer.datamodule
        dataset = getattr(datamodule, "val_dataset", None) if datamodule is not None else None
        if dataset is None:
            loaders = trainer.val_dataloaders
            if isinstance(loaders, DataLoader):
                dataset = loaders.dataset
        return dataset

    def _run_check(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        dataset = self._train_dataset(trainer)
        net = self._path.path_network()
        with eval_mode(pl_module), torch.no_grad():
            embedded = self._zero_error(dataset, net, pl_module, trainer.current_epoch)
        reached = trainer.strategy.reduce_boolean_decision(embedded is not None, all=True)
        if not reached:
            return
        metrics = None
        directory = self._output_dir(trainer)  # Trainer.log_dir is a collective: every rank asks for it
        if trainer.is_global_zero:
            metrics = self._analyse(trainer, pl_module, dataset, embedded, net, directory)
        metrics = trainer.strategy.broadcast(metrics, src=0)
        if self.zero_error_epoch is None:
            self.zero_error_epoch = trainer.current_epoch
        self.metrics = metrics
        for key, value in metrics.items():
            pl_module.log(f"nsv/{key}", value, on_step=False, on_epoch=True)
        pl_module.log("nsv/zero_error_epoch", float(self.zero_error_epoch), on_step=False, on_epoch=True)
        if self.stop_on_zero_error:
            trainer.should_stop = True

    def _errors(self, dataset: Dataset, indices: list[int], net, pl_module, stop_early: bool = True,
                keep: list | None = None) -> list[int]:
        """Indices whose ``y·N(x) <= 0``; ``keep`` collects the ``(embedding, label)`` batches."""
        wrong = []
        for start in range(0, len(indices), self.batch_size):
            chunk = indices[start:start + self.batch_size]
            x, y = _collate([dataset[i] for i in chunk])
            embedded = self._path.embed(x.to(pl_module.device)).cpu()
            if keep is not None:
                keep.append((embedded, y))
            outputs, _ = forward_with_slopes(net, embedded)
            bad = signed_labels(y) * outputs <= 0
            wrong += [chunk[i] for i in torch.nonzero(bad).flatten().tolist()]
            if wrong and stop_early:
                break
        return wrong

    def _zero_error(self, dataset: Dataset, net, pl_module, epoch: int) -> tuple[Tensor, Tensor] | None:
        """The embedded training set if every sample has ``y·N(x) > 0``, else None."""
        n = len(dataset)
        generator = torch.Generator().manual_seed(self.seed + epoch)
        probe = torch.randperm(n, generator=generator)[: self.probe_size].tolist()
        for indices in (self._hard, probe):
            wrong = self._errors(dataset, indices, net, pl_module) if indices else []
            if wrong:
                self._hard = wrong
                return None
        batches: list[tuple[Tensor, Tensor]] = []
        wrong = self._errors(dataset, list(range(n)), net, pl_module, keep=batches)
        if wrong:
            self._hard = wrong
            return None
        return torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])

    def _analyse(self, trainer, pl_module, dataset, embedded: tuple[Tensor, Tensor], net,
                 directory: Path) -> dict[str, float]:
        x_train, y_train = embedded
        val = self._val_dataset(trainer)
        x_val, y_val = self._embed_all(val, pl_module) if val is not None and len(val) else (None, None)
        analysis = network_support_vectors(
            net, x_train, y_train, x_val, y_val, intercept=self.intercept, C=self.C, delta=self.delta,
            kernel=self.kernel, max_dense_bytes=self.max_dense_bytes,
        )
        self.analysis = analysis
        rank_zero_info(
            f"Zero training error at epoch {trainer.current_epoch} on all {len(y_train)} training samples.\n"
            + analysis.report()
        )
        self._save(trainer, directory, analysis, y_train, net)
        sink = FigureSink(trainer.loggers, directory / "figures", type(self).__name__)
        self._log_figures(trainer, dataset, analysis, sink)
        self._log_path_figures(trainer, net, x_train, y_train, analysis, sink)
        return analysis.to_metrics()

    def _embed_all(self, dataset: Dataset, pl_module) -> tuple[Tensor, Tensor]:
        # an own generator: iterating a DataLoader would otherwise draw from the global RNG of training
        loader = DataLoader(dataset, batch_size=self.batch_size, shuffle=False, generator=torch.Generator())
        with eval_mode(pl_module), torch.no_grad():
            parts = [(self._path.embed(x.to(pl_module.device)).cpu(), y) for x, y in map(_split_batch, loader)]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    def _output_dir(self, trainer: pl.Trainer) -> Path:
        root = self.save_dir or (trainer.log_dir if trainer.log_dir else trainer.default_root_dir)
        return Path(root) / ("" if self.save_dir else "nsv")

    def _save(self, trainer, directory: Path, analysis: SupportVectorAnalysis, y_train: Tensor, net) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        stem = f"support_vectors_epoch{trainer.current_epoch}"
        source = getattr(trainer.datamodule, "train_indices", None)
        payload = {
            "support": torch.from_numpy(analysis.svm.support_),
            "alpha": torch.from_numpy(analysis.svm.alpha_),
            "intercept": analysis.svm.intercept_,
            "labels": signed_labels(y_train),
            "dataset_indices": None if source is None else torch.as_tensor(source),
            "weights": list(net.weights),
            "biases": None if net.biases is None else list(net.biases),
            "betas": list(net.betas),
            "gammas": list(net.gammas),
            "path_part": self._path.name,
            "epoch": trainer.current_epoch,
            "global_step": trainer.global_step,
            "solver": {"intercept": self.intercept, "C": self.C, "method": analysis.svm.method, "kernel": self.kernel,
                       "kernel_scale": analysis.svm.kernel_scale, "C_effective": analysis.svm.C_effective},
            "metrics": analysis.to_metrics(),
        }
        torch.save(payload, directory / f"{stem}.pt")
        summary = {k: v for k, v in payload["metrics"].items()}
        summary.update(epoch=trainer.current_epoch, m=analysis.m, report=analysis.report())
        (directory / f"{stem}.json").write_text(json.dumps(summary, indent=2))

    def _log_figures(self, trainer, dataset, analysis: SupportVectorAnalysis, sink: FigureSink) -> None:
        from lightning_nsv.plotting import alpha_histogram, image_grid

        support = analysis.svm.support_
        alpha = analysis.svm.alpha_[support]
        step = trainer.global_step
        sink.histogram("nsv/alpha", alpha, step)
        sink.figure("nsv/alpha_histogram", alpha_histogram(alpha)[0], step)
        order = support[alpha.argsort()[::-1][: self.max_images]]
        if not len(order):
            return
        images, labels = _collate([dataset[int(i)] for i in order])
        if images.dim() == 4:
            titles = [f"y={int(c)} α={a:.2g}" for c, a in zip(labels, analysis.svm.alpha_[order])]
            sink.figure("nsv/support_vectors", image_grid(images, titles)[0], step)

    def _log_path_figures(self, trainer, net, x_train: Tensor, y_train: Tensor,
                          analysis: SupportVectorAnalysis, sink: FigureSink) -> None:
        """Decision boundaries of network and SVM for 2-D inputs; the signed weights of small networks."""
        from lightning_nsv.plotting import data_extent, decision_grid, plot_decision_boundaries, plot_path_weights

        if x_train.shape[1] == 2:
            svm, sv = analysis.svm, analysis.svm.support_
            grid = decision_grid(net, x_train[sv], y_train[sv], svm.alpha_[sv], svm.intercept_,
                                 extent=data_extent(x_train), resolution=150)
            sink.figure("nsv/decision_boundaries", plot_decision_boundaries(grid, x_train, y_train, sv)[0],
                        trainer.global_step)
        if sum(w.numel() for w in net.weights) <= 400:
            sink.figure("nsv/path_weights", plot_path_weights(net, analysis.signs)[0], trainer.global_step)


def _collate(items: list) -> tuple[Tensor, Tensor]:
    xs, ys = zip(*[_split_batch(item) for item in items])
    return torch.stack([torch.as_tensor(x) for x in xs]), torch.stack([torch.as_tensor(y) for y in ys])


def _head_forward(path: PathPart, x: Tensor) -> Tensor:
    return forward_with_slopes(path.path_network(), path.embed(x).cpu())[0]
