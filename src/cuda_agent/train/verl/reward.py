"""``compute_score`` for verl's reward manager: a single-turn (warm-up) response scored by the
trusted evaluator as a complete solution file.

Point verl at it with ``reward.custom_reward_function.path`` (this file) and ``name:
compute_score``; ``reward_kwargs`` pass the ``cuda_agent`` section's ``device``, ``evaluation``
and ``pool`` (see :mod:`.settings`). Each reward worker process opens one evaluation pool (a
local GPU pool, a Ray pool, or a ``cuda-agent serve`` service) and keeps it; scoring is
asynchronous, so a worker has many responses in evaluation at once. Rows of the multi-turn
``cuda_agent`` agent loop carry their reward already and never reach this function.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from cuda_agent.pool import PoolConfig, open_pool
from cuda_agent.train.rewards import PoolScorer
from cuda_agent.train.verl.data import task_from_row
from cuda_agent.train.verl.settings import VerlSettings, plain

_lock = threading.Lock()
_scorers: dict[str, PoolScorer] = {}


def _scorer(device: str, evaluation: dict[str, Any], pool: dict[str, Any] | None) -> PoolScorer:
    key = json.dumps([device, evaluation, pool], sort_keys=True, default=str)
    with _lock:
        if key not in _scorers:
            settings = VerlSettings.from_section({"device": device, "evaluation": evaluation, "pool": pool})
            _scorers[key] = PoolScorer(open_pool(settings.evaluation, settings.pool or PoolConfig()))
        return _scorers[key]


def close_pools() -> None:
    """Close the pools this process opened for scoring (they otherwise live as long as the process)."""
    with _lock:
        for scorer in _scorers.values():
            scorer.pool.close()
        _scorers.clear()


async def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None,
                        device: str = "cuda", evaluation: Any = None, pool: Any = None, **_: Any) -> dict[str, Any]:
    """verl's reward function contract: the score, and details verl logs beside it.

    Returns:
        ``{"score": reward, "status": ..., "harness_error": 0|1}``; the reward is the milestone
        reward (-1, 1, 2, 3); a response without a solution is -1 at once; a harness failure
        (no verdict) is -1 with ``harness_error`` 1.
    """
    task = task_from_row(extra_info)
    scorer = _scorer(device, plain(evaluation or {}), plain(pool) if pool else None)
    score = await asyncio.wrap_future(scorer.submit(task, solution_str))
    return {"score": -1.0 if score.reward is None else score.reward, "status": score.detail,
            "harness_error": int(score.reward is None)}
