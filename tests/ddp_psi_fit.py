"""Run by tests/callbacks/test_ddp.py in a subprocess: PsiRankMonitor on two CPU ranks (gloo) with a network that diverges
after epoch 0 (``diverge``) or an error in rank 0's analysis (``error``); each rank writes what it saw."""
import json
import sys
import warnings

import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_nsv.callbacks import PsiRankMonitor
from lightning_nsv.compat import pl
from lightning_nsv.models.skip import SkipNetwork


class Diverge(pl.Callback):
    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch == 1:
            with torch.no_grad():
                for p in pl_module.parameters():
                    p.fill_(float("nan"))


def fail_on_rank_zero(trainer, pl_module):
    raise MemoryError("no room for Ψ")


if __name__ == "__main__":
    out, mode = sys.argv[1], sys.argv[2]
    pl.seed_everything(0)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.rand(40, 16, generator=g), torch.randint(3, (40,), generator=g))
    model = SkipNetwork.mlp(16, [16, 16, 16], 3, "softplus", num_skip_units=32, mode="skip_sgd", skip_seed=0, lr=0.05)
    monitor = PsiRankMonitor(log_figure=False)
    callbacks = [Diverge(), monitor] if mode == "diverge" else [monitor]
    if mode == "error":
        monitor._compute = fail_on_rank_zero
    trainer = pl.Trainer(max_epochs=3, accelerator="cpu", devices=2, strategy="ddp", callbacks=callbacks,
                         logger=False, enable_progress_bar=False, enable_checkpointing=False,
                         enable_model_summary=False, default_root_dir=out)
    raised = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            trainer.fit(model, DataLoader(data, batch_size=10))
        except Exception as error:  # noqa: BLE001 - written down for the test
            raised = f"{type(error).__name__}: {error}"
    with open(f"{out}/psi_rank{trainer.global_rank}.json", "w") as f:
        json.dump({"raised": raised, "last_epoch": monitor.last_epoch, "failed_epoch": monitor.failed_epoch,
                   "last_metrics": monitor.last_metrics, "epochs": trainer.current_epoch,
                   "warnings": [str(w.message) for w in caught if "no analysis" in str(w.message)]}, f)
