"""Compare two review outputs (report.json) finding id by finding id: for a refactoring that must not
change behaviour. Prints the counts, every id only one side has, and every id whose record differs
(severity, message, rule, location, evidence...); also compares files, backends, dataflow, coverage and
probes as wholes and the stage names/notes. Exit 0 when the findings are the same, 1 otherwise.

    python3 benchmarks/same_findings.py BEFORE/report.json AFTER/report.json
"""
from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

VOLATILE = ("generated_at", "wall_seconds", "snapshot", "environment", "stages")


def _load(path: str) -> dict:
    file = Path(path)
    return json.loads((file / "report.json" if file.is_dir() else file).read_text(encoding="utf-8"))


def _by_id(report: dict) -> dict[str, dict]:
    return {f["id"]: f for f in report["findings"]}


def compare(before: dict, after: dict) -> list[str]:
    """The differences, one line each; empty when the findings (and the whole-report sections) agree."""
    a, b = _by_id(before), _by_id(after)
    out = [f"only before: {i} {a[i]['severity']} {a[i]['rule']} {a[i]['message'][:120]}" for i in sorted(a.keys() - b.keys())]
    out += [f"only after: {i} {b[i]['severity']} {b[i]['rule']} {b[i]['message'][:120]}" for i in sorted(b.keys() - a.keys())]
    for i in sorted(a.keys() & b.keys()):
        fields = sorted(k for k in a[i].keys() | b[i].keys() if a[i].get(k) != b[i].get(k))
        if fields:
            out.append(f"same id, other {', '.join(fields)}: {i}")
    for key in sorted(before.keys() & after.keys()):
        if key not in VOLATILE and key != "findings" and before[key] != after[key]:
            out.append(f"section {key} differs")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: same_findings.py BEFORE AFTER (report.json or its folder)", file=sys.stderr)
        return 2
    try:
        before, after = _load(argv[0]), _load(argv[1])
    except (OSError, ValueError, KeyError) as exc:
        print(f"cannot read the reports: {exc}", file=sys.stderr)
        return 2
    for name, report in (("before", before), ("after", after)):
        counts = Counter(f["severity"] for f in report["findings"])
        print(f"{name}: {len(report['findings'])} findings "
              f"({counts['error']} error, {counts['warning']} warning, {counts['info']} info)")
    stages_a = [(s.get("name"), s.get("note")) for s in before.get("stages", [])]
    stages_b = [(s.get("name"), s.get("note")) for s in after.get("stages", [])]
    for sa, sb in zip(stages_a, stages_b, strict=False):
        if sa != sb:
            print(f"stage note (not counted): {sa} -> {sb}")
    diffs = compare(before, after)
    print("\n".join(diffs) if diffs else "same findings: every id with the same record")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
