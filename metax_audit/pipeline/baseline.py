# New vs baseline: which revision a review is compared with, and the state of each finding
# against the baseline review (new, changed, unchanged; fixed for the baseline's own leftovers).
"""`review --staged` and `--worktree` compare with HEAD unless told otherwise; `--rev A` compares
with `--baseline REV`, or with the merge base of A and a named branch (`--merge-base BRANCH`).
Findings are matched by id (fingerprints.py): an id absent from the baseline is new; a present id
whose content hash differs is changed (it gates like a new one: a new mismatch in a known flow is
news); the rest are unchanged. The baseline's findings that this review lacks are fixed.

New and changed findings come first in `report.findings`, so every renderer that keeps the order
(terminal, Markdown, JSON, SARIF) shows them first."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING

from metax_audit.core.errors import SnapshotError
from metax_audit.core.models import AuditReport, BaselineState, Finding, SnapshotInfo

if TYPE_CHECKING:
    from metax_audit.core.config import AuditConfig
    from metax_audit.core.options import ReviewOptions


def baseline_rev(options: ReviewOptions, snap: SnapshotInfo) -> str | None:
    """The revision to compare with, or None when the review has no baseline."""
    if options.no_baseline or snap.mode == "installed":
        return None
    if options.baseline:
        return options.baseline
    if options.merge_base:
        return merge_base(options, snap)
    if snap.mode in ("staged", "worktree") and snap.commit is not None:
        return "HEAD"
    return None


def merge_base(options: ReviewOptions, snap: SnapshotInfo) -> str:
    from pathlib import Path

    from metax_audit.core import gitcmd
    from metax_audit.stages.snapshot import find_repo

    top = find_repo(options.repo or Path.cwd())
    tip = snap.commit or "HEAD"
    res = gitcmd.run(top, "merge-base", tip, str(options.merge_base), timeout=60)
    if res.returncode != 0 or not res.stdout.strip():
        raise SnapshotError(f"no merge base of {tip[:12]} and {options.merge_base!r} (is the branch name right?)")
    return res.stdout.strip()


def baseline_options(options: ReviewOptions, rev: str, config: AuditConfig | None = None) -> ReviewOptions:
    """The same review of `rev`: same upstream, stack, scope, waivers and config (the subject's, when
    given: what the subject is reviewed under, its baseline is too); no probes, tests or baseline."""
    return replace(options, mode="rev", rev=rev, baseline=None, merge_base=None, no_baseline=True,
                   run_probes=False, test_command=None, config=config if config is not None else options.config)


def compare_with(report: AuditReport, base: AuditReport, rev: str) -> AuditReport:
    """`report` with each finding's state against `base`, new ones first, and the fixed ones."""
    before = {f.id: f for f in base.findings}
    # A finding triage folded into another (a difference that became an error's root cause) is still
    # there: inside that finding. It is neither fixed when it joins one, nor new when it stands alone again.
    joined_before = {j for f in base.findings for j in f.joined}
    joined_now = {j for f in report.findings for j in f.joined}
    marked: list[Finding] = []
    for f in report.findings:
        old = before.get(f.id)
        state = (BaselineState.CHANGED if old is None and _unsuffixed(f.id) in joined_before
                 else BaselineState.NEW if old is None
                 else BaselineState.CHANGED if old.content != f.content else BaselineState.UNCHANGED)
        marked.append(replace(f, baseline=state))
    ids = {f.id for f in report.findings}
    fixed = tuple(replace(f, baseline=BaselineState.FIXED) for f in base.findings
                  if f.id not in ids and _unsuffixed(f.id) not in joined_now)
    # Stable: new/changed first, each part in the inventory's order.
    marked.sort(key=lambda f: not (f.baseline is not None and f.baseline.is_new))
    counts = Counter(f.baseline.value for f in marked if f.baseline is not None)
    info = {"rev": rev, "commit": base.snapshot.commit, "new": counts["new"], "changed": counts["changed"],
            "unchanged": counts["unchanged"], "fixed": len(fixed)}
    return replace(report, findings=tuple(marked), fixed=fixed, baseline_info=info)


def _unsuffixed(finding_id: str) -> str:
    """The id before fingerprints.disambiguate's -2, -3 suffix (triage records ids before it runs)."""
    head, _, tail = finding_id.rpartition("-")
    return head if tail.isdigit() and head.count("-") >= 1 else finding_id


def new_findings(report: AuditReport) -> list[Finding]:
    return [f for f in report.findings if f.baseline is not None and f.baseline.is_new]
