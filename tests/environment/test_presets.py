"""Evaluation presets: ``paper`` reproduces the CUDA Agent harness's rules, ``strict`` stays the
default, and honest solutions get verdicts that differ only where the presets are documented to."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from cuda_agent.environment import ConfigError, EvalConfig, Status
from cuda_agent.environment.presets import PRESETS, describe, preset_settings
from cuda_agent.environment.reward import DRIFT, milestone_reward

from support import EXAMPLES

REPO = Path(__file__).resolve().parents[2]


def test_default_config_is_the_strict_preset() -> None:
    config = EvalConfig()
    assert config.preset == "strict" and PRESETS.get("strict") == {}
    assert config.verify.precision == "faithful" and config.timing.method == "events"
    assert config.timing.baseline_tf32 == "policy" and config.reward.milestone == "speedup"


def test_paper_preset_sets_the_papers_rules_and_sections_override_them() -> None:
    config = EvalConfig.from_dict({"preset": "paper", "device": "cuda"})
    assert config.preset == "paper"
    assert (config.verify.precision, config.verify.trials, config.verify.perturbed_trials) == ("cuda-agent", 5, False)
    timing = config.timing
    assert (timing.method, timing.warmup_calls, timing.min_samples, timing.max_samples) == ("profiler", 5, 10, 10)
    assert (timing.batch_min_ms, timing.flush_l2, timing.baseline_tf32) == (0.0, False, "pytorch_default")
    assert (config.reward.milestone, config.reward.confidence) == ("time_saved", 0.0)  # measured times decide
    assert EvalConfig().reward.confidence == 0.95  # strict: a 95 % lower bound
    assert "PyTorch's default TF32" in describe(config) and "preset paper" in describe(config)
    assert "confidence" not in describe(config) and "at 95% confidence" in describe(EvalConfig())
    overridden = EvalConfig.from_dict({"preset": "paper", "verify": {"trials": 8}})
    assert overridden.verify.trials == 8 and overridden.verify.precision == "cuda-agent"
    assert EvalConfig.from_dict(config.to_dict()) == config


def test_unknown_preset_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match="preset 'papers' is unknown; valid: paper, strict"):
        EvalConfig.from_dict({"preset": "papers"})
    with pytest.raises(ConfigError, match="valid: paper, strict"):
        EvalConfig(preset="papers")


def test_the_paper_config_file_states_exactly_the_preset() -> None:
    data = yaml.safe_load((REPO / "configs" / "presets" / "paper.yaml").read_text())
    assert data.pop("preset") == "paper"
    assert data == preset_settings("paper")


@pytest.mark.parametrize(("speedup", "strict", "paper"), [
    (1.05, 1, 1), (1.051, 2, 1),  # (t0 - t) / t0 = 4.85 %: faster by > 5 % only as a speed-up
    (1 / 0.95, 2, 1),  # exactly 5 % of the time saved is not "more than 5 %"
    (math.nextafter(1 / 0.95, 2.0), 2, 2), (1.2, 2, 2), (0.9, 1, 1),
])
def test_milestone_rules_differ_only_between_a_speedup_of_1_05_and_1_0526(speedup, strict, paper) -> None:
    assert milestone_reward(True, speedup, None, "speedup") == strict
    assert milestone_reward(True, speedup, None, "time_saved") == paper
    assert milestone_reward(False, speedup, speedup, "time_saved") == -1


# Verdict fields the presets are documented to change (docs/environment.md, "Presets"); every other
# field must be the same for an honest solution.
PRESET_DEPENDENT = {
    "preset", "precision_policy", "reward_baseline", "trials", "reward",
    # measurements: a different timing method and loop, so other numbers
    "eager_ms", "compile_ms", "candidate_ms", "speedup_vs_eager", "speedup_vs_compile", "speedups", "baselines",
    "candidate_timing", "phase_seconds", "build", "notes",
    # the milestone rule: strict's confidence bounds, paper's measured speed-ups
    "reward_confidence", "reward_drift", "speedup_vs_eager_lower", "speedup_vs_compile_lower",
    "baseline_sources",  # each preset's baselines are cached apart (another timing method): timed or not
    "baseline_seconds",  # so the seconds their timing took, or none when cached
    "environment",  # per evaluation: the sandbox uid, whether workers were prestarted
    "memory_mb",  # measured per evaluation (resident memory of each worker)
}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["relu", "rmsnorm"])
def test_honest_cpu_solutions_differ_between_presets_only_where_documented(
        name: str, session_cache_dir: Path, scratch_dir: Path, run_evaluation) -> None:
    solution, task = EXAMPLES / "solutions" / "cpu" / f"{name}.py", EXAMPLES / "tasks" / f"{name}.py"
    common = {"device": "cpu", "cache_dir": str(session_cache_dir), "scratch_dir": str(scratch_dir),
              "timing": {"compile_baseline": False}}
    strict = run_evaluation(task, solution, EvalConfig.from_dict({**common, "timing": {
        "compile_baseline": False, "budget_s": 0.3, "min_samples": 3}}))
    paper = run_evaluation(task, solution, EvalConfig.from_dict({**common, "preset": "paper"}))
    assert strict.status is Status.CORRECT and paper.status is Status.CORRECT, (strict.error, paper.error)

    assert (strict.preset, paper.preset) == ("strict", "paper")
    assert (strict.precision_policy, paper.precision_policy) == ("faithful", "cuda-agent")
    assert [t.kind for t in paper.trials] == ["standard"] * 5 + ["post_timing"]
    assert {"scaled"} <= {t.kind for t in strict.trials}
    assert paper.candidate_timing.n == 10 and paper.candidate_timing.calls_per_sample == 1
    assert paper.baselines["eager_tf32_off"].n == 10
    assert strict.reward == milestone_reward(True, strict.speedup_vs_eager_lower, None, "speedup")
    assert paper.reward == milestone_reward(True, paper.speedup_vs_eager, None, "time_saved")
    assert paper.speedup_vs_eager_lower == paper.speedup_vs_eager and paper.reward_confidence == 0  # no bound
    assert (strict.reward_drift, paper.reward_drift) == (DRIFT["cpu"], 0.0)

    strict_json, paper_json = strict.to_json_dict(), paper.to_json_dict()
    assert set(strict_json) == set(paper_json)
    same = {key: (strict_json[key], paper_json[key]) for key in strict_json if key not in PRESET_DEPENDENT}
    assert {key: pair for key, pair in same.items() if pair[0] != pair[1]} == {}
    assert paper.build.cached  # the same build serves both presets
