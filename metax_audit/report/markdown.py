# Markdown for reviewers: summary.md (files, findings by category and severity, backends, probes,
# coverage) and one page per file with every difference and finding linked to its file:line.
from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from metax_audit.core.models import AuditReport, CallSite, Category, Difference, FileRecord, Finding, Severity
from metax_audit.report.first_screen import first_screen, grouped, statement, untouched_line, what_why
from metax_audit.report.text import cut_words, uri, visible
from metax_audit.stages.inventory import NEEDS_ACTION, NOT_ANALYSED, probe_id, severity_counts, summary_line

FILES_DIR = "files"
_STATUS_MARK = {"ok": "ok", NEEDS_ACTION: "**needs action**", NOT_ANALYSED: "_not analysed_"}

# A link maker turns (repo-relative path, line) into a Markdown target, or None for plain text.
Linker = Callable[[str, int], "str | None"]


# A page's name is at most this many bytes: NAME_MAX is 255 on common filesystems, and the report is
# staged under a longer name first; a 240-character file name made every review of its repo exit 2.
PAGE_NAME_MAX = 160


def page_name(path: str, *, hashed: bool = False) -> str:
    """files/<path with slashes as __>.md: flat, so the pages sort like the paths (a control
    character in the path is written as its escape: no such byte ever reaches a file name). A name
    past PAGE_NAME_MAX bytes (or `hashed`: one that another path's page already has) is a readable
    prefix plus a hash of the whole path."""
    import hashlib

    flat = visible(path).replace("/", "__")
    if not hashed and len(flat.encode()) + 3 <= PAGE_NAME_MAX:
        return flat + ".md"
    digest = hashlib.sha256(path.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    head = flat.encode()[: PAGE_NAME_MAX - len(digest) - 5].decode("utf-8", "ignore")
    return f"{head}--{digest}.md"


def page_names(paths: Sequence[str]) -> dict[str, str]:
    """Each path's page name, distinct even where flattening or a case-insensitive filesystem would
    make two the same (`a/b.py` and `a__b.py`): the later path, in sorted order, gets the hashed name."""
    names: dict[str, str] = {}
    taken: set[str] = set()
    for path in sorted(set(paths)):
        name = page_name(path)
        if name.casefold() in taken:
            name = page_name(path, hashed=True)
        taken.add(name.casefold())
        names[path] = name
    return names


def source_linker(report: AuditReport, page_dir: Path) -> Linker:
    """Links into the audited repo when the page lies inside it (reports/ in the checkout)."""
    if not report.snapshot.repo:
        return no_links
    try:
        repo = Path(report.snapshot.repo).resolve()
        rel = os.path.relpath(repo, page_dir.resolve())
        page_dir.resolve().relative_to(repo)
    except (ValueError, OSError):
        return no_links
    prefix = Path(rel).as_posix()

    def link(path: str, line: int) -> str | None:
        if not path:
            return None
        return uri(f"{prefix}/{path}") + (f"#L{line}" if line else "")

    return link


def no_links(path: str, line: int) -> str | None:
    return None


# ---------------------------------------------------------------- helpers


_SPECIAL = re.compile(r"([\\*_\[\]<>|])")


def _md(text: str) -> str:
    """Plain text with its `code spans` kept: Markdown and HTML specials outside them escaped,
    control characters shown as escapes. Spans are paired as CommonMark pairs them (a run of n
    backticks closes only at the next run of exactly n); a run that closes nothing is escaped."""
    text = visible(" ".join(text.split()))
    runs = list(re.finditer("`+", text))
    out: list[str] = []
    pos = k = 0
    while k < len(runs):
        opener = runs[k]
        width = len(opener.group())
        closer = next((j for j in range(k + 1, len(runs)) if len(runs[j].group()) == width), None)
        out.append(_SPECIAL.sub(r"\\\1", text[pos:opener.start()]))
        if closer is None:
            out.append("\\`" * width)
            pos, k = opener.end(), k + 1
            continue
        out.append(text[opener.start():runs[closer].end()].replace("|", "\\|"))
        pos, k = runs[closer].end(), closer + 1
    out.append(_SPECIAL.sub(r"\\\1", text[pos:]))
    return "".join(out)


def code(text: object, *, table: bool = False) -> str:
    """`text` as one Markdown code span, whatever it holds: fenced with one backtick more than its
    longest run of backticks (padded with a space where it starts or ends with one), so a backtick in
    a file name can never close the span and let what follows (`<img onerror=...>`) be raw HTML. In a
    table cell (`table`) a pipe is escaped as GFM requires even inside a span."""
    body = visible(" ".join(str(text).split()))
    if table:
        body = body.replace("|", "\\|")
    run = max((len(m) for m in re.findall("`+", body)), default=0)
    fence = "`" * (run + 1)
    pad = " " if body.startswith(("`", " ")) or body.endswith(("`", " ")) or not body else ""
    return f"{fence}{pad}{body}{pad}{fence}"


def _code(text: str) -> str:
    """Evidence: one code span, or (when it quotes code spans of its own) _md, which keeps them and
    escapes every HTML and Markdown special outside them."""
    return code(text) if "`" not in text else _md(text)


def _cell(text: object) -> str:
    return _md("" if text is None else str(text)) or " "


def _loc(path: str, line: int, link: Linker) -> str:
    label = f"{path}:{line}" if line else path
    target = link(path, line)
    return f"[{code(label, table=True)}]({target})" if target else code(label, table=True)


def _table(header: list[str], rows: Sequence[Sequence[object]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(_cell(c) if not isinstance(c, _Raw) else str(c) for c in row) + " |" for row in rows]
    return out


class _Raw(str):
    """A cell already written as Markdown (a link); not escaped again."""


def _finding_line(f: Finding, link: Linker) -> list[str]:
    waived = f" — waived: {f.waiver_reason or 'no reason given'}" if f.waived else ""
    head = f"- **{f.severity.value}** {code(f.rule)} {_loc(f.location.path, f.location.line, link)}"
    if f.location.symbol:
        head += f" {code(f.location.symbol)}"
    out = [f"{head}: {_md(f.message)}{_md(waived)} <sub>{f.id}</sub>"]
    out += [f"  - {_code(e)}" for e in f.evidence]
    return out


def _inline(text: str) -> str:
    return _md(text)


# ---------------------------------------------------------------- summary


def render_summary(report: AuditReport, link: Linker = no_links, page_link: Callable[[str], str] | None = None) -> str:
    if page_link is None:
        names = page_names([rec.path for rec in report.files])
        page_link = lambda p: f"{FILES_DIR}/{names.get(p) or page_name(p)}"  # noqa: E731
    out = ["# metax-audit review", ""]
    out += _first_screen(report, link, page_link)
    out += [f"**{summary_line(report)}**", ""]
    out += _inputs_lines(report)
    not_run = [s for s in report.stages if not s.ran]
    if not_run:
        out.append("> **Stages that did not run:** " + "; ".join(f"{s.name}" + (f" ({_inline(s.note)})" if s.note else "") for s in not_run))
        out.append("")

    out += new_findings_section(report, link)

    out += ["## Findings by category", ""]
    out += _category_table(report.findings)
    out.append("")
    out += _files_section(report, page_link)
    out += _backends_section(report, link)
    out += _probes_section(report)
    out += _dataflow_section(report, link)
    out += _gaps_section(report)
    out += _findings_section(report, link)
    out += _runs_section(report)
    return visible("\n".join(out).rstrip(), lines=True) + "\n"  # no control character from the repo survives


def _inputs_lines(report: AuditReport) -> list[str]:
    """What was reviewed against what: snapshot, upstream, base, tool, coverage."""
    snap = report.snapshot
    out: list[str] = []
    commit = snap.commit[:12] if snap.commit else "no commit"
    label = f" {code(snap.label)}" if snap.label else ""
    out.append(f"- snapshot: {snap.mode}{label} at {code(commit)}" + (" (worktree dirty)" if snap.dirty else ""))
    out.extend(f"  - note: {_md(note)}" for note in snap.notes)
    if report.upstream:
        up = report.upstream
        out.append(f"- upstream: {code(up.package)} {up.version or 'unknown version'} ({up.source})")
    else:
        out.append("- upstream: none (no comparison with upstream)")
    if report.base:
        out.append(f"- base (last synced release): {code(report.base.package)} {report.base.version or 'unknown version'} ({report.base.source})")
    out.append(f"- tool: metax-audit {report.tool_version}" + (f", generated {report.generated_at}" if report.generated_at else ""))
    cov = report.coverage
    out.append(
        f"- coverage: {cov.analysed} of {cov.in_scope} files in scope analysed"
        + (f", {len(cov.skipped)} not analysed" if cov.skipped else "")
        + (f", {len(cov.left_out)} left out by PATHS" if cov.left_out else "")
    )
    out.append("")
    return out


def _files_section(report: AuditReport, page_link: Callable[[str], str]) -> list[str]:
    out: list[str] = []
    out += ["## Files", ""]
    rows = []
    for rec in report.files:
        counts = severity_counts(_findings_of(report, rec))
        declared = sum(d.declared for d in rec.differences)
        rows.append([
            _Raw(f"[{code(rec.path, table=True)}]({uri(page_link(rec.path))})"),
            _Raw(_STATUS_MARK.get(rec.status, rec.status)),
            _Raw(code(rec.upstream_path, table=True)) if rec.upstream_path else "—",
            f"{declared}/{len(rec.differences)}",
            f"{counts['error']}/{counts['warning']}/{counts['info']}",
            len(rec.probes),
            rec.status_reason,
        ])
    out += _table(["file", "status", "upstream", "declared/differences", "E/W/I", "probes", "note"], rows) if rows else ["_No files in scope._"]
    out.append("")
    return out


def _backends_section(report: AuditReport, link: Linker) -> list[str]:
    out: list[str] = []
    out += ["## Backends", ""]
    if report.backends:
        rows = []
        for b in report.backends:
            where = _Raw(_loc(b.registered_at.path, b.registered_at.line, link)) if b.registered_at else "not registered"
            if b.condition:
                where = _Raw(f"{where} when {code(b.condition, table=True)}")
            kernels = sorted({h.resolved or h.qualname for h in b.chain if h.role in ("wrapper", "kernel")})
            shown = ", ".join(code(k, table=True) for k in kernels[:4]) + (f" (+{len(kernels) - 4} more on the file pages)" if len(kernels) > 4 else "")
            rows.append([b.name, _Raw(code(b.class_path, table=True)), where, "yes" if b.active else "no", len(b.chain), len(b.unresolved), _Raw(shown or "—")])
        out += _table(["backend", "class", "registered at", "active", "hops", "unresolved", "kernels"], rows)
    else:
        out.append(_stage_note(report, "trace", "No backends traced."))
    out.append("")
    return out


def _probes_section(report: AuditReport) -> list[str]:
    out: list[str] = []
    out += ["## Probes", ""]
    if report.probes:
        rows = [[probe_id(p), p.verdict, p.matched or "—", p.expected or "—", _num(p.worst_error), p.device or "—", p.skipped_reason or ""] for p in report.probes]
        out += _table(["probe", "verdict", "matched", "expected", "worst error", "device", "reason"], rows)
    else:
        out.append("_No probes ran: kernel semantics are unvalidated in this report._")
    out.append("")
    return out


def _gaps_section(report: AuditReport) -> list[str]:
    cov = report.coverage
    out: list[str] = []
    if cov.skipped or cov.left_out:
        out += ["## Coverage gaps", ""]
        out += [f"- not analysed: {code(s.path)}: {_inline(s.reason)}" for s in cov.skipped]
        out += [f"- left out: {code(s.path)}: {_inline(s.reason)}" for s in cov.left_out]
        out.append("")
    return out


def _findings_section(report: AuditReport, link: Linker) -> list[str]:
    out: list[str] = []
    out += ["## Findings", ""]
    if report.findings:
        for sev in Severity:
            group = [f for f in report.findings if f.severity is sev]
            if group:
                out += [f"### {sev.value} ({len(group)})", ""]
                for f in group:
                    out += _finding_line(f, link)
                out.append("")
    else:
        out += ["_No findings._", ""]
    return out


def _runs_section(report: AuditReport) -> list[str]:
    """The port's test run and the stage table."""
    out: list[str] = []
    if report.test_run:
        t = report.test_run
        out += ["## Port test run", "", f"{code(t.command)} exited {t.exit_code} in {t.seconds:.1f} s", "", "```", t.output_tail.rstrip(), "```", ""]

    if report.stages:
        out += ["## Stages", ""]
        out += _table(["stage", "ran", "seconds", "note"], [[s.name, "yes" if s.ran else "no", f"{s.seconds:.2f}", s.note] for s in report.stages])
        out.append("")
    return out


def new_findings_section(report: AuditReport, link: Linker = no_links) -> list[str]:
    """What the change introduced against the baseline (baseline.py): new and changed findings,
    errors first, and how many the change fixed; nothing when the review had no baseline."""
    b = report.baseline_info
    if not b:
        return []
    news = sorted((f for f in report.findings if f.baseline is not None and f.baseline.is_new),
                  key=lambda f: (-f.severity.rank, f.location.path, f.location.line))
    commit = f" {code(b['commit'][:12])}" if b.get("commit") else ""
    out = [f"## New in this change (against {code(b['rev'])}{commit})", "",
           f"{b['new']} new, {b['changed']} changed, {b['unchanged']} unchanged, {b['fixed']} fixed.", ""]
    for f in news:
        lines = _finding_line(f, link)
        out += [lines[0].replace("- **", f"- {f.baseline.value.upper() if f.baseline else ''} **", 1), *lines[1:]]
    out += [""] if news else []
    return out


def _clip(text: str, limit: int = 200) -> str:
    return cut_words(text, limit)  # after a whole word: never inside a path or a name


WARNINGS_SHOWN = 25  # on the first screen; the rest are under "Findings" below


def _first_screen(report: AuditReport, link: Linker, page_link: Callable[[str], str]) -> list[str]:
    """Verdict, each error on one line, what is new, the warnings by consequence, the files the last sync left."""
    screen = first_screen(report)
    out = [f"**{_md(screen.verdict)}**", ""]
    # A config that narrows the review qualifies the verdict: it stands right under it.
    narrowed = [s.note for s in report.stages if s.name == "config" and s.note]
    if narrowed:
        out += ["> **" + _inline(narrowed[0]) + "**", ""]

    def item(f: Finding) -> str:
        """An error says what breaks (its rule) and why; a warning says what differs."""
        where = _loc(f.location.path, f.location.line, link)
        text = what_why(f, 300) if f.severity is Severity.ERROR else statement(f, 400)
        return f"1. {where} {code(f.rule)} {_md(text)}"

    if screen.errors:
        out += [f"### Errors ({len(screen.errors)})", "", *(item(f) for f in screen.errors), ""]
    if screen.new is not None:
        b = report.baseline_info or {}
        since = f" since {code(b['rev'])}" if b.get("rev") else ""
        out += [f"### New{since} ({len(screen.new)}; details under \"New in this change\" below)", ""]
        out += [*(item(f) for f in screen.new), ""] if screen.new else ["_Nothing new since the baseline._", ""]
    if screen.warnings:
        shown = screen.warnings[:WARNINGS_SHOWN]
        alone = [f for f in shown if not grouped(f)]
        together = [f for f in shown if grouped(f)]
        out += [f"### Warnings ({len(screen.warnings)}), most consequential first", "", *(item(f) for f in alone)]
        if together:
            out += ["", "Grouped (one root cause, every place listed on the file pages):", "", *(item(f) for f in together)]
        if len(screen.warnings) > len(shown):
            out.append(f"\n{len(screen.warnings) - len(shown)} more warnings under [Findings](#findings).")
        out.append("")
    if screen.untouched:
        out += [f"### Files the last sync did not touch ({len(screen.untouched)})", ""]
        out += [f"- [{code(u.path)}]({uri(page_link(u.path))}): {_md(untouched_line(u).split(': ', 1)[1])}" for u in screen.untouched]
        out.append("")
    out += [f"Everything else ({screen.infos} info, the tables, backends and probes) is below and on the per-file pages.", ""]
    return out


def _category_table(findings: tuple[Finding, ...]) -> list[str]:
    if not findings:
        return ["_No findings._"]
    rows = []
    for cat in Category:
        here = [f for f in findings if f.category is cat]
        if not here:
            continue
        c = severity_counts(here)
        rows.append([cat.value, c["error"], c["warning"], c["info"], sum(f.waived for f in here)])
    return _table(["category", "error", "warning", "info", "waived"], rows)


class _Index:
    """Lookups every page needs, built once per report: rendering stays linear in files plus
    findings plus call sites (a scan of all findings per file was quadratic at 10,000 files)."""

    def __init__(self, report: AuditReport) -> None:
        self.report = report
        self.at: dict[str, list[int]] = {}  # finding id -> its positions in report.findings
        for i, f in enumerate(report.findings):
            self.at.setdefault(f.id, []).append(i)
        calls: dict[str, dict[tuple[int, str, str], CallSite]] = {}
        for b in report.backends:
            for c in b.calls:
                calls.setdefault(c.location.path, {}).setdefault((c.location.line, c.callee_text, c.resolved or ""), c)
        self.calls = {path: [seen[k] for k in sorted(seen)] for path, seen in calls.items()}


_LAST_INDEX: list[_Index] = []


def _index(report: AuditReport) -> _Index:
    last = _LAST_INDEX[0].report if _LAST_INDEX else None
    # the same findings and backends (a report only re-timed by replace() keeps both): the same index
    if last is None or last.findings is not report.findings or last.backends is not report.backends:
        _LAST_INDEX[:] = [_Index(report)]
    return _LAST_INDEX[0]


def _findings_of(report: AuditReport, rec: FileRecord) -> list[Finding]:
    at = _index(report).at
    return [report.findings[i] for i in sorted({i for fid in rec.findings for i in at.get(fid, ())})]


def _stage_note(report: AuditReport, stage: str, default: str) -> str:
    for s in report.stages:
        if s.name == stage and not s.ran:
            return f"_The {stage} stage did not run{': ' + _inline(s.note) if s.note else ''}._"
    return f"_{default}_"


def _num(x: object) -> str:
    if isinstance(x, float):
        return f"{x:.3g}"
    return "—" if x is None else str(x)


# ---------------------------------------------------------------- per-file page


def _calls_in(report: AuditReport, path: str) -> list[CallSite]:
    return _index(report).calls.get(path, [])


def _difference_table(rec: FileRecord, diffs: list[Difference], inactive: set[int], link: Linker) -> list[str]:
    rows = []
    for d in diffs:
        where = _loc(rec.path, d.line, link) if d.line else "upstream only" + (f" (line {d.upstream_line})" if d.upstream_line else "")
        kind = d.kind + (" (inactive)" if d.line and d.line in inactive else "")
        rows.append([_Raw(where), kind, d.symbol, _Raw("yes" if d.declared else "**no**"), d.reason, d.action, d.validation, d.detail])
    return _table(["where", "kind", "symbol", "declared", "reason", "proposed action", "validation", "detail"], rows)


def render_file_page(report: AuditReport, rec: FileRecord, link: Linker = no_links, summary_href: str = "../summary.md") -> str:
    out = [f"# {_code(rec.path)}", "", f"[back to summary]({summary_href})", ""]
    out.append(f"- status: {_STATUS_MARK.get(rec.status, rec.status)}" + (f" — {_inline(rec.status_reason)}" if rec.status_reason else ""))
    out.append(f"- in scope because: {rec.reason}")
    if rec.upstream_path:
        out.append(f"- upstream counterpart: {code(rec.upstream_path)}")
    elif any(s.name == "compare" and s.ran for s in report.stages) or not report.stages:
        out.append("- upstream counterpart: none (vendor-only file)")
    else:
        out.append("- upstream counterpart: unknown (compare did not run)")
    out.append("")

    out += _registrations_lines(rec, link)

    out += ["## Callers", ""]
    out += [f"- {_loc(c, 0, link)}" for c in rec.callers] or ["_No importers found in scope._"]
    out.append("")

    findings = _findings_of(report, rec)
    inactive = {f.location.line for f in findings if f.category is Category.INACTIVE_PATH}
    out += _differences_lines(rec, inactive, link)

    out += ["## Findings", ""]
    if findings:
        for f in findings:
            out += _finding_line(f, link)
    else:
        out.append("_None._")
    out.append("")

    out += ["## Probe coverage", ""]
    by_id = {probe_id(p): p for p in report.probes}
    if rec.probes:
        rows = [[pid, by_id[pid].verdict, by_id[pid].matched or "—", by_id[pid].skipped_reason or ""] for pid in rec.probes if pid in by_id]
        out += _table(["probe", "verdict", "matched", "reason"], rows)
    else:
        out.append("_No probe reaches the kernels this file calls: its kernel semantics are unvalidated._")
    out.append("")

    calls = _calls_in(report, rec.path)
    if calls:
        out += ["## Traced calls", ""]
        rows = [[_Raw(_loc(rec.path, c.location.line, link)), _Raw(code(c.callee_text, table=True)), c.resolved or f"unresolved ({c.origin})", c.branch or "—"] for c in calls]
        out += _table(["where", "call", "resolved", "branch"], rows)
        out.append("")
    return visible("\n".join(out).rstrip(), lines=True) + "\n"


def _registrations_lines(rec: FileRecord, link: Linker) -> list[str]:
    out: list[str] = []
    out += ["## Registrations", ""]
    if rec.registrations:
        for r in rec.registrations:
            state = "resolves" if r.resolved else "**does not resolve**"
            how = f", returned by {_md(r.selected_by)} when {code(r.condition)}" if r.condition else (
                f", returned by {r.selected_by}" if r.selected_by else "")
            out.append(f"- {r.kind} {code(r.name)} → {code(r.class_path)} at {_loc(r.location.path, r.location.line, link)} ({state}{how})")
    else:
        out.append("_None._")
    out.append("")
    return out


def _differences_lines(rec: FileRecord, inactive: set[int], link: Linker) -> list[str]:
    out: list[str] = []
    out += ["## Differences from upstream", ""]
    if rec.differences:
        # Cosmetic differences (import order, unused imports) are listed, folded, after the rest.
        real = [d for d in rec.differences if d.kind != "cosmetic"]
        cosmetic = [d for d in rec.differences if d.kind == "cosmetic"]
        out += _difference_table(rec, real, inactive, link) if real else ["_Only cosmetic differences._"]
        if cosmetic:
            out += ["", f"<details><summary>{len(cosmetic)} cosmetic difference{'s' if len(cosmetic) != 1 else ''}</summary>", ""]
            out += _difference_table(rec, cosmetic, inactive, link)
            out += ["", "</details>"]
    else:
        out.append("_None recorded._" if rec.upstream_path else "_No upstream counterpart to compare with._")
    out.append("")
    return out


def _dataflow_section(report: AuditReport, link: Linker) -> list[str]:
    """Every LSE flow from a producing kernel to a merge/reduction, so a reviewer sees the matches too."""
    out = ["## LSE flows (producer -> consumer)", ""]
    if not report.dataflow:
        out += [_stage_note(report, "dataflow", "No LSE flows from a kernel into a merge or reduction were found."), ""]
        return out
    rows = []
    for flow in report.dataflow:
        prod, cons = flow.producer, flow.consumer
        rows.append([
            _Raw(f"{code(prod.callee, table=True)} " + _loc(prod.location.path, prod.location.line, link)),
            f"base {prod.base}, {prod.layout}",
            _Raw(f"{code(f'{cons.callee}({cons.arg}=)', table=True)} " + _loc(cons.location.path, cons.location.line, link)),
            f"base {cons.base}, {cons.layout}",
            len(flow.steps),
            flow.verdict,
            "; ".join(p.command for p in flow.probes),
        ])
    out += _table(["producer", "produces", "consumer", "expects", "steps", "verdict", "confirm with"], rows)
    out.append("")
    return out
