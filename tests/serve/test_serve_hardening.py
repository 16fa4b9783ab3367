"""``cuda-agent serve`` against poison input and careless exposure, over real HTTP on loopback:
lone surrogates and over-deep task sources are 400s naming the field and leave the compile stage
alive; a candidate's unencodable exception text and this host's paths never reach the client; the
API docs need the token; unknown fields are 422; the job database is private to its owner."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from service_process import GUARDED, TASK, TOKEN, Server, kernel_files, start_server

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def server(tmp_path_factory, session_cache_dir: Path):
    running = start_server(tmp_path_factory.mktemp("hardening"), session_cache_dir)
    yield running
    running.stop()


def raw_json(**fields: str) -> bytes:
    """A JSON body; ``\\ud800`` in a value stays the escape a hostile client would send."""
    return json.dumps(fields).replace("\\\\ud800", "\\ud800").encode()


POISON = [
    ("surrogate in solution", {"task_code": TASK, "solution_code": "x = '\\ud800'\n"}, "solution_files"),
    ("surrogate in task", {"task_code": TASK + "# \\ud800\n", "solution_code": GUARDED}, "task_code"),
    ("surrogate in task id", {"task_code": TASK, "task_id": "t\\ud800", "solution_code": GUARDED}, "task_id"),
    ("deep task", {"task_code": "x = " + "-" * 200_000 + "1\n", "solution_code": GUARDED}, "task_code"),
    ("unknown field", {"task_code": TASK, "solution_code": GUARDED, "solution_cod": "x"}, "solution_cod"),
]


@pytest.mark.parametrize("body, field", [pytest.param(*case[1:], id=case[0]) for case in POISON])
def test_poison_requests_are_rejected_naming_the_field(server: Server, body, field) -> None:
    response = httpx.post(f"{server.url}/v1/jobs", headers=AUTH, content=raw_json(**body), timeout=60)
    assert response.status_code in (400, 422), response.text
    assert field in json.dumps(response.json()["detail"])


def test_after_poison_jobs_are_still_evaluated_and_answers_stay_readable(server: Server,
                                                                         session_cache_dir: Path) -> None:
    for _ in range(2):  # as many as the compile threads of a 2-core machine
        httpx.post(f"{server.url}/v1/jobs", headers=AUTH, content=raw_json(task_code=TASK, solution_code="'\\ud800'"),
                   timeout=60)
    raising = kernel_files("        raise RuntimeError('bad ' + chr(0xD800) + ' text')\n")
    with server.client() as client:
        guarded = client.evaluate(TASK, solution_code=GUARDED, timeout_s=300)
        job = client.evaluate(TASK, solution_files=raising, timeout_s=600)
        again = httpx.get(f"{server.url}/v1/jobs/{job.job_id}", headers=AUTH, timeout=30)
    assert guarded.verdict["status"] == "guard_violation"
    assert job.verdict["status"] == "runtime_error" and again.status_code == 200
    text = again.text
    assert "bad \ufffd text" in again.json()["result"]["verdict"]["error"]
    assert str(session_cache_dir) not in text and "/staged/" not in text, "a server path reached the client"
    assert "solution/model_new.py" in text


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json"])
def test_api_docs_need_the_token(server: Server, path: str) -> None:
    assert httpx.get(server.url + path, timeout=30).status_code == 401
    assert httpx.get(server.url + path, headers=AUTH, timeout=30).status_code == 200


def test_job_database_is_private(server: Server) -> None:
    state = server.log.parent / "state"
    assert stat.S_IMODE((state / "jobs.sqlite").stat().st_mode) == 0o600
    assert stat.S_IMODE(state.stat().st_mode) & 0o077 == 0


def test_anonymous_service_on_a_network_address_is_warned_about(tmp_path: Path) -> None:
    # 192.0.2.1 is a documentation address: the service warns, then cannot bind, and never listens.
    result = subprocess.run([sys.executable, "-m", "cuda_agent.cli", "serve", "--allow-anonymous", "--host",
                             "192.0.2.1", "--device", "cpu", "--state-dir", str(tmp_path / "state"), "--workers", "1"],
                            capture_output=True, text=True, timeout=300)
    assert "warning: --allow-anonymous on 192.0.2.1" in result.stderr


def test_a_retried_submission_with_its_idempotency_key_is_stored_once(server: Server) -> None:
    body = {"jobs": [{"task_code": TASK, "solution_code": GUARDED}] * 2}
    headers = {**AUTH, "Idempotency-Key": "retry-of-batch-7"}
    first = httpx.post(f"{server.url}/v1/jobs/batch", headers=headers, json=body, timeout=60)
    again = httpx.post(f"{server.url}/v1/jobs/batch", headers=headers, json=body, timeout=60)
    other = httpx.post(f"{server.url}/v1/jobs/batch", headers=headers, json={"jobs": body["jobs"][:1]}, timeout=60)
    assert first.status_code == again.status_code == 202
    assert again.json()["job_ids"] == first.json()["job_ids"] and len(set(first.json()["job_ids"])) == 2
    assert other.status_code == 409 and "Idempotency-Key" in other.text


def test_a_second_service_on_the_same_state_folder_is_refused(server: Server) -> None:
    state = server.log.parent / "state"
    result = subprocess.run([sys.executable, "-m", "cuda_agent.cli", "serve", "--allow-anonymous", "--device", "cpu",
                             "--state-dir", str(state), "--port", "1"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert "in use by another cuda-agent serve (pid" in result.stderr and str(server.proc.pid) in result.stderr
