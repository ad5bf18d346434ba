# Triage: a binding finding (a call, an import, an attribute read, a name) whose every place lies inside a branch the
# vendor platform never takes has no consequence there: the statement never runs on it. 1e74892^ read
# ops.persistent_topk, which vLLM 0.25.0 does not define, only under `if current_platform.is_cuda() and ...`: False
# on an out-of-tree platform, so the read is info with that branch as its gate, not an error. The branch is judged
# by the same evaluation of the platform class's fixed answers as the compare's (consequence.enclosing_gate).
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from metax_audit.core.models import Finding, Severity
from metax_audit.core.pysource import read_source_cached
from metax_audit.stages.compare.consequence import VendorPlatform, enclosing_gate

# The rules whose consequence happens where their statement runs: the calls bound against a signature or an op, the
# imports, the attribute reads and the names read. Claims, graph capture and registrations hold whatever path runs.
AT_STATEMENT = frozenset({
    *(f"MXA{n}" for n in range(101, 113)),
    *(f"MXA{n}" for n in range(120, 130)),
    "MXA170", "MXA174", "MXA175",
})
_MAX_BYTES = 5_000_000


def demote_never_taken(findings: Sequence[Finding], platform: VendorPlatform, port_root: Path) -> list[Finding]:
    gate_at = _Gates(platform, port_root)
    out = []
    for f in findings:
        if f.severity in (Severity.ERROR, Severity.WARNING) and f.rule in AT_STATEMENT and f.location.line:
            places = dict.fromkeys([(f.location.path, f.location.line), *((s.path, s.line) for s in f.sites if s.line)])
            gates = [gate_at(path, line) for path, line in places]
            if all(gates):
                why = "; ".join(dict.fromkeys(f"{path}:{line}: {gate}" for (path, line), gate in zip(places, gates, strict=True)))
                f = replace(f, severity=Severity.INFO, evidence=(*f.evidence, f"gate: never runs on the vendor platform: {why}"))
        out.append(f)
    return out


class _Gates:
    """The never-taken branch holding a line of a port file ("" when none does, or the file cannot be read)."""

    def __init__(self, platform: VendorPlatform, port_root: Path) -> None:
        self._platform, self._root = platform, port_root
        self._seen: dict[tuple[str, int], str] = {}

    def __call__(self, path: str, line: int) -> str:
        key = (path, line)
        if key not in self._seen:
            self._seen[key] = self._gate(path, line)
        return self._seen[key]

    def _gate(self, path: str, line: int) -> str:
        full = self._root / path
        if not full.is_file():
            return ""
        tree = read_source_cached(self._root, path, _MAX_BYTES).tree
        return enclosing_gate(tree, (line, line), self._platform) if tree is not None else ""

