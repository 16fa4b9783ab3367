"""Fixtures shared by the environment tests."""

from __future__ import annotations

import pytest

from cuda_agent.environment.thread_starts import START_FUNCTIONS, ThreadStartLog


@pytest.fixture
def stamped_threads(monkeypatch) -> ThreadStartLog:
    """A log stamping this interpreter's thread starts, as the candidate worker installs it
    (``ThreadStartLog.install``), undone after the test."""
    log = ThreadStartLog()
    for module, name in START_FUNCTIONS:
        if hasattr(module, name):
            monkeypatch.setattr(module, name, log.stamping(getattr(module, name)))
    return log
