"""The ``hf`` policy with a tiny randomly initialised model built from a config (no download),
and the loss masks derived from its trajectory."""

from __future__ import annotations

import asyncio

import pytest

from cuda_agent.agent.config import AgentConfig, ContextConfig
from cuda_agent.agent.evaluation import EvaluationQueue
from cuda_agent.agent.loop import run_episode
from cuda_agent.agent.masks import token_masks
from cuda_agent.agent.base import PolicyError
from cuda_agent.agent.policies.hf_policy import HFConfig, HFPolicy, stop_token_ids
from cuda_agent.environment import load_task

from support import EXAMPLES

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A 2-layer Llama with a byte-level BPE tokenizer trained on a few lines, saved to a folder."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    corpus = [(EXAMPLES / "tasks" / "relu.py").read_text(), '<tool_call>{"name": "bash"}</tool_call>']
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                         max_position_embeddings=16384, eos_token_id=tokenizer.eos_token_id,
                                         pad_token_id=tokenizer.pad_token_id))
    path = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_hf_policy_runs_a_few_turns_and_records_token_ids(tiny_model, make_config, tmp_path):
    policy = HFPolicy(HFConfig(model_path=tiny_model, max_new_tokens=12, temperature=1.0, seed=0))
    config = AgentConfig(work_root=tmp_path, max_turns=3, max_idle_replies=3, context=ContextConfig(window_tokens=65536))

    async def episode():
        queue = EvaluationQueue(make_config(), 1)
        try:
            return await run_episode(load_task(EXAMPLES / "tasks" / "relu.py"), policy, config, queue)
        finally:
            queue.close()

    trajectory = asyncio.run(episode())
    assert trajectory.turns == 3 and trajectory.end_reason in ("idle", "max_turns")
    assert trajectory.policy["name"] == "hf" and trajectory.final["op"] == "final" and trajectory.reward == -1
    for step in trajectory.steps:
        message = trajectory.messages[step.message_index]
        assert 1 <= len(step.completion_token_ids) <= policy.config.max_new_tokens
        assert step.completion_tokens == len(step.completion_token_ids)
        assert message["content"] == policy.tokenizer.decode(step.completion_token_ids, skip_special_tokens=True)
        seen = trajectory.messages[: step.message_index]
        assert tuple(step.prompt_token_ids) == policy.prompt_ids(seen, trajectory.tools)
        assert step.prompt_tokens == len(step.prompt_token_ids)

    ids, mask = token_masks(trajectory.messages, trajectory.tools, policy.tokenizer)
    assert len(ids) == len(mask) and set(mask) == {0, 1}
    policy_text = policy.tokenizer.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=False)
    for step in trajectory.steps:
        assert trajectory.messages[step.message_index]["content"] + "<|im_end|>" in policy_text
    assert "SKILL" not in policy_text and "<tool_response" not in policy_text
    assert ids[: len(trajectory.steps[0].prompt_token_ids)] == trajectory.steps[0].prompt_token_ids
    assert mask[: len(trajectory.steps[0].prompt_token_ids)] == [0] * len(trajectory.steps[0].prompt_token_ids)


def test_hf_batched_generation_matches_one_at_a_time(tiny_model):
    policy = HFPolicy(HFConfig(model_path=tiny_model, max_new_tokens=8, temperature=0.0))
    prompts = [policy.prompt_ids([{"role": "user", "content": text}], []) for text in ("relu", "a longer prompt here")]
    batched = policy.generate_batch(prompts)
    single = [policy.generate_batch([p])[0] for p in prompts]
    assert [g.completion_ids for g in batched] == [g.completion_ids for g in single]
    assert [g.prompt_ids for g in batched] == prompts


def test_hf_policy_stops_on_every_end_of_turn_token_and_refuses_prompts_past_the_models_positions(tiny_model):
    policy = HFPolicy(HFConfig(model_path=tiny_model, max_new_tokens=8, temperature=0.0))
    prompt = policy.prompt_ids([{"role": "user", "content": "relu"}], [])
    (free,) = policy.generate_batch([prompt])
    own_stop = free.completion_ids[1]  # as if the model's generation config listed this token too
    policy.model.generation_config.eos_token_id = [policy.tokenizer.eos_token_id, own_stop]
    policy.stop_ids = stop_token_ids(policy.tokenizer, policy.model)
    assert policy.stop_ids == (policy.tokenizer.eos_token_id, own_stop)
    (stopped,) = policy.generate_batch([prompt])
    assert stopped.completion_ids == free.completion_ids[: free.completion_ids.index(own_stop) + 1]
    assert stopped.finish_reason == "stop"

    too_long = HFPolicy(HFConfig(model_path=tiny_model, max_new_tokens=16384), model=policy.model,
                        tokenizer=policy.tokenizer)
    with pytest.raises(PolicyError, match="exceeds the model's 16384 positions; set agent.context.window_tokens"):
        asyncio.run(too_long.act([{"role": "user", "content": "relu"}], [], "e"))
