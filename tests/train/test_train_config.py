"""Training configuration: strict loading with errors that name the field, and docs/train.md
documenting every field."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cuda_agent.train import config as train_config
from cuda_agent.train.config import TrainConfig, TrainConfigError

from support import REPO_ROOT


def test_yaml_sections_become_typed_frozen_configs():
    config = TrainConfig.from_dict({"model": {"path": "/m", "lora": {"rank": 8, "target_modules": ["q_proj"]}},
                                    "ppo": {"steps": 3, "algorithm": {"clip_high": 0.3}, "actor_optim": {"lr": 1}},
                                    "rft": {"trajectories": ["a.jsonl"]}, "device": "cpu", "agent": {"max_turns": 5}})
    assert config.model.path == Path("/m") and config.model.lora.target_modules == ("q_proj",)
    assert config.ppo.algorithm.clip_high == 0.3 and config.ppo.algorithm.clip_low == 0.2
    assert config.ppo.actor_optim.lr == 1.0 and isinstance(config.ppo.actor_optim.lr, float)
    assert config.rft.trajectories == (Path("a.jsonl"),)
    assert config.evaluation == {"device": "cpu"} and config.agent == {"max_turns": 5}
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.ppo.steps = 4


def test_paper_settings_are_the_defaults_and_the_clip_can_act():
    config = TrainConfig()
    algorithm = config.ppo.algorithm
    assert (algorithm.gamma, algorithm.lam, algorithm.clip_low, algorithm.clip_high) == (1.0, 0.95, 0.2, 0.28)
    assert (config.ppo.actor_optim.lr, config.ppo.critic_optim.lr) == (3e-6, 6e-6)
    assert config.rft.filter.min_reward == 1  # reward > 0
    assert algorithm.epochs * algorithm.minibatches > 1  # one update per batch would keep the ratio at 1


@pytest.mark.parametrize("data, message", [
    ({"ppo": {"rollout": {"temprature": 1}}}, "ppo.rollout: unknown keys ['temprature']"),
    ({"ppo": {"rollout": {"temperature": 0}}}, "ppo.rollout: temperature must be > 0"),
    ({"ppo": {"actor_optim": {"betas": [0.9]}}}, "ppo.actor_optim.betas: must have 2 items"),
    ({"ppo": {"actor_optim": {"schedule": "step"}}}, "schedule must be one of ('constant', 'linear', 'cosine')"),
    ({"model": {"precision": "fp8"}}, "precision must be one of"),
    ({"rft": {"sample": False}}, "nothing to train on"),
    ({"value": {"checkpoint": {"every_steps": 0}}}, "value.checkpoint: every_steps must be >= 1"),
    ({"environment": {"keypad": {"codes": ["x"]}}}, "codes must be single keys"),
    ({"warmup": []}, "config.warmup: must be a mapping"),
    ({"ppo": {"tensorboard": "yes"}}, "ppo.tensorboard: must be true or false"),
])
def test_invalid_values_name_the_field(data, message):
    with pytest.raises(TrainConfigError) as error:
        TrainConfig.from_dict(data)
    assert message in str(error.value)


def test_docs_document_every_field():
    text = (REPO_ROOT / "docs" / "train.md").read_text()
    classes = [getattr(train_config, name) for name in dir(train_config)
               if name.endswith("Config") and dataclasses.is_dataclass(getattr(train_config, name))]
    for cls in classes:
        if cls is TrainConfig:
            continue
        for field in dataclasses.fields(cls):
            assert f"| `{field.name}` |" in text, f"docs/train.md does not document {cls.__name__}.{field.name}"


def test_the_shipped_cpu_smoke_config_is_valid_and_cpu_only():
    import yaml

    from cuda_agent.train.environments import evaluation_settings

    config = TrainConfig.from_dict(yaml.safe_load((REPO_ROOT / "configs" / "train" / "cpu-smoke.yaml").read_text()),
                                   "cpu-smoke.yaml")
    evaluation_settings(config)
    assert config.evaluation["device"] == "cpu" and config.model.device == "cpu"
    assert config.rft.filter.min_reward == -1  # a random model earns -1: RFT must keep something
