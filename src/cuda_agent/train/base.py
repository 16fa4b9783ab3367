"""The trainer's extension point: an :class:`Environment` gives tasks, runs multi-turn episodes
through the agent loop, and scores single-turn responses.

The kernel environment (``cuda``) and the synthetic sanity check (``keypad``) implement the same
interface, and both run episodes through :class:`cuda_agent.agent.loop.Episode` with the ``hf``
policy: what the learning test exercises is the path real training takes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, ClassVar

from cuda_agent.agent.base import Policy
from cuda_agent.agent.trajectory import Trajectory
from cuda_agent.environment import Task


@dataclass(frozen=True)
class ResponseScore:
    """The reward of one single-turn response."""

    reward: float | None
    """The milestone reward (-1, 1, 2, 3), or ``None`` when no verdict could be reached for
    reasons outside the policy's control (a worker died on every attempt): such samples are left
    out of the update instead of being punished."""
    detail: str
    """One line: why (the verdict's status, or what was missing from the response)."""


class Environment(ABC):
    """Tasks, episodes and scoring for one training run.

    The trainer calls :meth:`start` and :meth:`stop` around each batch of episodes, inside the
    event loop that runs them (per-loop resources such as the evaluation queue live there), and
    :meth:`close` once at the end.
    """

    name: ClassVar[str]
    tasks: list[Task]
    device: str
    """Where candidates run (``cuda``/``cpu``), recorded in trajectories."""

    async def start(self) -> None:
        """Prepare for a batch of concurrent episodes (called in their event loop)."""

    async def stop(self) -> None:
        """Release what :meth:`start` made."""

    @abstractmethod
    async def episode(self, task: Task, policy: Policy, episode_id: str, sample: int) -> Trajectory:
        """One multi-turn episode of ``policy`` on ``task``, scored by the environment."""

    @abstractmethod
    def single_turn_prompt(self, task: Task) -> list[dict[str, Any]]:
        """The warm-up prompt for ``task``: chat messages asking for one complete answer."""

    @abstractmethod
    def score_responses(self, items: list[tuple[Task, str]]) -> list[Future[ResponseScore]]:
        """Start scoring each ``(task, response text)``; returns at once (the futures resolve as
        evaluations finish, so the caller can use the GPU meanwhile)."""

    def close(self) -> None:
        """Stop workers and pools."""


def resolved(score: ResponseScore) -> Future[ResponseScore]:
    """A future that is already done (a score known without evaluating anything)."""
    future: Future[ResponseScore] = Future()
    future.set_result(score)
    return future
