"""The commands the READMEs give run as written: the two set-up lines, the files every command names, the CLI
commands' arguments, and the demo itself, from a fresh working directory."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_nsv.cli import main
from tests.timeouts import timeout_for

ROOT = Path(__file__).resolve().parents[2]
READMES = [ROOT / "README.md", ROOT / "examples" / "README.md", ROOT / "benchmarks" / "README.md"]
PREFIXES = ("lightning-nsv ", "python examples/", "python benchmarks/", "python tools/")
PLACEHOLDER = re.compile(r"^(DIR|ROOT|LOGDIR|[A-Z]\.pt|…|\.\.\.)$|<[^>]*>|\|")


def _commands() -> list[tuple[str, str]]:
    """``(readme, command)`` for every command in a fenced bash block or inline code of the READMEs."""
    found = []
    for readme in READMES:
        text = readme.read_text()
        blocks = [block.replace("\\\n", " ") for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]
        inline = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S).replace("\n", " "))
        for command in [line for block in blocks for line in block.splitlines()] + inline:
            for part in command.split("&&"):
                part = part.strip()
                if part.startswith(PREFIXES):
                    found.append((readme.relative_to(ROOT).as_posix(), part))
    return found


COMMANDS = _commands()


def _split(command: str) -> list[str]:
    try:
        return shlex.split(command, comments=True)
    except ValueError:  # an inline fragment with a stray quote or backslash
        return command.split()


def _setup_commands() -> list[str]:
    setup = re.search(r"## Set-up\n(.*?)\n## ", (ROOT / "README.md").read_text(), flags=re.S).group(1)
    return [line for block in re.findall(r"```bash\n(.*?)```", setup, flags=re.S) for line in block.splitlines()]


def test_readmes_name_commands():
    assert len(COMMANDS) >= 20, COMMANDS


def test_two_setup_commands_and_ci_runs_the_test_one():
    demo, tests = _setup_commands()
    assert demo.startswith("pip install torch==2.14.1 torchvision==0.29.1 && pip install -e . && lightning-nsv fit")
    assert tests.endswith("python -m pytest")
    assert tests in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("readme, command", COMMANDS, ids=[c for _, c in COMMANDS])
def test_every_file_a_command_names_exists(readme, command):
    for token in _split(command):
        if re.search(r"\.(py|yaml)$", token) and "/" in token and not PLACEHOLDER.search(token):
            assert (ROOT / token).is_file(), f"{readme}: `{command}` names {token}, which does not exist"


FIT_COMMANDS = sorted({c for _, c in COMMANDS if c.startswith("lightning-nsv fit ") and not any(
    PLACEHOLDER.search(t) for t in _split(c))})


@pytest.mark.parametrize("command", FIT_COMMANDS)
def test_fit_commands_parse_as_written(command, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    helps = "--help" in _split(command)
    with pytest.raises(SystemExit) as done:
        main(_split(command)[1:] + ([] if helps else ["--print_config"]))
    assert done.value.code in (None, 0), capsys.readouterr().err
    assert ("usage: lightning-nsv [options] fit" if helps else "model:") in capsys.readouterr().out


def test_the_demo_command_runs_as_written(tmp_path):
    demo = _setup_commands()[0].split("&&")[-1].strip()
    (tmp_path / "examples").symlink_to(ROOT / "examples")  # a fresh directory holding the repository's examples
    done = subprocess.run(shlex.split(demo) + ["--data.init_args.m=200"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=timeout_for(12), env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "network support vectors:" in done.stdout
    assert list((tmp_path / "runs" / "digits_mlp").rglob("support_vectors_epoch*.pt"))


def test_the_mnist_fit_command_trains_on_mnist_files(tmp_path, monkeypatch):
    """The README's MNIST line for `fit` (`--data BinaryMNISTDataModule --data.root data`) trains as written,
    on MNIST-format files in ./data, for one epoch on 60 samples."""
    from tests.fake_datasets import write_fake_mnist

    command = next(c for c in FIT_COMMANDS if "BinaryMNISTDataModule" in c)
    assert "--data.root data" in command
    write_fake_mnist(tmp_path / "data", 100, 20)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    main(_split(command)[1:] + ["--data.init_args.m=60", "--trainer.max_epochs=1", "--trainer.default_root_dir=out",
                                "--trainer.logger.init_args.save_dir=out", "--trainer.enable_progress_bar=false"])
    config = (tmp_path / "out" / "tensorboard" / "version_0" / "config.yaml").read_text()
    assert "class_path: lightning_nsv.datamodules.BinaryMNISTDataModule" in config and "in_features: 784" in config
    assert list((tmp_path / "out" / "tensorboard" / "version_0" / "checkpoints").glob("*.ckpt"))


def test_the_own_model_snippet_runs_and_the_report_is_printed_once(tmp_path, monkeypatch, capsys, caplog):
    """The README's snippet for a user's own module, run as written on a small module and the digits (its import
    line takes the Lightning package this process uses): the callback's report reaches the output once."""
    import logging

    from lightning_nsv.compat import pl
    from lightning_nsv.datamodules import DigitsDataModule
    from tests.callbacks.test_nsv_callback import UserClassifier

    section = re.search(r"## On your own model\n(.*?)\n## ", (ROOT / "README.md").read_text(), flags=re.S).group(1)
    snippet = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    assert "trainer.fit(my_module, datamodule=my_data)" in snippet
    code = "\n".join(line for line in snippet.splitlines() if not line.startswith("import lightning"))
    monkeypatch.chdir(tmp_path)
    caplog.set_level(logging.INFO)
    pl.seed_everything(0)
    namespace = {"pl": pl, "my_module": UserClassifier(), "my_data": DigitsDataModule(m=300, seed=0, batch_size=50)}
    exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["nsv"].analysis is not None
    printed = capsys.readouterr().out + "\n".join(record.getMessage() for record in caplog.records)
    assert printed.count("network support vectors: ") == 1, printed[-3000:]
