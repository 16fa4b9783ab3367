"""The trusted evaluator: build → verify → profile → reward, one candidate at a time.

The parent process (this module) never imports task or candidate code. It starts two fresh
workers per evaluation: the trusted reference worker (task code only: inputs from secret seeds,
reference outputs, comparisons, baselines) and the untrusted candidate worker (``ModelNew`` only).
Inputs and outputs travel between them as files in the safe tensor format; control messages go
over private pipes. Any crash, hang or OOM becomes a verdict, and both workers are always killed.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from cuda_agent.environment.baselines import BaselineCache
from cuda_agent.environment.build import BuiltSolution, CompileError, build_location, build_solution
from cuda_agent.environment.config import EvalConfig
from cuda_agent.environment.guards import run_static_guards
from cuda_agent.environment.precision import POLICIES
from cuda_agent.environment.reward import milestone_reward
from cuda_agent.environment.solution import Solution, SolutionError, load_solution
from cuda_agent.environment.task import Task, TaskLoadError, check_source
from cuda_agent.environment.verdict import Status, TimingStats, TrialResult, Verdict, Violation
from cuda_agent.environment.worker import (
    RemoteError, WorkerDied, WorkerError, WorkerMemoryExceeded, WorkerProcess, WorkerTimeout, child_env,
)

logger = logging.getLogger(__name__)


class _Stop(Exception):
    """Ends an evaluation early with a final status and message."""

    def __init__(self, status: Status, error: str) -> None:
        super().__init__(error)
        self.status = status
        self.error = error


def evaluate(task: Task, solution_path: str | Path, config: EvalConfig | None = None) -> Verdict:
    """Evaluate one candidate on one task and return the trusted verdict (never raises for
    anything the candidate or the task does)."""
    return _Evaluation(task, Path(solution_path), config or EvalConfig()).run()


def _default_scratch_root() -> Path:
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return shm
    return Path(tempfile.gettempdir())


class _Evaluation:
    def __init__(self, task: Task, solution_path: Path, config: EvalConfig) -> None:
        self.task = task
        self.solution_path = solution_path
        self.config = config
        self.policy = POLICIES.get(config.verify.precision)
        self.verdict = Verdict(
            compiled=False, correct=False, reward=-1, eager_ms=None, compile_ms=None, candidate_ms=None,
            speedup_vs_eager=None, speedup_vs_compile=None, violations=[], error=None,
            precision_policy=self.policy.name, status=Status.SOLUTION_ERROR, device=config.device,
            task=task.id, reward_baseline=self.policy.baseline,
        )
        self.reference: WorkerProcess | None = None
        self.candidate: WorkerProcess | None = None
        self.scratch = Path(tempfile.mkdtemp(prefix="cuda-agent-", dir=config.scratch_dir or _default_scratch_root()))
        self._phase_started = time.monotonic()

    # -- driver --------------------------------------------------------------------------------
    def run(self) -> Verdict:
        started = time.monotonic()
        try:
            self._run_phases()
            self.verdict.status = Status.CORRECT
        except _Stop as stop:
            self.verdict.status, self.verdict.error = stop.status, stop.error
        finally:
            for worker in (self.candidate, self.reference):
                if worker is not None:
                    worker.close()
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.verdict.phase_seconds["total"] = time.monotonic() - started
        self.verdict.correct = self.verdict.status is Status.CORRECT
        self.verdict.reward = milestone_reward(self.verdict.correct, self.verdict.speedup_vs_eager,
                                               self.verdict.speedup_vs_compile)
        return self.verdict

    def _run_phases(self) -> None:
        solution = self._load_inputs()
        with ThreadPoolExecutor(max_workers=1) as pool:
            build = pool.submit(build_solution, solution, self.config.device, self.config.build, self.config.cache_dir)
            self._start_reference()
            self._start_candidate(solution)  # its interpreter starts while the build runs
            trials = self._prepare_trials()
            built = self._finish_build(build)
        self._phase("prepare")
        baselines = self._baselines()
        self._load_candidate(built)
        self._verify(trials)
        self._phase("verify")
        self._profile(trials[0][0], baselines)
        self._phase("profile")
        if self.config.verify.post_timing_check:
            self._verify([self._make_trial(self._trial_count, "post_timing")])

    def _phase(self, name: str) -> None:
        now = time.monotonic()
        self.verdict.phase_seconds[name] = now - self._phase_started
        self._phase_started = now

    # -- phases --------------------------------------------------------------------------------
    def _load_inputs(self) -> Solution:
        try:
            check_source(self.task.code, self.task.origin)
        except TaskLoadError as exc:
            raise _Stop(Status.TASK_ERROR, str(exc)) from None
        try:
            solution = load_solution(self.solution_path)
        except SolutionError as exc:
            raise _Stop(Status.SOLUTION_ERROR, str(exc)) from None
        if self.config.guards.enabled:
            violations = run_static_guards(solution, self.config.guards)
            self._phase("guards")
            if violations:
                self.verdict.violations.extend(violations)
                raise _Stop(Status.GUARD_VIOLATION, "; ".join(v.message for v in violations[:5]))
        task_dir = self.scratch / "task"
        task_dir.mkdir()
        self.task_file = task_dir / "model.py"
        self.task_file.write_text(self.task.code)
        self.task_file.chmod(0o444)
        (self.scratch / "io").mkdir()
        return solution

    def _start_reference(self) -> None:
        self.reference = WorkerProcess(
            "cuda_agent.environment.reference_worker", env=child_env(), cwd=self.scratch,
            log_path=self.scratch / "reference.log",
        )
        reply = self._ask_reference("load", {
            "task_file": str(self.task_file), "device": self.config.device,
            "init_seed": self.config.verify.init_seed, "precision": self.policy.name,
        })
        self.verdict.environment = reply["environment"]

    def _start_candidate(self, solution: Solution) -> None:
        _, _, extensions_dir = build_location(solution, self.config.device, self.config.build, self.config.cache_dir)
        env = child_env({"TORCH_CUDA_ARCH_LIST": self.config.build.cuda_arch, "TORCH_EXTENSIONS_DIR": str(extensions_dir)})
        workdir = self.scratch / "candidate"
        workdir.mkdir()
        self.candidate = WorkerProcess(
            "cuda_agent.environment.candidate_worker", env=env, cwd=workdir,
            log_path=self.scratch / "candidate.log", mem_mb=self.config.limits.mem_mb,
            limit_address_space=self.config.device == "cpu",
        )

    def _finish_build(self, build) -> BuiltSolution:
        try:
            built = build.result()
        except CompileError as exc:
            self.verdict.phase_seconds["build"] = time.monotonic() - self._phase_started
            detail = f"{exc}\n{exc.log_tail}".strip()
            raise _Stop(Status.TIMEOUT if exc.timed_out else Status.COMPILE_ERROR, detail) from None
        self.verdict.compiled = True
        self.verdict.build = built.info
        self.verdict.phase_seconds["build"] = built.info.seconds
        return built

    def _prepare_trials(self) -> list[tuple[int, str]]:
        """Generate every correctness input set (and its references) from fresh secret seeds."""
        kinds = ["standard"] * self.config.verify.trials
        if self.config.verify.perturbed_trials:
            kinds += ["scaled", "sign_symmetric"]
        self._trial_count = len(kinds)
        trials = []
        for index, kind in enumerate(kinds):
            trial = self._make_trial(index, kind)
            if trial is not None:
                trials.append(trial)
        return trials

    def _make_trial(self, index: int, kind: str) -> tuple[int, str] | None:
        reply = self._ask_reference("make_inputs", {
            "index": index, "kind": kind, "seed": secrets.randbits(63),
            "scale": self.config.verify.perturb_scale, "path": str(self._inputs_path(index)),
        })
        if reply.get("skipped"):
            self.verdict.notes.append(f"trial {index} ({kind}) skipped: {reply['skipped']}")
            return None
        if reply.get("fp64_error") and not any("float64" in n for n in self.verdict.notes):
            self.verdict.notes.append(
                f"precision: the reference does not run in float64 ({reply['fp64_error']}); "
                "correctness falls back to the kernelbench tolerances"
            )
        return index, kind

    def _baselines(self) -> dict[str, TimingStats]:
        variants = ["eager_tf32_off"]
        if self.config.timing.compile_baseline:
            variants.append("compile_tf32_off")
        if self.config.device == "cuda":
            variants += [v.replace("_off", "_on") for v in variants]
        env = self.verdict.environment
        device_key = env.get("gpu") or f"cpu:{env.get('cpu')}:{env.get('threads')}"
        software = f"torch={env.get('torch')};cuda={env.get('cuda')};compile={self.config.timing.compile_mode}"
        cache = BaselineCache(self.config.cache_dir / "baselines.sqlite")
        stats = cache.get(self.task.code_hash, device_key, software, variants)
        missing = [v for v in variants if v not in stats]
        if missing:
            reply = self._ask_reference("baselines", {
                "variants": missing, "seed": self.config.verify.init_seed,
                "timing": dataclasses.asdict(self.config.timing),
            })
            fresh = {v: TimingStats.from_dict(s) for v, s in reply["stats"].items()}
            cache.put(self.task.code_hash, device_key, software, fresh)
            stats.update(fresh)
        self.verdict.baselines = stats
        return stats

    def _load_candidate(self, built: BuiltSolution) -> None:
        reply = self._ask_candidate("load", {
            "task_file": str(self.task_file), "solution_file": str(built.solution.model_file),
            "layout": built.solution.layout.value, "extensions_dir": str(built.extensions_dir),
            "device": self.config.device, "init_seed": self.config.verify.init_seed,
        }, self.config.limits.candidate_timeout_s)
        self.verdict.notes.extend(reply.get("notes", []))

    def _verify(self, trials: list[tuple[int, str] | None]) -> None:
        for trial in trials:
            if trial is None:
                continue
            index, kind = trial
            outputs = self.scratch / "io" / f"outputs_{index}.bin"
            reply = self._ask_candidate("run", {"inputs_path": str(self._inputs_path(index)),
                                                "outputs_path": str(outputs),
                                                "require_extension_call": self.config.verify.require_extension_call},
                                        self.config.limits.candidate_timeout_s, context=f"trial {index} ({kind})")
            self._raise_on_violations(reply)
            check = self._ask_reference("check", {"index": index, "path": str(outputs)})
            result = TrialResult(index, kind, bool(check["passed"]), str(check["message"]),
                                 check.get("max_abs_err"), check.get("error_ratio"))
            self.verdict.trials.append(result)
            outputs.unlink(missing_ok=True)
            if not result.passed:
                weights = [n for n in self.verdict.notes if n.startswith("weights:")]
                raise _Stop(Status.INCORRECT, f"trial {index} ({kind}): {result.message}"
                            + "".join(f"\n{n}" for n in weights))

    def _raise_on_violations(self, reply: dict[str, Any]) -> None:
        violations = [Violation(str(v["code"]), str(v["message"])) for v in reply.get("violations", [])]
        if violations:
            self.verdict.violations.extend(violations)
            raise _Stop(Status.GUARD_VIOLATION, "; ".join(v.message for v in violations))

    def _profile(self, index: int, baselines: dict[str, TimingStats]) -> None:
        reply = self._ask_candidate("time", {
            "inputs_path": str(self._inputs_path(index)), "timing": dataclasses.asdict(self.config.timing),
        }, self.config.limits.timing_timeout_s, context="timing")
        self._raise_on_violations(reply)
        candidate = TimingStats.from_dict(reply["stats"])
        v = self.verdict
        v.candidate_timing = candidate
        v.candidate_ms = candidate.median_ms
        v.speedups = {name: s.median_ms / candidate.median_ms for name, s in baselines.items() if candidate.median_ms > 0}
        v.eager_ms = self._reward_baseline(baselines, "eager")
        v.compile_ms = self._reward_baseline(baselines, "compile")
        if candidate.median_ms > 0:
            v.speedup_vs_eager = v.eager_ms / candidate.median_ms if v.eager_ms else None
            v.speedup_vs_compile = v.compile_ms / candidate.median_ms if v.compile_ms else None

    def _reward_baseline(self, baselines: dict[str, TimingStats], kind: str) -> float | None:
        """The baseline time the reward compares against, per the policy's TF32 rule."""
        off, on = baselines.get(f"{kind}_tf32_off"), baselines.get(f"{kind}_tf32_on")
        if on is None:  # CPU: TF32 does not exist, both settings are the same computation
            return off.median_ms if off else None
        if self.policy.baseline == "tf32_on":
            return on.median_ms
        if self.policy.baseline == "fastest":
            return min(off.median_ms, on.median_ms)
        return off.median_ms

    # -- worker calls ------------------------------------------------------------------------
    def _inputs_path(self, index: int) -> Path:
        return self.scratch / "io" / f"inputs_{index}.bin"

    def _ask_reference(self, op: str, payload: dict[str, Any]) -> dict[str, Any]:
        assert self.reference is not None
        try:
            return self.reference.request({"op": op, **payload}, self.config.limits.task_timeout_s)
        except RemoteError as exc:
            raise _Stop(Status.TASK_ERROR, f"reference '{op}' failed: {exc}\n{exc.traceback}".strip()) from None
        except WorkerError as exc:
            raise _Stop(Status.TASK_ERROR, f"reference worker failed during '{op}': {exc}\n{exc.log_tail}".strip()) from None

    def _ask_candidate(self, op: str, payload: dict[str, Any], timeout_s: float, context: str = "") -> dict[str, Any]:
        assert self.candidate is not None
        where = f"'{op}'" + (f" ({context})" if context else "")
        try:
            return self.candidate.request({"op": op, **payload}, timeout_s)
        except RemoteError as exc:
            status = Status.OUT_OF_MEMORY if _is_out_of_memory(exc) else Status.RUNTIME_ERROR
            raise _Stop(status, f"candidate raised during {where}: {exc}\n{_short_traceback(exc.traceback)}".strip()) from None
        except WorkerTimeout as exc:
            raise _Stop(Status.TIMEOUT, f"candidate timed out during {where}: {exc}") from None
        except WorkerMemoryExceeded as exc:
            raise _Stop(Status.OUT_OF_MEMORY, f"candidate during {where}: {exc}") from None
        except WorkerDied as exc:
            scope = f" ({context})" if context else ""
            raise _Stop(Status.RUNTIME_ERROR, f"candidate process failed{scope}: {exc}\n{exc.log_tail[-2000:]}".strip()) from None
        except WorkerError as exc:
            raise _Stop(Status.RUNTIME_ERROR, f"candidate failed during {where}: {exc}") from None


def _is_out_of_memory(exc: RemoteError) -> bool:
    """CUDA OOM has its own exception type; on CPU, torch's allocator raises a RuntimeError under
    ``RLIMIT_AS`` and plain Python raises ``MemoryError``."""
    return exc.error_type in ("OutOfMemoryError", "MemoryError") or "can't allocate memory" in exc.detail


def _short_traceback(text: str, lines: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])
