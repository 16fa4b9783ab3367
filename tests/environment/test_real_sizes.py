"""Verdicts at real sizes on the CPU backend: a GiB-sized problem is judged within a memory bound
per worker, the harness's own copies and files are never charged to the candidate, and a problem
too large for the machine is a ``task_error`` naming its bytes before anything of its size exists."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuda_agent.environment import EvalConfig, LimitsConfig, Status, TimingConfig, VerifyConfig, evaluate, load_task

from support import EXAMPLES

RELU_SOLUTION = EXAMPLES / "solutions" / "cpu" / "relu.py"

_RELU_TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn({rows}, {cols})]


def get_init_inputs():
    return []
'''


def relu_task(folder: Path, rows: int, cols: int) -> Path:
    path = folder / f"relu_{rows}x{cols}.py"
    path.write_text(_RELU_TASK.format(rows=rows, cols=cols))
    return path


@pytest.mark.slow
def test_a_gib_problem_is_judged_within_four_times_its_input_per_worker_and_not_charged_to_the_candidate(
        tmp_path: Path, session_cache_dir: Path) -> None:
    """1 GiB in, 1 GiB out, under limits far below the harness's own copies (a 64 MB disk budget
    against 1 GiB output files, 2 GiB of memory against its timing copies): the honest kernel
    must come out correct, and what each worker holds beyond its loaded code must stay within 4x
    the input (the reference's float64 inputs and outputs are that much at their peak), plus
    128 MB for the runtime's own working memory (the checks' chunks, allocator slack)."""
    task = relu_task(tmp_path, 16384, 16384)
    config = EvalConfig(device="cpu", cache_dir=session_cache_dir,
                        limits=LimitsConfig(mem_mb=2048, disk_mb=64),
                        verify=VerifyConfig(perturbed_trials=False, post_timing_check=False, timed_audits=1),
                        timing=TimingConfig(budget_s=0.5, min_samples=3, warmup_calls=1, compile_baseline=False))
    verdict = evaluate(load_task(task), RELU_SOLUTION, config)
    assert verdict.status is Status.CORRECT, verdict.error
    input_mb = verdict.problem_bytes["input_bytes"] / 2**20
    assert input_mb == 1024 and verdict.problem_bytes["output_bytes"] == 2**30
    for worker in ("reference", "candidate"):
        memory = verdict.memory_mb[worker]
        grown = memory["peak_host_mb"] - memory["loaded_host_mb"]
        print(f"{worker}: peak {memory['peak_host_mb']:.0f} MB, loaded {memory['loaded_host_mb']:.0f} MB, "
              f"{grown / input_mb:.2f}x the input above loaded")
        assert grown <= 4 * input_mb + 128, (worker, memory)


def test_a_problem_larger_than_the_machine_is_a_task_error_naming_its_bytes_before_anything_is_made(
        tmp_path: Path, run_evaluation) -> None:
    """4 TiB of inputs: measured on the meta device when the task loads, refused there (the
    verdict waits only for the solution's build, which runs alongside)."""
    verdict = run_evaluation(relu_task(tmp_path, 1 << 20, 1 << 20), RELU_SOLUTION)
    assert verdict.status is Status.TASK_ERROR and verdict.reward == -1
    assert "does not fit this machine" in verdict.error and "4.4e+03 GB" in verdict.error, verdict.error
    assert verdict.problem_bytes["input_bytes"] == 4 * 2**40
    assert not {"baselines", "load", "verify"} & set(verdict.phase_seconds) and not verdict.trials
