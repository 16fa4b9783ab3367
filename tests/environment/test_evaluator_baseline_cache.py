"""A verdict takes a cached baseline only when it was timed at least as thoroughly, and says where
each baseline came from (issue 31: a smoke run's 0.3 s eager time served a later full evaluation,
which reported a 16x speed-up)."""

from __future__ import annotations

import dataclasses
import secrets
from pathlib import Path

import pytest

from cuda_agent.environment import Status, TimingConfig

from support import FAST_TIMING, SMALL_RELU_TASK, skip_unless_cacheable

pytestmark = pytest.mark.slow  # uses the shared fault-kernel build

DEFAULT_BUDGET = dataclasses.replace(TimingConfig(), compile_baseline=False)


def test_a_smoke_budget_baseline_is_never_reused_by_a_default_budget_verdict(
        run_evaluation, fault_solution, make_config, tmp_path: Path) -> None:
    task = tmp_path / "small_relu.py"  # a task hash of its own: no cache (even a kept one) holds its baselines
    task.write_text(SMALL_RELU_TASK.read_text() + f"\n# {secrets.token_hex(8)}\n")
    solution = fault_solution("relu_ok")

    smoke = run_evaluation(task, solution, make_config(timing=FAST_TIMING))
    assert smoke.status is Status.CORRECT, smoke.error
    assert smoke.baseline_sources == {"eager_tf32_off": "timed"}
    assert 0 < smoke.baseline_seconds["eager_tf32_off"] <= smoke.phase_seconds["baselines"]

    full = run_evaluation(task, solution, make_config(timing=DEFAULT_BUDGET))
    assert full.status is Status.CORRECT, full.error
    assert full.baseline_sources == {"eager_tf32_off": "timed"}
    (note,) = [n for n in full.notes if n.startswith("baselines: ")]
    assert "the cached one was timed with budget_s 0.3, below this verdict's 1.5" in note
    assert full.baselines["eager_tf32_off"] != smoke.baselines["eager_tf32_off"]

    stats = full.baselines["eager_tf32_off"]
    skip_unless_cacheable(stats, "the default-budget baseline")
    quick = run_evaluation(task, solution, make_config(timing=FAST_TIMING))
    assert quick.baseline_sources == {"eager_tf32_off": "cache"}  # the thorough entry serves a quicker verdict
    assert quick.baseline_seconds == {}
    assert quick.baselines == full.baselines
    (note,) = [n for n in quick.notes if n.startswith("baselines: ")]
    assert note.startswith(f"baselines: eager_tf32_off from the cache ({stats.n} samples, median "
                           f"±{stats.median_rel_err:.2%}; timed ")
    assert "1.5 s budget" in note
