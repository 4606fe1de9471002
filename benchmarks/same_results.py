"""Whether two checkouts of the package give the same analyses bit for bit: the reference cases (a binary and a
10-class MLP head, the intercept protocol, a CNN analysed whole and by its head, each on digits, trained by the
callback with seed 0) and their ``reproduce()``, support and α compared byte for byte.

    python benchmarks/same_results.py --old /path/to/old/checkout [--new .] [--out benchmarks/results/same_results.md]

Each checkout runs in its own interpreter (``PYTHONPATH`` set to it); a refactoring that changes nothing a user sees
leaves every row ``identical``."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CASES = {
    "mlp_binary_auto": ("LeakyReLUMLP(widths=[64], optimizer='adam', lr=0.01)", {}, {"m": 200}),
    "mlp_10class_auto": ("LeakyReLUMLP(widths=[64], optimizer='adam', lr=0.01, num_classes=10)", {},
                         {"m": 200, "task": "multiclass"}),
    "cnn_binary_whole": ("ConvFCNet(in_channels=1, image_size=8, fc_depth=1, fc_width=16, conv_channels=4, "
                         "optimizer='adam', lr=0.01)", {}, {"m": 120}),
    "cnn_binary_head": ("ConvFCNet(in_channels=1, image_size=8, fc_depth=1, fc_width=16, conv_channels=4, "
                        "optimizer='adam', lr=0.01)", {"scope": "head"}, {"m": 120}),
    "mlp_binary_intercept": ("LeakyReLUMLP(widths=[64], optimizer='adam', lr=0.01)", {"intercept": True}, {"m": 200}),
}


def run_cases(out: str) -> None:
    """In the checkout on ``PYTHONPATH``: every case's support and α, and those of its ``reproduce()``."""
    import logging
    import warnings

    import numpy as np
    import pytorch_lightning as pl

    from lightning_nsv.artifacts import reproduce
    from lightning_nsv.callbacks import NetworkSupportVectors
    from lightning_nsv.datamodules import DigitsDataModule
    from lightning_nsv.models import ConvFCNet, LeakyReLUMLP  # noqa: F401 (the cases name them)

    warnings.filterwarnings("ignore")
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    arrays = {}
    for name, (model, arguments, data) in CASES.items():
        pl.seed_everything(0)
        callback = NetworkSupportVectors(save_dir=f"{out}_{name}", **arguments)
        trainer = pl.Trainer(max_epochs=150, accelerator="cpu", callbacks=[callback], logger=False,
                             enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False)
        trainer.fit(eval(model), datamodule=DigitsDataModule(seed=0, **data))
        svm = callback.analysis.svm
        arrays[f"{name}/support"], arrays[f"{name}/alpha"] = np.asarray(svm.support_), np.asarray(svm.alpha_)
        arrays[f"{name}/reproduced alpha"] = np.asarray(reproduce(callback.result_path).svm.alpha_)
    np.savez(out, **arrays)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True, help="a checkout of the package to compare with")
    parser.add_argument("--new", default=str(Path(__file__).resolve().parents[1]))
    parser.add_argument("--out", default=None, help="a Markdown file for the table")
    args = parser.parse_args()
    import numpy as np

    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for which in ("old", "new"):
            out = os.path.join(folder, which)
            env = {**os.environ, "PYTHONPATH": getattr(args, which), "OMP_NUM_THREADS": "1"}
            subprocess.run([sys.executable, __file__, "--run", out], env=env, check=True, cwd=folder)
            results[which] = dict(np.load(out + ".npz"))
    rows = ["| array | shape | old and new |", "|---|---|---|"]
    for key in sorted(results["old"]):
        old, new = results["old"][key], results["new"].get(key)
        same = new is not None and old.shape == new.shape and old.dtype == new.dtype and old.tobytes() == new.tobytes()
        rows.append(f"| {key} | {old.shape} | {'identical' if same else 'DIFFERENT'} |")
    table = "\n".join(rows)
    print(table)
    if args.out:
        Path(args.out).write_text(f"# Same results, old and new\n\n`{' '.join(sys.argv)}`\n\n{table}\n")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--run"]:
        run_cases(sys.argv[2])
    else:
        main()
