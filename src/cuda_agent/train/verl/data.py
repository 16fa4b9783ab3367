"""What a verl dataset row holds for cuda-agent, and the rows ``cuda-agent train verl-data`` writes.

RL rows (verl's PPO trainer, ``data.train_files``): ``data_source`` (``cuda_agent``), ``prompt``
(the chat messages: the agent's first two for ``agent`` rows, the warm-up prompt for
``single_turn`` rows), ``agent_name`` (``cuda_agent`` or ``cuda_agent_single_turn``), ``reward_model``
(``{"style": "rule", "ground_truth": ""}``) and ``extra_info`` (``task_id``, ``task_code``,
``index``). SFT rows (verl's SFT trainer, RFT on a cluster): ``messages``, each kept trajectory
rendered as the local policy sees it (the text tool protocol).
"""

from __future__ import annotations

from typing import Any

from cuda_agent.agent.text_protocol import render_for_text_model
from cuda_agent.agent.trajectory import Trajectory
from cuda_agent.environment import Task

DATA_SOURCE = "cuda_agent"
AGENT_LOOPS = {"agent": "cuda_agent", "single_turn": "cuda_agent_single_turn"}


def task_from_row(extra_info: Any) -> Task:
    """The task a dataset row names in ``extra_info`` (``task_id``, ``task_code``).

    Raises:
        ValueError: the row has no task.
    """
    info = dict(extra_info or {})
    if not info.get("task_code"):
        raise ValueError("dataset row: extra_info.task_code is missing (write the data with cuda-agent train verl-data)")
    task_id = str(info.get("task_id") or "task")
    return Task(task_id, str(info["task_code"]), f"verl:{task_id}")


def rl_rows(tasks: list[Task], device: str, mode: str) -> list[dict[str, Any]]:
    """One RL row per task for ``mode`` ``agent`` (multi-turn) or ``single_turn`` (warm-up).

    Raises:
        ValueError: unknown mode.
    """
    if mode not in AGENT_LOOPS:
        raise ValueError(f"unknown mode {mode!r}; valid: {', '.join(AGENT_LOOPS)}")
    if mode == "agent":
        from cuda_agent.agent.loop import initial_messages

        prompts = [initial_messages(task, device) for task in tasks]
    else:
        from cuda_agent.train.environments.cuda import warmup_prompt

        prompts = [warmup_prompt(task, device) for task in tasks]
    return [{"data_source": DATA_SOURCE, "prompt": prompt, "agent_name": AGENT_LOOPS[mode],
             "reward_model": {"style": "rule", "ground_truth": ""},
             "extra_info": {"task_id": task.id, "task_code": task.code, "index": index}}
            for index, (task, prompt) in enumerate(zip(tasks, prompts))]


def sft_rows(trajectories: list[Trajectory]) -> list[dict[str, Any]]:
    """One SFT row per trajectory: its conversation as the text-protocol policy sees it."""
    return [{"messages": render_for_text_model(t.messages, t.tools)} for t in trajectories]
