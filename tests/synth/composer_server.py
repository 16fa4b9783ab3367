"""The synth LLM composer's script for the shared OpenAI-compatible test server
(``tests/openai_server.py``). What it answers is chosen by ``mode``:

- ``valid``: a runnable task that uses every operator of :data:`SNIPPETS` named in the prompt;
- ``invalid_then_valid``: a first reply without ``get_init_inputs``, then (once the conversation
  carries the composer's feedback) a valid one;
- ``invalid``: never valid;
- ``429_then_valid``: HTTP 429 with ``Retry-After: 0`` on the first request, then valid;
- ``slow_then_valid``: the first request waits ``slow_s`` before answering (a client timeout);
- ``500``: HTTP 500 on every request.
"""

from __future__ import annotations

from typing import Any

from openai_server import OpenAITestServer, Reply

MODES = ("valid", "invalid_then_valid", "invalid", "429_then_valid", "slow_then_valid", "500")

# Operator -> (line for __init__ or None, expression on x for forward). Sizes: x is (batch, features).
SNIPPETS = {
    "torch.nn.Linear": ("self.linear = nn.Linear(features, features)", "self.linear(x)"),
    "torch.nn.LayerNorm": ("self.norm = nn.LayerNorm(features)", "self.norm(x)"),
    "torch.nn.functional.gelu": (None, "F.gelu(x)"),
    "torch.tanh": (None, "torch.tanh(x)"),
    "torch.sigmoid": (None, "torch.sigmoid(x)"),
}


def task_code(ops: list[str]) -> str:
    """A KernelBench-format task applying ``ops`` (keys of :data:`SNIPPETS`) in order."""
    inits = [SNIPPETS[op][0] for op in ops if SNIPPETS[op][0]] or ["pass"]
    steps = [f"x = {SNIPPETS[op][1]}" for op in ops]
    body = "\n".join(f"        {line}" for line in ["super().__init__()", *inits])
    forward = "\n".join(f"        {line}" for line in [*steps, "return x"])
    return (
        "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"
        "batch_size = 16\nfeatures = 64\n\n\n"
        "class Model(nn.Module):\n"
        f"    def __init__(self, features):\n{body}\n\n"
        f"    def forward(self, x):\n{forward}\n\n\n"
        "def get_inputs():\n    return [torch.randn(batch_size, features)]\n\n\n"
        "def get_init_inputs():\n    return [features]\n"
    )


class ComposerScript:
    """``script(number, body) -> Reply`` for one of :data:`MODES`."""

    def __init__(self, mode: str, slow_s: float = 1.0) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
        self.mode, self.slow_s = mode, slow_s

    def __call__(self, number: int, body: dict[str, Any]) -> Reply:
        if self.mode == "500":
            return Reply.error(500, "server_error", retry_after_s=0)
        if self.mode == "429_then_valid" and number == 0:
            return Reply.error(429, "rate_limit_exceeded", retry_after_s=0)
        messages = body["messages"]
        prompt = messages[1]["content"]
        code = task_code(sorted((op for op in SNIPPETS if op in prompt), key=prompt.index))
        repaired = any(m["role"] == "assistant" for m in messages)
        if self.mode == "invalid" or (self.mode == "invalid_then_valid" and not repaired):
            code = code.split("def get_init_inputs")[0]
        slow = self.slow_s if self.mode == "slow_then_valid" and number == 0 else 0.0
        return Reply(content=f"Here is the layer.\n\n```python\n{code}```\n", delay_s=slow)


def composer_server(mode: str = "valid", api_key: str = "test-key", delay_s: float = 0.0,
                    slow_s: float = 1.0) -> OpenAITestServer:
    """A test server answering as a model composing tasks in ``mode``."""
    return OpenAITestServer(ComposerScript(mode, slow_s), api_key=api_key, delay_s=delay_s)
