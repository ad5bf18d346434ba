# Strings from the audited repo (file names, messages quoting its code) made safe for each output:
# control characters and bidirectional overrides shown as visible escapes, never passed through.
from __future__ import annotations

import re
from urllib.parse import quote

# C0 and C1 controls and DEL, plus the Unicode line separators and bidi controls ("Trojan Source").
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069\ufffe\uffff]")
_UNSAFE_BUT_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069\ufffe\uffff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str, *, lines: bool = False) -> str:
    """`text` with every control character written as a visible escape (ESC -> `\\x1b`); with
    `lines`, tab and newline are kept (multi-line evidence)."""
    return (_UNSAFE_BUT_LINES if lines else _UNSAFE).sub(_escape, text)


def uri(path: str) -> str:
    """A repo-relative path as a URI reference (SARIF artifactLocation.uri): percent-encoded."""
    return quote(path, safe="/")


ELLIPSIS = " ..."


def cut_words(text: str, budget: int) -> str:
    """`text` in at most `budget` characters, cut after a whole word (never inside a path or a
    name) and marked with ' ...'; a first word longer than the budget is kept whole."""
    text = " ".join(text.split())
    if len(text) <= budget:
        return text
    head = text[: max(budget - len(ELLIPSIS), 0) + 1]
    cut = head.rfind(" ")
    if cut <= 0:
        first = text.split(" ", 1)[0]
        return first + (ELLIPSIS if len(first) < len(text) else "")
    return text[:cut].rstrip() + ELLIPSIS
