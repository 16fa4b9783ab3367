"""Worker zygotes: a worker forked from one starts as an exec'd one would, is told apart from its
siblings, is killed with its zygote, and the zygote dies with the process that started it.

The toy worker (tests/fixtures/toy_worker.py) reports what it started with; the exec'd start is the
reference each forked start is compared with. A worker's life and death (crashes, hangs, kills) is
tested under both starts in test_worker.py.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cuda_agent.environment import zygote
from cuda_agent.environment.worker import WorkerDied, WorkerProcess, child_env

from support import BOTH_WORKER_STARTS, is_live, wait_until


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as children:
        return [int(child) for child in children.read().split()]


@BOTH_WORKER_STARTS
def test_a_worker_starts_with_its_environment_directory_session_log_and_only_its_own_pipes(
        start_worker, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    worker = start_worker()
    seen = worker.request({"op": "describe"}, timeout_s=60)
    worker.request({"op": "print_to_log", "text": "to the log"}, timeout_s=30)
    env = child_env()
    assert {k: v for k, v in seen["env"].items() if k != "PYTHONPATH"} == \
        {k: v for k, v in env.items() if k != "PYTHONPATH"}
    assert seen["cwd"] == seen["path0"] == str(tmp_path)
    assert seen["sid"] == seen["pgid"] == seen["pid"] == worker.proc.pid
    assert seen["stdin"] == "/dev/null"
    assert len(seen["fds"]) == 5 and seen["fds"][:3] == [0, 1, 2]  # stdio and its request/reply pipes
    assert "to the log" in worker.log_tail()
    forked = request.node.callspec.params["start_worker"] == "zygote"
    assert seen["modules_preloaded"] is forked
    assert (seen["comm"] == zygote.process_name("toy_worker")) is forked  # what ps shows it as
    assert (seen["ppid"] in zygote.zygote_pids()) is forked
    assert (seen["ppid"] == os.getpid()) is not forked


@pytest.mark.parametrize("start_worker", ["zygote"], indirect=True)
def test_workers_of_one_zygote_draw_their_own_random_numbers(start_worker) -> None:
    first, second = (worker.request({"op": "describe"}, timeout_s=60) for worker in (start_worker(), start_worker()))
    assert first["random"] != second["random"]
    assert first["numpy_random"] is not None and first["numpy_random"] != second["numpy_random"]


@pytest.mark.parametrize("start_worker", ["zygote"], indirect=True)
def test_a_preexec_that_raises_ends_only_that_worker_with_its_traceback_in_the_log(start_worker) -> None:
    failed = start_worker(preexec=functools.partial(int, "not a number"))  # raises ValueError when called
    with pytest.raises(WorkerDied) as info:
        failed.request({"op": "echo"}, timeout_s=60)
    assert "ValueError" in info.value.log_tail and failed.proc.wait(timeout=30) == 1
    assert start_worker().request({"op": "echo", "value": 1}, timeout_s=60)["value"] == 1  # the zygote serves on


def test_one_zygote_serves_environments_that_differ_only_in_what_is_read_later(monkeypatch) -> None:
    module = zygote.PRELOADED[0]
    shared = zygote.zygote_for(module, child_env())
    assert shared is not None
    assert zygote.zygote_for(module, child_env({"HOME": "/nowhere", "TMPDIR": "/nowhere",
                                                "CUDA_VISIBLE_DEVICES": "3"})) is shared
    assert zygote.zygote_for("toy_worker", child_env()) is None  # not preloaded: exec'd
    monkeypatch.setenv("CUDA_AGENT_WORKER_START", "exec")
    assert zygote.zygote_for(module, child_env()) is None


def test_a_zygote_killed_from_outside_ends_its_workers_and_is_replaced(tmp_path: Path) -> None:
    module = zygote.PRELOADED[0]
    worker = WorkerProcess(module, env=child_env(), cwd=tmp_path, log_path=tmp_path / "reference.log")
    first = zygote.zygote_for(module, child_env())
    assert first is not None and worker.proc.pid in [pid for pid in _children(first.proc.pid)]
    first.proc.kill()
    first.proc.wait()
    assert worker.proc.wait(timeout=30) == -signal.SIGKILL
    assert wait_until(lambda: not is_live(worker.proc.pid), timeout_s=30)
    worker.kill()
    second = zygote.zygote_for(module, child_env())
    assert second is not None and second is not first and second.proc.poll() is None


_EVALUATOR = textwrap.dedent('''
    import os, sys, time
    from pathlib import Path
    from cuda_agent.environment.worker import WorkerDied, WorkerProcess, child_env
    from cuda_agent.environment.zygote import zygote_pids
    worker = WorkerProcess("cuda_agent.environment.reference_worker", env=child_env(), cwd=Path(sys.argv[1]),
                           log_path=Path(sys.argv[1]) / "reference.log")
    print(worker.proc.pid, *zygote_pids(), flush=True)
    time.sleep(300)
''')


def test_a_killed_evaluator_leaves_neither_its_zygote_nor_its_workers(tmp_path: Path) -> None:
    evaluator = subprocess.Popen([sys.executable, "-c", _EVALUATOR, str(tmp_path)], stdout=subprocess.PIPE,
                                 env=child_env(), text=True)
    try:
        worker_pid, zygote_pid = map(int, evaluator.stdout.readline().split())
        assert is_live(worker_pid) and is_live(zygote_pid)
        evaluator.send_signal(signal.SIGKILL)
        evaluator.wait()
        assert wait_until(lambda: not is_live(worker_pid) and not is_live(zygote_pid), timeout_s=30)
    finally:
        evaluator.kill()
        evaluator.wait()
