"""The trusted evaluator: build → verify → profile → reward, one candidate at a time.

The parent process (this module) never imports task or candidate code. It starts two fresh
workers per evaluation: the trusted reference worker (task code only: inputs from secret seeds,
reference outputs, comparisons, baselines) and the untrusted candidate worker (``ModelNew`` only).
Inputs and outputs travel between them in shared memory (device allocations opened through IPC
handles on CUDA, shared-memory files on the CPU backend: :mod:`shared_tensors`); control messages
go over private pipes. The problem's size is measured before anything of that size is allocated,
and trials are made only as far ahead as memory allows (one at a time for GPU-sized problems).
Any crash, hang or OOM becomes a verdict, and both workers are always killed.
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

from cuda_agent.environment.baselines import BaselineCache, provenance_note, software_key
from cuda_agent.environment.build import BuiltSolution, CompileError, build_solution, require_buildable_for
from cuda_agent.environment.config import EvalConfig, TimingConfig
from cuda_agent.environment.device_clock import sm_clock_mhz
from cuda_agent.environment.device_share import DeviceShare
from cuda_agent.environment.guards import run_static_guards
from cuda_agent.environment.precision import POLICIES
from cuda_agent.environment.presets import reward_baseline_setting
from cuda_agent.environment.problem_size import MemoryPlan, ProblemSize, gigabytes, memory_plan
from cuda_agent.environment.reward import (
    MEDIAN_TO_MEAN_ERROR, MILESTONES, Speedup, bound_z, candidate_err_needed, drift_for, milestone_reward,
)
from cuda_agent.environment.solution import Layout, Solution, SolutionError, load_solution
from cuda_agent.environment.task import Task, TaskLoadError, check_source
from cuda_agent.environment.call_seeds import call_seed
from cuda_agent.environment.verdict import Status, TimingStats, TrialResult, Verdict, Violation
from cuda_agent.environment.slots import Prestarter, WorkerSlot
from cuda_agent.environment.worker import (
    ForgedReply, RemoteError, WorkerDied, WorkerDiskExceeded, WorkerError, WorkerMemoryExceeded, WorkerTimeout,
    available_host_bytes,
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
             prestarted: Prestarter | None = None, share: DeviceShare | None = None) -> Verdict:
    """Evaluate one candidate on one task and return the trusted verdict (never raises for
    anything the candidate or the task does).

    ``profile=False`` stops after the correctness trials (no baselines, no timing): a quick check
    for an agent iterating on correctness. Its reward is at most 1, and a note says it was not timed.
    ``prestarted``: take the workers from there (started and warmed ahead, see
    :class:`slots.Prestarter`) instead of starting them now. ``share``: the GPU is shared with
    other evaluations running at once (see :mod:`device_share`); the caller then holds no lock
    around this call, the evaluation holds the GPU for its device work only.
    """
    config = config or EvalConfig()
    return _Evaluation(task, Path(solution_path), config, profile, prestarted, share).run()


class _Evaluation:
    def __init__(self, task: Task, solution_path: Path, config: EvalConfig, profile: bool,
                 prestarted: Prestarter | None, share: DeviceShare | None) -> None:
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
            reward_confidence=config.reward.confidence,
            reward_drift=drift_for(config.reward, config.device),
        )
        self.prestarted = prestarted
        self.share = share
        self._device_seconds = {"wait": 0.0, "measure": 0.0, "use": 0.0}
        """On a shared GPU: seconds waiting for turns, holding it alone, holding it beside others."""
        self._using = False
        """Whether this evaluation holds the shared GPU for untimed work now (device work nested in
        that hold takes no turn of its own)."""
        self._kept_for_teardown = contextlib.ExitStack()
        """The last phase's hold, kept open through the teardown that follows it: a second turn
        would queue behind every measurement asked for meanwhile (one H200's self-check waited
        ~1.7 s a turn)."""
        self.slot: WorkerSlot | None = None
        self.plan: MemoryPlan | None = None
        self._phase_name, self._phase_started = "guards", time.monotonic()
        self._skipped_trials: list[str] = []
        """Notes of trials made and skipped, kept until trials run (trials are made during the build,
        and a verdict that ends before verifying ran no trial to skip)."""

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
            with self._kept_for_teardown:
                if self.slot is not None:
                    with self._on_device():  # ending its workers' contexts is device work too
                        self._record_memory()
                        self.slot.close()
            self.verdict.phase_seconds["total"] = self._begin("") - started  # the same clock reads as the phases
            if self.share is not None:
                self.verdict.environment["device_shared"] = f"{self.share.evaluations} evaluations at once"
                self.verdict.device_seconds = dict(self._device_seconds)
        if self.prestarted is not None and self.profile:
            self.prestarted.note_verdict(self.verdict)
        self.verdict.correct = self.verdict.status is Status.CORRECT
        self.verdict.reward = 0 if self.verdict.status is Status.INFRA_ERROR else milestone_reward(
            self.verdict.correct, self.verdict.speedup_vs_eager_lower, self.verdict.speedup_vs_compile_lower,
            self.config.reward.milestone)
        return self.verdict

    def _run_phases(self) -> None:
        """The phases, each timed under its own name in ``verdict.phase_seconds``: together they
        make up the wall time (the build's own time, which overlaps them, is ``verdict.build``)."""
        solution = self._load_inputs()
        batches = self._trial_batches()
        with ThreadPoolExecutor(max_workers=1) as pool:
            build = pool.submit(build_solution, solution, self.config.device, self.config.build, self.config.cache_dir,
                                self.config.sandbox)
            self._begin("workers")
            self._take_slot()  # a cold start's interpreters start while the build runs
            self._begin("prepare")
            with self._on_device():
                self._lay_out(solution)
                self._load_reference()
                batches = self._resize_batches(batches)
                self.verdict.environment["sandbox"] = self.slot.lease.describe()
                # While the build runs, when all trials are made at once (small problems); a larger
                # problem's first trial would still be resident while its baselines are timed.
                first = None if build.done() or len(batches) > 1 else self._prepare_trials(batches[0])
            self._begin("build_wait")
            built = self._finish_build(build)
        self._begin("baselines")
        baselines = self._baselines() if self.profile else {}  # before any candidate code runs
        self._begin("load")  # its turn on a shared GPU counts as the load's
        with self._on_device():
            self._load_and_verify(built, batches, first)
        if not self.profile:
            self.verdict.notes.append("verified only (profile=False): not timed, so the reward is at most 1")
            return
        self._begin("profile")
        with self._on_device(measure=True), self._quiet_device():
            self._profile(baselines)
        if self.config.verify.post_timing_check:
            self._begin("post_timing")
            self._kept_for_teardown.enter_context(self._on_device())
            self._verify(self._prepare_trials([(len(sum(batches, [])), "post_timing")]))

    def _load_and_verify(self, built: BuiltSolution, batches: list[list[tuple[int, str]]],
                         first: list[tuple[int, str, Any]] | None) -> None:
        """The candidate's first phases (``load`` has begun): load it, verify every trial."""
        with ThreadPoolExecutor(max_workers=1) as pool:
            # The reference makes the first input sets while the candidate loads; this thread keeps
            # watching the candidate's limits.
            pending = pool.submit(self._prepare_trials, batches[0]) if first is None else None
            self._load_candidate(built)
            first = first if pending is None else pending.result()
        self._begin("verify")
        self._verify(first)
        for batch in batches[1:]:
            self._verify(self._prepare_trials(batch))

    def _quiet_device(self) -> contextlib.AbstractContextManager:
        """While timing: no prestarted slot initialises its device context (on a shared GPU, the
        slots initialise theirs holding it for untimed work, which a measurement keeps out)."""
        if self.prestarted is None or self.share is not None:
            return contextlib.nullcontext()
        return self.prestarted.quiet_device()

    @contextlib.contextmanager
    def _on_device(self, measure: bool = False) -> Iterator[None]:
        """Device work: on a shared GPU, a ``measure``-ment holds it alone, other work beside other
        evaluations' untimed work. Untimed work inside such a hold takes no turn of its own."""
        if self.share is None or (self._using and not measure):
            yield
            return
        assert not self._using, "a measurement asked for inside a shared hold would wait for itself"
        mode, phase = "measure" if measure else "use", self._phase_name
        asked, asked_at = time.monotonic(), time.time()
        with self.share.measure() if measure else self.share.use():
            entered = time.monotonic()
            self._device_seconds["wait"] += entered - asked
            self._using = not measure
            try:
                yield
            finally:
                self._using = False
                held = time.monotonic() - entered
                self._device_seconds[mode] += held
                self.verdict.device_turns.append({"phase": phase, "mode": mode, "asked_at": asked_at,
                                                  "wait_s": entered - asked, "held_s": held})

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
        try:
            require_buildable_for(solution, self.config.device)  # before any worker or compiler starts
        except CompileError as exc:
            raise _Stop(Status.COMPILE_ERROR, str(exc)) from None
        if self.config.guards.enabled:
            violations = run_static_guards(solution, self.config.guards)
            if violations:
                self.verdict.violations.extend(violations)
                raise _Stop(Status.GUARD_VIOLATION, "; ".join(v.message for v in violations[:5]))
        return solution

    def _take_slot(self) -> None:
        """Workers, scratch folder and sandbox lease: prestarted ones when there are, else new."""
        if self.prestarted is not None:
            self.prestarted.note_task(self.task.code)  # before taking: the slot started next learns it
            self.slot = self.prestarted.take(self.config)
        self.verdict.environment["prestarted"] = self.slot is not None
        if self.slot is None:
            self.slot = WorkerSlot(self.config, evaluations=1 if self.share is None else self.share.evaluations)
        if self.share is not None:  # the shared GPU's turn that made the slot's device contexts
            self.verdict.device_turns += self.slot.device_turns
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
        self.slot.reference.mem_mb = self._reference_budget_mb()
        reply = self._ask_reference("load", {
            "task_file": str(self.task_file), "device": self.config.device,
            "init_seed": self.config.verify.init_seed, "precision": self.policy.name,
            "io_dir": str(self.scratch / "io"), "out_dir": str(self.scratch / "out"),
            "address_space_mb": self._reference_budget_mb() if self.config.device == "cpu" else None,
        })
        self.verdict.environment = {**reply["environment"], **environment}
        self._note_loaded_memory("reference", self.slot.reference)
        self.verdict.environment["transport"] = ("CUDA IPC (device to device)" if self.config.device == "cuda"
                                                 else "shared-memory files (mapped by both workers)")
        self._plan_memory(ProblemSize.from_json_dict(reply["size"]), reply.get("memory", {}))

    def _reference_budget_mb(self) -> int:
        """Host memory the reference worker may hold (``limits.reference_mem_mb``, or what the
        host has available now)."""
        return self.config.limits.reference_mem_mb or int(available_host_bytes() / 2**20)

    def _plan_memory(self, size: ProblemSize, room: dict[str, int]) -> None:
        """Decide, before anything of the problem's size exists, whether it can be judged here
        (else a ``task_error`` naming the bytes), how many trials may be resident at once, and
        how much the harness holds in the candidate's process (added to its limits, never
        charged to it)."""
        self.verdict.problem_bytes = {k: v for k, v in size.to_json_dict().items() if k != "note"}
        if size.note:
            self.verdict.notes.append(f"size: {size.note}")
        on_device = self.config.device == "cuda"
        budget = room.get("device_free_bytes", 0) if on_device else self._reference_budget_mb() * 2**20
        if on_device and self.share is not None:
            budget = min(budget, self.share.memory_share(room.get("device_total_bytes", 0)))
        verify = self.config.verify
        trials = verify.trials + (2 if verify.perturbed_trials else 0)
        plan = memory_plan(size, trials, self.policy.needs_float64, self.policy.needs_tf32_reference and on_device,
                           verify.timed_audits)
        self.plan = plan
        where = "device memory" if on_device else "host memory"
        if plan.peak_bytes > budget:
            outputs = "unknown" if size.output_bytes is None else gigabytes(size.output_bytes)
            raise _Stop(Status.TASK_ERROR, (
                f"the problem does not fit this machine: judging it needs about {gigabytes(plan.peak_bytes)} of "
                f"{where} (inputs {gigabytes(size.input_bytes)}, outputs {outputs}, with the float64 reference, "
                f"one resident trial and the timing buffers), and {gigabytes(budget)} is available"))
        if plan.audits < verify.timed_audits:
            self.verdict.notes.append(f"timing: {plan.audits} of {verify.timed_audits} timed calls audited (each "
                                      f"kept call holds the outputs, {gigabytes(size.output_bytes or 0)})")
        candidate = self.slot.candidate
        # what the harness holds in the candidate's process is not the candidate's: the reference
        # Model it builds on the host to copy the weights from, and on the CPU the shared tensors
        harness = size.parameter_bytes + (0 if on_device else plan.candidate_harness_bytes)
        candidate.mem_mb = self.config.limits.mem_mb + harness // 2**20
        outputs = size.output_bytes if size.output_bytes is not None else size.input_bytes
        if candidate.disk_mb is not None and not on_device:  # shared output files live in its outputs folder
            candidate.disk_mb = self.config.limits.disk_mb + (plan.resident_trials + plan.audits + 2) * outputs // 2**20

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

    def _trial_batches(self) -> list[list[tuple[int, str]]]:
        """The correctness trials, ``(index, kind)``, in one batch until the memory plan splits them."""
        kinds = ["standard"] * self.config.verify.trials
        if self.config.verify.perturbed_trials:
            kinds += ["scaled", "sign_symmetric"]
        return [list(enumerate(kinds))]

    def _resize_batches(self, batches: list[list[tuple[int, str]]]) -> list[list[tuple[int, str]]]:
        """Batches of as many trials as may be resident at once (all of them for small problems)."""
        trials = sum(batches, [])
        size = self.plan.resident_trials if self.plan is not None else len(trials)
        return [trials[i:i + size] for i in range(0, len(trials), size)]

    def _prepare_trials(self, batch: list[tuple[int, str]]) -> list[tuple[int, str, Any]]:
        """Make every input set of ``batch`` (and its references) from fresh secret seeds, in one
        pipelined batch of requests; returns ``(index, kind, shared inputs header)`` per trial made."""
        for index, kind in batch:
            self._send_reference("make_trial", {
                "index": index, "kind": kind, "seed": secrets.randbits(63), "timed": index == _TIMED_TRIAL,
                "scale": self.config.verify.perturb_scale,
            })
        made = [self._made_trial(index, kind, self._receive_reference("make_trial")) for index, kind in batch]
        return [trial for trial in made if trial is not None]

    def _made_trial(self, index: int, kind: str, reply: dict[str, Any]) -> tuple[int, str, Any] | None:
        if reply.get("skipped"):
            self._skipped_trials.append(f"trial {index} ({kind}) skipped: {reply['skipped']}")
            return None
        notes = self.verdict.notes
        if reply.get("fp64_error") and not any("float64" in n for n in notes):
            notes.append(f"precision: the reference does not run in float64 ({reply['fp64_error']}); "
                         "correctness falls back to the kernelbench tolerances")
        source = reply.get("input_source", "device")
        if source != "device" and not any(n.startswith("inputs: ") for n in notes):
            notes.append(f"inputs: drawn on the {source}")
        notes.extend(f"inputs: trial {index}: {n}" for n in reply.get("notes", []))
        return index, kind, reply["inputs"]

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
        key = (self.task.code_hash, device_key, software_key(env, timing, self.slot.cpu_split is not None))
        cache = BaselineCache(self.config.cache_dir / "baselines.sqlite")
        cached, unfit = cache.get(*key, variants, timing)
        missing = [v for v in variants if v not in cached]
        fresh: dict[str, TimingStats] = {}
        if missing:
            request = {"variants": missing, "seed": self.config.verify.init_seed, "timing": dataclasses.asdict(timing),
                       "timed_cpus": self._timed_cpus}
            ahead = {}
            if self.share is not None and any(v.startswith("compile_") for v in missing):
                # code generation is host work: another evaluation may use the GPU meanwhile
                ahead = {"compile_unheld": self._ask_reference("compile", request)["seconds"]}
            with self._on_device(measure=True), self._quiet_device():
                reply = self._ask_reference("baselines", request)
                self._note_clock("baselines")
            self._note_unpinned(reply, "the reference worker (baselines)")
            fresh = {v: TimingStats.from_dict(s) for v, s in reply["stats"].items()}
            self.verdict.baseline_seconds = {**ahead, **reply["seconds"]}
            cache.put(*key, fresh, timing, self.task.id)
        stats = {v: cached[v].stats if v in cached else fresh[v] for v in variants}
        self.verdict.baselines = stats
        self.verdict.baseline_sources = {v: "cache" if v in cached else "timed" for v in variants}
        self.verdict.notes.append(provenance_note(stats, cached, unfit, time.time()))
        return stats

    def _note_loaded_memory(self, name: str, worker: Any) -> None:
        """The worker's resident memory once its code is loaded (the interpreter, torch, the task's
        or candidate's module and model) and before any input exists: what the problem's data and
        the harness's copies of it add is measured from here."""
        loaded = worker.rss_mb()
        if loaded is not None:
            self.verdict.memory_mb.setdefault(name, {})["loaded_host_mb"] = loaded

    def _load_candidate(self, built: BuiltSolution) -> None:
        reply = self._ask_candidate("load", {
            "task_file": str(self.task_file), "solution_file": str(self.candidate_model_file),
            "layout": built.solution.layout.value, "extensions_dir": str(self.slot.extensions_dir),
            "device": self.config.device, "init_seed": self.config.verify.init_seed,
            "io_dir": str(self.scratch / "io"), "out_dir": str(self.scratch / "out"),
            # on CUDA device memory is not address space (a context maps far more than it holds);
            # on the CPU the shared regions the harness maps into it are room it did not ask for
            "address_space_mb": self._candidate_address_space_mb() if self.config.device == "cpu" else None,
        }, self.config.limits.candidate_timeout_s)
        self._note_loaded_memory("candidate", self.slot.candidate)
        self.verdict.notes.extend(reply.get("notes", []))

    def _candidate_address_space_mb(self) -> int:
        harness = 2 * self.plan.peak_bytes // 2**20 if self.plan is not None else 0
        return self.slot.candidate.mem_mb + harness

    def _verify(self, trials: list[tuple[int, str, Any]]) -> None:
        """The candidate runs every trial (pipelined requests); the reference checks each trial as
        soon as its run has replied; then the candidate closes one deferred-work window for all of
        them, after the reference has read their outputs. Outcomes are judged in trial order, exactly as if one trial followed the other: trial
        *i*'s run-time violations count only after trial *i − 1* was found correct, and a failed
        run (crash, timeout) is reported only after the trials before it were judged. Judged
        trials are freed on both sides before the next batch is made."""
        self.verdict.notes.extend(self._skipped_trials)
        self._skipped_trials.clear()
        for index, kind, inputs in trials:
            self._send_candidate("run", {"trial": index, "inputs": inputs,
                                         "require_extension_call": self.config.verify.require_extension_call})
        runs: list[dict[str, Any]] = []
        checks: list[dict[str, Any]] = []
        changed: set[int] = set()
        failure: _Stop | None = None
        try:
            for index, kind, _ in trials:
                runs.append(self._receive_candidate("run", self.config.limits.candidate_timeout_s,
                                                    context=f"trial {index} ({kind})"))
                self._send_reference("check", {"index": index, "outputs": runs[-1].get("outputs")})
        except _Stop as stop:
            failure = stop
        checks = [self._receive_reference("check") for _ in runs]
        if failure is None:
            # After the reference has read the outputs: outputs shared in place must not have
            # changed by then (deferred work finishing the result for the check, not the timer).
            try:
                changed = set(self._ask_candidate("settle", {}, self.config.limits.candidate_timeout_s)["changed"])
            except _Stop as stop:
                failure = stop
        for position, reply in enumerate(runs):
            if position > 0:
                self._judge(*trials[position - 1][:2], checks[position - 1])
            self._raise_on_violations(reply)
            if trials[position][0] in changed:
                raise self._violation("output-changed-after-return", "outputs kept changing after forward() "
                                      "returned and the device was synchronised")
        if runs:
            self._judge(*trials[len(runs) - 1][:2], checks[len(runs) - 1])
        if failure is not None:
            raise failure
        self._ask_candidate("release", {"trials": [index for index, _, _ in trials]},
                            self.config.limits.candidate_timeout_s)

    def _judge(self, index: int, kind: str, check: dict[str, Any]) -> None:
        """Record the reference's check of trial ``index`` and stop if it failed."""
        result = TrialResult(index, kind, bool(check["passed"]), str(check["message"]),
                             check.get("max_abs_err"), check.get("error_ratio"))
        self.verdict.trials.append(result)
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
        eager, compiled = self._reward_baseline(baselines, "eager"), self._reward_baseline(baselines, "compile")
        if (self.config.device == "cuda" and eager and candidate.median_ms > 0
                and eager.median_ms / candidate.median_ms > self.config.verify.plausible_speedup):
            host = self._time_candidate(host_clock=True)
            self.verdict.notes.append(
                f"timing: a {eager.median_ms / candidate.median_ms:.3g}x speed-up over eager is above the plausibility "
                f"bound ({self.config.verify.plausible_speedup:g}x); re-measured with the host clock: "
                f"{host.median_ms:.4g} ms vs {candidate.median_ms:.4g} ms with CUDA events; the slower one counts")
            candidate = max(candidate, host, key=lambda stats: stats.median_ms)
        if candidate.median_ms > 0:
            candidate = self._retime_near_threshold(candidate, [b for b in (eager, compiled) if b is not None])
        v = self.verdict
        v.candidate_timing = candidate
        v.candidate_ms = candidate.median_ms
        v.speedups = {name: s.median_ms / candidate.median_ms for name, s in baselines.items() if candidate.median_ms > 0}
        v.eager_ms = eager.median_ms if eager else None
        v.compile_ms = compiled.median_ms if compiled else None
        v.speedup_vs_eager, v.speedup_vs_eager_lower = self._speedup(eager, candidate, "eager")
        v.speedup_vs_compile, v.speedup_vs_compile_lower = self._speedup(compiled, candidate, "compile")

    def _speedup(self, baseline: TimingStats | None, candidate: TimingStats,
                 kind: str) -> tuple[float | None, float | None]:
        """The speed-up over ``baseline`` and its lower bound (what the reward uses), with a note
        when the bound withholds a milestone the speed-up alone would earn."""
        if baseline is None or baseline.median_ms <= 0 or candidate.median_ms <= 0:
            return None, None
        speedup = Speedup.of(baseline, candidate, self.verdict.reward_drift)
        lower = speedup.lower_bound(self._bound_z)
        if speedup.value > self._threshold >= lower:
            self.verdict.notes.append(
                f"reward: the speed-up vs {kind} ({speedup.value:.4g}x) clears {self._threshold:.4g} but its "
                f"{self.config.reward.confidence:.0%} lower bound ({lower:.4g}x, counting "
                f"{self.verdict.reward_drift:.1%} drift of each timing between verdicts) does not: that milestone is "
                "not awarded")
        return speedup.value, lower

    @property
    def _threshold(self) -> float:
        return MILESTONES.get(self.config.reward.milestone)

    @property
    def _bound_z(self) -> float:
        """How many standard errors the reward's bounds lie below the speed-ups (0: no bound)."""
        reward = self.config.reward
        return bound_z(reward.confidence, looks=2 if reward.resample_budget_s > 0 else 1)

    def _retime_near_threshold(self, candidate: TimingStats, baselines: list[TimingStats]) -> TimingStats:
        """The candidate timed once more, for up to ``reward.resample_budget_s`` and towards the
        precision its bound needs, when a milestone it may still earn (the compile one only after
        the eager one) clears its threshold within its uncertainty; else ``candidate`` itself."""
        budget_s = self.config.reward.resample_budget_s
        needed = (candidate_err_needed(baselines, candidate, self._threshold, self._bound_z, self.verdict.reward_drift)
                  if budget_s else None)
        if needed is None:
            return candidate
        timing = dataclasses.replace(self._timing, budget_s=budget_s, target_rel_std_err=min(
            self._timing.target_rel_std_err, needed / MEDIAN_TO_MEAN_ERROR))
        retimed = self._time_candidate(host_clock=False, timing=timing)
        self.verdict.notes.append(
            f"timing: a speed-up was within its uncertainty of {self._threshold:.4g}, so the candidate was timed again "
            f"for up to {budget_s:g} s: {retimed.n} samples, median ±{retimed.median_rel_err:.2%} (was "
            f"{candidate.n}, ±{candidate.median_rel_err:.2%}); the second timing counts")
        return retimed

    def _time_candidate(self, host_clock: bool, timing: TimingConfig | None = None) -> TimingStats:
        """One timing loop in the candidate worker on the timed trial's inputs (shared afresh by
        the reference), its audited calls then checked by the reference; ``timing``: other
        settings than the baselines' (a longer loop near a threshold)."""
        noise_seed = secrets.randbits(62)
        inputs = self._ask_reference("timing_inputs", {})["inputs"]
        reply = self._ask_candidate("time", {
            "inputs": inputs, "timing": dataclasses.asdict(timing or self._timing),
            "noise_seed": noise_seed, "audits": self._audits, "audit_seed": secrets.randbits(62),
            "host_clock": host_clock, "timed_cpus": self._timed_cpus,
        }, self.config.limits.timing_timeout_s, context="timing (host clock)" if host_clock else "timing")
        self._note_clock("timing")
        self._note_unpinned(reply, "the candidate worker")
        self._raise_on_violations(reply)
        stats = TimingStats.from_dict(reply["stats"])
        self._audit_timed_calls(reply.get("audited"), stats.n * stats.calls_per_sample, noise_seed)
        self._ask_candidate("release", {"audited": True}, self.config.limits.candidate_timeout_s)
        self._ask_reference("finish_timing", {})
        return stats

    @property
    def _audits(self) -> int:
        """Timed calls to audit: as configured, fewer when their kept outputs would not fit."""
        return self.plan.audits if self.plan is not None else self.config.verify.timed_audits

    @property
    def _timed_cpus(self) -> list[int] | None:
        """The CPUs a worker moves its timing loops onto (see ``timed_cpus``)."""
        split = self.slot.cpu_split
        return sorted(split.timed) if split is not None else None

    def _note_clock(self, after: str) -> None:
        """The GPU's SM clock right after a timing (``device_clock``), in the verdict's environment."""
        clock = sm_clock_mhz(self.config.device)
        if clock is not None:
            self.verdict.environment[f"sm_clock_mhz_{after}"] = str(clock)

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
        """Have the reference check the outputs the candidate kept for its audited timed calls.

        The parent, not the candidate, derives each call's input seed, so a reply can only name
        which calls were audited (and where their outputs are), and must name as many as were
        asked for."""
        expected = min(self._audits, samples)
        entries = audited if isinstance(audited, list) and all(isinstance(a, dict) for a in audited) else []
        calls = [a.get("call") for a in entries]
        if len(calls) != expected or len(set(calls)) != expected or not all(isinstance(c, int) and c > 0 for c in calls):
            raise self._violation("timed-audit-missing", f"the timing reply did not report {expected} audited timed calls")
        for call, entry in zip(calls, entries):
            self._send_reference("audit", {"seed": call_seed(noise_seed, call), "noise": self.config.timing.input_noise,
                                           "outputs": entry.get("outputs")})
        checks = [self._receive_reference("audit") for _ in calls]  # all received before any is judged
        for call, check in zip(calls, checks):
            if not check["passed"]:
                raise self._violation("timed-output-incorrect", (
                    f"timed call {call} returned a wrong result ({check['message']}): the candidate computes "
                    "differently when timed than when verified"))

    def _violation(self, code: str, message: str) -> _Stop:
        self.verdict.violations.append(Violation(code, message))
        return _Stop(Status.GUARD_VIOLATION, message)

    def _reward_baseline(self, baselines: dict[str, TimingStats], kind: str) -> TimingStats | None:
        """The baseline timing the reward compares against, per the policy's TF32 rule."""
        off, on = baselines.get(f"{kind}_tf32_off"), baselines.get(f"{kind}_tf32_on")
        if on is None:  # CPU: TF32 does not exist, both settings are the same computation
            return off
        if self.verdict.reward_baseline == "tf32_default":
            return baselines[f"{kind}_tf32_default"]
        if self.policy.baseline == "tf32_on":
            return on
        if self.policy.baseline == "fastest":
            return min(off, on, key=lambda stats: stats.median_ms)
        return off

    # -- worker calls ------------------------------------------------------------------------
    def _record_memory(self) -> None:
        """Each worker's peak memory: host from the kernel (read here), device as the worker
        reports it when it is still alive and idle."""
        for name, worker in (("reference", self.slot.reference), ("candidate", self.slot.candidate)):
            if worker is None:
                continue
            peak: dict[str, float] = {}
            host = worker.peak_rss_mb()
            if host is not None:
                peak["peak_host_mb"] = host
            if worker.idle:
                try:
                    reported = worker.request({"op": "stats"}, 30)
                    peak.update({key: float(reported[key]) for key in ("peak_device_mb", "peak_device_reserved_mb")
                                 if isinstance(reported.get(key), (int, float))})
                except (WorkerError, RemoteError):
                    pass
            if peak:
                self.verdict.memory_mb.setdefault(name, {}).update(peak)

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
            if _is_out_of_memory(exc):
                raise _Stop(Status.TASK_ERROR, f"the reference ran out of memory during '{op}' ({exc}); "
                                               f"{self._size_summary()}") from None
            raise _Stop(Status.TASK_ERROR, f"reference '{op}' failed: {exc}\n{exc.traceback}".strip()) from None
        except WorkerMemoryExceeded as exc:
            raise _Stop(Status.TASK_ERROR, f"the reference ran out of host memory during '{op}': {exc} "
                                           f"(limits.reference_mem_mb); {self._size_summary()}") from None
        except WorkerError as exc:
            reference = self.slot.reference
            killed = isinstance(exc, WorkerDied) and reference.proc.returncode == -signal.SIGKILL
            if killed and reference.oom_killed() and reference.last_rss_mb * 2**20 > available_host_bytes():
                # it held more than the host had left: the problem does not fit, no retry helps
                raise _Stop(Status.TASK_ERROR, f"the reference ran out of host memory during '{op}': {exc}; "
                                               f"{self._size_summary()}") from None
            # Other SIGKILLs (the OOM killer ending it for a neighbour's memory, an operator) are
            # no fault of the task; pools try again.
            raise _Stop(Status.INFRA_ERROR if killed else Status.TASK_ERROR,
                        f"reference worker failed during '{op}': {exc}\n{exc.log_tail}".strip()) from None

    def _size_summary(self) -> str:
        sizes = self.verdict.problem_bytes
        if not sizes:
            return "the problem's size is unknown"
        outputs = sizes.get("output_bytes")
        return (f"the problem's inputs are {gigabytes(sizes.get('input_bytes') or 0)}, its outputs "
                f"{'unknown' if outputs is None else gigabytes(outputs)}")

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
