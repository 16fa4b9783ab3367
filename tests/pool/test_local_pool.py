"""The local pool under load and under worker deaths: every job is answered exactly once.

Cheap jobs go the whole real path (compile stage -> bounded queue -> worker process ->
``evaluate()``): most are candidates the static guards reject (answered in milliseconds by the
worker), a few are honest evaluations from the shared build cache, long enough to kill a worker
in the middle of one.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from cuda_agent.environment import Status, load_task
from cuda_agent.pool import EvalJob, JobStatus, PoolConfig, PoolConfigError, SolutionFiles, open_pool
from cuda_agent.pool.local import _lane_slots
from cuda_agent.pool.pipeline import NOT_STARTED

from support import SMALL_RELU_TASK, child_pids

_GUARDED = '''import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):  # variant {index}: a torch fallback, rejected by the static guards
    def forward(self, x):
        return F.relu(x)
'''


def _guarded(index: int) -> SolutionFiles:
    return SolutionFiles.from_mapping({"model_new.py": _GUARDED.format(index=index)})


def _kill_worker_running(pool, job_prefix: str, timeout_s: float = 600) -> str:
    """SIGKILL the worker process of the first lane seen running a job whose id starts with
    ``job_prefix``; return that job's id."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for lane in pool.stats().lanes:
            if (lane.current_job or "").startswith(job_prefix) and lane.detail.get("pid"):
                os.kill(lane.detail["pid"], signal.SIGKILL)
                return lane.current_job
        time.sleep(0.02)
    raise AssertionError(f"no lane ran a {job_prefix!r} job within {timeout_s} s")


def test_two_workers_answer_200_jobs_exactly_once_when_one_is_killed_mid_job(make_config, fault_solution,
                                                                             tmp_path: Path) -> None:
    task = load_task(SMALL_RELU_TASK)
    honest = SolutionFiles.from_path(fault_solution("relu_ok"))
    honest_at = {10, 90, 170}
    jobs = [EvalJob(f"honest-{i}" if i in honest_at else f"guarded-{i}", task, honest if i in honest_at else _guarded(i))
            for i in range(200)]
    answers: Counter[str] = Counter()
    with open_pool(make_config(), PoolConfig(workers=2, staging_dir=tmp_path / "staged")) as pool:
        futures = {}
        for job in jobs:
            futures[job.job_id] = pool.submit(job)
            futures[job.job_id].add_done_callback(lambda _, job_id=job.job_id: answers.update([job_id]))
        killed = _kill_worker_running(pool, "honest-")
        results = {job_id: future.result(timeout=900) for job_id, future in futures.items()}
        stats = pool.stats()
    assert answers == Counter({job.job_id: 1 for job in jobs})
    assert all(r.status is JobStatus.DONE for r in results.values()), [r.error for r in results.values() if r.error]
    statuses = Counter(r.verdict.status for r in results.values())
    assert statuses == {Status.GUARD_VIOLATION: 197, Status.CORRECT: 3}
    assert results[killed].attempts == 2 and results[killed].verdict.status is Status.CORRECT
    assert all(results[f"honest-{i}"].verdict.environment["prestarted"] for i in honest_at)  # the CPU default: 1
    assert sum(r.attempts for r in results.values()) == 201
    assert stats.submitted == stats.answered == 200 and stats.failed == 0 and stats.retried == 1
    assert sorted(lane.restarts for lane in stats.lanes) == [0, 1]
    assert {r.worker for r in results.values()} == {"cpu:0", "cpu:1"}
    assert child_pids() == [], "the pool left worker processes behind"


def test_a_job_whose_every_attempt_loses_its_worker_is_answered_with_an_error(make_config, fault_solution,
                                                                               tmp_path: Path) -> None:
    task = load_task(SMALL_RELU_TASK)
    job = EvalJob("honest-once", task, SolutionFiles.from_path(fault_solution("relu_ok")))
    with open_pool(make_config(), PoolConfig(workers=1, max_attempts=1, staging_dir=tmp_path / "staged")) as pool:
        future = pool.submit(job)
        _kill_worker_running(pool, "honest-")
        result = future.result(timeout=600)
        after = pool.submit(EvalJob("after", task, _guarded(0))).result(timeout=600)  # the lane restarted
    assert result.status is JobStatus.FAILED and result.verdict is None
    assert "failed on all 1 attempts" in result.error and "SIGKILL" in result.error
    assert after.status is JobStatus.DONE and after.verdict.status is Status.GUARD_VIOLATION
    assert child_pids() == []


def test_prestart_slots_reaches_the_lanes_and_zero_starts_each_evaluations_workers_itself(
        make_config, fault_solution, tmp_path: Path) -> None:
    job = EvalJob("honest", load_task(SMALL_RELU_TASK), SolutionFiles.from_path(fault_solution("relu_ok")))
    with open_pool(make_config(), PoolConfig(workers=1, prestart_slots=0, staging_dir=tmp_path / "staged")) as pool:
        result = pool.submit(job).result(timeout=600)
    assert result.verdict.status is Status.CORRECT, result.verdict.error
    assert result.verdict.environment["prestarted"] is False


def test_closing_with_cancel_answers_jobs_not_yet_started(make_config, tmp_path: Path) -> None:
    task = load_task(SMALL_RELU_TASK)
    pool = open_pool(make_config(), PoolConfig(workers=1, staging_dir=tmp_path / "staged"))
    futures = [pool.submit(EvalJob(f"guarded-{i}", task, _guarded(i))) for i in range(50)]
    pool.close(cancel_pending=True)
    results = [f.result(timeout=60) for f in futures]
    assert all(r.status is JobStatus.DONE or "closed before this job started" in r.error for r in results)
    assert any(r.status is JobStatus.FAILED for r in results)  # the worker was still starting
    assert child_pids() == []


def test_cancelling_while_a_lane_runs_and_builds_wait_for_room_closes_at_once(make_config, fault_solution,
                                                                              tmp_path: Path) -> None:
    """The interrupted lane stops taking jobs while compile threads wait for room in the full
    ready queue (2 places, 12 jobs): they must give their jobs up, not wait forever (an interrupted
    ``tasks check`` of 40 tasks on one GPU once hung here until SIGKILL)."""
    task = load_task(SMALL_RELU_TASK)
    honest = SolutionFiles.from_path(fault_solution("relu_ok"))
    pool = open_pool(make_config(), PoolConfig(workers=1, compile_workers=4, queue_size=2,
                                               staging_dir=tmp_path / "staged"))
    futures = [pool.submit(EvalJob("honest-0", task, honest))]
    deadline = time.monotonic() + 300
    while pool.stats().lanes[0].current_job != "honest-0":
        assert time.monotonic() < deadline, pool.stats()
        time.sleep(0.02)
    futures += [pool.submit(EvalJob(f"guarded-{i}", task, _guarded(i))) for i in range(11)]
    while pool.stats().waiting < 2:  # guarded jobs need no build: the queue fills at once
        assert pool.stats().lanes[0].current_job == "honest-0", pool.stats()
        time.sleep(0.02)
    time.sleep(0.5)  # the other compile threads wait for room
    closing = threading.Thread(target=pool.close, kwargs={"cancel_pending": True}, daemon=True)
    started = time.monotonic()
    closing.start()
    closing.join(timeout=60)
    assert not closing.is_alive(), "close(cancel_pending=True) waited on compile threads stuck on a full queue"
    assert time.monotonic() - started < 30
    results = [f.result(timeout=5) for f in futures]
    assert all(r.status is JobStatus.FAILED for r in results)
    assert "interrupted" in results[0].error and all(NOT_STARTED in r.error for r in results[1:])
    assert child_pids() == []


def test_cuda_pool_needs_a_visible_gpu_and_at_most_one_worker_per_gpu(make_config, monkeypatch) -> None:
    config = make_config(device="cuda")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(PoolConfigError, match="no GPU is visible"):
        open_pool(config, PoolConfig())
    with pytest.raises(PoolConfigError, match="at most lanes_per_gpu workers per GPU"):
        open_pool(config, PoolConfig(gpus=("0", "1"), workers=3))


def test_lanes_per_gpu_gives_each_gpu_that_many_lanes_taken_in_turn(make_config) -> None:
    config = make_config(device="cuda")
    assert _lane_slots(config, PoolConfig(gpus=("0", "1"), lanes_per_gpu=2)) == [
        ("cuda:0", "0"), ("cuda:1", "1"), ("cuda:0.1", "0"), ("cuda:1.1", "1")]
    assert _lane_slots(config, PoolConfig(gpus=("0", "1"), lanes_per_gpu=2, workers=3)) == [
        ("cuda:0", "0"), ("cuda:1", "1"), ("cuda:0.1", "0")]
    with pytest.raises(PoolConfigError, match="pool.workers is 5 .* with pool.lanes_per_gpu 2"):
        _lane_slots(config, PoolConfig(gpus=("0", "1"), lanes_per_gpu=2, workers=5))
    with pytest.raises(PoolConfigError, match="pool.lanes_per_gpu is for device 'cuda'"):
        _lane_slots(make_config(), PoolConfig(lanes_per_gpu=2))


def test_pool_config_names_the_bad_field() -> None:
    with pytest.raises(PoolConfigError, match="pool.backend must be one of local, ray, service"):
        PoolConfig(backend="slurm")
    with pytest.raises(PoolConfigError, match="pool.address"):
        PoolConfig(backend="service")
    with pytest.raises(PoolConfigError, match="pool.lanes_per_gpu must be >= 1, got 0"):
        PoolConfig(lanes_per_gpu=0)
    with pytest.raises(PoolConfigError, match="pool.lanes_per_gpu is for backend 'local'"):
        PoolConfig(backend="ray", lanes_per_gpu=2)
    with pytest.raises(PoolConfigError, match=r"pool.prestart_slots must be >= 0 \(or unset for the default\), got -1"):
        PoolConfig(prestart_slots=-1)
