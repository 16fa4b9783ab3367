"""The four stages by name, and ``all``, which chains them: warm-up -> RFT -> value pre-training
-> agentic PPO, each consuming the previous one's output folder."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from cuda_agent.registry import Registry
from cuda_agent.train.config import STAGES, TrainConfig
from cuda_agent.train.stages.common import StageContext, StageError, StageOutput, StageResult


def _warmup(context: StageContext) -> StageResult:
    from cuda_agent.train.stages.warmup import run_warmup

    return run_warmup(context)


def _rft(context: StageContext) -> StageResult:
    from cuda_agent.train.stages.rft import run_rft

    return run_rft(context)


def _value(context: StageContext) -> StageResult:
    from cuda_agent.train.stages.value import run_value

    return run_value(context)


def _ppo(context: StageContext) -> StageResult:
    from cuda_agent.train.stages.ppo import run_ppo

    return run_ppo(context)


STAGE_RUNNERS: Registry[Callable[[StageContext], StageResult]] = Registry("stage")
for _name, _runner in zip(STAGES, (_warmup, _rft, _value, _ppo)):
    STAGE_RUNNERS.register(_name, _runner)


def run_stage(name: str, context: StageContext) -> StageResult:
    """Run (or resume) stage ``name`` in ``context.out_dir``."""
    return STAGE_RUNNERS.get(name)(context)


def run_all(config: TrainConfig, out_dir: Path, on_step: Callable | None = None,
            deadline: float | None = None) -> list[StageResult]:
    """Run the stages in order in ``out_dir/<stage>``; completed ones are skipped, and a stage that
    stops early (the deadline) ends the chain (run again to resume)."""
    results: list[StageResult] = []
    previous: StageOutput | None = None
    for name in STAGES:
        context = StageContext(config, out_dir / name, previous, on_step, None, deadline)
        result = run_stage(name, context)
        results.append(result)
        if not result.completed:
            break
        previous = StageOutput.read(out_dir / name)
    return results


__all__ = ["STAGE_RUNNERS", "StageContext", "StageError", "StageOutput", "StageResult", "run_all", "run_stage"]
