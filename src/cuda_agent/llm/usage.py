"""Per-request JSONL usage log (tokens, latency, cost) with running totals, shared by threads."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from cuda_agent.llm.config import LLMConfig


@dataclass
class UsageTotals:
    """Running totals over every HTTP request a :class:`UsageLog` has seen."""

    requests: int = 0
    failed_requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    latency_s: float = 0.0


class UsageLog:
    """Per-request JSONL log plus running totals; safe to share between threads."""

    def __init__(self, path: str | Path | None = None, usd_per_mtok_prompt: float = 0.0,
                 usd_per_mtok_completion: float = 0.0) -> None:
        self.path = None if path is None else Path(path)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._prices = (usd_per_mtok_prompt, usd_per_mtok_completion)
        self._totals = UsageTotals()
        self._lock = threading.Lock()

    @classmethod
    def for_config(cls, config: LLMConfig) -> UsageLog:
        return cls(config.usage_log, config.usd_per_mtok_prompt, config.usd_per_mtok_completion)

    def record(self, *, model: str, seed: int | None, attempt: int, status: str, latency_s: float,
               prompt_tokens: int = 0, completion_tokens: int = 0, error: str = "", tag: str = "") -> None:
        """Count one HTTP request and append its line.

        Args:
            seed: the sampling seed sent with the request (``None``: none sent).
            attempt: 1 for the first try of a request, 2.. for its retries.
            status: ``ok``, ``http_<code>``, ``timeout``, ``connection_error`` or ``bad_response``.
            latency_s: seconds from sending the request to the reply or the failure.
            tag: who asked (an episode id), to group lines.
        """
        cost = (prompt_tokens * self._prices[0] + completion_tokens * self._prices[1]) / 1e6
        line = {"timestamp": datetime.now(timezone.utc).isoformat(), "model": model, "seed": seed, "tag": tag,
                "attempt": attempt, "status": status, "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens,
                "latency_s": latency_s, "cost_usd": cost, "error": error}
        with self._lock:
            totals = self._totals
            totals.requests += 1
            totals.failed_requests += status != "ok"
            totals.prompt_tokens += prompt_tokens
            totals.completion_tokens += completion_tokens
            totals.cost_usd += cost
            totals.latency_s += latency_s
            if self.path is not None:
                with self.path.open("a") as log:
                    log.write(json.dumps(line) + "\n")

    @property
    def totals(self) -> UsageTotals:
        with self._lock:
            return replace(self._totals)
