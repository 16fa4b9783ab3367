"""The LLM composer against a local OpenAI-compatible server speaking the real chat-completions
protocol over HTTP on loopback (``tests/openai_server.py`` with ``composer_server.py``'s script)."""

from __future__ import annotations

import json

import pytest
import torch

from cuda_agent.environment import load_task
from cuda_agent.llm import LLMConfig, LLMEndpointError, UsageLog
from cuda_agent.synth.llm_composer import (
    InvalidComposition, LLMCompositionError, LLMComposer, build_messages, compose_many, extract_code, validate,
)
from cuda_agent.synth.records import SeedOp

from composer_server import composer_server, task_code
from openai_server import OpenAITestServer

LINEAR = SeedOp("torch.nn.Linear", "module", "torch", "linear", 1, (2, 3), ("float32",), "reshape",
                init={"in_features": "{last}", "out_features": 64}, signature="(in_features, out_features, bias=True)",
                params=4160)
GELU = SeedOp("torch.nn.functional.gelu", "function", "torch", "activation", 1, (1, 2, 3, 4), ("float32",), "same",
              signature="(input, approximate='none')")
NORM = SeedOp("torch.nn.LayerNorm", "module", "torch", "normalization", 1, (2, 3), ("float32",), "same",
              init={"normalized_shape": "{last}"})
TANH = SeedOp("torch.tanh", "function", "torch", "activation", 1, (1, 2, 3, 4), ("float32",), "same")
SIGMOID = SeedOp("torch.sigmoid", "function", "torch", "activation", 1, (1, 2, 3, 4), ("float32",), "same")


def _config(server: OpenAITestServer, **settings) -> LLMConfig:
    settings = {"backoff_s": 0.01, "max_backoff_s": 0.05, "timeout_s": 5.0, **settings}
    return LLMConfig(base_url=server.base_url, model="test-model", api_key="test-key", **settings)


def _run(code: str) -> torch.Tensor:
    """Build and call the task in-process: the code comes from our own test server."""
    namespace: dict = {}
    exec(compile(code, "<task>", "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["Model"](*namespace["get_init_inputs"]())
    return model(*namespace["get_inputs"]())


def test_llm_composer_output_loads_and_runs_as_task(tmp_path):
    with composer_server("valid") as server:
        record = LLMComposer(_config(server)).compose([LINEAR, GELU, NORM], seed=7)
    assert record.ops == ["torch.nn.Linear", "torch.nn.functional.gelu", "torch.nn.LayerNorm"]
    assert (record.composer, record.seed, record.source) == ("llm:test-model", 7, "torch")
    assert record.data_source == "torch#3"
    path = tmp_path / "task.py"
    path.write_text(record.code)
    task = load_task(path)
    out = _run(task.code)
    assert out.shape == (16, 64) and torch.isfinite(out).all()


def test_llm_composer_sends_chat_completions_request_with_bearer_auth():
    with composer_server("valid") as server:
        LLMComposer(_config(server, temperature=0.3, max_tokens=1000)).compose([TANH], seed=3)
    (request,) = server.requests
    assert request["headers"]["Authorization"] == "Bearer test-key"
    body = request["body"]
    assert (body["model"], body["temperature"], body["max_tokens"], body["seed"]) == ("test-model", 0.3, 1000, 3)
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert "class Model(nn.Module)" in body["messages"][0]["content"]
    assert "torch.tanh" in body["messages"][1]["content"]


def test_llm_composer_wrong_api_key_fails_at_once_naming_the_key():
    with composer_server("valid", api_key="right") as server:
        with pytest.raises(LLMEndpointError, match="HTTP 401.*CUDA_AGENT_LLM_API_KEY"):
            LLMComposer(_config(server)).compose([TANH], seed=0)
    assert server.unauthorized == 1 and server.requests == []


def test_llm_composer_feeds_validation_error_back_and_accepts_repair():
    with composer_server("invalid_then_valid") as server:
        record = LLMComposer(_config(server)).compose([LINEAR, TANH], seed=1)
    assert len(server.requests) == 2
    repair = server.requests[1]["body"]["messages"]
    assert [m["role"] for m in repair] == ["system", "user", "assistant", "user"]
    assert "get_init_inputs" in repair[-1]["content"] and "rejected" in repair[-1]["content"]
    assert _run(record.code).shape == (16, 64)


def test_llm_composer_gives_up_after_max_repairs_with_reason():
    with composer_server("invalid") as server:
        with pytest.raises(LLMCompositionError, match=r"after 3 replies \(max_repairs=2\).*get_init_inputs"):
            LLMComposer(_config(server, max_repairs=2)).compose([TANH], seed=0)
    assert len(server.requests) == 3


def test_llm_composer_retries_429_after_backoff_and_logs_each_request(tmp_path):
    log = tmp_path / "logs" / "usage.jsonl"
    with composer_server("429_then_valid") as server:
        composer = LLMComposer(_config(server, backoff_s=0.1, max_backoff_s=1.0, usage_log=log,
                                       usd_per_mtok_prompt=1.0, usd_per_mtok_completion=2.0))
        composer.compose([SIGMOID], seed=5)
    assert server.requests[1]["time"] - server.requests[0]["time"] >= 0.1
    first, second = [json.loads(line) for line in log.read_text().splitlines()]
    assert (first["status"], first["attempt"], first["prompt_tokens"]) == ("http_429", 1, 0)
    usage = server.responses[1]["usage"]
    assert (second["status"], second["attempt"], second["model"], second["seed"]) == ("ok", 2, "test-model", 5)
    assert (second["prompt_tokens"], second["completion_tokens"], second["total_tokens"]) == (
        usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"])
    assert second["cost_usd"] == pytest.approx((usage["prompt_tokens"] + 2 * usage["completion_tokens"]) / 1e6)
    assert second["latency_s"] > 0 and second["timestamp"]
    totals = composer.usage.totals
    assert (totals.requests, totals.failed_requests, totals.prompt_tokens) == (2, 1, usage["prompt_tokens"])


def test_llm_composer_retries_a_timeout():
    with composer_server("slow_then_valid", slow_s=1.0) as server:
        usage = UsageLog()
        LLMComposer(_config(server, timeout_s=0.2), usage).compose([TANH], seed=0)
    assert len(server.requests) == 2
    assert (usage.totals.requests, usage.totals.failed_requests) == (2, 1)


def test_llm_composer_persistent_500_fails_clearly_after_max_retries():
    with composer_server("500") as server:
        with pytest.raises(LLMEndpointError, match=r"failed 3 times \(max_retries=2\).*HTTP 500.*scripted 500"):
            LLMComposer(_config(server, max_retries=2)).compose([TANH], seed=0)
    assert len(server.requests) == 3


def test_compose_many_respects_concurrency_and_keeps_order(tmp_path):
    log = tmp_path / "usage.jsonl"
    op_lists = [[TANH], [SIGMOID, LINEAR], [GELU], [NORM, TANH], [LINEAR], [SIGMOID], [GELU, NORM], [TANH]]
    seeds = list(range(100, 108))
    with composer_server("valid", delay_s=0.15) as server:
        results = list(compose_many(op_lists, seeds, _config(server, concurrency=3, usage_log=log)))
    assert server.max_in_flight == 3
    assert [(r.index, r.seed, r.error) for r in results] == [(i, s, None) for i, s in enumerate(seeds)]
    assert [r.record.ops for r in results] == [[op.name for op in ops] for ops in op_lists]
    assert len(log.read_text().splitlines()) == len(op_lists)


def test_compose_many_reports_failures_as_results():
    with composer_server("500") as server:
        (result,) = compose_many([[TANH]], [0], _config(server, max_retries=1))
    assert result.record is None and "HTTP 500" in result.error


def test_compose_many_rejects_mismatched_lengths():
    config = LLMConfig(base_url="http://127.0.0.1:9/v1", model="m")
    with pytest.raises(ValueError):
        list(compose_many([[TANH], [TANH]], [0], config))


def test_validate_requires_every_op_by_name_not_in_comments():
    code = task_code(["torch.tanh"]).replace("import torch\n", "import torch  # uses gelu\n", 1)
    validate(code, [TANH])
    with pytest.raises(InvalidComposition, match="torch.nn.functional.gelu"):
        validate(code, [TANH, GELU])


def test_validate_rejects_syntax_errors_and_missing_names():
    with pytest.raises(InvalidComposition, match="syntax error"):
        validate("def Model(:\n", [TANH])
    with pytest.raises(InvalidComposition, match="get_inputs"):
        validate("import torch\nclass Model: pass\n", [TANH])


def test_extract_code_prefers_last_python_fence():
    text = "```\nuntagged\n```\n```python\nfirst\n```\ntext\n```python\nsecond\n```\n```bash\nls\n```"
    assert extract_code(text) == "second\n"
    assert extract_code("```\nonly untagged\n```") == "only untagged\n"
    assert extract_code("x = 1\n") == "x = 1\n"
    assert extract_code("```python\ncut off at max_tokens") == "cut off at max_tokens\n"


def test_prompt_lists_each_op_with_its_mined_facts():
    system, user = build_messages([LINEAR, GELU])
    assert "get_init_inputs()" in system["content"] and "```python" in system["content"]
    text = user["content"]
    assert "1. torch.nn.Linear (module" in text and "2. torch.nn.functional.gelu (function" in text
    assert "Linear(in_features, out_features, bias=True)" in text and '"out_features": 64' in text
    assert "family linear" in text and "ranks that work: 2, 3" in text


def test_config_from_env_prefers_arguments_then_cuda_agent_then_openai_variables():
    env = {"OPENAI_BASE_URL": "https://api.example/v1/", "OPENAI_API_KEY": "sk-openai",
           "CUDA_AGENT_LLM_API_KEY": "sk-agent", "CUDA_AGENT_LLM_MODEL": "env-model"}
    config = LLMConfig.from_env(env=env, concurrency=2)
    assert (config.base_url, config.model, config.api_key, config.concurrency) == (
        "https://api.example/v1", "env-model", "sk-agent", 2)
    assert LLMConfig.from_env(model="arg-model", env=env).model == "arg-model"
    assert "sk-agent" not in repr(config)
    with pytest.raises(ValueError, match="CUDA_AGENT_LLM_MODEL"):
        LLMConfig.from_env(env={"OPENAI_BASE_URL": "http://x/v1"})
    with pytest.raises(ValueError, match="CUDA_AGENT_LLM_BASE_URL"):
        LLMConfig.from_env(env={"CUDA_AGENT_LLM_MODEL": "m"})
    with pytest.raises(ValueError, match="concurrency must be >= 1"):
        LLMConfig.from_env(env=env, concurrency=0)

