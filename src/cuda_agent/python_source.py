"""Parsing Python source into an AST, one thread at a time.

CPython 3.11 keeps the AST constructor's recursion counter in state shared by every thread of the
interpreter. A garbage collection during one ``ast.parse`` can run finalizers that switch to another
thread parsing too, and one of them then fails with ``SystemError: AST constructor recursion depth
mismatch`` (python/cpython#106905). Evaluations run side by side in threads (RL rollouts, pools,
the keep-warm evaluator) and parse tasks and solutions, and one rollout episode was lost that way in
CI. Every parse in this package goes through :func:`parse_source`, which holds a lock around it.
"""

from __future__ import annotations

import ast
import threading

_PARSING = threading.Lock()


def parse_source(source: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse(source, filename)``, serialised with every other parse in this process."""
    with _PARSING:
        return ast.parse(source, filename=filename)
