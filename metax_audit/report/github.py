# GitHub Actions workflow commands (`--format github`): one `::error file=...,line=...,title=...::` annotation
# per finding the gate counts (new ones, with a baseline), capped, then a count of the rest; printed, not written.
from __future__ import annotations

from metax_audit.core.findings import RULES
from metax_audit.core.models import AuditReport, Finding, Severity

MAX_ANNOTATIONS = 50  # GitHub shows 10 errors and 10 warnings per step; more only lengthen the log
_COMMAND = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}


def _data(text: str) -> str:
    """A workflow command's message: %, CR and LF escaped (GitHub's toolkit escapeData)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _prop(text: str) -> str:
    """A workflow command's property value: also ':' and ',' escaped (toolkit escapeProperty)."""
    return _data(text).replace(":", "%3A").replace(",", "%2C")


def _counted(report: AuditReport) -> list[Finding]:
    """The findings a pull request is asked about: unwaived errors and warnings, only the new or changed
    ones when the review had a baseline; errors first, then the report's order."""
    live = [f for f in report.findings if not f.waived and f.severity is not Severity.INFO]
    if report.baseline_info:
        live = [f for f in live if f.baseline is not None and f.baseline.is_new]
    return sorted(live, key=lambda f: -f.severity.rank)


def workflow_commands(report: AuditReport, cap: int = MAX_ANNOTATIONS) -> list[str]:
    """The workflow-command lines: the headline of a review with unbound kernel packages first, then one
    annotation per counted finding up to `cap`, then one notice saying how many were left out."""
    from metax_audit.stages.inventory import unchecked_headline

    out: list[str] = []
    if unchecked_headline(report):
        out.append(f"::warning title={_prop('metax-audit: review incomplete')}::{_data(unchecked_headline(report))}")
    found = _counted(report)
    for f in found[:cap]:
        rule = RULES.get(f.rule)
        title = f"metax-audit {f.rule}" + (f": {rule.title}" if rule else "")
        where = f"file={_prop(f.location.path)}" + (f",line={f.location.line}" if f.location.line else "")
        state = f"{f.baseline.value.upper()}: " if f.baseline is not None and f.baseline.is_new else ""
        out.append(f"::{_COMMAND[f.severity]} {where},title={_prop(title)}::{_data(state + f.message)}")
    if len(found) > cap:
        rest = len(found) - cap
        out.append(f"::notice title=metax-audit::{rest} more finding{'s' * (rest != 1)} not annotated "
                   f"(at most {cap}): see summary.md")
    return out
