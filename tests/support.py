"""Constants and helpers shared by the test modules (imported as ``support``; conftest.py holds
the fixtures)."""

from __future__ import annotations

import os
from collections.abc import Callable
import threading
from pathlib import Path

import pytest

from cuda_agent.environment import TimingConfig
from cuda_agent.environment.baselines import MAX_MEDIAN_REL_ERR
from cuda_agent.environment.zygote import process_name, zygote_pids

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = REPO_ROOT / "examples"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SMALL_RELU_TASK = FIXTURES / "tasks" / "small_relu.py"

# Small budgets: the tests check the pipeline, not the precision of the timings.
FAST_TIMING = TimingConfig(budget_s=0.3, min_samples=3, warmup_calls=1, compile_baseline=False)


def skip_unless_cacheable(stats, what: str) -> None:
    """Skip a test about reusing a cached baseline when ``stats`` (``what``) came out too noisy for
    any verdict to reuse (a busy host): the cache would be right to time it afresh."""
    if stats.median_rel_err > MAX_MEDIAN_REL_ERR:
        pytest.skip(f"the machine was too busy: {what} has its median ±{stats.median_rel_err:.1%}, "
                    "which no verdict reuses from the cache")


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


BOTH_WORKER_STARTS = pytest.mark.parametrize("start_worker", ["exec", "zygote"], indirect=True)
"""For tests of a worker's start, life and death: exec'd, and forked by a worker zygote (the
``start_worker`` fixture of tests/environment/conftest.py)."""


def child_pids(parent: int | None = None) -> list[int]:
    """Live children of ``parent`` (default: this process, whose worker zygotes count as the
    workers they forked: a zygote lives as long as this process, its children must not)."""
    parent = os.getpid() if parent is None else parent
    zygotes = set(zygote_pids()) if parent == os.getpid() else set()
    return [pid for pid, fields in _live_processes()
            if (int(fields[1]) == parent and pid not in zygotes) or int(fields[1]) in zygotes]


def live_group_members(pgid: int) -> list[int]:
    """Live processes whose process group is ``pgid``."""
    return [pid for pid, fields in _live_processes() if int(fields[2]) == pgid]


def processes_matching(*, uids: range = range(0), name: str | None = None) -> list[int]:
    """Live (non-zombie) processes whose real uid is in ``uids`` or whose name (comm) is ``name``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = dict(line.split(":", 1) for line in (entry / "status").read_text().splitlines())
        except (OSError, ValueError):
            continue
        if fields["State"].split()[0] == "Z":
            continue
        if int(fields["Uid"].split()[0]) in uids or fields["Name"].strip() == name:
            found.append(int(entry.name))
    return found


class PeakDiskUsage:
    """Polls a directory tree from a thread: the most bytes it ever held, in total and in one file
    (allocated blocks, so sparse files count for what they really use)."""

    def __init__(self, root: Path, interval_s: float = 0.02) -> None:
        self.root, self.interval_s = root, interval_s
        self.total = self.largest = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> "PeakDiskUsage":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        while not self._stop.wait(self.interval_s):
            sizes = []
            for directory, _, files in os.walk(self.root):
                for name in files:
                    try:
                        sizes.append(os.lstat(os.path.join(directory, name)).st_blocks * 512)
                    except OSError:
                        pass
            self.total, self.largest = max(self.total, sum(sizes)), max([self.largest, *sizes])


def descendants(pid: int) -> list[int]:
    """Live processes below ``pid`` (children, grandchildren, ...), read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split() if entry.name.isdigit() else None
        except OSError:
            continue
        if fields and fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, frontier = [], [pid]
    while frontier:
        found += (kids := [k for p in frontier for k in children.get(p, [])])
        frontier = kids
    return found


def proc_text(pid: int, name: str) -> str:
    """``/proc/<pid>/<name>`` (e.g. ``comm``, ``wchan``), stripped; empty once the process is gone."""
    try:
        return (Path("/proc") / str(pid) / name).read_bytes().decode(errors="replace").strip()
    except OSError:
        return ""


def is_live(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    stat = proc_text(pid, "stat")
    return bool(stat) and stat.rsplit(")", 1)[1].split()[0] != "Z"


def command_line(pid: int) -> str:
    """The process's arguments joined by spaces ("" once it is gone)."""
    return proc_text(pid, "cmdline").replace("\0", " ")


def runs_module(pid: int, module: str) -> bool:
    """Whether ``pid`` runs ``module``: exec'd (``python -m module``), or a worker a zygote forked,
    which shows the zygote's command line under a name of its own (``zygote.process_name``)."""
    return module in command_line(pid) or proc_text(pid, "comm") == process_name(module)


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


def errors_when_run_at_once(action: Callable[[], object], threads: int) -> list[BaseException]:
    """Run ``action`` in ``threads`` threads released together by a barrier (to provoke races);
    returns what they raised."""
    start, errors = threading.Barrier(threads), []

    def run() -> None:
        start.wait()
        try:
            action()
        except BaseException as exc:  # noqa: BLE001 - returned for the test's assertion
            errors.append(exc)

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return errors
