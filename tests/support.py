"""Constants and helpers shared by the test modules (imported as ``support``; conftest.py holds
the fixtures)."""

from __future__ import annotations

import os
from pathlib import Path

from cuda_agent.environment import TimingConfig

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = REPO_ROOT / "examples"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SMALL_RELU_TASK = FIXTURES / "tasks" / "small_relu.py"

# Small budgets: the tests check the pipeline, not the precision of the timings.
FAST_TIMING = TimingConfig(budget_s=0.3, min_samples=3, warmup_calls=1, compile_baseline=False)


def _live_processes() -> list[tuple[int, list[str]]]:
    """``(pid, [state, ppid, pgrp, ...])`` for every live (non-zombie) process, read from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may contain spaces, so split after the last ')'.
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z":
            found.append((int(entry.name), fields))
    return found


def child_pids(parent: int | None = None) -> list[int]:
    """Live children of ``parent`` (default: this process)."""
    parent = os.getpid() if parent is None else parent
    return [pid for pid, fields in _live_processes() if int(fields[1]) == parent]


def live_group_members(pgid: int) -> list[int]:
    """Live processes whose process group is ``pgid``."""
    return [pid for pid, fields in _live_processes() if int(fields[2]) == pgid]


def wait_until(predicate, timeout_s: float = 5.0, interval_s: float = 0.05) -> bool:
    """Poll ``predicate`` until it is true or ``timeout_s`` passes; return its last value."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return bool(predicate())
        time.sleep(interval_s)
