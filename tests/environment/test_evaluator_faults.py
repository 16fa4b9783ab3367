"""Faults in candidates and tasks become typed verdicts, and the evaluator stays usable after each.

Native faults come from one shared kernels folder (tests/fixtures/fault_kernels, compiled once per
session); pure-Python faults are single-file solutions in tests/fixtures/solutions. After every
failure an honest candidate is evaluated again in the same session and must still succeed.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cuda_agent.environment import BuildConfig, LimitsConfig, Status, Task, evaluate, load_task

from cuda_agent.environment.guards import GuardConfig

from support import FIXTURES, SMALL_RELU_TASK

pytestmark = pytest.mark.slow  # builds (or reuses) compiled extensions

SOLUTIONS = FIXTURES / "solutions"
# A few seconds beyond a worker's start-up (each imports torch: ~3-5 s on a loaded 2-core machine).
HANG_TIMEOUT_S = 10.0


def assert_failed(verdict, status: Status) -> None:
    assert verdict.status is status, f"{verdict.status}: {verdict.error}"
    assert not verdict.correct and verdict.reward == -1
    assert verdict.error


# -- wrong results and build failures ----------------------------------------------------------

def test_slightly_wrong_kernel_is_incorrect_and_names_the_trial(run_evaluation, fault_solution,
                                                                assert_honest_evaluation_succeeds) -> None:
    verdict = run_evaluation(SMALL_RELU_TASK, fault_solution("relu_slightly_wrong"))
    assert_failed(verdict, Status.INCORRECT)
    assert verdict.compiled
    assert verdict.error.startswith("trial 0 (standard): output: error vs float64")
    assert [t.passed for t in verdict.trials] == [False]
    assert verdict.trials[0].max_abs_err == pytest.approx(1e-2, rel=1e-3)
    assert verdict.candidate_ms is None and verdict.speedup_vs_eager is None
    assert_honest_evaluation_succeeds()


def test_compile_error_reports_the_compiler_message(run_evaluation, make_config,
                                                    assert_honest_evaluation_succeeds) -> None:
    # One compiler job, so ninja stops at the broken file before compiling the generated module.
    config = make_config(build=BuildConfig(max_jobs=1))
    verdict = run_evaluation(SMALL_RELU_TASK, FIXTURES / "compile_error", config)
    assert_failed(verdict, Status.COMPILE_ERROR)
    assert not verdict.compiled and verdict.build is None
    assert verdict.error.startswith("compilation failed")
    assert "broken_binding.cpp" in verdict.error
    assert "error: expected ';'" in verdict.error.replace("‘", "'").replace("’", "'")
    assert verdict.trials == [] and verdict.candidate_ms is None
    assert_honest_evaluation_succeeds()


# -- crashes -----------------------------------------------------------------------------------

def test_native_segfault_in_forward_yields_runtime_error_naming_sigsegv(run_evaluation, fault_solution,
                                                                       assert_honest_evaluation_succeeds) -> None:
    verdict = run_evaluation(SMALL_RELU_TASK, fault_solution("segfault"))
    assert_failed(verdict, Status.RUNTIME_ERROR)
    assert "killed by SIGSEGV" in verdict.error and "trial 0 (standard)" in verdict.error
    assert_honest_evaluation_succeeds()


def test_ctypes_segfault_in_forward_yields_runtime_error_naming_sigsegv(run_evaluation, runtime_only_config,
                                                                       assert_honest_evaluation_succeeds) -> None:
    verdict = run_evaluation(SMALL_RELU_TASK, SOLUTIONS / "segfault_ctypes.py", runtime_only_config)
    assert_failed(verdict, Status.RUNTIME_ERROR)
    assert verdict.compiled  # nothing to compile: the crash is at run time
    assert "killed by SIGSEGV" in verdict.error and "trial 0 (standard)" in verdict.error
    assert_honest_evaluation_succeeds()


def test_abort_in_forward_yields_runtime_error_naming_sigabrt(run_evaluation, fault_solution,
                                                             assert_honest_evaluation_succeeds) -> None:
    verdict = run_evaluation(SMALL_RELU_TASK, fault_solution("abort_process"))
    assert_failed(verdict, Status.RUNTIME_ERROR)
    assert "killed by SIGABRT" in verdict.error
    assert_honest_evaluation_succeeds()


def test_exception_in_forward_yields_runtime_error_with_its_text(run_evaluation,
                                                                assert_honest_evaluation_succeeds) -> None:
    verdict = run_evaluation(SMALL_RELU_TASK, SOLUTIONS / "raise_in_forward.py")
    assert_failed(verdict, Status.RUNTIME_ERROR)
    assert "candidate raised during 'run' (trial 0 (standard))" in verdict.error
    assert "ValueError: deliberate failure in ModelNew.forward (fault fixture)" in verdict.error
    assert "raise_in_forward.py" in verdict.error  # the traceback points at the candidate's line
    assert_honest_evaluation_succeeds()


def test_import_time_failure_yields_runtime_error_during_load(run_evaluation,
                                                             assert_honest_evaluation_succeeds) -> None:
    verdict = run_evaluation(SMALL_RELU_TASK, SOLUTIONS / "import_error.py")
    assert_failed(verdict, Status.RUNTIME_ERROR)
    assert "candidate raised during 'load'" in verdict.error
    assert "ImportError: deliberate import-time failure (fault fixture)" in verdict.error
    assert verdict.trials == []
    assert_honest_evaluation_succeeds()


# -- hangs -------------------------------------------------------------------------------------

def test_python_hang_in_forward_yields_timeout(run_evaluation, make_config,
                                               assert_honest_evaluation_succeeds) -> None:
    config = make_config(limits=LimitsConfig(candidate_timeout_s=HANG_TIMEOUT_S))
    started = time.monotonic()
    verdict = run_evaluation(SMALL_RELU_TASK, SOLUTIONS / "hang_in_forward.py", config)
    assert_failed(verdict, Status.TIMEOUT)
    assert f"candidate timed out during 'run' (trial 0 (standard)): no reply to 'run' within {HANG_TIMEOUT_S:g} s" \
        in verdict.error
    assert time.monotonic() - started < HANG_TIMEOUT_S + 30
    assert_honest_evaluation_succeeds()


def test_native_infinite_loop_holding_the_gil_yields_timeout(run_evaluation, make_config, fault_solution,
                                                            assert_honest_evaluation_succeeds) -> None:
    config = make_config(limits=LimitsConfig(candidate_timeout_s=HANG_TIMEOUT_S))
    verdict = run_evaluation(SMALL_RELU_TASK, fault_solution("spin_forever"), config)
    assert_failed(verdict, Status.TIMEOUT)
    assert "candidate timed out during 'run' (trial 0 (standard))" in verdict.error
    assert_honest_evaluation_succeeds()


# -- memory ------------------------------------------------------------------------------------

def test_allocation_beyond_the_memory_limit_yields_out_of_memory(run_evaluation, make_config,
                                                                 assert_honest_evaluation_succeeds) -> None:
    """On CPU the candidate's address space is capped at ``limits.mem_mb``; an 8 GiB allocation
    then fails inside the candidate. That is the candidate running out of memory."""
    config = make_config(limits=LimitsConfig(mem_mb=4096), guards=GuardConfig(enabled=False))
    verdict = run_evaluation(SMALL_RELU_TASK, SOLUTIONS / "oom_in_forward.py", config)
    assert verdict.reward == -1 and "can't allocate memory" in (verdict.error or "")
    assert verdict.status is Status.OUT_OF_MEMORY, f"{verdict.status}: {verdict.error}"
    assert_honest_evaluation_succeeds()


# -- task and solution problems ----------------------------------------------------------------

def test_task_that_fails_to_import_yields_task_error(run_evaluation, tmp_path: Path,
                                                     assert_honest_evaluation_succeeds) -> None:
    task = tmp_path / "broken_import.py"
    code = SMALL_RELU_TASK.read_text()
    task.write_text(code.replace("import torch\n", "import torch\nimport no_such_module_4711\n", 1))
    verdict = run_evaluation(task, SOLUTIONS / "raise_in_forward.py")
    assert_failed(verdict, Status.TASK_ERROR)
    assert "reference 'load' failed" in verdict.error
    assert "ModuleNotFoundError: No module named 'no_such_module_4711'" in verdict.error
    assert verdict.trials == []
    assert_honest_evaluation_succeeds()


def test_task_whose_get_inputs_raises_yields_task_error(run_evaluation, tmp_path: Path) -> None:
    task = tmp_path / "bad_inputs.py"
    task.write_text(SMALL_RELU_TASK.read_text().replace(
        "def get_inputs():\n", "def get_inputs():\n    raise RuntimeError('inputs unavailable')\n", 1))
    verdict = run_evaluation(task, SOLUTIONS / "raise_in_forward.py")
    assert_failed(verdict, Status.TASK_ERROR)
    assert "reference 'make_inputs' failed" in verdict.error and "inputs unavailable" in verdict.error


def test_task_source_without_model_yields_task_error_without_starting_workers(make_config) -> None:
    task = Task(id="no_model", code="def get_inputs(): return []\ndef get_init_inputs(): return []\n", origin="<test>")
    verdict = evaluate(task, SOLUTIONS / "raise_in_forward.py", make_config())
    assert_failed(verdict, Status.TASK_ERROR)
    assert "<test>: missing top-level Model" in verdict.error


def test_missing_solution_yields_solution_error(make_config, tmp_path: Path) -> None:
    verdict = evaluate(load_task(SMALL_RELU_TASK), tmp_path / "nothing_here.py", make_config())
    assert_failed(verdict, Status.SOLUTION_ERROR)
    assert "no such file or directory" in verdict.error
    assert not verdict.compiled
