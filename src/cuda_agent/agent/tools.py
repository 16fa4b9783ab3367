"""The coding tools: bash, read_file, write_file, edit_file, multi_edit, glob, grep, finish (and the
background shells of :mod:`cuda_agent.agent.background`).

File tools run in the trusted process and check every path with :meth:`Workdir.resolve` (inside
the workdir, symlinks followed, protected files read-only). Files they create are handed to the
sandbox uid so the agent's shell can edit them too. Every failure is a :class:`ToolError` whose
message tells the model what to do instead.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from pathlib import Path
from typing import Any

from cuda_agent.agent.background import BackgroundShells, BackgroundTool, BashKillTool, BashOutputTool, BashStartTool
from cuda_agent.agent.base import Tool, ToolError, ToolResult
from cuda_agent.agent.base import object_schema as _object
from cuda_agent.agent.config import ToolConfig
from cuda_agent.agent.shell import SandboxedShell, truncate_middle
from cuda_agent.agent.workdir import Workdir, WorkdirPathError

_JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict, "array": list}


def _string(description: str) -> dict[str, str]:
    return {"type": "string", "description": description}


class _FileTool(Tool):
    def __init__(self, workdir: Workdir, config: ToolConfig, owner_uid: int | None) -> None:
        self.workdir, self.config, self.owner_uid = workdir, config, owner_uid

    def _resolve(self, path: str, for_write: bool) -> Path:
        try:
            return self.workdir.resolve(path, for_write)
        except WorkdirPathError as exc:
            raise ToolError(str(exc)) from None

    def _relative(self, path: Path) -> str:
        return os.path.relpath(path, os.path.realpath(self.workdir.path))

    def _read_text(self, path: Path, display: str) -> str:
        if not path.is_file():
            raise ToolError(f"{display}: no such file (use glob to list files)")
        if path.stat().st_size > self.config.max_file_bytes:
            raise ToolError(f"{display}: larger than {self.config.max_file_bytes} bytes; use grep or bash (head, sed -n)")
        data = path.read_bytes()
        if b"\0" in data:
            raise ToolError(f"{display}: a binary file; inspect it with bash (e.g. xxd | head)")
        return data.decode(errors="replace")

    def _write_text(self, path: Path, display: str, text: str) -> None:
        data = text.encode()
        if len(data) > self.config.max_file_bytes:
            raise ToolError(f"{display}: {len(data)} bytes is over the {self.config.max_file_bytes}-byte limit")
        if path.is_dir():
            raise ToolError(f"{display}: is a directory")
        if path.exists() and path.stat().st_nlink > 1:
            raise ToolError(f"{display}: has other hard links; write a new file instead")
        created = [p for p in reversed(path.parents) if not p.exists()]
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        if self.owner_uid is not None:
            for item in [*created, path]:
                os.chown(item, self.owner_uid, self.owner_uid, follow_symlinks=False)


class BashTool(Tool):
    name = "bash"
    description = ("Run a bash command in the workdir (sandboxed: no network; processes it starts are killed when "
                   "it returns). Use it for ./build, ./verify, ./profile, ls, python, and the like. Output is "
                   "stdout and stderr together, truncated in the middle when long.")
    parameters = _object(["command"], command=_string("The command line, run with bash -c in the workdir."),
                         timeout_s={"type": "number", "description": "Time limit in seconds (default 300)."})

    def __init__(self, shell: SandboxedShell, config: ToolConfig) -> None:
        self.shell, self.config = shell, config

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        timeout_s = float(arguments.get("timeout_s") or self.config.bash_timeout_s)
        if not 0 < timeout_s <= self.config.max_bash_timeout_s:
            raise ToolError(f"timeout_s must be in (0, {self.config.max_bash_timeout_s:g}], got {timeout_s:g}")
        result = await self.shell.run(arguments["command"], timeout_s, self.config.max_output_chars)
        status = "timed out" if result.timed_out else f"exit code {result.exit_code}"
        output = f"{result.output.rstrip()}\n[{status}]" if result.output.strip() else f"[{status}, no output]"
        return ToolResult(output, ok=result.exit_code == 0, details={
            "exit_code": result.exit_code, "timed_out": result.timed_out,
            "truncated_chars": result.truncated_chars, "seconds": result.seconds})


class ReadFileTool(_FileTool):
    name = "read_file"
    description = "Read a text file of the workdir with line numbers, optionally only lines start_line..end_line."
    parameters = _object(["path"], path=_string("Path relative to the workdir."),
                         start_line={"type": "integer", "description": "First line to show (1-based)."},
                         end_line={"type": "integer", "description": "Last line to show (inclusive)."})

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        display = arguments["path"]
        lines = self._read_text(self._resolve(display, for_write=False), display).splitlines()
        start = int(arguments.get("start_line") or 1)
        end = int(arguments.get("end_line") or len(lines))
        if lines and start > len(lines):
            raise ToolError(f"{display} has {len(lines)} lines; start_line {start} is past the end")
        if start < 1 or end < start:
            raise ToolError(f"invalid line range {start}..{end}; lines are numbered from 1 and end_line >= start_line")
        shown = "\n".join(f"{n:6d}\t{line}" for n, line in enumerate(lines[start - 1:end], start=start))
        text, cut = truncate_middle(shown, self.config.max_output_chars)
        header = f"{display}: lines {start}-{min(end, len(lines))} of {len(lines)}"
        return ToolResult(f"{header}\n{text}" if lines else f"{display}: empty file", details={"truncated_chars": cut})


class WriteFileTool(_FileTool):
    name = "write_file"
    description = ("Create or overwrite a file in the workdir with the given content (parent folders are created). "
                   "model.py, SKILL.md and the build/verify/profile commands are read-only.")
    parameters = _object(["path", "content"], path=_string("Path relative to the workdir, e.g. kernels/relu.cu."),
                         content=_string("The complete new file content."))

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        display = arguments["path"]
        path = self._resolve(display, for_write=True)
        self._write_text(path, display, arguments["content"])
        return ToolResult(f"wrote {len(arguments['content'].encode())} bytes to {self._relative(path)}")


class EditFileTool(_FileTool):
    name = "edit_file"
    description = ("Replace an exact string in a workdir file. old_string must occur exactly once (include enough "
                   "surrounding lines to make it unique), unless replace_all is true.")
    parameters = _object(["path", "old_string", "new_string"], path=_string("Path relative to the workdir."),
                         old_string=_string("The exact text to replace, whitespace included."),
                         new_string=_string("The replacement text."),
                         replace_all={"type": "boolean", "description": "Replace every occurrence (default false)."})

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        display = arguments["path"]
        path = self._resolve(display, for_write=True)
        text, count = replace_exact(self._read_text(path, display), display, arguments)
        self._write_text(path, display, text)
        return ToolResult(f"replaced {count} occurrence(s) in {self._relative(path)}")


def replace_exact(text: str, display: str, edit: dict[str, Any]) -> tuple[str, int]:
    """``text`` with ``edit["old_string"]`` replaced by ``edit["new_string"]`` (once, or every
    occurrence with ``replace_all``), and how many were replaced.

    Raises:
        ToolError: old_string is empty, missing, or not unique without ``replace_all``.
    """
    old, new = edit["old_string"], edit["new_string"]
    if not old:
        raise ToolError("old_string is empty; to write a whole file use write_file")
    count = text.count(old)
    if count == 0:
        raise ToolError(f"{display}: old_string not found; read_file the current text and copy it exactly "
                        "(whitespace and indentation included)")
    if count > 1 and not edit.get("replace_all"):
        lines = [text.count("\n", 0, m.start()) + 1 for m in re.finditer(re.escape(old), text)]
        raise ToolError(f"{display}: old_string occurs {count} times (lines {', '.join(map(str, lines[:10]))}); "
                        "include more surrounding text to make it unique, or set replace_all")
    return text.replace(old, new), count if edit.get("replace_all") else 1


class MultiEditTool(_FileTool):
    name = "multi_edit"
    description = ("Apply several exact-string replacements to one workdir file, in order, each on the result of "
                   "the previous one; all or nothing (if one fails, the file is unchanged).")
    parameters = _object(["path", "edits"], path=_string("Path relative to the workdir."),
                         edits={"type": "array", "description": "The replacements, applied in order.",
                                "items": _object(["old_string", "new_string"],
                                                 old_string=_string("The exact text to replace."),
                                                 new_string=_string("The replacement text."),
                                                 replace_all={"type": "boolean",
                                                              "description": "Replace every occurrence."})})

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        display, edits = arguments["path"], arguments["edits"]
        if not edits:
            raise ToolError("edits is empty; give at least one {old_string, new_string}")
        path = self._resolve(display, for_write=True)
        text, total = self._read_text(path, display), 0
        for number, edit in enumerate(edits, start=1):
            try:
                check_arguments(self.parameters["properties"]["edits"]["items"], edit, f"edit {number}")
                text, count = replace_exact(text, display, edit)
            except ToolError as exc:
                raise ToolError(f"edit {number} of {len(edits)}: {exc} (no edit was applied)") from None
            total += count
        self._write_text(path, display, text)
        return ToolResult(f"applied {len(edits)} edit(s), {total} replacement(s), to {self._relative(path)}")


class GlobTool(_FileTool):
    name = "glob"
    description = "List workdir paths matching a glob pattern, e.g. '**/*.cu' or 'kernels/*'."
    parameters = _object(["pattern"], pattern=_string("Glob pattern relative to the workdir ('**' recurses)."))

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        pattern = arguments["pattern"]
        if pattern.startswith("/") or ".." in Path(pattern).parts:
            raise ToolError(f"{pattern}: patterns are relative to the workdir and may not contain '..'")
        regex = glob_regex(pattern)
        matches = [p for p in walk_workdir(self.workdir.path) if regex.fullmatch(p)]
        shown = matches[: self.config.max_matches]
        more = f"\n[... {len(matches) - len(shown)} more]" if len(matches) > len(shown) else ""
        return ToolResult("\n".join(shown) + more if shown else f"no paths match {pattern}")


class GrepTool(_FileTool):
    name = "grep"
    description = "Search workdir text files for a regular expression (Python syntax); prints path:line: text."
    parameters = _object(["pattern"], pattern=_string("Regular expression."),
                         path=_string("File or folder to search, relative to the workdir (default: all)."),
                         glob=_string("Only files whose name matches this glob, e.g. '*.cu'."))

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        try:
            regex = re.compile(arguments["pattern"])
        except re.error as exc:
            raise ToolError(f"invalid regular expression {arguments['pattern']!r}: {exc}") from None
        root = self._resolve(arguments.get("path") or ".", for_write=False)
        files = [root] if root.is_file() else [root / p for p in walk_workdir(root) if (root / p).is_file()]
        name_glob = arguments.get("glob")
        hits: list[str] = []
        for path in files:
            if (name_glob and not fnmatch.fnmatch(path.name, name_glob)) or not self._searchable(path):
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
                if regex.search(line):
                    hits.append(f"{self._relative(path)}:{number}: {line[:300]}")
        shown = hits[: self.config.max_matches]
        more = f"\n[... {len(hits) - len(shown)} more matches]" if len(hits) > len(shown) else ""
        return ToolResult("\n".join(shown) + more if shown else "no matches")

    def _searchable(self, path: Path) -> bool:
        try:
            resolved = self.workdir.resolve(str(path), for_write=False)
        except WorkdirPathError:
            return False
        if resolved.stat().st_size > self.config.max_file_bytes:
            return False
        with open(resolved, "rb") as handle:
            return b"\0" not in handle.read(4096)


class FinishTool(Tool):
    name = "finish"
    description = ("End the episode. The evaluator then scores the workdir as it is (model_new.py and kernels/), "
                   "whatever earlier commands printed.")
    parameters = _object(["summary"], summary=_string("What you implemented and the last ./profile result."))

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        return ToolResult("episode finished; the evaluator now scores the workdir", finish=True,
                          details={"summary": arguments["summary"]})


class ToolBox:
    """The tools of one episode, by name; checks arguments against each schema before a call."""

    def __init__(self, tools: list[Tool], background: BackgroundShells | None = None) -> None:
        self.tools = {tool.name: tool for tool in tools}
        self.background = background

    async def aclose(self) -> None:
        """Kill what the tools left running (background shells) at the end of the episode."""
        if self.background is not None:
            await self.background.close()

    def schemas(self) -> list[dict[str, Any]]:
        return [tool.schema() for tool in self.tools.values()]

    async def call(self, name: str, arguments: str) -> ToolResult:
        """Run tool ``name`` with JSON ``arguments``; every problem comes back as a failed result."""
        tool = self.tools.get(name)
        if tool is None:
            return ToolResult(f"unknown tool {name!r}; available: {', '.join(self.tools)}", ok=False)
        try:
            parsed = json.loads(arguments or "{}")
            check_arguments(tool.parameters, parsed, name)
            return await tool.run(parsed)
        except json.JSONDecodeError as exc:
            return ToolResult(f"{name}: arguments are not valid JSON ({exc}); send one JSON object", ok=False)
        except ToolError as exc:
            return ToolResult(f"{name}: {exc}", ok=False)
        except OSError as exc:
            return ToolResult(f"{name}: {exc.strerror or exc}", ok=False)


def walk_workdir(root: Path, max_entries: int = 20000) -> list[str]:
    """Paths under ``root`` relative to it, sorted, symlinked folders not entered, at most ``max_entries``."""
    found: list[str] = []
    for directory, subdirs, files in os.walk(root):
        subdirs.sort()
        relative = os.path.relpath(directory, root)
        for name in [*subdirs, *files]:
            found.append(name if relative == "." else f"{relative}/{name}")
        if len(found) >= max_entries:
            break
    return sorted(found[:max_entries])


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A glob with ``**`` (any depth), ``*`` and ``?`` (within one path part) as a regex."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        else:
            char = pattern[i]
            out.append("[^/]*" if char == "*" else "[^/]" if char == "?" else re.escape(char))
            i += 1
    return re.compile("".join(out))


def check_arguments(schema: dict[str, Any], arguments: Any, name: str) -> None:
    """Check parsed ``arguments`` against a tool's JSON ``schema`` (what :class:`ToolBox` accepts;
    the trainer's RFT filter uses it to find invalid calls in recorded trajectories).

    Raises:
        ToolError: not an object, missing or unknown keys, or a value of the wrong type.
    """
    if not isinstance(arguments, dict):
        raise ToolError(f"arguments must be a JSON object, got {type(arguments).__name__}")
    properties = schema["properties"]
    missing = [key for key in schema["required"] if key not in arguments]
    unknown = [key for key in arguments if key not in properties]
    if missing or unknown:
        raise ToolError(f"missing {missing} / unknown {unknown} arguments; {name} takes {sorted(properties)} "
                        f"(required: {schema['required']})")
    for key, value in arguments.items():
        expected = _JSON_TYPES[properties[key]["type"]]
        if value is not None and (not isinstance(value, expected) or (isinstance(value, bool) and expected is not bool)):
            raise ToolError(f"argument {key!r} must be a {properties[key]['type']}, got {type(value).__name__}")


EPISODE_TOOLS: tuple[type[Tool], ...] = (BashTool, ReadFileTool, WriteFileTool, EditFileTool, GlobTool, GrepTool,
                                         FinishTool)
"""The standard tool set (workdir style ``default``), in the order the policy sees it."""
PAPER_TOOLS: tuple[type[Tool], ...] = (BashTool, BashStartTool, BashOutputTool, BashKillTool, ReadFileTool,
                                       WriteFileTool, EditFileTool, MultiEditTool, GlobTool, GrepTool, FinishTool)
"""The paper's tool set (workdir style ``paper``): Bash, background shells, Read, Write, Edit,
MultiEdit, Glob, Grep, plus finish to end the episode."""
TOOL_SETS = {"default": EPISODE_TOOLS, "paper": PAPER_TOOLS}


def episode_tool_schemas(style: str = "default") -> list[dict[str, Any]]:
    """The schemas an episode of workdir style ``style`` offers (its first prompt lists them)."""
    return [tool.schema() for tool in TOOL_SETS[style]]


def episode_tools(workdir: Workdir, shell: SandboxedShell, config: ToolConfig, style: str = "default") -> ToolBox:
    """The tool set of an episode of workdir style ``style``."""
    background = BackgroundShells(shell, config)

    def make(tool: type[Tool]) -> Tool:
        if issubclass(tool, _FileTool):
            return tool(workdir, config, shell.uid)
        if issubclass(tool, BackgroundTool):
            return tool(background)
        return BashTool(shell, config) if tool is BashTool else tool()

    tools = [make(tool) for tool in TOOL_SETS[style]]
    return ToolBox(tools, background if any(isinstance(t, BackgroundTool) for t in tools) else None)
