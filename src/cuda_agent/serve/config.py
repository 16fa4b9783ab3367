"""Configuration of ``cuda-agent serve`` (the HTTP front; evaluation settings are an ``EvalConfig``
and pool settings a ``PoolConfig``, fixed when the service starts: clients cannot weaken them)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

JOBS_FILE = "jobs.sqlite"


class ServeConfigError(ValueError):
    """A service setting is invalid; the message names it and what is allowed."""


@dataclass(frozen=True)
class ServeConfig:
    state_dir: Path = Path("serve-state")
    """Holds the persistent job queue (``jobs.sqlite``): accepted jobs survive a restart."""
    token: str | None = None
    """Bearer token every request but ``/v1/health`` must carry; None only with ``allow_anonymous``."""
    allow_anonymous: bool = False
    """Accept requests without a token (for a trusted loopback or private network only)."""
    max_request_mb: float = 8.0
    """Largest request body; larger ones get 413."""
    max_batch: int = 1024
    """Most jobs in one batch request."""
    max_wait_s: float = 3600.0
    """Longest a synchronous request may wait for its verdict (its ``wait_s`` is capped to this)."""

    def __post_init__(self) -> None:
        if self.token is None and not self.allow_anonymous:
            raise ServeConfigError("the service needs a bearer token (--token-file or $CUDA_AGENT_SERVE_TOKEN), "
                                   "or --allow-anonymous on a trusted network")
        if self.token is not None and len(self.token) < 16:
            raise ServeConfigError(f"the bearer token must be at least 16 characters, got {len(self.token)}")
        if self.max_request_mb <= 0:
            raise ServeConfigError(f"max_request_mb must be > 0, got {self.max_request_mb}")
        if self.max_batch < 1:
            raise ServeConfigError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.max_wait_s <= 0:
            raise ServeConfigError(f"max_wait_s must be > 0, got {self.max_wait_s}")

    @property
    def max_request_bytes(self) -> int:
        return int(self.max_request_mb * 1024 * 1024)
