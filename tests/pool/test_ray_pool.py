"""The Ray backend on a local Ray instance and the CPU backend: the same pool work runs in actors
(one honest evaluation from the shared build cache, one static-guard rejection)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuda_agent.environment import Status, load_task
from cuda_agent.pool import EvalJob, JobStatus, PoolConfig, SolutionFiles, open_pool

from support import SMALL_RELU_TASK

ray = pytest.importorskip("ray")

GUARDED = ("import torch.nn as nn\nimport torch.nn.functional as F\n\n\nclass ModelNew(nn.Module):\n"
           "    def forward(self, x):\n        return F.relu(x)\n")


@pytest.fixture()
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_actors_evaluate_jobs_like_local_workers(local_ray, make_config, fault_solution, tmp_path: Path) -> None:
    task = load_task(SMALL_RELU_TASK)
    jobs = [EvalJob("honest", task, SolutionFiles.from_path(fault_solution("relu_ok"))),
            EvalJob("guarded", task, SolutionFiles.from_mapping({"model_new.py": GUARDED}))]
    with open_pool(make_config(), PoolConfig(backend="ray", workers=1, staging_dir=tmp_path / "staged")) as pool:
        results = {r.job_id: r for r in pool.run(jobs)}
        stats = pool.stats()
    assert all(r.status is JobStatus.DONE for r in results.values()), [r.error for r in results.values()]
    assert results["honest"].verdict.status is Status.CORRECT and results["honest"].verdict.reward >= 1
    assert results["guarded"].verdict.status is Status.GUARD_VIOLATION
    assert {r.worker for r in results.values()} == {"ray:0"}
    assert stats.backend == "ray" and stats.answered == 2 and stats.lanes[0].detail["pid"] > 0
