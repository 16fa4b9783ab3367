"""One measurement at a time per device, across threads and processes.

Synthesis times tasks from several places at once: composer processes size tasks by timing them,
and filter lanes time the tasks they check. Kernels of two processes share the GPU (and threads
share the CPU cores), so two overlapping measurements both come out slow. Every timed section
takes this lock: a thread lock for the lanes of one process, plus an advisory ``flock`` on a file
per device for other processes on the machine.

A GPU's lock is named after the physical GPU, whatever a process calls it: ``cuda`` in a lane that
sees one GPU and ``cuda:2`` in the parent that sees four are the same file when they are the same
GPU, and so is ``gpu-<entry>``, the name the evaluation pool's lanes lock (``<entry>`` being the
GPU's ``CUDA_VISIBLE_DEVICES`` entry), so synthesis and evaluation never time on one GPU at once.

Device work that is not a measurement (an evaluation's loading, verifying, tearing down on a GPU
that several evaluations share) may overlap other such work but never a measurement: it holds the
same file shared (:func:`using`) where a measurement holds it alone (:func:`measuring`). Both pass
through a turnstile (a second file, held only while queueing) in the same mode:
- a waiting measurement goes first: untimed work that comes after it queues behind it, so a
  stream of overlapping shared holders cannot keep a measurement waiting for ever;
- untimed work that waits for a measurement to end goes in together, before a measurement asked
  for meanwhile. Queued one at a time instead, they alternated with measurements and barely
  overlapped (one H200's self-check, five evaluations: the GPU held alone 44 % of the time and
  shared 54 %, with ten seconds of each verdict spent waiting for its turns).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from cuda_agent.synth.devices import listed_gpu_entries

_THREAD_LOCKS: dict[str, threading.Lock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()


def lock_name(device: str) -> str:
    """The physical device behind ``device`` as this process sees it: ``cuda`` and ``cuda:<i>``
    become ``gpu-<CUDA_VISIBLE_DEVICES entry>``; other names (``cpu``, ``gpu-0``) stay."""
    match = re.fullmatch(r"cuda(?::(\d+))?", device)
    if match is None:
        return device
    index = int(match.group(1) or 0)
    entries = listed_gpu_entries()
    return f"gpu-{entries[index] if entries and index < len(entries) else index}"


def lock_file(device: str) -> Path:
    """The file whose ``flock`` serialises measurements on ``device`` (``cuda``, ``cuda:1``, ``cpu``)."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", lock_name(device))
    return Path(tempfile.gettempdir()) / f"cuda-agent-timing-{name}.lock"


@contextlib.contextmanager
def measuring(device: str) -> Iterator[None]:
    """Hold ``device`` alone for one measurement; blocks while another thread or process holds it
    (alone or shared)."""
    with _THREAD_LOCKS_GUARD:
        thread_lock = _THREAD_LOCKS.setdefault(lock_name(device), threading.Lock())
    with thread_lock, _flocked(device, fcntl.LOCK_EX):
        yield


@contextlib.contextmanager
def using(device: str) -> Iterator[None]:
    """Hold ``device`` for device work that is not a measurement: beside other such work, never
    during a measurement (blocks while one runs or waits)."""
    with _flocked(device, fcntl.LOCK_SH):
        yield


@contextlib.contextmanager
def _flocked(device: str, mode: int) -> Iterator[None]:
    """``flock`` the device's file in ``mode``, queueing through its turnstile in the same mode
    (shared holders waiting there together, a measurement alone). Each hold opens its own
    descriptor: ``flock`` treats descriptors opened separately as separate holders, in one process
    as across processes."""
    path = lock_file(device)
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        turn = os.open(path.with_suffix(".turn"), os.O_RDONLY | os.O_CREAT, 0o644)
        try:
            fcntl.flock(turn, mode)
            fcntl.flock(fd, mode)
        finally:
            os.close(turn)  # the next in the queue may go on waiting for the device
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock
