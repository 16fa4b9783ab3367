"""``cuda-agent optimize``: one task, one episode, and the best verified solution written out.

The best solution is the highest-reward correct one among the snapshots the evaluator profiled
during the episode (``./profile``) and the final workdir (its fastest on a tie). Every one of
those verdicts is the trusted evaluator's; nothing the agent printed is used.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuda_agent.agent.base import Policy
from cuda_agent.agent.config import AgentConfig
from cuda_agent.agent.evaluation import EvaluationQueue
from cuda_agent.agent.loop import run_episode
from cuda_agent.agent.trajectory import Trajectory, append_trajectory
from cuda_agent.environment import EvalConfig, Task

REPORT_FILE = "report.json"
TRAJECTORY_FILE = "trajectory.jsonl"


@dataclass(frozen=True)
class OptimizeResult:
    """The episode and the solution chosen from it."""

    trajectory: Trajectory
    best: dict[str, Any]
    """The ``EvaluationRecord`` (as a dict) of the solution written out."""
    report: dict[str, Any]
    out_dir: Path


def best_evaluation(trajectory: Trajectory) -> dict[str, Any]:
    """The best trusted, fully profiled evaluation of the episode (the final one if none is correct)."""
    profiled = [e for e in trajectory.evaluations if e["op"] == "profile" and e["ok"]]
    candidates = [*profiled, trajectory.final] if trajectory.final["ok"] else profiled
    if not candidates:
        return trajectory.final
    return max(candidates, key=lambda e: (e["reward"], -(e["verdict"].get("candidate_ms") or float("inf")),
                                          e["number"]))


async def optimize(task: Task, policy: Policy, agent_config: AgentConfig, eval_config: EvalConfig,
                   out_dir: Path, queue: EvaluationQueue | None = None) -> OptimizeResult:
    """Run one episode on ``task`` and write ``out_dir/model_new.py`` (plus ``kernels/`` for the
    workdir layout), ``out_dir/report.json`` and ``out_dir/trajectory.jsonl``.

    Args:
        queue: the evaluation queue to share with other episodes; by default one of its own, one
            evaluation at a time.
    """
    keep = agent_config.keep_workdir
    own_queue = queue is None
    queue = EvaluationQueue(eval_config, 1) if own_queue else queue
    try:
        trajectory = await run_episode(task, policy, agent_config.replace(keep_workdir=True), queue)
    finally:
        if own_queue:
            queue.close()
    try:
        best = best_evaluation(trajectory)
        out_dir.mkdir(parents=True, exist_ok=True)
        _copy_solution(Path(trajectory.workdir) / "snapshots" / str(best["number"]), out_dir)
        report = {**best["verdict"], "turns": trajectory.turns, "episode_id": trajectory.episode_id,
                  "solution_from": f"{best['op']} evaluation #{best['number']} (turn {best['turn']})",
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
    return OptimizeResult(trajectory, best, report, out_dir)


def _copy_solution(snapshot: Path, out_dir: Path) -> None:
    kernels = out_dir / "kernels"
    if kernels.exists():
        shutil.rmtree(kernels)
    for source in sorted(snapshot.rglob("*")):
        if source.is_file():
            target = out_dir / source.relative_to(snapshot)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
