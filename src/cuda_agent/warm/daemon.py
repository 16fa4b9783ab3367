"""The keep-warm evaluator process: evaluations for one configuration, on worker slots kept warm.

Started by :func:`cuda_agent.warm.client.evaluate_warm` in a session of its own (``python -m
cuda_agent.warm.daemon --socket S --config C --idle-s N``). It listens on a Unix socket that only
its user can reach, answers one request per connection, one at a time (evaluations on one device
are serialised anyway), and exits after ``--idle-s`` seconds without an evaluation, on ``stop`` or on
SIGTERM, closing its prestarted slots (and removing its socket) on the way out.

Requests and replies are one JSON line each:
``{"op": "evaluate", "task_file", "solution"}`` -> ``{"verdict": <verify --json object>}`` or
``{"error": "..."}``; ``{"op": "ping"}`` -> ``{"pid", "device", "evaluations", "started", "idle_s"}``;
``{"op": "stop"}`` -> ``{"stopping": true}``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

from cuda_agent.environment import EvalConfig, Prestarter, evaluate, load_task
from cuda_agent.environment.slots import default_prestart_slots

logger = logging.getLogger("cuda_agent.warm")
MAX_REQUEST_BYTES = 1 << 20


class WarmDaemon:
    def __init__(self, config: EvalConfig, idle_s: float) -> None:
        self.config, self.idle_s = config, idle_s
        self.evaluations = 0
        self.started = time.time()

    def serve(self, listener: socket.socket) -> None:
        """Answer requests until ``idle_s`` pass without an evaluation (a ``ping`` does not count)."""
        with Prestarter(self.config, default_prestart_slots(self.config.device)) as prestarted:
            idle_until = time.monotonic() + self.idle_s
            while (left := idle_until - time.monotonic()) > 0:
                listener.settimeout(left)
                try:
                    connection, _ = listener.accept()
                except TimeoutError:
                    break
                with connection:
                    connection.settimeout(None)
                    request = _read_line(connection)
                    reply = self.answer(request, prestarted)
                    with contextlib.suppress(OSError):  # the command gave up waiting: nothing to tell
                        connection.sendall(json.dumps(reply, default=str).encode() + b"\n")
                if reply.get("stopping"):
                    return
                if isinstance(request, dict) and request.get("op") == "evaluate":
                    idle_until = time.monotonic() + self.idle_s
            logger.info("no evaluation for %g s: exiting", self.idle_s)

    def answer(self, request: dict[str, Any] | None, prestarted: Prestarter) -> dict[str, Any]:
        op = request.get("op") if isinstance(request, dict) else None
        if op == "ping":
            return {"pid": os.getpid(), "device": self.config.device, "evaluations": self.evaluations,
                    "started": self.started, "idle_s": self.idle_s}
        if op == "stop":
            return {"stopping": True}
        if op != "evaluate":
            return {"error": f"unknown request {op!r} (evaluate, ping or stop)"}
        try:
            task = load_task(Path(request["task_file"]))
            verdict = evaluate(task, Path(request["solution"]), self.config, prestarted=prestarted)
        except Exception as exc:  # noqa: BLE001 - the command reports it and evaluates by itself
            logger.exception("evaluation failed")
            return {"error": f"{type(exc).__name__}: {exc}"}
        self.evaluations += 1
        return {"verdict": verdict.to_json_dict()}


def _read_line(connection: socket.socket) -> dict[str, Any] | None:
    data = b""
    while not data.endswith(b"\n") and len(data) < MAX_REQUEST_BYTES:
        chunk = connection.recv(1 << 16)
        if not chunk:
            break
        data += chunk
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


def _listen(path: Path) -> socket.socket:
    """Bind ``path`` (replacing a socket nobody listens on: the starter holds the start lock)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    previous = os.umask(0o177)
    try:
        listener.bind(str(path))
    finally:
        os.umask(previous)
    listener.listen(16)
    return listener


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="cuda-agent's keep-warm evaluator (started by `verify --keep-warm`)")
    parser.add_argument("--socket", type=Path, required=True)
    parser.add_argument("--config", type=Path, required=True, help="the evaluation config as JSON (EvalConfig.to_dict)")
    parser.add_argument("--idle-s", type=float, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    config = EvalConfig.from_dict(json.loads(args.config.read_text()))

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    listener = _listen(args.socket)
    bound = args.socket.stat().st_ino
    logger.info("serving %s evaluations on %s (pid %d)", config.device, args.socket, os.getpid())
    try:
        WarmDaemon(config, args.idle_s).serve(listener)
    finally:
        listener.close()
        with contextlib.suppress(FileNotFoundError):
            if args.socket.stat().st_ino == bound:  # still ours, not a successor's
                args.socket.unlink()


if __name__ == "__main__":
    main()
