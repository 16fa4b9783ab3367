"""Worker slots: closing one is safe from several threads at once."""

from __future__ import annotations

import threading
from pathlib import Path

from cuda_agent.environment.slots import WorkerSlot

from support import errors_when_run_at_once


def test_a_slot_closed_by_two_threads_at_once_is_closed_once(make_config, scratch_dir: Path) -> None:
    """A prestarter closes a slot mid-warm-up while the warm-up thread, seeing its workers die,
    closes it too: the lease must be released once (twice closed its lock descriptor on a GPU host,
    which could close a descriptor another thread had opened in between)."""
    slot = WorkerSlot(make_config(), warm_device=False)
    lease, releases = slot.lease, []
    release = lease.release

    def counted_release() -> None:
        releases.append(threading.current_thread().name)
        release()

    lease.release = counted_release
    assert errors_when_run_at_once(slot.close, 2) == [] and len(releases) == 1
    assert list(scratch_dir.iterdir()) == []
