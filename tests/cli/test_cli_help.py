"""What `lightning-nsv` shows of its arguments: help without Sphinx markup, one optimizer route, and the example
scripts' data options refused with the command line's form."""
import re

import pytest

from lightning_nsv.cli import main
from lightning_nsv.cli_help import plain_text

MARKUP = re.compile(r":[a-z]+:`|``|`_\b|>`_")


def _help(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as done:
        main([*args, "--help"] if args[-1:] != ("LeakyReLUMLP",) else list(args))
    assert done.value.code in (None, 0)
    return capsys.readouterr().out


@pytest.mark.parametrize("text, plain", [
    (":meth:`analyze`", "analyze"),
    ("the :class:`~lightning_nsv.callbacks.NetworkSupportVectors` callback", "the NetworkSupportVectors callback"),
    (":py:func:`torch.load`", "torch.load"),
    (":ref:`the guide <cli-guide>`", "the guide"),
    ('Default: ``"auto"``.', 'Default: "auto".'),
    ("see `Serialization Semantics <https://docs.pytorch.org/x.html#id3>`_.",
     "see Serialization Semantics (https://docs.pytorch.org/x.html#id3)."),
    ("plain text, `one backquote` and 50% kept", "plain text, `one backquote` and 50% kept"),
])
def test_plain_text_reads_sphinx_markup_as_words(text, plain):
    assert plain_text(text) == plain


def test_fit_help_has_no_markup_and_says_which_optimizer_applies(capsys):
    shown = _help(capsys, "fit")
    assert not MARKUP.search(shown), MARKUP.search(shown).group(0) + " in: " + shown[
        max(0, MARKUP.search(shown).start() - 200): MARKUP.search(shown).end() + 100]
    assert shown.startswith("usage: lightning-nsv [options] fit")
    sections = dict(re.findall(r"\n([^ \n][^\n]*):\n((?:  [^\n]*\n)+)", shown))
    model = " ".join(sections["Model"].split())
    assert "The optimizer is the model's own: --model.optimizer sgd|adam, --model.lr" in model
    assert "when given, they replace the model's configure_optimizers" in model
    optimizer = " ".join(sections["LightningCLI's optimizer (not needed)"].split())
    assert optimizer.startswith("When given, replaces the model's own optimizer (--model.optimizer, --model.lr)")
    assert "--data BinaryMNISTDataModule --data.root DIR" in " ".join(sections["Data"].split())


def test_analyze_help_and_a_class_help_have_no_markup(capsys):
    for args in (("analyze",), ("fit", "--model.help", "LeakyReLUMLP")):
        shown = _help(capsys, *args)
        assert "--" in shown and not MARKUP.search(shown), (args, MARKUP.search(shown))


@pytest.mark.parametrize("args, given", [
    (["fit", "--data", "mnist", "--data-root", "data"], "--data mnist"),
    (["fit", "--data=cifar"], "--data=cifar"),
    (["fit", "--data", "DigitsDataModule", "--data-root", "data"], "--data-root"),
])
def test_the_example_scripts_data_options_are_refused_with_the_command_line_form(args, given):
    with pytest.raises(ValueError) as refused:
        main(args)
    message = str(refused.value)
    assert f"`lightning-nsv` got {given}:" in message
    assert "--data mnist -> --data BinaryMNISTDataModule --data.root DIR" in message
    assert "--data cifar -> --data CIFAR10FrogsShipsDataModule --data.root DIR" in message


def test_the_top_level_help_lists_every_subcommand_compare_included(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code in (None, 0)
    shown = capsys.readouterr().out
    assert "{fit,validate,test,predict,analyze,compare,profile}" in shown
    listed = dict(re.findall(r"\n    (\w+) +(\S[^\n]*)", shown))
    assert listed["compare"].startswith("Compare the support sets of result files") and "analyze" in listed
    with pytest.raises(SystemExit) as done:
        main(["compare", "--help"])  # the entry only lists it: compare keeps its own command line
    assert done.value.code in (None, 0) and "usage: lightning-nsv compare [-h]" in capsys.readouterr().out
    assert listed["profile"].startswith("Analyse a trained checkpoint from every valid cut")
    with pytest.raises(SystemExit) as done:
        main(["profile", "--help"])
    assert done.value.code in (None, 0) and "usage: lightning-nsv profile [-h] --ckpt_path" in capsys.readouterr().out
