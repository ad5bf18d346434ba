# The JSON report: the stable, versioned schema of DESIGN.md ("metax-audit/report/v1"), with
# sorted keys and ordered lists so two runs on one input differ only in generated_at/wall_seconds.
from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict
from enum import Enum
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from metax_audit.core.models import (
    AuditReport,
    BackendChain,
    Difference,
    FileRecord,
    Finding,
    InstalledSignature,
    LseFlow,
    ProbeEvidence,
    ProbeResult,
    Registration,
    SkippedFile,
    UpstreamCaller,
)

SCHEMA_RESOURCE = "report/schema/report-v1.json"


@cache
def load_schema() -> dict[str, Any]:
    """The JSON Schema shipped in the package (draft 2020-12) for `metax-audit/report/v1`."""
    text = resources.files("metax_audit").joinpath(SCHEMA_RESOURCE).read_text(encoding="utf-8")
    return json.loads(text)


def to_json_dict(report: AuditReport) -> dict[str, Any]:
    from metax_audit.stages.inventory import unchecked_headline

    snap = report.snapshot
    data = {
        "schema": report.schema,
        "tool_version": report.tool_version,
        "generated_at": report.generated_at,
        "wall_seconds": round(report.wall_seconds, 3),
        "snapshot": {"mode": snap.mode, "repo": snap.repo, "commit": snap.commit, "dirty": snap.dirty},
        "upstream": (
            {"package": report.upstream.package, "version": report.upstream.version, "source": report.upstream.source}
            if report.upstream
            else None
        ),
        "base": (
            {"package": report.base.package, "version": report.base.version, "source": report.base.source}
            if report.base
            else None
        ),
        "environment": _plain(report.environment),
        "stages": [
            {"name": s.name, "ran": s.ran, "seconds": round(s.seconds, 3), "note": s.note} for s in report.stages
        ],
        "backends": [backend_to_dict(b) for b in report.backends],
        "files": [_file(f) for f in report.files],
        "findings": [_finding(f) for f in report.findings],
        "probes": [_probe(p) for p in report.probes],
        "coverage": {
            "in_scope": report.coverage.in_scope,
            "analysed": report.coverage.analysed,
            "skipped": [_skip(s) for s in report.coverage.skipped],
            "left_out": [_skip(s) for s in report.coverage.left_out],
        },
        "test_run": (
            {
                "command": report.test_run.command,
                "exit_code": report.test_run.exit_code,
                "seconds": round(report.test_run.seconds, 3),
                "output_tail": report.test_run.output_tail,
            }
            if report.test_run
            else None
        ),
        "waivers": _plain(report.waivers),
        "dataflow": [_plain(_flow(f)) for f in report.dataflow],
        "baseline": _plain(report.baseline_info) if report.baseline_info else None,
        "fixed": [_finding(f) for f in report.fixed],
        "incomplete": unchecked_headline(report) or None,
        "unbound": [{"module": u.module, "pin": u.pin, "path": u.location.path, "line": u.location.line, "why": u.why,
                     "calls": u.calls, "accepted_by": u.accepted_by} for u in report.unbound],
    }
    # The snapshot is a temporary export; its path must never leak into a report.
    return _scrub(data, str(snap.root)) if str(snap.root) not in ("", ".") else data


def dumps(report: AuditReport) -> str:
    return json.dumps(to_json_dict(report), indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"


_WALL_UNSET = -1.0
_WALL_LINE = '\n  "wall_seconds": '  # top level (indent 2): a string in JSON never holds a raw newline


def dumps_until_wall(report: AuditReport) -> Callable[[float], str]:
    """The report rendered now, but for its wall time: the returned function fills that in (the run
    is timed to the last report rendered, and this one is the largest to render)."""
    from dataclasses import replace

    text = dumps(replace(report, wall_seconds=_WALL_UNSET))
    mark = f"{_WALL_LINE}{_WALL_UNSET}"
    if text.count(mark) != 1:  # never expected: the key is written once, at top level
        raise ValueError("report.json: the wall_seconds line is not unique")
    return lambda wall: text.replace(mark, f"{_WALL_LINE}{json.dumps(round(wall, 3))}", 1)


def write_json(report: AuditReport, path: Path) -> Path:
    path.write_text(dumps(report), encoding="utf-8")
    return path


# ---------------------------------------------------------------- pieces


def _flow(flow: LseFlow) -> dict[str, Any]:
    """A flow as the report's JSON holds it; a probe request as the command that reruns it (what a
    mismatched flow gets wrong is said in its reasons' words)."""
    return {"producer": asdict(flow.producer), "consumer": asdict(flow.consumer), "steps": [asdict(s) for s in flow.steps],
            "verdict": flow.verdict, "reasons": list(flow.reasons), "probes": [p.command for p in flow.probes]}


def _registration(r: Registration) -> dict[str, Any]:
    selected = {"selected_by": r.selected_by, "condition": r.condition} if r.selected_by else {}
    return {
        "kind": r.kind,
        "name": r.name,
        "class_path": r.class_path,
        "path": r.location.path,
        "line": r.location.line,
        "resolved": r.resolved,
        "resolved_path": r.resolved_path,
        **selected,
    }


def _difference(d: Difference) -> dict[str, Any]:
    return {
        "kind": d.kind,
        "line": d.line,
        "symbol": d.symbol,
        "declared": d.declared,
        "reason": d.reason,
        "action": d.action,
        "validation": d.validation,
        "detail": d.detail,
        "upstream_line": d.upstream_line,
    }


def _file(f: FileRecord) -> dict[str, Any]:
    return {
        "path": f.path,
        "reason": f.reason,
        "upstream_path": f.upstream_path,
        "registrations": [_registration(r) for r in f.registrations],
        "callers": list(f.callers),
        "differences": [_difference(d) for d in f.differences],
        "findings": list(f.findings),
        "probes": list(f.probes),
        "status": f.status,
        "status_reason": f.status_reason,
    }


def backend_to_dict(b: BackendChain) -> dict[str, Any]:
    """A traced backend as the report's `backends` entry (also `metax-audit trace --format json`)."""
    return {
        "name": b.name,
        "class_path": b.class_path,
        "registered_at": {"path": b.registered_at.path, "line": b.registered_at.line} if b.registered_at else None,
        "active": b.active,
        "capture_support": b.capture_support,
        **({"condition": b.condition} if b.condition else {}),
        "chain": [
            {"role": h.role, "qualname": h.qualname, "path": h.path, "line": h.line, "resolved": h.resolved,
             "inherited_from": h.inherited_from}
            for h in b.chain
        ],
        "unresolved": [
            {"path": u.location.path, "line": u.location.line, "text": u.text, "reason": u.reason}
            for u in sorted(b.unresolved, key=lambda u: (u.location, u.text))
        ],
    }


def _finding(f: Finding) -> dict[str, Any]:
    return {
        "id": f.id,
        "rule": f.rule,
        "category": f.category.value,
        "severity": f.severity.value,
        "path": f.location.path,
        "line": f.location.line,
        "symbol": f.location.symbol,
        "message": f.message,
        "evidence": list(f.evidence),
        "sites": [{"path": x.path, "line": x.line, "symbol": x.symbol, "kind": x.kind, "detail": x.detail,
                   "verdict": x.verdict, "upstream": x.upstream, "change": x.change, "keywords": list(x.keywords)} for x in f.sites],
        "installed": _installed(f.installed) if f.installed is not None else None,
        "probe": _probe_evidence(f.probe) if f.probe is not None else None,
        "callers": [_caller(c) for c in f.callers],
        "waived": f.waived,
        "waiver_reason": f.waiver_reason,
        "content": f.content,
        "status": f.baseline.value if f.baseline is not None else None,
    }


def _caller(c: UpstreamCaller) -> dict[str, Any]:
    return {"path": c.path, "line": c.line, "function": c.function, "passes": c.passes, "live": c.live, "why": c.why}


def _installed(s: InstalledSignature) -> dict[str, Any]:
    return {"callable": s.callable, "signature": s.signature, "read_from": s.read_from, "origin": s.origin,
            "file": s.file, "line": s.line, "distribution": s.distribution, "version": s.version}


def _probe_evidence(p: ProbeEvidence) -> dict[str, Any]:
    return {"probe": p.probe, "target": p.target, "family": p.family, "verdict": p.verdict, "observed": p.observed,
            "expected": p.expected, "device": p.device}


def _probe(p: ProbeResult) -> dict[str, Any]:
    return {
        "probe": p.probe,
        "family": p.family,
        "target": p.target,
        "verdict": p.verdict,
        "matched": p.matched,
        "expected": p.expected,
        "hypotheses": {k: _plain(v) for k, v in sorted(p.hypotheses.items())},
        "worst_error": _plain(p.worst_error),
        "device": p.device,
        "skipped_reason": p.skipped_reason,
        "details": _plain(p.details),
    }


def _skip(s: SkippedFile) -> dict[str, str]:
    return {"path": s.path, "reason": s.reason}


def _plain(value: Any) -> Any:
    """JSON-safe copy: enums to values, paths and unknown objects to str, non-finite floats to str."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((_plain(v) for v in value), key=str)
    return str(value)


def _scrub(value: Any, root: str) -> Any:
    if isinstance(value, str):
        return value.replace(root, "<snapshot>") if root in value else value
    if isinstance(value, dict):
        return {k: _scrub(v, root) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub(v, root) for v in value]
    return value
