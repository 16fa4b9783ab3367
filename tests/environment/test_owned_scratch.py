"""Scratch folders of a killed process are removed by the next pool; a live process keeps its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cuda_agent.environment.owned_scratch import make_owned_dir, sweep_orphans


def test_only_the_folders_of_exited_processes_are_swept(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    orphan = tmp_path / f"cuda-agent-build-{int(dead.stdout)}-abc"
    (orphan / "out").mkdir(parents=True)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        kept = [make_owned_dir("pool", tmp_path), tmp_path / f"cuda-agent-pool-{live.pid}-xyz", tmp_path / "other"]
        for folder in kept:
            folder.mkdir(exist_ok=True)
        assert sweep_orphans(tmp_path) == [orphan]
    finally:
        live.kill()
        live.wait()
    assert sorted(tmp_path.iterdir()) == sorted(kept)
