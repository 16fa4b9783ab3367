"""Client of ``cuda-agent serve`` for trainers and scripts (the verl reward function uses it).

Only ``httpx`` is needed: this module imports neither the web framework nor torch, so it loads
fast in a trainer's reward workers. Verdicts come back as their JSON form (``Verdict.to_json_dict``,
the ``verify --json`` contract)::

    from cuda_agent.serve.client import EvalClient
    with EvalClient("http://gpu-host:8000", token=TOKEN) as client:
        verdict = client.evaluate(task_code, solution_code=candidate_source)
        reward = verdict["reward"]
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

DEFAULT_WAIT_S = 600.0
POLL_WAIT_S = 30.0
"""Each long-poll asks the service to hold the request this long before answering "not yet"."""
SUBMIT_ATTEMPTS = 3
"""Tries of one submission when the connection fails; each carries the same ``Idempotency-Key``, so
a submission the service stored before the connection broke is not stored twice."""


class EvalServiceError(RuntimeError):
    """The service answered with an error status; ``status_code`` and ``detail`` say which and why."""

    def __init__(self, status_code: int, detail: Any) -> None:
        super().__init__(f"HTTP {status_code}: {detail}")
        self.status_code = status_code
        self.detail = detail


@dataclass(frozen=True)
class RemoteJob:
    """A job as the service reports it. ``result`` is the pool's answer once the job is finished:
    ``{"status": "done"|"failed", "verdict": {...} | None, "error", "worker", "attempts", ...}``."""

    job_id: str
    state: str  # queued | running | done | failed
    result: dict[str, Any] | None

    @property
    def finished(self) -> bool:
        return self.result is not None

    @property
    def verdict(self) -> dict[str, Any] | None:
        return None if self.result is None else self.result.get("verdict")


def job_request(task_code: str, *, solution_files: Mapping[str, str] | None = None, solution_code: str | None = None,
                solution_path: str | Path | None = None, task_id: str | None = None) -> dict[str, Any]:
    """The JSON body of one job: the task's source and the solution as files, one source string, or
    a path (a single ``.py`` or a workdir, read here)."""
    if sum(x is not None for x in (solution_files, solution_code, solution_path)) != 1:
        raise ValueError("give exactly one of solution_files, solution_code or solution_path")
    if solution_path is not None:
        from cuda_agent.pool.jobs import SolutionFiles

        solution_files = SolutionFiles.from_path(solution_path).to_json_dict()
    body: dict[str, Any] = {"task_code": task_code}
    if task_id is not None:
        body["task_id"] = task_id
    if solution_files is not None:
        body["solution_files"] = dict(solution_files)
    else:
        body["solution_code"] = solution_code
    return body


class EvalClient:
    """Synchronous client; thread-safe (one connection pool). Use as a context manager or ``close()``.

    Args:
        base_url: the service, e.g. ``http://gpu-host:8000``.
        token: its bearer token (None for a service started with ``--allow-anonymous``).
        timeout_s: network timeout of one request beyond the time the service is asked to wait.
    """

    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 60.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout_s = timeout_s
        self._http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s,
                                  transport=transport)

    def __enter__(self) -> "EvalClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, wait_s: float = 0.0, **kwargs) -> dict[str, Any]:
        response = self._http.request(method, path, timeout=self.timeout_s + wait_s, **kwargs)
        return self._decode(response)

    def _submit(self, path: str, wait_s: float = 0.0, **kwargs) -> dict[str, Any]:
        """POST a submission, retried on connection failures under one idempotency key."""
        headers = {"Idempotency-Key": uuid.uuid4().hex}
        for attempt in range(1, SUBMIT_ATTEMPTS):
            try:
                return self._decode(self._http.post(path, timeout=self.timeout_s + wait_s, headers=headers, **kwargs))
            except httpx.TransportError:
                time.sleep(attempt)
        return self._decode(self._http.post(path, timeout=self.timeout_s + wait_s, headers=headers, **kwargs))

    @staticmethod
    def _decode(response: httpx.Response) -> dict[str, Any]:
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            raise EvalServiceError(response.status_code, detail)
        return response.json()

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/v1/health")

    def metrics(self) -> dict[str, Any]:
        return self._call("GET", "/v1/metrics")

    def submit(self, request: dict[str, Any]) -> str:
        """Queue one job (a :func:`job_request` body); returns its id."""
        return self._submit("/v1/jobs", json=request)["job_id"]

    def submit_batch(self, requests: list[dict[str, Any]]) -> list[str]:
        """Queue many jobs in one request (all accepted, or none); returns their ids in order."""
        return self._submit("/v1/jobs/batch", json={"jobs": requests})["job_ids"]

    def get(self, job_id: str, wait_s: float = 0.0) -> RemoteJob:
        """The job's state; with ``wait_s``, the service holds the request until the job finishes or
        ``wait_s`` passes."""
        data = self._call("GET", f"/v1/jobs/{job_id}", wait_s, params={"wait_s": wait_s})
        return RemoteJob(data["job_id"], data["state"], data["result"])

    def wait(self, job_id: str, timeout_s: float | None = None) -> RemoteJob:
        """Long-poll until the job finishes.

        Raises:
            TimeoutError: not finished after ``timeout_s``.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            remaining = POLL_WAIT_S if deadline is None else min(POLL_WAIT_S, deadline - time.monotonic())
            if remaining <= 0:
                raise TimeoutError(f"job {job_id} not finished after {timeout_s} s")
            job = self.get(job_id, wait_s=remaining)
            if job.finished:
                return job

    def evaluate(self, task_code: str, *, solution_files: Mapping[str, str] | None = None,
                 solution_code: str | None = None, solution_path: str | Path | None = None,
                 task_id: str | None = None, timeout_s: float | None = DEFAULT_WAIT_S) -> RemoteJob:
        """Submit one job and wait for its answer (``.verdict`` holds the verdict JSON; None when the
        harness could not reach one, with ``.result["error"]`` saying why)."""
        body = job_request(task_code, solution_files=solution_files, solution_code=solution_code,
                           solution_path=solution_path, task_id=task_id)
        first_wait = POLL_WAIT_S if timeout_s is None else min(timeout_s, DEFAULT_WAIT_S)
        data = self._submit("/v1/evaluate", first_wait, params={"wait_s": first_wait}, json=body)
        job = RemoteJob(data["job_id"], data["state"], data["result"])
        if job.finished:
            return job
        return self.wait(job.job_id, None if timeout_s is None else max(0.0, timeout_s - first_wait))
