"""Policy backends, by name: ``openai`` (any OpenAI-compatible endpoint), ``hf`` (a local
transformers model) and ``replay`` (recorded turns). Each is imported only when it is made."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from cuda_agent.agent.base import Policy
from cuda_agent.registry import Registry


@dataclass(frozen=True)
class PolicySpec:
    """What the command line or a config file says about the policy to use."""

    name: str
    model: str | None = None
    """``openai``: the model name; ``hf``: the model folder."""
    base_url: str | None = None
    """``openai``: the endpoint (else ``CUDA_AGENT_LLM_BASE_URL`` / ``OPENAI_BASE_URL``)."""
    api_key: str | None = field(default=None, repr=False)
    replay: Path | None = None
    """``replay``: a trajectory JSONL or a replay script."""
    tool_protocol: str = "native"
    """``openai``: ``native`` tool calls or the ``text`` protocol."""
    settings: dict[str, Any] = field(default_factory=dict)
    """More fields of the backend's config (``LLMConfig`` or ``HFConfig``), e.g. from YAML."""


def _openai(spec: PolicySpec) -> Policy:
    from cuda_agent.agent.policies.openai_policy import OpenAIPolicy
    from cuda_agent.llm import LLMConfig

    config = LLMConfig.from_mapping(spec.settings, "policy settings", base_url=spec.base_url, model=spec.model,
                                    api_key=spec.api_key)
    return OpenAIPolicy(config, spec.tool_protocol)


def _hf(spec: PolicySpec) -> Policy:
    import dataclasses

    from cuda_agent.agent.policies.hf_policy import HFConfig, HFPolicy

    if not spec.model:
        raise ValueError("the hf policy needs --model: a local transformers model folder")
    valid = {f.name for f in dataclasses.fields(HFConfig)} - {"model_path"}
    unknown = set(spec.settings) - valid
    if unknown:
        raise ValueError(f"policy settings: unknown hf keys {sorted(unknown)}; valid: {sorted(valid)}")
    return HFPolicy(HFConfig(model_path=Path(spec.model), **spec.settings))


def _replay(spec: PolicySpec) -> Policy:
    from cuda_agent.agent.policies.replay_policy import ReplayPolicy

    if spec.replay is None:
        raise ValueError("the replay policy needs --replay: a trajectory .jsonl or a replay script .json")
    return ReplayPolicy.from_path(spec.replay)


POLICIES: Registry[Callable[[PolicySpec], Policy]] = Registry("policy")
POLICIES.register("openai", _openai)
POLICIES.register("hf", _hf)
POLICIES.register("replay", _replay)


def make_policy(spec: PolicySpec) -> Policy:
    """Build the policy ``spec.name`` names.

    Raises:
        KeyError: unknown name (listing the valid ones).
        ValueError, TrajectoryError, PolicyError, LLMError: a setting is missing or invalid.
    """
    return POLICIES.get(spec.name)(spec)
