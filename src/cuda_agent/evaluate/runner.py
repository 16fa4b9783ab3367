"""One benchmark run, owned from plan to stored result: the entry ``cuda-agent eval`` and
``cuda-agent tasks check`` both call, leaving the command line only to parse and print.

A run loads its task set, gets a solution for every task (a given folder; the agent's, for a
policy; or, for the harness's self-check, each task's own reference as its candidate), plans what
is left to evaluate, sends it through a pool and stores every result the moment it arrives. Tasks
that already have a result in the store for the same solution are skipped, so a killed run
continues where it stopped. Tasks that need no evaluation (a task that does not load, a missing or
unreadable solution) get their result at once.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuda_agent.environment import EvalConfig, SolutionError, Status
from cuda_agent.environment.precision import POLICIES
from cuda_agent.environment.presets import describe
from cuda_agent.evaluate.metrics import MISSING
from cuda_agent.evaluate.store import HARNESS_ERROR, STORE_FILE, ResultRecord, ResultsStore, StoreError
from cuda_agent.evaluate.tasks import EvalTask, SolutionMatch, TaskSetError, load_task_set, match_solutions
from cuda_agent.pool import EvalJob, EvalPool, JobInputError, JobResult, PoolConfig, PoolConfigError, SolutionFiles, open_pool

logger = logging.getLogger(__name__)

SELFCHECK_FOLDER = "selfcheck_solutions"
"""Where a self-check run writes each task's reference as its candidate (inside the run folder)."""


@dataclass(frozen=True)
class TaskPlan:
    """How one task gets its result: a job for the pool, or a result known without evaluating
    (the task does not load, the solution is missing or unreadable)."""

    task: EvalTask
    solution: Path | None
    solution_hash: str | None  # content hash of the solution's files (None: no readable solution)
    job: EvalJob | None
    settled: ResultRecord | None


class RunError(ValueError):
    """The run cannot start or continue (task set, store settings, pool, policy); the message says why."""


@dataclass(frozen=True)
class AgentSpec:
    """Solutions written by the agent for a policy before they are evaluated."""

    policy: Any  # agent.policies.PolicySpec
    options: dict[str, Any]  # AgentConfig fields (max_turns, workdir_style, skill_path)
    episodes: int
    solution_rule: str


@dataclass(frozen=True)
class RunSpec:
    """What one run evaluates, where, and under which settings. Exactly one of ``solutions``,
    ``agent`` and ``selfcheck`` says where the solutions come from."""

    run_dir: Path
    tasks: Path
    levels: tuple[int, ...]
    config: EvalConfig
    pool: PoolConfig
    solutions: Path | None = None
    agent: AgentSpec | None = None
    selfcheck: bool = False


@dataclass
class RunEvents:
    """What a run tells its caller while it goes (progress bars, messages); all optional."""

    note: Callable[[str], None] = lambda message: None
    start: Callable[[int, int], None] = lambda total, done: None  # tasks in the run, already done
    result: Callable[[ResultRecord], None] = lambda record: None


@dataclass(frozen=True)
class RunSummary:
    """A finished run: every task's stored result, and what the run was."""

    records: list[ResultRecord]
    info: dict[str, Any]
    store_path: Path
    harness_errors: int = field(default=0)


def run_benchmark(spec: RunSpec, events: RunEvents | None = None) -> RunSummary:
    """Run ``spec`` to the end: every task gets a stored result (rerunning continues the run).

    Raises:
        RunError: the task set, the solutions, the store's earlier settings, the pool or the policy
            cannot be used (nothing was evaluated).
    """
    events = events or RunEvents()
    try:
        task_set = load_task_set(spec.tasks, spec.levels)
        solutions_dir = _solutions_for(spec, task_set, events)
        match = match_solutions(task_set, solutions_dir)
    except TaskSetError as exc:
        raise RunError(str(exc)) from None
    store = _open_run(spec, task_set, match, solutions_dir)
    plans = plan_run(task_set, match.by_task)
    todo = still_to_do(store, spec.run_dir.name, plans)
    _announce(task_set, match, spec.run_dir, len(plans) - len(todo), events)
    events.start(len(plans), len(plans) - len(todo))
    try:
        with open_pool(spec.config, spec.pool) as pool:
            evaluate_plans(store, spec.run_dir.name, todo, pool, events.result)
    except PoolConfigError as exc:
        raise RunError(str(exc)) from None
    records = store.records(spec.run_dir.name)
    return RunSummary(records, store.run(spec.run_dir.name).info, store.path,
                      sum(r.status == HARNESS_ERROR for r in records))


def selfcheck_config(config: EvalConfig) -> EvalConfig:
    """The settings a self-check judges a task's own reference under: the same trials, timing and
    limits, with the guards off (the reference is PyTorch code, which the guards exist to refuse)."""
    guards = dataclasses.replace(config.guards, enabled=False)
    return config.replace(guards=guards, verify=dataclasses.replace(config.verify, require_extension_call=False))


def write_selfcheck_solutions(tasks: list[EvalTask], folder: Path, tf32: bool) -> None:
    """One candidate per loaded task: the task's own code, with ``ModelNew`` as ``Model``, run with
    TF32 as the fp32 reference it is compared with (``tf32``: on for matmuls and convolutions, else
    off). Left at PyTorch's defaults (TF32 on for cuDNN convolutions), every convolution would
    carry TF32's error, which a faithful comparison rightly fails."""
    folder.mkdir(parents=True, exist_ok=True)
    for task in tasks:
        if task.task is None:
            continue
        source = (f"{task.task.code.rstrip()}\n\n\nimport torch as _torch\n\n"
                  f"_torch.backends.cuda.matmul.allow_tf32 = _torch.backends.cudnn.allow_tf32 = {tf32}\n\n\n"
                  "class ModelNew(Model):\n"
                  '    """The reference itself, judged as its own candidate (cuda-agent tasks check)."""\n')
        path = folder / f"{task.key}.py"
        if not path.is_file() or path.read_text() != source:
            path.write_text(source)


def _solutions_for(spec: RunSpec, task_set: list[EvalTask], events: RunEvents) -> Path:
    """The folder of solutions to evaluate: the given one, the self-check's, or the agent's."""
    given = sum(x is not None and x is not False for x in (spec.solutions, spec.agent, spec.selfcheck))
    if given != 1:
        raise RunError("a run evaluates exactly one of: a folder of solutions, a policy, or the self-check")
    if spec.solutions is not None:
        return spec.solutions
    if spec.selfcheck:
        folder = spec.run_dir / SELFCHECK_FOLDER
        write_selfcheck_solutions(task_set, folder, POLICIES.get(spec.config.verify.precision).needs_tf32_reference)
        return folder
    return _agent_solutions(spec, task_set, events)


def _agent_solutions(spec: RunSpec, task_set: list[EvalTask], events: RunEvents) -> Path:
    from cuda_agent.agent import AgentConfig, AgentConfigError
    from cuda_agent.agent.optimize import SOLUTION_RULES
    from cuda_agent.evaluate.policy import run_agent, tasks_without_solution

    agent = spec.agent
    if agent.episodes < 1:
        raise RunError(f"--episodes must be >= 1, got {agent.episodes}")
    if agent.solution_rule not in SOLUTION_RULES:
        raise RunError(f"--solution {agent.solution_rule!r} is unknown; valid: {', '.join(SOLUTION_RULES.names())}")
    folder = spec.run_dir / "solutions"
    todo = tasks_without_solution(task_set, folder)
    events.note(f"agent: {len(todo)} of {len(task_set)} tasks to solve with the {agent.policy.name} policy "
                f"({agent.options['max_turns']} turns each, {agent.episodes} episodes at once; scored solution: "
                f"{agent.solution_rule})")
    try:
        failures = run_agent(todo, agent.policy, AgentConfig.from_dict(agent.options, "agent options"), folder,
                             spec.config, agent.episodes, agent.solution_rule)
    except (AgentConfigError, ValueError) as exc:  # a policy that cannot be made (bad model, endpoint, script)
        raise RunError(f"cannot run the {agent.policy.name} policy: {exc}") from None
    for key, error in failures:
        events.note(f"agent episode for {key} failed ({error}); it counts as failed, a rerun retries it")
    return folder


def _open_run(spec: RunSpec, task_set: list[EvalTask], match: SolutionMatch, solutions_dir: Path) -> ResultsStore:
    """The run's store, with the run started (or checked to continue under the same settings)."""
    store = ResultsStore(spec.run_dir / STORE_FILE)
    info = {"tasks": str(spec.tasks), "solutions": str(solutions_dir),
            "policy": spec.agent.policy.name if spec.agent is not None else None, "selfcheck": spec.selfcheck,
            "device": spec.config.device, "precision": spec.config.verify.precision, "preset": spec.config.preset,
            "protocol": describe(spec.config), "backend": spec.pool.backend,
            "unmatched_solutions": [str(p) for p in match.unmatched]}
    try:
        store.start_run(spec.run_dir.name, run_settings(spec.tasks, spec.levels, solutions_dir, task_set, spec.config),
                        info)
    except StoreError as exc:
        raise RunError(str(exc)) from None
    return store


def _announce(task_set: list[EvalTask], match: SolutionMatch, run_dir: Path, done: int, events: RunEvents) -> None:
    missing = sum(path is None for path in match.by_task.values())
    unloaded = sum(t.task is None for t in task_set)
    events.note(f"{len(task_set)} tasks, {match.n_found} solutions ({missing} missing, counted as failed)"
                + (f", {unloaded} tasks do not load" if unloaded else "")
                + (f"; continuing {run_dir}: {done} already done" if done else f"; results in {run_dir}"))
    if match.unmatched:
        names = ", ".join(p.name for p in match.unmatched[:5]) + (" ..." if len(match.unmatched) > 5 else "")
        events.note(f"{len(match.unmatched)} entries of the solutions folder match no task: {names}")


def run_settings(tasks_path: Path, levels: tuple[int, ...], solutions_dir: Path, tasks: list[EvalTask],
                 config: EvalConfig) -> dict[str, Any]:
    """What must not change while a run is continued: the tasks (by content), where the solutions
    come from, and every evaluation setting except where files are kept."""
    evaluation = {k: v for k, v in config.to_dict().items() if k not in ("cache_dir", "scratch_dir", "sandbox")}
    return {"tasks": str(tasks_path.resolve()), "levels": list(levels), "solutions": str(solutions_dir.resolve()),
            "task_hashes": {t.key: t.task.code_hash if t.task else None for t in tasks}, "evaluation": evaluation}


def plan_run(tasks: list[EvalTask], solutions: dict[str, Path | None]) -> list[TaskPlan]:
    """One plan per task; ``solutions`` maps a task key to its solution path (None: missing)."""
    return [_plan(task, solutions.get(task.key)) for task in tasks]


def still_to_do(store: ResultsStore, run_id: str, plans: list[TaskPlan]) -> list[TaskPlan]:
    """Plans whose task has no final result in the store for this very solution (resuming skips the
    rest; a solution changed since its result was stored is evaluated again)."""
    finished = store.finished(run_id)
    return [p for p in plans if p.task.key not in finished or finished[p.task.key] != p.solution_hash]


def evaluate_plans(store: ResultsStore, run_id: str, plans: list[TaskPlan], pool: EvalPool,
                   on_result: Callable[[ResultRecord], None] | None = None) -> None:
    """Give every plan its result, storing each one the moment it is known.

    Args:
        on_result: called with each new result (progress bars).
    """
    def keep(record: ResultRecord) -> None:
        store.record(run_id, record)
        if on_result is not None:
            on_result(record)

    futures: dict[Future[JobResult], TaskPlan] = {}
    for plan in plans:
        if plan.settled is not None:
            keep(plan.settled)
        else:
            futures[pool.submit(plan.job)] = plan
    for future in as_completed(futures):
        keep(_record_of(futures[future], future.result()))


def _plan(task: EvalTask, solution: Path | None) -> TaskPlan:
    if task.task is None:
        return TaskPlan(task, solution, None, None,
                        _settled(task, solution, Status.TASK_ERROR.value, f"the task does not load: {task.error}"))
    if solution is None:
        return TaskPlan(task, None, None, None, _settled(task, None, MISSING, "no solution for this task"))
    try:
        files = SolutionFiles.from_path(solution)
    except (SolutionError, JobInputError) as exc:
        return TaskPlan(task, solution, None, None, _settled(task, solution, Status.SOLUTION_ERROR.value, str(exc)))
    return TaskPlan(task, solution, files.content_hash(), EvalJob(task.key, task.task, files), None)


def _settled(task: EvalTask, solution: Path | None, status: str, error: str) -> ResultRecord:
    return ResultRecord(task.key, task.level, task.origin, None if solution is None else str(solution), None, status,
                        False, None, error, None, 0, 0.0, time.time())


def _record_of(plan: TaskPlan, result: JobResult) -> ResultRecord:
    task, solution = plan.task, str(plan.solution)
    if result.verdict is None:
        logger.warning("task %s has no verdict: %s", task.key, result.error)
        return ResultRecord(task.key, task.level, task.origin, solution, plan.solution_hash, HARNESS_ERROR, False,
                            None, result.error, result.worker or None, result.attempts, result.eval_s, time.time())
    verdict = result.verdict
    return ResultRecord(task.key, task.level, task.origin, solution, plan.solution_hash, verdict.status.value,
                        verdict.correct, verdict.to_json_dict(), verdict.error, result.worker, result.attempts,
                        result.eval_s, time.time())
