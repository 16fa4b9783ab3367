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


def test_plain_pytorch_builds_without_preparing_a_toolchain(tmp_path: Path) -> None:
    """A self-check candidate compiles nothing, so its build neither saves torch's flags nor builds
    the precompiled header (on a fresh 2-core machine that kept the first verdict waiting 40 s)."""
    source = tmp_path / "plain.py"
    source.write_text("import torch\n\n\nclass ModelNew(torch.nn.Module):\n"
                      "    def forward(self, x):\n        return torch.relu(x)\n")
    solution = load_solution(source)
    assert solution.compiles_nothing()
    cache = tmp_path / "cache"
    built = build_solution(solution, "cpu", BuildConfig(), cache)
    assert not built.info.cached
    assert not list(cache.rglob("toolchain-*.json")) and not [p for p in cache.glob("pch/**/*") if p.is_file()]


def test_a_single_file_that_loads_an_extension_still_gets_its_toolchain(tmp_path: Path) -> None:
    inline = tmp_path / "inline.py"
    inline.write_text("import torch\nfrom torch.utils.cpp_extension import load_inline\n\n\n"
                      "class ModelNew(torch.nn.Module):\n    pass\n")
    assert not load_solution(inline).compiles_nothing()
