"""A compiler rejection is recorded in the build cache: the same sources fail again at once (a
pool builds every job before evaluating it, and RL batches resubmit candidates)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cuda_agent.environment import BuildConfig, load_solution
from cuda_agent.environment.build import BUILD_FAILED_FILE, CompileError, build_location, build_solution

from support import FIXTURES


def test_second_build_of_rejected_sources_reports_the_recorded_error_without_compiling(session_cache_dir: Path) -> None:
    solution, config = load_solution(FIXTURES / "compile_error"), BuildConfig(max_jobs=1)
    with pytest.raises(CompileError) as first:
        build_solution(solution, "cpu", config, session_cache_dir)
    started = time.monotonic()
    with pytest.raises(CompileError) as second:
        build_solution(solution, "cpu", config, session_cache_dir)
    assert time.monotonic() - started < 2.0
    assert str(second.value).startswith("compilation failed (recorded by an earlier build")
    assert second.value.log_tail == first.value.log_tail and "broken_binding.cpp" in second.value.log_tail
    _, build_dir, _ = build_location(solution, "cpu", config, session_cache_dir)
    assert (build_dir / BUILD_FAILED_FILE).is_file()
