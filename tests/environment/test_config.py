"""Configuration validation: every bad value is rejected with a message naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuda_agent.environment import (
    BuildConfig, ConfigError, EvalConfig, LimitsConfig, TimingConfig, VerifyConfig,
)
from cuda_agent.environment.config import RewardConfig, default_cache_dir


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: BuildConfig(timeout_s=0), "build.timeout_s"),
        (lambda: BuildConfig(max_jobs=-1), "build.max_jobs"),
        (lambda: BuildConfig(cuda_arch="sm_90"), "build.cuda_arch"),
        (lambda: BuildConfig(cuda_arch="9"), "build.cuda_arch"),
        (lambda: VerifyConfig(trials=4), "verify.trials"),
        (lambda: VerifyConfig(perturb_scale=0), "verify.perturb_scale"),
        (lambda: VerifyConfig(precision="fp16"), "verify.precision"),
        (lambda: TimingConfig(warmup_calls=0), "timing.warmup_calls"),
        (lambda: TimingConfig(min_samples=2), "timing.min_samples"),
        (lambda: TimingConfig(min_samples=20, max_samples=10), "timing.max_samples"),
        (lambda: TimingConfig(target_rel_std_err=0), "timing.target_rel_std_err"),
        (lambda: TimingConfig(target_rel_std_err=1.5), "timing.target_rel_std_err"),
        (lambda: TimingConfig(budget_s=0), "timing.budget_s"),
        (lambda: TimingConfig(compile_mode="fast"), "timing.compile_mode"),
        (lambda: LimitsConfig(task_timeout_s=0), "limits.task_timeout_s"),
        (lambda: LimitsConfig(candidate_timeout_s=-1), "limits.candidate_timeout_s"),
        (lambda: LimitsConfig(timing_timeout_s=0), "limits.timing_timeout_s"),
        (lambda: LimitsConfig(mem_mb=100), "limits.mem_mb"),
        (lambda: EvalConfig(device="tpu"), "device"),
        (lambda: RewardConfig(confidence=1.0), "reward.confidence"),
        (lambda: RewardConfig(confidence=0.3), "reward.confidence"),
        (lambda: RewardConfig(resample_budget_s=-1), "reward.resample_budget_s"),
    ],
)
def test_invalid_value_raises_config_error_naming_the_field(make, field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        make()


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


def test_unknown_precision_error_lists_the_valid_policies() -> None:
    with pytest.raises(ConfigError, match="valid: cuda-agent, faithful, kernelbench, tf32"):
        VerifyConfig(precision="bogus")


def test_valid_boundary_values_are_accepted() -> None:
    VerifyConfig(trials=5)
    TimingConfig(min_samples=3, max_samples=3, warmup_calls=1)
    LimitsConfig(mem_mb=512)
    BuildConfig(cuda_arch="8.0+PTX", max_jobs=0)


def test_configs_are_frozen() -> None:
    config = EvalConfig(device="cpu")
    with pytest.raises(AttributeError):
        config.device = "cuda"  # type: ignore[misc]


def test_from_dict_builds_nested_sections(tmp_path: Path) -> None:
    config = EvalConfig.from_dict({
        "device": "cpu",
        "cache_dir": str(tmp_path),
        "build": {"extra_cflags": ["-O2", "-g"]},
        "verify": {"trials": 7, "precision": "kernelbench"},
        "timing": {"budget_s": 0.5, "compile_baseline": False},
        "limits": {"mem_mb": 2048},
    })
    assert config.device == "cpu" and config.cache_dir == tmp_path
    assert config.build.extra_cflags == ("-O2", "-g")
    assert config.verify.trials == 7 and config.verify.precision == "kernelbench"
    assert config.timing.budget_s == 0.5 and not config.timing.compile_baseline
    assert config.limits.mem_mb == 2048
    assert config.scratch_dir is None


def test_from_dict_rejects_unknown_top_level_keys() -> None:
    with pytest.raises(ConfigError, match=r"unknown config keys \['verfy'\]"):
        EvalConfig.from_dict({"verfy": {}})


def test_from_dict_rejects_unknown_keys_in_a_section_naming_section_and_key() -> None:
    with pytest.raises(ConfigError, match=r"unknown keys \['budget'\] in config section 'timing'"):
        EvalConfig.from_dict({"timing": {"budget": 1}})


def test_from_dict_validates_section_values() -> None:
    with pytest.raises(ConfigError, match=r"verify\.trials must be >= 5"):
        EvalConfig.from_dict({"verify": {"trials": 1}})


def test_default_cache_dir_prefers_cuda_agent_cache_dir(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CUDA_AGENT_CACHE_DIR", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "a"
    monkeypatch.delenv("CUDA_AGENT_CACHE_DIR")
    assert default_cache_dir() == tmp_path / "xdg" / "cuda-agent"


def test_replace_returns_a_new_config() -> None:
    config = EvalConfig(device="cpu")
    other = config.replace(device="cuda")
    assert config.device == "cpu" and other.device == "cuda"
