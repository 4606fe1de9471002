"""The package's generic argument validators, in one leaf module (it imports nothing from :mod:`lightning_nsv`).

Each refuses a value with the argument's name, what came (its ``repr`` and, for a wrong type, its type) and a valid
value or how to fix it. Integers are Python or numpy integers, never a bool (``True`` is ``1`` to Python, but a bool
passed as a count is a mistake); flags are ``bool`` or ``numpy.bool_``, never a string (``'false'`` would count as
True); real numbers are Python or numpy reals, never a bool.

Checks that need the package's objects (a module's input shape against its traced graph, a scope request against
the analysis' options, a head against the data module's classes) stay with those objects and are built from these.
"""
from __future__ import annotations

import math
import numbers
import os
from typing import Any

import numpy as np
import torch

__all__ = ["check_bytes", "check_choice", "check_count", "check_dotted_name", "check_flag", "check_integer",
           "check_path", "check_positive", "check_probability", "check_real", "check_real_type", "check_shape",
           "check_threads", "check_time_budget", "check_whole", "is_count", "is_flag", "is_real"]


# ------------------------------------------------------------------------------------------------- predicates
def is_count(value: Any) -> bool:
    """Whether ``value`` is an integer (Python or numpy), not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def is_flag(value: Any) -> bool:
    """Whether ``value`` is a truth value, ``bool`` or ``numpy.bool_`` (a string such as 'false' is not)."""
    return isinstance(value, (bool, np.bool_))


def is_real(value: Any) -> bool:
    """Whether ``value`` is a real number (Python or numpy, integers included), not a bool."""
    return not is_flag(value) and isinstance(value, numbers.Real)


# ---------------------------------------------------------------------------------------------------- choices
def check_choice(name: str, value: Any, choices: tuple[str, ...], fix: str = "") -> None:
    """Refuse ``value`` outside ``choices``, saying what was expected, what came and (``fix``) how to fix it."""
    if value not in choices:
        raise ValueError(f"`{name}` can be {', '.join(choices)}, got {value!r}" + (f": {fix}" if fix else ""))


# ------------------------------------------------------------------------------------------------------ flags
def check_flag(name: str, value: Any, hint: str = "") -> bool:
    """``value`` as a bool if it is one (numpy's included): a string such as 'false' would count as True; ``hint``
    follows the message (e.g. "; a string such as 'no' would count as True")."""
    if not is_flag(value):
        raise TypeError(f"`{name}` must be True or False, got {value!r} ({type(value).__name__}){hint}")
    return bool(value)


# ---------------------------------------------------------------------------------------------------- numbers
def check_real_type(name: str, value: Any, example: Any = None) -> None:
    """Refuse a ``value`` that is no real number (a bool, a string, None) with a TypeError; ``example``, when given,
    is the valid value the message suggests."""
    if not is_real(value):
        raise TypeError(f"`{name}` must be a real number, got {value!r} ({type(value).__name__})"
                        + ("" if example is None else f"; e.g. {name}={example}"))


def check_positive(name: str, value: Any, why: str = "") -> None:
    """Refuse a ``value`` that is not a real number in (0, inf), naming it; ``why`` follows "> 0" in the message."""
    check_real_type(name, value)
    if not 0 < value < math.inf:
        raise ValueError(f"`{name}` must be > 0{why}, got {value}; valid: 0 < {name} < inf")


def check_real(name: str, value: Any, example: float, high: float = math.inf, closed: bool = True) -> float:
    """``value`` as a float if it is a finite real number (not a bool) in [0, high] ([0, high) unless ``closed``):
    a TypeError names any other type, a ValueError NaN, infinity or a value out of range, both with ``example``."""
    check_real_type(name, value, example)
    try:
        x = float(value)
    except OverflowError:  # an int beyond float's range
        x = math.inf
    if not (math.isfinite(x) and 0 <= x and (x <= high if closed else x < high)):
        span = (f"in [0, {high:g}{']' if closed else ')'}" if high < math.inf
                else "non-negative" if x < 0 else "finite and non-negative")
        raise ValueError(f"`{name}` must be {span}, got {value}; e.g. {name}={example}")
    return x


def check_probability(name: str, value: Any, hint: str = "") -> None:
    """Refuse a ``value`` outside (0, 1) (NaN included) with a ValueError; ``hint`` follows the message (e.g. ";
    e.g. delta=0.05 for a 95% bound"). The type is not checked here: :func:`check_real_type` does that."""
    if not 0 < value < 1:
        raise ValueError(f"`{name}` must be in (0, 1), got {value}{hint}")


def check_time_budget(time_budget: Any) -> float | None:
    """``time_budget`` as float seconds, or ``None`` (no limit; ``inf`` means the same and is kept); refuses
    anything else (a bool, a string, NaN, zero or less), for the analysis and the callback alike."""
    if time_budget is None:
        return None
    if not is_real(time_budget) or not time_budget > 0:  # NaN is not > 0
        raise ValueError(f"`time_budget` must be a positive number of seconds or None (no limit; inf means the "
                         f"same), got {time_budget!r} ({type(time_budget).__name__}); e.g. time_budget=3600 for an "
                         "hour")
    try:
        return float(time_budget)
    except OverflowError:  # an integer beyond float's range: no limit, as inf
        return math.inf


# --------------------------------------------------------------------------------------------------- integers
def check_integer(name: str, value: Any, low: int | None) -> None:
    """Refuse a non-integer (a bool, a float such as 1.5, a string) or one below ``low``, as Lightning's own callbacks do."""
    if is_flag(value) or not isinstance(value, numbers.Integral):
        raise TypeError(f"`{name}` must be an integer, got {value!r} ({type(value).__name__}); pass e.g. {name}="
                        f"{max(low or 0, 1)}")
    if low is not None and value < low:
        kind = "a positive integer" if low == 1 else f"an integer >= {low}"
        raise ValueError(f"`{name}` must be {kind}, got {value}")


def check_count(name: str, value: Any, low: int, example: int, high: int | None = None,
                none: str | None = None) -> int | None:
    """``value`` as an int if it is an integer (Python or numpy, not a bool) in ``low..high``: a TypeError names
    any other type, a ValueError a value out of range, both with ``example``. ``none`` (what None means) allows None."""
    if value is None and none is not None:
        return None
    kind = {0: "a non-negative integer", 1: "a positive integer"}.get(low, f"an integer of at least {low}")
    kind += f" or None ({none})" if none is not None else ""
    if not is_count(value):
        raise TypeError(f"`{name}` must be {kind}, got {value!r} ({type(value).__name__}); e.g. {name}={example}")
    if value < low:
        kind = kind if low < 2 else f"at least {low}"
        raise ValueError(f"`{name}` must be {kind}, got {value}; e.g. {name}={example}")
    if high is not None and value > high:
        raise ValueError(f"`{name}` must be at most {high}, got {value}; e.g. {name}={example}")
    return int(value)


def check_whole(name: str, value: Any, low: int, what: str) -> None:
    """Refuse a ``value`` that is no integer (a TypeError) or below ``low`` (a ValueError): "`name` must be what"."""
    if not is_count(value) or value < low:
        raise (ValueError if is_count(value) else TypeError)(f"`{name}` must be {what}, got {value!r}")


def check_bytes(name: str, value: Any, low: int = 1) -> None:
    """Refuse a byte count that is not an integer of at least ``low``."""
    if not (is_count(value) and value >= low):
        kind = "`{}` must be a positive integer (bytes)" if low == 1 else f"{{}} must be >= {low}, an integer (bytes)"
        raise ValueError(f"{kind.format(name)}, got {value!r} ({type(value).__name__}); e.g. {name}={128 << 20} for "
                         "128 MiB")


def check_threads(threads: Any) -> None:
    """Refuse a thread count that is not ``None`` (torch's) or a positive integer."""
    if threads is not None and not (is_count(threads) and threads >= 1):
        raise ValueError(f"`threads` must be a positive integer or None (torch's, {torch.get_num_threads()} now), "
                         f"got {threads!r}")


# ------------------------------------------------------------------------------------- names, paths, shapes
def check_dotted_name(name: str, value: Any) -> None:
    """Refuse a ``value`` that is neither ``None`` nor a non-empty string, the dotted name of a submodule."""
    if value is not None and (not isinstance(value, str) or not value):
        raise TypeError(f"`{name}` must be the dotted name of a submodule (e.g. 'head' or 'net.trunk') or None, "
                        f"got {value!r}")


def check_path(name: str, value: Any) -> None:
    """Refuse a ``value`` that is neither ``None`` nor a path (``str`` or ``os.PathLike``)."""
    if value is not None and not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"`{name}` must be a path (str or os.PathLike) or None, got {value!r}")


def check_shape(name: str, value: Any, lengths: tuple[int, ...] = (2, 3), what: str = "(C, H, W) or (H, W)",
                example: str = "(1, 8, 8)") -> None:
    """Refuse a ``value`` that is neither ``None`` nor a sequence of ``lengths`` positive integers (``what`` names
    its axes, ``example`` is a valid one)."""
    if value is not None and (isinstance(value, (str, bytes)) or not hasattr(value, "__len__")
                              or len(value) not in lengths
                              or not all(isinstance(n, numbers.Integral) and not isinstance(n, bool) and n > 0
                                         for n in value)):
        raise ValueError(f"`{name}` must be {what} of positive integers, e.g. {example}, or None; got {value!r}")
