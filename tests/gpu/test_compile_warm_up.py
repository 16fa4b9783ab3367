"""On the GPU: prestarted slots warm ``torch.compile`` up while the verdicts they serve compile a
baseline (a self-check, tasks new to the baseline cache), and stop once baselines come from the
cache (the warm-up is seconds of host work a cached verdict never needs)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from cuda_agent.environment import Prestarter, Status, evaluate, load_task

from support import EXAMPLES, FAST_TIMING

pytestmark = pytest.mark.gpu

RELU_TASK = EXAMPLES / "tasks" / "relu.py"
RELU_SOLUTION = EXAMPLES / "solutions" / "cuda" / "relu.py"


def test_prestarted_slots_warm_compile_up_only_while_baselines_are_compiled(make_cuda_config, tmp_path: Path) -> None:
    # A cache of its own, so the first verdict compiles its baseline (the suite's timing skips it).
    config = make_cuda_config(cache_dir=tmp_path / "cache", timing=replace(FAST_TIMING, compile_baseline=True))
    task = load_task(RELU_TASK)
    with Prestarter(config, count=1) as prestarted:
        assert prestarted.compile_ahead
        first = evaluate(task, RELU_SOLUTION, config, prestarted=prestarted)
        assert first.status is Status.CORRECT, first.error
        assert first.baseline_sources["compile_tf32_off"] == "timed" and prestarted.compile_ahead
        # where its baselines phase went: the compile, then the four loops (TF32 on recompiles in its own)
        assert set(first.baseline_seconds) == {"compile", *first.baseline_sources}
        assert sum(first.baseline_seconds.values()) <= first.phase_seconds["baselines"]
        second = evaluate(task, RELU_SOLUTION, config, prestarted=prestarted)  # its slot was warmed with compile
        assert second.status is Status.CORRECT, second.error
        assert set(second.baseline_sources.values()) == {"cache"} and not prestarted.compile_ahead
        assert second.baseline_seconds == {}
