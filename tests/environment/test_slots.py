"""Worker slots: closing one is safe from several threads at once; on the CPU backend a prestarter
starts the next slot only once the taken one is closed."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from cuda_agent.environment.slots import Prestarter, WorkerSlot

from support import child_pids, errors_when_run_at_once


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


def test_on_the_cpu_backend_the_next_slot_starts_once_the_taken_one_is_closed(make_config, scratch_dir: Path) -> None:
    """A slot starting (two interpreters importing torch) would take the cores the taken slot's
    evaluation times on: on 2 cores it spread the candidate's timing to 13-32 % relative error."""
    config = make_config()
    with Prestarter(config) as prestarted:
        slot = prestarted.take(config)
        assert slot is not None
        time.sleep(1.0)  # the old prestarter had the next slot's workers running within milliseconds
        assert sorted(child_pids()) == sorted([slot.reference.proc.pid, slot.candidate.proc.pid])
        slot.close()
        assert prestarted.wait_ready(120), "the next slot did not start after the taken one closed"
        assert len(child_pids()) == 2
    assert child_pids() == [] and list(scratch_dir.iterdir()) == []
