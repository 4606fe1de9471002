"""``lightning-nsv``: LightningCLI over any LightningModule and LightningDataModule.

Example::

    lightning-nsv fit --config examples/configs/digits_mlp.yaml
"""
from __future__ import annotations

from pytorch_lightning import LightningDataModule, LightningModule
from pytorch_lightning.cli import LightningCLI


def main(args: list[str] | None = None) -> None:
    """Run the command line; ``args`` replaces ``sys.argv[1:]`` (for tests)."""
    LightningCLI(
        LightningModule,
        LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        save_config_kwargs={"overwrite": True},
        args=args,
    )


if __name__ == "__main__":
    main()
