"""Verdicts at real sizes on the CPU backend: a GiB-sized problem is judged within a memory bound
per worker, the harness's own copies and files are never charged to the candidate, a problem
too large for the machine is a ``task_error`` naming its bytes before anything of its size exists,
and outputs the meta device cannot measure are measured by one real forward pass."""

from __future__ import annotations

from pathlib import Path

import pytest

import torch

from cuda_agent.environment import EvalConfig, LimitsConfig, Status, TimingConfig, VerifyConfig, evaluate, load_task
from cuda_agent.environment.problem_size import measure_size
from cuda_agent.evaluate.runner import selfcheck_config

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


_WIDE_LINEAR_TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(10240, 10240)

    def forward(self, x):
        return self.fc(x)


def get_inputs():
    return [torch.randn(8, 10240)]


def get_init_inputs():
    return []
'''


def test_the_reference_copy_the_harness_builds_for_the_weights_is_not_charged_to_the_candidate(
        tmp_path: Path, session_cache_dir: Path) -> None:
    """400 MB of weights (KernelBench level 3's wide MLPs hold 8 GB): the candidate's process
    builds the reference Model beside ModelNew to copy its weights over. Under a 768 MB limit that
    fits the runtime and ModelNew's own weights but not the harness's copy too, the reference run
    as its own candidate must come out correct, not ``out_of_memory``."""
    task = tmp_path / "wide_linear.py"
    task.write_text(_WIDE_LINEAR_TASK)
    solution = tmp_path / "wide_linear_selfcheck.py"
    solution.write_text(_WIDE_LINEAR_TASK + "\n\nclass ModelNew(Model):\n    pass\n")
    config = selfcheck_config(EvalConfig(
        device="cpu", cache_dir=session_cache_dir, limits=LimitsConfig(mem_mb=768),
        verify=VerifyConfig(perturbed_trials=False, post_timing_check=False, timed_audits=1),
        timing=TimingConfig(budget_s=0.3, min_samples=3, warmup_calls=1, compile_baseline=False)))
    verdict = evaluate(load_task(task), solution, config)
    assert verdict.status is Status.CORRECT, verdict.error
    assert verdict.problem_bytes["parameter_bytes"] == (10240 * 10240 + 10240) * 4
    memory = verdict.memory_mb["candidate"]
    assert memory["peak_host_mb"] > 768, memory  # over its own limit: the harness's copy was there


def test_a_problem_larger_than_the_machine_is_a_task_error_naming_its_bytes_before_anything_is_made(
        tmp_path: Path, run_evaluation) -> None:
    """4 TiB of inputs: measured on the meta device when the task loads, refused there (the
    verdict waits only for the solution's build, which runs alongside)."""
    verdict = run_evaluation(relu_task(tmp_path, 1 << 20, 1 << 20), RELU_SOLUTION)
    assert verdict.status is Status.TASK_ERROR and verdict.reward == -1
    assert "does not fit this machine" in verdict.error and "4.4e+03 GB" in verdict.error, verdict.error
    assert verdict.problem_bytes["input_bytes"] == 4 * 2**40
    assert not {"baselines", "load", "verify"} & set(verdict.phase_seconds) and not verdict.trials


_COV_TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """torch.cov has no meta kernel; its output (rows x rows) dwarfs its input (rows x 8)."""

    def forward(self, x):
        return torch.cov(torch.relu(x))


def get_inputs():
    return [torch.rand(2048, 8)]


def get_init_inputs():
    return []
'''


def test_outputs_the_meta_device_cannot_run_are_measured_by_one_real_forward_pass_when_given_one() -> None:
    """Unknown outputs are planned as large as the inputs: 64 kB here against 16 MB really (on
    the GPU a 4 MB problem with a 1 GiB ``cov`` output ran its lane out of memory that way)."""
    inputs = lambda: [torch.rand(2048, 8)]  # noqa: E731
    model = lambda: torch.nn.Sequential(torch.nn.ReLU())  # noqa: E731
    seen = []

    class Cov(torch.nn.Module):
        def forward(self, x):
            return torch.cov(x)

    def forward(input_bytes: int):
        seen.append(input_bytes)
        return Cov()(*inputs())

    assert measure_size(inputs, model).output_bytes == 2048 * 8 * 4  # the meta device runs a ReLU
    measured = measure_size(inputs, Cov, forward=forward)
    assert measured.output_bytes == 2048 * 2048 * 4 and seen == [2048 * 8 * 4]
    assert measured.note.startswith("outputs measured by one forward pass on the device"), measured.note
    unknown = measure_size(inputs, Cov)
    assert unknown.output_bytes is None and "does not run on the meta device" in unknown.note
    declined = measure_size(inputs, Cov, forward=lambda input_bytes: None)
    assert declined.output_bytes is None and "no room" in declined.note, declined.note
    failed = measure_size(inputs, Cov, forward=lambda input_bytes: 1 / 0)
    assert failed.output_bytes is None and "nor for real (ZeroDivisionError)" in failed.note, failed.note


def test_a_verdict_plans_with_the_outputs_of_a_problem_the_meta_device_cannot_run(run_self_check) -> None:
    verdict = run_self_check("cov", _COV_TASK)
    assert verdict.status is Status.CORRECT, verdict.error
    assert verdict.problem_bytes["output_bytes"] == 2048 * 2048 * 4, verdict.problem_bytes
    assert any(n.startswith("size: outputs measured by one forward pass") for n in verdict.notes), verdict.notes
