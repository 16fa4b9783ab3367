"""Shared fixtures for the cuda-agent test suite.

Compiling a C++ extension costs ~30 s on a 2-core CI machine, so every test that builds shares one
session-wide cache directory (build cache and baseline SQLite database): a source compiled once
is a cache hit for every later evaluation, in-process or through the CLI (``CUDA_AGENT_CACHE_DIR``).
Set ``CUDA_AGENT_TEST_CACHE_DIR`` to keep that cache between local runs.

Tests marked ``gpu`` are skipped cleanly when ``torch.cuda.is_available()`` is False.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable

import pytest
import torch

from cuda_agent.environment import EvalConfig, Status, Verdict, VerifyConfig, evaluate, load_task
from cuda_agent.environment.guards import GuardConfig

from support import FAST_TIMING, FIXTURES, SMALL_RELU_TASK, child_pids

# model_new.py bodies for the shared fault-kernel workdir (tests/fixtures/fault_kernels): each
# calls one function of the one compiled extension, so all fault tests share a single build.
_FAULT_CALLS = {
    "relu_ok": "cuda_extension.relu_ok(x.data_ptr(), out.data_ptr(), x.numel())",
    "relu_slightly_wrong": "cuda_extension.relu_slightly_wrong(x.data_ptr(), out.data_ptr(), x.numel())",
    "relu_mutating_input": "cuda_extension.relu_mutating_input(x.data_ptr(), out.data_ptr(), x.numel())",
    "return_input": "out = cuda_extension.return_input(x)",
    "segfault": "cuda_extension.segfault(out.data_ptr())",
    "spin_forever": "cuda_extension.spin_forever()",
    "abort_process": "cuda_extension.abort_process()",
}
_FAULT_MODEL_NEW = '''"""Fault-kernel workdir for tests: ModelNew calls the fault extension's `{name}`."""

import torch
import torch.nn as nn

import cuda_extension  # built by the harness from kernels/*


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        {call}
        return out
'''


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
def fault_solution(tmp_path: Path) -> Callable[[str], Path]:
    """``fault_solution(name)``: a workdir with the shared fault kernels whose ModelNew calls ``name``."""

    def make(name: str) -> Path:
        root = Path(tempfile.mkdtemp(prefix=f"solution_{name}_", dir=tmp_path))
        shutil.copytree(FIXTURES / "fault_kernels" / "kernels", root / "kernels")
        (root / "model_new.py").write_text(_FAULT_MODEL_NEW.format(name=name, call=_FAULT_CALLS[name]))
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
def assert_honest_evaluation_succeeds(run_evaluation, fault_solution, make_config) -> Callable[[], Verdict]:
    """After a failure: an honest candidate (the fault kernels' correct ReLU) still evaluates fine."""

    def check() -> Verdict:
        verdict = run_evaluation(SMALL_RELU_TASK, fault_solution("relu_ok"), make_config())
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
