"""Models: LoRA trains only the adapters (of the last blocks when asked) and saves them alone and
merged, critics round-trip through their folder, and the KL reference is the starting policy."""

from __future__ import annotations

import torch

from cuda_agent.agent.policies.hf_policy import HFConfig, HFPolicy
from cuda_agent.train.config import LoRAConfig, ModelConfig, OptimConfig, PPOAlgorithmConfig
from cuda_agent.train.models import ModelSet
from cuda_agent.train.ppo import PPOLearner, ScoredBatch
from cuda_agent.train.sequences import TokenRow
from cuda_agent.train.sft import SFTLearner

ROWS = [TokenRow(0, (5, 6, 7, 8, 9, 10), (0, 0, 1, 1, 0, 1)), TokenRow(1, (5, 6, 11, 12), (0, 0, 1, 1))]


def test_lora_trains_only_adapters_and_saves_them_alone_and_merged(keypad_model, tmp_path):
    models = ModelSet(ModelConfig(device="cpu", lora=LoRAConfig(rank=4, target_modules=("q_proj", "v_proj"))),
                      keypad_model)
    trainable = [name for name, p in models.actor.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    frozen_before = {n: p.clone() for n, p in models.actor.named_parameters() if not p.requires_grad}
    learner = SFTLearner(models, OptimConfig(lr=1e-2), total_steps=3, micro_batch_tokens=4096)
    for _ in range(3):
        learner.step(ROWS)
    assert all(torch.equal(p, frozen_before[n]) for n, p in models.actor.named_parameters() if not p.requires_grad)
    with torch.no_grad():
        ids = torch.tensor([ROWS[0].ids])
        tuned = models.actor(input_ids=ids).logits
        with models.reference_policy() as reference:
            base = reference(input_ids=ids).logits
    assert not torch.allclose(tuned, base)  # the adapters changed the policy; disabling them gives the base
    models.save_actor(tmp_path / "actor", tmp_path / "adapter")
    merged = ModelSet(ModelConfig(device="cpu"), tmp_path / "actor")
    adapted = HFPolicy(HFConfig(model_path=keypad_model, adapter_path=tmp_path / "adapter"))
    with torch.no_grad():
        assert torch.allclose(merged.actor(input_ids=ids).logits, tuned, atol=1e-4)
        assert torch.allclose(adapted.model(input_ids=ids).logits, tuned, atol=1e-4)


def test_lora_last_layers_adapts_only_the_last_blocks(keypad_model):
    models = ModelSet(ModelConfig(device="cpu", lora=LoRAConfig(rank=4, last_layers=1)), keypad_model)
    adapted = {name.split(".layers.")[1].split(".")[0] for name, p in models.actor.named_parameters()
               if p.requires_grad}
    assert adapted == {str(models.actor.config.num_hidden_layers - 1)}


def test_critics_round_trip_through_their_folders(keypad_model, tmp_path):
    for kind in ("separate", "shared"):
        models = ModelSet(ModelConfig(device="cpu", critic=kind), keypad_model, keypad_model)
        assert models.critic.shared == (kind == "shared")
        with torch.no_grad():
            models.critic.head.linear.bias.fill_(0.5)
        models.save_critic(tmp_path / kind)
        again = ModelSet(ModelConfig(device="cpu"), keypad_model, tmp_path / kind)  # the folder says its kind
        assert again.critic.shared == (kind == "shared")
        assert float(again.critic.head.linear.bias.detach()) == 0.5


def test_kl_penalty_to_the_starting_policy_is_zero_before_the_first_update(keypad_model):
    models = ModelSet(ModelConfig(device="cpu", critic="shared"), keypad_model, keypad_model, reference=True)
    one_step = PPOAlgorithmConfig(kl_coef=0.1, epochs=1, minibatches=1)  # the first update's stats precede any step
    learner = PPOLearner(models, one_step, OptimConfig(lr=1e-2), OptimConfig(lr=1e-2), updates=2, temperature=1.0)
    first = learner.update(learner.estimate(learner.score(ROWS), [1.0, -1.0]))
    assert abs(first["actor/kl_to_reference"]) < 1e-6 and abs(first["actor/approx_kl"]) < 1e-6
    second = learner.update(learner.estimate(learner.score(ROWS), [1.0, -1.0]))
    assert second["actor/kl_to_reference"] > 0  # the actor moved away from its frozen copy


def test_outcome_value_gap_compares_the_critics_last_value_of_passing_and_failing_episodes():
    # Episode 0 (passed) has two rows: its last policy token is in the second; episode 1 failed;
    # episode 2 reached no verdict and is left out.
    rows = [TokenRow(0, (1, 2, 3), (0, 1, 0)), TokenRow(0, (1, 2, 3, 4), (0, 0, 1, 1)),
            TokenRow(1, (1, 2, 3), (0, 1, 1)), TokenRow(2, (1, 2), (0, 1))]
    values = [torch.tensor([9.0, 9.0]), torch.tensor([9.0, 0.5, 2.0]), torch.tensor([0.0, -1.0]), torch.tensor([7.0])]
    batch = ScoredBatch(rows, [None] * 4, [None] * 4, values, [], [])
    assert batch.outcome_value_gap([1.0, -1.0, None]) == 3.0
    assert batch.outcome_value_gap([1.0, 3.0, None]) is None
