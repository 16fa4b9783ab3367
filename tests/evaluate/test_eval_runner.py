"""Resuming a run: which tasks are evaluated again (none that has a result for the same solution)."""

from __future__ import annotations

import time
from pathlib import Path

from cuda_agent.evaluate import ResultsStore, load_task_set, match_solutions
from cuda_agent.evaluate.runner import plan_run, still_to_do, write_selfcheck_solutions
from cuda_agent.evaluate.store import HARNESS_ERROR, ResultRecord

from support import SMALL_RELU_TASK


def _record(plan, status: str) -> ResultRecord:
    return ResultRecord(plan.task.key, None, plan.task.origin, str(plan.solution), plan.solution_hash, status,
                        status == "correct", None, None, "cpu:0", 1, 1.0, time.time())


def test_resume_skips_finished_tasks_but_not_changed_solutions_or_harness_errors(tmp_path: Path) -> None:
    tasks, solutions = tmp_path / "tasks", tmp_path / "solutions"
    tasks.mkdir()
    solutions.mkdir()
    for name in ("a", "b", "c", "d"):
        (tasks / f"{name}.py").write_text(SMALL_RELU_TASK.read_text())
        (solutions / f"{name}.py").write_text(f"class ModelNew:  # {name}\n    pass\n")
    task_set = load_task_set(tasks)
    store = ResultsStore(tmp_path / "results.sqlite")
    store.start_run("run", {}, {})
    plans = {p.task.key: p for p in plan_run(task_set, match_solutions(task_set, solutions).by_task)}
    store.record("run", _record(plans["a"], "correct"))
    store.record("run", _record(plans["b"], "incorrect"))
    store.record("run", _record(plans["c"], HARNESS_ERROR))
    (solutions / "b.py").write_text("class ModelNew:  # b, revised\n    pass\n")
    (solutions / "d.py").unlink()
    replanned = plan_run(task_set, match_solutions(task_set, solutions).by_task)
    todo = {p.task.key for p in still_to_do(store, "run", replanned)}
    assert todo == {"b", "c", "d"}  # b changed, c has no verdict, d was never evaluated (now missing)
    missing = next(p for p in replanned if p.task.key == "d")
    assert missing.job is None and missing.settled.status == "missing"
    store.record("run", missing.settled)
    assert {p.task.key for p in still_to_do(store, "run", replanned)} == {"b", "c"}


def test_selfcheck_candidate_runs_with_the_tf32_setting_of_its_reference(tmp_path: Path) -> None:
    """The self-check's candidate is the task's own ``Model`` with TF32 set as the fp32 reference
    runs (off, unless the policy compares against a TF32 reference): at PyTorch's defaults every
    convolution would carry TF32's error and fail a faithful comparison."""
    import importlib.util

    import torch

    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "relu.py").write_text(SMALL_RELU_TASK.read_text())
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        for tf32 in (False, True):
            write_selfcheck_solutions(load_task_set(tmp_path / "tasks"), tmp_path / f"check-{tf32}", tf32)
            spec = importlib.util.spec_from_file_location(f"selfcheck_{tf32}", tmp_path / f"check-{tf32}" / "relu.py")
            module = importlib.util.module_from_spec(spec)
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = not tf32
            spec.loader.exec_module(module)
            assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (tf32, tf32)
            assert issubclass(module.ModelNew, module.Model)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
