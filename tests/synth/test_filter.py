"""The execution filter: every rule rejects a task built to break it, and a good task passes."""

from __future__ import annotations

import textwrap

import pytest

from cuda_agent.synth.filter import REASONS, FilterConfig, TaskFilter
from cuda_agent.synth.records import TaskRecord


def _task(forward: str, inputs: str = "[torch.randn(64, 256)]", init: str = "") -> TaskRecord:
    code = textwrap.dedent('''\
        import os
        import time

        import torch
        import torch.nn as nn


        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.w = nn.Parameter(torch.randn(256))
        {init}
            def forward(self, x):
        {forward}


        def get_inputs():
            return {inputs}


        def get_init_inputs():
            return []
        ''').format(forward=textwrap.indent(textwrap.dedent(forward), " " * 8),
                    init=textwrap.indent(textwrap.dedent(init), " " * 8), inputs=inputs)
    return TaskRecord(code, ["test"], "deterministic", seed=0)


GOOD = _task("return torch.tanh(x * self.w).sum(dim=-1)")

BAD = {
    "import-error": TaskRecord("import torch\nclass Model(:\n", ["test"], "deterministic", 0),
    "eager-error": _task("return x @ x"),
    "nondeterministic": _task("return torch.nn.functional.dropout(x * self.w, 0.5, training=True)"),
    "input-independent": _task("return self.w * 2.0 + 0 * x.sum()"),
    "degenerate-output": _task("return (x * self.w) * 1e-6"),
    "writes-input": _task("return torch.relu_(x) * self.w"),
    "returns-input": _task("return torch.unbind(x)[0]"),
    # 1e-8 is lost in float32 beside most of x, in float64 beside none: the index count depends on rounding.
    "rounding-shape": _task("return torch.nonzero((x * self.w + 1e-8) - x * self.w)"),
    # Runs eagerly; torch.compile's C++ code generation needs a compiler this task takes away.
    "compile-error": _task("return torch.tanh(x * self.w)",
                           init="__import__('torch._inductor.config')\ntorch._inductor.config.cpp.cxx = ('/nonexistent-compiler',)\n"),
    "worker-died": _task("os._exit(3)"),
}


@pytest.fixture(scope="module")
def task_filter():
    with TaskFilter(FilterConfig(device="cpu", window_ms=(0.0, 10_000.0))) as f:
        yield f


def test_a_shape_that_rounding_changes_on_a_later_input_only_is_caught() -> None:
    """The first input (seed 42: x[0, 0] = 1.93) takes the branch whose shape rounding cannot
    change; most later ones take the other. One input lets the task through, the default eight do not."""
    task = _task("""\
        y = (x * self.w + 1e-8) - x * self.w
        return torch.nonzero(y if x[0, 0] < 1.0 else y * 0 + 1)""")
    outcomes = {}
    for seeds in (1, FilterConfig().rounding_seeds):
        with TaskFilter(FilterConfig(device="cpu", window_ms=(0.0, 10_000.0), compile=False,
                                     rounding_seeds=seeds)) as one_filter:
            outcomes[seeds] = one_filter.check(task)
    assert outcomes[1].accepted, outcomes[1].detail
    rejected = outcomes[FilterConfig().rounding_seeds]
    assert rejected.reason == "rounding-shape" and "nonzero" in rejected.detail, rejected


def test_a_good_task_passes_with_its_times_recorded(task_filter) -> None:
    outcome = task_filter.check(GOOD)
    assert outcome.accepted, outcome.detail
    assert outcome.eager_ms > 0 and outcome.compile_ms > 0 and outcome.memory_mb > 0


@pytest.mark.parametrize("reason", sorted(BAD))
def test_each_rule_rejects_a_task_built_to_break_it(task_filter, reason: str) -> None:
    outcome = task_filter.check(BAD[reason])
    assert outcome.reason == reason, outcome
    assert outcome.detail
    assert task_filter.check(GOOD).accepted  # the lane recovers for the next task


@pytest.mark.parametrize("window, reason", [((1e4, 1e5), "too-fast"), ((0.0, 1e-6), "too-slow")])
def test_the_time_window_rejects_both_ways(window, reason: str) -> None:
    with TaskFilter(FilterConfig(device="cpu", window_ms=window, compile=False)) as f:
        outcome = f.check(GOOD)
    assert outcome.reason == reason and outcome.eager_ms is not None


def test_a_hanging_task_times_out() -> None:
    with TaskFilter(FilterConfig(device="cpu", compile=False, step_timeout_s=10.0, window_ms=(0.0, 10_000.0))) as f:
        outcome = f.check(_task("time.sleep(60)\nreturn x * self.w"))
        assert outcome.reason == "timeout", outcome
        assert f.check(GOOD).accepted


def test_the_memory_bound_rejects_big_tasks() -> None:
    big = _task("return x * 2", inputs="[torch.randn(1024, 1024)]")  # 4 MB in, 4 MB out
    with TaskFilter(FilterConfig(device="cpu", max_memory_mb=4.0, compile=False)) as f:
        outcome = f.check(big)
    assert outcome.reason == "too-much-memory" and outcome.memory_mb >= 8


def test_every_reason_is_documented_and_tested() -> None:
    tested = set(BAD) | {"too-fast", "too-slow", "too-much-memory", "timeout"}
    assert tested == set(REASONS)


def test_bad_config_is_refused_with_the_field_named() -> None:
    with pytest.raises(ValueError, match="window_ms"):
        FilterConfig(window_ms=(5.0, 1.0))
    with pytest.raises(ValueError, match="device"):
        FilterConfig(device="tpu")
