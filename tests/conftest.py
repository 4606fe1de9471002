"""Every test starts from the same process state, whatever ran before it.

Tests and the code under test change process-wide settings: torch's and the BLAS libraries' thread counts
(``--threads``, ``threadpool_limits``), the default dtype, float32 matmul precision, warning filters, logging
levels and filters (and ``logging.disable``), the rank Lightning's ``rank_zero_only`` logs for and the logger its
``rank_zero_info`` writes to (importing the other Lightning package redirects it), environment variables
(``LIGHTNING_NSV_PACKAGE``), the current directory, torch's global random state. The fixture below records them
before each test and puts back whatever changed, so the suite passes in any order (``python -m pytest`` shuffles
it with pytest-randomly; see the README).

torch seeds its generator from the operating system in every process, so a test or a module-scoped fixture that
draws without seeding would see different numbers on every run. Each test module and each test therefore starts
from a seed of its own, fixed by its name: the same numbers in any order and on every run. Property-based tests
(``hypothesis``) draw the same examples on every run too (derandomized, no example database) unless
``NSV_PROPERTY_SCALE`` asks for more of them (``tests/kernel/test_properties.py``).
"""
from __future__ import annotations

import logging
import os
import sys
import warnings
import zlib
from pathlib import Path

import pytest
import torch
from hypothesis import settings
from threadpoolctl import threadpool_info, threadpool_limits


settings.register_profile("reproducible", derandomize=True, database=None)
if int(os.environ.get("NSV_PROPERTY_SCALE", "1")) == 1:
    settings.load_profile("reproducible")


def _blas_threads() -> list[tuple[str, str, int]]:
    return [(info["user_api"], info["filepath"], info["num_threads"]) for info in threadpool_info()]


def _rank_zero_ranks() -> dict[object, object]:
    """The rank that Lightning's ``rank_zero_only`` logs for, of each Lightning package imported (a Trainer sets it)."""
    owners = [sys.modules.get(f"{package}.utilities.rank_zero") for package in ("lightning_fabric", "lightning.fabric")]
    return {owner.rank_zero_only: getattr(owner.rank_zero_only, "rank", None) for owner in owners if owner is not None}


def _rank_zero_log():
    """lightning_utilities' rank-zero helpers log to the logger of the Lightning package imported last: importing
    ``lightning.pytorch`` redirects ``pytorch_lightning``'s ``rank_zero_info`` away from the logger tests read."""
    module = sys.modules.get("lightning_utilities.core.rank_zero")
    return None if module is None else (module, module.log)


def _logger_state() -> dict[str, tuple]:
    loggers = [logging.getLogger()] + [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)]
    return {lg.name: (lg.level, list(lg.filters), list(lg.handlers), lg.propagate, lg.disabled) for lg in loggers}


def _restore_loggers(saved: dict[str, tuple]) -> None:
    for name, (level, filters, handlers, propagate, disabled) in saved.items():
        lg = logging.getLogger(name) if name != "root" else logging.getLogger()
        lg.setLevel(level)
        lg.filters[:] = filters
        lg.handlers[:] = handlers
        lg.propagate, lg.disabled = propagate, disabled


#: Folders whose tests fit Lightning models or start subprocesses: outside the quick subset.
SLOW_FOLDERS = ("tests/callbacks/", "tests/cli/")
SLOW_TESTS = frozenset(line.strip() for line in (Path(__file__).parent / "slow_tests.txt").read_text().splitlines()
                       if line.strip() and not line.startswith("#"))


def pytest_collection_modifyitems(config, items):
    """``quick``: the inner loop's subset (``python -m pytest -m quick``, under about 2 minutes on 2 cores), every
    test but those of :data:`SLOW_FOLDERS` and of ``slow_tests.txt``; ``python -m pytest`` runs everything."""
    for item in items:
        if not item.nodeid.startswith(SLOW_FOLDERS) and item.nodeid not in SLOW_TESTS:
            item.add_marker(pytest.mark.quick)


def _seed_from(nodeid: str) -> None:
    """The seed of a test or a test module, fixed by its file's name and the test's (not by the folder it is in)."""
    path, _, rest = nodeid.partition("::")
    name = f"tests/{path.rpartition('/')[2]}" + (f"::{rest}" if rest else "")
    torch.manual_seed(zlib.crc32(name.encode()))


@pytest.fixture(scope="module", autouse=True)
def seeded_module(request):
    """Module-scoped fixtures that draw without a seed of their own draw from this one."""
    _seed_from(request.node.nodeid)


@pytest.fixture(autouse=True)
def restore_process_state(request):
    threads, blas = torch.get_num_threads(), _blas_threads()
    dtype, precision = torch.get_default_dtype(), torch.get_float32_matmul_precision()
    tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    deterministic = torch.are_deterministic_algorithms_enabled()
    rng = torch.get_rng_state()
    environ, cwd = dict(os.environ), os.getcwd()
    filters, loggers, disabled, ranks = list(warnings.filters), _logger_state(), logging.root.manager.disable, \
        _rank_zero_ranks()
    rank_zero_log = _rank_zero_log()
    _seed_from(request.node.nodeid)
    yield
    torch.set_num_threads(threads)
    if _blas_threads() != blas:
        threadpool_limits(limits={path: n for _, path, n in blas})
    torch.set_default_dtype(dtype)
    torch.set_float32_matmul_precision(precision)
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    torch.use_deterministic_algorithms(deterministic)
    torch.set_rng_state(rng)
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    warnings.filters[:] = filters
    getattr(warnings, "_filters_mutated", lambda: None)()  # tells the C filter cache (private; absent elsewhere)
    _restore_loggers(loggers)
    logging.disable(disabled)
    for decorator, rank in ranks.items():
        decorator.rank = rank
    if rank_zero_log is not None:
        module, log = rank_zero_log
        module.log = log
