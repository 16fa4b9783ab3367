"""One ReAct episode: the policy acts through tool calls until it finishes or a budget runs out;
then the trusted evaluator scores the final workdir.

    trajectory = await run_episode(task, policy, AgentConfig(), EvaluationQueue(EvalConfig(device="cpu")))
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from cuda_agent.agent.base import Policy, PolicyError, PolicyReply
from cuda_agent.agent.config import AgentConfig
from cuda_agent.agent.context import apply_view, estimate_tokens, plan_view
from cuda_agent.agent.evaluation import EpisodeEvaluator, EvaluationQueue, EvaluationRecord
from cuda_agent.agent.prompts import system_prompt, task_prompt
from cuda_agent.agent.shell import SandboxedShell
from cuda_agent.agent.tools import ToolBox, episode_tools
from cuda_agent.agent.trajectory import FORMAT, Step, ToolCallRecord, Trajectory
from cuda_agent.agent.workdir import Workdir
from cuda_agent.environment import Task

logger = logging.getLogger(__name__)

_NO_TOOL_CALL = ("Your reply called no tool. Call a tool (e.g. bash with ./build, ./verify or ./profile) "
                 "or call finish when you are done.")


async def run_episode(task: Task, policy: Policy, config: AgentConfig, evaluations: EvaluationQueue,
                      episode_id: str | None = None, sample: int = 0) -> Trajectory:
    """Run one episode of ``policy`` on ``task`` and return its trajectory (never raises for
    anything the policy or its code does; a policy failure ends the episode with ``policy_error``).

    Args:
        evaluations: the queue every evaluation of this episode goes through (share one between
            concurrent episodes to bound the evaluations running at once).
        episode_id: a unique name (default: ``<task id>-<random>``).
        sample: which sample of this task the episode is (recorded).
    """
    episode_id = episode_id or f"{task.id}-{uuid.uuid4().hex[:8]}"
    root = Path(tempfile.mkdtemp(prefix="cuda-agent-episode-", dir=config.work_root))
    skill = config.skill_text()
    workdir = Workdir.create(root, task, config.workdir_style, skill)
    eval_config = evaluations.config
    shell = SandboxedShell(workdir.path, workdir.home, eval_config.sandbox, eval_config.limits, root, workdir.bin_dir)
    try:
        if shell.uid is not None:
            workdir.hand_to(shell.uid)
        evaluator = EpisodeEvaluator(task, workdir, evaluations, shell.uid)
        await evaluator.start()
        try:
            messages = initial_messages(task, eval_config.device, config.workdir_style, skill)
            tools = episode_tools(workdir, shell, config.tools, config.workdir_style)
            episode = Episode(task, policy, config, episode_id, tools, evaluator, messages)
            try:
                await episode.run()
            finally:
                await tools.aclose()
            final = await evaluator.evaluate("final")
        finally:
            await evaluator.close()
        trajectory = episode.trajectory(final.to_dict(), shell.describe(), sample, eval_config.device)
        trajectory.workdir = str(root) if config.keep_workdir else None
        return trajectory
    finally:
        shell.close()
        if not config.keep_workdir:
            workdir.remove()


def initial_messages(task: Task, device: str, style: str = "default", skill: str | None = None) -> list[dict[str, Any]]:
    """The system prompt and the task message every kernel episode of workdir ``style`` starts with
    (``skill``: the SKILL.md text, None for the packaged one)."""
    return [{"role": "system", "content": system_prompt(style, skill)},
            {"role": "user", "content": task_prompt(task, device, style)}]


class EvaluationLog(Protocol):
    """Where an episode's tool calls record the evaluations they ask for (:class:`EpisodeEvaluator`;
    an environment without evaluations passes an empty log)."""

    records: list[EvaluationRecord]
    turn: int
    """Set by the loop before each tool call: evaluations are recorded under this turn."""


class Episode:
    """The state of one running episode: the ReAct loop over any :class:`ToolBox`.

    :func:`run_episode` drives it with the kernel workdir's tools; other environments (the
    trainer's synthetic sanity-check task) drive it with their own tools and first messages, so
    every environment goes through the same loop, tool dispatch and trajectory format.
    """

    def __init__(self, task: Task, policy: Policy, config: AgentConfig, episode_id: str, tools: ToolBox,
                 evaluator: EvaluationLog, messages: list[dict[str, Any]]) -> None:
        self.task, self.policy, self.config, self.episode_id = task, policy, config, episode_id
        self.tools, self.evaluator = tools, evaluator
        self.messages: list[dict[str, Any]] = list(messages)
        self.steps: list[Step] = []
        self.end_reason, self.error = "max_turns", None
        self.tokens = {"prompt": 0, "completion": 0}
        self.timings = {"policy_s": 0.0, "tools_s": 0.0, "env_overhead_s": 0.0}
        self.started_at = datetime.now(timezone.utc).isoformat()
        self._started = time.monotonic()

    async def run(self) -> None:
        idle = 0
        for turn in range(self.config.max_turns):
            if self._budget_exhausted():
                return
            reply = await self._act(turn)
            if reply is None:
                return
            calls = reply.message.get("tool_calls") or []
            finished = await self._call_tools(calls, self.steps[-1]) if calls else False
            if reply.parse_errors or not calls:  # after the tool results: they must follow their calls
                self._remind(reply.parse_errors, bool(calls))
            if finished:
                self.end_reason = "finish"
                return
            idle = 0 if calls else idle + 1
            if idle >= self.config.max_idle_replies:
                self.end_reason = "idle"
                return

    def _budget_exhausted(self) -> bool:
        if time.monotonic() - self._started >= self.config.wall_clock_s:
            self.end_reason = "wall_clock"
        elif self.config.max_episode_tokens and sum(self.tokens.values()) >= self.config.max_episode_tokens:
            self.end_reason = "max_episode_tokens"
        else:
            return False
        return True

    async def _act(self, turn: int) -> PolicyReply | None:
        """Ask the policy for the next turn; record it, or end the episode on failure."""
        counter = (lambda m: self.policy.count_tokens([m]) or estimate_tokens(m))
        view = plan_view(self.messages, self.config.context, counter)
        remaining_s = self.config.wall_clock_s - (time.monotonic() - self._started)
        started = time.monotonic()
        try:
            reply = await asyncio.wait_for(
                self.policy.act(apply_view(self.messages, view), self.tools.schemas(), self.episode_id), remaining_s)
        except PolicyError as exc:
            self.end_reason, self.error = "policy_error", str(exc)
            logger.warning("episode %s: policy failed: %s", self.episode_id, exc)
            return None
        except asyncio.TimeoutError:
            self.end_reason = "wall_clock"
            return None
        policy_s = time.monotonic() - started
        self.timings["policy_s"] += policy_s
        self.tokens["prompt"] += reply.prompt_tokens
        self.tokens["completion"] += reply.completion_tokens
        self.messages.append(_assistant_message(reply.message))
        self.steps.append(Step(
            turn=turn, message_index=len(self.messages) - 1, prompt_tokens=reply.prompt_tokens,
            completion_tokens=reply.completion_tokens, policy_s=policy_s, finish_reason=reply.finish_reason,
            parse_errors=list(reply.parse_errors), context=view.to_dict() if view else None,
            prompt_token_ids=list(reply.prompt_token_ids) if reply.prompt_token_ids is not None else None,
            completion_token_ids=list(reply.completion_token_ids) if reply.completion_token_ids is not None else None))
        return reply

    def _remind(self, parse_errors: tuple[str, ...], called: bool) -> None:
        lines = [f"Could not parse: {error}" for error in parse_errors]
        if not called:
            lines.append(_NO_TOOL_CALL)
        self.messages.append({"role": "user", "content": "\n".join(lines)})

    async def _call_tools(self, calls: list[dict[str, Any]], step: Step) -> bool:
        """Run the turn's tool calls in order; True when one of them was ``finish``."""
        self.evaluator.turn = step.turn
        finished = False
        for call in calls:
            function = call["function"]
            if finished:
                self._tool_message(call, "not run: finish was called earlier in this reply")
                continue
            before = len(self.evaluator.records)
            started = time.monotonic()
            result = await self.tools.call(function["name"], function.get("arguments") or "")
            latency_s = time.monotonic() - started
            asked = self.evaluator.records[before:]
            overhead_s = latency_s - sum(r.compile_s + r.timing_s for r in asked)
            step.evaluations.extend(r.number for r in asked)
            step.tool_calls.append(ToolCallRecord(
                id=call["id"], name=function["name"], arguments=function.get("arguments") or "", ok=result.ok,
                output_chars=len(result.output), latency_s=latency_s, overhead_s=overhead_s, details=result.details))
            self.timings["tools_s"] += latency_s
            self.timings["env_overhead_s"] += overhead_s
            self._tool_message(call, result.output)
            finished = result.finish
        return finished

    def _tool_message(self, call: dict[str, Any], content: str) -> None:
        self.messages.append({"role": "tool", "tool_call_id": call["id"], "name": call["function"]["name"],
                              "content": content})

    def trajectory(self, final: dict[str, Any], sandbox: str, sample: int, device: str) -> Trajectory:
        """The finished episode; ``final`` is the scoring of its outcome (an ``EvaluationRecord`` dict)."""
        self.timings["wall_s"] = time.monotonic() - self._started
        self.timings["final_eval_s"] = final["wait_s"] + final["seconds"]
        return Trajectory(
            episode_id=self.episode_id, task_id=self.task.id, task_origin=self.task.origin,
            task_code_hash=self.task.code_hash, device=device, policy=self.policy.describe(),
            messages=self.messages, tools=self.tools.schemas(), steps=self.steps,
            evaluations=[r.to_dict() for r in self.evaluator.records if r.op != "final"], final=final,
            reward=final["reward"] if final["reward"] is not None else -1, end_reason=self.end_reason,
            tokens=self.tokens, timings=self.timings, sandbox=sandbox, config=_config_dict(self.config),
            started_at=self.started_at, finished_at=datetime.now(timezone.utc).isoformat(), sample=sample,
            error=self.error, format=FORMAT)


def _assistant_message(message: dict[str, Any]) -> dict[str, Any]:
    """The assistant message in canonical form: role, content (a string) and tool calls if any."""
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    calls = message.get("tool_calls") or []
    if calls:
        out["tool_calls"] = [{"id": c.get("id") or f"call_{uuid.uuid4().hex[:10]}", "type": "function",
                              "function": {"name": c["function"]["name"],
                                           "arguments": c["function"].get("arguments") or ""}} for c in calls]
    return out


def _config_dict(config: AgentConfig) -> dict[str, Any]:
    import dataclasses

    data = dataclasses.asdict(config)
    data["work_root"] = str(config.work_root) if config.work_root else None
    return data
