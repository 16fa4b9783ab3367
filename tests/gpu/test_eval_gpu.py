"""``cuda-agent eval`` on a GPU: the bundled CUDA samples all pass, missing workdir solutions count
as failed, the red-team CUDA variants all fail, every visible GPU takes evaluations, and the same
benchmark through ``cuda-agent serve`` gives the same pass rate."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch

from support import EXAMPLES, REPO_ROOT, wait_until

pytestmark = pytest.mark.gpu

REDTEAM_CUDA = REPO_ROOT / "tests" / "redteam" / "cuda"


@pytest.fixture()
def gpu_eval(tmp_path: Path, session_cache_dir: Path):
    """``gpu_eval(tasks, solutions, *extra) -> (metrics JSON, {worker: evaluations})`` with small
    timing budgets, built for this GPU."""
    config = tmp_path / "gpu.yaml"
    config.write_text("build:\n  cuda_arch: '%d.%d'\ntiming:\n  budget_s: 0.5\n  min_samples: 5\n"
                      % torch.cuda.get_device_capability())
    env = {**os.environ, "CUDA_AGENT_CACHE_DIR": str(session_cache_dir)}

    def run(tasks: Path, solutions: Path, *extra: str) -> tuple[dict, dict[str, int]]:
        out = tmp_path / f"run{len(list(tmp_path.glob('run*')))}"
        result = subprocess.run([sys.executable, "-m", "cuda_agent.cli", "eval", "--tasks", str(tasks), "--solutions",
                                 str(solutions), "--out", str(out), "--device", "cuda", "--config", str(config),
                                 "--json", *extra], env=env, capture_output=True, text=True, timeout=1800)
        assert result.returncode == 0, result.stderr[-4000:]
        with sqlite3.connect(out / "results.sqlite") as db:
            workers = dict(db.execute("SELECT worker, COUNT(*) FROM results WHERE worker IS NOT NULL GROUP BY worker"))
        return json.loads(result.stdout), workers

    run.config, run.env = config, env
    return run


def test_cuda_samples_all_pass_on_every_visible_gpu(gpu_eval) -> None:
    metrics, workers = gpu_eval(EXAMPLES / "tasks", EXAMPLES / "solutions" / "cuda")
    overall = metrics["overall"]
    assert (overall["n_tasks"], overall["n_correct"], overall["pass_rate"]) == (6, 6, 1.0)
    assert overall["geomean_speedup_vs_eager"] > 0 and overall["tf32_on"] is not None
    assert len(workers) == min(6, torch.cuda.device_count()), f"not every GPU took an evaluation: {workers}"


def test_missing_workdir_solutions_count_as_failed(gpu_eval) -> None:
    metrics, _ = gpu_eval(EXAMPLES / "tasks", EXAMPLES / "solutions" / "cuda_workdir")
    overall = metrics["overall"]
    assert (overall["n_tasks"], overall["n_correct"], overall["n_missing"]) == (6, 2, 4)


def test_redteam_cuda_variants_all_fail(gpu_eval, tmp_path: Path) -> None:
    tasks, solutions = tmp_path / "rt-tasks", tmp_path / "rt-solutions"
    tasks.mkdir()
    solutions.mkdir()
    for variant in sorted(REDTEAM_CUDA.glob("*.py")):
        shutil.copy(REPO_ROOT / "tests" / "redteam" / "fixtures" / "tasks" / "relu.py", tasks / f"{variant.stem}.py")
        shutil.copy(variant, solutions / variant.name)
    metrics, _ = gpu_eval(tasks, solutions)
    assert metrics["overall"]["n_tasks"] == len(list(REDTEAM_CUDA.glob("*.py"))) >= 2
    assert metrics["overall"]["pass_rate"] == 0.0


def test_samples_through_the_service_pass_as_they_do_locally(gpu_eval, tmp_path: Path) -> None:
    pytest.importorskip("fastapi", reason="the service needs the 'serve' extra (FastAPI, uvicorn)")
    pytest.importorskip("uvicorn", reason="the service needs the 'serve' extra (FastAPI, uvicorn)")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = open(tmp_path / "serve.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "cuda_agent.cli", "serve", "--port", str(port), "--allow-anonymous",
                               "--state-dir", str(tmp_path / "state"), "--device", "cuda", "--config",
                               str(gpu_eval.config)], env=gpu_eval.env, stdout=log, stderr=subprocess.STDOUT)

    def healthy() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        assert wait_until(healthy, timeout_s=300, interval_s=1), (tmp_path / "serve.log").read_text()[-3000:]
        metrics, workers = gpu_eval(EXAMPLES / "tasks", EXAMPLES / "solutions" / "cuda", "--backend", "service",
                                    "--address", f"http://127.0.0.1:{port}")
    finally:
        server.terminate()
        server.wait(timeout=300)
        log.close()
    assert metrics["overall"]["pass_rate"] == 1.0
    assert len(workers) == min(6, torch.cuda.device_count()), f"not every GPU took an evaluation: {workers}"


def test_the_driver_read_from_the_kernel_module_is_nvidia_smis() -> None:
    from cuda_agent.environment.reference_worker import DRIVER_FILE, driver_from_banner

    smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                         text=True, timeout=30, check=True).stdout.splitlines()[0].strip()
    assert driver_from_banner(DRIVER_FILE.read_text()) == smi
