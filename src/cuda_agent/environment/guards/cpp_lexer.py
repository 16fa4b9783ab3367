"""A small C++/CUDA lexer for the static guards: comments removed, literals kept as single tokens.

Guards look at tokens, never at raw text, so a comment that mentions ``at::matmul`` or a string that
contains ``cudaStreamCreate`` is not code. Preprocessor directives are kept (marked ``directive``)
because ``#define`` bodies can rename forbidden identifiers.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from functools import cached_property

# Multi-character punctuators the guards need. ``<<`` / ``>>`` stay two tokens so that template
# brackets (``vector<vector<int>>``) and launch configurations (``<<<``) read the same way.
_PUNCT = ("::", "->", "##", "==", "!=", "<=", ">=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "&&", "||",
          "++", "--")
_PUNCT_RE = re.compile("|".join(re.escape(p) for p in _PUNCT))
_PUNCT_STARTS = frozenset(p[0] for p in _PUNCT)
_IDENT = re.compile(r"[A-Za-z_$\u0080-\U0010ffff][A-Za-z0-9_$\u0080-\U0010ffff]*")
_NUMBER = re.compile(r"\.?[0-9](?:[eEpP][+-]|'(?=[0-9A-Za-z_])|[A-Za-z0-9_.])*")
_STRING_PREFIX = re.compile(r"(?:u8|u|U|L)?R?(?=[\"'])")
_SPACE = re.compile(r"[ \t\f\v\r]+")
# Alternative tokens that matter to the guards: %: is #, %:%: is ##, <% %> are braces.
_DIGRAPHS = {"%:%:": "##", "%:": "#", "<%": "{", "%>": "}"}


@dataclass(frozen=True)
class Token:
    kind: str
    """``id`` (identifier or keyword), ``num``, ``str`` (string or character literal), ``punct``."""
    text: str
    """The token's text; for literals, the whole literal with its quotes."""
    line: int
    """1-based line in the lexed text."""
    directive: int = 0
    """1-based number of the preprocessor directive (``#define ...``) the token belongs to; 0 for code."""
    start: int = 0
    """Offset in the text, to tell adjacent tokens (``<<<``) from separated ones."""


@dataclass(frozen=True)
class CppSource:
    """C++/CUDA text to scan, and where its lines are in the solution (for messages)."""

    path: str
    """File shown in messages: a kernel file, or the Python file that embeds the source."""
    text: str
    line_offset: int = 0
    """Added to a line of ``text`` to give the line in ``path`` (embedded sources)."""
    lines: tuple[int, ...] = ()
    """Explicit line of ``path`` for each line of ``text`` (sources concatenated from pieces);
    empty means ``line_offset`` applies."""

    def where(self, line: int) -> str:
        """``path:line`` of line ``line`` (1-based) of ``text``."""
        if self.lines:
            return f"{self.path}:{self.lines[min(max(line, 1), len(self.lines)) - 1]}"
        return f"{self.path}:{self.line_offset + line}"

    @cached_property
    def tokens(self) -> tuple[Token, ...]:
        return tuple(tokenize(self.text))


def _skip_literal(text: str, i: int, quote: str) -> int:
    """Index just after the ordinary string or character literal whose opening quote is at ``i``."""
    n = len(text)
    j = i + 1
    while j < n:
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == quote or c == "\n":  # an unterminated literal ends at the line end
            return j + 1 if c == quote else j
        j += 1
    return n


def _skip_raw_string(text: str, i: int) -> int:
    """Index just after the raw string ``R"delim( ... )delim"`` whose quote is at ``i``."""
    open_paren = text.find("(", i + 1, i + 20)
    if open_paren < 0:
        return _skip_literal(text, i, '"')
    delimiter = text[i + 1:open_paren]
    end = text.find(")" + delimiter + '"', open_paren + 1)
    return len(text) if end < 0 else end + len(delimiter) + 2


def _splice(text: str) -> tuple[str, list[int]]:
    """``text`` with every backslash-newline removed (translation phase 2: ``at::mat\\<newline>mul`` is
    ``at::matmul``), and the offsets in the result where a line was joined."""
    if "\\\n" not in text and "\\\r\n" not in text:
        return text, []
    parts: list[str] = []
    joins: list[int] = []
    length = 0
    for k, piece in enumerate(re.split(r"(\\\r?\n)", text)):
        if k % 2:  # a separator: the backslash-newline itself
            joins.append(length)
        else:
            parts.append(piece)
            length += len(piece)
    return "".join(parts), joins


def tokenize(text: str) -> list[Token]:
    """Tokens of ``text``; never raises, whatever the input (unknown characters become punctuators)."""
    text, joins = _splice(text)
    newlines = [m.start() for m in re.finditer("\n", text)]

    def line_at(pos: int) -> int:
        return 1 + bisect_left(newlines, pos) + bisect_right(joins, pos)

    tokens: list[Token] = []
    n = len(text)
    i = 0
    at_line_start = True
    in_directive = False
    directives = 0
    while i < n:
        c = text[i]
        if c == "\n":
            i += 1
            at_line_start = True
            in_directive = False
            continue
        m = _SPACE.match(text, i)
        if m:
            i = m.end()
            continue
        if text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
            continue
        digraph = next((d for d in _DIGRAPHS if text.startswith(d, i)), None) if c in "%<" else None
        if (c == "#" or digraph == "%:") and at_line_start and not in_directive:
            in_directive = True
            directives += 1
        at_line_start = False
        d = directives if in_directive else 0
        line = line_at(i)
        if digraph is not None:
            tokens.append(Token("punct", _DIGRAPHS[digraph], line, d, i))
            i += len(digraph)
            continue
        prefix = _STRING_PREFIX.match(text, i) if c in "uULR\"'" else None
        if prefix is not None:
            quote_at = prefix.end()
            if "R" in prefix.group(0) and text[quote_at] == '"':
                stop = _skip_raw_string(text, quote_at)
            else:
                stop = _skip_literal(text, quote_at, text[quote_at])
            tokens.append(Token("str", text[i:stop], line, d, i))
            i = stop
            continue
        m = _IDENT.match(text, i)
        if m:
            tokens.append(Token("id", m.group(0), line, d, i))
            i = m.end()
            continue
        m = _NUMBER.match(text, i)
        if m:
            tokens.append(Token("num", m.group(0), line, d, i))
            i = m.end()
            continue
        m = _PUNCT_RE.match(text, i) if c in _PUNCT_STARTS else None
        p = m.group(0) if m else c
        tokens.append(Token("punct", p, line, d, i))
        i += len(p)
    return tokens
