"""When each Python thread started by candidate code began and ended (runtime guard ``thread-left-running``).

Counting live threads after a call races with the thread: deferred work that finishes in the moment
between the call's return and the count goes unseen, and under load it did. So before any candidate
code is imported the candidate worker wraps the interpreter's thread-start functions; every thread
started afterwards stamps when it started and when its function returned, on the clock the timers
stop on (``time.perf_counter_ns``). Whether a thread outlived a call is then read from the stamps,
whatever the scheduler did in between.
"""

from __future__ import annotations

import _thread
import threading
import time
from typing import Any, Callable

START_FUNCTIONS = ((_thread, "start_new_thread"), (threading, "_start_new_thread"),
                   (_thread, "start_joinable_thread"), (threading, "_start_joinable_thread"))
"""Where threads are started from Python: ``_thread`` itself, and ``threading``'s own references to
it (``_start_new_thread`` up to Python 3.12, ``_start_joinable_thread`` from 3.13)."""


class ThreadStartLog:
    """``[started_ns, ended_ns or None]`` of every thread started after :meth:`install`."""

    def __init__(self) -> None:
        self._spans: list[list[int | None]] = []
        self._lock = _thread.allocate_lock()

    def install(self) -> None:
        """Wrap every thread-start function this interpreter has (candidate worker only)."""
        for module, name in START_FUNCTIONS:
            start = getattr(module, name, None)
            if start is not None:
                setattr(module, name, self.stamping(start))

    def stamping(self, start: Callable[..., Any]) -> Callable[..., Any]:
        """``start`` (a thread-start function) with the new thread's function stamping its span."""

        def start_stamped(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            span: list[int | None] = [time.perf_counter_ns(), None]
            with self._lock:
                self._spans.append(span)

            def run(*run_args: Any, **run_kwargs: Any) -> Any:
                try:
                    return function(*run_args, **run_kwargs)
                finally:
                    span[1] = time.perf_counter_ns()

            try:
                return start(run, *args, **kwargs)
            except BaseException:
                span[1] = span[0]  # no thread started
                raise

        return start_stamped

    def outlived(self, since_ns: int, returned_ns: int) -> bool:
        """Whether a thread started at or after ``since_ns`` and before ``returned_ns`` was still
        running at ``returned_ns`` (its span ends later, or has not ended yet)."""
        with self._lock:
            return any(since_ns <= started <= returned_ns and (ended is None or ended > returned_ns)
                       for started, ended in self._spans)
