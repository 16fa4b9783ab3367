"""Checkpoints resume exactly: a run interrupted after step k and resumed ends with the same
weights and the same metrics as an uninterrupted one. A folder holding another configuration's run
is refused, and a completed stage is not run again."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from cuda_agent.train.metrics import read_metrics
from cuda_agent.train.stages import StageContext, StageError, run_stage

from keypad_support import keypad_config

# _share: of a step's wall time; generation_calls: how many turn requests met in the policy's batching window
_TIMINGS = ("seconds", "tokens_per_s", "step_s", "_share", "generation_calls")


def _metrics(folder):
    return [{k: v for k, v in row.items() if not any(t in k for t in _TIMINGS)} for row in read_metrics(folder)]


def _weights(folder):
    return {name: tensor for path in sorted(folder.glob("*.safetensors")) for name, tensor in load_file(path).items()}


def _assert_same_weights(left, right):
    a, b = _weights(left), _weights(right)
    assert a.keys() == b.keys() and a
    for name in a:
        assert torch.equal(a[name], b[name]), name


def _ppo_config(warm):
    return keypad_config(warm.actor, ppo={
        "steps": 4, "seed": 3, "rollout": {"tasks_per_step": 2, "samples_per_task": 2, "max_new_tokens": 8},
        "actor_optim": {"lr": 1e-3, "schedule": "linear"}, "critic_optim": {"lr": 1e-3},
        "checkpoint": {"every_steps": 1, "keep_last": 1}, "tensorboard": False})


def test_ppo_interrupted_and_resumed_matches_an_uninterrupted_run(warm_keypad, tmp_path):
    config = _ppo_config(warm_keypad)
    straight = run_stage("ppo", StageContext(config, tmp_path / "straight", previous=warm_keypad))
    assert straight.completed
    first = run_stage("ppo", StageContext(config, tmp_path / "resumed", previous=warm_keypad, until_step=2))
    assert (first.completed, first.step, first.stopped) == (False, 2, "until_step")
    assert (tmp_path / "resumed" / "checkpoints" / "step-000002").is_dir()
    second = run_stage("ppo", StageContext(config, tmp_path / "resumed", previous=warm_keypad))
    assert second.completed and second.summary["resumed_from"] == 2
    assert _metrics(tmp_path / "straight") == _metrics(tmp_path / "resumed")
    assert len(_metrics(tmp_path / "resumed")) == 4
    _assert_same_weights(tmp_path / "straight" / "actor", tmp_path / "resumed" / "actor")
    _assert_same_weights(tmp_path / "straight" / "critic", tmp_path / "resumed" / "critic")


def test_rft_interrupted_and_resumed_matches_an_uninterrupted_run(keypad_model, keypad_demos, tmp_path):
    config = keypad_config(keypad_model, rft={
        "sample": False, "trajectories": [str(keypad_demos)], "filter": {"min_reward": -1, "max_repeats": 4},
        "epochs": 1, "batch_size": 12, "optim": {"lr": 1e-2, "warmup_steps": 1, "schedule": "cosine"},
        "checkpoint": {"every_steps": 10}, "tensorboard": False})
    assert run_stage("rft", StageContext(config, tmp_path / "straight")).completed
    stopped = run_stage("rft", StageContext(config, tmp_path / "resumed", until_step=1))
    assert not stopped.completed and stopped.step == 1
    assert run_stage("rft", StageContext(config, tmp_path / "resumed")).completed
    assert _metrics(tmp_path / "straight") == _metrics(tmp_path / "resumed")
    _assert_same_weights(tmp_path / "straight" / "actor", tmp_path / "resumed" / "actor")


def test_a_folder_with_another_configuration_is_refused_and_a_completed_stage_is_kept(keypad_model, keypad_demos,
                                                                                     tmp_path):
    rft = {"sample": False, "trajectories": [str(keypad_demos)], "filter": {"min_reward": -1, "max_repeats": 4},
           "epochs": 1, "batch_size": 48, "tensorboard": False}
    config = keypad_config(keypad_model, rft=rft)
    assert run_stage("rft", StageContext(config, tmp_path / "rft")).completed
    again = run_stage("rft", StageContext(config, tmp_path / "rft"))
    assert again.already_done and again.completed
    changed = keypad_config(keypad_model, rft={**rft, "epochs": 2})
    with pytest.raises(StageError, match=r"other settings \(settings.stage.epochs\)"):
        run_stage("rft", StageContext(changed, tmp_path / "rft"))
