"""The command's side of the keep-warm evaluator: find (or start) the daemon for a configuration,
send it one evaluation, read back the verdict.

Daemons live in one private folder per user (``$CUDA_AGENT_WARM_DIR``, default
``/tmp/cuda-agent-warm-<uid>``, mode 0700 and owned by the user, else refused): a socket, a log and
a start lock per daemon key. The key covers the evaluation configuration, the Python interpreter,
the visible GPUs and the installed cuda-agent code, so a daemon never judges with settings or code
other than the command's own.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cuda_agent
from cuda_agent.environment import timed_cpus
from cuda_agent.environment.config import EvalConfig
from cuda_agent.environment.verdict import Verdict

DIR_ENV = "CUDA_AGENT_WARM_DIR"
IDLE_S_ENV = "CUDA_AGENT_KEEP_WARM_IDLE_S"
DEFAULT_IDLE_S = 600.0
START_TIMEOUT_S = 120.0


class WarmError(RuntimeError):
    """The keep-warm evaluator gave no verdict: it did not start, or stopped during the evaluation."""


@dataclass(frozen=True)
class DaemonFiles:
    """Where the daemon of one key keeps its socket, log, start lock and configuration."""

    socket: Path
    log: Path
    lock: Path
    config: Path

    @classmethod
    def of(cls, key: str) -> "DaemonFiles":
        folder = daemon_dir()
        return cls(folder / f"{key}.sock", folder / f"{key}.log", folder / f"{key}.lock", folder / f"{key}.json")


def daemon_dir() -> Path:
    """The user's private folder of daemons, made on first use; an error if another user owns it
    or others may enter it (a socket there would take evaluations from anyone who can)."""
    folder = Path(os.environ.get(DIR_ENV) or f"/tmp/cuda-agent-warm-{os.getuid()}")
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700, parents=True)
    info = folder.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise WarmError(f"{folder}: the keep-warm folder must be a directory of this user with mode 0700 "
                        f"(set {DIR_ENV} to use another)")
    return folder


def daemon_key(config: EvalConfig) -> str:
    """What a daemon serves: the configuration, the interpreter, the visible GPUs, the CPU set
    apart for timing and the code."""
    digest = hashlib.sha256()
    for part in (json.dumps(config.to_dict(), sort_keys=True, default=str), sys.executable,
                 os.environ.get("CUDA_VISIBLE_DEVICES", "<all>"), os.environ.get(timed_cpus.ENV_VAR, "auto"),
                 _code_fingerprint()):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:24]


def _code_fingerprint() -> str:
    """Names, sizes and modification times of the installed package's files (an edit or an upgrade
    gets a new daemon)."""
    root = Path(cuda_agent.__file__).resolve().parent
    entries = sorted((str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns)
                     for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return hashlib.sha256(repr(entries).encode()).hexdigest()


def evaluate_warm(task_file: Path, solution: Path, config: EvalConfig, idle_s: float | None = None) -> Verdict:
    """The verdict of ``solution`` on ``task_file`` from the daemon for ``config`` (started when
    none runs; it exits after ``idle_s`` idle seconds, default ``$CUDA_AGENT_KEEP_WARM_IDLE_S`` or
    600). A daemon that stops at the moment it is reached is started again once."""
    key = daemon_key(config)
    files = DaemonFiles.of(key)
    request = {"op": "evaluate", "task_file": str(Path(task_file).resolve()), "solution": str(Path(solution).resolve())}
    idle = idle_s if idle_s is not None else float(os.environ.get(IDLE_S_ENV, DEFAULT_IDLE_S))
    try:
        reply = _exchange(_connect(files.socket) or _start(files, config, idle), request)
    except WarmError:  # it stopped (its idle time up, or killed) as it was reached: once more, afresh
        reply = _exchange(_connect(files.socket) or _start(files, config, idle), request)
    if "error" in reply:
        raise WarmError(f"the keep-warm evaluator failed: {reply['error']} (its log: {files.log})")
    return Verdict.from_json_dict(reply["verdict"])


def running_daemons() -> list[dict[str, Any]]:
    """What each daemon of this user answers to ``ping`` (its socket added)."""
    return [{**reply, "socket": str(path)} for path, reply in _ask_every_daemon({"op": "ping"})]


def stop_daemons() -> int:
    """Ask every daemon of this user to stop (each finishes the evaluation it is running); the
    number asked."""
    return len(_ask_every_daemon({"op": "stop"}))


def _ask_every_daemon(request: dict[str, Any]) -> list[tuple[Path, dict[str, Any]]]:
    """``request`` to every daemon in the folder, with each one's reply; sockets nobody listens on
    any more are removed."""
    replies = []
    for path in sorted(daemon_dir().glob("*.sock")):
        connection = _connect(path)
        if connection is None:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            continue
        with contextlib.suppress(WarmError):
            replies.append((path, _exchange(connection, request)))
    return replies


def _connect(path: Path) -> socket.socket | None:
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(str(path))
    except OSError:
        connection.close()
        return None
    return connection


def _start(files: DaemonFiles, config: EvalConfig, idle_s: float) -> socket.socket:
    """Start the daemon of ``files`` (one starter at a time: the others find it running) and
    connect to it."""
    with open(files.lock, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        connection = _connect(files.socket)
        if connection is not None:
            return connection
        files.config.write_text(json.dumps(config.to_dict()))
        with open(files.log, "ab") as log:
            daemon = subprocess.Popen(
                [sys.executable, "-m", "cuda_agent.warm.daemon", "--socket", str(files.socket),
                 "--config", str(files.config), "--idle-s", str(idle_s)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            connection = _connect(files.socket)
            if connection is not None:
                return connection
            if daemon.poll() is not None:
                raise WarmError(f"the keep-warm evaluator exited with status {daemon.returncode} as it started "
                                f"(its log: {files.log})")
            time.sleep(0.05)
        daemon.kill()
        raise WarmError(f"the keep-warm evaluator did not listen within {START_TIMEOUT_S:g} s (its log: {files.log})")


def _exchange(connection: socket.socket, request: dict[str, Any]) -> dict[str, Any]:
    """Send one request line, read the one reply line (the daemon closes after it)."""
    with connection:
        try:
            connection.sendall(json.dumps(request).encode() + b"\n")
            reply = b""
            while not reply.endswith(b"\n"):
                chunk = connection.recv(1 << 16)
                if not chunk:
                    break
                reply += chunk
        except OSError as exc:
            raise WarmError(f"lost the keep-warm evaluator: {exc}") from exc
    if not reply.endswith(b"\n"):
        raise WarmError("the keep-warm evaluator closed the connection without a reply")
    return json.loads(reply)
