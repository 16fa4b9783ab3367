"""The modules a task imports, imported ahead by the workers of slots started for later tasks.

A task built from ``transformers`` spends seconds in each worker importing its modeling code
(about 4 s per worker on an H200 host): the reference worker when it loads the task, the
candidate worker when it loads the candidate. Over a stream of tasks (a self-check, a dataset's
check, RL training) the same few modules come back, so a :class:`~cuda_agent.environment.slots.Prestarter`
learns them from the tasks it serves and its next slots import them while they wait, off the
verdict's path. Only modules named by task code (trusted) are imported; the candidate worker
imports the same ones anyway when it loads the task beside the candidate.
"""

from __future__ import annotations

import ast
import importlib
import sys

from cuda_agent.python_source import parse_source

MAX_MODULES = 32
"""A stream's learned set stops growing here: each module costs every later slot its import."""

_ALREADY_THERE = frozenset({"torch", "cuda_agent", "__future__"})


def modules_imported(code: str) -> tuple[str, ...]:
    """Absolute imports of ``code`` outside the standard library and torch, as importable names:
    ``import a.b`` and ``from a.b import c`` give ``a.b``; ``from a import c`` gives ``a`` and
    ``a.c`` (``c`` may be a submodule, or an attribute whose lookup loads one, as the lazy
    top-level packages of ``transformers`` do). Code that does not parse names nothing (its
    verdict reports why)."""
    try:
        tree = parse_source(code)
    except (SyntaxError, ValueError):
        return ()
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
            if "." not in node.module:
                names.extend(f"{node.module}.{alias.name}" for alias in node.names if alias.name != "*")
    top = {name.split(".")[0] for name in names}
    keep = top - _ALREADY_THERE - set(sys.stdlib_module_names)
    return tuple(dict.fromkeys(name for name in names if name.split(".")[0] in keep))


def import_ahead(names: list[str] | tuple[str, ...]) -> list[str]:
    """Import ``names`` in this worker (``a.b.c``: the module, else attribute ``c`` of ``a.b``).
    A name that does not import is skipped: the task's own import reports it when it loads."""
    done = []
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - not a module (an attribute), or missing: try the attribute
            parent, _, attribute = name.rpartition(".")
            try:
                getattr(importlib.import_module(parent), attribute)
            except Exception:  # noqa: BLE001 - reported by the task's own import, not here
                continue
        done.append(name)
    return done
