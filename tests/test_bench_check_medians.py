"""``bench/benchlib.check_medians``: a self-check run's medians, and how much of its baseline
timing went to loops that ran out of budget."""

from __future__ import annotations

import pytest

from support import REPO_ROOT


def _row(total: float, seconds: dict[str, float], exhausted: list[str], sources: dict[str, str]) -> dict:
    return {"phase_seconds": {"total": total, "baselines": total / 2}, "baseline_seconds": seconds,
            "baseline_exhausted": exhausted, "baseline_sources": sources}


def test_the_share_of_baseline_seconds_in_exhausted_loops_counts_timed_loops_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO_ROOT / "bench"))
    from benchlib import check_medians

    timed = {"eager_tf32_off": "timed", "compile_tf32_off": "timed"}
    rows = [
        _row(10.0, {"compile_unheld": 5.0, "eager_tf32_off": 1.5, "compile_tf32_off": 0.5}, ["eager_tf32_off"], timed),
        _row(20.0, {"eager_tf32_off": 0.5, "compile_tf32_off": 0.5}, [], timed),
        # from the cache: no loop ran, so neither its count nor its (absent) seconds weigh
        _row(30.0, {}, [], {"eager_tf32_off": "cache", "compile_tf32_off": "cache"}),
    ]
    medians = check_medians(rows)
    assert medians["median_verdict_s"] == 20.0
    assert medians["baseline_loops_exhausted"] == 1 / 4
    assert medians["baseline_seconds_exhausted"] == 1.5 / 3.0  # the unheld compile is not a loop
    assert check_medians(rows[2:])["baseline_seconds_exhausted"] is None
