"""Cache of baseline timings (eager and torch.compile) in a local SQLite file.

Baselines depend on the task, the device and the software stack, so they are measured once per
(task hash, device, torch/CUDA version, variant) and reused by later candidates, as long as the
machine is about as busy as when they were timed (``machine_load``): a baseline timed under load
is timed again on an idle machine, so a reward never depends on when its baseline was cached.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from cuda_agent.environment.machine_load import comparable, current_load
from cuda_agent.environment.verdict import TimingStats

_SCHEMA = """
CREATE TABLE IF NOT EXISTS baselines (
    task_hash TEXT NOT NULL,
    device TEXT NOT NULL,
    software TEXT NOT NULL,
    variant TEXT NOT NULL,
    stats TEXT NOT NULL,
    load REAL,
    PRIMARY KEY (task_hash, device, software, variant)
)
"""
_LOAD_COLUMN = "ALTER TABLE baselines ADD COLUMN load REAL"
"""Added to a cache of the first schema; its entries (load unknown) are timed again once."""


class BaselineCache:
    """``variant`` names a baseline such as ``eager_tf32_off`` or ``compile[default]_tf32_on``.
    ``load`` tells how busy the machine is now (``machine_load.current_load``)."""

    def __init__(self, path: Path, load: Callable[[], float] = current_load) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._load = load
        self._create_or_upgrade()

    def _create_or_upgrade(self) -> None:
        """Create the table, or add ``load`` to a cache of the first schema, holding the write lock
        throughout: processes that open one cache at once (parallel evaluations on a fresh cache)
        would otherwise all see the column missing and all try to add it."""
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            db.execute("BEGIN IMMEDIATE")
            db.execute(_SCHEMA)
            if "load" not in {row[1] for row in db.execute("PRAGMA table_info(baselines)")}:
                db.execute(_LOAD_COLUMN)
            db.execute("COMMIT")
        finally:
            db.close()

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30)

    def get(self, task_hash: str, device: str, software: str, variants: list[str]) -> dict[str, TimingStats]:
        """Cached stats for those of ``variants`` that were measured before, under a load like now's."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT variant, stats, load FROM baselines WHERE task_hash=? AND device=? AND software=?",
                (task_hash, device, software),
            ).fetchall()
        now = self._load()
        found = {variant: TimingStats.from_dict(json.loads(stats)) for variant, stats, load in rows
                 if comparable(load, now)}
        return {v: found[v] for v in variants if v in found}

    def put(self, task_hash: str, device: str, software: str, stats: dict[str, TimingStats]) -> None:
        """Store ``stats``, just timed, with the machine's load now."""
        load = self._load()
        with self._connect() as db:
            db.executemany(
                "INSERT OR REPLACE INTO baselines (task_hash, device, software, variant, stats, load) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [(task_hash, device, software, variant, json.dumps(asdict(s)), load) for variant, s in stats.items()],
            )
