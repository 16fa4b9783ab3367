"""The agent's shell: one ``bash -c`` per tool call, in the workdir, sandboxed, with a timeout.

Running as root, an episode leases a sandbox uid (:mod:`cuda_agent.environment.sandbox`: the uid
the evaluator gives candidates, from the same slot range) and every command runs as that uid in a
fresh network namespace with a private ``/tmp`` and ``$HOME``, under the evaluator's resource
limits. The protected files are root-owned and read-only, so the kernel enforces what the file
tools check. After each command every process of the uid is killed, so nothing the agent started
outlives its tool call (and nothing can race the next file-tool call). Not root, commands run as the
current user in their own process group; the episode records that the sandbox was off.

Background shells (:mod:`cuda_agent.agent.background`) are the one exception: each runs in a
session of its own, registered here, which the per-command kill spares (while any runs, the
leftovers of a command are killed process by process, by session, instead of all at once by uid).
:meth:`close` kills every background session, and then every process of the uid, at episode end.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from cuda_agent.environment import sandbox
from cuda_agent.environment.config import LimitsConfig, SandboxConfig
from cuda_agent.environment.worker import die_with_parent

_READ_CHUNK = 1 << 16


@dataclass(frozen=True)
class ShellResult:
    """What one command did. ``output`` is stdout and stderr interleaved, possibly truncated."""

    output: str
    exit_code: int | None
    """``None`` when the command was killed at its timeout."""
    timed_out: bool
    truncated_chars: int
    seconds: float


def truncate_middle(text: str, max_chars: int) -> tuple[str, int]:
    """Keep the head and tail of ``text`` around a marker saying how much was cut.

    Returns:
        The text to show and the number of characters left out (0: nothing was cut).
    """
    if len(text) <= max_chars:
        return text, 0
    head = max_chars // 2
    tail = max_chars - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... {cut} characters truncated ...]\n{text[-tail:]}", cut


class SandboxedShell:
    """Runs commands for one episode; :meth:`close` releases its sandbox lease."""

    def __init__(self, workdir: Path, home: Path, sandbox_config: SandboxConfig, limits: LimitsConfig,
                 episode_root: Path, path_prefix: Path | None = None) -> None:
        self.workdir, self.home, self.limits = workdir, home, limits
        self.path_prefix = path_prefix
        """A folder searched before ``$PATH`` (the paper workdir style's ``sudo`` shim)."""
        self.lease = sandbox.acquire(sandbox_config, "cpu", episode_root)
        self._preexec = self.lease.preexec(limits, workdir=home) \
            if self.lease.uid is not None else _own_session
        self.background_sessions: set[int] = set()
        """Session ids of running background shells (spared by the per-command kill)."""

    @property
    def uid(self) -> int | None:
        """The sandbox uid commands run as (``None``: sandbox off)."""
        return self.lease.uid

    def describe(self) -> str:
        return self.lease.describe()

    async def spawn(self, command: str, own_session: bool = False) -> asyncio.subprocess.Process:
        """Start ``command`` with ``bash -c`` in the workdir, sandboxed, stdout and stderr on one pipe;
        in a new session (its id is the pid) when ``own_session`` or when the sandbox is off."""
        path = os.environ.get("PATH", "/usr/bin:/bin")
        env = {"PATH": f"{self.path_prefix}:{path}" if self.path_prefix else path, "HOME": str(self.home), "TMPDIR": "/tmp",
               "LANG": "C.UTF-8", "TERM": "dumb", "PYTHONDONTWRITEBYTECODE": "1"}
        return await asyncio.create_subprocess_exec(
            "bash", "--noprofile", "--norc", "-c", f"cd {_quote(self.workdir)} || exit 1\n{command}",
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            cwd=self.home, env=env, preexec_fn=self._preexec, start_new_session=own_session or self.lease.uid is None)

    async def run(self, command: str, timeout_s: float, max_output_chars: int) -> ShellResult:
        """Run ``command`` with ``bash -c`` in the workdir; kill it (and all it started) at ``timeout_s``."""
        started = time.monotonic()
        proc = await self.spawn(command)
        output = _HeadTail(2 * max_output_chars)

        async def drain() -> None:
            while chunk := await proc.stdout.read(_READ_CHUNK):
                output.add(chunk)
            await proc.wait()

        timed_out = False
        try:
            await asyncio.wait_for(drain(), timeout_s)
        except asyncio.TimeoutError:
            timed_out = True
        finally:
            await self._kill_leftovers(proc)
        shown, cut = truncate_middle(output.text(), max_output_chars)
        if timed_out:
            shown += f"\n[command timed out after {timeout_s:g} s and was killed]"
        return ShellResult(shown, None if timed_out else proc.returncode, timed_out, cut + output.dropped,
                           time.monotonic() - started)

    async def _kill_leftovers(self, proc: asyncio.subprocess.Process) -> None:
        """Kill the command and everything it started (by uid in the sandbox, else by group), sparing
        the background shells' sessions."""
        if self.lease.uid is not None and self.background_sessions:
            await asyncio.to_thread(kill_sessions_of, self.lease.uid, lambda sid: sid not in self.background_sessions)
        elif self.lease.uid is not None:
            await asyncio.to_thread(sandbox.kill_all_processes_of, self.lease.uid)
        else:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if proc.returncode is None:
            await proc.wait()

    def kill_session(self, sid: int) -> None:
        """Kill background session ``sid`` and everything in it, and stop sparing it."""
        self.background_sessions.discard(sid)
        if self.lease.uid is not None:
            kill_sessions_of(self.lease.uid, lambda session: session == sid)
        else:
            try:
                os.killpg(sid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        """Kill every background shell and every process of the sandbox uid, then release the lease."""
        for sid in list(self.background_sessions):
            self.kill_session(sid)
        self.lease.release()


class _HeadTail:
    """The first and last ``keep`` bytes of a stream, and how many were dropped between them."""

    def __init__(self, keep: int) -> None:
        self.keep, self.head, self.tail, self.dropped = keep, bytearray(), bytearray(), 0

    def add(self, chunk: bytes) -> None:
        room = self.keep - len(self.head)
        self.head += chunk[:room]
        self.tail += chunk[room:] if room > 0 else chunk
        if len(self.tail) > self.keep:
            self.dropped += len(self.tail) - self.keep
            del self.tail[: len(self.tail) - self.keep]

    def text(self) -> str:
        middle = f"\n[... {self.dropped} bytes truncated ...]\n" if self.dropped else ""
        return self.head.decode(errors="replace") + middle + self.tail.decode(errors="replace")


def kill_sessions_of(uid: int, doomed, rounds: int = 50) -> None:
    """SIGKILL every process of ``uid`` whose session id ``doomed(sid)`` selects, repeating until
    none is left (a process cannot leave its session except by starting a new one, which the next
    round finds), at most ``rounds`` times."""
    for _ in range(rounds):
        targets = [pid for pid in sandbox.processes_of(uid) if doomed(_session_of(pid))]
        if not targets:
            return
        for pid in targets:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)


def _session_of(pid: int) -> int:
    """The session id of ``pid`` (field 6 of /proc/<pid>/stat); -1 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return -1 if fields[0] == "Z" else int(fields[3])
    except (OSError, IndexError, ValueError):
        return -1


def _own_session() -> None:
    die_with_parent()


def _quote(path: Path) -> str:
    return "'" + str(path).replace("'", "'\\''") + "'"
