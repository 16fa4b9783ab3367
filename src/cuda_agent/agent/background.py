"""Background shells: start a long command, read its output later, kill it.

A background shell is a ``bash -c`` run by the episode's :class:`SandboxedShell`, with the same
sandbox (uid, network namespace, private ``/tmp`` and ``$HOME``, resource limits) as the ``bash``
tool, in a session of its own that the per-command kill spares. Its output is kept head and tail
(like ``bash``'s), read incrementally. At most ``MAX_BACKGROUND_SHELLS`` run at once, and every
one is killed when the episode ends (``SandboxedShell.close``), so none outlives its episode.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from typing import Any

from cuda_agent.agent.base import Tool, ToolError, ToolResult
from cuda_agent.agent.base import object_schema as _object
from cuda_agent.agent.config import ToolConfig
from cuda_agent.agent.shell import SandboxedShell, truncate_middle

MAX_BACKGROUND_SHELLS = 4
_READ_CHUNK = 1 << 16


@dataclass
class _Job:
    command: str
    process: asyncio.subprocess.Process
    unread: bytearray = field(default_factory=bytearray)
    dropped: int = 0
    reader: asyncio.Task | None = None


class BackgroundShells:
    """The background shells of one episode, by id (``bg1``, ``bg2``, ...)."""

    def __init__(self, shell: SandboxedShell, config: ToolConfig) -> None:
        self.shell, self.config = shell, config
        self.jobs: dict[str, _Job] = {}
        self._ids = itertools.count(1)

    async def start(self, command: str) -> str:
        running = [name for name, job in self.jobs.items() if job.process.returncode is None]
        if len(running) >= MAX_BACKGROUND_SHELLS:
            raise ToolError(f"{len(running)} background shells are running ({', '.join(running)}); "
                            "kill one with bash_kill first")
        process = await self.shell.spawn(command, own_session=True)
        self.shell.background_sessions.add(process.pid)
        name = f"bg{next(self._ids)}"
        job = _Job(command, process)
        job.reader = asyncio.create_task(self._drain(job))
        self.jobs[name] = job
        return name

    async def _drain(self, job: _Job) -> None:
        """Keep at most twice the output limit unread; older unread bytes are dropped (and counted)."""
        keep = 2 * self.config.max_output_chars
        while chunk := await job.process.stdout.read(_READ_CHUNK):
            job.unread += chunk
            if len(job.unread) > keep:
                job.dropped += len(job.unread) - keep
                del job.unread[: len(job.unread) - keep]
        await job.process.wait()

    def job(self, name: str) -> _Job:
        if name not in self.jobs:
            raise ToolError(f"no background shell {name!r}; started: {', '.join(self.jobs) or 'none'}")
        return self.jobs[name]

    def read(self, name: str) -> tuple[str, str]:
        """The output since the last read and the shell's status (``running`` or its exit)."""
        job = self.job(name)
        text = job.unread.decode(errors="replace")
        if job.dropped:
            text = f"[... {job.dropped} earlier bytes dropped ...]\n{text}"
        job.unread.clear()
        job.dropped = 0
        shown, _ = truncate_middle(text, self.config.max_output_chars)
        code = job.process.returncode
        return shown, "running" if code is None else f"exited with code {code}"

    async def kill(self, name: str) -> str:
        job = self.job(name)
        if job.process.returncode is not None:
            return f"exited with code {job.process.returncode}"
        await asyncio.to_thread(self.shell.kill_session, job.process.pid)
        await job.process.wait()
        return "killed"

    async def close(self) -> None:
        """Kill every background shell (the episode ended) and wait for their readers."""
        for name in list(self.jobs):
            await self.kill(name)
        for job in self.jobs.values():
            if job.reader is not None:
                await job.reader


_SHELL_ID = {"type": "string", "description": "The id bash_start returned, e.g. bg1."}


class BackgroundTool(Tool):
    """A tool over the episode's :class:`BackgroundShells`."""

    def __init__(self, shells: BackgroundShells) -> None:
        self.shells = shells


class BashStartTool(BackgroundTool):
    name = "bash_start"
    description = (f"Start a command in a background shell (sandboxed like bash; at most {MAX_BACKGROUND_SHELLS} at "
                   "once, all killed when the episode ends) and return its id at once; read its output with "
                   "bash_output, stop it with bash_kill.")
    parameters = _object(["command"], command={"type": "string", "description": "The command line (bash -c)."})

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        name = await self.shells.start(arguments["command"])
        return ToolResult(f"started background shell {name}", details={"shell": name})


class BashOutputTool(BackgroundTool):
    name = "bash_output"
    description = "Output of a background shell since the last bash_output, and whether it still runs."
    parameters = _object(["shell_id"], shell_id=_SHELL_ID)

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        await asyncio.sleep(0)  # let the reader take what the pipe holds
        output, status = self.shells.read(arguments["shell_id"])
        body = output.rstrip() or "[no new output]"
        return ToolResult(f"{body}\n[{arguments['shell_id']}: {status}]", details={"status": status})


class BashKillTool(BackgroundTool):
    name = "bash_kill"
    description = "Kill a background shell and everything it started."
    parameters = _object(["shell_id"], shell_id=_SHELL_ID)

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        status = await self.shells.kill(arguments["shell_id"])
        return ToolResult(f"{arguments['shell_id']}: {status}")
