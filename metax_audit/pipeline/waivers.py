# Accepted findings, kept in a YAML file with a reason and an optional expiry date. Waivers go
# stale loudly: an entry that matches nothing, or is past its date, becomes a finding itself.
# A generated entry names one finding by its fingerprint (`id`) and records what it said
# (`content`): when the finding says something else later, it is reported again. Hand-written
# entries without an id match by rule/category, path glob, symbol and message substring.
from __future__ import annotations

import fnmatch
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import date
from pathlib import Path
from typing import Any

from metax_audit.core import inputs
from metax_audit.core.config import yaml_error_line
from metax_audit.core.errors import ConfigError
from metax_audit.core.findings import make_finding, rule
from metax_audit.core.models import Category, Finding, Location, Severity

R_UNMATCHED = rule(
    "MXA210", Category.COVERAGE, Severity.WARNING,
    "waiver entry matches no finding",
    "The waivers file accepts a finding that this run did not produce: the code was fixed or moved, "
    "or the entry is mistyped. Delete the entry (or correct its rule/path/symbol).",
).id
R_EXPIRED = rule(
    "MXA211", Category.COVERAGE, Severity.WARNING,
    "waiver entry is past its expiry date",
    "The entry's `expires` date has passed, so it no longer suppresses anything. Fix the finding, "
    "or renew the entry with a new date and a current reason.",
).id

_KEYS = {"id", "content", "rule", "path", "symbol", "message", "reason", "expires"}


@dataclass(frozen=True)
class Waiver:
    rule: str  # rule id or category, fnmatch pattern ("MXA2*", "undeclared-difference")
    path: str  # fnmatch pattern on the repo-relative path
    symbol: str | None
    message: str | None  # substring of the finding message
    reason: str
    expires: date | None
    line: int  # where the entry starts in the waivers file
    id: str | None = None  # a finding's fingerprint: the entry accepts exactly that finding
    content: str | None = None  # the finding's content hash when it was accepted

    def matches(self, f: Finding) -> bool:
        if self.id is not None:
            return f.id == self.id
        if not (fnmatch.fnmatchcase(f.rule, self.rule) or fnmatch.fnmatchcase(f.category.value, self.rule)):
            return False
        if not fnmatch.fnmatchcase(f.location.path, self.path):
            return False
        if self.symbol is not None and not fnmatch.fnmatchcase(f.location.symbol, self.symbol):
            return False
        return self.message is None or self.message in f.message


def load_waivers(path: Path) -> list[Waiver]:
    """Parse the waivers file: a list of entries, or a mapping with a `waivers:` list."""
    try:
        return _load_waivers(path)
    except RecursionError:  # PyYAML composes and constructs one level per call
        raise ConfigError(f"waivers file {path}: nested too deeply to read") from None


def _load_waivers(path: Path) -> list[Waiver]:
    import yaml

    try:
        text = inputs.read_text(path)
    except OSError as exc:
        raise ConfigError(f"waivers file {path} cannot be read: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"waivers file {path} is not UTF-8 text (byte {exc.start})") from None
    try:
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        raise ConfigError(f"waivers file {path} is not valid YAML: {yaml_error_line(exc)}") from None
    except ValueError as exc:  # a value YAML itself cannot build, such as the date 2026-13-01
        raise ConfigError(f"waivers file {path}: {exc}") from None
    if data is None:
        return []
    items_node = node
    if isinstance(data, dict):
        data = data.get("waivers") or []
        items_node = next((v for k, v in node.value if k.value == "waivers"), None)  # type: ignore[union-attr]
    if not isinstance(data, list):
        raise ConfigError(f"waivers file {path}: expected a list of entries (or `waivers:` holding one)")
    lines = [n.start_mark.line + 1 for n in getattr(items_node, "value", [])] if items_node is not None else []
    return [_entry(item, path, lines[i] if i < len(lines) else 0) for i, item in enumerate(data)]


def _entry(item: Any, path: Path, line: int) -> Waiver:
    where = f"{path}:{line}"
    if not isinstance(item, dict):
        raise ConfigError(f"{where}: each waiver must be a mapping with rule, path and reason")
    unknown = set(item) - _KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown waiver key(s) {', '.join(sorted(map(str, unknown)))} (known: {', '.join(sorted(_KEYS))})")
    for key in ("rule", "reason") if item.get("id") is None else ("reason",):
        if not isinstance(item.get(key), str) or not item[key].strip():
            raise ConfigError(f"{where}: waiver needs a non-empty `{key}`")
    if isinstance(item.get("content"), int) and not isinstance(item["content"], bool) and len(str(item["content"])) == 16:
        item = {**item, "content": str(item["content"])}  # an unquoted all-digit hash (files generated before 0.x quoted it)
    for key in ("id", "content"):
        if item.get(key) is not None and (not isinstance(item[key], str) or not item[key].strip()):
            raise ConfigError(f"{where}: waiver `{key}` must be a non-empty string")
    expires = item.get("expires")
    if isinstance(expires, str):
        try:
            expires = date.fromisoformat(expires)
        except ValueError:
            raise ConfigError(f"{where}: expires must be YYYY-MM-DD, got {expires!r}") from None
    if expires is not None and not isinstance(expires, date):
        raise ConfigError(f"{where}: expires must be YYYY-MM-DD")
    return Waiver(
        rule=str(item.get("rule") or "*").strip(),
        path=str(item.get("path") or "*"),
        symbol=None if item.get("symbol") is None else str(item["symbol"]),
        message=None if item.get("message") is None else str(item["message"]),
        reason=item["reason"].strip(),
        expires=expires,
        line=line,
        id=None if item.get("id") is None else item["id"].strip(),
        content=None if item.get("content") is None else item["content"].strip(),
    )


def apply_waivers(findings: Sequence[Finding], waivers_path: Path | None, today: date) -> tuple[list[Finding], dict]:
    """Mark waived findings (waived=True, waiver_reason) and add findings for stale entries.

    An entry with a recorded `content` waives its finding only while the finding says the same
    thing; otherwise the finding stays active with the waiver named in its evidence (`changed`)."""
    if waivers_path is None:
        return list(findings), {"file": None, "entries": 0, "waived": 0, "unmatched": 0, "expired": 0, "changed": 0,
                                "by_rule": {}}
    entries = load_waivers(waivers_path)
    used: Counter[int] = Counter()
    out: list[Finding] = []
    by_rule: Counter[str] = Counter()
    active = [(i, w) for i, w in enumerate(entries) if w.expires is None or w.expires >= today]
    by_id = {w.id: (i, w) for i, w in active if w.id is not None}
    patterns = [(i, w) for i, w in active if w.id is None]
    changed = 0
    for f in findings:
        hit = by_id.get(f.id) or next(((i, w) for i, w in patterns if w.matches(f)), None)
        if hit is None or f.waived:
            out.append(f)
            continue
        used[hit[0]] += 1
        if hit[1].content is not None and hit[1].content != f.content:
            changed += 1
            out.append(replace(f, evidence=(
                *f.evidence, f"changed since waived at {waivers_path}:{hit[1].line} (content {hit[1].content} -> "
                f"{f.content}): reported again; the waiver's reason was: {hit[1].reason}")))
            continue
        by_rule[f.rule] += 1
        out.append(replace(f, waived=True, waiver_reason=hit[1].reason))
    unmatched = expired = 0
    for i, w in enumerate(entries):
        loc = Location(str(waivers_path), w.line, w.symbol or "")
        desc = (f"id={w.id} " if w.id else "") + f"rule={w.rule} path={w.path}" + (f" symbol={w.symbol}" if w.symbol else "") \
            + (f" message~{w.message!r}" if w.message and not w.id else "")
        if w.expires is not None and w.expires < today:
            expired += 1
            still = sum(1 for f in findings if w.matches(f))
            out.append(make_finding(R_EXPIRED, loc, f"waiver ({desc}) expired on {w.expires.isoformat()}",
                                    [f"{waivers_path}:{w.line}", f"reason was: {w.reason}", f"{still} finding(s) it would match are active again"],
                                    key=w.id or desc))
        elif used[i] == 0:
            unmatched += 1
            out.append(make_finding(R_UNMATCHED, loc, f"waiver ({desc}) matches no finding", [f"{waivers_path}:{w.line}", f"reason: {w.reason}"],
                                    key=w.id or desc))
    summary = {
        "file": str(waivers_path),
        "entries": len(entries),
        "waived": sum(by_rule.values()),
        "unmatched": unmatched,
        "expired": expired,
        "changed": changed,
        "by_rule": dict(sorted(by_rule.items())),
    }
    return out, summary


def generate_waivers(findings: Sequence[Finding]) -> str:
    """A starting waivers file: one entry per finding (every rule; ids are unique per review), each
    naming the finding's fingerprint and content and needing a real reason. Findings an existing
    file already waives keep their reason; entries for stale waivers are not written."""
    lines = [
        "# metax-audit waivers: each entry accepts the one finding whose fingerprint is `id`, while it",
        "# says what `content` hashes (a changed finding is reported again). rule/path/symbol/message",
        "# are for the reader. Replace every TODO reason; add `expires: YYYY-MM-DD` to make an entry",
        "# go stale. Entries that match nothing, or are past their date, become findings.",
        "waivers:",
    ]
    header = len(lines)
    seen: set[str] = set()
    for f in sorted(findings, key=lambda f: (f.location.path, f.location.line, f.rule, f.id)):
        if f.rule in {R_UNMATCHED, R_EXPIRED} or f.id in seen:
            continue
        seen.add(f.id)
        reason = f.waiver_reason if f.waived and f.waiver_reason else f"TODO: why this is accepted (line {f.location.line})"
        lines.append(f"  - id: {f.id}  # {f.category.value}, {f.severity.value}")
        lines.append(f"    content: {json.dumps(f.content)}")  # quoted: an all-digit hash would load as a number
        lines.append(f"    rule: {f.rule}")
        lines.append(f"    path: {json.dumps(f.location.path)}")
        if f.location.symbol:
            lines.append(f"    symbol: {json.dumps(f.location.symbol)}")
        lines.append(f"    message: {json.dumps(f.message[:80])}")
        lines.append(f"    reason: {json.dumps(reason)}")
        lines.append("    # expires: YYYY-MM-DD")
    if len(lines) == header:
        lines[-1] = "waivers: []"
    return "\n".join(lines) + "\n"
