"""The lean build path never changes a verdict: every corpus entry (tests/build_corpus.py) is built
and evaluated once with cuda-agent's lean path and once with torch's own JIT builder (``build.lean:
false``), and both must give the same compile outcome, status and correctness (the reward can differ
by timing noise alone, so it is not compared).

CI runs ``build_corpus.CI_ENTRIES``; ``CUDA_AGENT_BUILD_CORPUS=all`` runs all entries for the device
(32 on the CPU, 34 on CUDA; the GPU validation runs them on both devices:
tests/gpu/test_build_differential_cuda.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cuda_agent.environment import EvalConfig, load_solution

from build_corpus import STYLES, Style, assert_same_verdict, run_differential, selected_styles, solution_source
from support import FAST_TIMING

pytestmark = pytest.mark.slow


def test_corpus_has_thirty_honest_styles_that_pass_the_static_guards(tmp_path: Path) -> None:
    from cuda_agent.environment.guards import run_static_guards

    assert len(STYLES) >= 30 and len({s.name for s in STYLES}) == len(STYLES)
    for device in ("cpu", "cuda"):
        for style in (s for s in STYLES if device in s.devices):
            path = tmp_path / device / style.name / "solution.py"
            path.parent.mkdir(parents=True)
            path.write_text(solution_source(style, device, "guards"))
            violations = run_static_guards(load_solution(path), EvalConfig().guards)
            assert not violations, (style.name, device, violations)


@pytest.fixture(scope="module")
def cpu_corpus(tmp_path_factory, session_cache_dir) -> dict:
    base = EvalConfig(device="cpu", cache_dir=session_cache_dir, timing=FAST_TIMING)
    return run_differential(base, tmp_path_factory.mktemp("corpus-cpu"))


@pytest.mark.parametrize("style", selected_styles("cpu"), ids=lambda s: s.name)
def test_lean_and_torch_builders_give_the_same_verdict_on_cpu(style: Style, cpu_corpus) -> None:
    assert_same_verdict(style, cpu_corpus[style.name])
