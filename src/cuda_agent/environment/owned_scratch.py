"""Scratch folders named after the process that made them (``cuda-agent-<kind>-<pid>-<random>``):
a process killed with ``kill -9`` cannot remove its own, so the next pool to start on the host
removes those whose maker is no longer alive."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

_OWNED = re.compile(r"^cuda-agent-(?:pool|build)-(\d+)-")


def make_owned_dir(kind: str, root: Path) -> Path:
    """A fresh folder ``root/cuda-agent-<kind>-<this pid>-<random>``."""
    return Path(tempfile.mkdtemp(prefix=f"cuda-agent-{kind}-{os.getpid()}-", dir=root))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_orphans(root: Path) -> list[Path]:
    """Remove the pool and build scratch folders under ``root`` whose making process has exited;
    returns them. A reused pid only keeps a folder for longer."""
    removed = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = _OWNED.match(entry.name)
        if match and int(match.group(1)) != os.getpid() and not _alive(int(match.group(1))):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed
