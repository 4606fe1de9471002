"""The generic argument validators (lightning_nsv/validate.py): each takes valid values (numpy's included) and
refuses bad ones naming the argument; the module is a leaf, and no other module of the package defines them again."""
from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest

from lightning_nsv import validate as v

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lightning_nsv"


def test_the_predicates():
    assert v.is_count(3) and v.is_count(np.int64(3)) and v.is_count(-1)
    assert not any(v.is_count(x) for x in (True, np.bool_(True), 1.0, "1", None))
    assert v.is_flag(True) and v.is_flag(np.bool_(False))
    assert not any(v.is_flag(x) for x in ("false", 0, 1, None))
    assert v.is_real(1) and v.is_real(np.float32(0.5)) and v.is_real(np.int8(2)) and v.is_real(math.nan)
    assert not any(v.is_real(x) for x in (True, np.bool_(True), "1", None, 1j))


def test_check_choice():
    v.check_choice("kernel", "dense", ("auto", "dense"), "fix")
    with pytest.raises(ValueError, match=r"^`kernel` can be auto, dense, got 'x': fix$"):
        v.check_choice("kernel", "x", ("auto", "dense"), "fix")
    with pytest.raises(ValueError, match=r"^`mode` can be a, b, got 3$"):
        v.check_choice("mode", 3, ("a", "b"))


@pytest.mark.parametrize("value", ["false", "True", 0, 1, None, np.int64(1)])
def test_check_flag_refuses_what_is_no_bool(value):
    with pytest.raises(TypeError, match=r"^`progress` must be True or False, got .*; a string such as 'no'"):
        v.check_flag("progress", value, "; a string such as 'no' would count as True")


def test_check_flag():
    assert v.check_flag("download", np.bool_(True)) is True and v.check_flag("download", False) is False
    with pytest.raises(TypeError, match=r"^`download` must be True or False, got 'false' \(str\)$"):
        v.check_flag("download", "false")


@pytest.mark.parametrize("value", [1, 0.5, np.float32(2.5), np.int64(3), 1e300])
def test_check_positive_takes_positive_reals(value):
    v.check_positive("eps", value)


@pytest.mark.parametrize("value, error", [(True, TypeError), ("1", TypeError), (None, TypeError), (0, ValueError),
                                          (-1.0, ValueError), (math.nan, ValueError), (math.inf, ValueError)])
def test_check_positive_refuses(value, error):
    with pytest.raises(error, match="`eps` must be"):
        v.check_positive("eps", value, " (why)")


def test_check_real():
    assert v.check_real("noise", np.float64(0.25), 0.1) == 0.25 and v.check_real("noise", 0, 0.1) == 0.0
    assert v.check_real("val_fraction", 0.5, 0.2, high=1.0, closed=False) == 0.5
    for value, error in ((True, TypeError), ("0.1", TypeError), (math.nan, ValueError), (math.inf, ValueError),
                         (-0.1, ValueError), (10 ** 400, ValueError)):
        with pytest.raises(error, match=r"`noise` must be .*; e.g. noise=0.1$"):
            v.check_real("noise", value, 0.1)
    with pytest.raises(ValueError, match=r"^`val_fraction` must be in \[0, 1\), got 1.0; e.g. val_fraction=0.2$"):
        v.check_real("val_fraction", 1.0, 0.2, high=1.0, closed=False)


def test_check_real_type():
    v.check_real_type("C", np.float32(1.0))
    with pytest.raises(TypeError, match=r"^`C` must be a real number, got True \(bool\)$"):
        v.check_real_type("C", True)
    with pytest.raises(TypeError, match=r"^`C` must be a real number, got 'x' \(str\); e.g. C=1$"):
        v.check_real_type("C", "x", 1)


def test_check_probability():
    v.check_probability("delta", 0.05)
    v.check_probability("delta", np.float32(0.5))
    for value in (0, 1, -0.1, 1.5, math.nan):
        with pytest.raises(ValueError, match=r"^`delta` must be in \(0, 1\), got .*; e.g. delta=0.05$"):
            v.check_probability("delta", value, "; e.g. delta=0.05")


def test_check_time_budget():
    assert v.check_time_budget(None) is None and v.check_time_budget(np.int64(60)) == 60.0
    assert v.check_time_budget(math.inf) == math.inf and v.check_time_budget(10 ** 400) == math.inf
    for value in (True, np.bool_(True), "3600", 0, -1, math.nan):
        with pytest.raises(ValueError, match="`time_budget` must be a positive number of seconds or None"):
            v.check_time_budget(value)


def test_check_integer():
    v.check_integer("seed", -3, None)
    v.check_integer("batch_size", np.int32(4), 1)
    for value in (True, np.bool_(True), 1.0, "1", None):
        with pytest.raises(TypeError, match=r"^`batch_size` must be an integer, got .*; pass e.g. batch_size=1$"):
            v.check_integer("batch_size", value, 1)
    with pytest.raises(ValueError, match=r"^`batch_size` must be a positive integer, got 0$"):
        v.check_integer("batch_size", 0, 1)
    with pytest.raises(ValueError, match=r"^`probe_size` must be an integer >= 0, got -1$"):
        v.check_integer("probe_size", -1, 0)


def test_check_count():
    assert v.check_count("m", np.int64(5), 1, 500) == 5 and type(v.check_count("m", np.int64(5), 1, 500)) is int
    assert v.check_count("m", None, 1, 500, none="all") is None
    with pytest.raises(TypeError, match=r"^`m` must be a positive integer, got True \(bool\); e.g. m=500$"):
        v.check_count("m", True, 1, 500)
    with pytest.raises(TypeError, match=r"^`m` must be a positive integer or None \(all\), got 2.0"):
        v.check_count("m", 2.0, 1, 500, none="all")
    with pytest.raises(ValueError, match=r"^`n_samples` must be at least 2, got 1; e.g. n_samples=1000$"):
        v.check_count("n_samples", 1, 2, 1000)
    with pytest.raises(ValueError, match=r"^`seed` must be at most 9, got 10; e.g. seed=0$"):
        v.check_count("seed", 10, 0, 0, high=9)


def test_check_whole():
    v.check_whole("num_points", np.int16(2), 2, "an integer >= 2")
    with pytest.raises(TypeError, match=r"^`num_points` must be an integer >= 2, got True$"):
        v.check_whole("num_points", True, 2, "an integer >= 2")
    with pytest.raises(ValueError, match=r"^`num_points` must be an integer >= 2, got 1$"):
        v.check_whole("num_points", 1, 2, "an integer >= 2")


def test_check_bytes_and_threads():
    v.check_bytes("memory_bytes", np.int64(1 << 20))
    v.check_bytes("cache_bytes", 0, low=0)
    v.check_threads(None)
    v.check_threads(np.int64(2))
    for value in (0, True, 1.5, "8"):
        with pytest.raises(ValueError, match=r"^`memory_bytes` must be a positive integer \(bytes\), got"):
            v.check_bytes("memory_bytes", value)
        with pytest.raises(ValueError, match=r"^`threads` must be a positive integer or None"):
            v.check_threads(value)
    with pytest.raises(ValueError, match=r"^cache_bytes must be >= 0, an integer \(bytes\), got -1"):
        v.check_bytes("cache_bytes", -1, low=0)


def test_names_paths_and_shapes():
    v.check_dotted_name("path_module", None)
    v.check_dotted_name("path_module", "net.head")
    for value in ("", 3, b"head"):
        with pytest.raises(TypeError, match=r"^`path_module` must be the dotted name of a submodule"):
            v.check_dotted_name("path_module", value)
    v.check_path("save_dir", None)
    v.check_path("save_dir", Path("."))
    with pytest.raises(TypeError, match=r"^`save_dir` must be a path \(str or os.PathLike\) or None, got 3$"):
        v.check_path("save_dir", 3)
    v.check_shape("image_shape", None)
    v.check_shape("image_shape", (1, 8, np.int64(8)))
    v.check_shape("image_shape", [8, 8])
    for value in ("1,8,8", (8,), (1, 8, 8, 8), (1, 0, 8), (1, 8.0, 8), (True, 8, 8), 8):
        with pytest.raises(ValueError, match=r"^`image_shape` must be \(C, H, W\) or \(H, W\) of positive integers"):
            v.check_shape("image_shape", value)


def test_validate_is_a_leaf():
    tree = ast.parse((PACKAGE / "validate.py").read_text())
    imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    imported += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert {name.split(".")[0] for name in imported} <= {"__future__", "math", "numbers", "os", "typing", "numpy",
                                                         "torch"}


GENERIC = set(v.__all__) | {"_check_count", "_check_flag", "_check_integer", "_is_count"}


def test_no_module_but_validate_defines_a_generic_validator():
    defined = [f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"
               for path in sorted(PACKAGE.rglob("*.py")) if path != PACKAGE / "validate.py"
               for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in GENERIC]
    assert defined == []


#: what only validate.py says: a module that says it checks the value itself instead of calling the validator
MESSAGES = ("must be True or False", "must be a real number", "must be in (0, 1)", "must be a path (str or os.PathLike)",
            "must be the dotted name of a submodule", "must be a positive number of seconds or None")


def test_no_module_but_validate_writes_a_validator_s_message():
    written = [f"{path.relative_to(ROOT)}:{node.lineno} {text!r}"
               for path in sorted(PACKAGE.rglob("*.py")) if path != PACKAGE / "validate.py"
               for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.Constant) and isinstance(node.value, str)
               for text in MESSAGES if text in node.value]
    assert written == []
