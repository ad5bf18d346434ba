# Terminal rendering of results for the CLI (rich tables); the files in reports/ are written by
# metax_audit.report, this only shows a short summary.
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from metax_audit.core.models import AuditReport, Finding, ProbeResult, Severity
from metax_audit.report.text import visible

_console = Console()
_quiet = False
_color = "auto"
# A finding's line on a terminal: the rule's title and the message, in at most this many lines of the
# terminal's width (errors say what breaks and why); in a pipe, one line of at most so many characters.
_LINES = {Severity.ERROR: 4, Severity.WARNING: 3, Severity.INFO: 3}
_PIPE_CHARS = {Severity.ERROR: 200, Severity.WARNING: 160, Severity.INFO: 160}
_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "dim"}
_VERDICT_STYLE = {"FAIL": "bold red", "REVIEW": "bold yellow", "PASS": "bold green"}


def configure(*, color: str = "auto", quiet: bool = False) -> None:
    """--color and --quiet of the command being run: the console every renderer here prints to."""
    from metax_audit.cli.term import make_console

    global _console, _quiet, _color
    _console, _quiet, _color = make_console(color), quiet, color


def _safe(text: str) -> str:
    """A string from the audited repo for a rich line: control characters (an ESC from a file name
    would reach the terminal) as visible escapes, and no rich markup of its own."""
    return escape(visible(text))


def render_review_summary(report: AuditReport, written: Sequence[Path]) -> None:
    """The first screen: verdict, errors (one line each), what is new, the warnings by consequence, the
    files the last sync left behind, then where to read the rest. --quiet: the verdict and the counts."""
    from metax_audit.report.first_screen import first_screen, statement, untouched_line, what_why, where

    snap = report.snapshot
    screen = first_screen(report)
    if _quiet:
        _verdict(screen.verdict)
        _baseline_line(report)
        return
    _console.print(f"[bold]metax-audit review[/bold] {snap.mode} {_safe(snap.label)} "
                   f"commit {(snap.commit or 'none')[:12]}{' (dirty)' if snap.dirty else ''}", soft_wrap=True)
    for note in snap.notes:
        _plain(f"  note: {note}")
    skipped = [s for s in report.stages if not s.ran]
    for s in skipped:
        _plain(f"  stage {s.name} did not run: {s.note}")
    _verdict(screen.verdict)
    _baseline_line(report)

    def line(f: Finding) -> None:
        text = what_why(f, 1 << 30) if f.severity is Severity.ERROR else statement(f, 320)
        _finding(f, f"{where(f)} {text}")

    _plain(f"errors ({len(screen.errors)}):" if screen.errors else "errors: none")
    for f in screen.errors:
        line(f)
    listed: set[int] = set()
    if screen.new is not None:
        news = [f for f in screen.new if f.severity is not Severity.ERROR]  # new errors are marked above
        _plain(f"new in this change ({len(screen.new)}{', errors above' if len(news) < len(screen.new) else ''}):")
        for f in news[:TERMINAL_WARNINGS]:
            line(f)
            listed.add(id(f))
    rest = [f for f in screen.warnings if id(f) not in listed]  # a new warning is listed once, above
    shown = rest[:TERMINAL_WARNINGS]
    if shown or len(rest) < len(screen.warnings):
        above = len(screen.warnings) - len(rest)
        _plain(f"warnings ({len(screen.warnings)}{f', {above} new above' if above else ''}), most consequential first:")
        for f in shown:
            line(f)
    for u in screen.untouched:
        _plain(f"  untouched by the last sync: {untouched_line(u)}")
    summary = next((p for p in written if p.name == "summary.md"), written[0] if written else None)
    more = len(rest) - len(shown)
    read = f"read {summary}" if summary else "write reports with --format md to read them"
    _plain(f"{more} more warning{'s' * (more != 1)} and {screen.infos} info: {read}" if more else f"{screen.infos} info: {read}")


TERMINAL_WARNINGS = 10


def render_finding_lines(report: AuditReport) -> None:
    """--format text: one plain line per finding on stdout (no colour, no wrapping)."""
    import sys

    from metax_audit.report.lines import render_lines

    lines = render_lines(report)
    if lines:
        sys.stdout.write("\n".join(lines) + "\n")


def render_counts(line: str) -> None:
    """The closing counts line, on stderr, wrapped as the first screen is."""
    from metax_audit.cli.term import make_console, wrap_width, wrap_words

    err = make_console(_color, stderr=True)
    err.print("\n".join(wrap_words(visible(line), wrap_width(err))), markup=False, highlight=False, soft_wrap=True)


def _verdict(verdict: str) -> None:

    style = _VERDICT_STYLE.get(verdict.split(":", 1)[0], "bold")
    _print_lines(verdict, first="", style_first=(0, len(verdict.split(":", 1)[0]), style), rest_style="bold")


def _baseline_line(report: AuditReport) -> None:
    if report.baseline_info:
        b = report.baseline_info
        _plain(f"against {b['rev']} {(b['commit'] or '')[:12]}: {b['new']} new, {b['changed']} changed, "
               f"{b['unchanged']} unchanged, {b['fixed']} fixed")


def _finding(f: Finding, text: str) -> None:
    """`  [NEW] severity RULE path:line message`: wrapped at the terminal's width between words (never
    inside a path or a name), the message cut after a whole word when it would take more lines."""
    from rich.text import Text

    from metax_audit.cli.term import wrap_width, wrap_words
    from metax_audit.report.text import cut_words

    mark = _mark(f)
    first = f"  {mark}{f.severity.value:7} {f.rule} "
    width = wrap_width(_console)
    text = visible(cut_words(text, _PIPE_CHARS[f.severity]) if width is None else " ".join(text.split()))
    lines = wrap_words(text, width, first=first, max_lines=_LINES[f.severity])
    out = Text("\n".join(lines))
    at = 2
    if mark:
        out.stylize("bold magenta", at, at + len(mark.rstrip()))
        at += len(mark)
    out.stylize(_STYLE[f.severity], at, at + len(f.severity.value))
    out.stylize("bold", len(first) - len(f.rule) - 1, len(first) - 1)
    _console.print(out, soft_wrap=True)


def _mark(f: Finding) -> str:
    """NEW / CHANGED against the baseline, or nothing."""
    return f"{f.baseline.value.upper():9} " if f.baseline is not None and f.baseline.is_new else ""


def _print_lines(text: str, *, first: str = "", style_first: tuple[int, int, str] | None = None,
                 rest_style: str | None = None, indent: int = 4) -> None:
    from rich.text import Text

    from metax_audit.cli.term import wrap_width, wrap_words

    out = Text("\n".join(wrap_words(visible(text), wrap_width(_console), first=first, indent=indent)), style=rest_style or "")
    if style_first is not None:
        out.stylize(style_first[2], style_first[0], style_first[1])
    _console.print(out, soft_wrap=True)


def _plain(text: str, hang: int = 4) -> None:
    """A line with text from the audited repo: control characters made visible, no markup, wrapped
    between words at the terminal's width (continuation lines indented `hang` more than the first)."""
    indent = len(text) - len(text.lstrip(" "))
    _print_lines(text.lstrip(" "), first=" " * indent, indent=indent + hang)


def render_probe_results(results: Sequence[ProbeResult], written: Sequence[Path]) -> None:
    """A table in a terminal; elsewhere one whole line per probe (probing.probe_line: probe, family,
    target, verdict, matched hypothesis and worst error never cut). Probes skipped because this
    machine has no CUDA device are one line together, not one each."""
    from metax_audit.stages.probing import NO_DEVICE, probe_line

    no_dev = [r for r in results if r.details.get("no_device")]
    shown = [r for r in results if not r.details.get("no_device")]
    if not _console.is_terminal:
        for r in shown:
            print(probe_line(r))
    elif shown:
        t = Table(title="probes", show_edge=False)
        for col in ("probe", "family", "target", "verdict", "matched", "expected", "worst error", "note"):
            t.add_column(col)
        for r in shown:
            err = "" if r.worst_error is None else f"{r.worst_error:.2e}"
            t.add_row(r.probe, r.family, r.target, r.verdict, r.matched or "", r.expected or "", err, r.skipped_reason or "")
        _console.print(t)
    if no_dev:
        targets = sorted({r.target for r in no_dev})
        ran = sorted({r.target for r in shown if r.verdict != "skipped"})
        print(f"{NO_DEVICE}: skipped {len(no_dev)} probe(s) of {', '.join(targets)} without starting them"
              + (f"; ran on CPU: {', '.join(ran)}" if ran else "; on CPU run --backend torch-reference (graph-capture of a plan/run target: python -m metax_audit.probes run ... --option simulate=1)"))
    if written:
        print(f"reports: {', '.join(str(p) for p in written)}")


def render_rule(found: Any) -> None:
    """`metax-audit rule ID` (a rules_doc.RuleExplanation): title, meaning, each severity with an
    example, a waiver entry; wrapped at the terminal's width."""
    r = found.rule
    _print_lines(f"{r.id} {r.title}", style_first=(0, len(r.id), "bold"), rest_style="")
    _plain(f"category {r.category.value}; default severity {r.severity.value} (severity-overrides in the config can change it)", 0)
    _console.print()
    _plain(r.help, 0)
    if found.severities:
        _console.print()
    for severity, when, example in found.severities:
        _plain(f"{severity} when {when}.", 2)
        _plain(f"  example: {example}.", 2)
    _console.print()
    _plain("waive it: an entry in the waivers file (review --waivers FILE, or the file the config's `waivers` names):", 0)
    for line in found.waiver:
        _console.print("    " + line, markup=False, highlight=False, soft_wrap=True)
    _plain("or write entries for the current findings with review --generate-waivers FILE; "
           f"a waiver that matches nothing is a finding itself. More: {found.doc}", 0)


def render_rules(rules: Sequence[Any]) -> None:
    """`metax-audit rules`: one line per rule (id, default severity, category, title)."""
    for r in rules:
        first = f"{r.id} {r.severity.value:7} {r.category.value:21} "
        _print_lines(r.title, first=first, style_first=(0, len(r.id), "bold"), rest_style="", indent=len(first))


def render_trees(trees: Sequence[Any]) -> None:
    """`trace`: one rich tree per chain, on the configured console (--color)."""
    for tree in trees:
        _console.print(tree)


def render_evidence(env: dict[str, Any], changes: Sequence[str], manifest: Path | None, as_json: bool) -> None:
    if as_json:
        print(json.dumps(env, indent=2, sort_keys=True, default=str))
    else:
        t = Table(title="environment", show_edge=False)
        t.add_column("fact")
        t.add_column("value")
        for key, value in sorted(_flatten(env).items()):
            t.add_row(key, str(value))
        _console.print(t)
    for c in changes:
        _console.print(f"[yellow]changed since the saved record:[/yellow] {c}")
    if manifest is not None:
        _console.print(f"stack manifest written: {manifest}")


def render_contracts(contracts: Any, checks: Sequence[Any], as_json: bool) -> None:
    from metax_audit.core.contracts import contracts_to_dict

    data = contracts_to_dict(contracts, checks)
    if as_json:
        print(json.dumps(data, indent=2, sort_keys=True, default=str))
        return
    for obs in data.get("observations", []):
        status = obs.get("status", "")
        _console.print(f"[bold]{obs.get('id', '')}[/bold] {status} {obs.get('component', '')} "
                       f"{obs.get('version', '')} on {obs.get('device', '')}", highlight=False)
        _console.print(f"    claim: {obs.get('claim', '')}", markup=False, highlight=False)
        _console.print(f"    probe: {obs.get('probe', '')}", markup=False, highlight=False)
        for key in ("reason", "result"):
            if obs.get(key):
                _console.print(f"    {key}: {obs[key]}", markup=False, highlight=False)


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out
