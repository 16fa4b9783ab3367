"""Fixtures shared by the environment tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cuda_agent.environment import zygote
from cuda_agent.environment.thread_starts import START_FUNCTIONS, ThreadStartLog
from cuda_agent.environment.worker import WorkerProcess, child_env

from support import FIXTURES


@pytest.fixture()
def start_worker(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``start_worker(**kwargs)``: a toy worker (tests/fixtures/toy_worker.py, torch-free when
    exec'd); every one started is killed at teardown. Exec'd unless the test asks, through
    ``parametrize("start_worker", [...], indirect=True)``, for ``"zygote"``: forked by a worker
    zygote (one with tests/fixtures on its path, shared by the whole run)."""
    if getattr(request, "param", "exec") == "zygote":
        monkeypatch.setattr(zygote, "PRELOADED", (*zygote.PRELOADED, "toy_worker"))
    started: list[WorkerProcess] = []

    def start(**kwargs) -> WorkerProcess:
        env = child_env()
        env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(FIXTURES)])
        worker = WorkerProcess("toy_worker", env=env, cwd=tmp_path, log_path=tmp_path / "worker.log", **kwargs)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.kill()


@pytest.fixture
def stamped_threads(monkeypatch) -> ThreadStartLog:
    """A log stamping this interpreter's thread starts, as the candidate worker installs it
    (``ThreadStartLog.install``), undone after the test."""
    log = ThreadStartLog()
    for module, name in START_FUNCTIONS:
        if hasattr(module, name):
            monkeypatch.setattr(module, name, log.stamping(getattr(module, name)))
    return log
