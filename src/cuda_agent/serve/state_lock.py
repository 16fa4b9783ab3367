"""One service per state folder: ``cuda-agent serve`` holds an exclusive lock on
``<state-dir>/service.lock`` for its whole life, so a second instance (or a restart that overlaps a
graceful shutdown still finishing its jobs) cannot take over jobs that are still being evaluated.
The kernel releases the lock when the holder exits, however it exits (``kill -9`` included)."""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path

LOCK_FILE = "service.lock"


class StateDirBusy(RuntimeError):
    """Another live service holds the state folder; the message names its process."""


class StateDirLock:
    """The held lock; :meth:`release` (idempotent) or process exit gives it up."""

    def __init__(self, state_dir: Path) -> None:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = state_dir / LOCK_FILE
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self.path.read_text().strip() or "unknown process"
            os.close(self._fd)
            self._fd = None
            raise StateDirBusy(f"{state_dir}: in use by another cuda-agent serve ({holder}); stop it first, or give "
                               "this one its own --state-dir") from None
        os.ftruncate(self._fd, 0)
        os.write(self._fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
