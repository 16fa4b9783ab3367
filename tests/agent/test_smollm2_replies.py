"""What the real SmolLM2-135M-Instruct writes, through the text tool protocol's parser, the agent
loop and the static guards: its recorded replies (tests/fixtures/agent/smollm2/replies.json,
made by record_replies.py beside it) are prose, runaway repetition, code cut off mid-statement,
and ``<tool_call>`` blocks it opens and never closes. None of it may crash anything: an unparsed
call goes back to the model as a tool error and is counted, and code that does not parse is
refused with its file and line before anything is built."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from cuda_agent.agent.base import Policy, PolicyReply
from cuda_agent.agent.evaluation import EvaluationQueue
from cuda_agent.agent.loop import run_episode
from cuda_agent.agent.text_protocol import OPEN, parse_tool_calls, reply_from_text
from cuda_agent.agent.trajectory import summarize
from cuda_agent.environment import load_solution, load_task
from cuda_agent.environment.guards import GuardConfig, SourceBundle, run_guards
from cuda_agent.environment.solution import SolutionError
from cuda_agent.train.filters import invalid_calls

from support import EXAMPLES, FIXTURES

REPLIES = json.loads((FIXTURES / "agent" / "smollm2" / "replies.json").read_text())["replies"]
OPENED = [r["text"] for r in REPLIES if r["text"].startswith(OPEN)]
UNCLOSED = "tool call 1 has no closing </tool_call>"
PYTHON_BLOCK = re.compile(r"```python\n(.*?)(?:```|\Z)", re.DOTALL)
SYNTAX_ERRORS = {  # (prompt, temperature, seed) -> the line the model's code stops being Python
    ("write_a_cuda_relu", 0.0, 0): 18, ("write_a_cuda_relu", 0.7, 0): 21, ("write_a_cuda_relu", 0.7, 1): 6,
    ("agent_first_turn_cuda", 0.7, 0): 16,
}


def test_the_parser_finds_no_call_where_the_model_wrote_none_and_names_the_unclosed_ones():
    assert len(REPLIES) == 20 and len(OPENED) == 4
    for reply in REPLIES:
        calls, errors = parse_tool_calls(reply["text"], "call")
        assert calls == [] and errors == ([UNCLOSED] if reply["text"] in OPENED else []), reply["text"][:200]


class RecordedTextPolicy(Policy):
    """Sends recorded model text as the hf policy sends what it generates: through the text protocol."""

    name = "recorded-text"

    def __init__(self, texts: list[str]) -> None:
        self.texts = iter(texts)

    async def act(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], episode_id: str) -> PolicyReply:
        return reply_from_text(next(self.texts), (), (), "length")


def test_unclosed_calls_come_back_to_the_model_are_counted_and_the_episode_is_scored(make_config, agent_config):
    config = agent_config.replace(max_turns=len(OPENED), max_idle_replies=len(OPENED))

    async def episode():
        queue = EvaluationQueue(make_config(), 1)
        try:
            return await run_episode(load_task(EXAMPLES / "tasks" / "relu.py"), RecordedTextPolicy(OPENED), config,
                                     queue)
        finally:
            queue.close()

    trajectory = asyncio.run(episode())
    assert trajectory.turns == len(OPENED) and trajectory.end_reason == "idle" and trajectory.error is None
    for step in trajectory.steps:
        assert step.parse_errors == [UNCLOSED] and step.tool_calls == []
        assert trajectory.messages[step.message_index]["content"] in OPENED  # the model's text, as written
        answer = trajectory.messages[step.message_index + 1]
        assert answer["role"] == "user" and answer["content"].startswith(f"Could not parse: {UNCLOSED}\n")
    assert summarize([trajectory]).unparsed_tool_calls == len(OPENED)
    assert invalid_calls(trajectory) == [f"turn {t}: {UNCLOSED}" for t in range(len(OPENED))]  # RFT drops it
    assert trajectory.final["verdict"]["status"] == "runtime_error" and trajectory.reward == -1


def test_code_the_model_wrote_is_refused_with_its_line_before_anything_is_built(tmp_path):
    checked = 0
    for reply in REPLIES:
        for number, code in enumerate(PYTHON_BLOCK.findall(reply["text"])):
            workdir = tmp_path / f"{reply['prompt']}-{reply['temperature']}-{reply['seed']}-{number}"
            (workdir / "kernels").mkdir(parents=True)
            (workdir / "model_new.py").write_text(code)
            line = SYNTAX_ERRORS.get((reply["prompt"], reply["temperature"], reply["seed"]))
            violations = run_guards(SourceBundle(python={"model_new.py": code}), GuardConfig())
            try:
                load_solution(workdir)
            except SolutionError as exc:
                refusal = str(exc)
            else:
                raise AssertionError(f"the evaluator would build what SmolLM2 wrote: {code[:200]}")
            if line is None:  # parses, but is no solution
                assert violations == [] and "no top-level 'class ModelNew'" in refusal
            else:
                assert [(v.code, v.message.split(" ")[0]) for v in violations] == [("syntax-error",
                                                                                     f"model_new.py:{line}:")]
                assert f"model_new.py: syntax error at line {line}:" in refusal
            checked += 1
    assert checked == 6
