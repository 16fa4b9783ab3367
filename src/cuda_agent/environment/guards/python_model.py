"""What the static guards know about a candidate's Python file, from its AST alone.

The file is parsed, never imported. ``PyModule`` resolves names through the file's imports
(``F.relu`` is ``torch.nn.functional.relu``), lists its top-level classes and functions, and finds
the ``load_inline`` / ``load`` calls whose C++/CUDA sources the C++ guards must scan.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from cuda_agent.environment.guards.cpp_lexer import CppSource
from cuda_agent.python_source import parse_source

if TYPE_CHECKING:
    from cuda_agent.environment.guards.python_sources import LoadCall, SourceReader


def location(path: str, node: ast.AST) -> str:
    return f"{path}:{getattr(node, 'lineno', 0)}"


def snippet(node: ast.AST, limit: int = 48) -> str:
    """Short source text of ``node`` for messages (never raises)."""
    try:
        text = ast.unparse(node)
    except (RecursionError, ValueError, AttributeError, TypeError):
        return type(node).__name__
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class ImportRecord:
    node: ast.stmt
    module: str
    """The module named by the statement (``torch.nn`` for ``from torch.nn import functional``;
    leading dots for relative imports)."""
    bound: str
    """The local name the statement binds (``*`` for a star import)."""
    target: str
    """The qualified name bound (``torch.nn.functional``)."""


class PyModule:
    """A parsed candidate Python file. ``path`` is the name used in messages."""

    def __init__(self, path: str, tree: ast.Module, directory: Path | None = None, root: Path | None = None) -> None:
        self.path = path
        self.tree = tree
        self.nodes: list[ast.AST] = list(ast.walk(tree))
        """Every node of the tree, in ``ast.walk`` order (walked once, read by every rule)."""
        self.directory = directory
        self.root = root
        self.imports: list[ImportRecord] = []
        self.aliases: dict[str, str] = {}
        self.classes: dict[str, ast.ClassDef] = {}
        self.functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        self.constants: dict[str, ast.expr] = {}
        """Module-level names assigned exactly once, with their value expression."""
        self.assigned: set[str] = set()
        self.docstrings: set[int] = set()
        self._collect()

    # -- names -----------------------------------------------------------------------------------
    def where(self, node: ast.AST) -> str:
        return location(self.path, node)

    def qualname(self, node: ast.AST | None) -> str | None:
        """Fully qualified name of a ``Name`` / ``Attribute`` chain rooted at an import or alias,
        e.g. ``F.relu`` -> ``torch.nn.functional.relu``; None when the root is not imported."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id not in self.aliases:
            return None
        return ".".join([self.aliases[node.id], *reversed(parts)])

    @cached_property
    def references(self) -> list[tuple[ast.expr, str]]:
        """Every maximal ``Name`` / ``Attribute`` chain rooted at an import or alias, with its
        qualified name (``torch.cuda.Stream`` once, not also ``torch.cuda`` and ``torch``)."""
        inner = {id(n.value) for n in self.nodes if isinstance(n, ast.Attribute)}
        out = []
        for node in self.nodes:
            if isinstance(node, (ast.Name, ast.Attribute)) and id(node) not in inner:
                qual = self.qualname(node)
                if qual is not None:
                    out.append((node, qual))
        return out

    @cached_property
    def call_targets(self) -> list[tuple[ast.Call, str | None]]:
        """Every call with the qualified name of what it calls (None when not an imported name)."""
        return [(n, self.qualname(n.func)) for n in self.nodes if isinstance(n, ast.Call)]

    def is_builtin(self, node: ast.AST, name: str) -> bool:
        """``node`` is the bare name ``name`` and the module does not rebind it."""
        return (isinstance(node, ast.Name) and node.id == name and name not in self.aliases
                and name not in self.functions and name not in self.classes and name not in self.assigned)

    def _collect(self) -> None:
        for stmt in _top_level(self.tree.body):
            if isinstance(stmt, ast.Import):
                for a in stmt.names:
                    bound = a.asname or a.name.split(".")[0]
                    target = a.name if a.asname else a.name.split(".")[0]
                    self._add_import(ImportRecord(stmt, a.name, bound, target))
            elif isinstance(stmt, ast.ImportFrom):
                module = "." * stmt.level + (stmt.module or "")
                for a in stmt.names:
                    bound = a.asname or a.name
                    target = f"{module}.{a.name}" if not module.endswith(".") else module + a.name
                    self._add_import(ImportRecord(stmt, module, bound, target))
            elif isinstance(stmt, ast.ClassDef):
                self.classes[stmt.name] = stmt
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions[stmt.name] = stmt
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        self.assigned.add(target.id)
                        self.constants[target.id] = stmt.value
                        qual = self.qualname(stmt.value) if isinstance(stmt.value, (ast.Name, ast.Attribute)) else None
                        if qual is not None:
                            self.aliases[target.id] = qual
        # Nested imports (inside functions) bind names too; record them for the import rules.
        seen = {id(r.node) for r in self.imports}
        for node in self.nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in seen:
                for a in node.names:
                    module = a.name if isinstance(node, ast.Import) else "." * node.level + (node.module or "")
                    target = a.name if isinstance(node, ast.Import) else f"{module}.{a.name}"
                    self.imports.append(ImportRecord(node, module, a.asname or a.name.split(".")[0], target))
        for node in self.nodes:
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
                first = node.body[0]
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                    self.docstrings.add(id(first.value))
        # A name stored more than once at module level (``src += ...``, a loop, ``global`` in a
        # function) is not a constant the guards can read.
        stores: dict[str, int] = {}
        for stmt in self.tree.body:
            for node in _walk_module_level(stmt):
                if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                    stores[node.id] = stores.get(node.id, 0) + 1
        for node in self.nodes:
            if isinstance(node, ast.Global):
                for name in node.names:
                    stores[name] = stores.get(name, 0) + 2
        for name in list(self.constants):
            if stores.get(name, 0) > 1:
                del self.constants[name]

    def _add_import(self, record: ImportRecord) -> None:
        self.imports.append(record)
        if record.bound != "*":
            self.aliases[record.bound] = record.target

    @cached_property
    def _sources(self) -> SourceReader:
        from cuda_agent.environment.guards.python_sources import SourceReader  # it builds on this module

        return SourceReader(self)

    @property
    def load_calls(self) -> list[LoadCall]:
        """The module's ``load_inline`` / ``load`` calls and what could be read of their arguments."""
        return self._sources.load_calls

    def embedded_cpp(self) -> list[CppSource]:
        """C++/CUDA the file carries (``load_inline`` sources, ``-D`` flags, C++-looking literals)."""
        return self._sources.embedded_cpp()


def _walk_module_level(stmt: ast.stmt):
    """Nodes of a module-level statement, not descending into function or class bodies."""
    stack: list[ast.AST] = [stmt]
    while stack:
        node = stack.pop()
        yield node
        if node is not stmt and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        stack.extend(ast.iter_child_nodes(node))


def _top_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """Module statements, looking inside top-level ``if`` / ``try`` / ``with`` blocks."""
    out: list[ast.stmt] = []
    for stmt in body:
        out.append(stmt)
        if isinstance(stmt, ast.If):
            out.extend(_top_level(stmt.body + stmt.orelse))
        elif isinstance(stmt, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            out.extend(_top_level(stmt.body + stmt.orelse + stmt.finalbody))
            for handler in stmt.handlers:
                out.extend(_top_level(handler.body))
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            out.extend(_top_level(stmt.body))
    return out


def parse_python(path: str, text: str, directory: Path | None = None, root: Path | None = None) -> PyModule | str:
    """The parsed module, or a one-line reason why ``text`` is not valid Python."""
    try:
        tree = parse_source(text, filename=path)
    except SyntaxError as exc:
        return f"{path}:{exc.lineno or 0}: not valid Python ({exc.msg}); fix the syntax error"
    except (ValueError, RecursionError, MemoryError, OverflowError) as exc:
        return f"{path}:0: cannot be parsed as Python ({type(exc).__name__}: {str(exc)[:80]}); fix the file"
    return PyModule(path, tree, directory, root)
