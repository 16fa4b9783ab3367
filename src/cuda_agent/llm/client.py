"""Chat-completions requests through the official ``openai`` package, against any
OpenAI-compatible endpoint (hosted APIs, vLLM, SGLang), with our own retry loop.

The package's built-in retries are off (``max_retries=0``) so that every HTTP attempt, failed ones
included, is one line of the usage log, and so that backoff honours ``Retry-After`` up to a cap we
choose. HTTP 408/409/429/5xx, timeouts and dropped connections are retried; anything else (400,
401, a reply that is not a chat completion) fails at once with a message naming the URL and status.
``openai`` is imported when a client is created, never on the default import path.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from typing import Any

from cuda_agent.llm.config import ENV_API_KEY, LLMConfig
from cuda_agent.llm.usage import UsageLog

logger = logging.getLogger(__name__)

_RETRYABLE_HTTP = frozenset({408, 409, 429})


class LLMError(RuntimeError):
    """An LLM could not produce what was asked for."""


class LLMEndpointError(LLMError):
    """The endpoint refused the request, or kept failing after every retry."""


@dataclass(frozen=True)
class ToolCall:
    """One function call the model asked for; ``arguments`` is the JSON text it wrote."""

    id: str
    name: str
    arguments: str

    def to_message(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ChatReply:
    """The parts of a chat completion cuda-agent uses."""

    content: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    tool_calls: tuple[ToolCall, ...] = ()

    def to_message(self) -> dict[str, Any]:
        """The assistant message in chat-completions form (what goes back into the history)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [call.to_message() for call in self.tool_calls]
        return message


class _RequestFailed(Exception):
    """One HTTP request failed; ``status`` goes to the usage log, ``retryable`` decides what next."""

    def __init__(self, status: str, message: str, retryable: bool, retry_after_s: float = 0.0) -> None:
        super().__init__(message)
        self.status, self.retryable, self.retry_after_s = status, retryable, retry_after_s


class ChatClient:
    """Chat-completions requests with retries, backoff and usage logging; safe to share between
    threads (one connection pool)."""

    def __init__(self, config: LLMConfig, usage: UsageLog | None = None) -> None:
        try:
            import openai
        except ImportError:
            raise LLMError("llm: the 'openai' package is not installed; pip install openai") from None
        self.config = config
        self.usage = usage if usage is not None else UsageLog.for_config(config)
        self.url = config.base_url.rstrip("/") + "/chat/completions"
        self._openai = openai
        # An empty key sends no Authorization header at all (local servers need none).
        self._headers = {} if config.api_key else {"Authorization": openai.Omit()}
        self._client = openai.OpenAI(base_url=config.base_url, api_key=config.api_key or "unused",
                                     timeout=config.timeout_s, max_retries=0)

    def complete(self, messages: list[dict[str, Any]], seed: int | None = None,
                 tools: list[dict[str, Any]] | None = None, tag: str = "") -> ChatReply:
        """Send ``messages`` (and ``tools``, OpenAI function schemas, with ``tool_choice="auto"``);
        retry transient failures up to ``max_retries`` times.

        Raises:
            LLMEndpointError: a non-retryable status (e.g. 400, 401), a malformed reply, or the
                last retry failing; the message names the URL, the status and the attempts.
        """
        cfg = self.config
        for attempt in range(1, cfg.max_retries + 2):
            start = time.monotonic()
            try:
                reply = self._post(messages, seed, tools)
            except _RequestFailed as exc:
                self._log(seed, tag, attempt, exc.status, start, error=str(exc))
                if not exc.retryable:
                    raise LLMEndpointError(f"llm: {exc}") from None
                if attempt > cfg.max_retries:
                    raise LLMEndpointError(f"llm: {self.url} failed {attempt} times (max_retries="
                                           f"{cfg.max_retries}); last error: {exc}") from None
                delay = min(max(cfg.backoff_s * 2 ** (attempt - 1), exc.retry_after_s)
                            * (1 + 0.25 * random.random()), cfg.max_backoff_s)
                logger.info("llm: %s (attempt %d); retrying in %.2f s", exc, attempt, delay)
                time.sleep(delay)
            else:
                self._log(seed, tag, attempt, "ok", start, reply.prompt_tokens, reply.completion_tokens)
                return reply
        raise AssertionError("unreachable: the last attempt returns or raises")

    def close(self) -> None:
        self._client.close()

    def _log(self, seed: int | None, tag: str, attempt: int, status: str, start: float, prompt_tokens: int = 0,
             completion_tokens: int = 0, error: str = "") -> None:
        self.usage.record(model=self.config.model, seed=seed, attempt=attempt, status=status, tag=tag,
                          latency_s=time.monotonic() - start, prompt_tokens=prompt_tokens,
                          completion_tokens=completion_tokens, error=error)

    def _post(self, messages: list[dict[str, Any]], seed: int | None,
              tools: list[dict[str, Any]] | None) -> ChatReply:
        cfg, openai = self.config, self._openai
        extra: dict[str, Any] = {}
        if seed is not None:
            extra["seed"] = seed
        if tools:
            extra.update(tools=tools, tool_choice="auto")
        try:
            completion = self._client.chat.completions.create(
                model=cfg.model, messages=messages, temperature=cfg.temperature, max_tokens=cfg.max_tokens,
                extra_headers=self._headers, **extra)
        except openai.APITimeoutError:
            raise _RequestFailed("timeout", f"no reply from {self.url} within timeout_s={cfg.timeout_s}",
                                 retryable=True) from None
        except openai.APIConnectionError as exc:
            raise _RequestFailed("connection_error", f"cannot reach {self.url}: {exc.__cause__ or exc}",
                                 retryable=True) from None
        except openai.APIStatusError as exc:
            raise _http_failure(exc, self.url) from None
        except openai.APIError as exc:  # a 200 whose body is not JSON, or similar
            raise _RequestFailed("bad_response", f"{self.url} sent no chat completion: {exc}", retryable=False) from None
        return _parse_completion(completion, self.url)


def _http_failure(exc: Any, url: str) -> _RequestFailed:
    """Retryable for 408/409/429/5xx (honouring ``Retry-After``), final for the rest."""
    code = exc.status_code
    body = exc.body if isinstance(exc.body, dict) else {}
    detail = body.get("message") or (body.get("error") or {}).get("message") if body else None
    message = f"HTTP {code} from {url}: {detail or exc.message}"
    if code in (401, 403):
        message += f" (check the API key: argument or env {' / '.join(ENV_API_KEY)})"
    try:
        retry_after_s = float(exc.response.headers.get("Retry-After", 0))
    except (TypeError, ValueError):
        retry_after_s = 0.0
    return _RequestFailed(f"http_{code}", message, code in _RETRYABLE_HTTP or code >= 500, retry_after_s)


def _parse_completion(completion: Any, url: str) -> ChatReply:
    try:
        choice = completion.choices[0]
        usage = completion.usage
        calls = tuple(ToolCall(call.id, call.function.name, call.function.arguments or "")
                      for call in (choice.message.tool_calls or ()))
        return ChatReply(content=choice.message.content or "", finish_reason=choice.finish_reason or "",
                         prompt_tokens=int(usage.prompt_tokens) if usage else 0,
                         completion_tokens=int(usage.completion_tokens) if usage else 0, tool_calls=calls)
    except (AttributeError, IndexError, TypeError, ValueError) as exc:
        raise _RequestFailed("bad_response", f"{url} sent no chat completion (expected choices[0].message; "
                             f"{type(exc).__name__}: {exc}): {str(completion)[:200]}", retryable=False) from None
