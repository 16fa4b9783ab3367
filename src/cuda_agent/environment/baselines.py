"""Cache of baseline timings (eager and torch.compile) in a local SQLite file.

Baselines depend only on the task, the device and the software stack, so they are measured once
per (task hash, device, torch/CUDA version, variant) and reused by every later candidate.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import asdict
from pathlib import Path

from cuda_agent.environment.verdict import TimingStats

_SCHEMA = """
CREATE TABLE IF NOT EXISTS baselines (
    task_hash TEXT NOT NULL,
    device TEXT NOT NULL,
    software TEXT NOT NULL,
    variant TEXT NOT NULL,
    stats TEXT NOT NULL,
    PRIMARY KEY (task_hash, device, software, variant)
)
"""


class BaselineCache:
    """``variant`` names a baseline such as ``eager_tf32_off`` or ``compile[default]_tf32_on``."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        with self._connect() as db:
            db.execute(_SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30)

    def get(self, task_hash: str, device: str, software: str, variants: list[str]) -> dict[str, TimingStats]:
        """Cached stats for those of ``variants`` that were measured before."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT variant, stats FROM baselines WHERE task_hash=? AND device=? AND software=?",
                (task_hash, device, software),
            ).fetchall()
        found = {variant: TimingStats.from_dict(json.loads(stats)) for variant, stats in rows}
        return {v: found[v] for v in variants if v in found}

    def put(self, task_hash: str, device: str, software: str, stats: dict[str, TimingStats]) -> None:
        with self._connect() as db:
            db.executemany(
                "INSERT OR REPLACE INTO baselines VALUES (?, ?, ?, ?, ?)",
                [(task_hash, device, software, variant, json.dumps(asdict(s))) for variant, s in stats.items()],
            )
