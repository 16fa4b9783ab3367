"""The trusted evaluator: build → verify → profile → reward, one candidate at a time.

The parent process (this module) never imports task or candidate code. It starts two fresh
workers per evaluation: the trusted reference worker (task code only: inputs from secret seeds,
reference outputs, comparisons, baselines) and the untrusted candidate worker (``ModelNew`` only).
Inputs and outputs travel between them as files in the safe tensor format; control messages go
over private pipes. Any crash, hang or OOM becomes a verdict, and both workers are always killed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import secrets
import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

from cuda_agent.environment.baselines import BaselineCache
from cuda_agent.environment.build import BuiltSolution, CompileError, build_solution
from cuda_agent.environment.config import EvalConfig, TimingConfig
from cuda_agent.environment.guards import run_static_guards
from cuda_agent.environment.precision import POLICIES
from cuda_agent.environment.presets import reward_baseline_setting, timing_method_key
from cuda_agent.environment.reward import milestone_reward
from cuda_agent.environment.solution import Layout, Solution, SolutionError, load_solution
from cuda_agent.environment.task import Task, TaskLoadError, check_source
from cuda_agent.environment.call_seeds import call_seed
from cuda_agent.environment.verdict import Status, TimingStats, TrialResult, Verdict, Violation
from cuda_agent.environment.slots import Prestarter, WorkerSlot
from cuda_agent.environment.worker import (
    ForgedReply, RemoteError, WorkerDied, WorkerDiskExceeded, WorkerError, WorkerMemoryExceeded, WorkerTimeout,
)

logger = logging.getLogger(__name__)


_TIMED_TRIAL = 0
"""The correctness trial whose inputs (perturbed per call) the candidate is timed on."""


class _Stop(Exception):
    """Ends an evaluation early with a final status and message."""

    def __init__(self, status: Status, error: str) -> None:
        super().__init__(error)
        self.status = status
        self.error = error


def evaluate(task: Task, solution_path: str | Path, config: EvalConfig | None = None, profile: bool = True,
             prestarted: Prestarter | None = None) -> Verdict:
    """Evaluate one candidate on one task and return the trusted verdict (never raises for
    anything the candidate or the task does).

    ``profile=False`` stops after the correctness trials (no baselines, no timing): a quick check
    for an agent iterating on correctness. Its reward is at most 1, and a note says it was not timed.
    ``prestarted``: take the workers from there (started and warmed ahead, see
    :class:`slots.Prestarter`) instead of starting them now.
    """
    config = config or EvalConfig()
    return _Evaluation(task, Path(solution_path), config, profile, prestarted).run()


class _Evaluation:
    def __init__(self, task: Task, solution_path: Path, config: EvalConfig, profile: bool,
                 prestarted: Prestarter | None) -> None:
        self.task = task
        self.solution_path = solution_path
        self.config = config
        self.profile = profile
        self.policy = POLICIES.get(config.verify.precision)
        self.verdict = Verdict(
            compiled=False, correct=False, reward=-1, eager_ms=None, compile_ms=None, candidate_ms=None,
            speedup_vs_eager=None, speedup_vs_compile=None, violations=[], error=None,
            precision_policy=self.policy.name, status=Status.SOLUTION_ERROR, device=config.device,
            task=task.id, preset=config.preset, reward_baseline=reward_baseline_setting(config, self.policy),
        )
        self.prestarted = prestarted
        self.slot: WorkerSlot | None = None
        self._post_timing_trial: tuple[int, str] | None = None
        self._phase_name, self._phase_started = "guards", time.monotonic()

    # -- driver --------------------------------------------------------------------------------
    def run(self) -> Verdict:
        started = self._phase_started
        try:
            self._run_phases()
            self.verdict.status = Status.CORRECT
        except _Stop as stop:
            self.verdict.status, self.verdict.error = stop.status, stop.error
        finally:
            self._begin("teardown")
            if self.slot is not None:
                self.slot.close()
            self.verdict.phase_seconds["total"] = self._begin("") - started  # the same clock reads as the phases
        self.verdict.correct = self.verdict.status is Status.CORRECT
        self.verdict.reward = 0 if self.verdict.status is Status.INFRA_ERROR else milestone_reward(
            self.verdict.correct, self.verdict.speedup_vs_eager, self.verdict.speedup_vs_compile,
            self.config.reward.milestone)
        return self.verdict

    def _run_phases(self) -> None:
        """The phases, each timed under its own name in ``verdict.phase_seconds``: together they
        make up the wall time (the build's own time, which overlaps them, is ``verdict.build``)."""
        solution = self._load_inputs()
        with ThreadPoolExecutor(max_workers=1) as pool:
            build = pool.submit(build_solution, solution, self.config.device, self.config.build, self.config.cache_dir,
                                self.config.sandbox)
            self._begin("workers")
            self._take_slot()  # a cold start's interpreters start while the build runs
            self._begin("prepare")
            self._lay_out(solution)
            self._load_reference()
            self.verdict.environment["sandbox"] = self.slot.lease.describe()
            trials = None if build.done() else self._prepare_trials()  # while the build runs
            self._begin("build_wait")
            built = self._finish_build(build)
        self._begin("baselines")
        with self._quiet_device():
            baselines = self._baselines() if self.profile else {}  # before any candidate code runs
        self._begin("load")
        with ThreadPoolExecutor(max_workers=1) as pool:
            # The reference makes the input sets while the candidate loads; this thread keeps
            # watching the candidate's limits.
            pending = pool.submit(self._prepare_trials) if trials is None else None
            self._load_candidate(built)
            trials = trials if pending is None else pending.result()
        self._begin("verify")
        self._verify(trials)
        if not self.profile:
            self.verdict.notes.append("verified only (profile=False): not timed, so the reward is at most 1")
            return
        self._begin("profile")
        with self._quiet_device():
            self._profile(baselines)
        if self._post_timing_trial is not None:
            self._begin("post_timing")
            self._ask_reference("write_inputs", {"index": self._post_timing_trial[0]})
            self._verify([self._post_timing_trial])

    def _quiet_device(self) -> contextlib.AbstractContextManager:
        """While timing: no prestarted slot initialises its device context."""
        return self.prestarted.quiet_device() if self.prestarted is not None else contextlib.nullcontext()

    def _begin(self, name: str) -> float:
        """End the running phase (its seconds go to ``phase_seconds``) and start ``name`` now (returned)."""
        now = time.monotonic()
        self.verdict.phase_seconds[self._phase_name] = now - self._phase_started
        self._phase_name, self._phase_started = name, now
        return now

    # -- phases --------------------------------------------------------------------------------
    @property
    def scratch(self) -> Path:
        assert self.slot is not None
        return self.slot.scratch

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
            if violations:
                self.verdict.violations.extend(violations)
                raise _Stop(Status.GUARD_VIOLATION, "; ".join(v.message for v in violations[:5]))
        return solution

    def _take_slot(self) -> None:
        """Workers, scratch folder and sandbox lease: prestarted ones when there are, else new."""
        if self.prestarted is not None:
            self.slot = self.prestarted.take(self.config)
        self.verdict.environment["prestarted"] = self.slot is not None
        if self.slot is None:
            self.slot = WorkerSlot(self.config)
        split = self.slot.cpu_split
        self.verdict.environment["timed_cpus"] = split.describe() if split is not None else "not set apart"

    def _lay_out(self, solution: Solution) -> None:
        """The task file (read-only to everyone) and a root-owned, read-only copy of the solution's
        Python files for the candidate worker to import."""
        self.task_file = self.scratch / "task" / "model.py"
        self.task_file.write_text(self.task.code)
        self.task_file.chmod(0o444)
        copy = self.scratch / "solution"
        sources = [solution.model_file] if solution.layout is Layout.SINGLE_FILE else sorted(solution.root.glob("*.py"))
        for source in sources:
            shutil.copyfile(source, copy / source.name)
            (copy / source.name).chmod(0o444)
        self.candidate_model_file = copy / solution.model_file.name

    def _load_reference(self) -> None:
        environment = self.verdict.environment
        reply = self._ask_reference("load", {
            "task_file": str(self.task_file), "device": self.config.device,
            "init_seed": self.config.verify.init_seed, "precision": self.policy.name,
        })
        self.verdict.environment = {**reply["environment"], **environment}

    def _finish_build(self, build) -> BuiltSolution:
        try:
            built = build.result()
        except CompileError as exc:
            detail = f"{exc}\n{exc.log_tail}".strip()
            status = Status.INFRA_ERROR if exc.infrastructure else Status.TIMEOUT if exc.timed_out else Status.COMPILE_ERROR
            raise _Stop(status, detail) from None
        self.verdict.compiled = True
        self.verdict.build = built.info
        shutil.copytree(built.extensions_dir, self.slot.extensions_dir)
        self.slot.lease.give_to_candidate(self.slot.extensions_dir)
        return built

    def _prepare_trials(self) -> list[tuple[int, str]]:
        """Generate every correctness input set (and its references) from fresh secret seeds, in
        one pipelined batch of requests. The post-timing trial's set is made now too (its
        references must not compete with the timed candidate for the device), but its file is
        written only after timing ended."""
        kinds = ["standard"] * self.config.verify.trials
        if self.config.verify.perturbed_trials:
            kinds += ["scaled", "sign_symmetric"]
        post_timing = self.profile and self.config.verify.post_timing_check
        if post_timing:
            kinds.append("post_timing")
        for index, kind in enumerate(kinds):
            self._send_reference("make_inputs", {
                "index": index, "kind": kind, "seed": secrets.randbits(63), "keep_inputs": index == _TIMED_TRIAL,
                "scale": self.config.verify.perturb_scale, "path": str(self._inputs_path(index)),
                "defer_write": kind == "post_timing",
            })
        made = [self._made_trial(index, kind, self._receive_reference("make_inputs")) for index, kind in enumerate(kinds)]
        if post_timing:
            self._post_timing_trial = made.pop()
        return [trial for trial in made if trial is not None]

    def _made_trial(self, index: int, kind: str, reply: dict[str, Any]) -> tuple[int, str] | None:
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
            if self.config.timing.baseline_tf32 == "pytorch_default":
                variants += [v.replace("_off", "_default") for v in variants if v.endswith("_off")]
        env = self.verdict.environment
        device_key = env.get("gpu") or f"cpu:{env.get('cpu')}:{env.get('threads')}"
        timing = self._timing
        software = (f"torch={env.get('torch')};cuda={env.get('cuda')};compile={timing.compile_mode};"
                    f"batch_min_ms={timing.batch_min_ms:g}" + timing_method_key(timing)
                    + (";timed_cpu_apart" if self.slot.cpu_split is not None else ""))
        cache = BaselineCache(self.config.cache_dir / "baselines.sqlite")
        stats = cache.get(self.task.code_hash, device_key, software, variants)
        missing = [v for v in variants if v not in stats]
        if missing:
            reply = self._ask_reference("baselines", {
                "variants": missing, "seed": self.config.verify.init_seed, "timing": dataclasses.asdict(timing),
                "timed_cpus": self._timed_cpus,
            })
            self._note_unpinned(reply, "the reference worker (baselines)")
            fresh = {v: TimingStats.from_dict(s) for v, s in reply["stats"].items()}
            cache.put(self.task.code_hash, device_key, software, fresh)
            stats.update(fresh)
        self.verdict.baselines = stats
        return stats

    def _load_candidate(self, built: BuiltSolution) -> None:
        reply = self._ask_candidate("load", {
            "task_file": str(self.task_file), "solution_file": str(self.candidate_model_file),
            "layout": built.solution.layout.value, "extensions_dir": str(self.slot.extensions_dir),
            "device": self.config.device, "init_seed": self.config.verify.init_seed,
            # on CUDA device memory is not address space (a context maps far more than it holds)
            "address_space_mb": self.config.limits.mem_mb if self.config.device == "cpu" else None,
        }, self.config.limits.candidate_timeout_s)
        self.verdict.notes.extend(reply.get("notes", []))

    def _verify(self, trials: list[tuple[int, str] | None]) -> None:
        """The candidate runs every trial (pipelined requests), then closes one deferred-work
        window for all of them; the reference checks each trial as soon as its run has replied.
        Outcomes are judged in trial order, exactly as if one trial followed the other: trial
        *i*'s run-time violations count only after trial *i − 1* was found correct, and a failed
        run (crash, timeout) is reported only after the trials before it were judged."""
        trials = [t for t in trials if t is not None]
        for index, kind in trials:
            self._inputs_path(index).chmod(0o644)  # readable by the sandbox user whatever the umask
            self._send_candidate("run", {"trial": index, "inputs_path": str(self._inputs_path(index)),
                                         "outputs_path": str(self._outputs_path(index)),
                                         "require_extension_call": self.config.verify.require_extension_call})
        self._send_candidate("settle", {})
        runs: list[dict[str, Any]] = []
        changed: set[int] = set()
        failure: _Stop | None = None
        try:
            for index, kind in trials:
                runs.append(self._receive_candidate("run", self.config.limits.candidate_timeout_s,
                                                    context=f"trial {index} ({kind})"))
                self._send_reference("check", {"index": index, "path": str(self._outputs_path(index))})
            changed = set(self._receive_candidate("settle", self.config.limits.candidate_timeout_s)["changed"])
        except _Stop as stop:
            failure = stop
        for position, reply in enumerate(runs):
            if position > 0:
                self._judge(*trials[position - 1])
            self._raise_on_violations(reply)
            if trials[position][0] in changed:
                raise self._violation("output-changed-after-return", "outputs kept changing after forward() "
                                      "returned and the device was synchronised")
        if runs:
            self._judge(*trials[len(runs) - 1])
        if failure is not None:
            raise failure

    def _judge(self, index: int, kind: str) -> None:
        """Receive the reference's check of trial ``index`` (the next reply it owes) and stop if it failed."""
        check = self._receive_reference("check")
        result = TrialResult(index, kind, bool(check["passed"]), str(check["message"]),
                             check.get("max_abs_err"), check.get("error_ratio"))
        self.verdict.trials.append(result)
        self._outputs_path(index).unlink(missing_ok=True)
        if not result.passed:
            weights = [n for n in self.verdict.notes if n.startswith("weights:")]
            raise _Stop(Status.INCORRECT, f"trial {index} ({kind}): {result.message}"
                        + "".join(f"\n{n}" for n in weights))

    def _raise_on_violations(self, reply: dict[str, Any]) -> None:
        violations = [Violation(str(v["code"]), str(v["message"])) for v in reply.get("violations", [])]
        if violations:
            self.verdict.violations.extend(violations)
            raise _Stop(Status.GUARD_VIOLATION, "; ".join(v.message for v in violations))

    def _profile(self, baselines: dict[str, TimingStats]) -> None:
        candidate = self._time_candidate(host_clock=False)
        eager = self._reward_baseline(baselines, "eager")
        if (self.config.device == "cuda" and eager and candidate.median_ms > 0
                and eager / candidate.median_ms > self.config.verify.plausible_speedup):
            host = self._time_candidate(host_clock=True)
            self.verdict.notes.append(
                f"timing: a {eager / candidate.median_ms:.3g}x speed-up over eager is above the plausibility bound "
                f"({self.config.verify.plausible_speedup:g}x); re-measured with the host clock: "
                f"{host.median_ms:.4g} ms vs {candidate.median_ms:.4g} ms with CUDA events; the slower one counts")
            candidate = max(candidate, host, key=lambda stats: stats.median_ms)
        v = self.verdict
        v.candidate_timing = candidate
        v.candidate_ms = candidate.median_ms
        v.speedups = {name: s.median_ms / candidate.median_ms for name, s in baselines.items() if candidate.median_ms > 0}
        v.eager_ms = eager
        v.compile_ms = self._reward_baseline(baselines, "compile")
        if candidate.median_ms > 0:
            v.speedup_vs_eager = v.eager_ms / candidate.median_ms if v.eager_ms else None
            v.speedup_vs_compile = v.compile_ms / candidate.median_ms if v.compile_ms else None

    def _time_candidate(self, host_clock: bool) -> TimingStats:
        """One timing loop in the candidate worker, its audited calls checked by the reference."""
        noise_seed = secrets.randbits(62)
        reply = self._ask_candidate("time", {
            "inputs_path": str(self._inputs_path(_TIMED_TRIAL)), "timing": dataclasses.asdict(self._timing),
            "noise_seed": noise_seed, "audits": self.config.verify.timed_audits, "audit_seed": secrets.randbits(62),
            "out_dir": str(self.scratch / "out"), "host_clock": host_clock, "timed_cpus": self._timed_cpus,
        }, self.config.limits.timing_timeout_s, context="timing (host clock)" if host_clock else "timing")
        self._note_unpinned(reply, "the candidate worker")
        self._raise_on_violations(reply)
        stats = TimingStats.from_dict(reply["stats"])
        self._audit_timed_calls(reply.get("audited"), stats.n * stats.calls_per_sample, noise_seed)
        return stats

    @property
    def _timed_cpus(self) -> list[int] | None:
        """The CPUs a worker moves its timing loops onto (see ``timed_cpus``)."""
        split = self.slot.cpu_split
        return sorted(split.timed) if split is not None else None

    def _note_unpinned(self, reply: dict[str, Any], worker: str) -> None:
        if self._timed_cpus is not None and not reply.get("pinned"):
            self.verdict.notes.append(
                f"timing: {worker} could not move onto cpu {self._timed_cpus}; it timed where it ran")

    @property
    def _timing(self) -> TimingConfig:
        """The timing settings the workers get, the same for baselines and candidate. Batches of
        back-to-back calls only while the static guards forbid side streams (calls on streams of
        their own could overlap inside a batch), within a quarter of the candidate's memory limit."""
        timing = self.config.timing
        guards = self.config.guards
        batch_min_ms = timing.batch_min_ms if guards.enabled and not guards.allow_streams else 0.0
        return dataclasses.replace(timing, batch_min_ms=batch_min_ms,
                                   batch_mem_mb=max(1, min(timing.batch_mem_mb, self.config.limits.mem_mb // 4)))

    def _audit_timed_calls(self, audited: Any, samples: int, noise_seed: int) -> None:
        """Have the reference check the outputs the candidate captured for its audited timed calls.

        The parent, not the candidate, derives each call's input seed and its outputs path, so a
        reply can only name which calls were audited, and must name as many as were asked for."""
        expected = min(self.config.verify.timed_audits, samples)
        entries = audited if isinstance(audited, list) and all(isinstance(a, dict) for a in audited) else []
        calls = [a.get("call") for a in entries]
        if len(calls) != expected or len(set(calls)) != expected or not all(isinstance(c, int) and c > 0 for c in calls):
            raise self._violation("timed-audit-missing", f"the timing reply did not report {expected} audited timed calls")
        for call in calls:
            self._send_reference("audit", {"seed": call_seed(noise_seed, call), "noise": self.config.timing.input_noise,
                                           "path": str(self.scratch / "out" / f"timed_{call}.bin")})
        checks = [self._receive_reference("audit") for _ in calls]  # all received before any is judged
        for call, check in zip(calls, checks):
            (self.scratch / "out" / f"timed_{call}.bin").unlink(missing_ok=True)
            if not check["passed"]:
                raise self._violation("timed-output-incorrect", (
                    f"timed call {call} returned a wrong result ({check['message']}): the candidate computes "
                    "differently when timed than when verified"))

    def _violation(self, code: str, message: str) -> _Stop:
        self.verdict.violations.append(Violation(code, message))
        return _Stop(Status.GUARD_VIOLATION, message)

    def _reward_baseline(self, baselines: dict[str, TimingStats], kind: str) -> float | None:
        """The baseline time the reward compares against, per the policy's TF32 rule."""
        off, on = baselines.get(f"{kind}_tf32_off"), baselines.get(f"{kind}_tf32_on")
        if on is None:  # CPU: TF32 does not exist, both settings are the same computation
            return off.median_ms if off else None
        if self.verdict.reward_baseline == "tf32_default":
            return baselines[f"{kind}_tf32_default"].median_ms
        if self.policy.baseline == "tf32_on":
            return on.median_ms
        if self.policy.baseline == "fastest":
            return min(off.median_ms, on.median_ms)
        return off.median_ms

    # -- worker calls ------------------------------------------------------------------------
    def _inputs_path(self, index: int) -> Path:
        return self.scratch / "io" / f"inputs_{index}.bin"

    def _outputs_path(self, index: int) -> Path:
        return self.scratch / "out" / f"outputs_{index}.bin"

    def _ask_reference(self, op: str, payload: dict[str, Any]) -> dict[str, Any]:
        self._send_reference(op, payload)
        return self._receive_reference(op)

    def _send_reference(self, op: str, payload: dict[str, Any]) -> None:
        with self._reference_failures(op):
            self.slot.reference.send({"op": op, **payload})

    def _receive_reference(self, op: str) -> dict[str, Any]:
        """The reply to the oldest request sent to the reference (``op`` names it in errors)."""
        with self._reference_failures(op):
            return self.slot.reference.receive(self.config.limits.task_timeout_s)

    @contextlib.contextmanager
    def _reference_failures(self, op: str) -> Iterator[None]:
        assert self.slot is not None and self.slot.reference is not None
        try:
            yield
        except RemoteError as exc:
            raise _Stop(Status.TASK_ERROR, f"reference '{op}' failed: {exc}\n{exc.traceback}".strip()) from None
        except WorkerError as exc:
            # SIGKILL from outside (the OOM killer, an operator) is no fault of the task; pools try again.
            killed = isinstance(exc, WorkerDied) and self.slot.reference.proc.returncode == -signal.SIGKILL
            raise _Stop(Status.INFRA_ERROR if killed else Status.TASK_ERROR,
                        f"reference worker failed during '{op}': {exc}\n{exc.log_tail}".strip()) from None

    def _ask_candidate(self, op: str, payload: dict[str, Any], timeout_s: float, context: str = "") -> dict[str, Any]:
        self._send_candidate(op, payload)
        return self._receive_candidate(op, timeout_s, context)

    def _send_candidate(self, op: str, payload: dict[str, Any]) -> None:
        with self._candidate_failures(op, ""):
            self.slot.candidate.send({"op": op, **payload})

    def _receive_candidate(self, op: str, timeout_s: float, context: str = "") -> dict[str, Any]:
        """The reply to the oldest request sent to the candidate (``op``/``context`` name it in errors)."""
        with self._candidate_failures(op, context):
            return self.slot.candidate.receive(timeout_s)

    @contextlib.contextmanager
    def _candidate_failures(self, op: str, context: str) -> Iterator[None]:
        assert self.slot is not None and self.slot.candidate is not None
        where = f"'{op}'" + (f" ({context})" if context else "")
        try:
            yield
        except RemoteError as exc:
            status = Status.OUT_OF_MEMORY if _is_out_of_memory(exc) else Status.RUNTIME_ERROR
            raise _Stop(status, f"candidate raised during {where}: {exc}\n{_short_traceback(exc.traceback)}".strip()) from None
        except WorkerTimeout as exc:
            raise _Stop(Status.TIMEOUT, f"candidate timed out during {where}: {exc}") from None
        except WorkerMemoryExceeded as exc:
            raise _Stop(Status.OUT_OF_MEMORY, f"candidate during {where}: {exc}") from None
        except WorkerDiskExceeded as exc:
            raise _Stop(Status.RUNTIME_ERROR, f"candidate during {where}: {exc} (limits.disk_mb)") from None
        except ForgedReply as exc:
            raise self._violation("result-channel-forged", f"during {where}: {exc}") from None
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
