# The inventory: one record per file in scope (registrations, callers, upstream counterpart,
# differences, findings, probe coverage, status), built from whatever stages ran; plus the CI gate.
from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

from metax_audit.errors import ConfigError
from metax_audit.findings import make_finding, rule
from metax_audit.models import (
    AuditReport,
    CallSite,
    Category,
    Comparison,
    ConfigSwitch,
    Coverage,
    Difference,
    Discovery,
    FileComparison,
    FileRecord,
    Finding,
    Location,
    ProbeResult,
    Registration,
    Severity,
    SkippedFile,
    SnapshotInfo,
    SourceFile,
    StageRecord,
    TestRun,
    TraceResult,
    UpstreamInfo,
)

INACTIVE_PATH = rule(
    "MXA300",
    Category.INACTIVE_PATH,
    Severity.INFO,
    "adaptation sits behind a feature the platform turns off",
    "The file keeps code (a vendor difference or a traced call) in a branch of a feature that the "
    "platform's config switch turns off on every run, so that code never runs on this platform and "
    "no probe or test exercises it. That is not a defect by itself: keeping upstream's branch makes "
    "the next sync easier, so do not delete it just to silence this. Know that it is unvalidated: "
    "before the switch is turned back on, probe the kernels the branch calls on the vendor device, and "
    "give undeclared differences inside it their reason. Waive with the reason (for example 'cascade "
    "is disabled on this platform until the vendor wrapper supports it') to acknowledge it.",
)

FAIL_ON = ("error", "warning", "info", "never")

# Statuses a file record can take; "not-analysed" always carries a reason.
OK, NEEDS_ACTION, NOT_ANALYSED = "ok", "needs-action", "not-analysed"

# Rules that mean "this file was not analysed" (declared by the foundation in findings.py).
_NOT_ANALYSED_RULES = frozenset({"MXA001", "MXA002"})

_OFF_VALUES = frozenset({"false", "0", "none", "off", "disabled", "no", "never"})
_ON_VALUES = frozenset({"true", "1", "on", "yes", "always"})
# Words around a switch's name that say how it works, not which feature it names:
# disable_cascade_attn -> ("cascade",), use_mm_prefix_lm -> ("mm", "prefix", "lm").
_LEAD_WORDS = frozenset({"disable", "disabled", "enable", "enabled", "use", "allow", "force", "support", "supports", "is", "no", "skip"})
_TAIL_WORDS = frozenset({"attn", "attention", "mode", "enabled", "flag", "level"})
# A condition made only of None guards is as good as unconditional.
_NONE_GUARD = re.compile(r"^\(?\s*[\w.]+ is not None\s*\)?$")


def build_report(
    *,
    snapshot: SnapshotInfo,
    discovery: Discovery | None,
    trace: TraceResult | None,
    comparison: Comparison | None,
    findings: Sequence[Finding],
    probes: Sequence[ProbeResult],
    stages: Sequence[StageRecord],
    upstream: UpstreamInfo | None,
    environment: dict[str, Any],
    test_run: TestRun | None,
    wall_seconds: float,
    waivers: dict[str, Any],
    tool_version: str,
    generated_at: str,
    suggest_probe: Callable[[str], str | None] | None = None,
) -> AuditReport:
    """Join the stage outputs into one report; a stage that did not run leaves its part empty.

    `suggest_probe(callee)` names the probe command a contract says validates a call to `callee`;
    unvalidated differences on such a call carry it, so the reviewer knows what to run.
    """
    sources = {f.path: f for f in discovery.files} if discovery else {}
    compared = {f.path: f for f in comparison.files} if comparison else {}
    calls = _calls_by_path(trace)

    paths = set(sources) | set(compared)
    if trace is not None:
        paths |= set(trace.reached_files)

    extra = list(_inactive_path_findings(discovery, comparison, calls, paths))
    all_findings = _dedupe(sorted([*findings, *extra], key=_finding_key))
    by_path: dict[str, list[Finding]] = {}
    for f in all_findings:
        by_path.setdefault(f.location.path, []).append(f)

    sorted_probes = tuple(sorted(probes, key=_probe_key))
    records = []
    for path in sorted(paths):
        src = sources.get(path)
        comp = compared.get(path)
        here = by_path.get(path, [])
        regs = ()
        if discovery is not None:
            regs = tuple(sorted(
                (r for r in discovery.registrations if path in (r.location.path, r.resolved_path)),
                key=_registration_key,
            ))
        status, status_reason = _status(src, comp, here, trace, comparison)
        records.append(FileRecord(
            path=path,
            reason=src.reason if src else ("reached-by-trace" if trace and path in trace.reached_files else "compared"),
            upstream_path=comp.upstream_path if comp else None,
            registrations=regs,
            callers=tuple(sorted(set(discovery.callers.get(path, ())))) if discovery else (),
            differences=tuple(sorted((_validated(d, calls.get(path, ()), sorted_probes, suggest_probe) for d in comp.differences),
                                     key=_difference_key)) if comp else (),
            findings=tuple(f.id for f in here),
            probes=tuple(probe_id(p) for p in sorted_probes if any(_reaches(c, p.target) for c in calls.get(path, ()))),
            status=status,
            status_reason=status_reason,
        ))

    skipped = tuple(SkippedFile(r.path, r.status_reason) for r in records if r.status == NOT_ANALYSED)
    left_out = tuple(sorted(discovery.left_out, key=lambda s: (s.path, s.reason))) if discovery else ()
    return AuditReport(
        tool_version=tool_version,
        snapshot=snapshot,
        upstream=upstream if upstream is not None else (comparison.upstream if comparison else None),
        environment=dict(environment),
        backends=tuple(sorted(trace.backends, key=lambda b: (b.name, b.class_path))) if trace else (),
        files=tuple(records),
        findings=tuple(all_findings),
        probes=sorted_probes,
        coverage=Coverage(
            in_scope=len(records),
            analysed=len(records) - len(skipped),
            skipped=skipped,
            left_out=left_out,
        ),
        stages=tuple(stages),
        test_run=test_run,
        generated_at=generated_at,
        wall_seconds=wall_seconds,
        waivers=dict(waivers),
        base=comparison.base if comparison else None,
    )


def probe_id(p: ProbeResult) -> str:
    """The name a probe result goes by in file records, JUnit and Markdown."""
    return f"{p.probe}/{p.family}/{p.target}"


def exit_code(report: AuditReport, fail_on: str, *, new_only: bool = False) -> int:
    """0 when no unwaived finding is at or above `fail_on`, else 1 (2 is the CLI's, for AuditError).
    With `new_only`, only findings new or changed against the baseline count (a pre-commit or
    pull-request gate); a review without a baseline is a ConfigError then."""
    if fail_on not in FAIL_ON:
        raise ConfigError(f"--fail-on must be one of {', '.join(FAIL_ON)}, not {fail_on!r}")
    if new_only and not report.baseline_info:
        raise ConfigError("--new-only needs a baseline: --staged/--worktree compare with HEAD; with --rev pass "
                          "--baseline REV or --merge-base BRANCH")
    if fail_on == "never":
        return 0
    threshold = Severity(fail_on).rank
    return int(any(not f.waived and f.severity.rank >= threshold
                   and (not new_only or (f.baseline is not None and f.baseline.is_new)) for f in report.findings))


def severity_counts(findings: Iterable[Finding]) -> dict[str, int]:
    """Unwaived findings per severity, in the fixed order error, warning, info."""
    counts = {s.value: 0 for s in Severity}
    for f in findings:
        if not f.waived:
            counts[f.severity.value] += 1
    return counts


def summary_line(report: AuditReport) -> str:
    counts = severity_counts(report.findings)
    waived = sum(f.waived for f in report.findings)
    text = (
        f"{len(report.files)} files, {len(report.backends)} backends, findings: "
        f"{counts['error']} error, {counts['warning']} warning, {counts['info']} info"
    )
    if waived:
        text += f" ({waived} waived)"
    if report.baseline_info:
        b = report.baseline_info
        text += f"; vs {b['rev']}: {b['new']} new, {b['changed']} changed, {b['fixed']} fixed"
    return f"{text}, {report.wall_seconds:.1f} s"


# ---------------------------------------------------------------- status


def _status(
    src: SourceFile | None,
    comp: FileComparison | None,
    here: Sequence[Finding],
    trace: TraceResult | None,
    comparison: Comparison | None,
) -> tuple[str, str]:
    if src is not None and src.parse_error:
        # discover also records size skips here ("too large: ..."), which are not syntax errors
        broken = not src.parse_error.startswith("too large")
        return NOT_ANALYSED, f"parse error: {src.parse_error}" if broken else f"not parsed: {src.parse_error}"
    skipped = [f for f in here if f.rule in _NOT_ANALYSED_RULES]
    if skipped:
        return NOT_ANALYSED, "; ".join(f.message for f in skipped)
    if trace is None and comp is None:
        why = "trace and compare did not run" if comparison is None else "trace did not run and compare did not cover it"
        return NOT_ANALYSED, why
    open_ = [f for f in here if not f.waived and f.severity.rank >= Severity.WARNING.rank]
    if open_:
        counts = severity_counts(open_)
        parts = [f"{n} {sev}" for sev, n in counts.items() if n]
        return NEEDS_ACTION, "unwaived findings: " + ", ".join(parts)
    notes = []
    if comparison is None:
        notes.append("compare did not run")
    elif comp is None:
        notes.append("no comparison with upstream")
    if trace is None:
        notes.append("trace did not run")
    return OK, "; ".join(notes)


# ---------------------------------------------------------------- inactive paths


def _tokens(text: str) -> list[str]:
    """snake_case, dotted and CamelCase text as lower-case words (MultiLevelCascade -> multi, level, cascade)."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", " ", text)
    return [w for w in re.split(r"[^a-z0-9]+", spaced.lower()) if w]


def _feature_words(switch: ConfigSwitch) -> tuple[str, ...]:
    words = _tokens(switch.target.rsplit(".", 1)[-1])
    while words and words[0] in _LEAD_WORDS:
        words.pop(0)
    while words and words[-1] in _TAIL_WORDS:
        words.pop()
    return tuple(words)


def _turns_off(switch: ConfigSwitch) -> bool:
    """A switch turns its feature off when a disable_* flag is true or any other flag is false/none."""
    name = switch.target.rsplit(".", 1)[-1].lower()
    value = switch.value.strip().strip("'\"").rsplit(".", 1)[-1].lower()
    if name.startswith(("disable", "no_", "skip")):
        return value in _ON_VALUES
    return value in _OFF_VALUES


def _unconditional(switch: ConfigSwitch) -> bool:
    """Set on every run of the platform, not only for some models (which would be a partial path)."""
    parts = [p.strip() for part in switch.condition.split(" / ") for p in part.split(" and ")]
    return all(not p or _NONE_GUARD.match(p) for p in parts)


def _mentions(text: str, words: tuple[str, ...]) -> bool:
    """The feature's words appear together, in order: `use_cascade` yes, `prefix_output` not for mm_prefix_lm."""
    toks = _tokens(text)
    n = len(words)
    return any(tuple(toks[i : i + n]) == words for i in range(len(toks) - n + 1))


def _behind(branch: str, words: tuple[str, ...]) -> bool:
    """Only runs when the feature is on: some condition requires it, un-negated and not or-ed away.

    `not attn_metadata.use_cascade` is the path that does run with cascade off, so it is no hit;
    `use_cascade or x` may run without the feature, so it is no hit either.
    """
    for part in branch.split(" / "):
        if " or " in part:
            continue
        for cond in part.split(" and "):
            cond = cond.strip().strip("()").strip()
            if _mentions(cond, words) and not cond.startswith("not ") and not re.search(r"(is|==)\s*(False|None)\s*$", cond):
                return True
    return False


def _inactive_path_findings(
    discovery: Discovery | None,
    comparison: Comparison | None,
    calls: dict[str, list[CallSite]],
    paths: set[str],
) -> Iterable[Finding]:
    if discovery is None:
        return
    diffs: dict[str, tuple[Difference, ...]] = {f.path: f.differences for f in comparison.files} if comparison else {}
    for switch in sorted(discovery.switches, key=lambda s: (s.location, s.target)):
        words = _feature_words(switch)
        if not words or not _turns_off(switch) or not _unconditional(switch):
            continue
        for path in sorted(paths):
            if path == switch.location.path:
                continue  # the file that flips the switch is not behind it
            hits: list[tuple[int, str]] = []
            for d in diffs.get(path, ()):
                # A removed item is not retained, and the switch itself is not behind the switch.
                if d.line and d.kind not in ("feature-disabled", "removed") and _mentions(" ".join((d.symbol, d.detail, d.reason)), words):
                    hits.append((d.line, f"{path}:{d.line}: {'declared' if d.declared else 'undeclared'} {d.kind} difference in {d.symbol or 'module'}"))
            for c in calls.get(path, ()):
                if _behind(c.branch, words):
                    hits.append((c.location.line, f"{path}:{c.location.line}: call {c.callee_text} under branch `{c.branch}`"))
            if not hits:
                continue
            hits = sorted(set(hits))
            shown = [h[1] for h in hits[:10]]
            if len(hits) > 10:
                shown.append(f"... and {len(hits) - 10} more places")
            cond = f" when {switch.condition}" if switch.condition else ""
            yield make_finding(
                INACTIVE_PATH.id,
                Location(path, hits[0][0], switch.target),
                f"{len(hits)} place(s) in this file depend on '{' '.join(words)}', which the platform turns off "
                f"({switch.target} = {switch.value}{cond}); kept, but it never runs here and nothing validates it",
                [f"switch: {switch.location}: {switch.target} = {switch.value}{cond}", *shown],
            )


# ---------------------------------------------------------------- probe coverage


def _calls_by_path(trace: TraceResult | None) -> dict[str, list[CallSite]]:
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


def _reaches(call: CallSite, target: str) -> bool:
    """Does a resolved call land on the probed target ("pkg.mod:Qual.name" or "pkg:Name")?

    Probe targets name a public entry point, while traces resolve to the defining module
    (flashinfer:X vs flashinfer.decode.X), so the module part only has to be a prefix.
    """
    if not call.resolved:
        return False
    module, sep, qual = target.partition(":")
    if not sep:
        module, _, qual = target.rpartition(".")
    parts = call.resolved.split(".")
    mod_parts = module.split(".") if module else []
    if mod_parts and parts[: len(mod_parts)] != mod_parts:
        return False
    want = qual.split(".")
    rest = parts[len(mod_parts):]
    return any(rest[i : i + len(want)] == want for i in range(len(rest) - len(want) + 1))


def _validated(d: Difference, calls: Sequence[CallSite], probes: Sequence[ProbeResult],
               suggest_probe: Callable[[str], str | None] | None = None) -> Difference:
    """Fill an empty `validation` with the probes that reach the kernel called on the difference's line.

    Only the same line counts: a probe of another kernel in the same method proves nothing about
    this difference. What nothing validates says so, so a reviewer never reads a blank as "proven",
    and names the probe the contracts give for the kernel called there, when there is one.
    The compare stage's own text, when it wrote one, is kept.
    """
    if d.kind == "cosmetic":
        return d
    on_line = [c for c in calls if c.location.line == d.line and c.resolved] if d.line else []
    hits = [p for p in probes if any(_reaches(c, p.target) for c in on_line)]
    commands = sorted({cmd for c in on_line if suggest_probe and (cmd := suggest_probe(c.resolved or ""))})
    run = f"run `{'`; `'.join(commands)}`" if commands else ""
    if d.validation:
        if hits:
            return replace(d, validation=f"{d.validation}; " + "; ".join(f"probe {probe_id(p)}: {p.verdict}" for p in hits))
        return replace(d, validation=f"{d.validation}; {run}") if run else d
    if not d.line:
        return replace(d, validation="unvalidated: the item exists only upstream")
    if hits:
        return replace(d, validation="; ".join(f"probe {probe_id(p)}: {p.verdict}" for p in hits))
    why = "no probes ran" if not probes else "no probe reaches a kernel called on this line"
    return replace(d, validation=f"unvalidated: {why}; {run}" if run else f"unvalidated: {why}")


# ---------------------------------------------------------------- ordering


def _finding_key(f: Finding) -> tuple[str, int, str, str, str]:
    return (f.location.path, f.location.line, f.rule, f.location.symbol, f.message)


def _dedupe(findings: list[Finding]) -> list[Finding]:
    """Two stages may report the same rule at the same place: one finding. Findings that share a
    fingerprint at different places get an occurrence suffix, so every id is unique."""
    from metax_audit.fingerprints import disambiguate

    seen: dict[tuple[str, str, str, int], Finding] = {}
    for f in findings:
        if f.site in seen:
            kept = seen[f.site]
            if f.message != kept.message:
                seen[f.site] = replace(kept, evidence=(*kept.evidence, f"also: {f.message}", *f.evidence))
            continue
        seen[f.site] = f
    return disambiguate(list(seen.values()))


def _difference_key(d: Difference) -> tuple[int, str, str, str, str]:
    return (d.line, d.kind, d.symbol, d.detail, d.reason)


def _registration_key(r: Registration) -> tuple[str, int, str, str, str]:
    return (r.location.path, r.location.line, r.kind, r.name, r.class_path)


def _probe_key(p: ProbeResult) -> tuple[str, str, str, str]:
    return (p.probe, p.family, p.target, p.verdict)
