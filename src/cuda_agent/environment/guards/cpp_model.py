"""What the static guards know about one C++/CUDA source, from its tokens.

``CppUnit`` splits the code tokens from the preprocessor directives, matches brackets, finds the
top-level function bodies (host or device code), and, per function, the variables that hold a
``torch::Tensor`` and the names that hold the current CUDA stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from cuda_agent.environment.guards.cpp_lexer import CppSource, Token
from cuda_agent.environment.guards.vocabulary import CPP_ROOTS, aten_compute_names

KEYWORDS = frozenset({
    "if", "for", "while", "switch", "return", "sizeof", "alignof", "decltype", "static_cast", "reinterpret_cast",
    "const_cast", "dynamic_cast", "defined", "__launch_bounds__", "catch", "new", "delete", "throw", "typeid",
    "noexcept", "static_assert", "alignas", "__attribute__", "__declspec", "asm", "__asm__", "__asm", "operator",
    "do", "else", "case", "default", "template", "typename", "using", "namespace", "volatile", "__align__",
})
TYPE_WORDS = frozenset({
    "Tensor", "auto", "const", "int", "float", "double", "char", "bool", "void", "long", "short", "unsigned",
    "signed", "size_t", "half", "__half", "scalar_t", "T", "TensorOptions", "IntArrayRef", "typename",
    "constexpr", "static", "inline", "volatile", "__restrict__", "dim3", "float4", "float2", "int4", "int2",
})
# Methods and functions whose result is a tensor (for `auto y = x.view(...)` and `x.contiguous() * 2`).
TENSOR_RETURNING = frozenset({
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like",
    "from_blob", "contiguous", "view", "reshape", "to", "cuda", "cpu", "clone", "transpose", "permute", "unsqueeze",
    "squeeze", "flatten", "narrow", "select", "slice", "expand", "t", "as_strided", "detach", "resize_", "copy_",
    "fill_", "zero_",
})
_FUNCTION_SUFFIX = frozenset({"const", "noexcept", "override", "final", "mutable", "volatile", "&", "&&"})
CURRENT_STREAM = frozenset({"getCurrentCUDAStream", "getDefaultCUDAStream", "cuda_agent_stream"})
"""Calls that give the current stream: torch's, and the launcher header's (the stream the shim
passes a launcher is the current stream of the tensors' device)."""


@dataclass
class Scope:
    """A top-level function (or lambda) body and its parameter list: tokens ``start``..``end``."""

    start: int
    end: int
    name: str
    device: bool
    tensors: set[str] = field(default_factory=set)
    current_streams: set[str] = field(default_factory=set)


class CppUnit:
    def __init__(self, source: CppSource) -> None:
        self.source = source
        self.tokens: list[Token] = [t for t in source.tokens if not t.directive]
        self.directives: list[list[Token]] = _directive_lines(source.tokens)
        self.match = _match_brackets(self.tokens)
        self.macros: dict[str, list[str]] = _object_macros(self.directives)
        """Object-like ``#define NAME body``: body token texts (to read ``<<<..., STREAM>>>``)."""
        self.aliases: dict[str, list[str]] = {}
        self.using_aten = False
        self.using_std = False
        """``using namespace std``: every ``std::`` name may appear without the prefix. (A
        using-declaration, ``using std::thread;``, names ``std::thread`` itself.)"""
        self._read_namespaces()
        self.scopes: list[Scope] = []
        self.scope_at: list[Scope | None] = [None] * len(self.tokens)
        self._find_scopes()
        for scope in self.scopes:
            self._read_declarations(scope)

    def where(self, token: Token) -> str:
        return self.source.where(token.line)

    def text(self, i: int) -> str:
        return self.tokens[i].text if 0 <= i < len(self.tokens) else ""

    def is_host(self, i: int) -> bool:
        scope = self.scope_at[i]
        return scope is None or not scope.device

    def is_std(self, i: int) -> bool:
        """Token ``i`` is ``std`` or a namespace alias of it."""
        return self.text(i) == "std" or self.aliases.get(self.text(i)) == ["std"]

    def names_a_variable(self, i: int) -> bool:
        """Token ``i``'s name is declared as a variable or parameter in the function around it or at
        file scope (``bool write = ...``, ``int signal;``): there it is that variable, not the C
        function of the same name."""
        scopes = self._variables.get(self.text(i), ())
        return None in scopes or self.scope_at[i] in scopes

    @cached_property
    def _variables(self) -> dict[str, list[Scope | None]]:
        def type_ends_at(k: int) -> bool:
            tok = self.tokens[k] if k >= 0 else None
            return tok is not None and (tok.text == ">" or (tok.kind == "id" and tok.text not in KEYWORDS))

        found: dict[str, list[Scope | None]] = {}
        for i, tok in enumerate(self.tokens):
            if tok.kind == "id" and self.text(i + 1) in ("=", ";", ",", ")", "[", "{") and (
                    type_ends_at(i - 1) or (self.text(i - 1) in ("*", "&", "&&") and type_ends_at(i - 2))):
                found.setdefault(tok.text, []).append(self.scope_at[i])
        return found

    def tensor_var(self, i: int) -> bool:
        scope = self.scope_at[i]
        tok = self.tokens[i]
        return scope is not None and tok.kind == "id" and tok.text in scope.tensors

    # -- namespaces --------------------------------------------------------------------------------
    def _read_namespaces(self) -> None:
        t = self.text
        for i, tok in enumerate(self.tokens):
            if tok.text == "namespace" and t(i - 1) == "using":
                root = t(i + 1) if t(i + 1) != "::" else t(i + 2)
                if root in CPP_ROOTS or root in self.aliases:
                    self.using_aten = True
                self.using_std |= self.chain(i + 1)[0] == ["std"]
            elif tok.text == "namespace" and t(i + 2) == "=" and self.tokens[i + 1].kind == "id":
                chain, _ = self.chain(i + 3)
                if chain:
                    self.aliases[t(i + 1)] = chain

    def chain(self, i: int) -> tuple[list[str], int]:
        """The ``a::b::c`` name starting at token ``i`` (a leading ``::`` is skipped) and the index of
        its last token; an alias of a namespace is expanded. Empty when ``i`` is not an identifier."""
        if self.text(i) == "::":
            i += 1
        if i >= len(self.tokens) or self.tokens[i].kind != "id":
            return [], i
        parts = list(self.aliases.get(self.text(i), [self.text(i)]))
        j = i
        while self.text(j + 1) == "::" and j + 2 < len(self.tokens) and self.tokens[j + 2].kind == "id":
            parts.append(self.text(j + 2))
            j += 2
        return parts, j

    def after_template_args(self, i: int) -> int:
        """Index after ``<...>`` starting at ``i`` (or ``i`` if there are none)."""
        if self.text(i) != "<":
            return i
        depth = 0
        for j in range(i, min(len(self.tokens), i + 64)):
            text = self.text(j)
            if text == "<":
                depth += 1
            elif text == ">":
                depth -= 1
                if depth == 0:
                    return j + 1
            elif text in (";", "{", "}"):
                break
        return i

    def is_call(self, last: int) -> bool:
        """The name ending at token ``last`` is called (``f(``, ``f<T>(``)."""
        return self.text(self.after_template_args(last + 1)) == "("

    def arguments(self, open_paren: int) -> list[list[int]]:
        """Token indices of each top-level argument of the call whose ``(`` is at ``open_paren``."""
        close = self.match.get(open_paren, -1)
        args: list[list[int]] = [[]]
        j = open_paren + 1
        while 0 < j < close:
            if self.text(j) == ",":
                args.append([])
            else:
                args[-1].append(j)
            j = self.match.get(j, j) + 1 if self.text(j) in ("(", "[", "{") else j + 1
        return [a for a in args if a]

    # -- functions ---------------------------------------------------------------------------------
    def _find_scopes(self) -> None:
        t = self.text
        i = 0
        while i < len(self.tokens):
            if t(i) == "{":
                j = i - 1
                while t(j) in _FUNCTION_SUFFIX:
                    j -= 1
                open_paren = self.match.get(j, -1) if t(j) == ")" else -1
                name_at = open_paren - 1
                if open_paren >= 0 and (t(name_at) == "]" or (self.tokens[name_at].kind == "id"
                                                              and t(name_at) not in KEYWORDS)):
                    end = self.match.get(i, len(self.tokens) - 1)
                    scope = Scope(open_paren, end, t(name_at), self._device_function(name_at))
                    self.scopes.append(scope)
                    for k in range(open_paren, end + 1):
                        self.scope_at[k] = scope
                    i = end + 1
                    continue
            i += 1

    def _device_function(self, name_at: int) -> bool:
        j = name_at - 1
        while j >= 0 and self.text(j) not in (";", "}", "{") and name_at - j < 64:
            if self.text(j) in ("__global__", "__device__"):
                return True
            j -= 1
        return False

    def defined_functions(self) -> set[str]:
        return {s.name for s in self.scopes}

    def _read_declarations(self, scope: Scope) -> None:
        t = self.text
        params_end = self.match.get(scope.start, scope.start)
        for i in range(scope.start, scope.end + 1):
            tok = self.tokens[i]
            if tok.kind != "id":
                continue
            if tok.text == "Tensor" and t(i + 1) not in ("::", ">", "(", "<"):
                j = i + 1
                while t(j) in ("const", "&", "&&", "*"):
                    j += 1
                if j < len(self.tokens) and self.tokens[j].kind == "id" and t(j + 1) in (",", ")", "=", ";", "{",
                                                                                         "(", "["):
                    scope.tensors.add(t(j))
            elif tok.text == "auto" or (t(i + 1) == "=" and t(i - 1) in (";", "{", "}", ")") and i > params_end):
                j = i + 1 if tok.text == "auto" else i
                while t(j) in ("&", "&&", "const", "*"):
                    j += 1
                if j < len(self.tokens) and self.tokens[j].kind == "id" and t(j + 1) == "=":
                    self._classify_initializer(scope, t(j), j + 2)
            elif params_end > i and t(i + 1) in (",", ")") and t(i - 1) not in (",", "("):
                if any(t(k) in ("cudaStream_t", "CUDAStream") for k in range(max(scope.start, i - 6), i)):
                    scope.current_streams.add(tok.text)  # a stream parameter: the caller's (best effort)
            if t(i + 1) == "=" and any(t(k) in ("cudaStream_t", "CUDAStream") for k in range(max(0, i - 6), i)):
                self._classify_initializer(scope, tok.text, i + 2)

    def _classify_initializer(self, scope: Scope, name: str, start: int) -> None:
        end = start
        depth = 0
        while end < len(self.tokens) and not (depth == 0 and self.text(end) in (";", ",", ")")):
            depth += self.text(end) in ("(", "[", "{")
            depth -= self.text(end) in (")", "]", "}")
            end += 1
        texts = [self.text(k) for k in range(start, end)]
        if CURRENT_STREAM & set(texts):
            scope.current_streams.add(name)
        called = [texts[k] for k in range(len(texts) - 1) if texts[k + 1] in ("(", "<")
                  and self.tokens[start + k].kind == "id"]
        root_is_tensor = texts and (texts[0] in scope.tensors or texts[0] in CPP_ROOTS)
        if root_is_tensor and called and (called[-1] in TENSOR_RETURNING or called[-1] in aten_compute_names()):
            scope.tensors.add(name)
        elif len(texts) == 1 and texts[0] in scope.tensors:
            scope.tensors.add(name)

    # -- expressions -------------------------------------------------------------------------------
    def tensor_expression_ends_at(self, i: int, depth: int = 0) -> bool:
        """Token ``i`` ends an expression that is a tensor: a tensor variable, or a call such as
        ``x.contiguous()`` / ``torch::empty(...)`` that returns one."""
        if depth > 8 or i < 0:
            return False
        if self.tokens[i].kind == "id":
            return self.tensor_var(i) and self.text(i - 1) not in (".", "->", "::")
        if self.text(i) != ")":
            return False
        open_paren = self.match.get(i, -1)
        callee = open_paren - 1
        if callee >= 0 and self.text(callee) == ">":  # f<T>(...)
            k = callee
            while k > 0 and self.text(k) != "<":
                k -= 1
            callee = k - 1
        if callee < 0 or self.tokens[callee].kind != "id" or self.text(callee) not in TENSOR_RETURNING:
            return False
        if self.text(callee - 1) in (".", "->"):
            return self.tensor_expression_ends_at(callee - 2, depth + 1)
        if self.text(callee - 1) == "::":
            return True
        return False


def _match_brackets(tokens: list[Token]) -> dict[int, int]:
    pairs = {")": "(", "]": "[", "}": "{"}
    stack: list[int] = []
    match: dict[int, int] = {}
    for i, tok in enumerate(tokens):
        if tok.kind != "punct":
            continue
        if tok.text in ("(", "[", "{"):
            stack.append(i)
        elif tok.text in pairs:
            while stack and tokens[stack[-1]].text != pairs[tok.text] and tok.text == "}":
                stack.pop()  # an unbalanced ( or [ inside a block: drop it
            if stack and tokens[stack[-1]].text == pairs[tok.text]:
                j = stack.pop()
                match[i] = j
                match[j] = i
    return match


def _object_macros(directives: list[list[Token]]) -> dict[str, list[str]]:
    macros: dict[str, list[str]] = {}
    for line in directives:
        if len(line) >= 3 and line[1].text == "define" and line[2].kind == "id":
            body = line[3:]
            function_like = body and body[0].text == "(" and body[0].start == line[2].start + len(line[2].text)
            if not function_like:
                macros[line[2].text] = [tok.text for tok in body]
    return macros


def _directive_lines(tokens: tuple[Token, ...]) -> list[list[Token]]:
    lines: dict[int, list[Token]] = {}
    for tok in tokens:
        if tok.directive:
            lines.setdefault(tok.directive, []).append(tok)
    return list(lines.values())
