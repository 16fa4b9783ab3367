"""A pool whose evaluations run in a remote ``cuda-agent serve``: ``cuda-agent eval --backend
service --address URL`` sends a benchmark to GPU machines elsewhere, and anything written against
``EvalPool`` can do the same.

Each job is submitted at once (the service queues it durably); a thread per job in flight then
long-polls for its answer. Network trouble is retried; a job that cannot be submitted, or whose
answer cannot be fetched, is answered with an error, never dropped.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from cuda_agent.pool.base import EvalPool, PoolClosed, PoolStats
from cuda_agent.pool.config import PoolConfig, PoolConfigError
from cuda_agent.pool.jobs import EvalJob, JobResult, JobStatus

logger = logging.getLogger(__name__)

DEFAULT_IN_FLIGHT = 64
NETWORK_RETRIES = 5


class ServicePool(EvalPool):
    """Evaluates jobs through ``pool_config.address`` (a ``cuda-agent serve`` URL)."""

    def __init__(self, pool_config: PoolConfig) -> None:
        import httpx

        from cuda_agent.serve.client import EvalClient, EvalServiceError

        self._network_errors = (httpx.HTTPError, EvalServiceError)
        self._client = EvalClient(pool_config.address, pool_config.token)
        try:
            self._client.metrics()  # reachable, and the token is accepted
        except self._network_errors as exc:
            self._client.close()
            raise PoolConfigError(f"pool.address {pool_config.address}: the service is not usable ({exc})") from None
        self._waiters = ThreadPoolExecutor(max_workers=pool_config.workers or DEFAULT_IN_FLIGHT,
                                           thread_name_prefix="service-wait")
        self._lock = threading.Lock()
        self._open: dict[str, tuple[EvalJob, Future[JobResult], float]] = {}
        self._counts = {"submitted": 0, "answered": 0, "failed": 0, "retried": 0}
        self._accepting = True
        self._started = time.monotonic()

    def submit(self, job: EvalJob) -> Future[JobResult]:
        from cuda_agent.serve.client import job_request

        future: Future[JobResult] = Future()
        future.set_running_or_notify_cancel()
        with self._lock:
            if not self._accepting:
                raise PoolClosed(f"the service pool is closed; job {job.job_id!r} was not accepted")
            self._counts["submitted"] += 1
            self._open[job.job_id] = (job, future, time.monotonic())
        request = job_request(job.task.code, solution_files=job.solution.to_json_dict(), task_id=job.task.id)
        try:
            remote_id = self._with_retries(lambda: self._client.submit(request))
        except self._network_errors as exc:
            self._answer_failed(job.job_id, f"the service did not accept the job: {exc}")
            return future
        self._waiters.submit(self._await, job.job_id, remote_id)
        return future

    def _with_retries(self, call):
        for attempt in range(NETWORK_RETRIES):
            try:
                return call()
            except self._network_errors as exc:
                if getattr(exc, "status_code", 500) < 500 or attempt == NETWORK_RETRIES - 1:
                    raise
                with self._lock:
                    self._counts["retried"] += 1
                logger.warning("service request failed (attempt %d): %s", attempt + 1, exc)
                time.sleep(min(2.0 ** attempt, 10.0))

    def _await(self, job_id: str, remote_id: str) -> None:
        try:
            remote = self._with_retries(lambda: self._client.wait(remote_id))
        except self._network_errors as exc:
            self._answer_failed(job_id, f"the answer of remote job {remote_id} could not be fetched: {exc}")
            return
        self._answer(JobResult.from_json_dict(remote.result, job_id=job_id))

    def _answer(self, result: JobResult) -> None:
        with self._lock:
            entry = self._open.pop(result.job_id, None)
            if entry is None:  # answered already (the pool closed with cancel_pending)
                return
            self._counts["answered"] += 1
            self._counts["failed"] += not result.ok
        entry[1].set_result(result)

    def _answer_failed(self, job_id: str, error: str) -> None:
        started = self._open.get(job_id, (None, None, time.monotonic()))[2]
        self._answer(JobResult(job_id, JobStatus.FAILED, None, error, "", 0, time.monotonic() - started, 0.0))

    def stats(self) -> PoolStats:
        with self._lock:
            counts = dict(self._counts)
            waiting = len(self._open)
        return PoolStats("service", counts["submitted"], counts["answered"], counts["failed"], counts["retried"], 0,
                         waiting, (), time.monotonic() - self._started)

    def close(self, cancel_pending: bool = False) -> None:
        with self._lock:
            self._accepting = False
            open_jobs = list(self._open)
        if cancel_pending:
            for job_id in open_jobs:  # they go on running in the service; their answers are not awaited
                self._answer_failed(job_id, "the pool closed before this job was answered")
        self._waiters.shutdown(wait=not cancel_pending, cancel_futures=cancel_pending)
        self._client.close()
