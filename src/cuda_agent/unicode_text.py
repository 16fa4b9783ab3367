"""Text that UTF-8 can encode. JSON can carry a lone surrogate (``"\\ud800"``) that Python decodes
into a ``str`` no file, database or HTTP response can hold as UTF-8: input with one is rejected,
output (a candidate's exception text) is mended."""

from __future__ import annotations


def is_unicode(text: str) -> bool:
    """False for text holding a lone surrogate."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def encodable_text(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD."""
    if is_unicode(text):
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
