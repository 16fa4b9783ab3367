"""Replay scripts for agent tests: the assistant turns of an agent that writes a known solution
(an example workdir), builds, verifies, profiles and finishes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"function": {"name": name, "arguments": arguments}}


def turn(content: str, *calls: dict[str, Any]) -> dict[str, Any]:
    return {"content": content, "tool_calls": list(calls)}


def solution_script(solution: Path) -> list[dict[str, Any]]:
    """Turns that write every file of the workdir solution ``solution``, then build, verify,
    profile and finish."""
    files = sorted(p for p in solution.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    writes = [call("write_file", path=str(p.relative_to(solution)), content=p.read_text()) for p in files]
    return [
        turn("I will read the reference and the skill guide first.", call("read_file", path="model.py"),
             call("bash", command="ls -la && head -20 SKILL.md")),
        turn("A fused single-pass kernel avoids the intermediate tensors. Writing it now.", *writes),
        turn("Build it.", call("bash", command="./build")),
        turn("Check correctness.", call("bash", command="./verify")),
        turn("Time it against PyTorch.", call("bash", command="./profile")),
        turn("Done.", call("finish", summary="fused kernel, verified and profiled")),
    ]


def write_script(path: Path, turns: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps(turns, indent=1))
    return path
