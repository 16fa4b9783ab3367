"""How busy this machine's CPUs are, so that a baseline timed on a busy machine is not reused on an
idle one (or the other way round): a speed-up is only fair against a baseline timed under the same
load as the candidate."""

from __future__ import annotations

import os

LOAD_TOLERANCE = 1.0
"""Largest change in load per core (runnable processes per CPU, over the last minute) under which
a cached baseline is still reused; beyond it (a whole core's worth of work more or less) the
baseline is timed again."""


def current_load() -> float:
    """The 1-minute load average per CPU (0: idle, 1: every core busy)."""
    return os.getloadavg()[0] / (os.cpu_count() or 1)


def comparable(cached: float | None, now: float) -> bool:
    """True when a baseline timed at load ``cached`` (None: not recorded) may stand for one timed now."""
    return cached is not None and abs(cached - now) <= LOAD_TOLERANCE
