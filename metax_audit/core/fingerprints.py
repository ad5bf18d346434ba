# Finding identities that survive unrelated edits: a fingerprint from the rule, the path, the
# enclosing symbol and a normalized key of what the finding is about, never a line number.
"""A finding's id is `<rule>-<10 hex>` over (rule, path, enclosing symbol, key). The key is what
the check says the finding is about (the callee and keyword, the import, the flow's producer and
consumer); a check that gives none gets its message with line references and item counts taken
out, so inserting a line above moves nothing. Two findings with the same fingerprint in one run
(the same unresolved call twice in one function) are told apart by their order of appearance,
which unrelated edits do not change either (`disambiguate`).

The content hash is what the finding says (message and evidence, line references taken out): a
waiver records it, so a waived finding whose content changed (a new mismatch in the same flow)
is reported again, and a baseline uses it to tell an unchanged finding from a changed one."""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, Protocol, TypeVar


class _Placed(Protocol):
    @property
    def line(self) -> int: ...


class _Identified(Protocol):
    """What disambiguate reads of a finding (models.Finding; models imports this module, not the reverse)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def id(self) -> str: ...
    @property
    def message(self) -> str: ...
    @property
    def location(self) -> _Placed: ...


_F = TypeVar("_F", bound=_Identified)

# "line 1019", "lines 12-20", "(line 3)" -> "line N"; "a/b.py:304" -> "a/b.py"
_LINE_WORD = re.compile(r"\blines? \d+(?:\s*[-\u2013]\s*\d+)?")
_PATH_LINE = re.compile(r"(\.py|\.pyi|\.md|\.ya?ml|\.toml)(?::\d+)+")
# "15 call(s)", "6 place(s)": how many of a grouped item, which unrelated code changes
_COUNT = re.compile(r"\b\d+ (\w+)\(s\)")
_SPACE = re.compile(r"\s+")


@functools.lru_cache(maxsize=16384)
def normalize(text: str) -> str:
    """Text of a finding with what unrelated edits change (line numbers, group counts) taken out.
    Kept per text: a finding's content is hashed again after each dataclasses.replace (waivers, the
    baseline's marks) and for the baseline's own findings, whose texts are mostly the same (four
    regex passes per text were 0.13 s of a staged review's baseline comparison)."""
    text = _LINE_WORD.sub("line N", text)
    text = _PATH_LINE.sub(r"\1", text)
    text = _COUNT.sub(r"N \1(s)", text)
    return _SPACE.sub(" ", text).strip()


def fingerprint(rule: str, path: str, symbol: str, key: str) -> str:
    digest = hashlib.sha1(f"{rule}\x1f{path}\x1f{symbol}\x1f{key}".encode()).hexdigest()
    return f"{rule}-{digest[:10]}"


def finding_key(message: str, key: str = "") -> str:
    """The check's own key when it gave one, else the normalized message."""
    return normalize(key) if key else normalize(message)


def content_hash(message: str, evidence: Iterable[str]) -> str:
    """What the finding says: its message and evidence, line references normalized."""
    h = hashlib.sha1(normalize(message).encode())
    for item in evidence:
        h.update(b"\x1e")
        h.update(normalize(item).encode())
    return h.hexdigest()[:16]


def disambiguate(findings: Sequence[_F]) -> list[_F]:
    """Give the second and later findings sharing a fingerprint the suffix -2, -3, ... in the order
    of their place in the file (the order unrelated insertions above them keep)."""
    from dataclasses import replace

    groups: dict[str, list[int]] = {}
    for i, f in enumerate(findings):
        groups.setdefault(f.id, []).append(i)
    out = list(findings)
    for ids in groups.values():
        if len(ids) < 2:
            continue
        ordered = sorted(ids, key=lambda i: (findings[i].location.line, findings[i].message))
        for n, i in enumerate(ordered[1:], start=2):
            out[i] = replace(findings[i], id=f"{findings[i].id}-{n}")
    return out
