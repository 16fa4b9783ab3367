"""The candidate sandbox: its own uid, no network, read-only task/inputs/caches, nothing left behind.

The end-to-end tests need root (to switch users); without it they are skipped and the lease tests
check that the verdict says the sandbox is off.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from cuda_agent.environment import SandboxConfig, Status
from cuda_agent.environment.sandbox import SandboxError, _views_for, acquire, processes_of

from support import FIXTURES, SMALL_RELU_TASK, wait_until

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching to a sandbox user needs root")


def _probe(verdict) -> dict:
    match = re.search(r"SANDBOX-PROBE (\{.*?\})", verdict.error or "")
    assert match, verdict.error
    return json.loads(match.group(1))


@needs_root
def test_candidate_runs_as_its_own_uid_without_network_or_write_access(run_evaluation, plain_torch_config) -> None:
    verdict = run_evaluation(SMALL_RELU_TASK, FIXTURES / "solutions" / "sandbox_probe.py", plain_torch_config)
    assert verdict.status is Status.RUNTIME_ERROR
    report = _probe(verdict)
    sandbox = SandboxConfig()
    assert sandbox.uid_base <= report["uid"] < sandbox.uid_base + sandbox.slots
    assert verdict.environment["sandbox"] == f"uid {report['uid']}, own network namespace"
    assert report["interfaces"] == ["lo"]
    assert report["write_own_workdir"]
    assert not report["write_task"] and not report["write_inputs"]
    assert not report["list_scratch"] and not report["host_tmp_visible"]
    if report["root_home"] is not None:  # a view exposing only the Python installation under /root
        assert set(report["root_home"]) < set(os.listdir("/root")), report["root_home"]


@needs_root
def test_release_kills_every_process_of_the_uid_including_daemons(tmp_path: Path) -> None:
    lease = acquire(SandboxConfig(), "cpu", tmp_path)
    assert lease.uid is not None
    daemon = subprocess.Popen(["sleep", "300"], user=lease.uid,
                              group=lease.uid, start_new_session=True)
    assert wait_until(lambda: daemon.pid in processes_of(lease.uid))
    lease.release()
    assert daemon.wait(timeout=10) == -9
    assert processes_of(lease.uid) == []


@needs_root
def test_concurrent_leases_get_distinct_uids_and_a_full_range_is_an_error(tmp_path: Path) -> None:
    config = SandboxConfig(uid_base=62000, slots=2)
    first, second = acquire(config, "cpu", tmp_path), acquire(config, "cpu", tmp_path)
    try:
        assert {first.uid, second.uid} == {62000, 62001}
        with pytest.raises(SandboxError, match="all 2 sandbox slots are in use"):
            acquire(config, "cpu", tmp_path)
    finally:
        first.release()
        second.release()
    acquire(config, "cpu", tmp_path).release()  # freed slots are reusable


def test_mode_off_runs_unsandboxed_and_says_so(tmp_path: Path) -> None:
    lease = acquire(SandboxConfig(mode="off"), "cpu", tmp_path)
    assert lease.uid is None
    assert lease.describe() == "off: sandbox.mode is 'off'"


@pytest.mark.skipif(os.geteuid() == 0, reason="checks the non-root behaviour")
def test_without_root_auto_mode_falls_back_and_on_mode_is_an_error(tmp_path: Path) -> None:
    assert acquire(SandboxConfig(), "cpu", tmp_path).uid is None
    with pytest.raises(SandboxError, match="not running as root"):
        acquire(SandboxConfig(mode="on"), "cpu", tmp_path)


def test_views_expose_needed_paths_below_a_closed_directory() -> None:
    tmp_path = Path(tempfile.mkdtemp(dir="/var/lib" if os.access("/var/lib", os.W_OK) else None))
    closed = tmp_path / "home"
    (closed / "python" / "lib").mkdir(parents=True)
    (closed / "secret").mkdir()
    closed.chmod(0o700)
    tmp_path.chmod(0o755)
    try:
        views = dict(_views_for([closed / "python", closed / "python" / "lib"]))
        if tmp_path.parent not in (Path("/tmp"), Path("/var/tmp")):  # else the private /tmp view covers it
            assert views[closed] == ["python"]
        (closed / "python" / "lib").chmod(0o700)  # closed again below the exposed path: cannot work
        assert "closed to other users" in _views_for([closed / "python", closed / "python" / "lib"])
    finally:
        shutil.rmtree(tmp_path)


def test_candidate_gets_private_temp_dirs_that_still_show_its_scratch(tmp_path: Path) -> None:
    scratch = Path("/dev/shm") / "cuda-agent-view-test"
    views = dict(_views_for([scratch]))
    assert views[Path("/dev/shm")] == ["cuda-agent-view-test"]
    assert views[Path("/tmp")] == []
