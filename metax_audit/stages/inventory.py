# The inventory: one record per file in scope (registrations, callers, upstream counterpart,
# differences, findings, probe coverage, status), built from whatever stages ran; plus the CI gate.
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, Final

from metax_audit.core.errors import ConfigError
from metax_audit.core.models import (
    AuditReport,
    CallSite,
    Comparison,
    Coverage,
    Difference,
    Discovery,
    FileComparison,
    FileRecord,
    FileStatus,
    Finding,
    ProbeResult,
    Registration,
    Severity,
    SkippedFile,
    SnapshotInfo,
    SourceFile,
    StackFacts,
    StageRecord,
    TestRun,
    TraceResult,
    UpstreamInfo,
)
from metax_audit.stages.checks.signatures import UNCHECKED_EXTENSION
from metax_audit.stages.checks.stack import calls_by_path

FAIL_ON = ("error", "warning", "info", "never")

# Statuses a file record can take; "not-analysed" always carries a reason.
OK: Final = "ok"
NEEDS_ACTION: Final = "needs-action"
NOT_ANALYSED: Final = "not-analysed"

# Rules that mean "this file was not analysed" (declared by the foundation in findings.py).
_NOT_ANALYSED_RULES = frozenset({"MXA001", "MXA002"})


def environment_summary(facts: StackFacts | None, python: str | None) -> dict[str, Any]:
    """The report's environment: the target interpreter and where the stack facts came from."""
    env: dict[str, Any] = {"python": python or "current interpreter"}
    if facts is not None:
        env["stack_source"] = facts.source
        env["stack_captured_at"] = facts.captured_at
        env["stack_host"] = facts.host
        env["distributions"] = facts.distributions
    return env


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
    calls = calls_by_path(trace)

    paths = set(sources) | set(compared)
    if trace is not None:
        paths |= set(trace.reached_files)

    all_findings = _dedupe(sorted(findings, key=_finding_key))
    by_path: dict[str, list[Finding]] = {}
    for f in all_findings:
        by_path.setdefault(f.location.path, []).append(f)
        # A finding that stands for places in other files (an import error's other sites, a grouped root
        # cause) is listed on each of their pages too.
        for other in dict.fromkeys(s.path for s in f.sites if s.path not in ("", ".", f.location.path)):
            by_path.setdefault(other, []).append(f)

    sorted_probes = tuple(sorted(probes, key=_probe_key))
    records = [
        _file_record(path, sources.get(path), compared.get(path), by_path.get(path, []), discovery, trace, comparison,
                     calls.get(path, []), sorted_probes, suggest_probe)
        for path in sorted(paths)
    ]
    # Callers outside the scope (models, customized layers importing attention modules): bound where they
    # touch the attention code (their imports of modules in scope), listed with what was found there.
    callers = sorted({c for cs in discovery.callers.values() for c in cs} - paths) if discovery else []
    scoped = records
    records = sorted([*records, *(_caller_record(c, by_path.get(c, []), discovery) for c in callers)],  # type: ignore[arg-type]
                     key=lambda r: r.path)

    skipped = tuple(SkippedFile(r.path, r.status_reason) for r in scoped if r.status == NOT_ANALYSED)
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
            in_scope=len(scoped),
            analysed=len(scoped) - len(skipped),
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


def _file_record(
    path: str, src: SourceFile | None, comp: FileComparison | None, here: list[Finding], discovery: Discovery | None,
    trace: TraceResult | None, comparison: Comparison | None, calls: Sequence[CallSite], probes: Sequence[ProbeResult],
    suggest_probe: Callable[[str], str | None] | None,
) -> FileRecord:
    """One file's record: why it is in scope, its registrations, callers, validated differences,
    findings, the probes that reach its kernels, and its status."""
    regs: tuple[Registration, ...] = ()
    if discovery is not None:
        regs = tuple(sorted(
            (r for r in discovery.registrations if path in (r.location.path, r.resolved_path)),
            key=_registration_key,
        ))
    status, status_reason = _status(src, comp, here, trace, comparison)
    return FileRecord(
        path=path,
        reason=src.reason if src else ("reached-by-trace" if trace and path in trace.reached_files else "compared"),
        upstream_path=comp.upstream_path if comp else None,
        registrations=regs,
        callers=tuple(sorted(set(discovery.callers.get(path, ())))) if discovery else (),
        differences=tuple(sorted((_validated(d, calls, probes, suggest_probe) for d in comp.differences),
                                 key=_difference_key)) if comp else (),
        findings=tuple(f.id for f in here),
        probes=tuple(probe_id(p) for p in probes if any(_reaches(c, p.target) for c in calls)),
        status=status,
        status_reason=status_reason,
    )


CALLER: Final = "caller"  # the reason of a caller's record: outside the scope, imports a module in it


def _caller_record(path: str, here: list[Finding], discovery: Discovery) -> FileRecord:
    """A caller outside the scope: which files in scope it imports, and its findings (its imports of them)."""
    imports = tuple(sorted(t for t, cs in discovery.callers.items() if path in cs))
    open_ = [f for f in here if not f.waived and f.severity.rank >= Severity.WARNING.rank]
    counts = severity_counts(open_)
    return FileRecord(
        path=path, reason=CALLER, upstream_path=None, registrations=(), callers=(), differences=(),
        findings=tuple(f.id for f in here), probes=(), status=NEEDS_ACTION if open_ else OK,
        status_reason=("unwaived findings: " + ", ".join(f"{n} {sev}" for sev, n in counts.items() if n)) if open_ else
        "caller outside the scope: its imports of " + ", ".join(imports) + " are bound")


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


def unchecked_extensions(findings: Iterable[Finding]) -> dict[tuple[str, str], int]:
    """(kernel package, keyword) -> the calls passing a keyword that the public base of a package config's
    vendor-extends names lacks: bound against that base, so not checked (signatures, MXA113)."""
    out: dict[tuple[str, str], int] = {}
    for f in findings:
        if f.rule == UNCHECKED_EXTENSION and not f.waived:
            _, _, about = f.location.symbol.partition(":")
            target, _, keyword = about.rpartition(":")
            key = (target.split(".", 1)[0], keyword)
            out[key] = out.get(key, 0) + max(1, len(f.sites))
    return out


def unchecked_headline(report: AuditReport) -> str:
    """The line every format leads with when part of the pinned stack's calls went unchecked: pinned kernel
    packages accepted unbound (allow-unbound), and keywords only a vendor build that extends its public base
    may take (vendor-extends); how many calls, into what; "" when the review checked every call it bound."""
    parts = []
    if report.unbound:
        calls = sum(u.calls for u in report.unbound)
        into = ", ".join(f"{u.module} ({u.calls})" for u in report.unbound)
        accepted = ", ".join(dict.fromkeys(u.accepted_by for u in report.unbound))
        parts.append(f"{calls} call{'s' * (calls != 1)} unchecked, into {into}: pinned but not bound (accepted by {accepted})")
    extensions = unchecked_extensions(report.findings)
    if extensions:
        calls = sum(extensions.values())
        into = ", ".join(f"{kw}= into {pkg} ({n})" for (pkg, kw), n in sorted(extensions.items()))
        parts.append(f"{calls} call{'s' * (calls != 1)} unchecked, passing {into}: absent from the public base, the vendor "
                     "build may take it (vendor-extends; bind with a --stack manifest from `evidence --capture-stack`)")
    return "INCOMPLETE: " + "; ".join(parts) if parts else ""


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
    if unchecked_headline(report):
        text += f"; {unchecked_headline(report)}"
    return f"{text}, {report.wall_seconds:.1f} s"


# ---------------------------------------------------------------- status


def _status(
    src: SourceFile | None,
    comp: FileComparison | None,
    here: Sequence[Finding],
    trace: TraceResult | None,
    comparison: Comparison | None,
) -> tuple[FileStatus, str]:
    if src is not None and src.problem is not None:
        # discover also records size skips here, which are not syntax errors
        why = src.problem.message
        return NOT_ANALYSED, f"parse error: {why}" if src.problem.broken else f"not parsed: {why}"
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


# ---------------------------------------------------------------- probe coverage


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
    from metax_audit.core.fingerprints import disambiguate

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
