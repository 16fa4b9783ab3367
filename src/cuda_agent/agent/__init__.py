"""The agent: a ReAct loop with coding tools in a sandboxed workdir, guided by SKILL.md, scored by
the trusted evaluator (docs/agent.md).

    from cuda_agent.agent import AgentConfig, EvaluationQueue, PolicySpec, make_policy, run_episode
"""

from cuda_agent.agent.base import Policy, PolicyError, PolicyReply, Tool, ToolError, ToolResult
from cuda_agent.agent.config import AgentConfig, AgentConfigError, ContextConfig, ToolConfig
from cuda_agent.agent.evaluation import EvaluationQueue, EvaluationRecord
from cuda_agent.agent.loop import run_episode
from cuda_agent.agent.policies import POLICIES, PolicySpec, make_policy
from cuda_agent.agent.runner import RunnerConfig, RunSummary, run_episodes
from cuda_agent.agent.trajectory import Trajectory, TrajectoryError, append_trajectory, read_trajectories

__all__ = [
    "Policy", "PolicyError", "PolicyReply", "Tool", "ToolError", "ToolResult", "AgentConfig", "AgentConfigError",
    "ContextConfig", "ToolConfig", "EvaluationQueue", "EvaluationRecord", "run_episode", "POLICIES", "PolicySpec",
    "make_policy", "RunnerConfig", "RunSummary", "run_episodes", "Trajectory", "TrajectoryError",
    "append_trajectory", "read_trajectories",
]
