"""The SQLite cache of baseline timings: an entry says what it is, and serves only verdicts that
would not have timed it more thoroughly."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

import pytest

from cuda_agent.environment.baselines import BaselineCache, provenance_note, software_key
from cuda_agent.environment.config import TimingConfig
from cuda_agent.environment.verdict import TimingStats

from support import errors_when_run_at_once

STATS = TimingStats(median_ms=1.5, mean_ms=1.6, std_ms=0.1, n=10, rel_std_err=0.02, budget_exhausted=False,
                    median_rel_err=0.01)
DEFAULT = TimingConfig()
SMOKE = TimingConfig(budget_s=0.3, min_samples=3, warmup_calls=1, compile_baseline=False)
_FIRST_SCHEMA = ("CREATE TABLE baselines (task_hash TEXT NOT NULL, device TEXT NOT NULL, software TEXT NOT NULL, "
                 "variant TEXT NOT NULL, stats TEXT NOT NULL, PRIMARY KEY (task_hash, device, software, variant))")


def _served(cache: BaselineCache, timing: TimingConfig = DEFAULT, key=("t", "d", "s")) -> dict[str, TimingStats]:
    fit, _ = cache.get(*key, ["eager_tf32_off", "compile_tf32_off"], timing)
    return {variant: entry.stats for variant, entry in fit.items()}


def test_put_then_get_returns_the_same_stats_and_what_they_were_timed_under(tmp_path: Path) -> None:
    cache = BaselineCache(tmp_path / "sub" / "baselines.sqlite", load=lambda: 0.25)
    cache.put("t", "d", "s", {"eager_tf32_off": STATS}, DEFAULT, "relu")
    assert _served(cache) == {"eager_tf32_off": STATS}
    (entry,) = cache.entries()
    assert (entry.task, entry.variant, entry.load, entry.timing) == ("relu", "eager_tf32_off", 0.25,
                                                                      dataclasses.asdict(DEFAULT))
    assert entry.timed_at > 0


def test_entries_are_keyed_by_task_device_and_software(tmp_path: Path) -> None:
    cache = BaselineCache(tmp_path / "baselines.sqlite")
    cache.put("t", "d", "s", {"eager_tf32_off": STATS}, DEFAULT, "relu")
    for key in (("other-task", "d", "s"), ("t", "other-dev", "s"), ("t", "d", "other-sw")):
        assert _served(cache, key=key) == {}


def test_put_replaces_and_persists_across_instances(tmp_path: Path) -> None:
    path = tmp_path / "baselines.sqlite"
    BaselineCache(path).put("t", "d", "s", {"eager_tf32_off": STATS}, DEFAULT, "relu")
    newer = dataclasses.replace(STATS, median_ms=2.0)
    BaselineCache(path).put("t", "d", "s", {"eager_tf32_off": newer}, DEFAULT, "relu")
    assert _served(BaselineCache(path)) == {"eager_tf32_off": newer}


def test_a_smoke_budget_baseline_is_never_reused_by_a_default_budget_verdict(tmp_path: Path) -> None:
    """The issue's poisoned cache: a 0.3 s, 3-sample eager time from a smoke run served a later
    full evaluation, which then reported a 16x speed-up."""
    cache = BaselineCache(tmp_path / "baselines.sqlite", load=lambda: 0.0)
    cache.put("t", "d", "s", {"eager_tf32_off": STATS}, SMOKE, "add_relu_mul")
    fit, unfit = cache.get("t", "d", "s", ["eager_tf32_off"], DEFAULT)
    assert fit == {} and unfit == {"eager_tf32_off": "timed with budget_s 0.3, below this verdict's 1.5"}
    cache.put("t", "d", "s", {"eager_tf32_off": STATS}, DEFAULT, "add_relu_mul")  # the verdict re-times it
    assert _served(cache) == {"eager_tf32_off": STATS}
    assert _served(cache, SMOKE) == {"eager_tf32_off": STATS}  # a thorough entry serves a quicker verdict


@pytest.mark.parametrize(("cached", "reason"), [
    (dataclasses.replace(DEFAULT, target_rel_std_err=0.01), "target_rel_std_err 0.01, above this verdict's 0.005"),
    (dataclasses.replace(DEFAULT, min_samples=5), "min_samples 5, below this verdict's 10"),
    (dataclasses.replace(DEFAULT, warmup_ms=0.0), "warmup_ms 0.0, below this verdict's 200.0"),
    (dataclasses.replace(DEFAULT, input_noise=2.0 ** -6), "input_noise 0.015625, this verdict uses 0.0078125"),
])
def test_an_entry_timed_less_precisely_or_differently_is_timed_again(tmp_path: Path, cached, reason) -> None:
    cache = BaselineCache(tmp_path / "baselines.sqlite", load=lambda: 0.0)
    cache.put("t", "d", "s", {"eager_tf32_off": STATS}, cached, "relu")
    fit, unfit = cache.get("t", "d", "s", ["eager_tf32_off"], DEFAULT)
    assert fit == {} and unfit["eager_tf32_off"].endswith(reason)


def test_an_entry_too_spread_to_decide_a_milestone_is_timed_again(tmp_path: Path) -> None:
    """A busy machine stalled a share of the samples: the median is uncertain by far more than a
    5 % milestone margin, and reusing it would decide every later reward on noise."""
    cache = BaselineCache(tmp_path / "baselines.sqlite", load=lambda: 0.0)
    cache.put("t", "d", "s", {"eager_tf32_off": dataclasses.replace(STATS, median_rel_err=0.3)}, DEFAULT, "relu")
    fit, unfit = cache.get("t", "d", "s", ["eager_tf32_off"], DEFAULT)
    assert fit == {} and unfit == {"eager_tf32_off": "timed with the median ±30.0%, wider than ±2.5%"}


def test_settings_that_only_choose_variants_do_not_matter(tmp_path: Path) -> None:
    cache = BaselineCache(tmp_path / "baselines.sqlite", load=lambda: 0.0)
    cache.put("t", "d", "s", {"eager_tf32_off": STATS}, dataclasses.replace(DEFAULT, compile_baseline=False), "relu")
    assert _served(cache) == {"eager_tf32_off": STATS}


def test_a_baseline_timed_under_another_load_is_timed_again(tmp_path: Path) -> None:
    load = [3.0]  # runnable processes per core
    cache = BaselineCache(tmp_path / "baselines.sqlite", load=lambda: load[0])
    cache.put("t", "d", "s", {"eager_tf32_off": STATS}, DEFAULT, "relu")
    load[0] = 2.5  # a little less busy: still comparable
    assert _served(cache) == {"eager_tf32_off": STATS}
    load[0] = 0.1  # idle now: the busy baseline would flatter every candidate
    assert _served(cache) == {}
    cache.put("t", "d", "s", {"eager_tf32_off": STATS}, DEFAULT, "relu")
    assert _served(cache) == {"eager_tf32_off": STATS}


def test_entries_of_earlier_schemas_are_timed_again(tmp_path: Path) -> None:
    """The first schema had no load; the second had the load but neither the timing settings nor
    the median's error. Opening either adds the columns; their entries are timed again once."""
    path = tmp_path / "baselines.sqlite"
    second = '{"median_ms": 1.0, "mean_ms": 1.0, "std_ms": 0.0, "n": 3, "rel_std_err": 0.0, "budget_exhausted": true}'
    with sqlite3.connect(path) as db:
        db.execute(_FIRST_SCHEMA)
        db.execute("INSERT INTO baselines VALUES ('t', 'd', 's', 'eager_tf32_off', '{}')")
        db.execute("ALTER TABLE baselines ADD COLUMN load REAL")
        db.execute(f"INSERT INTO baselines VALUES ('t', 'd', 's', 'compile_tf32_off', '{second}', 0.0)")
    cache = BaselineCache(path, load=lambda: 0.0)
    fit, unfit = cache.get("t", "d", "s", ["eager_tf32_off", "compile_tf32_off"], DEFAULT)
    assert fit == {} and set(unfit) == {"eager_tf32_off", "compile_tf32_off"}
    assert {entry.task for entry in cache.entries()} == {None}


def test_clear_removes_every_entry_or_one_tasks(tmp_path: Path) -> None:
    cache = BaselineCache(tmp_path / "baselines.sqlite")
    cache.put("a", "d", "s", {"eager_tf32_off": STATS, "compile_tf32_off": STATS}, DEFAULT, "relu")
    cache.put("b", "d", "s", {"eager_tf32_off": STATS}, DEFAULT, "softmax")
    assert cache.clear(["a"]) == 2 and [entry.task_hash for entry in cache.entries()] == ["b"]
    assert cache.clear() == 1 and cache.entries() == []


def test_the_note_names_each_baselines_source_samples_and_spread(tmp_path: Path) -> None:
    cache = BaselineCache(tmp_path / "baselines.sqlite", load=lambda: 0.5)
    cache.put("t", "d", "s", {"eager_tf32_off": STATS}, DEFAULT, "relu")
    cached, _ = cache.get("t", "d", "s", ["eager_tf32_off"], DEFAULT)
    fresh = dataclasses.replace(STATS, n=42, median_rel_err=0.003)
    unfit = {"compile_tf32_off": "timed at load 3.00 per CPU, 0.50 now"}
    note = provenance_note({"eager_tf32_off": STATS, "compile_tf32_off": fresh}, cached, unfit,
                           cached["eager_tf32_off"].timed_at + 7200)
    assert note == ("baselines: eager_tf32_off from the cache (10 samples, median ±1.00%; timed 2.0 h ago, 1.5 s "
                    "budget, load 0.50); compile_tf32_off timed now (42 samples, median ±0.30%; the cached one was "
                    "timed at load 3.00 per CPU, 0.50 now)")


def test_caches_opened_at_once_all_open(tmp_path: Path) -> None:
    """Parallel evaluations on a fresh cache, and on one of the first schema, open it at the same
    moment (seen on a 16-core GPU host: 'duplicate column name: load')."""
    fresh, old = tmp_path / "fresh.sqlite", tmp_path / "old.sqlite"
    with sqlite3.connect(old) as db:
        db.execute(_FIRST_SCHEMA)
    for path in (fresh, old):
        errors = errors_when_run_at_once(
            lambda: BaselineCache(path).put("t", "d", "s", {"eager_tf32_off": STATS}, DEFAULT, "relu"), 8)
        assert errors == []
        assert _served(BaselineCache(path)) == {"eager_tf32_off": STATS}


def test_a_cudnn_workspace_cap_keys_baselines_apart_and_its_absence_keeps_the_old_key() -> None:
    """A cap on cuDNN's convolution workspace (a shared GPU's) changes which algorithms a
    convolution may run, so its baselines are not another setting's."""
    environment = {"torch": "2.11.0", "cuda": "13.0", "gpu": "NVIDIA H200"}
    plain = software_key(environment, TimingConfig(), cpu_apart=True)
    assert plain == "torch=2.11.0;cuda=13.0;compile=default;batch_min_ms=1;timed_cpu_apart"
    capped = software_key({**environment, "conv_workspace_cap_mb": "23859"}, TimingConfig(), cpu_apart=True)
    assert capped == plain + ";conv_workspace_mb=23859"
