"""A real ``cuda-agent serve`` subprocess on loopback for the service tests, and the requests they share."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from cuda_agent.serve.client import EvalClient

from support import FIXTURES, SMALL_RELU_TASK, wait_until

TOKEN = "test-token-0123456789abcdef"
TASK = SMALL_RELU_TASK.read_text()
GUARDED = ("import torch.nn as nn\nimport torch.nn.functional as F\n\n\nclass ModelNew(nn.Module):\n"
           "    def forward(self, x):\n        return F.relu(x)\n")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """A ``cuda-agent serve`` subprocess on loopback (CPU backend, one worker, small budgets)."""

    def __init__(self, state_dir: Path, env: dict[str, str], config_file: Path, *extra: str,
                 port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = state_dir.parent / f"serve-{self.port}.log"
        command = [sys.executable, "-m", "cuda_agent.cli", "serve", "--port", str(self.port), "--state-dir",
                   str(state_dir), "--device", "cpu", "--no-compile-baseline", "--config", str(config_file),
                   "--workers", "1", "--max-request-mb", "1", *extra]
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(command, env={**env, "CUDA_AGENT_SERVE_TOKEN": TOKEN}, stdout=log,
                                         stderr=subprocess.STDOUT)
        if not wait_until(self._healthy, timeout_s=180, interval_s=0.25):
            self.stop()
            raise AssertionError(f"the service did not come up:\n{self.log.read_text()[-3000:]}")

    def _healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"the service exited:\n{self.log.read_text()[-3000:]}")
        try:
            return httpx.get(f"{self.url}/v1/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def client(self) -> EvalClient:
        return EvalClient(self.url, token=TOKEN)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.kill()


FAST_CONFIG = "timing:\n  budget_s: 0.3\n  min_samples: 3\n  warmup_calls: 1\n"


def start_server(root: Path, cache_dir: Path, *extra: str, port: int | None = None) -> Server:
    """A service on the CPU backend with short timing budgets, sharing the session's build cache
    (``port``: the port of an earlier instance, for a restart)."""
    config_file = root / "fast.yaml"
    config_file.write_text(FAST_CONFIG)
    return Server(root / "state", {**os.environ, "CUDA_AGENT_CACHE_DIR": str(cache_dir)}, config_file, *extra,
                  port=port)


def kernel_files(forward_tail: str = "") -> dict[str, str]:
    """The fault-kernel workdir with an honest ReLU forward (one shared build), then ``forward_tail``."""
    files = {f"kernels/{p.name}": p.read_text() for p in (FIXTURES / "fault_kernels" / "kernels").iterdir()}
    files["model_new.py"] = ("import torch\nimport torch.nn as nn\n\nimport cuda_extension\n\n\n"
                             "class ModelNew(nn.Module):\n    def forward(self, x):\n        x = x.contiguous()\n"
                             "        out = torch.empty_like(x)\n"
                             "        cuda_extension.relu_ok(x.data_ptr(), out.data_ptr(), x.numel())\n"
                             f"{forward_tail}        return out\n")
    return files
