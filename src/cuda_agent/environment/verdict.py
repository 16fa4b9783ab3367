"""Typed evaluation results: what one evaluation of a candidate concluded, and why."""

from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from cuda_agent.unicode_text import encodable_text


class Status(str, enum.Enum):
    """Where an evaluation ended. Only ``CORRECT`` earns a positive reward."""

    CORRECT = "correct"
    INCORRECT = "incorrect"  # ran, but outputs did not match the reference
    COMPILE_ERROR = "compile_error"
    GUARD_VIOLATION = "guard_violation"  # static or runtime guard tripped
    RUNTIME_ERROR = "runtime_error"  # candidate raised, or its process died (segfault, abort)
    TIMEOUT = "timeout"  # candidate exceeded a time limit
    OUT_OF_MEMORY = "out_of_memory"
    TASK_ERROR = "task_error"  # the reference itself failed: not the candidate's fault
    SOLUTION_ERROR = "solution_error"  # unreadable solution layout, missing ModelNew
    INFRA_ERROR = "infra_error"  # a compiler or worker was killed from outside: no judgement, reward 0, retry


@dataclass(frozen=True)
class Violation:
    """A broken rule. ``code`` is stable (documented in docs/), ``message`` is one line for humans."""

    code: str
    message: str


@dataclass(frozen=True)
class TimingStats:
    """Repeated timing of one callable. All times in milliseconds; never rounded."""

    median_ms: float
    mean_ms: float
    std_ms: float
    n: int
    rel_std_err: float  # std / sqrt(n) / mean
    budget_exhausted: bool  # stopped on the time budget before reaching the target precision
    calls_per_sample: int = 1  # back-to-back calls per timed sample (a sample is their mean)
    median_rel_err: float | None = None
    """Standard error of ``median_ms`` over it, from the order statistics around the median
    (``timing.median_rel_err``); None where not recorded (timings made before it existed)."""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TimingStats":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass(frozen=True)
class TrialResult:
    """One correctness trial: one fresh secret input set, one comparison."""

    index: int
    kind: str  # "standard" | "scaled" | "sign_symmetric" | "post_timing"
    passed: bool
    message: str  # why it failed, or a summary of the error metrics
    max_abs_err: float | None = None
    error_ratio: float | None = None  # candidate error / eager fp32 error (faithful policies)


@dataclass(frozen=True)
class BuildInfo:
    """How the candidate's extension was built."""

    cached: bool
    seconds: float
    key: str
    log_tail: str = ""
    compile_stats: dict[str, int] = field(default_factory=dict)
    """Translation units compiled, object-cache hits and units that used the precompiled header."""


@dataclass
class Verdict:
    """The trusted evaluator's conclusion about one candidate on one task.

    The first fields are the stable JSON contract of ``cuda-agent verify --json`` (README).
    """

    compiled: bool
    correct: bool
    reward: int
    eager_ms: float | None
    compile_ms: float | None
    candidate_ms: float | None
    speedup_vs_eager: float | None
    speedup_vs_compile: float | None
    violations: list[Violation]
    error: str | None
    precision_policy: str
    status: Status
    device: str
    task: str
    preset: str = "strict"  # the evaluation preset the settings started from (environment/presets.py)
    # Speed-ups against each baseline variant ("eager_tf32_off", "compile_tf32_on", ...).
    speedups: dict[str, float] = field(default_factory=dict)
    speedup_vs_eager_lower: float | None = None
    """One-sided lower confidence bound of ``speedup_vs_eager`` at ``reward_confidence``, from both
    medians' standard errors: the reward's milestones are decided on the bounds (equal to the
    speed-ups when the confidence is 0, as in the ``paper`` preset)."""
    speedup_vs_compile_lower: float | None = None
    """The same for ``speedup_vs_compile``."""
    reward_confidence: float = 0.0
    """The confidence of those bounds (``reward.confidence``)."""
    reward_drift: float = 0.0
    """The between-verdict spread each median was given in those bounds (``reward.drift`` or the
    backend's default; 0 without a bound)."""
    baselines: dict[str, TimingStats] = field(default_factory=dict)
    baseline_sources: dict[str, str] = field(default_factory=dict)
    """Per baseline variant: ``cache`` (an entry timed by an earlier verdict at least as thoroughly,
    under a comparable load) or ``timed`` (measured by this verdict); a note gives each one's
    sample count and spread."""
    baseline_seconds: dict[str, float] = field(default_factory=dict)
    """Where the ``baselines`` phase went when this verdict timed any: ``compile`` (building
    ``torch.compile(Model)`` and its first run under each TF32 setting it is timed with; on a
    shared GPU that ran ahead, unheld, as ``compile_unheld``) and each timed variant's loop,
    warm-up included. Empty when every baseline came from the cache."""
    candidate_timing: TimingStats | None = None
    reward_baseline: str = "tf32_off"  # TF32 setting of the reward's baselines: tf32_off, tf32_on, fastest, tf32_default
    trials: list[TrialResult] = field(default_factory=list)
    build: BuildInfo | None = None
    notes: list[str] = field(default_factory=list)  # non-fatal findings (weights, fallbacks)
    phase_seconds: dict[str, float] = field(default_factory=dict)
    device_seconds: dict[str, float] = field(default_factory=dict)
    """On a GPU shared by several evaluations (``environment["device_shared"]`` says how many),
    seconds within this one's phases: ``wait`` (for its turns on the device), ``measure`` (holding
    it alone) and ``use`` (holding it beside other evaluations' untimed work). Empty: not shared."""
    device_turns: list[dict[str, Any]] = field(default_factory=list)
    """On a shared GPU, each of this verdict's turns on it in order: the ``phase`` it served
    (``slot_warm`` first: its prestarted workers making their device contexts, before the
    verdict began), its ``mode`` (``measure`` or ``use``), when it was asked for (``asked_at``,
    seconds since the epoch), ``wait_s`` and ``held_s``. The turns of a GPU's evaluations side by
    side are its timeline: how long it was held alone, held shared, or not held at all.
    ``device_seconds`` counts the verdict's own phases only (not ``slot_warm``)."""
    environment: dict[str, str] = field(default_factory=dict)
    problem_bytes: dict[str, int | None] = field(default_factory=dict)
    """The problem's size, measured before anything was allocated: ``input_bytes``,
    ``largest_input_bytes``, ``output_bytes`` (None when unknown), ``parameter_bytes``."""
    memory_mb: dict[str, dict[str, float]] = field(default_factory=dict)
    """Memory per worker (``reference``, ``candidate``): ``loaded_host_mb`` (resident once its code
    and model are loaded, before any input exists) and ``peak_host_mb`` (resident at its highest),
    both read by the trusted parent, and on CUDA ``peak_device_mb`` and ``peak_device_reserved_mb``
    (allocated and held from the device, as the worker reports them)."""

    def to_json_dict(self) -> dict[str, Any]:
        """Plain JSON-safe data: non-finite floats (an error ratio of inf) become ``None``, and text
        that UTF-8 cannot encode (a lone surrogate in a candidate's exception) gets U+FFFD instead."""
        data = asdict(self)
        data["status"] = self.status.value
        return _finite_or_none(data)

    @classmethod
    def from_json_dict(cls, data: dict[str, Any]) -> "Verdict":
        """The inverse of :meth:`to_json_dict`, for verdicts that crossed a process or network
        boundary (pool workers, the service). Non-finite floats come back as ``None``.

        Raises:
            KeyError, TypeError, ValueError: ``data`` is not a verdict's JSON form.
        """
        fields = dict(data)
        fields["status"] = Status(fields["status"])
        fields["violations"] = [Violation(**v) for v in fields["violations"]]
        fields["baselines"] = {k: TimingStats.from_dict(v) for k, v in (fields.get("baselines") or {}).items()}
        if fields.get("candidate_timing") is not None:
            fields["candidate_timing"] = TimingStats.from_dict(fields["candidate_timing"])
        fields["trials"] = [TrialResult(**t) for t in fields.get("trials") or []]
        if fields.get("build") is not None:
            fields["build"] = BuildInfo(**fields["build"])
        return cls(**fields)


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return encodable_text(value)
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_none(v) for v in value]
    return value
