"""Worker processes: a crash, a hang or a memory blow-up becomes a typed exception in the parent,
and the worker's whole process group is gone afterwards.

These use a torch-free toy worker (tests/fixtures/toy_worker.py), so each starts in a fraction of
a second.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from cuda_agent.environment.worker import (
    ForgedReply, RemoteError, WorkerDied, WorkerMemoryExceeded, WorkerProcess, WorkerProtocolError, WorkerTimeout,
    child_env, signal_name,
)

from support import BOTH_WORKER_STARTS, is_live, live_group_members, wait_until


def assert_gone(worker: WorkerProcess) -> None:
    """The worker was reaped and nothing is left in its process group."""
    assert worker.proc.returncode is not None
    assert wait_until(lambda: live_group_members(worker.proc.pid) == []), live_group_members(worker.proc.pid)


@BOTH_WORKER_STARTS
def test_request_returns_the_reply_and_the_worker_serves_many(start_worker) -> None:
    worker = start_worker()
    for value in (1, "two", [3]):
        assert worker.request({"op": "echo", "value": value}, timeout_s=30) == {"ok": True, "value": value}
    worker.close(graceful_s=30)
    assert worker.proc.returncode == 0
    assert_gone(worker)


def test_pipelined_requests_are_answered_in_order_and_background_replies_are_taken_first(start_worker) -> None:
    worker = start_worker()
    worker.send({"op": "echo", "value": "warm"}, background=True)
    for value in range(5):
        worker.send({"op": "echo", "value": value})
    assert [worker.receive(timeout_s=30)["value"] for _ in range(5)] == [0, 1, 2, 3, 4]
    assert [op for op, _, _ in worker.request_seconds] == ["echo"] * 6
    with pytest.raises(WorkerProtocolError, match="without a request"):
        worker.receive(timeout_s=1)


def test_a_failed_background_request_raises_at_the_next_receive(start_worker) -> None:
    worker = start_worker()
    worker.send({"op": "raise", "value": 3}, background=True)
    worker.send({"op": "echo", "value": 1})
    with pytest.raises(RemoteError, match="toy failure: 3"):
        worker.receive(timeout_s=30)
    assert worker.receive(timeout_s=30)["value"] == 1


@BOTH_WORKER_STARTS
def test_close_kills_at_once_without_waiting_for_a_graceful_exit(start_worker) -> None:
    worker = start_worker()
    worker.send({"op": "hang"})
    started = time.monotonic()
    worker.close()
    assert time.monotonic() - started < 2.0
    assert worker.proc.returncode == -signal.SIGKILL
    assert_gone(worker)


def test_exception_in_handler_is_remote_error_and_worker_survives(start_worker) -> None:
    worker = start_worker()
    with pytest.raises(RemoteError, match="ValueError: toy failure: 7") as info:
        worker.request({"op": "raise", "value": 7}, timeout_s=30)
    assert info.value.error_type == "ValueError"
    assert "raise_error" in info.value.traceback
    assert worker.request({"op": "echo", "value": 1}, timeout_s=30)["value"] == 1
    worker.close()


def test_unknown_op_is_a_remote_key_error(start_worker) -> None:
    worker = start_worker()
    with pytest.raises(RemoteError) as info:
        worker.request({"op": "no_such_op"}, timeout_s=30)
    assert info.value.error_type == "KeyError"
    worker.close()


@BOTH_WORKER_STARTS
@pytest.mark.parametrize(
    ("op", "extra", "description"),
    [
        ("segfault", {}, "killed by SIGSEGV"),
        ("abort", {}, "killed by SIGABRT"),
        ("exit_with", {"code": 3}, "exited with status 3"),
    ],
)
def test_crash_is_worker_died_naming_the_signal(start_worker, op, extra, description) -> None:
    worker = start_worker()
    worker.request({"op": "echo"}, timeout_s=30)
    with pytest.raises(WorkerDied, match=f"worker {description} during '{op}'"):
        worker.request({"op": op, **extra}, timeout_s=30)
    assert_gone(worker)


@BOTH_WORKER_STARTS
def test_request_to_a_worker_that_died_between_requests_is_worker_died(start_worker) -> None:
    worker = start_worker()
    worker.request({"op": "echo"}, timeout_s=30)
    os.kill(worker.proc.pid, signal.SIGKILL)
    worker.proc.wait()
    with pytest.raises(WorkerDied):
        worker.request({"op": "echo"}, timeout_s=5)
    assert_gone(worker)


def test_hang_is_worker_timeout_after_the_limit(start_worker) -> None:
    worker = start_worker()
    worker.request({"op": "echo"}, timeout_s=30)  # started and serving
    started = time.monotonic()
    with pytest.raises(WorkerTimeout, match=r"no reply to 'hang' within 1 s"):
        worker.request({"op": "hang"}, timeout_s=1.0)
    assert 0.9 <= time.monotonic() - started < 5
    assert_gone(worker)


@BOTH_WORKER_STARTS
def test_timeout_kills_grandchildren_in_the_process_group(start_worker, tmp_path: Path) -> None:
    worker = start_worker()
    pid_file = tmp_path / "grandchild.pid"
    with pytest.raises(WorkerTimeout):
        worker.request({"op": "spawn_child_then_hang", "pid_file": str(pid_file)}, timeout_s=3.0)
    grandchild = int(pid_file.read_text())
    assert_gone(worker)
    assert wait_until(lambda: not is_live(grandchild)), f"grandchild {grandchild} survived"


def test_memory_blow_up_is_worker_memory_exceeded(start_worker) -> None:
    worker = start_worker(mem_mb=150)
    worker.request({"op": "echo"}, timeout_s=30)
    started = time.monotonic()
    with pytest.raises(WorkerMemoryExceeded, match=r"worker used \d+ MB, over its 150 MB limit"):
        worker.request({"op": "grow_memory", "mb": 400}, timeout_s=30)
    assert time.monotonic() - started < 20  # killed on detection, not at the request's timeout
    assert_gone(worker)


def test_address_space_cap_makes_large_allocations_fail_inside_the_worker(start_worker) -> None:
    """The cap counts from what the worker has mapped (here it has imported nothing big); past it an
    allocation fails inside the worker, and the worker cannot lift the cap again."""
    worker = start_worker()
    worker.request({"op": "cap_address_space", "mb": 512}, timeout_s=30)
    worker.request({"op": "allocate", "mb": 256}, timeout_s=30)
    with pytest.raises(RemoteError) as info:
        worker.request({"op": "allocate", "mb": 2048}, timeout_s=30)
    assert info.value.error_type == "MemoryError"
    with pytest.raises(RemoteError) as info:
        worker.request({"op": "lift_address_space_cap"}, timeout_s=30)
    assert info.value.error_type in ("ValueError", "PermissionError")
    worker.close()


def test_reply_larger_than_the_limit_is_a_protocol_error(start_worker) -> None:
    worker = start_worker()
    with pytest.raises(WorkerProtocolError, match="exceeds"):
        worker.request({"op": "huge_reply"}, timeout_s=30)
    assert_gone(worker)


def test_reply_without_the_request_nonce_is_a_forged_reply(start_worker) -> None:
    worker = start_worker()
    with pytest.raises(ForgedReply, match="nonce"):
        worker.request({"op": "forged_reply"}, timeout_s=30)
    assert_gone(worker)


def test_reply_that_is_not_json_is_a_protocol_error(start_worker) -> None:
    worker = start_worker()
    with pytest.raises(WorkerProtocolError, match="not valid JSON"):
        worker.request({"op": "garbage_reply"}, timeout_s=30)
    assert_gone(worker)


@BOTH_WORKER_STARTS
def test_worker_error_carries_the_log_tail(start_worker) -> None:
    worker = start_worker()
    worker.request({"op": "print_to_log", "text": "marker-4711 before the crash"}, timeout_s=30)
    with pytest.raises(WorkerDied) as info:
        worker.request({"op": "abort"}, timeout_s=30)
    assert "marker-4711 before the crash" in info.value.log_tail


@BOTH_WORKER_STARTS
def test_kill_and_close_are_idempotent(start_worker) -> None:
    worker = start_worker()
    worker.kill()
    worker.kill()
    worker.close()
    assert_gone(worker)


def test_child_env_keeps_only_the_allow_list(monkeypatch) -> None:
    monkeypatch.setenv("CUDA_AGENT_TEST_SECRET", "s3cret")
    monkeypatch.setenv("PATH", "/usr/bin")
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "1")
    env = child_env({"EXTRA": "1"})
    assert "CUDA_AGENT_TEST_SECRET" not in env
    assert env["PATH"] == "/usr/bin" and env["EXTRA"] == "1" and env["TORCHINDUCTOR_COMPILE_THREADS"] == "1"
    assert Path(env["PYTHONPATH"], "cuda_agent", "__init__.py").is_file()
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"


def test_signal_name_describes_signals_and_exit_statuses() -> None:
    assert signal_name(-11) == "killed by SIGSEGV"
    assert signal_name(-9) == "killed by SIGKILL"
    assert signal_name(2) == "exited with status 2"
    assert signal_name(-200) == "killed by signal 200"
