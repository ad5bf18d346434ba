# The pass after the checks: one finding per root cause (several findings from one call or flow become
# one finding with every consequence in its evidence) and the demotions only the installed stack can prove.
from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from metax_audit.core.findings import make_finding, rule
from metax_audit.core.models import (
    BackendChain,
    CallSite,
    Category,
    ConfigSwitch,
    Finding,
    Location,
    Severity,
    Site,
    StackFacts,
)
from metax_audit.core.pysource import cached_text, read_source_cached, walk_nodes
from metax_audit.stages.never_taken import demote_never_taken
from metax_audit.stages.switched_off import demote_switched_off

if TYPE_CHECKING:
    from metax_audit.stages.checks.memo import FileMemo
    from metax_audit.stages.compare.carried import Carried
    from metax_audit.stages.compare.predicates import Evaluator

# The verdict compare gives a hunk that may change a kernel (its evidence line ends with it).
MAY_CHANGE = "-- may change what a kernel computes or whether it runs"
# Rules whose findings at one call site are consequences of one root cause (one call, one flow).
_PER_CALL = re.compile(r"^MXA(1\d\d|5\d\d)$")


def triage(findings: Sequence[Finding], calls: Sequence[CallSite], facts: StackFacts | None,
           counterparts: Counterparts | None = None, backends: Sequence[BackendChain] = (), *,
           platform: Evaluator | None = None, roots: tuple[Path, Path] | None = None,
           carried: Carried | None = None, switches: Sequence[ConfigSwitch] = (), port_package: str = "") -> list[Finding]:
    """Demote the differences the installed stack explains, those the vendor platform makes the same (`platform`
    evaluates conditions over its facts; `roots`: the port snapshot and the upstream release), the binding findings
    inside branches the platform never takes, and those only a
    backend the platform never selects runs, merge findings of one call or flow or root cause, and say which
    findings are about a statement the port inherited unchanged from upstream."""
    out = [_signature_demotion(f, calls, facts) for f in findings]
    if platform is not None and roots is not None:
        out = [_platform_demotion(f, platform, roots) for f in out]
        out = demote_never_taken(out, platform.platform, roots[0], platform, port_package)
    if carried is not None:
        out = [_carried_demotion(f, carried) for f in out]
    out = demote_unselected(out, backends)
    out = demote_switched_off(out, calls, switches)
    out = group_keyword_drops(group_left_behind(merge_into_errors(group_per_call(out))))
    return label_inherited(group_same_message(out), counterparts)


# ---------------------------------------------------------------- the installed signature explains it


def _platform_demotion(f: Finding, platform: Evaluator, roots: tuple[Path, Path]) -> Finding:
    """The hunks that change one statement into another that reads the same on the vendor platform (each side's
    conditions and helpers evaluated over the platform class's facts and the device capability) become info
    with that evaluation as their evidence; unknown stays unknown."""
    from metax_audit.stages.compare.predicates import (
        registered_by_imported_upstream,
        same_on_platform,
        unsupported_feature_branch,
    )

    if f.rule not in {"MXA201", "MXA203"} or f.severity is not Severity.WARNING:
        return f

    def explain(x: Site) -> Site:
        up_path, _, up_line = x.upstream.rpartition(":")
        if x.verdict or not up_path or not up_line.isdigit():
            return x
        why = ""
        if x.kind == "changed":
            why = same_on_platform(platform, roots[0], x.path, x.line, roots[1], up_path, int(up_line)) \
                or registered_by_imported_upstream(roots[0], x.path, x.line, roots[1], up_path, int(up_line))
        elif x.kind == "removed":
            why = unsupported_feature_branch(platform, roots[0], x.path, roots[1], up_path, int(up_line))
        elif x.kind == "call-changed" and x.keywords:
            why = _follows_own_signature(x, roots, up_path)
        return replace(x, verdict="info: " + why) if why else x

    return _with_sites(f, [explain(x) for x in f.sites])


def _follows_own_signature(site: Site, roots: tuple[Path, Path], up_path: str) -> str:
    """A call whose keyword changes are exactly the parameters the port's own definition of the callee (a function
    of the same file) adds to or drops from upstream's definition: the call follows the port's signature, and that
    signature's change is judged where it is defined."""
    def params(root: Path, rel: str, name: str) -> tuple[set[str], int] | None:
        tree = read_source_cached(root, rel, 5_000_000).tree if (root / rel).is_file() else None
        fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None) if tree else None
        if fn is None:
            return None
        a = fn.args
        return {p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs]}, fn.lineno

    why = []
    for callee, (added, dropped) in _deltas(site).items():
        port, up = params(roots[0], site.path, callee), params(roots[1], up_path, callee)
        if "." in callee or port is None or up is None or not added <= port[0] - up[0] or not dropped <= up[0] - port[0]:
            return ""
        change = ", ".join([*(f"adds {k}" for k in sorted(added)), *(f"drops {k}" for k in sorted(dropped))])
        why.append(f"the call follows the port's own {callee} ({site.path}:{port[1]}), whose signature {change} against "
                   f"upstream's ({up_path}:{up[1]}); that change is judged where it is defined")
    return "; ".join(why)


def _carried_demotion(f: Finding, carried: Carried) -> Finding:
    """The port-only hunks the port already had at its previous sync (a vendor change carried over, not made in
    this sync) become info with the commit as evidence."""
    if f.rule != "MXA201" or f.severity is not Severity.WARNING:
        return f

    def explain(x: Site) -> Site:
        if x.verdict:
            return x
        why = carried.explain(x)
        return replace(x, verdict="info: " + why) if why else x

    return _with_sites(f, [explain(x) for x in f.sites])


def _signature_demotion(f: Finding, calls: Sequence[CallSite], facts: StackFacts | None) -> Finding:
    """The hunks whose only change is keywords the installed signature does not have become info, read from the
    typed sites (their keyword changes), never from the evidence text; the evidence line of each is rendered again."""
    if facts is None or not any(not x.verdict and x.keywords for x in f.sites):
        return f
    return _with_sites(f, [_explained(x, calls, facts) for x in f.sites])


def _with_sites(f: Finding, sites: list[Site]) -> Finding:
    """The finding with its hunks' verdicts as `sites` now says: each changed hunk's evidence line rendered again,
    info when no hunk may change a kernel any more, and led by what remains when its lead hunk is explained."""
    if sites == list(f.sites):
        return f
    from metax_audit.stages.compare.grouping import hunk_line

    lines = {hunk_line(old): hunk_line(new) for old, new in zip(f.sites, sites, strict=True) if old != new}
    evidence = tuple(lines.get(e, e) for e in f.evidence)
    severity = f.severity
    if severity == Severity.WARNING and not any(MAY_CHANGE in e for e in evidence) and all(x.verdict for x in sites if x.kind):
        severity = Severity.INFO
    message, location = f.message, f.location
    lead = next((x for x in sites if x.kind and not x.verdict), None)
    if severity == Severity.WARNING and lead is not None and sites[0].verdict and not f.sites[0].verdict and f.rule == "MXA201":
        # The hunk the finding led with is explained now: it leads with what remains to judge.
        # Every hunk with a verdict counts, this pass's and the compare's (a case the port rejects up front): the
        # two numbers add up to the hunks the finding lists.
        hunks = [x for x in sites if x.kind]
        left = sum(not x.verdict for x in hunks)
        message = (f"{left} undeclared differences left in {lead.symbol or f.location.symbol} "
                   f"({len(hunks) - left} explained: installed signature, vendor platform, rejected case or carried); "
                   f"at line {lead.line}: "
                   f"{lead.kind}: {lead.detail}")
        location = replace(f.location, line=lead.line)
    return replace(f, evidence=evidence, severity=severity, sites=tuple(sites), message=message, location=location)


def _explained(site: Site, calls: Sequence[CallSite], facts: StackFacts) -> Site:
    if site.verdict or not site.keywords:
        return site
    if site.kind in {"removed", "upstream-not-followed"}:
        why = _feeds_absent_keyword(site, calls, facts)
    elif site.kind in {"argument-commented-out", "call-changed"}:
        why = _keywords_absent(site, calls, facts)
    else:
        why = ""
    return replace(site, verdict="info: " + why) if why else site


def _deltas(site: Site) -> dict[str, tuple[set[str], set[str]]]:
    """callee -> (keywords the port adds, keywords it leaves out), from the site's typed keyword changes."""
    out: dict[str, tuple[set[str], set[str]]] = {}
    for k in site.keywords:
        callee, _, change = k.rpartition(":")
        added, dropped = out.setdefault(callee, (set(), set()))
        (added if change[:1] == "+" else dropped).add(change[1:])
    return out


def _keywords_absent(site: Site, calls: Sequence[CallSite], facts: StackFacts) -> str:
    reasons = []
    for callee, (added, dropped) in _deltas(site).items():
        why = _lacks(callee, added, dropped, site.path, site.line, calls, facts)
        if not why:
            return ""
        reasons.append(why)
    return "; ".join(reasons)


def _feeds_absent_keyword(site: Site, calls: Sequence[CallSite], facts: StackFacts) -> str:
    """A removed local that upstream only passes as `kernel(kw=name)` is explained when every port call of
    that kernel in the file binds to an installed signature without `kw` (the port cannot pass it)."""
    reasons = []
    for callee, (_, dropped) in _deltas(site).items():
        for kw in sorted(dropped):
            sites = [cs for cs in calls if cs.location.path == site.path and cs.callee_text == callee]
            found = [facts.facts.get(cs.resolved or "") for cs in sites]
            if not sites or any(f is None or f.params is None or any(p.kind == "VAR_KEYWORD" for p in f.params)
                                or kw in {p.name for p in f.params} for f in found):
                return ""
            fact = found[0]
            assert fact is not None  # checked above: every site has a known signature
            reasons.append(f"it only fed {callee}({kw}=), and the installed {fact.target} has no parameter "
                           f"{kw!r} ({len(sites)} port call(s) in the file bind to it)")
    return "; ".join(reasons)


def _lacks(callee: str, added: set[str], dropped: set[str], path: str, line: int, calls: Sequence[CallSite],
           facts: StackFacts) -> str:
    """Why the installed callable explains the change: it has none of the dropped keywords (and accepts
    every added one); "" when it does not, or when the installed signature is unknown."""
    for cs in calls:
        if cs.location.path != path or not (line <= cs.location.line <= line + 40) or cs.callee_text != callee:
            continue
        fact = facts.facts.get(cs.resolved or "")
        if fact is None or fact.params is None:
            return ""
        names = {p.name for p in fact.params if p.kind not in {"VAR_POSITIONAL", "VAR_KEYWORD"}}
        # An added keyword the public base of a vendor-extends package lacks is an unchecked call (signatures'
        # MXA113, counted in the headline), not an unexplained one: the port passes what the vendor build may take.
        unchecked = (added - names) if fact.stand_in and fact.stand_in_extended else set()
        if any(p.kind == "VAR_KEYWORD" for p in fact.params) or (dropped & names) or (added - names - unchecked):
            return ""
        what = f"keyword(s) {', '.join(sorted(dropped))} dropped" if dropped else "keywords changed"
        taken = sorted(added - unchecked)
        more = (f"; added {', '.join(taken)}, which it accepts" if taken and dropped else "") + (
            f"; added {', '.join(sorted(unchecked))}, which only the vendor build may take (unchecked, counted in the headline)"
            if unchecked else "")
        return (f"{what} because the installed {fact.target} has no such parameter "
                f"({fact.signature or 'signature read'}){more}")
    return ""


# ---------------------------------------------------------------- a backend the platform never selects


def demote_unselected(findings: Sequence[Finding], backends: Sequence[BackendChain]) -> list[Finding]:
    """A difference from upstream in a file that only backends the platform never selects reach (registered, in no
    priority list and not returned by its selector) runs only when a user names that backend: info, with that gate."""
    reach: dict[str, list[BackendChain]] = {}
    for b in backends:
        for path in dict.fromkeys(h.path for h in b.chain if h.path):
            reach.setdefault(path, []).append(b)
    idle = {p: bs for p, bs in reach.items() if bs and not any(b.active for b in bs)}
    if not idle:
        return list(findings)
    out = []
    for f in findings:
        bs = idle.get(f.location.path)
        if bs is not None and f.rule in _COMPARE_RULES and f.severity is Severity.WARNING:
            names = ", ".join(sorted({b.name for b in bs}))
            why = (f"gate: only {names} runs this file, and the platform never selects it (registered, in no priority list, "
                   f"not returned by its selector): it runs only when a user names it")
            f = replace(f, severity=Severity.INFO, evidence=(*f.evidence, why))
        out.append(f)
    return out


# ---------------------------------------------------------------- one finding per call or flow


def group_per_call(findings: Iterable[Finding]) -> list[Finding]:
    """Findings of one stack/dataflow rule at one call site are one finding: the first, with every other
    one's message and evidence added (e.g. two LSE arguments of one merge call with the wrong base). So are
    findings of two such rules about the same thing at that call (one symbol: caller, callee and parameter),
    as when the stack check and the binding check both read an upstream op's signature (MXA103 and MXA109
    for one required parameter left out)."""
    out: list[Finding] = []
    groups: dict[tuple[str, str, int, str], list[Finding]] = {}  # both keys of a group name the same list
    for f in findings:
        if _PER_CALL.match(f.rule) and f.location.line and f.severity != Severity.INFO:
            keys = [(f.rule, f.location.path, f.location.line, f.severity.value)]
            if f.location.symbol:
                keys.append(("", f.location.path, f.location.line, f"{f.severity.value}:{f.location.symbol}"))
            group = next((groups[k] for k in keys if k in groups), None)
            if group is not None:
                group.append(f)
                for k in keys:
                    groups.setdefault(k, group)
                continue
            group = [f]
            for k in keys:
                groups[k] = group
        out.append(f)
    merged = {id(g[0]): _merge(g) for g in {id(g): g for g in groups.values()}.values() if len(g) > 1}
    return [merged.get(id(f), f) for f in out]


_COMPARE_RULES = frozenset({"MXA201", "MXA202", "MXA203"})


def merge_into_errors(findings: Sequence[Finding]) -> list[Finding]:
    """A difference from upstream at the very line of an error is that error's root cause (the port kept
    the old call, changed the argument): the compare finding joins the error as evidence, every hunk kept."""
    errors = {(f.location.path, f.location.line): f for f in findings
              if f.severity is Severity.ERROR and f.location.line and _PER_CALL.match(f.rule)}
    if not errors:
        return list(findings)
    absorbed: dict[tuple[str, int], list[Finding]] = {}
    out: list[Finding] = []
    for f in findings:
        hit = None
        if f.rule in _COMPARE_RULES and f.severity is not Severity.ERROR:
            hit = next(((x.path, x.line) for x in f.sites if (x.path, x.line) in errors), None)
        if hit is None:
            out.append(f)
        else:
            absorbed.setdefault(hit, []).append(f)
    merged = []
    for f in out:
        joined = absorbed.get((f.location.path, f.location.line), []) if f.severity is Severity.ERROR else []
        if joined:
            extra = [line for j in joined for line in (f"root cause, also {j.rule}: {j.message}", *j.evidence)]
            f = replace(f, evidence=(*f.evidence, *extra), joined=_joined(f, joined), sites=_sites(f, joined))
        merged.append(f)
    return merged


def _merge(group: list[Finding]) -> Finding:
    first = group[0]
    symbols = [f.location.symbol for f in group]
    prefix = symbols[0].split(":", 1)[0]
    symbol = prefix if all(s.split(":", 1)[0] == prefix for s in symbols) else symbols[0]
    message = f"{len(group)} findings at one call: " + " | ".join(f.message for f in group)
    evidence: list[str] = []
    for i, f in enumerate(group, 1):
        evidence.append(f"({i}) {f.message}")
        evidence.extend(e for e in f.evidence if e not in evidence)
    return replace(first, location=replace(first.location, symbol=symbol), message=message, evidence=tuple(evidence),
                   joined=_joined(first, group[1:]), sites=_sites(first, group[1:]))


def _sites(into: Finding, others: Sequence[Finding]) -> tuple[Site, ...]:
    """Every place a merged finding stands for: its own, then the others' (their locations when they had none)."""
    out: list[Site] = list(into.sites) or [Site(into.location.path, into.location.line, into.location.symbol)]
    for f in others:
        out.extend(f.sites or [Site(f.location.path, f.location.line, f.location.symbol, f.rule, f.message)])
    return tuple(dict.fromkeys(out))


def _joined(into: Finding, others: Sequence[Finding]) -> tuple[str, ...]:
    """The ids a merged finding stands for besides its own: the others' and what they had joined."""
    return tuple(dict.fromkeys((*into.joined, *(x for f in others for x in (f.id, *f.joined)))))


# ---------------------------------------------------------------- a file the last sync left behind


rule("MXA209", Category.UPSTREAM_DRIFT, Severity.WARNING,
     "the last sync left this file in the base release's form",
     "Upstream changed the file between the base release and the target, and the port followed none of it: the "
     "functions that keep the earlier form (a layout, a signature, a branch) are one root cause, one finding listing "
     "every function as a site. When the module also imports a name upstream removed since the base release, that "
     "import error is the same root cause and this finding is its evidence. An upstream addition the port lacks (a "
     "new method such as a capability hook, new statements in a function otherwise alike) stays its own finding: "
     "the sync would have brought it as a unit, and missing it changes what runs.")

# What upstream did that the port lacks as a unit: its own root cause, not part of the file's old layout.
_ADDITIONS = frozenset({"method-added", "statements-added", "kernel-argument-added"})


def group_left_behind(findings: Sequence[Finding]) -> list[Finding]:
    """One finding per file the last sync left behind (drift in it, nothing followed): its functions that keep
    the base release's form are sites of one finding, which joins the module's import of a name upstream removed
    since the base release when there is one (the same root cause); upstream additions stand alone."""
    from metax_audit.stages.checks.imports import REMOVED_SINCE_BASE

    followed = {f.location.path for f in findings if f.rule == "MXA204"}
    kept: dict[str, list[Finding]] = {}
    for f in findings:
        if f.rule == "MXA203" and f.severity is Severity.WARNING and f.location.path not in followed and not _addition(f):
            kept.setdefault(f.location.path, []).append(f)
    groups = {p: g for p, g in kept.items() if len(g) > 1}
    if not groups:
        return list(findings)
    removed_import = {f.location.path: f for f in findings if f.rule == "MXA122" and f.severity is Severity.ERROR
                      and REMOVED_SINCE_BASE in f.evidence}
    members = {id(f) for g in groups.values() for f in g}
    out: list[Finding] = []
    for f in findings:
        if id(f) in members:
            continue
        group = groups.get(f.location.path) if f is removed_import.get(f.location.path) else None
        if group is not None:
            head = f"root cause, also the file's old form: {_left_behind_message(group)}"
            f = replace(f, evidence=(*f.evidence, head, *(f"  {g.location}: {g.message}" for g in group)),
                        joined=_joined(f, group), sites=_sites(f, group))
        out.append(f)
    for path, group in groups.items():
        if path in removed_import:
            continue
        first = group[0]
        out.append(make_finding("MXA209", Location(path, first.location.line, "file"), _left_behind_message(group),
                                [f"{g.location}: {g.message}" for g in group] + [e for g in group for e in g.evidence
                                                                               if e.startswith("attribution:")][:1],
                                key=f"left-behind:{path}", sites=_sites(group[0], group[1:])))
        out[-1] = replace(out[-1], joined=_joined(out[-1], group))
    return out


def _addition(f: Finding) -> bool:
    """Every hunk that may change a kernel is something upstream added that the port lacks."""
    live = [s for s in f.sites if not s.verdict]
    return bool(live) and all(s.change in _ADDITIONS for s in live)


def _left_behind_message(group: Sequence[Finding]) -> str:
    hunks = sum(sum(1 for s in g.sites if s.kind == "upstream-not-followed") or 1 for g in group)
    names = ", ".join(g.location.symbol for g in group)
    return (f"the last sync left {group[0].location.path} in the base release's form: {hunks} upstream change(s) not "
            f"followed in {len(group)} functions ({names})")


# ---------------------------------------------------------------- one change of a callee's keywords at N call sites


rule("MXA212", Category.UNDECLARED_DIFFERENCE, Severity.WARNING,
     "the port leaves out keywords upstream passes to one callee, at several call sites",
     "Across the port, calls of one callee leave out keywords that upstream passes there (dropped, commented out, "
     "or a local read only as that keyword), and nothing else in those functions may change a kernel: one root cause "
     "(the callee the port binds takes another signature), one finding with every call site. When the installed "
     "signature is known and lacks the keywords, the differences are info instead; this finding stands when it is not "
     "(confirm the vendor build's signature, or capture a stack manifest).")


def group_keyword_drops(findings: Sequence[Finding]) -> list[Finding]:
    """Compare findings whose only live hunks leave out keywords of one callee are one finding per callee when
    there are several: the same upstream keyword set not passed at N call sites is one root cause."""
    by_callee: dict[str, list[Finding]] = {}
    for f in findings:
        callee = _only_drops_of(f) if f.rule in _COMPARE_RULES and f.severity is Severity.WARNING else ""
        if callee:
            by_callee.setdefault(callee, []).append(f)
    groups = {c: g for c, g in by_callee.items() if len(g) > 1}
    if not groups:
        return list(findings)
    members = {id(f): c for c, g in groups.items() for f in g}
    out: list[Finding] = []
    for f in findings:
        found = members.get(id(f))
        if found is None:
            out.append(f)
            continue
        callee = found
        group = groups[callee]
        if f is not group[0]:
            continue
        dropped = sorted({k.rsplit(":-", 1)[1] for g in group for x in g.sites for k in x.keywords if ":-" in k})
        calls = sum(1 for g in group for x in g.sites if x.keywords and not x.verdict)
        message = (f"calls of {callee} leave out keywords upstream passes ({', '.join(dropped)}) at {calls} call site(s) "
                   f"in {len(group)} functions; nothing else there may change a kernel")
        evidence = [f"{g.location}: {g.message}" for g in group]
        merged = make_finding("MXA212", Location(f.location.path, f.location.line, f.location.symbol), message, evidence,
                              key=f"keywords:{callee}", sites=_sites(group[0], group[1:]))
        out.append(replace(merged, joined=_joined(merged, group)))
    return out


def _only_drops_of(f: Finding) -> str:
    """The one callee whose keywords every live hunk of the finding leaves out, or ""."""
    live = [x for x in f.sites if not x.verdict]
    if not live or any(not x.keywords for x in live):
        return ""
    callees = {k.split(":", 1)[0].rsplit(".", 1)[-1] for x in live for k in x.keywords}
    # Keywords the port adds at the same call are part of the same signature change (the vendor's own arguments).
    return callees.pop() if len(callees) == 1 and any(":-" in k for x in live for k in x.keywords) else ""


# ---------------------------------------------------------------- one finding said of N symbols


def group_same_message(findings: Sequence[Finding]) -> list[Finding]:
    """Findings of one rule and severity that say the same thing of different symbols (four backends renaming the
    same parameter of the same upstream method) are one root cause: the first, with every symbol a site."""
    groups: dict[tuple[str, str, str], list[Finding]] = {}
    for f in findings:
        if f.severity is Severity.INFO or f.rule in _COMPARE_RULES or not f.location.symbol:
            continue
        cls = f.location.symbol.split(".", 1)[0]
        said = f.message.replace(f.location.symbol, "<symbol>").replace(cls, "<class>")
        if said != f.message:
            groups.setdefault((f.rule, f.severity.value, said), []).append(f)
    groups = {k: g for k, g in groups.items() if len(g) > 1}
    if not groups:
        return list(findings)
    member = {id(f): g for g in groups.values() for f in g}
    out = []
    for f in findings:
        g = member.get(id(f))
        if g is None:
            out.append(f)
        elif f is g[0]:
            others = ", ".join(x.location.symbol for x in g[1:])
            out.append(replace(f, message=f"{f.message} (the same in {len(g) - 1} more: {others})",
                               evidence=(*f.evidence, *(f"also {x.location}: {x.message}" for x in g[1:])),
                               joined=_joined(f, g[1:]), sites=_sites(f, g[1:])))
    return out


# ---------------------------------------------------------------- inherited from upstream


# Rules about one statement of the port: when that statement is upstream's, the finding is inherited.
_STATEMENT_RULE = re.compile(r"^MXA1[0-4]\d$")
# Findings of a followed value (LSE base/layout, FP8 scales): inherited when the call that receives the
# value in the wrong convention is upstream's own statement (upstream ships the same break).
_FLOW_CATEGORIES = frozenset({Category.LSE, Category.LAYOUT, Category.FP8_SCALE})


@dataclass(frozen=True)
class Counterparts:
    """Where each compared port file's upstream counterpart is, to tell inherited statements from the port's."""

    port_root: Path
    upstream_root: Path
    version: str
    files: dict[str, str]  # port path -> upstream path
    # The answer for one line is a function of the two files' bytes: kept per port file.
    memo: FileMemo | None = field(default=None, compare=False)

    def inherited(self, path: str, line: int, what: str = "") -> str:
        """Evidence that the statement at path:line is upstream's own, or ""."""
        up_path = self.files.get(path)
        if not up_path or not line:
            return ""
        compute = functools.partial(_upstream_line, self.port_root, path, line, self.upstream_root, up_path)
        if self.memo is None:
            up_line = compute()
        else:
            up_line = self.memo.get(path, ("inherited", line, up_path, self.memo.digest(self.upstream_root / up_path)), compute)
        if up_line is None:
            return ""
        return f"attribution: inherited from upstream {self.version}, {what or 'also present there'} ({up_path}:{up_line})"


def _upstream_line(port_root: Path, path: str, line: int, upstream_root: Path, up_path: str) -> int | None:
    """The upstream line where the statement at path:line appears verbatim (whitespace aside), or None."""
    stmt = _statement_text(port_root, path, line)
    up_text = _normalized(upstream_root, up_path)
    if len(stmt) < 12 or up_text is None or stmt not in up_text[0]:
        return None
    return up_text[1][up_text[0].index(stmt)]


def label_inherited(findings: Sequence[Finding], counterparts: Counterparts | None) -> list[Finding]:
    if counterparts is None:
        return list(findings)
    out = []
    for f in findings:
        if _STATEMENT_RULE.match(f.rule):
            why = counterparts.inherited(f.location.path, f.location.line)
        elif f.category in _FLOW_CATEGORIES:  # a flow's finding stands at the call where the convention breaks
            why = counterparts.inherited(f.location.path, f.location.line, "the call where it breaks is also present there")
        else:
            why = ""
        out.append(replace(f, evidence=(*f.evidence, why)) if why and why not in f.evidence else f)
    return out


def _statement_text(root: Path, path: str, line: int) -> str:
    """The whitespace-normalized source of the innermost statement holding `line`."""
    src = read_source_cached((root / path).parent, Path(path).name, 5_000_000)
    if src.tree is None or src.text is None:
        return ""
    holding = [span for span in _simple_statements(src.tree) if span[0] <= line <= span[1]]
    best = max(holding, key=lambda span: span[0], default=None)
    if best is None:
        return ""
    lines = src.text.splitlines()[best[0] - 1 : best[1]]
    return " ".join(" ".join(lines).split())


@functools.lru_cache(maxsize=64)
def _simple_statements(tree: ast.Module) -> tuple[tuple[int, int], ...]:
    """(first, last) line of every non-compound statement, in ast.walk order: one walk per parsed file
    (the parse is shared and never mutated), not one per finding."""
    compound = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.For, ast.While, ast.With, ast.Try)
    return tuple((n.lineno, n.end_lineno or n.lineno) for n in walk_nodes(tree)
                 if isinstance(n, ast.stmt) and not isinstance(n, compound))


def _normalized(root: Path, path: str) -> tuple[str, list[int]] | None:
    """The file's text with whitespace runs collapsed, and the source line of every character (the
    text read_source_cached gives, without parsing the upstream file for it)."""
    full = root / path
    try:
        if full.stat().st_size > 5_000_000:
            return None
        text = cached_text(full)
    except (OSError, UnicodeDecodeError):
        return None
    return _collapsed(text)


@functools.lru_cache(maxsize=64)
def _collapsed(source: str) -> tuple[str, list[int]]:
    """_normalized of one text, once per text (every finding in a file asks it again)."""
    chars: list[str] = []
    lines: list[int] = []
    for n, text in enumerate(source.splitlines(), 1):
        for word in text.split():
            if chars:
                chars.append(" ")
                lines.append(n)
            chars.append(word)
            lines.extend([n] * len(word))
    return "".join(chars), lines
