"""Head-only against whole-network support vectors (issue 32): the paper's CNN + FC network (ConvFCNet, conv trunk +
3 fully connected Leaky-ReLU layers) and a small ResNet-style CNN (ResNetClassifier: conv, BatchNorm, residual sums,
max- and average pooling), each trained to zero training error on the same binary task.

Three analyses of the max-margin classifier in path space (DESIGN.md §2, §2c), on the same training samples:

- ``cnn_fc / head only``: the paper's protocol; the trunk's flattened output is a fixed embedding and only the
  Linear/Leaky-ReLU head is in path space (``network_support_vectors`` on the embedded samples, as the
  ``NetworkSupportVectors`` callback does);
- ``cnn_fc / whole network``: every convolution, activation and max-pool selection of the same trained network is
  in path space (``whole_network_support_vectors`` on the module);
- ``resnet / whole network``: the same for the ResNet-style CNN, which has no head to read alone.

Writes to ``--out``: ``head_vs_whole.csv`` (one row per analysis: s, s/m, margin ratio, cosine, validation
agreement, unique activation patterns, bits per support vector, compression bound, seconds),
``head_vs_whole_overlap.csv`` (sizes and Jaccard index of pairs of support sets), ``head_vs_whole.md`` (both as
Markdown tables) and ``head_vs_whole.png``/``.pdf``.

Usage::

    python examples/head_vs_whole.py --out examples/results         # bundled 8×8 digits (0-4 vs 5-9), all 1438
    python examples/head_vs_whole.py --data cifar --data-root data --m 2000 --max-epochs 100
    python examples/head_vs_whole.py --quick                          # a smoke test
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from lightning_nsv.analysis import network_support_vectors, whole_network_support_vectors
from lightning_nsv.compat import Callback, pl
from lightning_nsv.experiments import make_datamodule, markdown_table, quiet, save_figures, write_csv
from lightning_nsv.extract import find_path_part
from lightning_nsv.models.conv_fc import ConvFCNet
from lightning_nsv.models.layers import eval_mode
from lightning_nsv.models.resnet import ResNetClassifier
from lightning_nsv.plotting.base import LEGEND_SIZE

NAME = "head_vs_whole"
TABLE = {"network": "network", "scope": "path space of", "epochs": "epochs", "train_seconds": "train s",
         "n_support": "s", "support_fraction": "s/m", "margin_ratio": "margin ratio", "cosine": "cosine",
         "val_agreement": "val agreement", "unique_patterns_train": "unique patterns", "bits_per_sv": "bits per SV",
         "bound": "bound", "seconds": "analysis s"}
OVERLAP = {"first": "support set A", "second": "support set B", "size_first": "size of A",
           "size_second": "size of B", "shared": "in both", "jaccard": "Jaccard"}


class ZeroTrainingError(Callback):
    """Stops at the first epoch whose frozen network (eval mode, BatchNorm's running statistics) classifies every
    sample of ``x``, ``y`` correctly; ``epoch`` is that epoch (1-based), or None."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y, self.epoch = x, y, None

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        with eval_mode(pl_module), torch.no_grad():
            wrong = sum(int(((pl_module(xb) > 0).long() != yb).sum()) for xb, yb in zip(self.x.split(1024),
                                                                                         self.y.split(1024)))
        if wrong == 0:
            self.epoch, trainer.should_stop = trainer.current_epoch + 1, True


def tensors(dataset: Any) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*(dataset[i][:2] for i in range(len(dataset))))
    return torch.stack(xs), torch.as_tensor([int(v) for v in ys])


def train(model: pl.LightningModule, datamodule: Any, x: torch.Tensor, y: torch.Tensor,
          max_epochs: int) -> tuple[int, float]:
    """Fit until zero training error; returns the epoch reached and the seconds. Raises if it is not reached."""
    stop = ZeroTrainingError(x, y)
    trainer = pl.Trainer(max_epochs=max_epochs, callbacks=[stop], logger=False, accelerator="auto", devices=1,
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         num_sanity_val_steps=0, limit_val_batches=0)
    start = time.perf_counter()
    trainer.fit(model, datamodule=datamodule)
    if stop.epoch is None:
        raise RuntimeError(f"{type(model).__name__} did not reach zero training error in {max_epochs} epochs; "
                           "raise --max-epochs (or lower the learning rate if the loss diverged)")
    return stop.epoch, time.perf_counter() - start


def head_only(model: ConvFCNet, x, y, x_val, y_val):
    """The paper's protocol: the trunk's output is a fixed embedding, the Linear/Leaky-ReLU head is in path space."""
    part = find_path_part(model)
    with eval_mode(model), torch.no_grad():
        embedded, embedded_val = part.embed(x).double(), part.embed(x_val).double()
    return network_support_vectors(part.path_network(), embedded, y, embedded_val, y_val)


def row(network: str, scope: str, analysis, epochs: int, train_seconds: float, seconds: float) -> dict[str, Any]:
    return {"network": network, "scope": scope, "epochs": epochs, "train_seconds": round(train_seconds, 1),
            "m": analysis.m, "n_support": analysis.n_support, "support_fraction": analysis.n_support / analysis.m,
            "margin_ratio": analysis.margin_ratio, "cosine": analysis.cosine, "val_agreement": analysis.val_agreement,
            "val_errors_network": analysis.val_errors_network, "val_errors_svm": analysis.val_errors_svm,
            "unique_patterns_train": analysis.unique_patterns_train, "bits_per_sv": analysis.n_hidden,
            "bound": analysis.bound, "seconds": round(seconds, 2)}


def overlaps(supports: dict[str, set[int]]) -> list[dict[str, Any]]:
    names = list(supports)
    rows = []
    for i, first in enumerate(names):
        for second in names[i + 1:]:
            a, b = supports[first], supports[second]
            rows.append({"first": first, "second": second, "size_first": len(a), "size_second": len(b),
                         "shared": len(a & b), "jaccard": len(a & b) / max(1, len(a | b))})
    return rows


def _bars(ax: Any, rows: Sequence[dict[str, Any]], keys: Sequence[tuple[str, str]], log: bool) -> None:
    width = 0.8 / len(rows)
    for k, r in enumerate(rows):
        values = [float(r[key]) if r[key] is not None else float("nan") for key, _ in keys]
        bars = ax.bar([i + k * width for i in range(len(keys))], values, width, label=f"{r['network']}: {r['scope']}")
        ax.bar_label(bars, fmt="%.2g", fontsize=7)
    ax.set_xticks([i + width * (len(rows) - 1) / 2 for i in range(len(keys))], [label for _, label in keys])
    if log:
        ax.set_yscale("log")
    else:
        ax.set_ylim(0, 1.4)


def plot(rows: Sequence[dict[str, Any]], pairs: Sequence[dict[str, Any]], title: str) -> Any:
    import matplotlib.pyplot as plt

    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(14, 4), gridspec_kw={"width_ratios": [2, 2, 3]})
    _bars(left, rows, [("support_fraction", "s/m"), ("val_agreement", "val agreement")], log=False)
    left.legend(fontsize=LEGEND_SIZE, loc="upper left")
    left.set_title(title, fontsize=10)
    _bars(middle, rows, [("margin_ratio", "margin ratio"), ("cosine", "cosine(wbar, v)")], log=True)
    middle.set_title("network against the max-margin classifier (log scale)", fontsize=10)
    labels = [f"{p['first']}\nvs {p['second']}" for p in pairs]
    only_a = [p["size_first"] - p["shared"] for p in pairs]
    shared = [p["shared"] for p in pairs]
    only_b = [p["size_second"] - p["shared"] for p in pairs]
    right.barh(labels, only_a, label="A only", color="tab:blue")
    right.barh(labels, shared, left=only_a, label="A and B", color="tab:purple")
    right.barh(labels, only_b, left=[a + s for a, s in zip(only_a, shared)], label="B only", color="tab:red")
    for i, p in enumerate(pairs):
        right.text(p["size_first"] + only_b[i], i, f" J = {p['jaccard']:.2f}", va="center", fontsize=8)
    right.tick_params(axis="y", labelsize=7)
    right.set_xlabel("support vectors")
    right.legend(fontsize=LEGEND_SIZE)
    right.set_title("overlap of the support sets (A: upper, B: lower name)", fontsize=10)
    fig.tight_layout()
    return fig


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add = parser.add_argument
    add("--out", default=f"runs/{NAME}", help="output directory (CSV, Markdown, PNG, PDF)")
    add("--data", choices=["digits", "cifar"], default="digits", help="digits (bundled) or CIFAR-10 frogs vs ships")
    add("--data-root", default=None, help="directory holding cifar-10-batches-py (--data cifar)")
    add("--download", action="store_true", help="let torchvision download CIFAR-10 into --data-root")
    add("--m", type=int, default=None, help="training samples (default: the whole training pool)")
    add("--seed", type=int, default=0, help="seed of both networks' initialisation and training order")
    add("--data-seed", type=int, default=0, help="seed of the validation split and the training subset")
    add("--max-epochs", type=int, default=150, help="epochs allowed to reach zero training error")
    add("--batch-size", type=int, default=50, help="batch size of both networks")
    add("--optimizer", choices=["sgd", "adam"], default="sgd", help="optimizer of both networks (SGD: momentum 0.9)")
    add("--cnn-lr", type=float, default=0.01, help="learning rate of the CNN + FC (digits_cnn.yaml: 0.01)")
    add("--resnet-lr", type=float, default=0.05, help="learning rate of the ResNet (digits_resnet.yaml: 0.05)")
    add("--resnet-width", type=int, default=16, help="channels of the ResNet's convolutions")
    add("--resnet-blocks", type=int, nargs="+", default=[1, 1], help="residual blocks per stage of the ResNet")
    add("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    add("--quick", action="store_true", help="m = 200, narrow networks trained with Adam: a smoke test")
    args = parser.parse_args(argv)
    if args.data == "cifar" and args.data_root is None:
        parser.error("--data cifar reads the files under --data-root; none was given")
    return args


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    args = parse(argv)
    quiet()
    if args.threads:
        torch.set_num_threads(args.threads)
    conv_channels = 64
    if args.quick:
        args.m, conv_channels, args.resnet_width = args.m or 200, 8, 8
        args.batch_size, args.optimizer, args.cnn_lr, args.resnet_lr = 25, "adam", 0.003, 0.01
    datamodule = make_datamodule(args.data, m=args.m, seed=args.data_seed, root=args.data_root,
                                 download=args.download, batch_size=args.batch_size)
    datamodule.setup("fit")
    (x, y), (x_val, y_val) = tensors(datamodule.train_dataset), tensors(datamodule.val_dataset)
    channels, height, width = x.shape[1:]
    pl.seed_everything(args.seed, verbose=False)
    cnn = ConvFCNet(in_channels=channels, image_size=(height, width), fc_depth=3, fc_width=64,
                    conv_channels=conv_channels, beta=0.1, bias=True, optimizer=args.optimizer, lr=args.cnn_lr)
    cnn_epochs, cnn_seconds = train(cnn, datamodule, x, y, args.max_epochs)
    pl.seed_everything(args.seed, verbose=False)
    resnet = ResNetClassifier(in_channels=channels, width=args.resnet_width, blocks=args.resnet_blocks,
                              optimizer=args.optimizer, lr=args.resnet_lr)
    resnet_epochs, resnet_seconds = train(resnet, datamodule, x, y, args.max_epochs)

    rows, supports = [], {}
    for network, scope, model, analyse, epochs, trained in (
            ("cnn_fc", "head only", cnn, head_only, cnn_epochs, cnn_seconds),
            ("cnn_fc", "whole network", cnn, whole_network_support_vectors, cnn_epochs, cnn_seconds),
            ("resnet", "whole network", resnet, whole_network_support_vectors, resnet_epochs, resnet_seconds)):
        start = time.perf_counter()
        analysis = analyse(model, x, y, x_val, y_val)
        rows.append(row(network, scope, analysis, epochs, trained, time.perf_counter() - start))
        supports[f"{network} {scope}"] = set(int(i) for i in analysis.svm.support_)
        print(f"{network}, {scope}: {analysis.report()}\n", flush=True)
    pairs = overlaps(supports)
    out = Path(args.out)
    write_csv(rows, out / f"{NAME}.csv")
    write_csv(pairs, out / f"{NAME}_overlap.csv")
    title = f"{args.data}: m = {rows[0]['m']}, {len(y_val)} validation samples"
    text = f"{title}\n\n{markdown_table(rows, TABLE)}\n\n{markdown_table(pairs, OVERLAP)}\n"
    (out / f"{NAME}.md").write_text(text)
    save_figures(plot(rows, pairs, title), out / NAME)
    print(text)
    return rows


if __name__ == "__main__":
    main()
