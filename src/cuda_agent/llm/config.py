"""Where an LLM endpoint is and how to talk to it: one frozen, validated config."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

ENV_BASE_URL = ("CUDA_AGENT_LLM_BASE_URL", "OPENAI_BASE_URL")
ENV_MODEL = ("CUDA_AGENT_LLM_MODEL",)
ENV_API_KEY = ("CUDA_AGENT_LLM_API_KEY", "OPENAI_API_KEY")
"""Environment variables read by :meth:`LLMConfig.from_env`, first match wins."""


@dataclass(frozen=True)
class LLMConfig:
    """Endpoint, sampling and retry settings of an OpenAI-compatible chat-completions client."""

    base_url: str
    """Endpoint root, up to and including the API version: ``https://api.openai.com/v1``,
    ``http://localhost:8000/v1`` (vLLM, SGLang). ``/chat/completions`` is appended."""
    model: str
    """Model name sent in each request."""
    api_key: str = field(default="", repr=False)
    """Sent as ``Authorization: Bearer <key>``; empty sends no header (local servers)."""
    temperature: float = 0.7
    max_tokens: int = 4096
    """Completion budget per reply."""
    timeout_s: float = 120.0
    """Limit for connecting and for each read from the endpoint; a timeout is retried."""
    max_retries: int = 4
    """Retries of one request after HTTP 408/409/429/5xx, a timeout or a dropped connection."""
    max_repairs: int = 2
    """Synth composer only: times invalid code is sent back with the reason before giving up."""
    concurrency: int = 4
    """Requests in flight at once (composer threads; agent policy calls)."""
    backoff_s: float = 1.0
    """Wait before the first retry; doubled on each further retry (plus up to 25% jitter)."""
    max_backoff_s: float = 60.0
    """Cap on one wait, including a server's ``Retry-After``."""
    usage_log: Path | None = None
    """JSONL file that gets one line per HTTP request (appended); ``None`` keeps totals only."""
    usd_per_mtok_prompt: float = 0.0
    """Price of a million prompt tokens, for the ``cost_usd`` of each request and the totals."""
    usd_per_mtok_completion: float = 0.0
    """Price of a million completion tokens."""

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"llm: base_url is {self.base_url!r}; expected an http(s) URL such as "
                             f"http://localhost:8000/v1 (argument, or env {' / '.join(ENV_BASE_URL)})")
        if not self.model:
            raise ValueError(f"llm: model is empty; pass one or set {ENV_MODEL[0]}")
        if self.temperature < 0:
            raise ValueError(f"llm: temperature must be >= 0, got {self.temperature}")
        for name in ("max_tokens", "concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"llm: {name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_retries", "max_repairs", "backoff_s", "max_backoff_s",
                     "usd_per_mtok_prompt", "usd_per_mtok_completion"):
            if getattr(self, name) < 0:
                raise ValueError(f"llm: {name} must be >= 0, got {getattr(self, name)}")
        if self.timeout_s <= 0:
            raise ValueError(f"llm: timeout_s must be > 0, got {self.timeout_s}")
        if self.usage_log is not None:
            object.__setattr__(self, "usage_log", Path(self.usage_log))

    @classmethod
    def from_env(cls, base_url: str | None = None, model: str | None = None, api_key: str | None = None,
                 env: Mapping[str, str] | None = None, **settings: Any) -> LLMConfig:
        """Build a config from explicit values, falling back to the environment.

        Args:
            base_url, model, api_key: explicit values; ``None`` reads :data:`ENV_BASE_URL`,
                :data:`ENV_MODEL`, :data:`ENV_API_KEY` (first set variable wins).
            env: the environment to read (default ``os.environ``).
            settings: any other :class:`LLMConfig` field.

        Raises:
            ValueError: naming the missing setting and the variables that could provide it.
        """
        env = os.environ if env is None else env

        def pick(value: str | None, names: tuple[str, ...]) -> str:
            return value if value is not None else next((env[n] for n in names if env.get(n)), "")

        return cls(base_url=pick(base_url, ENV_BASE_URL).rstrip("/"), model=pick(model, ENV_MODEL),
                   api_key=pick(api_key, ENV_API_KEY), **settings)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], origin: str, **overrides: Any) -> LLMConfig:
        """Build from a parsed YAML section (``origin`` names it in errors); ``overrides`` that are
        not ``None`` win, and unset endpoint fields fall back to the environment.

        Raises:
            ValueError: unknown keys (listing the valid ones) or invalid values.
        """
        valid = {f.name for f in fields(cls)}
        unknown = set(data) - valid
        if unknown:
            raise ValueError(f"{origin}: unknown llm keys {sorted(unknown)}; valid: {sorted(valid)}")
        merged = {**data, **{k: v for k, v in overrides.items() if v is not None}}
        endpoint = {k: merged.pop(k, None) for k in ("base_url", "model", "api_key")}
        return cls.from_env(**endpoint, **merged)
