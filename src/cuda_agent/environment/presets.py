"""Evaluation presets: named starting points for ``EvalConfig``.

``strict`` (the default) is the harness described in docs/environment.md. ``paper`` reproduces the
CUDA Agent paper's released harness, so that verdicts on honest kernels match the numbers its
scripts would give and can be compared with its table:

- correctness: ``allclose`` with atol = rtol = 1e-2 (precision policy ``cuda-agent``) on 5 random
  input sets, without our perturbed-distribution trials;
- timing: ``torch.profiler`` device time (kernels and memory operations) of single calls after 5
  warm-up calls, 10 timed calls, no L2 flush and no batching;
- baselines: PyTorch's default TF32 setting (matmuls off, cuDNN convolutions on);
- milestones: (t0 - t) / t0 > 5 % on the measured times, without a confidence bound.

Everything else (sandbox, guards, the post-timing re-check, audited timed calls, fresh inputs per
timed call) stays as in ``strict``: none of it changes the verdict of an honest kernel.
docs/environment.md lists the remaining differences from the released scripts.
"""

from __future__ import annotations

import copy
from typing import Any

from cuda_agent.registry import Registry

PRESETS: Registry[dict[str, dict[str, Any]]] = Registry("evaluation preset")
PRESETS.register("strict", {})
PRESETS.register("paper", {
    "verify": {"precision": "cuda-agent", "trials": 5, "perturbed_trials": False},
    "timing": {"method": "profiler", "warmup_calls": 5, "warmup_ms": 0.0, "min_samples": 10, "max_samples": 10,
               "target_rel_std_err": 0.99, "batch_min_ms": 0.0, "flush_l2": False,
               "baseline_tf32": "pytorch_default"},
    "reward": {"milestone": "time_saved", "confidence": 0.0},
})


def preset_settings(name: str) -> dict[str, dict[str, Any]]:
    """The sections and values preset ``name`` sets (a copy).

    Raises:
        ConfigError: ``name`` is not a preset; the message lists the valid ones.
    """
    from cuda_agent.environment.config import ConfigError

    if name not in PRESETS:
        raise ConfigError(f"preset {name!r} is unknown; valid: {', '.join(PRESETS.names())}")
    return copy.deepcopy(PRESETS.get(name))


def with_preset(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a nested config mapping with a ``preset`` key) on top of that preset's settings:
    a section of ``data`` overrides the preset's values field by field."""
    merged: dict[str, Any] = preset_settings(data["preset"])
    for key, value in data.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def reward_baseline_setting(config, policy) -> str:
    """The TF32 setting of the baselines the reward compares against (``Verdict.reward_baseline``):
    ``tf32_default`` under ``timing.baseline_tf32: pytorch_default`` on CUDA, else the precision
    policy's choice (``tf32_off``, ``tf32_on`` or ``fastest``; on the CPU all are the same run)."""
    if config.device == "cuda" and config.timing.baseline_tf32 == "pytorch_default":
        return "tf32_default"
    return policy.baseline


def timing_method_key(timing) -> str:
    """The part of the baseline cache key that tells profiler-timed baselines apart (empty for the
    default method, so baselines cached before the method existed stay valid)."""
    return "" if timing.method == "events" else f";method={timing.method};warmup={timing.warmup_calls};" \
        f"samples={timing.min_samples}-{timing.max_samples};flush_l2={timing.flush_l2}"


_BASELINE_WORDS = {"tf32_off": "TF32 off", "tf32_on": "TF32 on", "fastest": "the faster of TF32 off/on",
                   "tf32_default": "PyTorch's default TF32 (matmul off, cuDNN on)"}


def describe(config) -> str:
    """One line naming the preset and what decides a verdict: precision policy, timing method, the
    TF32 setting of the reward's baselines, and the milestone rule (for tables and reports)."""
    from cuda_agent.environment.precision import POLICIES

    setting = reward_baseline_setting(config, POLICIES.get(config.verify.precision))
    baselines = _BASELINE_WORDS[setting] if config.device == "cuda" else "no TF32 on the CPU"
    return (f"preset {config.preset}: precision {config.verify.precision}, {config.timing.method} timing, "
            f"baselines eager/compile with {baselines}, milestone {config.reward.milestone}"
            + (f" at {config.reward.confidence:.0%} confidence" if config.reward.confidence else ""))
