"""Support vectors along the depth (issue 44): where between the input and the head does a trained network go from
"almost every sample is needed" to "a few dozen are"?

Two networks are trained to zero training error (eval mode) on one binary task: the paper's CNN + FC (``ConvFCNet``)
and a small ResNet (``ResNetClassifier``). Each is then analysed from every valid cut
(:func:`~lightning_nsv.scope.profile.support_vector_profile`): everything before the cut is a fixed float64
embedding, everything after it is in path space. The cut at the input is the whole-network analysis, the cut at the
first Linear of the head the paper's head-only protocol.

Writes to ``--out``: ``depth_profile.md`` (both tables), ``depth_profile_<network>.csv`` and
``depth_profile.png``/``.pdf`` (s/m and the compression bound against the cut, one panel per network); with
``--data standin`` or ``cifar`` the files are ``depth_profile_<data>…``.

Usage::

    python examples/depth_profile.py --out examples/results        # bundled 8×8 digits, all 1438, about 1 min
    python examples/depth_profile.py --data standin --m 500 --out examples/results   # CIFAR-shaped stand-in
    python examples/depth_profile.py --data cifar --data_root data --m 500 --max-epochs 100
    python examples/depth_profile.py --quick                        # a smoke test
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, Sequence

import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_nsv.compat import Callback, pl
from lightning_nsv.datamodules.standin import frogs_ships_standin as standin
from lightning_nsv.experiments import make_datamodule, quiet, save_figures
from lightning_nsv.models.conv_fc import ConvFCNet
from lightning_nsv.models.layers import eval_mode
from lightning_nsv.models.resnet import ResNetClassifier
from lightning_nsv.scope.profile import DepthProfile, support_vector_profile

NAME = "depth_profile"


class ZeroTrainingError(Callback):
    """Stops at the first epoch whose frozen network (eval mode) classifies every sample of ``x``, ``y``."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y, self.epoch = x, y, None

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        with eval_mode(pl_module), torch.no_grad():
            wrong = int(((pl_module(self.x) > 0).long() != self.y).sum())
        if wrong == 0:
            self.epoch, trainer.should_stop = trainer.current_epoch + 1, True


def tensors(dataset: Any) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*(dataset[i][:2] for i in range(len(dataset))))
    return torch.stack(xs), torch.as_tensor([int(v) for v in ys])


def data(args: argparse.Namespace) -> tuple[torch.Tensor, ...]:
    """Training and validation inputs and labels of ``--data``."""
    if args.data == "standin":
        m = args.m or 500
        x, y = standin(m + m // 4, args.seed + 1)
        return x[:m], y[:m], x[m:], y[m:]
    datamodule = make_datamodule(args.data, m=args.m, seed=0, root=args.data_root, download=args.download,
                                 batch_size=25)
    datamodule.setup("fit")
    return (*tensors(datamodule.train_dataset), *tensors(datamodule.val_dataset))


def train(model: pl.LightningModule, x: torch.Tensor, y: torch.Tensor, max_epochs: int) -> int:
    stop = ZeroTrainingError(x, y)
    trainer = pl.Trainer(max_epochs=max_epochs, callbacks=[stop], logger=False, accelerator="auto", devices=1,
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         num_sanity_val_steps=0, limit_val_batches=0)
    loader = DataLoader(TensorDataset(x, y), batch_size=25, shuffle=True, generator=torch.Generator().manual_seed(0))
    trainer.fit(model, train_dataloaders=loader)
    if stop.epoch is None:
        raise RuntimeError(f"{type(model).__name__} did not reach zero training error in {max_epochs} epochs; "
                           "raise --max-epochs")
    return stop.epoch


def plot(profiles: dict[str, DepthProfile], title: str) -> Any:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(profiles), figsize=(6 * len(profiles), 4))
    for ax, (network, profile) in zip(axes, profiles.items()):
        _draw(ax, profile, f"{network}: {title}")
    fig.tight_layout()
    return fig


def _draw(ax: Any, profile: DepthProfile, title: str) -> None:
    rows = [r for r in profile.rows if not r.note]
    where = [r.index for r in rows]
    ax.plot(where, [r.s_over_m for r in rows], "o-", color="tab:blue", label="s/m")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("s/m", color="tab:blue")
    ax.set_xticks(where, [f"{r.index}: {r.cut}\n({r.part})" for r in rows], fontsize=8)
    ax.set_xlabel("cut (input → head)")
    right = ax.twinx()
    right.semilogy(where, [r.bound for r in rows], "s--", color="tab:red", label="compression bound")
    right.axhline(1.0, color="tab:red", lw=0.8, ls=":")
    right.set_ylabel("compression bound (log; 1 dotted)", color="tab:red")
    ax.set_title(title, fontsize=10)
    lines = ax.get_lines()[:1] + right.get_lines()[:1]
    ax.legend(lines, [line.get_label() for line in lines], loc="upper right", fontsize=9)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add = parser.add_argument
    add("--out", default=f"runs/{NAME}", help="output directory (Markdown, CSV, PNG, PDF)")
    add("--data", choices=["digits", "standin", "cifar"], default="digits",
        help="digits (bundled), a CIFAR-shaped stand-in (3×32×32, two classes) or CIFAR-10 frogs vs ships")
    add("--data_root", "--data-root", default=None, help="directory holding cifar-10-batches-py (--data cifar)")
    add("--download", action="store_true", help="let torchvision download CIFAR-10 into --data-root")
    add("--m", type=int, default=None, help="training samples (default: the whole training pool)")
    add("--seed", type=int, default=0, help="seed of both networks' initialisation and training order")
    add("--max-epochs", type=int, default=150, help="epochs allowed to reach zero training error")
    add("--conv-channels", type=int, default=8, help="filters of the CNN + FC's convolutions")
    add("--resnet-width", type=int, default=8, help="channels of the ResNet's convolutions")
    add("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    add("--quick", action="store_true", help="m = 100, 4 channels: a smoke test")
    args = parser.parse_args(argv)
    if args.data == "cifar" and args.data_root is None:
        parser.error("--data cifar reads the files under --data_root; none was given")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, DepthProfile]:
    args = parse(argv)
    quiet()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.m, args.conv_channels, args.resnet_width = 100, 4, 4
    x, y, x_val, y_val = data(args)
    channels, height, width = x.shape[1:]
    networks = {
        "cnn_fc": lambda: ConvFCNet(in_channels=channels, image_size=(height, width), fc_depth=2, fc_width=32,
                                    conv_channels=args.conv_channels, beta=0.1, bias=True, optimizer="adam",
                                    lr=0.003),
        "resnet": lambda: ResNetClassifier(in_channels=channels, width=args.resnet_width, blocks=[1, 1],
                                           optimizer="adam", lr=0.01),
    }
    stem = NAME if args.data == "digits" else f"{NAME}_{args.data}"
    profiles, sections = {}, []
    for network, make in networks.items():
        pl.seed_everything(args.seed, verbose=False)
        model = make()
        started = time.perf_counter()
        epochs = train(model, x, y, args.max_epochs)
        trained = time.perf_counter() - started
        profiles[network] = profile = support_vector_profile(model, x, y, x_val, y_val, say=print)
        sections.append(f"**{network}** (`{type(model).__name__}`, zero training error at epoch {epochs}, "
                        f"{trained:.0f} s of training)\n\n{profile.table()}")
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{stem}_{network}.csv").write_text(profile.csv())
    title = f"{args.data}: m = {len(y)}, {len(y_val)} validation samples"
    text = f"{title}\n\n" + "\n\n".join(sections) + "\n"
    (Path(args.out) / f"{stem}.md").write_text(text)
    save_figures(plot(profiles, title), Path(args.out) / stem)
    print(text)
    return profiles


if __name__ == "__main__":
    main()
