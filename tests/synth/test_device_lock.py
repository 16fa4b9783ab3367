"""The device lock: a measurement holds its device alone, untimed device work holds it beside
other untimed work (also another process's) but never beside a measurement, a waiting
measurement goes before untimed work that arrives after it, and untimed work that waited for a
measurement goes in together, before the next one."""

from __future__ import annotations

import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from cuda_agent.synth import device_lock

WAIT_S = 0.3  # long enough for a thread that is not blocked to take a free lock


def _holder(hold: Callable[[], AbstractContextManager[None]]) -> tuple[threading.Event, threading.Event,
                                                                          threading.Thread]:
    """A thread that enters ``hold()`` and stays until released: (entered, release, thread)."""
    entered, release = threading.Event(), threading.Event()

    def run() -> None:
        with hold():
            entered.set()
            release.wait(10)

    thread = threading.Thread(target=run)
    thread.start()
    return entered, release, thread


def _hold_in_child(device: str) -> subprocess.Popen:
    """Another process that holds ``device`` for untimed work until its stdin closes (a plain
    subprocess: multiprocessing would leave its resource tracker running)."""
    code = ("import sys\nfrom cuda_agent.synth import device_lock\n"
            f"with device_lock.using({device!r}):\n    print('held', flush=True)\n    sys.stdin.read()\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"
    return child


def test_measurements_wait_for_their_own_device_only() -> None:
    entered, release, holder = _holder(lambda: device_lock.measuring("cpu:7"))
    assert entered.wait(5)
    started = time.monotonic()
    with device_lock.measuring("cpu:8"):  # another device: no wait
        assert time.monotonic() - started < 1.0
    waiter_entered, waiter_release, waiter = _holder(lambda: device_lock.measuring("cpu:7"))
    assert not waiter_entered.wait(WAIT_S)  # the same device: blocked while it is held
    release.set()
    assert waiter_entered.wait(5)
    waiter_release.set()
    holder.join()
    waiter.join()


def test_untimed_work_overlaps_untimed_work_but_never_a_measurement() -> None:
    device = f"test-{secrets.token_hex(4)}"
    first, release_first, first_thread = _holder(lambda: device_lock.using(device))
    second, release_second, second_thread = _holder(lambda: device_lock.using(device))
    assert first.wait(5) and second.wait(5)  # two evaluations' loading or verifying at once
    measured, release_measure, measure_thread = _holder(lambda: device_lock.measuring(device))
    assert not measured.wait(WAIT_S)
    release_first.set()
    assert not measured.wait(WAIT_S)  # one untimed holder is left
    release_second.set()
    assert measured.wait(5)
    late, release_late, late_thread = _holder(lambda: device_lock.using(device))
    assert not late.wait(WAIT_S)  # untimed work waits while a measurement runs
    release_measure.set()
    assert late.wait(5)
    release_late.set()
    for thread in (first_thread, second_thread, measure_thread, late_thread):
        thread.join()


def test_a_waiting_measurement_goes_before_untimed_work_of_another_process_that_came_after_it() -> None:
    device = f"test-{secrets.token_hex(4)}"
    child = _hold_in_child(device)
    try:
        with device_lock.using(device):  # beside the other process's untimed work: no wait
            pass
        measured, release_measure, measure_thread = _holder(lambda: device_lock.measuring(device))
        assert not measured.wait(WAIT_S)  # the child holds the device for untimed work
        late, release_late, late_thread = _holder(lambda: device_lock.using(device))
        assert not late.wait(WAIT_S)  # queued behind the waiting measurement, not beside the child
        child.stdin.close()
        assert measured.wait(5)
        assert not late.is_set()
        release_measure.set()
        assert late.wait(5)
        release_late.set()
        measure_thread.join()
        late_thread.join()
    finally:
        if not child.stdin.closed:
            child.stdin.close()
        assert child.wait(30) == 0


def test_untimed_work_that_waited_for_a_measurement_goes_in_together_before_the_next_measurement() -> None:
    """While another process measures: one evaluation asks for untimed work, then one for a
    measurement, then one for untimed work. When the first measurement ends both untimed holders go
    in at once, and the second measurement waits for both (in the order asked, the untimed work
    would alternate with measurements and barely overlap)."""
    device = f"test-{secrets.token_hex(4)}"
    code = ("import sys\nfrom cuda_agent.synth import device_lock\n"
            f"with device_lock.measuring({device!r}):\n    print('held', flush=True)\n    sys.stdin.read()\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        first, release_first, first_thread = _holder(lambda: device_lock.using(device))
        assert not first.wait(WAIT_S)  # the child measures
        measured, release_measure, measure_thread = _holder(lambda: device_lock.measuring(device))
        assert not measured.wait(WAIT_S)
        second, release_second, second_thread = _holder(lambda: device_lock.using(device))
        assert not second.wait(WAIT_S)
        child.stdin.close()
        assert first.wait(5) and second.wait(5)  # both at once, before the measurement asked for between them
        assert not measured.wait(WAIT_S)
        release_first.set()
        assert not measured.wait(WAIT_S)  # one untimed holder is left
        release_second.set()
        assert measured.wait(5)
        release_measure.set()
        for thread in (first_thread, second_thread, measure_thread):
            thread.join()
    finally:
        if not child.stdin.closed:
            child.stdin.close()
        assert child.wait(30) == 0
