"""Soak and fault test of ``cuda-agent serve`` on 127.0.0.1: jobs from concurrent clients while the
service, its lane worker and its reference worker are SIGKILLed at random moments (and, in the long
form, the build process and the compiler of cold builds), with poison requests mixed in.

Asserts that every job the service accepted is answered exactly once, with a verdict that blames the
right party (a guarded candidate fails, an honest one passes or is answered without a verdict after
repeated infrastructure faults, never with -1), and that nothing leaks: no process of any instance
outlives the test, no scratch or build folder of theirs stays behind.

The short form runs in CI (a dozen jobs, one service kill, bounded loops). The long form::

    CUDA_AGENT_SOAK_JOBS=120 CUDA_AGENT_SOAK_RESTARTS=4 CUDA_AGENT_SOAK_COLD_BUILDS=4 \\
        python -m pytest -q tests/serve/test_soak.py -s

prints its numbers (jobs, kills by target, answered exactly once, leaks).
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx
import pytest

from cuda_agent.environment.slots import default_scratch_root
from cuda_agent.serve.client import EvalServiceError, job_request

from service_process import GUARDED, TASK, TOKEN, Server, kernel_files, start_server
from support import command_line, descendants, is_live, proc_text, runs_module, wait_until

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

JOBS = int(os.environ.get("CUDA_AGENT_SOAK_JOBS", "12"))
RESTARTS = int(os.environ.get("CUDA_AGENT_SOAK_RESTARTS", "1"))
COLD_BUILDS = int(os.environ.get("CUDA_AGENT_SOAK_COLD_BUILDS", "0"))
CLIENTS = 3
WORKER_TARGETS = {"lane worker": "cuda_agent.pool.process_worker",
                  "reference worker": "cuda_agent.environment.reference_worker",
                  "build process": "cuda_agent.environment.build_worker"}
POISON = [b'{"task_code": "x", "solution_code": "\\ud800"}',
          json.dumps({"task_code": "x = " + "-" * 100_000 + "1", "solution_code": GUARDED}).encode()]


class Faults:
    """A thread that, every few seconds, SIGKILLs one process of the running service: a lane
    worker, a reference worker, a build process or a compiler (whichever exist at that moment),
    ``budget`` kills in all (service kills are counted here too, but made by the test)."""

    def __init__(self, seed: int, budget: int) -> None:
        self.server: Server | None = None
        self.budget = budget  # most kills of workers: each costs a job an attempt (3 answer it without a verdict)
        self.kills: Counter[str] = Counter()
        self.seen: set[int] = set()  # every process of every instance, for the leak check
        self._rng = random.Random(seed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Faults":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def note_processes(self) -> None:
        if self.server is not None and self.server.proc.poll() is None:
            self.seen |= {self.server.proc.pid, *descendants(self.server.proc.pid)}

    def _run(self) -> None:
        while not self._stop.wait(self._rng.uniform(4.0, 10.0)) and sum(self.kills.values()) < self.budget:
            server = self.server
            if server is None or server.proc.poll() is not None:
                continue
            self.note_processes()
            targets = {name: [pid for pid in descendants(server.proc.pid) if runs_module(pid, module)]
                       for name, module in WORKER_TARGETS.items()}
            targets["compiler"] = [pid for pid in descendants(server.proc.pid)
                                   if proc_text(pid, "comm") == "cc1plus"]
            choices = [(name, pids) for name, pids in targets.items() if pids]
            if choices:
                name, pids = self._rng.choice(choices)
                try:
                    os.kill(self._rng.choice(pids), signal.SIGKILL)
                    self.kills[name] += 1
                except ProcessLookupError:
                    pass


def _cold_files() -> dict[str, str]:
    """An honest workdir with a kernel comment no build has seen: a cold build to kill."""
    files = kernel_files()
    name = next(n for n in files if n.endswith(".cpp") and "binding" not in n)
    files[name] = f"// {uuid.uuid4().hex}\n" + files[name]
    return files


def _submit_all(server_url: list[str], requests: list[tuple[str, dict]], accepted: dict[str, str],
                lock: threading.Lock) -> None:
    """One client: submits its requests one by one, retrying across service restarts."""
    from cuda_agent.serve.client import EvalClient

    for kind, body in requests:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                with EvalClient(server_url[0], token=TOKEN, timeout_s=30) as client:
                    job_id = client.submit(body)
                with lock:
                    accepted[job_id] = kind
                break
            except (httpx.TransportError, EvalServiceError):
                time.sleep(1.0)  # the service is restarting (connection refused, 503)


@pytest.mark.slow
def test_every_accepted_job_is_answered_once_and_blamed_right_and_nothing_leaks(tmp_path: Path,
                                                                                 session_cache_dir: Path) -> None:
    rng = random.Random(17)
    kinds = ["guarded"] * (JOBS // 2) + ["honest"] * (JOBS - JOBS // 2 - COLD_BUILDS) + ["cold"] * COLD_BUILDS
    rng.shuffle(kinds)
    bodies = {"guarded": lambda: job_request(TASK, solution_code=GUARDED),
              "honest": lambda: job_request(TASK, solution_files=kernel_files()),
              "cold": lambda: job_request(TASK, solution_files=_cold_files())}
    requests = [(kind, bodies[kind]()) for kind in kinds]
    accepted: dict[str, str] = {}
    lock = threading.Lock()
    server = start_server(tmp_path, session_cache_dir)
    url = [server.url]
    started = time.monotonic()
    with Faults(seed=5, budget=max(3, JOBS // 3)) as faults:
        faults.server = server
        clients = [threading.Thread(target=_submit_all, args=(url, requests[i::CLIENTS], accepted, lock))
                   for i in range(CLIENTS)]
        for thread in clients:
            thread.start()
        for poison in POISON:
            response = httpx.post(f"{server.url}/v1/jobs", content=poison, timeout=60,
                                  headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
            assert response.status_code == 400, response.text
        for _ in range(RESTARTS):
            wait_until(lambda: len(accepted) >= len(requests) // (RESTARTS + 1) or
                       not any(t.is_alive() for t in clients), timeout_s=300, interval_s=0.2)
            time.sleep(rng.uniform(0.5, 3.0))
            faults.note_processes()
            faults.server = None
            server.kill()
            faults.kills["service"] += 1
            server = start_server(tmp_path, session_cache_dir, port=server.port)
            faults.server = server
        for thread in clients:
            thread.join(timeout=900)
        with server.client() as client:
            answers = {job_id: client.wait(job_id, timeout_s=900) for job_id in list(accepted)}
        faults.note_processes()
    server.stop()
    elapsed = time.monotonic() - started

    with sqlite3.connect(tmp_path / "state" / "jobs.sqlite") as db:
        rows = db.execute("SELECT job_id, state FROM jobs").fetchall()
    assert sorted(job_id for job_id, _ in rows) == sorted(accepted), "a job was stored twice or lost"
    assert all(state in ("done", "failed") for _, state in rows)
    expected = {"guarded": "guard_violation", "honest": "correct", "cold": "correct"}
    wrong = {}
    for job_id, kind in accepted.items():
        verdict, result = answers[job_id].verdict, answers[job_id].result
        if verdict is None:  # the harness failed on every attempt: blames no one, says so
            ok = "attempts" in (result["error"] or "")
        else:
            ok = verdict["status"] == expected[kind]
        if not ok:
            wrong[job_id] = (kind, result)
    assert not wrong, f"answers that blame the wrong party: {wrong}"

    assert wait_until(lambda: not [pid for pid in faults.seen if is_live(pid)], timeout_s=120), \
        f"processes outlived their service: {[(p, command_line(p)) for p in faults.seen if is_live(p)]}"
    leaked = [p for p in default_scratch_root().glob("cuda-agent-*-*")
              if p.name.split("-")[3:4] and p.name.split("-")[3].isdigit() and
              int(p.name.split("-")[3]) in faults.seen]
    assert not leaked, f"scratch folders left behind: {leaked}"
    print(f"\nsoak: {len(accepted)} jobs accepted of {len(requests)} submitted in {elapsed:.0f} s; "
          f"kills {dict(faults.kills)}; answered exactly once: {len(rows)}/{len(accepted)}; "
          f"failed without a verdict: {sum(a.verdict is None for a in answers.values())}; "
          f"leaked processes 0, leaked folders {len(leaked)}")
