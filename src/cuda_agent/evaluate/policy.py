"""Evaluating a policy: the agent writes one solution per task into a folder, which is then
evaluated like any folder of solutions.

Splitting the two keeps the benchmark numbers independent of how solutions were produced (the
trusted evaluator scores the agent's final workdir once more, as in DESIGN §4), and makes a policy
run resumable in both halves: tasks that already have a solution in the folder are not given to
the agent again, and the evaluation continues through the results store.
"""

from __future__ import annotations

from pathlib import Path

from cuda_agent.environment import EvalConfig
from cuda_agent.evaluate.tasks import EvalTask

DEFAULT_TURNS = 200
"""Agent turns per task in evaluation (DESIGN §4: training uses 150, evaluation 200)."""


class AgentUnavailable(RuntimeError):
    """``--policy`` was asked for, but this installation has no agent loop."""


def tasks_without_solution(tasks: list[EvalTask], solutions_dir: Path) -> list[EvalTask]:
    """Loaded tasks with neither ``<key>.py`` nor ``<key>/`` in ``solutions_dir`` yet."""
    return [t for t in tasks if t.task is not None
            and not (solutions_dir / f"{t.key}.py").is_file() and not (solutions_dir / t.key).is_dir()]


def run_agent(tasks: list[EvalTask], policy: str, turns: int, solutions_dir: Path, config: EvalConfig) -> None:
    """Have the agent solve ``tasks`` with ``policy``, writing each task's best solution to
    ``solutions_dir/<task key>/`` (a workdir) or ``<task key>.py``.

    This is the one place the evaluation depends on the agent loop (``cuda_agent.agent``).

    Raises:
        AgentUnavailable: ``cuda_agent.agent`` cannot be imported.
    """
    try:
        from cuda_agent.agent import run_episodes
    except ImportError as exc:
        raise AgentUnavailable(
            f"--policy needs the agent loop (cuda_agent.agent), which this installation lacks ({exc}); "
            "evaluate a folder of solutions with --solutions instead") from None
    solutions_dir.mkdir(parents=True, exist_ok=True)
    run_episodes({t.key: t.task for t in tasks}, policy, max_turns=turns, out_dir=solutions_dir, eval_config=config)
