"""Infrastructure faults are not the candidate's: a compiler, build process or reference worker
killed from outside (as the OOM killer would) is tried again a bounded number of times and ends as
``infra_error`` (reward 0, nothing cached), never as the candidate's ``compile_error`` or the
task's ``task_error``. Processes are killed for real, found among this test's descendants."""

from __future__ import annotations

import os
import signal
import threading
import uuid
from pathlib import Path

import pytest

from cuda_agent.environment import Status, Task, evaluate, load_task
from cuda_agent.environment.build import BUILD_FAILED_FILE, BUILD_OK_FILE, INFRA_RETRIES, build_location, toolchain_dir
from cuda_agent.environment.build_sandbox import prepare_toolchain

from support import EXAMPLES, SMALL_RELU_TASK, descendants, proc_text, runs_module


class Killer:
    """A thread that SIGKILLs descendants of this process named ``comm`` (the kernel's short name)
    or running the module ``fragment`` (``support.runs_module``), once ``ready(pid)`` holds, each at most once, at most
    ``limit`` of them, until stopped; ``killed`` counts them."""

    def __init__(self, fragment: str = "", comm: str | None = None, ready=lambda pid: True,
                 limit: int = 1 << 30) -> None:
        self.fragment, self.comm, self.ready, self.limit, self.killed = fragment, comm, ready, limit, 0
        self._seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Killer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _matches(self, pid: int) -> bool:
        if self.comm is not None:
            return proc_text(pid, "comm") == self.comm
        return runs_module(pid, self.fragment)

    def _run(self) -> None:
        while not self._stop.wait(0.02) and self.killed < self.limit:
            for pid in descendants(os.getpid()):
                if pid not in self._seen and self._matches(pid) and self.ready(pid):
                    self._seen.add(pid)
                    try:
                        os.kill(pid, signal.SIGKILL)
                        self.killed += 1
                    except ProcessLookupError:
                        pass


def unique_cpu_relu(tmp_path: Path) -> Path:
    """The CPU ReLU sample with a comment that gives it a build key no other test shares."""
    source = (EXAMPLES / "solutions" / "cpu" / "relu.py").read_text()
    path = tmp_path / "relu.py"
    path.write_text(source.replace("torch::Tensor relu_forward", f"// {uuid.uuid4().hex}\ntorch::Tensor relu_forward", 1))
    return path


def build_markers(make_config, solution: Path) -> list[str]:
    from cuda_agent.environment import load_solution

    config = make_config()
    _, build_dir, _ = build_location(load_solution(solution), "cpu", config.build, config.cache_dir)
    return sorted(p.name for p in build_dir.glob("BUILD_*.json"))


@pytest.mark.slow  # a cold build, killed three times
def test_a_compiler_killed_on_every_try_is_an_infra_error_and_not_cached(make_config, tmp_path: Path) -> None:
    solution = unique_cpu_relu(tmp_path)
    config = make_config()
    prepare_toolchain("cpu", config.build, config.cache_dir, toolchain_dir("cpu", config.build, config.cache_dir),
                      precompiled_header=True, shim=False)  # its compiler is not the build's
    with Killer(comm="cc1plus") as killer:
        verdict = evaluate(load_task(EXAMPLES / "tasks" / "relu.py"), solution, make_config())
    assert verdict.status is Status.INFRA_ERROR and verdict.reward == 0, verdict.error
    assert killer.killed == INFRA_RETRIES + 1 and "compiler was killed" in verdict.error
    assert BUILD_FAILED_FILE not in build_markers(make_config, solution), "an infrastructure fault was cached"


@pytest.mark.slow  # a cold build, killed once then completed
def test_a_build_process_killed_once_is_built_again(make_config, tmp_path: Path) -> None:
    solution = unique_cpu_relu(tmp_path)
    with Killer("cuda_agent.environment.build_worker", limit=1) as killer:
        verdict = evaluate(load_task(EXAMPLES / "tasks" / "relu.py"), solution, make_config())
    assert killer.killed == 1
    assert verdict.status is Status.CORRECT and verdict.reward >= 1, verdict.error
    assert build_markers(make_config, solution) == [BUILD_OK_FILE]


def test_a_reference_worker_killed_from_outside_is_an_infra_error(make_config) -> None:
    slow = SMALL_RELU_TASK.read_text().replace("import torch\n", "import time\nimport torch\n", 1)
    slow = slow.replace("def get_inputs():", "def get_inputs():\n    time.sleep(3)", 1)
    task = Task(id="slow_reference", code=slow, origin="test")
    asleep = lambda pid: proc_text(pid, "wchan") == "hrtimer_nanosleep"  # in get_inputs' sleep
    with Killer("cuda_agent.environment.reference_worker", ready=asleep, limit=1):
        verdict = evaluate(task, EXAMPLES / "solutions" / "cpu" / "relu.py", make_config())
    assert verdict.status is Status.INFRA_ERROR and verdict.reward == 0, verdict.error
