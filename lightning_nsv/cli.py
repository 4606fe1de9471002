"""``lightning-nsv``: LightningCLI over any LightningModule and LightningDataModule.

Example::

    lightning-nsv fit --config examples/configs/digits_mlp.yaml
    lightning-nsv fit --model LeakyReLUMLP --data DigitsDataModule --trainer.callbacks+=NetworkSupportVectors

The package's modules, data modules and callbacks are imported here so that their short names resolve.
"""
from __future__ import annotations

import lightning_nsv.callbacks  # noqa: F401
import lightning_nsv.datamodules  # noqa: F401
import lightning_nsv.models  # noqa: F401
from lightning_nsv.compat import LightningDataModule, LightningModule, submodule


def main(args: list[str] | None = None) -> None:
    """Run the command line; ``args`` replaces ``sys.argv[1:]`` (for tests)."""
    submodule("cli").LightningCLI(
        LightningModule,
        LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        save_config_kwargs={"overwrite": True},
        args=args,
    )


if __name__ == "__main__":
    main()
