# `--format text`: one line per finding on stdout, `path:line: severity rule message`, as compilers and
# ruff print them, so editors (errorformat %f:%l: %m), grep and CI logs can read the review.
from __future__ import annotations

from metax_audit.core.models import AuditReport, Finding
from metax_audit.report.text import visible


def finding_line(f: Finding) -> str:
    """`path:line: severity rule message` on one line (no line: `path: ...`); the message whole,
    its whitespace folded and control characters shown as escapes."""
    where = visible(f.location.path or "-") + (f":{f.location.line}" if f.location.line else "")
    return f"{where}: {f.severity.value} {f.rule} {visible(' '.join(f.message.split()))}"


def render_lines(report: AuditReport) -> list[str]:
    """Every unwaived finding, by path and line, then severity and rule."""
    live = [f for f in report.findings if not f.waived]
    live.sort(key=lambda f: (f.location.path, f.location.line, -f.severity.rank, f.rule, f.message))
    return [finding_line(f) for f in live]
