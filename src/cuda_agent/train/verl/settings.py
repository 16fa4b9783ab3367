"""The ``cuda_agent`` section of a verl configuration: how episodes run and where candidates are
evaluated, shared by the agent loop and the reward function::

    cuda_agent:
      device: cuda                 # where candidates run
      evaluation_slots: 1          # evaluations at once per agent-loop worker (in-process mode)
      agent: {max_turns: 150}      # AgentConfig (docs/agent.md)
      evaluation: {timing: {budget_s: 10}}   # the evaluator's other sections (docs/environment.md)
      pool: {backend: service, address: "http://eval-host:8000"}   # optional; else in-process

Without ``pool`` the trusted evaluator runs in the worker's own process on its local GPU; with a
pool (``service``: a ``cuda-agent serve``, token from ``$CUDA_AGENT_SERVE_TOKEN``; ``ray``; or
``local``) every verify, profile and final scoring goes there.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from cuda_agent.agent.config import AgentConfig
from cuda_agent.environment import EvalConfig
from cuda_agent.pool import PoolConfig

SERVE_TOKEN_ENV = "CUDA_AGENT_SERVE_TOKEN"


def plain(value: Any) -> Any:
    """An OmegaConf node (or anything mapping-like) as plain dicts and lists."""
    if hasattr(value, "items"):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig":
        return [plain(v) for v in value]
    return value


@dataclass(frozen=True)
class VerlSettings:
    agent: AgentConfig
    evaluation: EvalConfig
    evaluation_slots: int
    pool: PoolConfig | None

    @classmethod
    def from_section(cls, section: Any) -> VerlSettings:
        """Raises:
            ValueError: an unknown key or invalid value, naming ``cuda_agent.<key>``.
        """
        data = plain(section or {})
        known = {"device", "evaluation_slots", "agent", "evaluation", "pool"}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"cuda_agent: unknown keys {sorted(unknown)}; valid: {sorted(known)}")
        evaluation = {"device": data.get("device", "cuda"), **(data.get("evaluation") or {})}
        try:
            eval_config = EvalConfig.from_dict(evaluation)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"cuda_agent.evaluation: {exc}") from None
        slots = int(data.get("evaluation_slots", 1))
        if slots < 1:
            raise ValueError(f"cuda_agent.evaluation_slots must be >= 1, got {slots}")
        return cls(AgentConfig.from_dict(data.get("agent") or {}, "cuda_agent.agent"), eval_config, slots,
                   pool_config(data.get("pool")))


def pool_config(data: dict[str, Any] | None) -> PoolConfig | None:
    """A ``PoolConfig`` from a mapping (the service token defaults to ``$CUDA_AGENT_SERVE_TOKEN``)."""
    if not data:
        return None
    valid = {f.name for f in dataclasses.fields(PoolConfig)}
    unknown = set(data) - valid
    if unknown:
        raise ValueError(f"cuda_agent.pool: unknown keys {sorted(unknown)}; valid: {sorted(valid)}")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
    if values.get("backend") == "service" and not values.get("token"):
        values["token"] = os.environ.get(SERVE_TOKEN_ENV)
    return PoolConfig(**values)
