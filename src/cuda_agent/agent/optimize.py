"""``cuda-agent optimize``: one task, one episode, and its scored solution written out.

Which solution an episode is scored by is a named rule (``SOLUTION_RULES``):

- ``final`` (default): the final workdir, scored once more by the trusted evaluator when the
  episode ends. Training rewards an episode by exactly this verdict, so evaluation numbers and
  training rewards describe the same thing.
- ``best``: the highest-reward correct solution among the snapshots the evaluator profiled during
  the episode (``./profile``) and the final workdir (the fastest on a tie); the final workdir
  when none is correct. A best-of-episode number is an upper bound on ``final``.

Every verdict used is the trusted evaluator's; nothing the agent printed is used.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from cuda_agent.agent.base import Policy
from cuda_agent.agent.config import AgentConfig
from cuda_agent.agent.evaluation import EvaluationQueue
from cuda_agent.agent.loop import run_episode
from cuda_agent.agent.trajectory import Trajectory, append_trajectory
from cuda_agent.environment import EvalConfig, Task
from cuda_agent.registry import Registry

REPORT_FILE = "report.json"
TRAJECTORY_FILE = "trajectory.jsonl"


@dataclass(frozen=True)
class OptimizeResult:
    """The episode and the solution chosen from it."""

    trajectory: Trajectory
    chosen: dict[str, Any]
    """The ``EvaluationRecord`` (as a dict) of the solution written out."""
    report: dict[str, Any]
    out_dir: Path


def final_evaluation(trajectory: Trajectory) -> dict[str, Any]:
    """The scoring of the final workdir (what training rewards)."""
    return trajectory.final


def best_evaluation(trajectory: Trajectory) -> dict[str, Any]:
    """The best trusted, fully profiled evaluation of the episode (the final one if none is correct)."""
    profiled = [e for e in trajectory.evaluations if e["op"] == "profile" and e["ok"]]
    candidates = [*profiled, trajectory.final] if trajectory.final["ok"] else profiled
    if not candidates:
        return trajectory.final
    return max(candidates, key=lambda e: (e["reward"], -(e["verdict"].get("candidate_ms") or float("inf")),
                                          e["number"]))


async def optimize(task: Task, policy: Policy, agent_config: AgentConfig, eval_config: EvalConfig,
                   out_dir: Path, queue: EvaluationQueue | None = None, solution_rule: str = "final") -> OptimizeResult:
    """Run one episode on ``task`` and write the solution ``solution_rule`` picks (``model_new.py``
    plus the workdir's sources), ``out_dir/report.json`` and ``out_dir/trajectory.jsonl``.

    Args:
        queue: the evaluation queue to share with other episodes; by default one of its own, one
            evaluation at a time.
        solution_rule: a name in ``SOLUTION_RULES`` (``final`` or ``best``).
    """
    choose = SOLUTION_RULES.get(solution_rule)
    keep = agent_config.keep_workdir
    own_queue = queue is None
    queue = EvaluationQueue(eval_config, 1) if own_queue else queue
    try:
        trajectory = await run_episode(task, policy, agent_config.replace(keep_workdir=True), queue)
    finally:
        if own_queue:
            queue.close()
    try:
        chosen = choose(trajectory)
        out_dir.mkdir(parents=True, exist_ok=True)
        _copy_solution(Path(trajectory.workdir) / "snapshots" / str(chosen["number"]), out_dir)
        report = {**chosen["verdict"], "turns": trajectory.turns, "episode_id": trajectory.episode_id,
                  "solution_rule": solution_rule,
                  "solution_from": f"{chosen['op']} evaluation #{chosen['number']} (turn {chosen['turn']})",
                  "end_reason": trajectory.end_reason}
        (out_dir / REPORT_FILE).write_text(json.dumps(report, indent=2, allow_nan=False, default=str) + "\n")
        if not keep:
            shutil.rmtree(trajectory.workdir, ignore_errors=True)
            trajectory.workdir = None
        (out_dir / TRAJECTORY_FILE).unlink(missing_ok=True)
        append_trajectory(out_dir / TRAJECTORY_FILE, trajectory)
    except BaseException:
        if not keep and trajectory.workdir:
            shutil.rmtree(trajectory.workdir, ignore_errors=True)
        raise
    return OptimizeResult(trajectory, chosen, report, out_dir)


SOLUTION_RULES: Registry[Callable[[Trajectory], dict[str, Any]]] = Registry("solution rule")
SOLUTION_RULES.register("final", final_evaluation)
SOLUTION_RULES.register("best", best_evaluation)


def _copy_solution(snapshot: Path, out_dir: Path) -> None:
    kernels = out_dir / "kernels"
    if kernels.exists():
        shutil.rmtree(kernels)
    for source in sorted(snapshot.rglob("*")):
        if source.is_file():
            target = out_dir / source.relative_to(snapshot)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
