"""Reading the C++/CUDA a candidate's Python file builds: ``load_inline`` / ``load`` arguments.

Source arguments are folded from literals (module-level constants, lists, ``+``, f-strings of
constants, ``textwrap.dedent``, ``"".join``, ``%`` / ``str.format`` / ``str.replace`` with constant
arguments); anything else is an ``unverifiable-source`` problem. Build flags are read too: ``-D``
becomes a ``#define`` to scan, flags that pull in unseen code are problems.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from cuda_agent.environment.guards.config import KNOWN_LIBRARIES
from cuda_agent.environment.guards.cpp_lexer import CppSource
from cuda_agent.environment.guards.python_model import PyModule

LOAD_INLINE = "torch.utils.cpp_extension.load_inline"
LOAD_FILES = "torch.utils.cpp_extension.load"
_SOURCE_KEYWORDS = {LOAD_INLINE: ("cpp_sources", "cuda_sources", "sycl_sources"), LOAD_FILES: ("sources",)}
_POSITIONAL = {LOAD_INLINE: ("name", "cpp_sources", "cuda_sources"), LOAD_FILES: ("name", "sources")}
_CFLAG_KEYWORDS = ("extra_cflags", "extra_cuda_cflags", "extra_sycl_cflags")
# Compiler flags that pull in code or tools the guards cannot see.
_HIDDEN_CODE_FLAGS = ("-include", "-imacros", "--pre-include", "--include-path", "-I", "-isystem", "-iquote",
                      "-idirafter", "-B", "-ccbin", "--compiler-bindir", "-fplugin", "-specs", "@", "-Wp,", "-load",
                      "-Xclang", "--output-directory", "-o")
_LINKABLE = {"c10", "c10_cuda", "torch", "torch_cpu", "torch_cuda", "torch_python", "cudart", "cuda", "m", "stdc++",
             "gomp"}
MIN_EMBEDDED_CPP_CHARS = 40
_CPP_MARKERS = ("#include", "__global__", "__device__", "torch::", "at::", "c10::", "<<<", "TORCH_CHECK",
                "PYBIND11_MODULE", "TORCH_LIBRARY", "#define")
_MAX_RESOLVE_DEPTH = 40
_PERCENT_FIELD = re.compile(r"%%|%(?:\([^)]*\))?[-#0 +]*(\*|\d*)(?:\.(\*|\d*))?")
_FORMAT_WIDTH = re.compile(r"\{[^{}]*:[^{}]*?(\d{4,})[^{}]*\}")
_MAX_FORMATTED_CHARS = 2_000_000


@dataclass
class LoadCall:
    """One ``load_inline`` / ``load`` call and what the guards could read of its arguments."""

    node: ast.Call
    function: str
    sources: list[CppSource] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """One line each: an argument that hides code from the guards (``unverifiable-source``)."""
    libraries: list[str] = field(default_factory=list)
    """Libraries linked with ``-l<name>`` in ``extra_ldflags``."""


class SourceReader:
    """Reads the load calls of one module (built once per ``PyModule.load_calls``)."""

    def __init__(self, module: PyModule) -> None:
        self.m = module
        self.load_calls = [self._load_call(node, fn) for node, fn in self._find_load_calls()]

    # -- load_inline / load ----------------------------------------------------------------------
    def _find_load_calls(self) -> list[tuple[ast.Call, str]]:
        found = []
        for node in self.m.nodes:
            if isinstance(node, ast.Call):
                qual = self.m.qualname(node.func)
                if qual in (LOAD_INLINE, LOAD_FILES):
                    found.append((node, qual))
        return found

    def _load_call(self, node: ast.Call, function: str) -> LoadCall:
        call = LoadCall(node, function)
        args: dict[str, ast.expr] = {}
        for i, arg in enumerate(node.args):
            if isinstance(arg, ast.Starred) or i >= len(_POSITIONAL[function]):
                call.problems.append(f"{self.m.where(node)}: pass {function.rsplit('.', 1)[1]}'s build options as "
                                     "keyword arguments with literal values")
                continue
            args[_POSITIONAL[function][i]] = arg
        for kw in node.keywords:
            if kw.arg is None:
                call.problems.append(f"{self.m.where(node)}: **kwargs hide {function.rsplit('.', 1)[1]}'s arguments; "
                                     "pass sources and flags as literal keyword arguments")
                continue
            args[kw.arg] = kw.value
        for name in _SOURCE_KEYWORDS[function]:
            if name in args:
                self._read_sources(call, name, args[name])
        for name in _CFLAG_KEYWORDS:
            if name in args:
                self._read_cflags(call, name, args[name])
        if "extra_ldflags" in args:
            self._read_ldflags(call, args["extra_ldflags"])
        if "extra_include_paths" in args and not _is_empty(args["extra_include_paths"]):
            call.problems.append(f"{self.m.where(node)}: extra_include_paths lets headers the guards cannot see into "
                                 "the build; keep all code in the scanned sources")
        return call

    def _read_sources(self, call: LoadCall, name: str, expr: ast.expr) -> None:
        items = self.resolve_strings(expr)
        if items is None:
            call.problems.append(f"{self.m.where(expr)}: {name} is not built from string literals, so the guards "
                                 "cannot read it; pass literal strings (or module-level constants)")
            return
        for pieces in items:
            if call.function == LOAD_FILES:
                self._read_source_file(call, "".join(text for text, _ in pieces), expr)
            else:
                call.sources.append(_join_pieces(self.m.path, pieces))

    def _read_source_file(self, call: LoadCall, relative: str, expr: ast.expr) -> None:
        if self.m.directory is None or self.m.root is None:
            call.problems.append(f"{self.m.where(expr)}: cannot read source file {relative!r}")
            return
        path = (self.m.directory / relative).resolve()
        try:
            path.relative_to(self.m.root.resolve() if self.m.root.is_dir() else self.m.root.resolve().parent)
            text = path.read_bytes().decode("utf-8", errors="replace")
        except (ValueError, OSError):
            call.problems.append(f"{self.m.where(expr)}: source file {relative!r} is not a readable file inside the "
                                 "solution; keep kernel sources in the solution directory")
            return
        call.sources.append(CppSource(relative, text))

    def _read_cflags(self, call: LoadCall, name: str, expr: ast.expr) -> None:
        flags = self._flat_strings(expr)
        if flags is None:
            call.problems.append(f"{self.m.where(expr)}: {name} is not a list of string literals; write the flags out")
            return
        defines = []
        pending_define = False
        for flag in flags:
            if pending_define:
                defines.append(flag)
                pending_define = False
            elif flag == "-D":
                pending_define = True
            elif flag.startswith("-D"):
                defines.append(flag[2:])
            elif any(flag.startswith(bad) for bad in _HIDDEN_CODE_FLAGS):
                call.problems.append(f"{self.m.where(expr)}: compiler flag {flag!r} in {name} brings in code or tools "
                                     "the guards cannot see; remove it")
        for define in defines:
            macro, _, value = define.partition("=")
            call.sources.append(CppSource(self.m.path, f"#define {macro} {value or '1'}\n",
                                          line_offset=getattr(expr, "lineno", 1) - 1))

    def _read_ldflags(self, call: LoadCall, expr: ast.expr) -> None:
        flags = self._flat_strings(expr)
        if flags is None:
            call.problems.append(f"{self.m.where(expr)}: extra_ldflags is not a list of string literals; write it out")
            return
        for flag in flags:
            if not flag.strip():
                continue
            if flag.startswith("-l") and len(flag) > 2:
                call.libraries.append(flag[2:])
                if flag[2:] in _LINKABLE:
                    continue
                if flag[2:] in KNOWN_LIBRARIES:
                    continue
            elif flag.startswith("-L") or flag in ("-O1", "-O2", "-O3", "-s"):
                continue
            call.problems.append(f"{self.m.where(expr)}: linker flag {flag!r} links code the guards cannot see; "
                                 "link only torch, the CUDA runtime and allowed vendor libraries")

    def _flat_strings(self, expr: ast.expr) -> list[str] | None:
        items = self.resolve_strings(expr)
        return None if items is None else ["".join(t for t, _ in pieces) for pieces in items]

    # -- constant folding of source strings -------------------------------------------------------
    def resolve_strings(self, expr: ast.expr, depth: int = 0) -> list[list[tuple[str, int]]] | None:
        """A string or a list/tuple of strings, each as ``(text, first line)`` pieces; None if any
        part is not a literal the guards can read."""
        if depth > _MAX_RESOLVE_DEPTH:
            return None
        if isinstance(expr, ast.Constant) and expr.value is None:
            return []
        if isinstance(expr, (ast.List, ast.Tuple)):
            out: list[list[tuple[str, int]]] = []
            for elt in expr.elts:
                sub = self.resolve_strings(elt, depth + 1)
                if sub is None:
                    return None
                out.extend(sub)
            return out
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            left = self.resolve_strings(expr.left, depth + 1)
            right = self.resolve_strings(expr.right, depth + 1)
            if left is None or right is None:
                return None
            if isinstance(self._deref(expr.left), (ast.List, ast.Tuple)):
                return left + right
            if len(left) == 1 and len(right) == 1:
                return [left[0] + right[0]]
            return None
        if isinstance(expr, ast.Name) and expr.id in self.m.constants and depth < _MAX_RESOLVE_DEPTH:
            return self.resolve_strings(self.m.constants[expr.id], depth + 1)
        text = self.resolve_text(expr, depth)
        return None if text is None else [text]

    def _deref(self, expr: ast.expr) -> ast.expr:
        for _ in range(_MAX_RESOLVE_DEPTH):
            if isinstance(expr, ast.Name) and expr.id in self.m.constants:
                expr = self.m.constants[expr.id]
            else:
                break
        return expr

    def resolve_text(self, expr: ast.expr, depth: int = 0) -> list[tuple[str, int]] | None:
        """One string as ``(text, first line)`` pieces, or None if it is not a readable literal."""
        if depth > _MAX_RESOLVE_DEPTH:
            return None
        line = getattr(expr, "lineno", 1)
        if isinstance(expr, ast.Constant):
            return [(expr.value, line)] if isinstance(expr.value, str) else None
        if isinstance(expr, ast.Name) and expr.id in self.m.constants:
            return self.resolve_text(self.m.constants[expr.id], depth + 1)
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            left = self.resolve_text(expr.left, depth + 1)
            right = self.resolve_text(expr.right, depth + 1)
            return None if left is None or right is None else left + right
        if isinstance(expr, ast.JoinedStr):
            pieces: list[tuple[str, int]] = []
            for value in expr.values:
                if isinstance(value, ast.FormattedValue):
                    inner = self._deref(value.value)
                    if value.format_spec is not None or not isinstance(inner, ast.Constant) \
                            or not isinstance(inner.value, (str, int, float)):
                        return None
                    pieces.append((str(inner.value), line))
                else:
                    sub = self.resolve_text(value, depth + 1)
                    if sub is None:
                        return None
                    pieces.extend(sub)
            return pieces
        if isinstance(expr, ast.Call) and len(expr.args) == 1 and not expr.keywords:
            qual = self.m.qualname(expr.func)
            if qual in ("textwrap.dedent", "inspect.cleandoc"):
                return self.resolve_text(expr.args[0], depth + 1)
            if (isinstance(expr.func, ast.Attribute) and expr.func.attr == "join"
                    and isinstance(expr.func.value, ast.Constant) and isinstance(expr.func.value.value, str)):
                items = self.resolve_strings(expr.args[0], depth + 1)
                if items is None:
                    return None
                joined: list[tuple[str, int]] = []
                for k, item in enumerate(items):
                    if k:
                        joined.append((expr.func.value.value, line))
                    joined.extend(item)
                return joined
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mod):
            values = self._constant_values(expr.right)
            return None if values is None else self._formatted(expr.left, line, depth, "%", values, {})
        if (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute)
                and expr.func.attr in ("format", "replace")):
            args = [self._constant_values(a) for a in expr.args]
            kwargs = {kw.arg: self._constant_values(kw.value) for kw in expr.keywords}
            if any(a is None or len(a) != 1 for a in args) or None in kwargs or any(
                    v is None or len(v) != 1 for v in kwargs.values()):
                return None
            positional = [a[0] for a in args]
            named = {k: v[0] for k, v in kwargs.items()}
            return self._formatted(expr.func.value, line, depth, expr.func.attr, positional, named)
        return None

    def _constant_values(self, expr: ast.expr) -> list[str | int | float] | None:
        """The constant(s) of a format argument: one literal (or module constant), or a tuple of them."""
        expr = self._deref(expr)
        items = expr.elts if isinstance(expr, ast.Tuple) else [expr]
        out = []
        for item in items:
            item = self._deref(item)
            if not (isinstance(item, ast.Constant) and isinstance(item.value, (str, int, float))) \
                    or isinstance(item.value, bool):
                return None
            out.append(item.value)
        return out

    def _formatted(self, template_expr: ast.expr, line: int, depth: int, method: str, args: list,
                   kwargs: dict) -> list[tuple[str, int]] | None:
        """``apply(template)`` for a literal template (``%``, ``str.format``, ``str.replace`` with
        constant arguments); None when the template is not literal or the result would be huge."""
        pieces = self.resolve_text(template_expr, depth + 1)
        if pieces is None:
            return None
        template = "".join(t for t, _ in pieces)
        if not _small_result(template, method, args):
            return None  # "%0999999999d" and friends: refuse to build enormous strings
        try:
            result = template % tuple(args) if method == "%" else getattr(template, method)(*args, **kwargs)
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError):
            return None
        if not isinstance(result, str):
            return None
        return [(result, pieces[0][1] if pieces else line)]

    # -- embedded C++ ------------------------------------------------------------------------------
    def embedded_cpp(self) -> list[CppSource]:
        """C++/CUDA the file carries: every ``load_inline`` source (and ``-D`` flag), plus every other
        long string literal that looks like C++ (sources handed over some other way)."""
        sources = [src for call in self.load_calls for src in call.sources]
        used = {id(n) for call in self.load_calls
                for arg in [*call.node.args, *(kw.value for kw in call.node.keywords)]
                for n in _reachable_constants(self.m, arg)}
        for node in self.m.nodes:
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in used
                    and id(node) not in self.m.docstrings and looks_like_cpp(node.value)):
                sources.append(CppSource(self.m.path, node.value, line_offset=getattr(node, "lineno", 1) - 1))
        return sources


def _small_result(template: str, method: str, args: list) -> bool:
    """Formatting ``template`` cannot produce more than ``_MAX_FORMATTED_CHARS`` characters."""
    if method == "%":
        for m in _PERCENT_FIELD.finditer(template):
            if m.group(0) != "%%" and any(g == "*" or (g and len(g) > 3) for g in m.groups()):
                return False
        return len(template) + sum(len(str(a)) for a in args) <= _MAX_FORMATTED_CHARS
    if method == "format":
        return not _FORMAT_WIDTH.search(template) and \
            len(template) * (1 + sum(len(str(a)) for a in args)) <= 50 * _MAX_FORMATTED_CHARS
    old, new = (str(args[0]), str(args[1])) if len(args) >= 2 else ("", "")
    count = template.count(old) if old else len(template) + 1
    return len(template) + count * len(new) <= _MAX_FORMATTED_CHARS


def looks_like_cpp(text: str) -> bool:
    if len(text) < MIN_EMBEDDED_CPP_CHARS:
        return False
    if any(marker in text for marker in _CPP_MARKERS):
        return True
    return all(ch in text for ch in "{};()")


def _reachable_constants(module: PyModule, expr: ast.expr, depth: int = 0) -> list[ast.AST]:
    """The literal nodes a load_inline argument is built from (through module-level names)."""
    if depth > _MAX_RESOLVE_DEPTH:
        return []
    out: list[ast.AST] = []
    for node in ast.walk(expr):
        out.append(node)
        if isinstance(node, ast.Name) and node.id in module.constants:
            out.extend(_reachable_constants(module, module.constants[node.id], depth + 1))
    return out


def _join_pieces(path: str, pieces: list[tuple[str, int]]) -> CppSource:
    text = "".join(t for t, _ in pieces)
    if len(pieces) == 1:
        return CppSource(path, text, line_offset=pieces[0][1] - 1)
    lines: list[int] = []
    for piece, first in pieces:
        n = piece.count("\n")
        if lines and piece:
            lines.extend(first + k for k in range(1, n + 1))  # the piece's first line joins the previous one
        else:
            lines.extend(first + k for k in range(n + 1))
    return CppSource(path, text, lines=tuple(lines) or (pieces[0][1],))


def _is_empty(expr: ast.expr) -> bool:
    return (isinstance(expr, ast.Constant) and expr.value is None) or \
        (isinstance(expr, (ast.List, ast.Tuple)) and not expr.elts)
