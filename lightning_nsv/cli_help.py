"""What ``lightning-nsv`` shows of its arguments: ``--help`` as plain text (the docstrings' Sphinx roles, links
and double backquotes read as words), argument groups with titles that say what each is for, the optimizer
route said once, and a clear error for the example scripts' ``--data mnist``/``--data-root`` options."""
from __future__ import annotations

import re
from argparse import SUPPRESS
from typing import Any

from jsonargparse import DefaultHelpFormatter

from lightning_nsv.compat import submodule

_cli = submodule("cli")

_ROLE = re.compile(r":(?:[\w-]+:)?[\w-]+:`(~?)([^`<]*?)\s*(?:<([^>`]*)>)?`")  # :meth:`x`, :class:`~a.B`, :ref:`t <x>`
_LINK = re.compile(r"`([^`<]+?)\s*<([^>`]+)>`_{1,2}")  # `text <url>`_
_LITERAL = re.compile(r"``(.+?)``", re.S)


def plain_text(text: str) -> str:
    """``text`` without Sphinx markup: ``:meth:`analyze``` reads ``analyze``, ``:class:`~a.b.C``` reads ``C``,
    a link reads ``text (url)`` and a double-backquoted literal its content."""
    def role(match: re.Match) -> str:
        tilde, shown, target = match.groups()
        shown = shown or target or ""
        return shown.rsplit(".", 1)[-1] if tilde else shown

    return _LITERAL.sub(r"\1", _LINK.sub(r"\1 (\2)", _ROLE.sub(role, text)))


class PlainHelpFormatter(DefaultHelpFormatter):
    """jsonargparse's help formatter with :func:`plain_text` applied to help strings, group titles and
    descriptions (Lightning's docstrings and the package's are written for Sphinx)."""

    def _get_help_string(self, action: Any) -> str:
        return plain_text(super()._get_help_string(action))

    def start_section(self, heading: str | None) -> None:
        super().start_section(plain_text(heading) if heading else heading)

    def add_text(self, text: str | None) -> None:
        super().add_text(text if text is None or text == SUPPRESS else plain_text(text))


class NSVArgumentParser(_cli.LightningArgumentParser):
    """LightningArgumentParser whose help is plain text; ``--model.help CLASS`` builds one of these too."""

    def __init__(self, *args: Any, formatter_class: Any = PlainHelpFormatter, prog: str = "lightning-nsv",
                 **kwargs: Any) -> None:
        super().__init__(*args, formatter_class=formatter_class, prog=prog, **kwargs)


OPTIMIZER_ROUTE = (
    "The optimizer is the model's own: --model.optimizer sgd|adam, --model.lr, --model.momentum, "
    "--model.weight_decay (see --model.help LeakyReLUMLP). LightningCLI's --optimizer and --lr_scheduler are "
    "not needed; when given, they replace the model's configure_optimizers and --model.optimizer/--model.lr are "
    "then ignored."
)
_GROUPS = {
    "trainer": ("Trainer", "Lightning's Trainer arguments. The analysis callbacks go in --trainer.callbacks "
                "(NetworkSupportVectors; PsiRankMonitor and LossValleyMonitor for skip networks); `analyze` "
                "runs them once on a checkpoint."),
    "model": ("Model", "A LightningModule class (--model LeakyReLUMLP, ConvFCNet, SkipNetwork, or a class path of "
              "your own) and its arguments (--model.widths [32,32]). " + OPTIMIZER_ROUTE),
    "data": ("Data", "A LightningDataModule class and its arguments: --data DigitsDataModule (bundled), "
             "--data BinaryMNISTDataModule --data.root DIR (DIR/MNIST/raw), --data CIFAR10FrogsShipsDataModule "
             "--data.root DIR (DIR/cifar-10-batches-py), Toy2DDataModule, QuadrantDataModule; --data.m chooses the "
             "number of training samples."),
    "optimizer": ("LightningCLI's optimizer (not needed)", "When given, replaces the model's own optimizer "
                  "(--model.optimizer, --model.lr), which is then ignored."),
    "lr_scheduler": ("LightningCLI's learning-rate scheduler (optional)", "Takes effect only together with "
                     "--optimizer; the model's own optimizer runs without a scheduler."),
}


def describe_groups(parser: Any) -> None:
    """Add LightningCLI's optimizer and scheduler groups to ``parser`` (as LightningCLI would) and give every
    group a title and a description that say what it is for."""
    from torch.optim import Optimizer

    parser.add_optimizer_args((Optimizer,))
    parser.add_lr_scheduler_args(_cli.LRSchedulerTypeTuple)
    for key, (title, description) in _GROUPS.items():
        group = parser.groups.get(key)
        if group is not None:
            group.title, group.description = title, description


COMPARE_HELP = ("Compare the support sets of result files of one training set: s per run, pairwise Jaccard, the "
                "core (see lightning-nsv compare --help).")


PROFILE_HELP = ("Analyse a trained checkpoint from every valid cut, input to head: s/m, margins, the bound along "
                "depth (see lightning-nsv profile --help).")


def add_compare_entry(parser: Any) -> None:
    """List ``compare`` and ``profile`` among the subcommands of ``parser`` (``lightning-nsv --help``).
    :func:`lightning_nsv.cli.main` runs them before LightningCLI parses anything, so these entries only show them."""
    for name, text in (("compare", COMPARE_HELP), ("profile", PROFILE_HELP)):
        entry = NSVArgumentParser(prog=f"lightning-nsv {name}", description=text)
        parser._subcommands_action.add_subcommand(name, entry, help=text)


# the example scripts' data options (python examples/*.py --data mnist --data-root DIR) and their CLI form
_EXAMPLE_DATA = {"digits": "DigitsDataModule", "mnist": "BinaryMNISTDataModule --data.root DIR",
                 "cifar": "CIFAR10FrogsShipsDataModule --data.root DIR"}


def check_example_script_options(argv: list[str]) -> None:
    """Refuse the example scripts' ``--data digits|mnist|cifar`` and ``--data-root`` with their CLI form (else
    jsonargparse answers "Expected a dot import path string: mnist").

    Raises:
        ValueError: naming the option given and the one to use.
    """
    for i, arg in enumerate(argv):
        name, _, value = arg.partition("=")
        if name == "--data" and not value and i + 1 < len(argv):
            value = argv[i + 1]
        if name == "--data-root" or (name == "--data" and value.lower() in _EXAMPLE_DATA):
            forms = "; ".join(f"--data {example} -> --data {cli}" for example, cli in _EXAMPLE_DATA.items())
            raise ValueError(
                f"`lightning-nsv` got {arg if value in arg else f'{arg} {value}'}: `--data NAME` and `--data-root` "
                "are options of the example scripts (python examples/...). The command line takes a data module "
                f"class and its root: {forms} (see --help)"
            )
