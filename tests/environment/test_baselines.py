"""The SQLite cache of baseline timings."""

from __future__ import annotations

from pathlib import Path

from cuda_agent.environment.baselines import BaselineCache
from cuda_agent.environment.verdict import TimingStats

from support import errors_when_run_at_once

STATS = TimingStats(median_ms=1.5, mean_ms=1.6, std_ms=0.1, n=10, rel_std_err=0.02, budget_exhausted=False)


def test_put_then_get_returns_the_same_stats(tmp_path: Path) -> None:
    cache = BaselineCache(tmp_path / "sub" / "baselines.sqlite")
    cache.put("task", "cpu:x:2", "torch=2", {"eager_tf32_off": STATS})
    assert cache.get("task", "cpu:x:2", "torch=2", ["eager_tf32_off", "compile_tf32_off"]) == {"eager_tf32_off": STATS}


def test_entries_are_keyed_by_task_device_and_software(tmp_path: Path) -> None:
    cache = BaselineCache(tmp_path / "baselines.sqlite")
    cache.put("task", "dev", "sw", {"eager_tf32_off": STATS})
    assert cache.get("other-task", "dev", "sw", ["eager_tf32_off"]) == {}
    assert cache.get("task", "other-dev", "sw", ["eager_tf32_off"]) == {}
    assert cache.get("task", "dev", "other-sw", ["eager_tf32_off"]) == {}


def test_put_replaces_and_persists_across_instances(tmp_path: Path) -> None:
    path = tmp_path / "baselines.sqlite"
    BaselineCache(path).put("t", "d", "s", {"eager_tf32_off": STATS})
    newer = TimingStats(2.0, 2.0, 0.0, 3, 0.0, True)
    BaselineCache(path).put("t", "d", "s", {"eager_tf32_off": newer})
    assert BaselineCache(path).get("t", "d", "s", ["eager_tf32_off"]) == {"eager_tf32_off": newer}


def test_a_baseline_timed_under_another_load_is_timed_again(tmp_path: Path) -> None:
    load = [3.0]  # runnable processes per core
    cache = BaselineCache(tmp_path / "baselines.sqlite", load=lambda: load[0])
    cache.put("t", "d", "s", {"eager_tf32_off": STATS})
    load[0] = 2.5  # a little less busy: still comparable
    assert cache.get("t", "d", "s", ["eager_tf32_off"]) == {"eager_tf32_off": STATS}
    load[0] = 0.1  # idle now: the busy baseline would flatter every candidate
    assert cache.get("t", "d", "s", ["eager_tf32_off"]) == {}
    cache.put("t", "d", "s", {"eager_tf32_off": STATS})
    assert cache.get("t", "d", "s", ["eager_tf32_off"]) == {"eager_tf32_off": STATS}


def test_entries_of_the_first_schema_are_timed_again(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "baselines.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE baselines (task_hash TEXT NOT NULL, device TEXT NOT NULL, software TEXT NOT NULL, "
                   "variant TEXT NOT NULL, stats TEXT NOT NULL, PRIMARY KEY (task_hash, device, software, variant))")
        db.execute("INSERT INTO baselines VALUES ('t', 'd', 's', 'eager_tf32_off', '{}')")
    assert BaselineCache(path, load=lambda: 0.0).get("t", "d", "s", ["eager_tf32_off"]) == {}


def test_caches_opened_at_once_all_open(tmp_path: Path) -> None:
    """Parallel evaluations on a fresh cache, and on one of the first schema, open it at the same
    moment (seen on a 16-core GPU host: 'duplicate column name: load')."""
    import sqlite3

    fresh, old = tmp_path / "fresh.sqlite", tmp_path / "old.sqlite"
    with sqlite3.connect(old) as db:
        db.execute("CREATE TABLE baselines (task_hash TEXT NOT NULL, device TEXT NOT NULL, software TEXT NOT NULL, "
                   "variant TEXT NOT NULL, stats TEXT NOT NULL, PRIMARY KEY (task_hash, device, software, variant))")
    for path in (fresh, old):
        errors = errors_when_run_at_once(lambda: BaselineCache(path).put("t", "d", "s", {"eager_tf32_off": STATS}), 8)
        assert errors == []
        assert BaselineCache(path).get("t", "d", "s", ["eager_tf32_off"]) == {"eager_tf32_off": STATS}
