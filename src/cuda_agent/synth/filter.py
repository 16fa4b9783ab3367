"""The execution filter: keep only composed tasks that make good training problems.

Each rule is a named reason, so a run can report its funnel. In order (cheapest first):

``import-error``        the task does not import or ``Model(*get_init_inputs())`` fails
``eager-error``         an eager forward pass raises
``too-much-memory``     one forward pass needs more than ``max_memory_mb``, or runs out of device memory
``degenerate-output``   outputs are near-constant, tiny relative to the tolerance, or not finite
``nondeterministic``    two runs on the same inputs differ (random ops in ``forward``)
``input-independent``   different input seeds, or re-drawing one input, leave the outputs unchanged
``writes-input``        the forward pass writes into an input (a candidate may not: the verdict's
                        guard flags it, so the task's own reference could not pass its self-check)
``returns-input``       an output is a view of an input (``unbind(x)[0]``): a candidate's outputs must
                        be fresh tensors, so the task's own reference could not pass its self-check
``rounding-shape``      an output's shape differs between float64 and float32 (``unique`` or
                        ``nonzero`` of floats) on one of ``rounding_seeds`` inputs: the verdict
                        cannot judge any candidate against it
``too-fast`` / ``too-slow``  eager time outside ``window_ms`` (paper: 1-100 ms on the target GPU)
``compile-error``       ``torch.compile(Model)`` fails to build or run
``timeout`` / ``worker-died``  the task hung or killed its worker

Task code runs in the trusted reference worker of the evaluation environment (its own process,
with a memory limit and a timeout per step), never in the caller. The checks' forward passes and
the timing take the device's measurement lock (:mod:`cuda_agent.synth.device_lock`), so lanes
never time while another runs the GPU; only ``torch.compile`` (building, then a warm-up call)
runs outside it, so compilation proceeds in parallel. A lane given a :class:`LaneDevice` works on
that GPU alone: its worker sees only it, and it takes that GPU's lock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuda_agent.environment.config import TimingConfig
from cuda_agent.environment.degenerate import DEFAULT_ATOL
from cuda_agent.environment.worker import RemoteError, WorkerError, WorkerProcess, WorkerTimeout, child_env
from cuda_agent.synth.device_lock import measuring
from cuda_agent.synth.devices import LaneDevice
from cuda_agent.synth.records import TaskRecord

REASONS = ("import-error", "eager-error", "too-much-memory", "degenerate-output", "nondeterministic",
           "input-independent", "writes-input", "returns-input", "rounding-shape", "too-fast", "too-slow",
           "compile-error", "timeout", "worker-died")
"""Every reason a task can be rejected for, in the order the rules run."""

_DEGENERACY_REASONS = {
    "nondeterministic": "nondeterministic",
    "seed-insensitive": "input-independent",
    "input-ignored": "input-independent",
    "constant-output": "degenerate-output",
    "tiny-output": "degenerate-output",
    "non-finite-output": "degenerate-output",
    "input-mutated": "writes-input",
    "output-aliases-input": "returns-input",
}

DEFAULT_WINDOWS_MS = {"cuda": (1.0, 100.0), "cpu": (0.5, 1000.0)}
"""Accepted eager time per device: the paper's window on GPUs; a wider one for the CPU backend."""

DEFAULT_MAX_MEMORY_MB = {"cuda": 4096.0, "cpu": 16384.0}
"""Memory bound per device: 4 GB lets 16 lanes share an 80 GB GPU."""

def _filter_timing() -> TimingConfig:
    return TimingConfig(warmup_calls=2, warmup_ms=50.0, min_samples=5, max_samples=200,
                        target_rel_std_err=0.02, budget_s=1.0)


@dataclass
class FilterConfig:
    device: str = "cpu"
    window_ms: tuple[float, float] | None = None
    """Accepted eager time; ``None`` takes the device's default (:data:`DEFAULT_WINDOWS_MS`)."""
    max_memory_mb: float | None = None
    """Bound on one forward pass (see ``footprint`` in the reference worker for what is counted);
    ``None`` takes the device's default (:data:`DEFAULT_MAX_MEMORY_MB`). Lanes share the device:
    on a GPU, lanes x this bound must fit its memory."""
    compile: bool = True
    """Require ``torch.compile`` to work and record its time (``compile_ms``)."""
    degenerate_atol: float = DEFAULT_ATOL
    """Outputs whose magnitude is below this are ``degenerate-output`` (zeros would pass)."""
    degenerate_seeds: int = 3
    rounding_seeds: int = 8
    """Inputs on which a forward with a value-shaped operator (``unique``, ``nonzero``) is run in
    float64 and float32 for ``rounding-shape``: a shape may change with rounding on a few inputs only."""
    timing: TimingConfig = field(default_factory=_filter_timing)
    step_timeout_s: float = 300.0
    """Limit on each step (import, one forward, compile, timing) before the task is ``timeout``."""
    worker_mem_mb: int | None = None
    """RSS limit of the worker process; ``None`` for none."""
    restart_every: int = 1
    """Tasks one worker serves before a fresh one starts. 1 (the default) keeps every task away
    from the global state another left behind (torch defaults, compiler settings, caches), at the
    cost of a worker start (an interpreter and ``import torch``, ~2 s) per task."""

    def __post_init__(self) -> None:
        if self.device not in DEFAULT_WINDOWS_MS:
            raise ValueError(f"filter.device must be one of {sorted(DEFAULT_WINDOWS_MS)}, got {self.device!r}")
        low, high = self.window
        if not 0 <= low < high:
            raise ValueError(f"filter.window_ms must be (low, high) with 0 <= low < high, got {self.window_ms}")
        if self.memory_bound_mb <= 0 or self.step_timeout_s <= 0 or self.restart_every < 1 or self.rounding_seeds < 1:
            raise ValueError("filter.max_memory_mb and filter.step_timeout_s must be > 0, filter.restart_every and "
                             "filter.rounding_seeds >= 1")

    @property
    def window(self) -> tuple[float, float]:
        return tuple(self.window_ms) if self.window_ms is not None else DEFAULT_WINDOWS_MS[self.device]

    @property
    def memory_bound_mb(self) -> float:
        return self.max_memory_mb if self.max_memory_mb is not None else DEFAULT_MAX_MEMORY_MB[self.device]


@dataclass
class FilterOutcome:
    """What the filter decided for one task; ``reason`` is ``None`` when it was accepted."""

    reason: str | None = None
    detail: str = ""
    eager_ms: float | None = None
    compile_ms: float | None = None
    memory_mb: float | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    """Where the check's time went: ``start`` (worker start and task import), ``lock-wait``,
    ``checks`` (memory and degeneracy), ``eager-timing``, ``compile``, ``compile-timing``."""

    @property
    def accepted(self) -> bool:
        return self.reason is None


class _Rejected(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail


class TaskFilter:
    """Runs the rules on one task at a time in a long-lived worker; use one per parallel lane.

    A task that kills or hangs its worker is rejected (``worker-died`` / ``timeout``) and the next
    task gets a fresh worker.

    Args:
        config: the rules' settings.
        device: the device this lane works on; ``None``: ``config.device`` as this process sees it
            (on ``cuda``, its first GPU).
    """

    def __init__(self, config: FilterConfig, device: LaneDevice | None = None) -> None:
        self.config = config
        self.device = device
        self._scratch = Path(tempfile.mkdtemp(prefix="cuda-agent-synth-filter-"))
        self._worker: WorkerProcess | None = None
        self._served = 0
        self._checked = 0

    def __enter__(self) -> TaskFilter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
            self._worker = None
        shutil.rmtree(self._scratch, ignore_errors=True)

    def check(self, record: TaskRecord) -> FilterOutcome:
        outcome = FilterOutcome()
        try:
            self._run_rules(record, outcome)
        except _Rejected as rejected:
            outcome.reason, outcome.detail = rejected.reason, rejected.detail
        return outcome

    def _run_rules(self, record: TaskRecord, outcome: FilterOutcome) -> None:
        config = self.config
        self._checked += 1
        task_file = self._scratch / f"task_{self._checked}.py"
        task_file.write_text(record.code)
        with self._timed(outcome, "start"):
            self._ask("import-error", {"op": "load", "task_file": str(task_file), "device": config.device,
                                       "init_seed": 42, "precision": "kernelbench"})
        with self._measuring(outcome), self._timed(outcome, "checks"):  # forward passes: keep off others' timing
            footprint = self._ask("eager-error", {"op": "footprint", "seed": 42})
            memory = footprint["bytes"] / 2**20
            outcome.memory_mb = memory
            if memory > config.memory_bound_mb:
                raise _Rejected("too-much-memory",
                                f"one forward pass needs {memory:.0f} MB > {config.memory_bound_mb:g} MB")
            flags = self._ask("eager-error", {"op": "degeneracy", "seeds": config.degenerate_seeds,
                                              "atol": config.degenerate_atol})
            found = {_DEGENERACY_REASONS.get(flag, "degenerate-output"): detail
                     for flag, detail in zip(flags["flags"], flags["details"])}
            if not found and footprint["value_shaped"]:  # float64 passes: only where a shape may follow values
                seeds = [42 + k for k in range(config.rounding_seeds)]
                problem = self._ask("eager-error", {"op": "rounding_shape", "seeds": seeds,
                                                    "value_shaped": footprint["value_shaped"]})["problem"]
                if problem:
                    found["rounding-shape"] = problem
        for reason in REASONS:  # the first rule in order: a tiny output also looks input-independent
            if reason in found:
                raise _Rejected(reason, found[reason])
        timing = dataclasses.asdict(config.timing)
        outcome.eager_ms = self._time("eager_tf32_off", timing, outcome)
        low, high = config.window
        if outcome.eager_ms < low:
            raise _Rejected("too-fast", f"eager {outcome.eager_ms:.3g} ms < {low:g} ms")
        if outcome.eager_ms > high:
            raise _Rejected("too-slow", f"eager {outcome.eager_ms:.3g} ms > {high:g} ms")
        if config.compile:
            with self._timed(outcome, "compile"):
                self._ask("compile-error", {"op": "compile", "variants": ["compile_tf32_off"], "seed": 42,
                                            "timing": timing})
            outcome.compile_ms = self._time("compile_tf32_off", timing, outcome)

    def _time(self, variant: str, timing: dict[str, Any], outcome: FilterOutcome) -> float:
        step = "compile" if variant.startswith("compile") else "eager"
        with self._measuring(outcome), self._timed(outcome, f"{step}-timing"):
            reply = self._ask(f"{step}-error", {"op": "baselines", "variants": [variant], "seed": 42,
                                                "timing": timing})
        return float(reply["stats"][variant]["median_ms"])

    @contextlib.contextmanager
    def _timed(self, outcome: FilterOutcome, step: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            outcome.seconds[step] = outcome.seconds.get(step, 0.0) + time.monotonic() - started

    @contextlib.contextmanager
    def _measuring(self, outcome: FilterOutcome) -> Iterator[None]:
        """The device's measurement lock, with the wait for it counted as ``lock-wait``."""
        started = time.monotonic()
        with measuring(self.config.device if self.device is None else self.device.name):
            outcome.seconds["lock-wait"] = outcome.seconds.get("lock-wait", 0.0) + time.monotonic() - started
            yield

    def _ask(self, reason: str, message: dict[str, Any]) -> dict[str, Any]:
        """One request; a failure becomes a rejection with ``reason`` (or timeout / worker-died)."""
        try:
            return self._live_worker(fresh_task=message["op"] == "load").request(message, self.config.step_timeout_s)
        except RemoteError as exc:
            if exc.error_type == "OutOfMemoryError":  # the device's own verdict on the memory bound
                reason = "too-much-memory"
            raise _Rejected(reason, _first_line(str(exc))) from None
        except WorkerTimeout as exc:
            self._worker = None
            raise _Rejected("timeout", f"{message['op']}: {exc}") from None
        except WorkerError as exc:
            self._worker = None
            raise _Rejected("worker-died", f"{message['op']}: {_first_line(str(exc))}") from None

    def _live_worker(self, fresh_task: bool) -> WorkerProcess:
        if fresh_task and self._worker is not None and self._served >= self.config.restart_every:
            self._worker.close()
            self._worker = None
        if self._worker is None:
            # Parallelism comes from the lanes: one inductor compile thread each, not a pool per lane.
            device_env = {} if self.device is None else self.device.env()
            env = child_env({"TORCHINDUCTOR_COMPILE_THREADS": "1", **device_env})
            self._worker = WorkerProcess("cuda_agent.environment.reference_worker", env=env,
                                         cwd=self._scratch, log_path=self._scratch / "worker.log",
                                         mem_mb=self.config.worker_mem_mb)
            self._served = 0
        if fresh_task:
            self._served += 1
        return self._worker


def _first_line(text: str) -> str:
    """The error's type and message (the first line): later lines are hints and stack context."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[0][:300] if lines else text[:300]
