"""``cuda-agent cache show|clear``: the cached baselines, what each was timed under, and clearing
them (every one, or one task's), asking first."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from cuda_agent.environment.baselines import BaselineCache
from cuda_agent.environment.config import TimingConfig
from cuda_agent.environment.verdict import TimingStats

STATS = TimingStats(median_ms=0.25, mean_ms=0.26, std_ms=0.01, n=40, rel_std_err=0.004, budget_exhausted=False,
                    median_rel_err=0.0061)


@pytest.fixture()
def cache_dir(tmp_path: Path) -> Path:
    """A cache with relu's eager and compile baselines (1.5 s budget) and softmax's eager one (0.3 s)."""
    cache = BaselineCache(tmp_path / "baselines.sqlite", load=lambda: 0.42)
    cache.put("aaaa1111", "cpu:EPYC:2", "torch=2", {"eager_tf32_off": STATS, "compile_tf32_off": STATS},
              TimingConfig(), "relu")
    cache.put("bbbb2222", "cpu:EPYC:2", "torch=2", {"eager_tf32_off": STATS}, TimingConfig(budget_s=0.3), "softmax")
    return tmp_path


def _cache(cli: list[str], env: dict[str, str], cache_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*cli, "cache", *args, "--cache-dir", str(cache_dir)], env=env, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_show_lists_each_baseline_with_what_it_was_timed_under(cli, cli_env, cache_dir: Path) -> None:
    table = _cache(cli, cli_env, cache_dir, "show")
    assert table.returncode == 0, table.stderr
    rows = [line for line in table.stdout.splitlines() if "eager_tf32_off" in line or "compile_tf32_off" in line]
    assert len(rows) == 3
    relu = next(row for row in rows if "relu" in row and "eager" in row).replace("│", " ").split()
    assert relu[:5] == ["relu", "aaaa1111", "cpu:EPYC:2", "eager_tf32_off", "0.25"]
    assert relu[5:9] == ["40", "0.61%", "1.5", "0.42"]

    listed = json.loads(_cache(cli, cli_env, cache_dir, "show", "--json", "--task", "softmax").stdout)
    assert [(e["task"], e["variant"], e["timing"]["budget_s"], e["stats"]["n"]) for e in listed] == [
        ("softmax", "eager_tf32_off", 0.3, 40)]
    assert listed[0]["load"] == 0.42 and listed[0]["age_s"] >= 0


def test_an_unknown_task_is_a_usage_error_naming_the_cached_ones(cli, cli_env, cache_dir: Path) -> None:
    result = _cache(cli, cli_env, cache_dir, "show", "--task", "matmul")
    assert result.returncode == 2
    assert "no cached baseline of task 'matmul'" in result.stderr and "cached: relu, softmax" in result.stderr


def test_clear_asks_first_and_removes_one_tasks_entries_or_all(cli, cli_env, cache_dir: Path) -> None:
    unconfirmed = _cache(cli, cli_env, cache_dir, "clear", "--task", "relu")
    assert unconfirmed.returncode == 2 and "pass --yes" in unconfirmed.stderr  # input is not a terminal
    assert len(BaselineCache(cache_dir / "baselines.sqlite").entries()) == 3

    by_hash = _cache(cli, cli_env, cache_dir, "clear", "--task", "aaaa", "--yes")
    assert by_hash.returncode == 0 and "removed 2 cached baselines" in by_hash.stdout
    assert [e.task for e in BaselineCache(cache_dir / "baselines.sqlite").entries()] == ["softmax"]

    everything = _cache(cli, cli_env, cache_dir, "clear", "--yes")
    assert everything.returncode == 0 and "removed 1 cached baseline\n" in everything.stdout
    assert "no cached baselines" in _cache(cli, cli_env, cache_dir, "show").stdout
