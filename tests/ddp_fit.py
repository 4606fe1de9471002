"""Run by tests/callbacks/test_ddp.py in a subprocess: two CPU ranks (gloo), each writes what its callback holds."""
import json
import sys


import lightning_nsv.scope.head as head_scope
import lightning_nsv.scope.whole as whole_scope
from lightning_nsv.callbacks import NetworkSupportVectors
from lightning_nsv.compat import pl
from lightning_nsv.datamodules import DigitsDataModule
from lightning_nsv.models import ConvFCNet, LeakyReLUMLP

SERVED = []


def counted(serve):
    def counted_serve(*args, **kwargs):
        SERVED.append(serve(*args, **kwargs))
        return SERVED[-1]

    return counted_serve


if __name__ == "__main__":
    out, kind = sys.argv[1], (sys.argv[2:] or ["mlp"])[0]  # "cnn": the whole network; "cut": from its 2nd conv
    # rank 1: the column blocks it computed for rank 0 (the head's, or the whole network's pair-network columns)
    head_scope.serve_kernel_columns = counted(head_scope.serve_kernel_columns)
    whole_scope.serve_whole_network_columns = counted(whole_scope.serve_whole_network_columns)
    pl.seed_everything(0)
    callback = NetworkSupportVectors(save_dir=f"{out}/nsv", scope="from:net.3" if kind == "cut" else "auto")
    trainer = pl.Trainer(max_epochs=60, accelerator="cpu", devices=2, strategy="ddp", callbacks=[callback],
                         logger=False, enable_progress_bar=False, enable_checkpointing=False,
                         enable_model_summary=False, default_root_dir=out)
    model = (ConvFCNet(in_channels=1, image_size=8, fc_depth=1, fc_width=16, conv_channels=4, optimizer="adam",
                       lr=0.01) if kind in ("cnn", "cut") else LeakyReLUMLP(widths=[32, 32], optimizer="adam", lr=0.01))
    trainer.fit(model, datamodule=DigitsDataModule(m=200, seed=0, batch_size=25))
    with open(f"{out}/rank{trainer.global_rank}.json", "w") as f:
        json.dump({"zero_error_epoch": callback.zero_error_epoch, "metrics": callback.metrics,
                   "analysed_here": callback.analysis is not None, "stopped_after": trainer.current_epoch,
                   "val_loss": float(trainer.callback_metrics["val_loss"]), "served": SERVED}, f)
