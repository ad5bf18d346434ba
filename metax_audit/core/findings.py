# The rule table: every rule id with its category, default severity and help text. Checks
# create findings only through `make_finding`, so docs/rules.md can be generated from here.
from __future__ import annotations

from dataclasses import dataclass

from metax_audit.core.models import (
    Category,
    Finding,
    InstalledSignature,
    Location,
    ProbeEvidence,
    Severity,
    Site,
    UpstreamCaller,
)


@dataclass(frozen=True)
class Rule:
    id: str
    category: Category
    severity: Severity
    title: str  # reads as a sentence: "call passes a keyword the installed kernel does not accept"
    help: str  # what it means and how to fix or waive it


RULES: dict[str, Rule] = {}


def rule(id: str, category: Category, severity: Severity, title: str, help: str) -> Rule:
    """Register a rule; modules that emit findings declare their rules at import time."""
    if id in RULES and RULES[id] != Rule(id, category, severity, title, help):
        raise ValueError(f"rule {id} declared twice with different content")
    RULES[id] = Rule(id, category, severity, title, help)
    return RULES[id]


def make_finding(
    rule_id: str,
    location: Location,
    message: str,
    evidence: tuple[str, ...] | list[str] = (),
    severity: Severity | None = None,
    *,
    key: str = "",
    sites: tuple[Site, ...] | list[Site] = (),
    installed: InstalledSignature | None = None,
    probe: ProbeEvidence | None = None,
    callers: tuple[UpstreamCaller, ...] = (),
) -> Finding:
    """`key` says what the finding is about when the message holds more (see fingerprints.py)."""
    r = RULES[rule_id]
    return Finding(
        rule=r.id,
        category=r.category,
        severity=severity or r.severity,
        location=location,
        message=message,
        evidence=tuple(evidence),
        key=key,
        sites=tuple(sites),
        installed=installed,
        probe=probe,
        callers=tuple(callers),
    )


# Rules owned by the foundation stages; later stages declare theirs in their own modules.
rule(
    "MXA001",
    Category.COVERAGE,
    Severity.ERROR,
    "file in scope could not be parsed",
    "The file has a syntax error (or is not UTF-8) in the snapshot, so nothing in it was "
    "traced or compared. Fix the file; the audit of its callers is incomplete until then.",
)
rule(
    "MXA002",
    Category.COVERAGE,
    Severity.INFO,
    "file in scope was not analysed by a stage",
    "A stage skipped this file (too large, generated, or outside what the stage reads). "
    "The reason is in the evidence; a reviewer must check the file by hand.",
)
rule(
    "MXA003",
    Category.ENVIRONMENT,
    Severity.WARNING,
    "the port's own test command failed on the snapshot",
    "`--test CMD` ran with the snapshot as working directory and first on PYTHONPATH and "
    "exited non-zero. Its output tail is the evidence.",
)
