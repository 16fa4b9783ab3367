"""On the GPU: two pool lanes share one GPU (``pool.lanes_per_gpu``): every self-check verdict is
correct and says the GPU was shared, and each compiled its baseline (for TF32 off and on) without
holding the GPU."""

from __future__ import annotations

import secrets
from dataclasses import replace
from pathlib import Path

import pytest
from cuda_agent.environment import Status, load_task
from cuda_agent.pool import EvalJob, JobStatus, PoolConfig, SolutionFiles, open_pool
from cuda_agent.pool.local import visible_gpus

from support import EXAMPLES, FAST_TIMING, child_pids

pytestmark = pytest.mark.gpu

RELU_TASK = EXAMPLES / "tasks" / "relu.py"


def test_two_lanes_share_one_gpu_and_judge_every_self_check(make_cuda_config, tmp_path: Path) -> None:
    config = make_cuda_config(cache_dir=tmp_path / "cache", timing=replace(FAST_TIMING, compile_baseline=True))
    config = config.replace(guards=replace(config.guards, enabled=False),
                            verify=replace(config.verify, require_extension_call=False))
    jobs = []
    for index in range(6):  # a task hash each: every verdict compiles and times its baselines
        folder = tmp_path / f"task{index}"
        folder.mkdir()
        (folder / "model.py").write_text(RELU_TASK.read_text() + f"\n# {secrets.token_hex(8)}\n")
        task = load_task(folder / "model.py")
        solution = SolutionFiles.from_mapping({"model_new.py": task.code + "\n\nclass ModelNew(Model):\n    pass\n"})
        jobs.append(EvalJob(f"relu-{index}", task, solution))
    gpu = visible_gpus()[0]
    with open_pool(config, PoolConfig(gpus=(gpu,), lanes_per_gpu=2, staging_dir=tmp_path / "staged")) as pool:
        results = [future.result(timeout=600) for future in [pool.submit(job) for job in jobs]]
    assert all(r.status is JobStatus.DONE for r in results), [r.error for r in results]
    assert [r.verdict.status for r in results] == [Status.CORRECT] * 6, [r.verdict.error for r in results]
    assert {r.worker for r in results} == {f"cuda:{gpu}", f"cuda:{gpu}.1"}
    for result in results:
        verdict = result.verdict
        assert verdict.environment["device_shared"] == "2 evaluations at once" and set(verdict.device_seconds) == {"wait", "measure", "use"}
        turns = [(turn["phase"], turn["mode"]) for turn in verdict.device_turns]
        prestarted = [("slot_warm", "use")] if verdict.environment["prestarted"] else []  # made its contexts
        assert turns == [*prestarted, ("prepare", "use"), ("baselines", "measure"), ("load", "use"),
                         ("profile", "measure"), ("post_timing", "use")]
        assert set(verdict.baseline_sources.values()) == {"timed"}
        assert "compile_unheld" in verdict.baseline_seconds  # code generation ran without the GPU held,
        assert verdict.baseline_seconds["compile"] < 0.05  # for both TF32 settings: nothing left to compile
    assert child_pids() == []
