"""A CPU core set apart for the thread that times, on CUDA hosts.

On CUDA the timed sample of a kernel of a few µs is mostly the host thread that launches it: the
reported time of a 6 µs ReLU was about 12 µs of Python and driver calls on an H200 (2026-11-26).
An interpreter importing torch (the next prestarted slot) or a compiler (the next candidate's
build) on the same core, or on its hyper-thread sibling, slows that thread, and whether one lands
there changes from one evaluation to the next. So on hosts with at least ``MIN_CPUS`` CPUs one
core (with its siblings) is set apart: the workers and builds we start run on the other CPUs, and
a worker's main thread (the one that serves requests, so the one that times) moves itself onto the
set only for its timing loops, baselines and candidates alike (not while torch.compile compiles:
the threads and processes a thread starts keep its CPUs).

``CUDA_AGENT_TIMED_CPU`` chooses: ``auto`` (the default: the highest-numbered CPU this process may
use), ``off``, or a comma-separated list of CPU numbers whose first is this process's timed CPU
and whose others stay free as well (the evaluation pool gives each GPU its own this way, shared by
the GPU's lanes).
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

ENV_VAR = "CUDA_AGENT_TIMED_CPU"
MIN_CPUS = 8
"""Fewer CPUs than this (CI's 2, a laptop's 4): none is set apart, the builds need them all."""


class TimedCpuError(ValueError):
    """``CUDA_AGENT_TIMED_CPU`` names something this host cannot set apart."""


@dataclass(frozen=True)
class CpuSplit:
    timed: frozenset[int]
    """Where a worker's main thread runs while it times."""
    others: frozenset[int]
    """Where the workers and builds we start run (the set apart CPUs of other lanes excluded too)."""

    def describe(self) -> str:
        return f"cpu {_ranges(self.timed)} for timing, workers and builds on cpu {_ranges(self.others)}"


def split_cpus(allowed: set[int], siblings_of: Callable[[int], set[int]], setting: str = "auto") -> CpuSplit | None:
    """The split a ``CUDA_AGENT_TIMED_CPU`` setting asks for on a process allowed ``allowed``."""
    setting = setting.strip().lower() or "auto"
    if setting == "off":
        return None
    if setting == "auto":
        if len(allowed) < MIN_CPUS:
            return None
        chosen = [max(allowed)]
    else:
        try:
            chosen = [int(part) for part in setting.split(",")]
        except ValueError:
            raise TimedCpuError(f"{ENV_VAR} must be 'auto', 'off' or CPU numbers such as '15' or '15,14', "
                                f"got {setting!r}") from None
        if not set(chosen) <= allowed:
            raise TimedCpuError(f"{ENV_VAR}={setting!r} names CPUs this process may not use "
                                f"(it may use cpu {_ranges(allowed)})")
    timed = frozenset({chosen[0]} | siblings_of(chosen[0])) & allowed
    kept_free = set().union(*({cpu} | siblings_of(cpu) for cpu in chosen))
    others = frozenset(allowed - kept_free)
    if not others:
        raise TimedCpuError(f"{ENV_VAR}={setting!r} leaves no CPU for the workers and builds")
    return CpuSplit(timed, others)


def thread_siblings(cpu: int) -> set[int]:
    """The hyper-thread siblings of ``cpu`` (itself included), from sysfs; just ``cpu`` if unknown."""
    try:
        text = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text()
    except OSError:
        return {cpu}
    return _parse_ranges(text) or {cpu}


_setting: str | None = None
"""Set by :func:`use_setting`; else ``CUDA_AGENT_TIMED_CPU`` decides."""


@functools.cache
def host_split() -> CpuSplit | None:
    """This process's split, from ``CUDA_AGENT_TIMED_CPU`` (read once)."""
    return split_cpus(set(os.sched_getaffinity(0)), thread_siblings, current_setting())


def use_setting(setting: str | None) -> str | None:
    """This process's setting from now on (None: ``CUDA_AGENT_TIMED_CPU`` again); returns the one
    it replaces. A pool whose GPU lanes each time on a CPU of their own sets the list of all of
    them while it runs, so that the builds it starts keep every one free."""
    global _setting
    previous, _setting = _setting, setting
    host_split.cache_clear()
    return previous


def current_setting() -> str:
    return _setting if _setting is not None else os.environ.get(ENV_VAR, "auto")


def split_for(device: str) -> CpuSplit | None:
    """The split evaluations on ``device`` use: none on the CPU backend, whose timed work runs on
    torch's own threads rather than on one launching thread."""
    return host_split() if device == "cuda" else None


def lane_settings(lane_gpus: Sequence[str | None]) -> list[str] | None:
    """``CUDA_AGENT_TIMED_CPU`` for each GPU lane on this host, given each lane's GPU: a CPU of
    its own for each GPU (the highest ones, one per core), the other GPUs' kept free too; None
    where that would leave the builds less than half the CPUs.

    Lanes of one GPU share its CPU: they time one at a time, each holding the GPU's measurement
    lock (:mod:`cuda_agent.synth.device_lock`), so a CPU for each lane would keep all but one of
    them idle (five lanes on an H200 with 16 CPUs set five apart and left eleven for the workers of
    all five, which kept those 83 % busy)."""
    gpus = list(dict.fromkeys(lane_gpus))
    allowed = set(os.sched_getaffinity(0))
    cores: list[int] = []
    taken: set[int] = set()
    for cpu in sorted(allowed, reverse=True):
        if len(cores) == len(gpus):
            break
        if cpu not in taken:
            cores.append(cpu)
            taken |= {cpu} | thread_siblings(cpu)
    if len(allowed) < MIN_CPUS or len(cores) < len(gpus) or len(allowed - taken) < len(allowed) / 2:
        return None
    own = dict(zip(gpus, cores))
    return [",".join(map(str, [own[gpu], *(c for c in cores if c != own[gpu])])) for gpu in lane_gpus]


def start_off_timed(split: CpuSplit | None, preexec: Callable[[], None] | None) -> Callable[[], None] | None:
    """A ``preexec_fn`` that moves the child onto ``split.others`` (every thread it starts later
    inherits that; where the system refuses, it runs where it would have), then runs ``preexec``.
    Picklable when ``preexec`` is, so a worker zygote can run it (see ``zygote``)."""
    return preexec if split is None else _StartOffTimed(split.others, preexec)


@dataclass(frozen=True)
class _StartOffTimed:
    """:func:`start_off_timed`'s ``preexec_fn``, as data (a closure could not be pickled)."""

    others: frozenset[int]
    then: Callable[[], None] | None

    def __call__(self) -> None:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, self.others)
        if self.then is not None:
            self.then()


@contextlib.contextmanager
def pinned_to(cpus: list[int] | None) -> Iterator[bool]:
    """Runs the block with the calling thread on ``cpus`` (a timing request's ``timed_cpus``) and
    puts it back afterwards; yields whether it moved. A worker moves itself: a thread may always
    change its own affinity, while moving another uid's process (the sandboxed candidate) needs
    ``CAP_SYS_NICE``."""
    if not cpus:
        yield False
        return
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, cpus)
    except OSError:
        yield False
        return
    try:
        yield True
    finally:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, before)


def _parse_ranges(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if "-" in part:
            low, high = part.split("-", 1)
            cpus.update(range(int(low), int(high) + 1))
        elif part:
            cpus.add(int(part))
    return cpus


def _ranges(cpus: frozenset[int] | set[int]) -> str:
    """``{0, 1, 2, 5}`` as ``0-2,5``."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(low) if low == high else f"{low}-{high}" for low, high in runs)
