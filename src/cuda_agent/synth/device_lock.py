"""One measurement at a time per device, across threads and processes.

Synthesis times tasks from several places at once: composer processes size tasks by timing them,
and filter lanes time the tasks they check. Kernels of two processes share the GPU (and threads
share the CPU cores), so two overlapping measurements both come out slow. Every timed section
takes this lock: a thread lock for the lanes of one process, plus an advisory ``flock`` on a file
per device for other processes on the machine.
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

_THREAD_LOCKS: dict[str, threading.Lock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()


def lock_file(device: str) -> Path:
    """The file whose ``flock`` serialises measurements on ``device`` (``cuda``, ``cuda:1``, ``cpu``)."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", device)
    return Path(tempfile.gettempdir()) / f"cuda-agent-timing-{name}.lock"


@contextlib.contextmanager
def measuring(device: str) -> Iterator[None]:
    """Hold ``device`` for one measurement; blocks while another thread or process holds it."""
    with _THREAD_LOCKS_GUARD:
        thread_lock = _THREAD_LOCKS.setdefault(device, threading.Lock())
    with thread_lock:
        fd = os.open(lock_file(device), os.O_RDONLY | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the flock
