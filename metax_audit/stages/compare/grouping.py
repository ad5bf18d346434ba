# Differences to findings: one finding per root cause (the hunks of one function, one upstream edit
# missed in several functions, the members dropped at one place).
from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import replace

from metax_audit.core.findings import make_finding
from metax_audit.core.models import Difference, Finding, Location, Severity, Site
from metax_audit.stages.compare.consequence import lead_rank
from metax_audit.stages.compare.counterparts import FileCounterpart
from metax_audit.stages.compare.rules import _ABSENT, R_ARCH, R_DRIFT, R_DRIFT_TAKEN, R_UNDECLARED
from metax_audit.stages.compare.side import _Env, _short


def _group_key(d: Difference) -> tuple[object, ...]:
    """Differences a maintainer handles as one: the hunks of one function (or one member), the members
    dropped at one place. Declared drift and capability checks stand alone with their declaration."""
    if d.declared:
        return (id(d),)
    if d.kind in {"removed", "class-attribute"} and d.detail.endswith(_ABSENT):
        return ("absent", d.line)
    if d.kind == "vendor-kernel-import":  # one swap of a kernel package, however many statements import from it
        return ("kernel-import", d.detail.split(" from ", 1)[-1].split(".")[0].split(" ")[0])
    return ("fn", d.symbol)


def _grouped(diffs: Iterable[Difference]) -> list[list[Difference]]:
    groups: dict[tuple[object, ...], list[Difference]] = {}
    for d in diffs:
        groups.setdefault(_group_key(d), []).append(d)
    return list(groups.values())


def _absent_symbol(group: list[Difference]) -> str:
    symbols = [d.symbol for d in group]
    owners = {s.rsplit(".", 1)[0] for s in symbols if "." in s}
    return owners.pop() if len(owners) == 1 and all("." in s for s in symbols) else ", ".join(symbols)


def _summary(group: list[Difference], what: str) -> tuple[Difference, str]:
    """The difference a group is reported at (its first that may change a kernel) and the message."""
    lead = next((d for d in group if not d.note and not d.declared), group[0])
    if len(group) == 1:
        return lead, ""
    if all(d.detail.endswith(_ABSENT) for d in group):
        return replace(group[0], symbol=_absent_symbol(group)), f"{len(group)} upstream members are absent from the port here: " + "; ".join(
            d.detail.removeprefix("upstream ").removesuffix(" is absent from the port").removesuffix(" has no port counterpart") for d in group)
    symbols = sorted({d.symbol for d in group})
    where = lead.symbol if len(symbols) == 1 else f"{len(symbols)} functions ({', '.join(symbols)})"
    if all(d.kind.endswith("-import") for d in group):
        what, where = "import statements", f"{lead.path} from one kernel package"
    return lead, f"{len(group)} {what} in {where}; at line {lead.line}: "


def _verdict(d: Difference) -> str:
    return f"info: {d.note}" if d.note else ("declared: " + d.reason if d.declared else "")


def hunk_site(d: Difference, upstream_path: str | None) -> Site:
    """The typed record of one hunk (what the evidence line below renders)."""
    return Site(d.path, d.line, d.symbol, d.kind, _short(d.detail, 200), _verdict(d),
                f"{upstream_path}:{d.upstream_line}" if upstream_path and d.upstream_line else "", d.change, d.keywords)


def hunk_line(s: Site) -> str:
    """One hunk as an evidence line: "<path>:<line> [<kind>] <detail> -- <verdict>"."""
    return f"{s.path}:{s.line} [{s.kind}] {s.detail} -- {s.verdict or 'may change what a kernel computes or whether it runs'}"


def _hunk_line(d: Difference) -> str:
    return hunk_line(hunk_site(d, None))


def _attribution(group: list[Difference], env: _Env) -> str:
    kinds = {d.attribution for d in group}
    target = f"{env.target or '?'}"
    if kinds == {"inherited"}:
        return f"attribution: inherited from upstream {target}, also present there"
    parts = []
    if "drift" in kinds:
        parts.append(f"drift: the port keeps the {env.base or 'base'} form where upstream {target} changed it")
    if "port-only" in kinds:
        why = "upstream did not change this file since the base" if env.base_state == "same" else f"differs from both {env.base} and {target}"
        parts.append(f"port-only change ({why})")
    if "" in kinds and env.base_state == "none":
        parts.append("drift not separated from the port's own changes (no --base)")
    return "attribution: " + "; ".join(parts) if parts else ""


_EDIT = re.compile(r"differs at (\.\.\.[^\[]{12,}\[upstream: [^|]+\| port: [^\]]*\])")


_KV_LAYOUT_HOOKS = frozenset({"get_kv_cache_shape", "get_kv_cache_stride_order"})


def _same_edit(groups: list[list[Difference]]) -> list[list[Difference]]:
    """Functions where the port misses the same upstream edit (the same text changed the same way) are one
    root cause: their groups merge into the first one."""
    out: list[list[Difference]] = []
    by_edit: dict[str, list[Difference]] = {}
    for group in groups:
        edits = {m.group(1) for d in group if not d.declared and not d.note for m in [_EDIT.search(d.detail)] if m}
        # A backend's KV-cache shape and stride order describe one layout (the order permutes the shape).
        edits |= {f"kv-cache layout of {d.symbol.rsplit('.', 1)[0]}" for d in group if not d.declared and not d.note
                  and d.symbol.rsplit(".", 1)[-1] in _KV_LAYOUT_HOOKS}
        target = next((by_edit[e] for e in sorted(edits) if e in by_edit), None)
        if target is not None:
            target.extend(group)
            continue
        out.append(group)
        for e in edits:
            by_edit[e] = group
    return out


def _severity(group: list[Difference]) -> Severity:
    return Severity.INFO if all(d.note or d.declared for d in group) else Severity.WARNING


_RULE_OF = {"upstream-not-followed": R_DRIFT, "arch-check": R_ARCH}


_WHAT = {R_DRIFT: "upstream changes not followed", R_ARCH: "capability checks", R_UNDECLARED: "undeclared differences"}


def _comparison_findings(diffs: list[Difference], drift: list[Difference], cp: FileCounterpart, env: _Env) -> Iterator[Finding]:
    """One finding per root cause: the undeclared hunks of one function (differences, capability checks and
    upstream changes not followed) are one finding, reported under the rule of its most consequential hunk;
    one upstream edit missed in several functions is one finding. Declared checks and drift stand alone."""
    undeclared = [d for d in diffs if not d.declared and d.kind not in {"cosmetic", "upstream-followed", "upstream-not-followed"}]
    not_followed = [d for d in drift if d.kind == "upstream-not-followed"]
    for group in _same_edit(_grouped(undeclared + [d for d in not_followed if not d.declared])):
        yield _unit_finding(group, cp, env)
    versions = f"{env.base or '?'} -> {env.target or '?'}"
    for d in [d for d in diffs if d.kind == "arch-check" and d.declared] + [d for d in not_followed if d.declared]:
        rule_id = _RULE_OF[d.kind]
        where = (f"upstream {cp.upstream_path}:{d.upstream_line} ({versions})" if rule_id == R_DRIFT
                 else f"upstream {cp.upstream_path}:{d.upstream_line}" if d.upstream_line else f"upstream {cp.upstream_path}")
        yield make_finding(rule_id, Location(d.path, d.line, d.symbol), _short(f"{d.symbol}: {d.detail}", 700),
                           [where, f"port {d.path}:{d.line}", _hunk_line(d), f"declared: {d.reason}"], severity=Severity.INFO,
                           sites=[hunk_site(d, cp.upstream_path)])
    for group in _grouped(d for d in drift if d.kind == "upstream-followed"):
        lead, head = _summary(group, "upstream changes followed")
        yield make_finding(R_DRIFT_TAKEN, Location(lead.path, lead.line, lead.symbol), _short(head + lead.detail if head else lead.detail, 700),
                           [f"upstream {cp.upstream_path}:{lead.upstream_line} ({versions})", *(_hunk_line(d) for d in group)],
                           sites=[hunk_site(d, cp.upstream_path) for d in group])


def _unit_finding(group: list[Difference], cp: FileCounterpart, env: _Env) -> Finding:
    """The finding for one function's undeclared hunks (or one missed edit, or members dropped at one place)."""
    pool = [d for d in group if not d.note] or group
    rule_id = next((r for r in (R_DRIFT, R_ARCH) if any(_RULE_OF.get(d.kind) == r for d in pool)), R_UNDECLARED)
    main = [d for d in group if _RULE_OF.get(d.kind, R_UNDECLARED) == rule_id]
    others = [d for d in group if d not in main]
    lead = min((d for d in main if not d.note), key=lambda d: lead_rank(d.kind, d.detail), default=main[0])
    ordered = [lead, *(d for d in main if d is not lead)]
    _, head = _summary(ordered, _WHAT[rule_id])
    if rule_id == R_UNDECLARED:
        if head and not head.endswith(": "):  # members dropped at one place
            lead = replace(lead, symbol=_absent_symbol(group))
        message = head + f"{lead.kind}: {lead.detail}" if head.endswith(": ") else f"{lead.kind} in {lead.symbol}: {head or lead.detail}"
    else:
        message = f"{lead.symbol}: " + (head + lead.detail if head else lead.detail)
    port_only = sum(d.kind not in _RULE_OF for d in others)
    checks = sum(d.kind == "arch-check" for d in others)
    drifted = sum(d.kind == "upstream-not-followed" for d in others)
    tail = [f"{port_only} port-only difference(s)"] * bool(port_only) + [f"{checks} capability check(s)"] * bool(checks) + [
        f"{drifted} upstream change(s) not followed"] * bool(drifted)
    if tail:
        message += f" (and {', '.join(tail)} in the same function)"
    versions = f"{env.base or '?'} -> {env.target or '?'}"
    up_where = f"upstream {cp.upstream_path}:{lead.upstream_line}" if lead.upstream_line else f"upstream {cp.upstream_path}"
    sites = [hunk_site(d, cp.upstream_path) for d in [*ordered, *others]]
    evidence = [f"{up_where} ({versions})" if rule_id == R_DRIFT and lead.upstream_line else up_where,
                f"port {lead.path}:{lead.line}" if lead.line else f"port {lead.path}",
                *(hunk_line(s) for s in sites), _attribution(group, env),
                "not declared: no vendor marker or comment in or directly above"]
    # What it is about, without line numbers or counts: the function (or the dropped members, the kernel package).
    about = "fn:" + ",".join(sorted({d.symbol for d in group}))
    return make_finding(rule_id, Location(lead.path, lead.line, lead.symbol), _short(message, 700),
                        [e for e in evidence if e], severity=_severity(group), key=about, sites=sites)
