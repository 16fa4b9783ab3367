"""The agent's extension points: a ``Policy`` chooses the next assistant message, a ``Tool`` acts
on the workdir. Both speak chat-completions messages (``{"role", "content", "tool_calls"}``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar


class PolicyError(RuntimeError):
    """The policy cannot produce a reply (endpoint down, model failed, replay exhausted): the
    episode ends with end reason ``policy_error`` and the message is recorded."""


@dataclass(frozen=True)
class PolicyReply:
    """One assistant turn.

    ``message`` is the assistant message in chat-completions form; tool calls parsed from text
    (for models without native tool calling) are already in ``message["tool_calls"]``, and
    ``parse_errors`` says which ``<tool_call>`` blocks could not be parsed.
    """

    message: dict[str, Any]
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str = ""
    parse_errors: tuple[str, ...] = ()
    prompt_token_ids: tuple[int, ...] | None = None
    """The exact prompt the policy saw, as token ids (local models only: what a trainer needs)."""
    completion_token_ids: tuple[int, ...] | None = None
    """The tokens the policy generated for this turn (local models only)."""


class Policy(ABC):
    """Chooses the next assistant message from the conversation so far."""

    name: ClassVar[str]

    @abstractmethod
    async def act(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], episode_id: str) -> PolicyReply:
        """The next assistant turn for ``messages`` with ``tools`` (OpenAI function schemas).

        Raises:
            PolicyError: no reply can be produced; the message says why.
        """

    def describe(self) -> dict[str, Any]:
        """What produced the trajectory (name, model, sampling settings), recorded in it."""
        return {"name": self.name}

    def count_tokens(self, messages: list[dict[str, Any]]) -> int | None:
        """Exact prompt size of ``messages`` when the policy has a tokenizer, else ``None``."""
        return None

    async def aclose(self) -> None:
        """Release connections, threads or models."""


@dataclass(frozen=True)
class ToolResult:
    """What a tool call returns to the model (``output``) and to the trajectory (``details``)."""

    output: str
    ok: bool = True
    """False: the call failed in a way the model should act on (the output says how)."""
    finish: bool = False
    """True: the agent declared the episode done."""
    details: dict[str, Any] = field(default_factory=dict)


class ToolError(Exception):
    """A tool call cannot be carried out; the message is returned to the model as the result."""


class Tool(ABC):
    """One function the model can call: its schema and its implementation."""

    name: ClassVar[str]
    description: ClassVar[str]
    parameters: ClassVar[dict[str, Any]]
    """JSON schema of the arguments object."""

    @classmethod
    def schema(cls) -> dict[str, Any]:
        """The OpenAI function-calling schema (a class attribute: no instance needed)."""
        return {"type": "function",
                "function": {"name": cls.name, "description": cls.description, "parameters": cls.parameters}}

    @abstractmethod
    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        """Carry out the call (arguments already checked against ``parameters``).

        Raises:
            ToolError: with a message the model can act on.
        """


def object_schema(required: list[str], **properties: dict[str, Any]) -> dict[str, Any]:
    """The JSON schema of a tool's arguments: an object of ``properties``, no others allowed."""
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
