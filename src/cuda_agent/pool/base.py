"""The pool interface every backend implements, and the lane interface of lane-based backends.

A pool takes jobs and answers each exactly once with a :class:`JobResult` (a verdict, or the
reason the harness could not reach one). ``cuda-agent eval``, the service, the agent runner and the
throughput benchmark all talk to this interface only.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, as_completed
from dataclasses import dataclass, field
from typing import Any

from cuda_agent.environment import Verdict
from cuda_agent.pool.jobs import EvalJob, JobResult


class PoolClosed(RuntimeError):
    """A job was submitted to a pool that is closing or closed."""


@dataclass(frozen=True)
class LaneStats:
    """One evaluation worker, as seen by the pool."""

    name: str
    alive: bool
    jobs_done: int
    restarts: int
    current_job: str | None
    detail: dict[str, Any] = field(default_factory=dict)  # pid, GPU, actor id: whatever the lane knows


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of a pool: queues, lanes and totals since it started."""

    backend: str
    submitted: int
    answered: int
    failed: int  # answered without a verdict
    retried: int  # attempts lost to worker deaths
    compiling: int  # jobs in the compile stage (queued or building)
    waiting: int  # built jobs waiting for an evaluation worker
    lanes: tuple[LaneStats, ...]
    uptime_s: float

    def to_json_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "submitted": self.submitted, "answered": self.answered,
                "failed": self.failed, "retried": self.retried, "compiling": self.compiling,
                "waiting": self.waiting, "uptime_s": self.uptime_s,
                "lanes": [vars(lane) for lane in self.lanes]}


class EvalPool(abc.ABC):
    """Evaluates jobs concurrently. Use as a context manager, or call :meth:`close`."""

    @abc.abstractmethod
    def submit(self, job: EvalJob) -> Future[JobResult]:
        """Queue ``job``; the future resolves to its one answer (it never raises).

        Raises:
            PoolClosed: the pool no longer accepts jobs.
        """

    @abc.abstractmethod
    def stats(self) -> PoolStats:
        """Current queues, lanes and totals."""

    @abc.abstractmethod
    def close(self, cancel_pending: bool = False) -> None:
        """Stop the workers after the jobs already submitted are answered; with ``cancel_pending``,
        answer the ones not yet started with an error instead of running them."""

    def run(self, jobs: Iterable[EvalJob]) -> Iterator[JobResult]:
        """Submit ``jobs`` and yield their results in the order they finish."""
        futures = [self.submit(job) for job in jobs]
        for future in as_completed(futures):
            yield future.result()

    def __enter__(self) -> "EvalPool":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(cancel_pending=exc_type is not None)


class LaneFailed(RuntimeError):
    """The lane's worker died or stopped answering during a job: the job may be retried elsewhere,
    and the lane must be restarted before its next job."""


class JobRejected(RuntimeError):
    """The worker ran the job and could not produce a verdict for a reason that would repeat on any
    worker (a harness bug, an impossible configuration): answered at once, not retried."""


class EvalLane(abc.ABC):
    """One evaluation slot of a lane-based pool (a worker process on one GPU, a Ray actor): it runs
    one job at a time, so timings on its device never overlap."""

    name: str

    @abc.abstractmethod
    def start(self) -> None:
        """Start (or restart) the worker. Called from the lane's own thread."""

    @abc.abstractmethod
    def evaluate(self, job: EvalJob) -> Verdict:
        """Run one job to its verdict.

        Raises:
            LaneFailed: the worker died or hung (it is dead afterwards).
            JobRejected: the worker answered with an error that would repeat anywhere.
        """

    @abc.abstractmethod
    def interrupt(self) -> None:
        """Stop the job running now, from another thread (an interrupted run): :meth:`evaluate`
        then raises ``LaneFailed`` in the lane's thread, which closes the lane."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop the worker and release what it holds (idempotent)."""

    def describe(self) -> dict[str, Any]:
        """Details for :class:`LaneStats` (a pid, a GPU)."""
        return {}
