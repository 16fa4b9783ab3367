"""Warm-up rewards from the trusted evaluator: responses become single-file solutions scored on a
real (CPU) evaluation pool, all submitted at once; a reply without a solution is -1 at once."""

from __future__ import annotations

import time

from cuda_agent.agent.config import AgentConfig
from cuda_agent.environment import load_task
from cuda_agent.pool import PoolConfig
from cuda_agent.train.environments.cuda import CudaEnvironment
from cuda_agent.train.rewards import extract_solution

from support import EXAMPLES


def test_extract_solution_takes_the_last_block_defining_model_new():
    text = "Plan.\n```python\nx = 1\n```\nfinal:\n```python\nclass ModelNew:\n    pass\n```\nbye"
    assert extract_solution(text) == "class ModelNew:\n    pass\n"
    assert extract_solution("class ModelNew(nn.Module): ...") == "class ModelNew(nn.Module): ...\n"
    assert extract_solution("```python\nclass ModelNew:\n    pass") == "class ModelNew:\n    pass\n"  # cut at max tokens
    assert extract_solution("no code at all") is None


def test_responses_are_scored_by_the_evaluator_on_a_pool(make_config, tmp_path):
    relu = load_task(EXAMPLES / "tasks" / "relu.py")
    solution = (EXAMPLES / "solutions" / "cpu" / "relu.py").read_text()
    environment = CudaEnvironment([relu], make_config(), AgentConfig(), PoolConfig(workers=1), evaluation_slots=1)
    try:
        assert "model.py:" in environment.single_turn_prompt(relu)[0]["content"]
        started = time.monotonic()
        futures = environment.score_responses([
            (relu, f"Here is my kernel.\n```python\n{solution}```"),
            (relu, "I am not sure how to do this."),
            (relu, "```python\nclass ModelNew(nn.Module:\n```"),
        ])
        assert time.monotonic() - started < 5  # submitted, not waited for
        assert futures[1].done() and futures[1].result().reward == -1.0
        scores = [future.result(timeout=600) for future in futures]
    finally:
        environment.close()
    assert scores[0].reward >= 1.0, scores[0]
    assert scores[2].reward == -1.0 and scores[2].reward is not None
