"""A local OpenAI-compatible chat-completions server for tests: the real protocol over real HTTP
on loopback (stdlib ``ThreadingHTTPServer`` in a thread). Shared by the synth LLM composer tests
and the agent's ``openai`` policy tests.

``POST /v1/chat/completions`` with a Bearer token is answered with ``{id, object:
"chat.completion", created, model, choices: [{index, message: {role, content, tool_calls?},
finish_reason}], usage: {prompt_tokens, completion_tokens, total_tokens}}``, or an OpenAI-style
``{"error": {...}}`` body. What it answers is decided by a *script*: a callable
``script(number, body) -> Reply`` given the 0-based number of the request and its JSON body.
:class:`Conversation` is the script of one tool-calling conversation; the synth tests have their
own (``tests/synth/composer_server.py``).

The server records every authorised request (headers, with names in ``Title-Case``; body; arrival time), counts refused ones,
and keeps the most requests in flight at once.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable


@dataclass(frozen=True)
class Reply:
    """One scripted answer: an assistant message, or an HTTP error (``status`` != 200)."""

    content: str = ""
    tool_calls: tuple[tuple[str, dict[str, Any]], ...] = ()
    """``(function name, arguments)`` pairs; each gets a fresh call id."""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    """Wait this long before answering (a client timeout)."""
    finish_reason: str = ""
    """Default: ``tool_calls`` when there are tool calls, else ``stop``."""

    @classmethod
    def error(cls, status: int, kind: str, retry_after_s: float | None = None) -> Reply:
        headers = {} if retry_after_s is None else {"Retry-After": f"{retry_after_s:g}"}
        return cls(status=status, headers=headers, content=kind)


Script = Callable[[int, dict[str, Any]], Reply]


def words(messages: list[dict[str, Any]]) -> int:
    """A crude token count (whitespace words) for the ``usage`` block."""
    return sum(len(str(m.get("content") or "").split()) + len(json.dumps(m.get("tool_calls") or []).split())
               for m in messages)


def completion_body(body: dict[str, Any], reply: Reply) -> dict[str, Any]:
    """The chat-completion JSON for ``reply`` to the request ``body``."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content or None}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": f"call_{uuid.uuid4().hex[:10]}", "type": "function",
             "function": {"name": name, "arguments": json.dumps(arguments)}}
            for name, arguments in reply.tool_calls]
    prompt_tokens, completion_tokens = words(body["messages"]), words([message])
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion", "created": int(time.time()),
        "model": body["model"],
        "choices": [{"index": 0, "message": message,
                     "finish_reason": reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


class Conversation:
    """Script of one tool-calling conversation: request ``n`` gets ``turns[n]``; past the end, an
    HTTP 400 (a test that asks too often fails loudly)."""

    def __init__(self, turns: list[Reply]) -> None:
        self.turns = turns

    def __call__(self, number: int, body: dict[str, Any]) -> Reply:
        if number >= len(self.turns):
            return Reply.error(400, f"scripted conversation has only {len(self.turns)} turns")
        return self.turns[number]


class OpenAITestServer:
    """Context manager running a scripted server; ``base_url`` ends in ``/v1``."""

    def __init__(self, script: Script, api_key: str | None = "test-key", delay_s: float = 0.0) -> None:
        """``api_key=None`` accepts requests without checking the Authorization header."""
        self.script, self.api_key, self.delay_s = script, api_key, delay_s
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

    def answer(self, number: int, body: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        """Status, JSON body and extra headers for request ``number`` with ``body``."""
        time.sleep(self.delay_s)
        reply = self.script(number, body)
        time.sleep(reply.delay_s)
        if reply.status != 200:
            message = f"scripted {reply.status}: {reply.content}"
            return reply.status, {"error": {"message": message, "type": reply.content, "code": reply.content}}, \
                reply.headers
        return 200, completion_body(body, reply), reply.headers


def _handler_for(server: OpenAITestServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            """Quiet: the tests read ``server.requests`` instead."""

        def do_POST(self) -> None:
            if self.path != "/v1/chat/completions":
                return self._send(404, {"error": {"message": f"no route {self.path}", "type": "invalid_request_error"}})
            if server.api_key is not None and self.headers.get("Authorization") != f"Bearer {server.api_key}":
                with server._lock:
                    server.unauthorized += 1
                return self._send(401, {"error": {"message": "Incorrect API key provided",
                                                  "type": "invalid_request_error", "code": "invalid_api_key"}})
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with server._lock:
                number = len(server.requests)
                headers = {name.title(): value for name, value in self.headers.items()}  # HTTP names are case-blind
                server.requests.append({"headers": headers, "body": body, "time": time.monotonic()})
                server.in_flight += 1
                server.max_in_flight = max(server.max_in_flight, server.in_flight)
            try:
                code, payload, headers = server.answer(number, body)
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
