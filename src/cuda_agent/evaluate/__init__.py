"""Benchmark evaluation: KernelBench-style metrics over a task set, a resumable results store, and
HTML/Markdown reports (``cuda-agent eval``, ``cuda-agent report``; docs/evaluate.md).

Public API::

    from cuda_agent.evaluate import benchmark_metrics, load_task_set, match_solutions
"""

from cuda_agent.evaluate.metrics import (
    FAST_P_THRESHOLDS, GroupMetrics, SpeedupMetrics, TaskOutcome, benchmark_metrics, fast_p, geometric_mean,
    group_metrics,
)
from cuda_agent.evaluate.store import ResultRecord, ResultsStore, StoreError
from cuda_agent.evaluate.tasks import EvalTask, SolutionMatch, TaskSetError, load_task_set, match_solutions

__all__ = [
    "FAST_P_THRESHOLDS", "GroupMetrics", "SpeedupMetrics", "TaskOutcome", "benchmark_metrics", "fast_p",
    "geometric_mean", "group_metrics", "ResultRecord", "ResultsStore", "StoreError", "EvalTask", "SolutionMatch",
    "TaskSetError", "load_task_set", "match_solutions",
]
