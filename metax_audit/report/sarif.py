# SARIF 2.1.0 for GitHub code scanning: every rule with its help text, one result per finding
# with a repo-relative location, cut to GitHub's upload limits (most severe results kept).
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from metax_audit.core.findings import RULES, Rule
from metax_audit.core.models import AuditReport, Finding
from metax_audit.report.text import uri

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
# GitHub keeps at most 5,000 results of a run (25,000 in a file); a longer message is cut so
# one huge traceback cannot push a file over the upload size.
MAX_RESULTS_PER_RUN = 5000
MAX_RESULTS_TOTAL = 25000
MAX_MESSAGE_CHARS = 4000
MAX_EVIDENCE_LINES = 20

_LEVEL = {"error": "error", "warning": "warning", "info": "note"}


def to_sarif_dict(report: AuditReport) -> dict[str, Any]:
    rules = _rules(report)
    index = {r.id: i for i, r in enumerate(rules)}
    limit = min(MAX_RESULTS_PER_RUN, MAX_RESULTS_TOTAL)
    # Most severe first, so a cut drops infos before errors; then the report's stable order.
    ranked = sorted(enumerate(report.findings), key=lambda p: (-p[1].severity.rank, p[0]))
    kept = sorted(ranked[:limit], key=lambda p: p[0])
    dropped = len(report.findings) - len(kept)

    run: dict[str, Any] = {
        "tool": {
            "driver": {
                "name": "metax-audit",
                "version": report.tool_version,
                "semanticVersion": report.tool_version,
                "rules": [_rule(r) for r in rules],
            }
        },
        "automationDetails": {"id": f"metax-audit/{report.snapshot.mode}/"},
        "columnKind": "unicodeCodePoints",
        "results": [_result(f, index) for _, f in kept],
        "properties": {
            "schema": report.schema,
            "snapshot": {"mode": report.snapshot.mode, "commit": report.snapshot.commit, "dirty": report.snapshot.dirty},
            "resultsDropped": dropped,
        },
    }
    from metax_audit.stages.inventory import unchecked_headline

    notes = []
    if unchecked_headline(report):  # the review left part of the pinned stack unchecked: its headline, first
        notes.append({"level": "error", "message": {"text": unchecked_headline(report)}})
        run["properties"]["incomplete"] = unchecked_headline(report)
    if dropped:
        notes.append({
            "level": "warning",
            "message": {"text": f"{dropped} lower-severity results left out to stay within {limit} results per run; see report.json for all"},
        })
    if notes:
        run["invocations"] = [{"executionSuccessful": True, "toolExecutionNotifications": notes}]
    return {"$schema": SARIF_SCHEMA, "version": SARIF_VERSION, "runs": [run]}


def dumps(report: AuditReport) -> str:
    return json.dumps(to_sarif_dict(report), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_sarif(report: AuditReport, path: Path) -> Path:
    path.write_text(dumps(report), encoding="utf-8")
    return path


def _rules(report: AuditReport) -> list[Rule]:
    """The rules the findings use, by id; the set of imported modules must not change the file."""
    used: dict[str, Rule] = {}
    if any(f.rule not in RULES for f in report.findings):
        # a review served from the result cache (or checked in a forked child) never imported the modules
        # that declare its rules: load them all, so that every rule has its help text
        from metax_audit.report.rules_doc import load_all_rules

        load_all_rules()
    for f in report.findings:
        used[f.rule] = RULES.get(f.rule) or Rule(
            f.rule, f.category, f.severity, f"{f.category.value} finding", "No help text was declared for this rule."
        )
    return [used[k] for k in sorted(used)]


def _rule(r: Rule) -> dict[str, Any]:
    return {
        "id": r.id,
        "name": "".join(w.capitalize() for w in r.category.value.split("-")) + r.id,
        "shortDescription": {"text": r.title},
        "fullDescription": {"text": r.help},
        "help": {
            "text": f"{r.title}\n\n{r.help}",
            "markdown": f"**{r.title}** (category `{r.category.value}`)\n\n{r.help}",
        },
        "defaultConfiguration": {"level": _LEVEL[r.severity.value]},
        "properties": {"tags": [r.category.value], "category": r.category.value},
    }


def _message(f: Finding) -> str:
    lines = [f.message]
    if f.evidence:
        lines.append("Evidence:")
        lines += [f"- {e}" for e in f.evidence[:MAX_EVIDENCE_LINES]]
        if len(f.evidence) > MAX_EVIDENCE_LINES:
            lines.append(f"- ... {len(f.evidence) - MAX_EVIDENCE_LINES} more in report.json")
    text = "\n".join(lines)
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[: MAX_MESSAGE_CHARS - 40].rstrip() + " ... (truncated; see report.json)"
    return text


def _result(f: Finding, index: dict[str, int]) -> dict[str, Any]:
    result: dict[str, Any] = {
        "ruleId": f.rule,
        "ruleIndex": index[f.rule],
        "level": _LEVEL[f.severity.value],
        "message": {"text": _message(f)},
        # v2: the id no longer holds a line number (fingerprints.py), so alerts survive unrelated edits.
        "partialFingerprints": {"metaxAuditFindingId/v2": f.id},
        "properties": {"category": f.category.value, "findingId": f.id},
    }
    if f.installed is not None:  # the typed evidence, as the JSON report has it
        from metax_audit.report.json_report import _installed

        result["properties"]["installed"] = _installed(f.installed)
    if f.probe is not None:
        from metax_audit.report.json_report import _probe_evidence

        result["properties"]["probe"] = _probe_evidence(f.probe)
    if f.baseline is not None:  # SARIF's word for "fixed" results is absent; changed is updated
        result["baselineState"] = {"new": "new", "changed": "updated", "unchanged": "unchanged"}.get(f.baseline.value, "absent")
    # "." marks a finding about the whole snapshot (a failed test command): no file to point at.
    if f.location.path not in ("", "."):
        region = {"startLine": max(f.location.line, 1)}
        loc: dict[str, Any] = {
            "physicalLocation": {"artifactLocation": {"uri": uri(f.location.path), "uriBaseId": "%SRCROOT%"}, "region": region}
        }
        if f.location.symbol:
            loc["logicalLocations"] = [{"fullyQualifiedName": f.location.symbol}]
        result["locations"] = [loc]
        # Every other place the finding stands for (the functions of a file the sync left behind, the other
        # import sites, the uses that fail with it) is a location of the same result.
        seen = {(f.location.path, f.location.line)}
        for site in f.sites:
            if site.path in ("", ".") or (site.path, site.line) in seen:
                continue
            seen.add((site.path, site.line))
            more: dict[str, Any] = {"physicalLocation": {"artifactLocation": {"uri": uri(site.path), "uriBaseId": "%SRCROOT%"},
                                                         "region": {"startLine": max(site.line, 1)}}}
            if site.symbol:
                more["logicalLocations"] = [{"fullyQualifiedName": site.symbol}]
            result["locations"].append(more)
    if f.waived:
        result["suppressions"] = [{"kind": "external", "justification": f.waiver_reason or "waived"}]
    return result
