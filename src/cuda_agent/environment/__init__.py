"""The evaluation environment: build, verify, profile and reward a candidate kernel.

Public API::

    from cuda_agent.environment import EvalConfig, evaluate, load_task
    verdict = evaluate(load_task("examples/tasks/relu.py"), "examples/solutions/cpu/relu.py",
                       EvalConfig(device="cpu"))
"""

from cuda_agent.environment.config import (
    BuildConfig, ConfigError, EvalConfig, LimitsConfig, SandboxConfig, TimingConfig, VerifyConfig,
)
from cuda_agent.environment.evaluator import evaluate
from cuda_agent.environment.precision import POLICIES
from cuda_agent.environment.slots import Prestarter
from cuda_agent.environment.solution import Solution, SolutionError, load_solution
from cuda_agent.environment.task import Task, TaskLoadError, TaskLoadResult, load_task, load_tasks
from cuda_agent.environment.verdict import Status, TimingStats, TrialResult, Verdict, Violation

__all__ = [
    "BuildConfig", "ConfigError", "EvalConfig", "LimitsConfig", "SandboxConfig", "TimingConfig", "VerifyConfig", "evaluate", "POLICIES",
    "Prestarter",
    "Solution", "SolutionError", "load_solution", "Task", "TaskLoadError", "TaskLoadResult", "load_task", "load_tasks",
    "Status", "TimingStats", "TrialResult", "Verdict", "Violation",
]
