"""Cache of baseline timings (eager and torch.compile) in a local SQLite file.

Baselines depend on the task, the device and the software stack, so they are measured once per
(task hash, device, torch/CUDA version, variant) and reused by later candidates. An entry records
what it is: its statistics (median, sample count, spread), the timing settings it was measured
under, the machine's load then, and when. A verdict reuses it only when it was timed at least as
thoroughly as the verdict would time it now (budget, samples, warm-up, precision target) with the
same measuring settings, precisely enough to decide a milestone, on a machine about as busy as now
(``machine_load``); otherwise the
verdict times the baseline again and replaces the entry. So a quick smoke run's baseline never
stands in for a careful one, and a reward does not depend on when its baseline was cached.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cuda_agent.environment.config import TimingConfig
from cuda_agent.environment.machine_load import comparable, current_load
from cuda_agent.environment.presets import timing_method_key
from cuda_agent.environment.verdict import TimingStats

def software_key(environment: dict[str, Any], timing: TimingConfig, cpu_apart: bool) -> str:
    """The ``software`` part of a baseline's cache key: what besides the task and the device its
    times depend on. torch and CUDA, the compile mode and timing method, whether timing had CPUs
    set apart, and a cap on cuDNN's convolution workspace (a shared GPU's, or the user's), which
    decides the algorithms a convolution may run. Parts absent by default add nothing, so entries
    cached before a part existed stay valid."""
    cap = environment.get("conv_workspace_cap_mb")
    return (f"torch={environment.get('torch')};cuda={environment.get('cuda')};compile={timing.compile_mode};"
            f"batch_min_ms={timing.batch_min_ms:g}" + timing_method_key(timing)
            + (";timed_cpu_apart" if cpu_apart else "") + ("" if cap is None else f";conv_workspace_mb={cap}"))


_SCHEMA = """
CREATE TABLE IF NOT EXISTS baselines (
    task_hash TEXT NOT NULL,
    device TEXT NOT NULL,
    software TEXT NOT NULL,
    variant TEXT NOT NULL,
    stats TEXT NOT NULL,
    load REAL,
    timing TEXT,
    timed_at REAL,
    task TEXT,
    PRIMARY KEY (task_hash, device, software, variant)
)
"""
_ADDED_COLUMNS = {"load": "REAL", "timing": "TEXT", "timed_at": "REAL", "task": "TEXT"}
"""Columns later schemas added. A cache made before them gets them empty, and an entry without
its load or timing settings is timed again once."""

AT_LEAST = ("budget_s", "min_samples", "max_samples", "warmup_calls", "warmup_ms")
"""Timing settings an entry must match or exceed to stand for a timing under the verdict's."""
AT_MOST = ("target_rel_std_err",)
"""Settings an entry must match or undercut (a tighter precision target)."""
NOT_MEASURED = ("compile_baseline", "baseline_tf32")
"""Settings that choose which variants are timed, not how one is: every other must be equal."""
MAX_MEDIAN_REL_ERR = 0.025
"""The widest error of a reused entry's median: its 95 % interval alone (±4.9 %) spans a 5 %
milestone margin. A wider one (a busy machine stalled a share of its samples) cannot decide a
milestone in any later verdict, so it is timed again instead."""


@dataclass(frozen=True)
class CachedBaseline:
    """One cache entry: a baseline's timing and what it was timed under."""

    task_hash: str
    device: str
    software: str
    variant: str
    stats: TimingStats
    load: float | None
    """Load per CPU when it was timed (``machine_load.current_load``); None: not recorded."""
    timing: dict[str, Any] | None
    """The ``TimingConfig`` fields it was timed under; None: not recorded."""
    timed_at: float | None
    """Unix time it was stored."""
    task: str | None
    """The task's id when it was stored (for people; the hash is the key)."""

    def unfit_for(self, timing: TimingConfig, load_now: float) -> str | None:
        """Why this entry may not stand for ``timing`` measured now (None: it may): its settings
        first (what it was asked to be), then what came out of it and the load it ran under."""
        if self.timing is None or self.stats.median_rel_err is None:
            return "timed before the cache recorded its settings and spread"
        wanted = asdict(timing)
        for name in AT_LEAST:
            if self.timing.get(name, 0) < wanted[name]:
                return f"timed with {name} {self.timing.get(name)}, below this verdict's {wanted[name]}"
        for name in AT_MOST:
            if self.timing.get(name, 1) > wanted[name]:
                return f"timed with {name} {self.timing.get(name)}, above this verdict's {wanted[name]}"
        for name in set(wanted) - set(AT_LEAST) - set(AT_MOST) - set(NOT_MEASURED):
            if self.timing.get(name) != wanted[name]:
                return f"timed with {name} {self.timing.get(name)!r}, this verdict uses {wanted[name]!r}"
        if not self.stats.median_rel_err <= MAX_MEDIAN_REL_ERR:
            return f"timed with the median ±{self.stats.median_rel_err:.1%}, wider than ±{MAX_MEDIAN_REL_ERR:.1%}"
        if not comparable(self.load, load_now):
            return f"timed at load {self.load:.2f} per CPU, {load_now:.2f} now"
        return None


class BaselineCache:
    """``variant`` names a baseline such as ``eager_tf32_off`` or ``compile[default]_tf32_on``.
    ``load`` tells how busy the machine is now (``machine_load.current_load``)."""

    def __init__(self, path: Path, load: Callable[[], float] = current_load) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._load = load
        self._create_or_upgrade()

    def _create_or_upgrade(self) -> None:
        """Create the table, or add the columns a cache of an earlier schema lacks, holding the
        write lock throughout: processes that open one cache at once (parallel evaluations on a
        fresh cache) would otherwise all see a column missing and all try to add it."""
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            db.execute("BEGIN IMMEDIATE")
            db.execute(_SCHEMA)
            present = {row[1] for row in db.execute("PRAGMA table_info(baselines)")}
            for column, kind in _ADDED_COLUMNS.items():
                if column not in present:
                    db.execute(f"ALTER TABLE baselines ADD COLUMN {column} {kind}")
            db.execute("COMMIT")
        finally:
            db.close()

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30)

    def get(self, task_hash: str, device: str, software: str, variants: list[str],
            timing: TimingConfig) -> tuple[dict[str, CachedBaseline], dict[str, str]]:
        """The entries for ``variants`` that may stand for a timing under ``timing`` now, and for
        each other cached variant why it may not."""
        now = self._load()
        fit, unfit = {}, {}
        for entry in self.entries(task_hash, device, software):
            if entry.variant not in variants:
                continue
            reason = entry.unfit_for(timing, now)
            if reason is None:
                fit[entry.variant] = entry
            else:
                unfit[entry.variant] = reason
        return fit, unfit

    def put(self, task_hash: str, device: str, software: str, stats: dict[str, TimingStats],
            timing: TimingConfig, task: str) -> None:
        """Store ``stats``, just timed under ``timing`` for task ``task``, with the machine's load now."""
        load, settings, now = self._load(), json.dumps(asdict(timing)), time.time()
        with self._connect() as db:
            db.executemany(
                "INSERT OR REPLACE INTO baselines (task_hash, device, software, variant, stats, load, timing, "
                "timed_at, task) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(task_hash, device, software, variant, json.dumps(asdict(s)), load, settings, now, task)
                 for variant, s in stats.items()],
            )

    def entries(self, task_hash: str | None = None, device: str | None = None,
                software: str | None = None) -> list[CachedBaseline]:
        """Every entry, or those of one task hash, device and software key, oldest first."""
        where = [(column, value) for column, value in (("task_hash", task_hash), ("device", device),
                                                       ("software", software)) if value is not None]
        sql = ("SELECT task_hash, device, software, variant, stats, load, timing, timed_at, task FROM baselines"
               + (" WHERE " + " AND ".join(f"{column}=?" for column, _ in where) if where else "")
               + " ORDER BY timed_at, task_hash, variant")
        with self._connect() as db:
            rows = db.execute(sql, [value for _, value in where]).fetchall()
        return [CachedBaseline(task_hash, device, software, variant, _stats(stats), load,
                               json.loads(timing) if timing else None, timed_at, task)
                for task_hash, device, software, variant, stats, load, timing, timed_at, task in rows]

    def clear(self, task_hashes: list[str] | None = None) -> int:
        """Remove every entry, or those of ``task_hashes``; returns how many were removed."""
        with self._connect() as db:
            if task_hashes is None:
                return db.execute("DELETE FROM baselines").rowcount
            return sum(db.execute("DELETE FROM baselines WHERE task_hash=?", (h,)).rowcount for h in task_hashes)


def _stats(text: str) -> TimingStats:
    """An entry's statistics; an unreadable or incomplete one (an old or damaged row) reads as a
    timing without a recorded spread, which no verdict reuses."""
    try:
        return TimingStats.from_dict(json.loads(text))
    except (ValueError, TypeError):
        return TimingStats(0.0, 0.0, 0.0, 0, 0.0, True)


def provenance_note(stats: dict[str, TimingStats], cached: dict[str, CachedBaseline], unfit: dict[str, str],
                    now: float) -> str:
    """One line for the verdict: each baseline, from the cache or timed now, with its sample count
    and the median's error, and why a cached entry was not reused."""
    parts = []
    for variant, s in stats.items():
        measured = f"{s.n} samples" + (f", median ±{s.median_rel_err:.2%}" if s.median_rel_err is not None else "")
        entry = cached.get(variant)
        if entry is not None:
            parts.append(f"{variant} from the cache ({measured}; timed {describe_age(now - entry.timed_at)} ago, "
                         f"{entry.timing['budget_s']:g} s budget, load {entry.load:.2f})")
        else:
            why = f"; the cached one was {unfit[variant]}" if variant in unfit else ""
            parts.append(f"{variant} timed now ({measured}{why})")
    return "baselines: " + "; ".join(parts)


def describe_age(seconds: float) -> str:
    """``seconds`` in the largest unit that fits: ``42 s``, ``3.5 min``, ``2.1 h``, ``4.0 d``."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"
