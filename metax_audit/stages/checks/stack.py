# Shared pieces of the checks against the installed kernel stack (signature, kwargs, import,
# graph-capture, claim): the installed side of the evidence and the port's source lines.
# Imports no check (checks/__init__.py runs them), so the checks import it without a cycle.
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from metax_audit.core.models import CallableFact, CallSite, InstalledSignature, StackFacts, TraceResult
from metax_audit.core.pysource import file_stamp, parse_file

__all__ = ["build_note", "call_text", "calls_by_path", "checked_calls", "installed_calls", "installed_record", "installed_text", "parse_file", "short_callee", "source_line",
           "usable"]


def usable(fact: CallableFact | None) -> bool:
    """A fact we can check a call against: a known parameter list, however it was obtained."""
    return fact is not None and fact.status == "ok" and fact.params is not None


def installed_record(fact: CallableFact, facts: StackFacts) -> InstalledSignature:
    """The installed side of the evidence as a record: the callable, its signature, where it was read."""
    origin = fact.source
    if facts.source.startswith("manifest:"):
        origin += f" via {facts.source}"
    read_from: Literal["installed", "manifest", "public-base", "static"] = (
        "public-base" if fact.stand_in else "manifest" if facts.source.startswith("manifest:") or fact.source == "manifest"
        else "installed" if fact.source == "import" else "static")
    return InstalledSignature(fact.target, fact.signature or "", read_from, origin,
                              Path(fact.sourcefile).name if fact.sourcefile else "", fact.line or 0,
                              fact.distribution or "", fact.version or "")


def installed_text(fact: CallableFact, facts: StackFacts) -> str:
    """`module.qualname(signature)  [source, dist version]` - the installed side of the evidence."""
    return str(installed_record(fact, facts))


def build_note(fact: CallableFact) -> list[str]:
    """Say whether the installed distribution is a vendor build (a `+local` version label) or not."""
    if fact.stand_in:
        return [f"bound against the {fact.stand_in}: a vendor change to this API would not be seen"]
    if not fact.version:
        return []
    if "+" in fact.version:
        return [f"build: {fact.distribution} {fact.version} carries the local label +{fact.version.split('+', 1)[1]} (a vendor build)"]
    return [f"build: {fact.distribution} {fact.version} has no local version label: an upstream build; "
            "a vendor build may differ, so confirm against a manifest captured on the vendor stack"]


def _lines(path: str) -> tuple[str, ...]:
    return _read_lines(path, file_stamp(path))


@lru_cache(maxsize=512)
def _read_lines(path: str, stamp: tuple[int, int]) -> tuple[str, ...]:
    try:
        return tuple(Path(path).read_text(encoding="utf-8", errors="replace").splitlines())
    except OSError:
        return ()


def source_line(root: Path, rel: str, line: int) -> str:
    lines = _lines(str(root / rel))
    return lines[line - 1].strip() if 0 < line <= len(lines) else ""


def call_text(root: Path, call: CallSite) -> str:
    """`path:line: text` of the call as written in the snapshot (the port side of the evidence)."""
    text = source_line(root, call.location.path, call.location.line) or call.callee_text + "(...)"
    return f"call: {call.location}: {text}"


def checked_calls(trace: TraceResult) -> list[CallSite]:
    """Every call site once (backend chains and the file-wide list overlap)."""
    seen: dict[tuple[str, int, str, str | None], CallSite] = {}
    for call in [*trace.calls, *(c for b in trace.backends for c in b.calls)]:
        seen.setdefault((call.location.path, call.location.line, call.callee_text, call.resolved), call)
    return sorted(seen.values(), key=lambda c: (c.location.path, c.location.line, c.callee_text))


def installed_calls(root: Path, trace: TraceResult, facts: StackFacts, prefix: str = "") -> list[tuple[str, str]]:
    """Each call site with a fact, the installed side beside it: (call text, installed text), for the
    report's "call site vs installed kernel" table (prefix narrows it, e.g. "flashinfer.")."""
    out = []
    for call in checked_calls(trace):
        fact = facts.facts.get(call.resolved or "")
        if fact is None or not (call.resolved or "").startswith(prefix):
            continue
        installed = installed_text(fact, facts) if usable(fact) else f"installed: {fact.target} <{fact.status}: {fact.error or ''}>"
        out.append((call_text(root, call), installed))
    return out


def calls_by_path(trace: TraceResult | None) -> dict[str, list[CallSite]]:
    """Every call site once (same place, callee and target), grouped by repo-relative path."""
    out: dict[str, list[CallSite]] = {}
    if trace is None:
        return out
    seen = set()
    for c in (*trace.calls, *(c for b in trace.backends for c in b.calls)):
        key = (c.location, c.callee_text, c.resolved)
        if key not in seen:
            seen.add(key)
            out.setdefault(c.location.path, []).append(c)
    return out


def short_callee(callee: str) -> str:
    """`pkg.mod.Wrapper.run` -> `Wrapper.run`; `pkg.mod.func` -> `func`."""
    parts = callee.split(".")
    return ".".join(parts[-2:]) if len(parts) > 1 and parts[-2][:1].isupper() else parts[-1]
