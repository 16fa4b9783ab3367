"""The released workdir layout on CUDA: built by the harness's registry, verified under both presets."""

from __future__ import annotations

import pytest

from cuda_agent.environment import EvalConfig, Status

from support import FIXTURES

pytestmark = pytest.mark.gpu

WORKDIRS = sorted(p for p in (FIXTURES / "paper_workdir").iterdir() if p.name.startswith("cuda_"))


@pytest.mark.parametrize("workdir", WORKDIRS, ids=[p.name for p in WORKDIRS])
def test_released_cuda_workdir_verifies_under_both_presets(run_evaluation, make_cuda_config, workdir) -> None:
    strict_config = make_cuda_config()
    strict = run_evaluation(workdir / "model.py", workdir, strict_config)
    assert strict.status is Status.CORRECT, strict.error
    assert strict.preset == "strict" and strict.reward >= 1

    base = strict_config.to_dict()
    paper_config = EvalConfig.from_dict({key: base[key] for key in ("device", "build", "cache_dir", "scratch_dir")}
                                        | {"preset": "paper", "timing": {"compile_baseline": True}})
    paper = run_evaluation(workdir / "model.py", workdir, paper_config)
    assert paper.status is Status.CORRECT, paper.error
    assert paper.preset == "paper" and paper.reward_baseline == "tf32_default"
    assert {"eager_tf32_default", "compile_tf32_default"} <= set(paper.baselines)
    assert paper.candidate_timing.n == 10 and paper.candidate_ms > 0
    assert paper.build.cached
