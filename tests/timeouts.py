"""How long a test waits for a subprocess: ``SLOWER`` times what it takes on a quiet machine of the kind that runs
the suite (2 shared CPU cores), so that a loaded machine fails nothing but a hang.

A shared machine under load was measured 7–8× slower than quiet (the demo: 9 s quiet, 62–76 s busy; issue 43), so
``SLOWER = 20`` leaves room beyond that. Every ``timeout=`` of a test's subprocess is :func:`timeout_for` of the
quiet duration of that subprocess, measured and written next to it.
"""
from __future__ import annotations

import math

SLOWER = 20


def timeout_for(quiet_seconds: float) -> int:
    """Seconds to wait for a subprocess that takes ``quiet_seconds`` on a quiet machine (at least a minute)."""
    return max(60, math.ceil(SLOWER * quiet_seconds))
