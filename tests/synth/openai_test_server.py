"""A local OpenAI-compatible chat-completions server for testing the LLM composer.

It is a real HTTP server on loopback (stdlib ``ThreadingHTTPServer`` in a thread) that speaks the
chat-completions schema: ``POST /v1/chat/completions`` with a Bearer token, answered with
``{id, object: "chat.completion", created, model, choices: [{index, message: {role, content},
finish_reason}], usage: {prompt_tokens, completion_tokens, total_tokens}}`` or an OpenAI-style
``{"error": {...}}`` body. What it answers is scripted by ``mode``:

- ``valid``: a runnable task that uses every operator of its table named in the prompt;
- ``invalid_then_valid``: a first reply without ``get_init_inputs``, then (once the conversation
  carries the composer's feedback) a valid one;
- ``invalid``: never valid;
- ``429_then_valid``: HTTP 429 with ``Retry-After: 0`` on the first request, then valid;
- ``slow_then_valid``: the first request waits ``slow_s`` before answering (a client timeout);
- ``500``: HTTP 500 on every request.

It records every authorised request (headers, body, arrival time), counts refused ones, and keeps
the most requests in flight at once.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

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


class OpenAITestServer:
    """Context manager running the scripted server; ``base_url`` ends in ``/v1``."""

    def __init__(self, mode: str = "valid", api_key: str = "test-key", delay_s: float = 0.0,
                 slow_s: float = 1.0) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
        self.mode, self.api_key, self.delay_s, self.slow_s = mode, api_key, delay_s, slow_s
        self.requests: list[dict[str, Any]] = []
        self.responses: list[dict[str, Any]] = []
        self.in_flight = self.max_in_flight = self.unauthorized = 0
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02},
                                        daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def __enter__(self) -> OpenAITestServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    def reply(self, number: int, body: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        """Status, JSON body and extra headers for request ``number`` (0-based) with ``body``."""
        if self.mode == "500" or (self.mode == "429_then_valid" and number == 0):
            code, kind = (500, "server_error") if self.mode == "500" else (429, "rate_limit_exceeded")
            return code, {"error": {"message": f"scripted {code}", "type": kind, "code": kind}}, {"Retry-After": "0"}
        if self.mode == "slow_then_valid" and number == 0:
            time.sleep(self.slow_s)
        messages = body["messages"]
        prompt = messages[1]["content"]
        ops = sorted((op for op in SNIPPETS if op in prompt), key=prompt.index)
        code = task_code(ops)
        repaired = any(m["role"] == "assistant" for m in messages)
        if self.mode == "invalid" or (self.mode == "invalid_then_valid" and not repaired):
            code = code.split("def get_init_inputs")[0]
        content = f"Here is the layer.\n\n```python\n{code}```\n"
        prompt_tokens = sum(len(m["content"].split()) for m in messages)
        completion_tokens = len(content.split())
        return 200, {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion", "created": int(time.time()),
            "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        }, {}


def _handler_for(server: OpenAITestServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            """Quiet: the tests read ``server.requests`` instead."""

        def do_POST(self) -> None:
            if self.path != "/v1/chat/completions":
                return self._send(404, {"error": {"message": f"no route {self.path}", "type": "invalid_request_error"}})
            if self.headers.get("Authorization") != f"Bearer {server.api_key}":
                with server._lock:
                    server.unauthorized += 1
                return self._send(401, {"error": {"message": "Incorrect API key provided",
                                                  "type": "invalid_request_error", "code": "invalid_api_key"}})
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with server._lock:
                number = len(server.requests)
                server.requests.append({"headers": dict(self.headers), "body": body, "time": time.monotonic()})
                server.in_flight += 1
                server.max_in_flight = max(server.max_in_flight, server.in_flight)
            try:
                time.sleep(server.delay_s)
                code, payload, headers = server.reply(number, body)
            finally:
                with server._lock:
                    server.in_flight -= 1
            with server._lock:
                server.responses.append(payload)
            self._send(code, payload, headers)

        def _send(self, code: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            try:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout test): nothing to answer

    return Handler
