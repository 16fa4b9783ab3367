"""GPU checks of the trainer (the full validation is ``bench/train_gpu_validation.py``): agentic PPO
in bf16 mixed precision on the GPU, warm-up rewards from the CUDA evaluator through a GPU pool,
and a warm-up step on real synth tasks.

Run: ``python -m pytest -q -s -m gpu tests/gpu/test_train_gpu.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cuda_agent.agent.config import AgentConfig
from cuda_agent.agent.text_protocol import tool_instructions
from cuda_agent.environment import load_task
from cuda_agent.pool import PoolConfig
from cuda_agent.train.config import TrainConfig
from cuda_agent.train.environments.cuda import CudaEnvironment
from cuda_agent.train.environments.keypad import SYSTEM_PROMPT, PressTool
from cuda_agent.train.init_model import default_corpus, init_random_model
from cuda_agent.train.metrics import read_metrics
from cuda_agent.train.stages import StageContext, run_stage

from support import EXAMPLES

pytestmark = pytest.mark.gpu
SAMPLE = EXAMPLES / "data" / "synth-h100-sample" / "tasks.parquet"


def test_keypad_ppo_runs_in_bf16_mixed_precision_on_the_gpu(tmp_path):
    init_random_model(tmp_path / "model", "tiny", [SYSTEM_PROMPT, tool_instructions([PressTool.schema()])] * 10)
    config = TrainConfig.from_dict({
        "environment": {"name": "keypad"},
        "model": {"path": str(tmp_path / "model"), "critic": "separate", "precision": "bf16-mixed", "device": "cuda"},
        "ppo": {"steps": 2, "rollout": {"tasks_per_step": 4, "samples_per_task": 2, "max_new_tokens": 16}}})
    result = run_stage("ppo", StageContext(config, tmp_path / "ppo"))
    assert result.completed
    rows = read_metrics(tmp_path / "ppo")
    assert len(rows) == 2 and all(row["gpu/peak_memory_gb"] > 0 for row in rows)
    assert all(row["update/tokens_per_s"] > 0 and row["rollout/tokens_per_s"] > 0 for row in rows)
    from safetensors.torch import load_file

    weights = load_file(next((tmp_path / "ppo" / "actor").glob("*.safetensors")))
    assert all(t.dtype == torch.float32 for t in weights.values())  # float32 master weights under autocast


def test_warmup_rewards_come_from_the_cuda_evaluator_on_a_gpu_pool(make_cuda_config):
    relu = load_task(EXAMPLES / "tasks" / "relu.py")
    solution = (EXAMPLES / "solutions" / "cuda" / "relu.py").read_text()
    environment = CudaEnvironment([relu], make_cuda_config(), AgentConfig(), PoolConfig(), evaluation_slots=1)
    try:
        good, empty = environment.score_responses([(relu, f"```python\n{solution}```"), (relu, "no idea")])
        assert good.result(timeout=900).reward >= 1.0 and empty.result().reward == -1.0
    finally:
        environment.close()


def test_warmup_step_on_synth_sample_tasks(tmp_path, session_cache_dir: Path):
    from cuda_agent.environment import load_tasks

    sources = [r.task.code for r in load_tasks(SAMPLE)[:20] if r.task is not None]
    init_random_model(tmp_path / "model", "small", default_corpus(sources))
    config = TrainConfig.from_dict({
        "environment": {"name": "cuda", "tasks": str(SAMPLE), "task_limit": 4},
        "model": {"path": str(tmp_path / "model"), "precision": "bf16-mixed"},
        "device": "cuda", "cache_dir": str(session_cache_dir),
        "warmup": {"steps": 1, "rollout": {"tasks_per_step": 2, "samples_per_task": 2, "max_new_tokens": 256}}})
    result = run_stage("warmup", StageContext(config, tmp_path / "warmup"))
    assert result.completed
    row = read_metrics(tmp_path / "warmup")[0]
    assert row["episodes"] == 4 and row["rollout/generated_tokens"] > 0 and row["gpu/peak_memory_gb"] > 0
