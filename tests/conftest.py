"""Shared fixtures for the cuda-agent test suite.

Compiling a C++ extension costs ~30 s on a 2-core CI machine, so every test that builds shares one
session-wide cache directory (build cache and baseline SQLite database): a source compiled once
is a cache hit for every later evaluation, in-process or through the CLI (``CUDA_AGENT_CACHE_DIR``).
Set ``CUDA_AGENT_TEST_CACHE_DIR`` to keep that cache between local runs.

Tests marked ``gpu`` are skipped cleanly when ``torch.cuda.is_available()`` is False.

Set ``CUDA_AGENT_TEST_FAILURE_LOG`` to a file to have each failure's report appended to it as soon
as the test fails (with ``-n``, pytest prints them only at the end: a run stopped by a time limit
would otherwise name its failures and show none of them).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import pytest
import torch

from cuda_agent.environment import EvalConfig, Status, Verdict, VerifyConfig, evaluate, load_task
from cuda_agent.environment.build import build_solution
from cuda_agent.environment.guards import GuardConfig
from cuda_agent.environment.solution import load_solution
from cuda_agent.evaluate.runner import selfcheck_config, write_selfcheck_solutions
from cuda_agent.evaluate.tasks import EvalTask

from support import FAST_TIMING, FIXTURES, SMALL_RELU_TASK, child_pids

# model_new.py bodies for the shared fault-kernel workdir (tests/fixtures/fault_kernels): each fault
# is one line in forward() (or at import time, for _FAULTS_AT_IMPORT), so all fault tests share a
# single build. Lines may hold ``{placeholders}`` that ``fault_solution(name, **values)`` fills in.
_HONEST_RELU = "cuda_extension.relu_ok(x.data_ptr(), out.data_ptr(), x.numel())"
_FAULT_CALLS = {
    "relu_ok": _HONEST_RELU,
    "relu_slightly_wrong": "cuda_extension.relu_slightly_wrong(x.data_ptr(), out.data_ptr(), x.numel())",
    "relu_mutating_input": "cuda_extension.relu_mutating_input(x.data_ptr(), out.data_ptr(), x.numel())",
    "return_input": "out = cuda_extension.return_input(x)",
    "segfault": "cuda_extension.segfault(out.data_ptr())",
    "spin_forever": "cuda_extension.spin_forever()",
    "abort_process": "cuda_extension.abort_process()",
    "grow_memory": f"cuda_extension.grow_memory(6 << 30, 2000); {_HONEST_RELU}",  # 6 GiB at most
    # A correct result, returned as a stride-0 view that is 10 GiB of float32 when materialised.
    "huge_output": f"{_HONEST_RELU}; out = out.view(-1)[:1].expand((10 << 30) // 4)",
    # Faults in Python: fault_actions.py is copied into the workdir for these only.
    "fork_bomb": "fault_actions.fork_bomb()",
    "flood_stdout": "fault_actions.flood_stdout()",
    "fill_workdir": "fault_actions.fill_workdir()",
    "delete_files": f"fault_actions.delete_files(*{{targets}}); {_HONEST_RELU}",
}
_FAULTS_AT_IMPORT = {
    "sleep_at_import": "import time; time.sleep(1e9)",
    "spin_at_import": "while True: pass",
}
_FAULT_MODEL_NEW = '''"""Fault-kernel workdir for tests: ModelNew runs the fault `{name}`."""

import torch
import torch.nn as nn

import cuda_extension  # built by the harness from kernels/*
{imports}

class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        {call}
        return out
'''
_RECOVERY_SECONDS: dict[str, tuple[float, str]] = {}
"""Test id -> (seconds from the evaluate() call to the verdict, status), printed at the end of the
run (docs/security.md quotes them)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def session_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One build cache + baseline database for the whole run."""
    override = os.environ.get("CUDA_AGENT_TEST_CACHE_DIR")
    if override:
        path = Path(override)
        path.mkdir(parents=True, exist_ok=True)
        return path
    return tmp_path_factory.mktemp("cuda-agent-cache")


@pytest.fixture()
def scratch_dir(tmp_path: Path) -> Path:
    """Per-test root for the evaluator's temporary files, so tests can check it is cleaned up."""
    path = tmp_path / "scratch"
    path.mkdir()
    return path


@pytest.fixture()
def make_config(session_cache_dir: Path, scratch_dir: Path) -> Callable[..., EvalConfig]:
    """``make_config(**changes)``: a CPU ``EvalConfig`` on the shared cache with small timing budgets."""

    def make(**changes) -> EvalConfig:
        base = EvalConfig(device="cpu", cache_dir=session_cache_dir, scratch_dir=scratch_dir, timing=FAST_TIMING)
        return base.replace(**changes)

    return make


@pytest.fixture()
def runtime_only_config(make_config) -> EvalConfig:
    """A config with the static guards off, to test the runtime layer on cheats the static guards
    would already reject (each layer of the defence must hold on its own)."""
    return make_config(guards=GuardConfig(enabled=False))


@pytest.fixture()
def plain_torch_config(make_config) -> EvalConfig:
    """Static guards off and no ``no-custom-kernel`` rule: for tests of other harness parts (weight
    transfer, the timing loop) that use plain-PyTorch candidates for brevity."""
    return make_config(guards=GuardConfig(enabled=False), verify=VerifyConfig(require_extension_call=False))


@pytest.fixture()
def fault_solution(tmp_path: Path) -> Callable[..., Path]:
    """``fault_solution(name, **values)``: a workdir with the shared fault kernels whose ModelNew runs
    the fault ``name`` (its line's placeholders filled from ``values``)."""

    def make(name: str, **values: str) -> Path:
        root = Path(tempfile.mkdtemp(prefix=f"solution_{name}_", dir=tmp_path))
        shutil.copytree(FIXTURES / "fault_kernels" / "kernels", root / "kernels")
        at_import = _FAULTS_AT_IMPORT.get(name, "")
        call = _FAULT_CALLS["relu_ok" if at_import else name].format(**values)
        imports = at_import
        if "fault_actions." in call:
            shutil.copy(FIXTURES / "fault_kernels" / "fault_actions.py", root)
            imports = "import fault_actions"
        (root / "model_new.py").write_text(_FAULT_MODEL_NEW.format(name=name, imports=imports, call=call))
        return root

    return make


@pytest.fixture()
def run_evaluation(make_config, scratch_dir: Path) -> Callable[..., Verdict]:
    """``run_evaluation(task_path, solution_path, config=None)``: evaluate, then check that the
    evaluation left no child process and no scratch files behind."""

    def run(task_path: Path, solution_path: Path, config: EvalConfig | None = None) -> Verdict:
        verdict = evaluate(load_task(task_path), solution_path, config or make_config())
        assert child_pids() == [], "the evaluation left worker processes behind"
        assert list(scratch_dir.iterdir()) == [], "the evaluation left scratch files behind"
        return verdict

    return run


@pytest.fixture()
def run_self_check(run_evaluation, make_config, tmp_path: Path) -> Callable[[str, str], Verdict]:
    """``run_self_check(name, code)``: the task ``code`` judged with its own reference as the
    candidate, as ``cuda-agent tasks check`` writes and configures it."""

    def run(name: str, code: str) -> Verdict:
        task_path = tmp_path / f"{name}.py"
        task_path.write_text(code)
        task = EvalTask(name, None, None, str(task_path), load_task(task_path), None)
        write_selfcheck_solutions([task], tmp_path / "selfcheck", tf32=False)
        return run_evaluation(task_path, tmp_path / "selfcheck" / f"{name}.py", selfcheck_config(make_config()))

    return run


@pytest.fixture()
def run_fault(run_evaluation, request: pytest.FixtureRequest) -> Callable[..., tuple[Verdict, float]]:
    """``run_fault(task_path, solution_path, config)``: ``run_evaluation``, timed from the
    ``evaluate()`` call to the verdict; returns ``(verdict, seconds)`` and records them for the
    recovery-time table printed at the end of the run."""

    def run(task_path: Path, solution_path: Path, config: EvalConfig) -> tuple[Verdict, float]:
        started = time.monotonic()
        verdict = run_evaluation(task_path, solution_path, config)
        seconds = time.monotonic() - started
        _RECOVERY_SECONDS[request.node.nodeid] = (seconds, verdict.status.value)
        first_line = (verdict.error or "").splitlines()[0] if verdict.error else ""
        print(f"{seconds:.2f} s to verdict {verdict.status.value}: {first_line[:300]}")
        return verdict, seconds

    return run


@pytest.fixture()
def record_seconds(request: pytest.FixtureRequest) -> Callable[[str, float, str], None]:
    """``record_seconds(label, seconds, outcome)``: add a row to the recovery-time table."""

    def record(label: str, seconds: float, outcome: str) -> None:
        _RECOVERY_SECONDS[f"{request.node.nodeid} {label}"] = (seconds, outcome)

    return record


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    log = os.environ.get("CUDA_AGENT_TEST_FAILURE_LOG")
    if log and report.failed:
        with open(log, "a") as out:
            out.write(f"==== {report.nodeid} ({report.when}, {report.duration:.1f} s)\n{report.longreprtext}\n\n")


def pytest_terminal_summary(terminalreporter) -> None:
    if _RECOVERY_SECONDS:
        terminalreporter.section("fault recovery: seconds from the evaluate() call to the verdict")
        for nodeid, (seconds, outcome) in _RECOVERY_SECONDS.items():
            terminalreporter.write_line(f"{seconds:9.2f} s  {outcome:<14} {nodeid}")


@pytest.fixture()
def assert_honest_evaluation_succeeds(run_evaluation, fault_solution, make_config,
                                      session_cache_dir: Path) -> Callable[[], Verdict]:
    """After a failure: an honest candidate (the fault kernels' correct ReLU) still evaluates fine,
    from the build cache. The fault kernels are built before the test, so a fault that destroys the
    cache (or a fault that needs no build) cannot pass this check with a fresh build."""
    honest, config = fault_solution("relu_ok"), make_config()
    build_solution(load_solution(honest), config.device, config.build, session_cache_dir)

    def check() -> Verdict:
        verdict = run_evaluation(SMALL_RELU_TASK, honest, config)
        assert verdict.status is Status.CORRECT, verdict.error
        assert verdict.reward >= 1
        assert verdict.build is not None and verdict.build.cached
        return verdict

    return check


@pytest.fixture(scope="session")
def fast_config_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """YAML config for CLI runs with the same small timing budgets as ``FAST_TIMING``."""
    path = tmp_path_factory.mktemp("cli-config") / "fast.yaml"
    path.write_text(
        "timing:\n"
        f"  budget_s: {FAST_TIMING.budget_s}\n"
        f"  min_samples: {FAST_TIMING.min_samples}\n"
        f"  warmup_calls: {FAST_TIMING.warmup_calls}\n"
    )
    return path


@pytest.fixture()
def cli_env(session_cache_dir: Path) -> dict[str, str]:
    """Environment for ``python -m cuda_agent.cli``: the shared cache, wide rich output."""
    env = dict(os.environ)
    env["CUDA_AGENT_CACHE_DIR"] = str(session_cache_dir)
    env["COLUMNS"] = "300"
    env["NO_COLOR"] = "1"
    return env


@pytest.fixture()
def cli() -> list[str]:
    """Command prefix that runs this checkout's CLI with the test interpreter."""
    return [sys.executable, "-m", "cuda_agent.cli"]
