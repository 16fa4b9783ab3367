"""The verl adapter under verl's own interfaces: ``CudaAgentLoop`` registered from
``configs/verl/agent_loop.yaml`` and built the way verl's ``AgentLoopWorker`` builds agent loops
(``hydra.utils.instantiate`` with verl's ``DictConfigWrap``/``ToolListWrap``), generating through
a test double of verl's LLM server manager (vLLM cannot run here) that returns verl's
``TokenOutput``; the episode is a real cuda-agent episode on the CPU backend. Also
``compute_score`` and the example configs, composed with verl's Hydra config.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

pytest.importorskip("verl.experimental.agent_loop.agent_loop", reason="verl is not installed (the verl extra)")

import hydra  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.experimental.agent_loop import agent_loop as verl_agent_loop  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

from cuda_agent.agent.loop import initial_messages  # noqa: E402
from cuda_agent.agent.text_protocol import render_for_text_model  # noqa: E402
from cuda_agent.agent.tools import episode_tool_schemas  # noqa: E402
from cuda_agent.environment import Task, load_task  # noqa: E402
from cuda_agent.train.init_model import build_tokenizer, default_corpus  # noqa: E402
from cuda_agent.train.verl.data import rl_rows  # noqa: E402
from cuda_agent.train.verl.reward import close_pools, compute_score  # noqa: E402
from cuda_agent.train.verl.settings import VerlSettings  # noqa: E402

from support import EXAMPLES, REPO_ROOT  # noqa: E402

CONFIGS = REPO_ROOT / "configs" / "verl"
RELU_WORKDIR = EXAMPLES / "solutions" / "cpu_workdir" / "relu"


def _call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def relu_script() -> list[str]:
    """The replies of an agent that writes the CPU relu workdir solution, verifies it and finishes."""
    writes = [_call("write_file", path=str(p.relative_to(RELU_WORKDIR)), content=p.read_text())
              for p in sorted(RELU_WORKDIR.rglob("*")) if p.is_file() and "__pycache__" not in p.parts]
    return ["Writing a fused kernel.\n" + "\n".join(writes), "Check it.\n" + _call("bash", command="./verify"),
            "Done.\n" + _call("finish", summary="relu kernel")]


class ScriptedServer:
    """A test double of verl's ``LLMServerClient``: ``generate`` returns the next scripted reply as
    token ids (with the end-of-turn token) in a ``TokenOutput``, and records what it was asked."""

    def __init__(self, tokenizer, replies: list[str]) -> None:
        self.tokenizer, self.replies = tokenizer, list(replies)
        self.prompts: list[list[int]] = []
        self.generated: list[list[int]] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        assert sampling_params["temperature"] == 1.0
        self.prompts.append(list(prompt_ids))
        ids = self.tokenizer.encode(self.replies.pop(0), add_special_tokens=False) + [self.tokenizer.eos_token_id]
        self.generated.append(ids)
        return TokenOutput(token_ids=ids, log_probs=[-0.25] * len(ids), stop_reason="completed")


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(default_corpus([(EXAMPLES / "tasks" / "relu.py").read_text()]), 1024)


def _verl_config(tmp_path: Path, cache_dir: Path, response_length: int = 16384):
    return OmegaConf.create({
        "actor_rollout_ref": {"rollout": {"prompt_length": 8192, "response_length": response_length}},
        "data": {"apply_chat_template_kwargs": {}},
        "cuda_agent": {"device": "cpu", "evaluation_slots": 1,
                       "agent": {"max_turns": 6, "work_root": str(tmp_path)},
                       "evaluation": {"cache_dir": str(cache_dir), "timing": {"budget_s": 0.3, "min_samples": 3,
                                                                              "warmup_calls": 1,
                                                                              "compile_baseline": False}}}})


def _agent_loop(config, server, tokenizer):
    """Register from the config file and instantiate exactly as verl's AgentLoopWorker does."""
    for entry in OmegaConf.load(CONFIGS / "agent_loop.yaml"):
        verl_agent_loop._agent_loop_registry[entry.name] = entry
    return hydra.utils.instantiate(
        config=verl_agent_loop._agent_loop_registry["cuda_agent"],
        trainer_config=verl_agent_loop.DictConfigWrap(config=config), server_manager=server, tokenizer=tokenizer,
        processor=None, hf_model_type=None, dataset_cls=RLHFDataset,
        data_config=verl_agent_loop.DictConfigWrap(config.data), tools=verl_agent_loop.ToolListWrap([]))


def test_agent_loop_returns_the_episode_with_a_correct_response_mask_and_reward(tokenizer, tmp_path,
                                                                                  session_cache_dir):
    relu = load_task(EXAMPLES / "tasks" / "relu.py")
    row = rl_rows([relu], "cpu", "agent")[0]
    server = ScriptedServer(tokenizer, relu_script())

    async def episode():  # built inside the running event loop, as verl's AgentLoopWorker does
        loop = _agent_loop(_verl_config(tmp_path, session_cache_dir), server, tokenizer)
        return await loop.run({"temperature": 1.0, "top_p": 1.0}, **{k: v for k, v in row.items() if k != "agent_name"})

    output = asyncio.run(episode())
    assert isinstance(output, verl_agent_loop.AgentLoopOutput)

    # The prompt is the agent's first two messages under the chat template, as the policy renders them.
    tools = episode_tool_schemas()
    expected_prompt = tokenizer.apply_chat_template(render_for_text_model(initial_messages(relu, "cpu"), tools),
                                                    add_generation_prompt=True, tokenize=True)
    expected_prompt = list(expected_prompt["input_ids"] if hasattr(expected_prompt, "keys") else expected_prompt)
    assert output.prompt_ids == expected_prompt

    # Mask 1 exactly on the generated tokens, in order; every turn's prompt was the sequence so far.
    assert len(output.response_ids) == len(output.response_mask)
    generated = [t for t, m in zip(output.response_ids, output.response_mask) if m == 1]
    assert generated == [t for ids in server.generated for t in ids]
    full = output.prompt_ids + output.response_ids
    for prompt in server.prompts:
        assert full[: len(prompt)] == prompt
    tool_text = tokenizer.decode([t for t, m in zip(output.response_ids, output.response_mask) if m == 0])
    assert "<tool_response" in tool_text and "verify: PASSED" in tool_text
    assert "verify: PASSED" not in tokenizer.decode(generated)
    assert output.response_logprobs == [-0.25 if m else 0.0 for m in output.response_mask]

    # The reward is the trusted evaluator's verdict on the final workdir; verl's own conversion keeps it.
    assert output.reward_score >= 1.0
    assert output.extra_fields["cuda_agent"]["end_reason"] == "finish"
    converted = output.as_dict()
    assert float(converted["rm_scores"][-1]) == output.reward_score
    assert converted["response_mask"].sum().item() == len(generated)


def _run(task, script, tokenizer, config):
    row = rl_rows([task], "cpu", "agent")[0]
    server = ScriptedServer(tokenizer, script)

    async def episode():
        loop = _agent_loop(config, server, tokenizer)
        return await loop.run({"temperature": 1.0, "top_p": 1.0}, **{k: v for k, v in row.items() if k != "agent_name"})

    return asyncio.run(episode()), server


def test_an_episode_cut_after_tool_output_ends_on_its_last_generated_token_with_the_reward(tokenizer, tmp_path,
                                                                                          session_cache_dir):
    relu = load_task(EXAMPLES / "tasks" / "relu.py")
    script = relu_script()
    first_turn = len(tokenizer.encode(script[0], add_special_tokens=False)) + 1
    # Room for the first turn only: its tool output is merged, then the next turn finds no room left.
    output, server = _run(relu, script, tokenizer, _verl_config(tmp_path, session_cache_dir, first_turn + 8))
    assert len(server.generated) == 1 and output.extra_fields["cuda_agent"]["end_reason"] == "policy_error"
    assert output.response_ids == server.generated[0] and output.response_mask == [1] * first_turn
    assert output.reward_score >= 1.0  # the written solution, scored on the final workdir
    converted = output.as_dict()  # verl puts the reward on the last response token: a generated one
    assert converted["response_mask"][-1].item() == 1 and float(converted["rm_scores"][-1]) == output.reward_score
    assert output.extra_fields["reward_extra_info"] == {"cuda_agent_harness_error": 0}


def test_a_harness_failure_is_masked_out_with_no_reward(tokenizer, tmp_path, session_cache_dir):
    no_model = Task("no_model", "def get_inputs(): return []\ndef get_init_inputs(): return []\n", "<test>")
    output, _ = _run(no_model, relu_script(), tokenizer, _verl_config(tmp_path, session_cache_dir))
    assert output.extra_fields["cuda_agent"]["final"] == "final verdict task_error"  # the reference, not the policy
    assert output.response_ids and set(output.response_mask) == {0} and output.reward_score == 0.0
    assert output.extra_fields["reward_extra_info"] == {"cuda_agent_harness_error": 1}


def test_single_turn_loop_scores_the_reply_and_masks_out_a_harness_failure(tokenizer, tmp_path, session_cache_dir):
    solution = (EXAMPLES / "solutions" / "cpu" / "relu.py").read_text()
    relu = load_task(EXAMPLES / "tasks" / "relu.py")
    no_model = Task("no_model", "def get_inputs(): return []\ndef get_init_inputs(): return []\n", "<test>")
    config = _verl_config(tmp_path, session_cache_dir)
    config.cuda_agent.pool = {"workers": 1}

    async def reply(task):
        row = rl_rows([task], "cpu", "single_turn")[0]
        server = ScriptedServer(tokenizer, [f"```python\n{solution}```"])
        loop = hydra.utils.instantiate(
            config=verl_agent_loop._agent_loop_registry["cuda_agent_single_turn"],
            trainer_config=verl_agent_loop.DictConfigWrap(config=config), server_manager=server, tokenizer=tokenizer,
            processor=None, hf_model_type=None, dataset_cls=RLHFDataset,
            data_config=verl_agent_loop.DictConfigWrap(config.data), tools=verl_agent_loop.ToolListWrap([]))
        output = await loop.run({"temperature": 1.0, "top_p": 1.0}, raw_prompt=row["prompt"],
                                extra_info=row["extra_info"])
        return output, server

    for entry in OmegaConf.load(CONFIGS / "agent_loop.yaml"):
        verl_agent_loop._agent_loop_registry[entry.name] = entry
    try:
        scored, server = asyncio.run(reply(relu))
        failed, _ = asyncio.run(reply(no_model))
    finally:
        from cuda_agent.train.verl.agent_loop import _Shared

        for scorer in _Shared.scorers.values():
            scorer.pool.close()
        _Shared.scorers.clear()
    assert scored.response_ids == server.generated[0] and set(scored.response_mask) == {1}
    assert scored.reward_score >= 1.0 and scored.extra_fields["reward_extra_info"] == {"cuda_agent_harness_error": 0}
    assert set(failed.response_mask) == {0} and failed.reward_score == 0.0  # the reference failed: not trained on
    assert failed.extra_fields["reward_extra_info"] == {"cuda_agent_harness_error": 1}


def test_compute_score_scores_single_turn_responses_with_the_evaluator(session_cache_dir):
    relu = load_task(EXAMPLES / "tasks" / "relu.py")
    row = rl_rows([relu], "cpu", "single_turn")[0]
    assert row["agent_name"] == "cuda_agent_single_turn" and "model.py" in row["prompt"][0]["content"]
    evaluation = {"cache_dir": str(session_cache_dir),
                  "timing": {"budget_s": 0.3, "min_samples": 3, "warmup_calls": 1, "compile_baseline": False}}
    solution = (EXAMPLES / "solutions" / "cpu" / "relu.py").read_text()

    async def score(text: str):
        return await compute_score(row["data_source"], text, "", row["extra_info"], device="cpu",
                                   evaluation=OmegaConf.create(evaluation), pool={"workers": 1})

    try:
        good = asyncio.run(score(f"```python\n{solution}```"))
        empty = asyncio.run(score("I cannot do this."))
    finally:
        close_pools()
    assert good["score"] >= 1.0 and good["harness_error"] == 0
    assert empty == {"score": -1.0, "status": "no solution: the response defines no class ModelNew",
                     "harness_error": 0}


def _leaves(node, prefix=""):
    if isinstance(node, dict):
        for key, value in node.items():
            if key not in ("defaults", "hydra", "cuda_agent"):
                yield from _leaves(value, f"{prefix}.{key}" if prefix else key)
    else:
        yield prefix


def _has_path(tree, key: str) -> bool:
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return False
        tree = tree[part]
    return True


# Keys verl reads with .get() that its defaults do not spell out.
_READ_WITH_GET = ("reward.custom_reward_function.reward_kwargs",)


@pytest.mark.parametrize("name", ["warmup", "ppo", "value", "rft"])
def test_example_configs_compose_with_verls_config_and_set_only_keys_it_has(name):
    import verl

    base_name = "sft_trainer_engine" if name == "rft" else "ppo_trainer"
    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        base = OmegaConf.to_container(compose(config_name=base_name), resolve=False)
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        composed = compose(config_name=name)
    files = [name] + (["agentic"] if name in ("ppo", "value") else [])
    for file in files:
        ours = OmegaConf.to_container(OmegaConf.load(CONFIGS / f"{file}.yaml"), resolve=False)
        for key in _leaves(ours):
            if not key.startswith(_READ_WITH_GET):
                assert _has_path(base, key), f"{file}.yaml sets {key}, which verl's {base_name} does not have"
    if name == "rft":
        assert composed.data.messages_key == "messages"
        return
    assert composed.actor_rollout_ref.actor.clip_ratio_low == 0.2
    assert composed.actor_rollout_ref.actor.clip_ratio_high == 0.28
    assert (composed.algorithm.gamma, composed.algorithm.lam) == (1.0, 0.95)
    assert composed.cuda_agent.device == "cuda"
    settings = VerlSettings.from_section(composed.cuda_agent)  # our own keys: agent (tools, context), pool, ...
    assert settings.evaluation.device == "cuda"
    if name == "warmup":
        assert composed.reward.custom_reward_function.path == "pkg://cuda_agent.train.verl.reward"
        assert composed.reward.custom_reward_function.reward_kwargs.device == "cuda"
        assert composed.actor_rollout_ref.rollout.agent.default_agent_loop == "cuda_agent_single_turn"
        assert composed.actor_rollout_ref.actor.ppo_epochs == 2
    else:
        assert composed.actor_rollout_ref.rollout.agent.default_agent_loop == "cuda_agent"
        assert composed.actor_rollout_ref.rollout.agent.agent_loop_config_path == "configs/verl/agent_loop.yaml"
        assert composed.trainer.critic_warmup == 20
        if name == "value":  # every step a critic warm-up step: the actor never learns
            assert composed.trainer.critic_warmup >= composed.trainer.total_training_steps
