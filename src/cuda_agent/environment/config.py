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
    lean: bool = True
    """Compile through cuda-agent's lean path (docs/performance.md); False: torch's JIT builder
    (ninja, ``torch/extension.h`` parsed in every unit), as before it, for comparison or as a
    fallback. A workdir in the fast (launcher) contract always builds the lean way: torch's
    builder has no launcher shim."""
    precompiled_header: bool = True
    """Precompile ``torch/extension.h`` once per toolchain and ``extra_cflags`` (GCC PCH in the
    cache) and use it for every C++ unit that includes it first with those flags."""

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
    """Every forward pass must call into the compiled extension (runtime guard ``no-custom-kernel``)
    and run no ATen compute operator (``torch-compute-at-runtime``). Turn off only to test other
    parts of the harness with plain-PyTorch candidates."""
    timed_audits: int = 5
    """Timed calls, picked uniformly at random while timing, whose outputs are captured right after
    the timer stops and checked against the reference (``timed-output-incorrect``): a candidate that
    behaves differently when timed than when verified is caught. The reward uses the median, so a
    cheat must be wrong on over half the timed calls to gain; it escapes all ``k`` audits with
    probability below ``2^-k`` (5: 3%, an expected reward below zero). 0 turns the audit off."""

    plausible_speedup: float = 50.0
    """On CUDA, a speed-up over eager above this is re-measured with the host clock around a
    device-wide synchronize (no CUDA events); the slower of the two timings counts, and the verdict
    says so in its notes."""

    def __post_init__(self) -> None:
        _require(self.trials >= 5, f"verify.trials must be >= 5 (fewer leave input-specific hacks undetected), got {self.trials}")
        _require(self.plausible_speedup > 1, f"verify.plausible_speedup must be > 1, got {self.plausible_speedup}")
        _require(0 <= self.timed_audits <= 32, f"verify.timed_audits must be in 0..32, got {self.timed_audits}")
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
    ramp its clocks, and a µs-scale kernel would otherwise be timed at idle clocks. Skipped where
    NVML reads the SM clock near its maximum already (``device_clock.sm_clock_ramped``: the GPU
    was busy just before, as between the evaluations of a check or a training step)."""
    min_samples: int = 10
    """Timed calls before the precision target may stop the loop."""
    max_samples: int = 1000
    """Hard cap on timed calls."""
    target_rel_std_err: float = 0.005
    """Stop once std/sqrt(n)/mean is at most this (0.5 %), or the median's relative standard error
    at most this times sqrt(pi/2) (the same precision for normal samples: 0.63 %)."""
    budget_s: float = 1.5
    """Wall-clock budget for one timed loop after its warm-up. Stopping rule: the loop ends as soon
    as it has ``min_samples`` samples precise enough (``target_rel_std_err``, by the mean's or the
    median's error: ``timing.precise_enough``), or ``max_samples``, or, once this budget is spent
    and at least 3 samples exist, with what it has (``budget_exhausted`` in the stats)."""
    flush_l2: bool = True
    """On CUDA, overwrite a buffer twice the L2 size before every timed call."""
    compile_baseline: bool = True
    """Also time ``torch.compile(Model)``; without it the reward cannot reach 3."""
    compile_mode: str = "default"
    """``torch.compile`` mode for the compiled baseline (``default``, ``reduce-overhead``,
    ``max-autotune``, ``max-autotune-no-cudagraphs``)."""
    input_noise: float = 2.0 ** -7
    """Every timed call gets fresh inputs: each floating-point element multiplied by its own random
    factor in ``1 ± input_noise`` (signs and domains kept, values never repeat, no global scale an
    analytical shortcut could exploit). The reference reproduces them to check audited calls."""
    batch_min_ms: float = 1.0
    """A timed sample is a batch of back-to-back calls between two device-wide synchronisations,
    as many as make the batch last at least this long (sized from the warm-up's fastest call, then
    once more from one untimed batch), so the
    synchronisation latency does not swamp µs kernels; 0 = one call per sample. Batching is used
    only while the static guards forbid side streams (otherwise consecutive calls could overlap on
    streams of their own): the evaluator then times with one call per sample."""
    batch_max_calls: int = 256
    """Most calls in one batch."""
    batch_mem_mb: int = 2048
    """Most memory a batch may hold: every call's prepared inputs and its outputs until the batch
    ends."""
    method: Literal["events", "profiler"] = "events"
    """How a sample is measured on CUDA: ``events`` (CUDA events around the calls and a device-wide
    synchronize: wall time on the device, launch gaps and idle included) or ``profiler`` (the sum
    of the calls' kernel and memory-operation durations recorded by ``torch.profiler``: busy time
    only, the CUDA Agent paper's method). The CPU backend always uses the host clock."""
    baseline_tf32: Literal["policy", "pytorch_default"] = "policy"
    """Which TF32 setting the reward's baselines run with on CUDA: ``policy`` (the precision
    policy's choice: TF32 off, on, or the faster of the two) or ``pytorch_default`` (PyTorch's
    defaults, TF32 off for matmuls and on for cuDNN convolutions, as in the paper's harness)."""

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
        _require(0 < self.input_noise < 0.5, f"timing.input_noise must be in (0, 0.5), got {self.input_noise}")
        _require(self.batch_min_ms >= 0, f"timing.batch_min_ms must be >= 0, got {self.batch_min_ms}")
        _require(self.batch_max_calls >= 1, f"timing.batch_max_calls must be >= 1, got {self.batch_max_calls}")
        _require(self.batch_mem_mb >= 1, f"timing.batch_mem_mb must be >= 1, got {self.batch_mem_mb}")
        _require(self.method in ("events", "profiler"), f"timing.method must be 'events' or 'profiler', got {self.method!r}")
        _require(self.baseline_tf32 in ("policy", "pytorch_default"),
                 f"timing.baseline_tf32 must be 'policy' or 'pytorch_default', got {self.baseline_tf32!r}")


@dataclass(frozen=True)
class RewardConfig:
    """The milestone rule of the reward (see ``cuda_agent.environment.reward``)."""

    milestone: str = "speedup"
    """When a candidate counts as faster than a baseline: ``speedup`` (baseline time / candidate
    time > 1.05) or ``time_saved`` ((t0 - t) / t0 > 5 %, the paper's rule, i.e. a speed-up above
    1/0.95 = 1.0526)."""
    confidence: float = 0.95
    """One-sided confidence that an awarded milestone's speed-up is real: a milestone is awarded
    only when the lower confidence bound of the speed-up (from both medians' standard errors)
    clears the threshold, so a false award has at most a ``1 - confidence`` chance. 0: the
    measured speed-up itself decides (the paper's rule)."""
    drift: float | None = None
    """How much one median timing varies between verdicts beyond its loop's own error (relative
    standard deviation): the bound counts it for both medians, so the false-award rate holds for
    what a single timing loop cannot see (load, clocks, the core a fresh worker gets, a cached
    baseline timed earlier). None: the backend's measured default (2 % CPU, 1 % CUDA;
    ``bench/reward_stability.py`` measures it on a machine). 0: the loops' errors alone."""
    resample_budget_s: float = 3.0
    """When a speed-up clears a threshold but its bound does not, the candidate is timed once more,
    for up to this long, towards the precision the bound needs (the second timing replaces the
    first; ``confidence`` is split over the two). 0: never."""

    def __post_init__(self) -> None:
        from cuda_agent.environment.reward import MILESTONES

        _require(self.milestone in MILESTONES,
                 f"reward.milestone {self.milestone!r} is unknown; valid: {', '.join(MILESTONES.names())}")
        _require(self.confidence == 0 or 0.5 <= self.confidence < 1,
                 f"reward.confidence must be 0 (no bound) or in [0.5, 1), got {self.confidence}")
        _require(self.drift is None or 0 <= self.drift < 1,
                 f"reward.drift must be null (the backend's default) or in [0, 1), got {self.drift}")
        _require(self.resample_budget_s >= 0, f"reward.resample_budget_s must be >= 0, got {self.resample_budget_s}")


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
    """Resident-memory limit of the candidate process. On the CPU backend its address space is also
    capped before the candidate is loaded, at what is mapped then plus the part of this limit not
    yet resident, so a huge allocation fails inside the candidate (``MemoryError``)."""
    reference_mem_mb: int = 0
    """Host memory the trusted reference worker may hold (its own, anonymous resident memory); 0:
    what the host has available when the evaluation starts. A problem that needs more cannot be
    judged on this host: a ``task_error`` naming the bytes, never the candidate's fault. On the CPU
    backend its address space is capped there too, so an allocation past it fails cleanly."""
    max_processes: int = 4096
    """``RLIMIT_NPROC`` of the sandboxed candidate: processes *and threads* of its sandbox user (a fork
    bomb stops here). Only enforced when the sandbox switches to an unprivileged user."""
    max_file_mb: int = 16384
    """``RLIMIT_FSIZE`` of the candidate: the largest file it may write (its outputs and its log)."""
    disk_mb: int = 16384
    """Total size of the files the candidate may write: its workdir, its outputs folder and its
    extension copy (watched twice a second; past it the candidate is killed), and, in the sandbox,
    each of its private ``/tmp``, ``/var/tmp`` and ``/dev/shm`` (tmpfs mounts of this size)."""
    cpu_s: int = 3600
    """``RLIMIT_CPU`` of the candidate: CPU seconds summed over its threads (a backstop to the
    wall-clock limits above)."""

    def __post_init__(self) -> None:
        for name in ("task_timeout_s", "candidate_timeout_s", "timing_timeout_s"):
            _require(getattr(self, name) > 0, f"limits.{name} must be > 0, got {getattr(self, name)}")
        _require(self.mem_mb >= 512, f"limits.mem_mb must be >= 512, got {self.mem_mb}")
        _require(self.reference_mem_mb == 0 or self.reference_mem_mb >= 512,
                 f"limits.reference_mem_mb must be 0 (what the host has) or >= 512, got {self.reference_mem_mb}")
        _require(self.max_processes >= 64, f"limits.max_processes must be >= 64, got {self.max_processes}")
        _require(self.max_file_mb >= 1, f"limits.max_file_mb must be >= 1, got {self.max_file_mb}")
        _require(self.cpu_s >= 1, f"limits.cpu_s must be >= 1, got {self.cpu_s}")
        _require(self.disk_mb >= 64, f"limits.disk_mb must be >= 64, got {self.disk_mb}")


@dataclass(frozen=True)
class SandboxConfig:
    """Where and as whom the untrusted candidate process runs (docs/security.md)."""

    mode: Literal["auto", "on", "off"] = "auto"
    """``on``: run the candidate as an unprivileged user of its own (requires root; an error
    otherwise); ``auto``: do so when running as root, else run as the current user and say so in
    the verdict; ``off``: never switch user."""
    uid_base: int = 61000
    """First uid of the sandbox range; evaluation slot ``i`` runs as uid ``uid_base + i``, so
    concurrent evaluations never share a user and each one's leftovers can be killed by uid."""
    slots: int = 256
    """Size of the uid range: how many sandboxed evaluations may run at once on this host."""
    isolate_network: bool = True
    """Put the candidate in a fresh network namespace (no interfaces but loopback) when the
    sandbox is on; if the kernel refuses, the verdict's environment says so."""

    def __post_init__(self) -> None:
        _require(self.mode in ("auto", "on", "off"), f"sandbox.mode must be 'auto', 'on' or 'off', got {self.mode!r}")
        _require(1000 <= self.uid_base <= 2**31 - 1 - self.slots,
                 f"sandbox.uid_base must be a free uid range start >= 1000, got {self.uid_base}")
        _require(1 <= self.slots <= 65536, f"sandbox.slots must be in 1..65536, got {self.slots}")


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
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """Unprivileged user, network namespace and read-only files for the candidate (docs/security.md)."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    preset: str = "strict"
    """The preset these settings started from (``cuda_agent.environment.presets``), named in every
    verdict. In a mapping given to :meth:`from_dict`, its values are applied first and the
    mapping's own sections on top."""
    cache_dir: Path = field(default_factory=default_cache_dir)
    """Build cache and baseline database live here."""
    scratch_dir: Path | None = None
    """Where per-evaluation temporary files go (inputs, outputs); default: /dev/shm if writable,
    else the system temp dir. Always removed after the evaluation."""

    def __post_init__(self) -> None:
        _require(self.device in ("cpu", "cuda"), f"device must be 'cpu' or 'cuda', got {self.device!r}")
        from cuda_agent.environment.presets import PRESETS

        _require(self.preset in PRESETS, f"preset {self.preset!r} is unknown; valid: {', '.join(PRESETS.names())}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "EvalConfig":
        """Build from a nested mapping (e.g. parsed YAML); unknown keys are an error. A ``preset``
        key applies that preset's settings first (the mapping's sections override them)."""
        from cuda_agent.environment.presets import with_preset

        sections = {"build": BuildConfig, "verify": VerifyConfig, "timing": TimingConfig, "limits": LimitsConfig,
                    "guards": GuardConfig, "sandbox": SandboxConfig, "reward": RewardConfig}
        if "preset" in data:
            data = with_preset(data)
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

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready nested mapping that :meth:`from_dict` turns back into an equal config (for
        configs sent to pool workers, Ray actors and services)."""
        data = dataclasses.asdict(self)
        data["cache_dir"] = str(self.cache_dir)
        data["scratch_dir"] = None if self.scratch_dir is None else str(self.scratch_dir)
        return data

    def replace(self, **changes: Any) -> "EvalConfig":
        return dataclasses.replace(self, **changes)
