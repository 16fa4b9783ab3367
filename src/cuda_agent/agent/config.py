"""Configuration of the agent: one frozen, validated dataclass per component."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class AgentConfigError(ValueError):
    """An agent configuration value is invalid; the message names the field and what is allowed."""


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise AgentConfigError(message)


@dataclass(frozen=True)
class ToolConfig:
    """Limits of the coding tools."""

    bash_timeout_s: float = 300.0
    """Default time limit of one ``bash`` call (protected commands included: a first compile takes
    30-60 s, and an evaluation may wait for a free evaluation slot)."""
    max_bash_timeout_s: float = 1800.0
    """The most a ``bash`` call may ask for with its ``timeout_s`` argument."""
    max_output_chars: int = 12000
    """Tool output beyond this is cut in the middle, with a marker saying how much."""
    max_file_bytes: int = 1 << 20
    """Largest file ``write_file``/``edit_file`` write and ``read_file`` reads."""
    max_matches: int = 200
    """Most paths ``glob`` and most lines ``grep`` return."""

    def __post_init__(self) -> None:
        _require(0 < self.bash_timeout_s <= self.max_bash_timeout_s,
                 f"tools.bash_timeout_s must be in (0, max_bash_timeout_s={self.max_bash_timeout_s}], "
                 f"got {self.bash_timeout_s}")
        for name in ("max_output_chars", "max_file_bytes", "max_matches"):
            _require(getattr(self, name) >= 100 if name != "max_matches" else getattr(self, name) >= 1,
                     f"tools.{name} is too small: {getattr(self, name)}")


@dataclass(frozen=True)
class ContextConfig:
    """What the policy sees when the history approaches its context window."""

    window_tokens: int = 32768
    """The policy's context window (prompt and reply together)."""
    reply_tokens: int = 4096
    """Room kept free for the reply."""
    keep_turns: int = 8
    """The latest turns (assistant message and its tool results) always kept whole."""

    def __post_init__(self) -> None:
        _require(self.window_tokens >= 1024, f"context.window_tokens must be >= 1024, got {self.window_tokens}")
        _require(0 < self.reply_tokens < self.window_tokens,
                 f"context.reply_tokens must be in (0, window_tokens), got {self.reply_tokens}")
        _require(self.keep_turns >= 1, f"context.keep_turns must be >= 1, got {self.keep_turns}")


@dataclass(frozen=True)
class AgentConfig:
    """Budgets and behaviour of one episode."""

    max_turns: int = 150
    """Assistant turns before the episode ends (paper: 150 in training, 200 in evaluation)."""
    max_episode_tokens: int = 0
    """Prompt plus completion tokens over the whole episode (what an API bills); 0: no limit."""
    wall_clock_s: float = 7200.0
    """Wall-clock limit of one episode, final scoring excluded."""
    max_idle_replies: int = 3
    """Consecutive replies without a tool call before the episode ends (the model is reminded
    to call a tool after each)."""
    tools: ToolConfig = field(default_factory=ToolConfig)
    context: ContextConfig = field(default_factory=ContextConfig)
    work_root: Path | None = None
    """Where episode directories are created (default: the system temp dir)."""
    keep_workdir: bool = False
    """Keep each episode's directory after it ends (for inspection), instead of removing it."""
    workdir_style: str = "default"
    """``default``: cuda-agent's workdir (``./build``, ``./verify``, ``./profile``, our SKILL.md and
    tool set). ``paper``: the CUDA Agent paper's released workdir (``binding.cpp``,
    ``binding_registry.h``, ``utils/compile.sh``, ``utils/verification.py``, ``utils/profiling.py``,
    the SKILL.md at ``skill_path``) and its tool set (adds multi_edit and background shells). Both
    are judged by the same trusted evaluator (docs/agent.md)."""
    skill_path: Path | None = None
    """SKILL.md to give the agent instead of the packaged one; required for ``workdir_style: paper``
    (the released SKILL.md: cuda-agent ships none of its text)."""

    def __post_init__(self) -> None:
        _require(self.max_turns >= 1, f"agent.max_turns must be >= 1, got {self.max_turns}")
        _require(self.max_episode_tokens >= 0, f"agent.max_episode_tokens must be >= 0, got {self.max_episode_tokens}")
        _require(self.wall_clock_s > 0, f"agent.wall_clock_s must be > 0, got {self.wall_clock_s}")
        _require(self.max_idle_replies >= 1, f"agent.max_idle_replies must be >= 1, got {self.max_idle_replies}")
        if self.work_root is not None:
            object.__setattr__(self, "work_root", Path(self.work_root))
        _require(self.workdir_style in ("default", "paper"),
                 f"agent.workdir_style must be 'default' or 'paper', got {self.workdir_style!r}")
        if self.skill_path is not None:
            object.__setattr__(self, "skill_path", Path(self.skill_path))
            _require(self.skill_path.is_file(), f"agent.skill_path: {self.skill_path} is not a file")
        _require(self.workdir_style != "paper" or self.skill_path is not None,
                 "agent.workdir_style 'paper' needs agent.skill_path: the released SKILL.md (e.g. "
                 "agent_workdir/SKILL.md of BytedTsinghua-SIA/CUDA-Agent); cuda-agent does not ship its text")

    def skill_text(self) -> str | None:
        """The SKILL.md text from ``skill_path`` (None: the packaged one)."""
        return None if self.skill_path is None else self.skill_path.read_text(encoding="utf-8")

    @classmethod
    def from_dict(cls, data: dict[str, Any], origin: str = "agent") -> AgentConfig:
        """Build from a parsed YAML section; unknown keys are an error naming the valid ones."""
        sections = {"tools": ToolConfig, "context": ContextConfig}
        kwargs: dict[str, Any] = {}
        valid = {f.name for f in dataclasses.fields(cls)}
        for key, value in data.items():
            _require(key in valid, f"{origin}: unknown key {key!r}; valid: {sorted(valid)}")
            if key in sections:
                _require(isinstance(value, dict), f"{origin}.{key} must be a mapping")
                known = {f.name for f in dataclasses.fields(sections[key])}
                bad = set(value) - known
                _require(not bad, f"{origin}.{key}: unknown keys {sorted(bad)}; valid: {sorted(known)}")
                kwargs[key] = sections[key](**value)
            else:
                kwargs[key] = value
        try:
            return cls(**kwargs)
        except TypeError as exc:
            raise AgentConfigError(f"{origin}: {exc}") from None

    def replace(self, **changes: Any) -> AgentConfig:
        return dataclasses.replace(self, **changes)
