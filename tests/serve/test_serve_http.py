"""``cuda-agent serve`` end to end over real HTTP on loopback: the client's sync, async and batch
calls, bad requests rejected with the right status naming the field, a restart that runs the jobs
accepted before the service was killed, and ``cuda-agent eval --backend service``."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from cuda_agent.serve.client import EvalClient, EvalServiceError, job_request

from service_process import GUARDED, TASK, TOKEN, Server, kernel_files, start_server

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")


@pytest.fixture(scope="module")
def server(tmp_path_factory, session_cache_dir: Path):
    running = start_server(tmp_path_factory.mktemp("serve"), session_cache_dir)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def honest_files() -> dict[str, str]:
    return kernel_files()


def test_client_evaluates_synchronously_asynchronously_and_in_batches(server: Server, honest_files) -> None:
    with server.client() as client:
        assert client.health()["workers"] == 1
        job = client.evaluate(TASK, solution_files=honest_files, task_id="small_relu")
        assert job.state == "done" and job.verdict["status"] == "correct" and job.verdict["reward"] >= 1
        assert job.verdict["task"] == "small_relu" and job.result["worker"] == "cpu:0"
        ids = client.submit_batch([job_request(TASK, solution_code=GUARDED) for _ in range(3)])
        single = client.submit(job_request(TASK, solution_files={"cheat.py": GUARDED}))
        answers = [client.wait(job_id, timeout_s=300) for job_id in [*ids, single]]
        assert [a.verdict["status"] for a in answers] == ["guard_violation"] * 4
        assert client.get(single).state == "done"
        metrics = client.metrics()
    assert metrics["jobs"]["done"] >= 5 and metrics["jobs"]["queued"] == 0
    assert metrics["evaluations_per_hour"] > 0 and metrics["pool"]["lanes"][0]["name"] == "cpu:0"


BAD_REQUESTS = [
    ("no token", "POST", "/v1/jobs", {}, {"task_code": TASK, "solution_code": GUARDED}, 401, "Bearer"),
    ("wrong token", "GET", "/v1/metrics", {"Authorization": "Bearer wrong-token-0123456789"}, None, 401, "Bearer"),
    ("unknown job", "GET", "/v1/jobs/nope", None, None, 404, "job_id"),
    ("not a task", "POST", "/v1/jobs", None, {"task_code": "x = 1", "solution_code": GUARDED}, 400, "task_code"),
    ("task syntax", "POST", "/v1/jobs", None, {"task_code": "def (", "solution_code": GUARDED}, 400, "task_code"),
    ("path escape", "POST", "/v1/jobs", None, {"task_code": TASK, "solution_files": {"../x.py": GUARDED}}, 400,
     "solution_files"),
    ("no solution", "POST", "/v1/jobs", None, {"task_code": TASK}, 400, "solution_files"),
    ("empty batch", "POST", "/v1/jobs/batch", None, {"jobs": []}, 400, "jobs"),
    ("bad batch entry", "POST", "/v1/jobs/batch", None,
     {"jobs": [{"task_code": TASK, "solution_code": GUARDED}, {"task_code": "x", "solution_code": GUARDED}]}, 400,
     "jobs[1].task_code"),
    ("missing field", "POST", "/v1/evaluate", None, {"solution_code": GUARDED}, 422, "body.task_code"),
    ("wrong type", "POST", "/v1/jobs", None, {"task_code": TASK, "solution_code": 5}, 422, "body.solution_code"),
    ("too large", "POST", "/v1/jobs", None, {"task_code": TASK, "solution_code": "#" * (2 << 20)}, 413, "request body"),
]


@pytest.mark.parametrize("method, path, headers, body, status, field",
                         [pytest.param(*case[1:], id=case[0]) for case in BAD_REQUESTS])
def test_bad_requests_get_their_status_and_name_the_field(server: Server, method, path, headers, body, status,
                                                          field) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"} if headers is None else headers
    response = httpx.request(method, server.url + path, headers=headers, json=body, timeout=60)
    assert response.status_code == status, response.text
    assert field in json.dumps(response.json()["detail"])


def test_invalid_json_is_422_and_the_client_raises_with_the_status(server: Server) -> None:
    response = httpx.post(f"{server.url}/v1/jobs", headers={"Authorization": f"Bearer {TOKEN}",
                                                            "Content-Type": "application/json"},
                          content=b"{not json", timeout=30)
    assert response.status_code == 422 and "invalid JSON" in response.text
    with EvalClient(server.url, token="wrong-token-0123456789") as client, pytest.raises(EvalServiceError) as error:
        client.submit(job_request(TASK, solution_code=GUARDED))
    assert error.value.status_code == 401


def queued_ids(state_dir: Path) -> set[str]:
    with sqlite3.connect(state_dir / "jobs.sqlite", timeout=30) as db:
        return {row[0] for row in db.execute("SELECT job_id FROM jobs WHERE state='queued'")}


def test_restart_after_a_kill_runs_every_accepted_job_and_reruns_none(tmp_path: Path, session_cache_dir: Path,
                                                                      honest_files) -> None:
    first = start_server(tmp_path, session_cache_dir)
    state = tmp_path / "state"
    try:
        with first.client() as client:
            finished = client.evaluate(TASK, solution_code=GUARDED)
            accepted = client.submit_batch([job_request(TASK, solution_files=honest_files),
                                            job_request(TASK, solution_code=GUARDED)])
    finally:
        first.kill()
    unanswered = queued_ids(state)  # one worker on a loaded host may answer the first job before the kill lands
    assert unanswered and unanswered <= set(accepted), "the kill left no accepted job unanswered: nothing to resume"
    second = start_server(tmp_path, session_cache_dir)
    try:
        with second.client() as client:
            answers = [client.wait(job_id, timeout_s=600) for job_id in accepted]
            again = client.get(finished.job_id)
    finally:
        second.stop()
    assert [a.verdict["status"] for a in answers] == ["correct", "guard_violation"]
    assert f"startup: resumed {len(unanswered)} unanswered jobs" in second.log.read_text()
    assert again.result == finished.result, "a job answered before the restart was evaluated again"
    assert queued_ids(state) == set()


def test_eval_command_runs_a_benchmark_through_the_service(server: Server, tmp_path: Path, honest_files,
                                                           session_cache_dir: Path) -> None:
    tasks, solutions = tmp_path / "tasks", tmp_path / "solutions"
    for name in ("a", "b", "c"):
        (tasks / f"{name}.py").parent.mkdir(exist_ok=True)
        (tasks / f"{name}.py").write_text(TASK)
    for relative, text in honest_files.items():
        (solutions / "a" / relative).parent.mkdir(parents=True, exist_ok=True)
        (solutions / "a" / relative).write_text(text)
    (solutions / "b.py").write_text(GUARDED)
    env = {**os.environ, "CUDA_AGENT_CACHE_DIR": str(session_cache_dir), "CUDA_AGENT_SERVE_TOKEN": TOKEN}
    result = subprocess.run([sys.executable, "-m", "cuda_agent.cli", "eval", "--tasks", str(tasks), "--solutions",
                             str(solutions), "--out", str(tmp_path / "run"), "--device", "cpu", "--backend", "service",
                             "--address", server.url, "--json"], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    overall = json.loads(result.stdout)["overall"]
    assert (overall["n_tasks"], overall["n_correct"], overall["n_missing"]) == (3, 1, 1)
    with sqlite3.connect(tmp_path / "run" / "results.sqlite") as db:
        assert dict(db.execute("SELECT task_key, worker FROM results WHERE status='correct'")) == {"a": "cpu:0"}
