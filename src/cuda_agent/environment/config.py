"""Configuration of one evaluation: one frozen dataclass per component, validated on creation."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cuda_agent.environment.guards.config import GuardConfig

Device = Literal["cpu", "cuda"]


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field, the value and what is allowed."""


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def default_cache_dir() -> Path:
    """Root of the build cache and baseline database: ``$CUDA_AGENT_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/cuda-agent``, else ``~/.cache/cuda-agent``."""
    import os

    if os.environ.get("CUDA_AGENT_CACHE_DIR"):
        return Path(os.environ["CUDA_AGENT_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cuda-agent"


@dataclass(frozen=True)
class BuildConfig:
    cuda_arch: str = "9.0"
    """Target compute capability for nvcc (``TORCH_CUDA_ARCH_LIST`` syntax, e.g. ``9.0`` = sm_90).
    Set explicitly so that compiling needs no GPU."""
    timeout_s: float = 600.0
    """Wall-clock limit of one build, after which the compiler's process group is killed."""
    max_jobs: int = 0
    """Parallel compiler jobs per build (``MAX_JOBS``); 0 = number of CPU cores."""
    extra_cflags: tuple[str, ...] = ("-O3",)
    """Flags for the host C++ compiler (all candidates, both layouts' protected build)."""
    extra_cuda_cflags: tuple[str, ...] = ("-O3",)
    """Flags for nvcc in the agent-workdir layout's protected build."""
    log_tail_lines: int = 60
    """How many trailing lines of compiler output a failed build reports."""

    def __post_init__(self) -> None:
        _require(self.timeout_s > 0, f"build.timeout_s must be > 0, got {self.timeout_s}")
        _require(self.max_jobs >= 0, f"build.max_jobs must be >= 0, got {self.max_jobs}")
        parts = self.cuda_arch.replace("+PTX", "").split(".")
        _require(
            len(parts) == 2 and all(p.isdigit() for p in parts),
            f"build.cuda_arch must look like '9.0' (compute capability), got {self.cuda_arch!r}",
        )


@dataclass(frozen=True)
class VerifyConfig:
    trials: int = 5
    """Standard correctness trials, each with a fresh secret seed (at least 5)."""
    perturbed_trials: bool = True
    """Also run the perturbed-distribution trials (scaled inputs; sign-symmetric inputs where the
    task's inputs are non-negative and the reference stays finite)."""
    perturb_scale: float = 4.0
    """Factor applied to floating-point inputs in the ``scaled`` trial."""
    post_timing_check: bool = True
    """Re-check the candidate on fresh inputs after the timing loop (call-count and cache tricks)."""
    precision: str = "faithful"
    """Precision policy name (see ``cuda_agent.environment.precision.POLICIES``)."""
    init_seed: int = 42
    """Seed under which both ``Model`` and ``ModelNew`` are constructed (KernelBench convention)."""
    require_extension_call: bool = True
    """Every forward pass must call into the compiled extension (runtime guard ``no-custom-kernel``).
    Turn off only to test other parts of the harness with plain-PyTorch candidates."""

    def __post_init__(self) -> None:
        _require(self.trials >= 5, f"verify.trials must be >= 5 (DESIGN §3), got {self.trials}")
        _require(self.perturb_scale > 0, f"verify.perturb_scale must be > 0, got {self.perturb_scale}")
        from cuda_agent.environment.precision import POLICIES

        _require(
            self.precision in POLICIES,
            f"verify.precision {self.precision!r} is unknown; valid: {', '.join(POLICIES.names())}",
        )


@dataclass(frozen=True)
class TimingConfig:
    warmup_calls: int = 3
    """Untimed calls before measuring (first-call costs: lazy init, autotuning, caches)."""
    warmup_ms: float = 200.0
    """Keep warming up for at least this long: a GPU idling between evaluations needs time to
    ramp its clocks, and a µs-scale kernel would otherwise be timed at idle clocks."""
    min_samples: int = 10
    """Timed calls before the precision target may stop the loop."""
    max_samples: int = 1000
    """Hard cap on timed calls."""
    target_rel_std_err: float = 0.005
    """Stop once std/sqrt(n)/mean is at most this (0.5 %)."""
    budget_s: float = 5.0
    """Wall-clock budget for one timed loop; the loop stops (flagged) when it runs out."""
    flush_l2: bool = True
    """On CUDA, overwrite a buffer twice the L2 size before every timed call."""
    compile_baseline: bool = True
    """Also time ``torch.compile(Model)``; without it the reward cannot reach 3."""
    compile_mode: str = "default"
    """``torch.compile`` mode for the compiled baseline (``default``, ``reduce-overhead``,
    ``max-autotune``, ``max-autotune-no-cudagraphs``)."""

    def __post_init__(self) -> None:
        _require(self.warmup_calls >= 1, f"timing.warmup_calls must be >= 1, got {self.warmup_calls}")
        _require(self.warmup_ms >= 0, f"timing.warmup_ms must be >= 0, got {self.warmup_ms}")
        _require(self.min_samples >= 3, f"timing.min_samples must be >= 3, got {self.min_samples}")
        _require(
            self.max_samples >= self.min_samples,
            f"timing.max_samples ({self.max_samples}) must be >= timing.min_samples ({self.min_samples})",
        )
        _require(0 < self.target_rel_std_err < 1,
                 f"timing.target_rel_std_err must be in (0, 1), got {self.target_rel_std_err}")
        _require(self.budget_s > 0, f"timing.budget_s must be > 0, got {self.budget_s}")
        modes = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
        _require(self.compile_mode in modes, f"timing.compile_mode must be one of {modes}, got {self.compile_mode!r}")


@dataclass(frozen=True)
class LimitsConfig:
    task_timeout_s: float = 900.0
    """Limit for loading the task, generating inputs and timing the baselines (first, uncached
    ``torch.compile`` included)."""
    candidate_timeout_s: float = 300.0
    """Limit for loading the candidate and running all its correctness trials."""
    timing_timeout_s: float = 120.0
    """Limit for the candidate's timing loop (its budget plus slack)."""
    mem_mb: int = 16384
    """Resident-memory limit of the candidate process; on the CPU backend also its address space."""

    def __post_init__(self) -> None:
        for name in ("task_timeout_s", "candidate_timeout_s", "timing_timeout_s"):
            _require(getattr(self, name) > 0, f"limits.{name} must be > 0, got {getattr(self, name)}")
        _require(self.mem_mb >= 512, f"limits.mem_mb must be >= 512, got {self.mem_mb}")


@dataclass(frozen=True)
class EvalConfig:
    """Everything one evaluation needs besides the task and the solution."""

    device: Device = "cuda"
    """``cuda`` (the target) or ``cpu`` (the CPU backend: C++ candidates, same pipeline)."""
    build: BuildConfig = field(default_factory=BuildConfig)
    verify: VerifyConfig = field(default_factory=VerifyConfig)
    timing: TimingConfig = field(default_factory=TimingConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    guards: GuardConfig = field(default_factory=GuardConfig)
    """Static guards run on the sources before anything is built (docs/guards.md)."""
    cache_dir: Path = field(default_factory=default_cache_dir)
    """Build cache and baseline database live here."""
    scratch_dir: Path | None = None
    """Where per-evaluation temporary files go (inputs, outputs); default: /dev/shm if writable,
    else the system temp dir. Always removed after the evaluation."""

    def __post_init__(self) -> None:
        _require(self.device in ("cpu", "cuda"), f"device must be 'cpu' or 'cuda', got {self.device!r}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "EvalConfig":
        """Build from a nested mapping (e.g. parsed YAML); unknown keys are an error."""
        sections = {"build": BuildConfig, "verify": VerifyConfig, "timing": TimingConfig, "limits": LimitsConfig,
                    "guards": GuardConfig}
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        _require(not unknown, f"unknown config keys {sorted(unknown)}; valid: {sorted(known)}")
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key in sections:
                section_cls = sections[key]
                valid = {f.name for f in dataclasses.fields(section_cls)}
                bad = set(value) - valid
                _require(not bad, f"unknown keys {sorted(bad)} in config section {key!r}; valid: {sorted(valid)}")
                kwargs[key] = section_cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in value.items()})
            elif key in ("cache_dir", "scratch_dir"):
                kwargs[key] = Path(value) if value is not None else None
            else:
                kwargs[key] = value
        return cls(**kwargs)

    def replace(self, **changes: Any) -> "EvalConfig":
        return dataclasses.replace(self, **changes)
