"""The two-stage pool: compile threads -> bounded queue -> one thread per evaluation lane.

Jobs enter an unbounded inbox. Compile threads take them, fill the build cache (compilers run in
their own processes, on CPU cores, never on a GPU) and put them on a bounded queue; a full queue
pauses the compile stage, so builds run ahead of the GPUs by at most ``queue_size`` jobs. Each lane
thread owns one evaluation worker and takes one job at a time from that queue.

A worker that dies mid-job costs that job one attempt: the job goes back to the front of the queue
(any lane may take it) and the lane restarts its worker; after ``max_attempts`` the job is answered
with an error. Every job's future is set exactly once; nothing is dropped, not even on close.
Closing with ``cancel_pending`` (an interrupted run) also stops the jobs running on lanes at once,
answered with an error and never retried: a rerun judges them again.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from cuda_agent.environment import Status, Verdict
from cuda_agent.pool.base import EvalLane, EvalPool, JobRejected, LaneFailed, LaneStats, PoolClosed, PoolStats
from cuda_agent.pool.jobs import EvalJob, JobResult, JobStatus

logger = logging.getLogger(__name__)

LANE_START_ATTEMPTS = 3
"""Consecutive failures to start a lane's worker after which the lane is retired."""
NOT_STARTED = "the pool closed before this job started"
"""The error of a job answered without running because the pool closed first."""


@dataclass
class _Entry:
    job: EvalJob
    future: Future
    submitted_at: float
    attempts: int = 0


class _ReadyQueue:
    """Built jobs waiting for a lane. Fresh jobs wait while it is full (back-pressure on the compile
    stage); a retried job goes to the front at once (a lane never blocks on it). ``get`` ends (None)
    once the queue is closed, empty, and no lane is still running a job that might come back."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._items: deque[_Entry] = deque()
        self._running = 0
        self._closed = False
        self._cond = threading.Condition()

    def put(self, entry: _Entry) -> bool:
        """Append ``entry`` once there is room; False (not queued) if the queue is closed."""
        with self._cond:
            while len(self._items) >= self.maxsize and not self._closed:
                self._cond.wait()
            if self._closed:
                return False
            self._items.append(entry)
            self._cond.notify_all()
            return True

    def put_front(self, entry: _Entry) -> None:
        with self._cond:
            self._items.appendleft(entry)
            self._cond.notify_all()

    def get(self) -> _Entry | None:
        with self._cond:
            while not self._items and not (self._closed and self._running == 0):
                self._cond.wait()
            if not self._items:
                return None
            self._running += 1
            self._cond.notify_all()
            return self._items.popleft()

    def job_finished(self) -> None:
        with self._cond:
            self._running -= 1
            self._cond.notify_all()

    def take_all(self) -> list[_Entry]:
        with self._cond:
            items, self._items = list(self._items), deque()
            self._cond.notify_all()
            return items

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def __len__(self) -> int:
        return len(self._items)


@dataclass
class _LaneState:
    lane: EvalLane
    thread: threading.Thread | None = None
    alive: bool = False  # its worker is up
    retired: bool = False  # its worker could not be started again: the lane is gone for good
    started_once: bool = False
    jobs_done: int = 0
    restarts: int = 0
    current_job: str | None = None


class LanePipeline(EvalPool):
    """A pool over ``lanes`` with ``compile_workers`` threads running ``build(job)`` ahead of them.

    Args:
        backend: name reported in stats (``local``, ``ray``).
        lanes: the evaluation workers; each is started in, and used only from, its own thread.
        build: fills the build cache for a job; must not raise for the candidate's faults.
        compile_workers: compile threads (each build runs its compiler in a child process).
        queue_size: built jobs that may wait for a lane.
        max_attempts: evaluation attempts per job before it is answered with an error.
    """

    def __init__(self, backend: str, lanes: list[EvalLane], build: Callable[[EvalJob], None],
                 compile_workers: int, queue_size: int, max_attempts: int) -> None:
        if not lanes:
            raise ValueError("a pool needs at least one evaluation lane")
        self.backend = backend
        self._build = build
        self._max_attempts = max_attempts
        self._inbox: queue.Queue[_Entry | None] = queue.Queue()
        self._ready = _ReadyQueue(queue_size)
        self._lock = threading.Lock()
        self._accepting = True
        self._cancelled = False
        self._started_at = time.monotonic()
        self._counts = {"submitted": 0, "answered": 0, "failed": 0, "retried": 0, "building": 0}
        self._retired_error: str | None = None
        self._building: dict[str, list[_Entry]] = {}  # sources' content hash -> jobs waiting on that build
        self._lanes = [_LaneState(lane) for lane in lanes]
        self._compile_threads = [threading.Thread(target=self._compile_loop, name=f"compile-{i}", daemon=True)
                                 for i in range(max(1, compile_workers))]
        for state in self._lanes:
            state.thread = threading.Thread(target=self._lane_loop, args=(state,), name=f"lane-{state.lane.name}",
                                            daemon=True)
        for thread in [*self._compile_threads, *(s.thread for s in self._lanes)]:
            thread.start()

    # -- interface -----------------------------------------------------------------------------
    def submit(self, job: EvalJob) -> Future[JobResult]:
        future: Future[JobResult] = Future()
        future.set_running_or_notify_cancel()  # not cancellable: every job is answered, exactly once
        with self._lock:
            if not self._accepting:
                raise PoolClosed(f"the {self.backend} pool is closed; job {job.job_id!r} was not accepted")
            self._counts["submitted"] += 1
            self._inbox.put(_Entry(job, future, time.monotonic()))
        return future

    def stats(self) -> PoolStats:
        lanes = tuple(LaneStats(s.lane.name, s.alive, s.jobs_done, s.restarts, s.current_job, s.lane.describe())
                      for s in self._lanes)
        with self._lock:
            counts = dict(self._counts)
        return PoolStats(self.backend, counts["submitted"], counts["answered"], counts["failed"], counts["retried"],
                         self._inbox.qsize() + counts["building"], len(self._ready), lanes,
                         time.monotonic() - self._started_at)

    def close(self, cancel_pending: bool = False) -> None:
        with self._lock:
            if not self._accepting:
                return
            self._accepting = False
            self._cancelled = cancel_pending
        if cancel_pending:
            # Closed first: compile threads waiting for room in it (a lane interrupted below stops
            # taking jobs) get their jobs back, answered as not started, instead of waiting forever.
            self._ready.close()
            for entry in self._ready.take_all():
                self._answer_failed(entry, NOT_STARTED, "")
            for state in self._lanes:
                if state.current_job is not None:
                    state.lane.interrupt()
        for _ in self._compile_threads:
            self._inbox.put(None)
        for thread in self._compile_threads:
            thread.join()
        self._ready.close()
        for state in self._lanes:
            state.thread.join()

    # -- compile stage -------------------------------------------------------------------------
    def _compile_loop(self) -> None:
        """Build each job, except that a job whose sources are being built by another compile thread
        waits for that build without holding a thread (samples of one policy repeat often)."""
        while (entry := self._inbox.get()) is not None:
            try:
                sources = entry.job.solution.content_hash()
            except Exception as exc:  # noqa: BLE001 - a malformed job must not end this thread
                logger.exception("job %s cannot be built", entry.job.job_id)
                self._answer_failed(entry, f"the job's sources cannot be hashed ({type(exc).__name__}: {exc})", "")
                continue
            with self._lock:
                self._counts["building"] += 1
                if sources in self._building:
                    self._building[sources].append(entry)
                    continue
                self._building[sources] = [entry]
            try:
                if not self._cancelled:
                    self._build(entry.job)
            except Exception:  # noqa: BLE001 - the evaluation will meet (and report) the same problem
                logger.exception("building job %s failed in the compile stage", entry.job.job_id)
            with self._lock:
                built = self._building.pop(sources)
                self._counts["building"] -= len(built)
            for waiting in built:
                self._enqueue_built(waiting)

    def _enqueue_built(self, entry: _Entry) -> None:
        if self._cancelled:
            self._answer_failed(entry, NOT_STARTED, "")
        elif not self._ready.put(entry):  # closed early: every lane retired
            self._answer_failed(entry, self._retired_error or NOT_STARTED, "")

    # -- evaluation lanes ----------------------------------------------------------------------
    def _lane_loop(self, state: _LaneState) -> None:
        if not self._start_lane(state):
            return
        while (entry := self._ready.get()) is not None:
            try:
                self._run_on_lane(state, entry)
            finally:
                self._ready.job_finished()
            if not state.alive and (self._cancelled or not self._start_lane(state)):
                break
        state.lane.close()
        state.alive = False

    def _run_on_lane(self, state: _LaneState, entry: _Entry) -> None:
        if self._cancelled:  # taken just as the pool closed with cancel_pending
            self._answer_failed(entry, NOT_STARTED, state.lane.name)
            return
        entry.attempts += 1
        state.current_job = entry.job.job_id
        started = time.monotonic()
        try:
            verdict = state.lane.evaluate(entry.job)
        except LaneFailed as exc:
            state.alive = False
            self._try_again(state, entry, "the evaluation worker failed", str(exc), started)
        except JobRejected as exc:
            self._answer_failed(entry, str(exc), state.lane.name, started)
        except Exception as exc:  # noqa: BLE001 - a bug in a lane must still answer the job
            logger.exception("lane %s raised on job %s", state.lane.name, entry.job.job_id)
            self._answer_failed(entry, f"{type(exc).__name__}: {exc}", state.lane.name, started)
        else:
            if verdict.status is Status.INFRA_ERROR:  # a compiler or worker killed from outside: no verdict yet
                self._try_again(state, entry, "an infrastructure fault (infra_error) ended the evaluation",
                                verdict.error or "", started)
                return
            state.jobs_done += 1
            self._answer(entry, verdict, None, state.lane.name, started)
        finally:
            state.current_job = None

    def _try_again(self, state: _LaneState, entry: _Entry, what: str, detail: str, started: float) -> None:
        """An attempt that reached no verdict: queue the job again, or after ``max_attempts``
        answer it without a verdict (a harness failure is never the candidate's reward)."""
        if self._cancelled:  # interrupted by close(cancel_pending=True): not a fault to retry
            self._answer_failed(entry, "the pool closed during this job (the run was interrupted)", state.lane.name,
                                started)
            return
        with self._lock:
            self._counts["retried"] += 1
        logger.warning("lane %s, job %s (attempt %d of %d): %s: %s", state.lane.name, entry.job.job_id,
                       entry.attempts, self._max_attempts, what, detail)
        if entry.attempts < self._max_attempts:
            self._ready.put_front(entry)
        else:
            self._answer_failed(entry, f"{what} on all {entry.attempts} attempts; last: {detail}", state.lane.name,
                                started)

    def _start_lane(self, state: _LaneState) -> bool:
        """(Re)start the lane's worker; after ``LANE_START_ATTEMPTS`` failures in a row, retire it."""
        error = ""
        for attempt in range(LANE_START_ATTEMPTS):
            state.lane.close()
            try:
                state.lane.start()
            except Exception as exc:  # noqa: BLE001 - any failure to start is reported the same way
                logger.warning("lane %s could not start (attempt %d): %s", state.lane.name, attempt + 1, exc)
                error = f"{type(exc).__name__}: {exc}"
                time.sleep(min(2.0 ** attempt, 5.0))
                continue
            state.alive = True
            state.restarts += state.started_once
            state.started_once = True
            return True
        state.alive, state.retired = False, True
        self._retire_if_last(f"no evaluation worker could be started (lane {state.lane.name}: {error})")
        return False

    def _retire_if_last(self, error: str) -> None:
        if not all(s.retired for s in self._lanes):
            return
        self._retired_error = error
        self._ready.close()
        for entry in self._ready.take_all():
            self._answer_failed(entry, error, "")

    # -- answers -------------------------------------------------------------------------------
    def _answer(self, entry: _Entry, verdict: Verdict | None, error: str | None, worker: str,
                started: float | None = None) -> None:
        now = time.monotonic()
        started = now if started is None else started
        result = JobResult(entry.job.job_id, JobStatus.DONE if verdict is not None else JobStatus.FAILED, verdict,
                           error, worker, entry.attempts, started - entry.submitted_at, now - started)
        with self._lock:
            self._counts["answered"] += 1
            self._counts["failed"] += verdict is None
        entry.future.set_result(result)  # raises if this job were ever answered twice

    def _answer_failed(self, entry: _Entry, error: str, worker: str, started: float | None = None) -> None:
        self._answer(entry, None, error, worker, started)
