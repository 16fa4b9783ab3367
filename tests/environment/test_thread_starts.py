"""thread_starts.ThreadStartLog: whether a thread outlived a call is read from the stamps the thread
itself leaves, so it does not depend on when the check runs."""

from __future__ import annotations

import _thread
import time

import pytest

from cuda_agent.environment.thread_starts import ThreadStartLog


def _started(log: ThreadStartLog, function) -> _thread.LockType:
    """Start ``function`` in a stamped thread; the returned lock is released once the span is stamped."""
    finished = _thread.allocate_lock()
    finished.acquire()

    def start_and_signal(target, args):
        def signalling() -> None:
            try:
                target(*args)
            finally:
                finished.release()

        return _thread.start_new_thread(signalling, ())

    log.stamping(start_and_signal)(function, ())
    return finished


def test_a_thread_that_ended_after_the_call_returned_outlived_it_whenever_it_is_checked() -> None:
    log = ThreadStartLog()
    called = time.perf_counter_ns()
    finished = _started(log, lambda: time.sleep(0.02))
    returned = time.perf_counter_ns()
    assert log.outlived(called, returned)  # still running
    finished.acquire()
    assert log.outlived(called, returned)  # ended since: the stamps still say it outlived the call


def test_a_thread_that_ended_before_the_call_returned_did_not_outlive_it() -> None:
    log = ThreadStartLog()
    called = time.perf_counter_ns()
    _started(log, lambda: None).acquire()
    assert not log.outlived(called, time.perf_counter_ns())


def test_threads_started_before_the_call_are_not_its_own() -> None:
    log = ThreadStartLog()
    finished = _started(log, lambda: time.sleep(0.02))
    called = time.perf_counter_ns()
    assert not log.outlived(called, time.perf_counter_ns())
    finished.acquire()


def test_a_start_that_fails_leaves_no_running_thread() -> None:
    log = ThreadStartLog()

    def refuse(function, args):
        raise RuntimeError("can't start new thread")

    called = time.perf_counter_ns()
    with pytest.raises(RuntimeError, match="can't start new thread"):
        log.stamping(refuse)(lambda: None, ())
    assert not log.outlived(called, time.perf_counter_ns())
