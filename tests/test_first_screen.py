# The first screen of summary.md and the terminal: verdict, one line per error, what is new (only when
# the review has a baseline), warnings ranked by consequence, files the last sync did not touch.
from __future__ import annotations

from dataclasses import replace

import report_factory as rf

from metax_audit.core.models import BaselineState, Category, Finding, Location, Severity
from metax_audit.report.first_screen import first_screen, what_why
from metax_audit.report.markdown import render_summary

FI = "vllm_metax/v1/attention/backends/flashinfer.py"
KERNEL = "-- may change what a kernel computes or whether it runs"


def _f(rule: str, cat: Category, sev: Severity, path: str, line: int, msg: str, *evidence: str) -> Finding:
    return Finding(rule, cat, sev, Location(path, line, "f"), msg, tuple(evidence))


FINDINGS = [
    _f("MXA201", Category.UNDECLARED_DIFFERENCE, Severity.WARNING, "vllm_metax/a.py", 10, "one kernel hunk", f"a.py:10 [changed] x {KERNEL}"),
    _f("MXA201", Category.UNDECLARED_DIFFERENCE, Severity.WARNING, "vllm_metax/a.py", 20, "two kernel hunks",
       f"a.py:20 [changed] x {KERNEL}", f"a.py:21 [changed] y {KERNEL}"),
    _f("MXA001", Category.COVERAGE, Severity.ERROR, FI, 327, "invalid syntax (line 327)"),
    _f("MXA203", Category.UPSTREAM_DRIFT, Severity.WARNING, "vllm_metax/b.py", 5, "upstream changed stride order"),
    _f("MXA203", Category.UPSTREAM_DRIFT, Severity.WARNING, FI, 400, "drift in a file the sync left"),
    _f("MXA204", Category.UPSTREAM_DRIFT, Severity.INFO, "vllm_metax/b.py", 9, "followed"),
    _f("MXA140", Category.CLAIM, Severity.INFO, "vllm_metax/a.py", 1, "claim"),
]


def test_first_screen_orders_errors_then_warnings_by_consequence_and_folds_untouched_files() -> None:
    screen = first_screen(rf.make_report(findings=FINDINGS))
    assert screen.verdict == "FAIL: 1 error break on the target stack; 4 warnings to review"
    assert [f.rule for f in screen.errors] == ["MXA001"]
    assert screen.new is None  # no baseline: no "new" section
    # drift before differences; among differences, more kernel hunks first; every warning is listed (the untouched
    # file's too: the section's count is the verdict's), and the file also has its line
    assert [(f.location.path, f.location.line) for f in screen.warnings] == [
        ("vllm_metax/b.py", 5), (FI, 400), ("vllm_metax/a.py", 20), ("vllm_metax/a.py", 10)]
    assert [(u.path, u.not_followed, u.warnings) for u in screen.untouched] == [(FI, 1, 1)]


def test_summary_opens_with_the_first_screen() -> None:
    text = render_summary(rf.make_report(findings=FINDINGS))
    head = text.splitlines()[:20]
    assert head[2] == "**FAIL: 1 error break on the target stack; 4 warnings to review**"
    assert head[4] == "### Errors (1)"
    assert head[6] == f"1. `{FI}:327` `MXA001` file does not parse: nothing in it runs: invalid syntax (line 327)"
    assert "### Warnings (4), most consequential first" in head
    assert any(line.startswith(f"- [`{FI}`](files/") and "followed none" in line for line in head)


def test_new_findings_have_their_own_section_when_a_baseline_is_present() -> None:
    marked = [replace(FINDINGS[0], baseline=BaselineState.NEW), *(replace(f, baseline=BaselineState.UNCHANGED) for f in FINDINGS[1:])]
    screen = first_screen(rf.make_report(findings=marked))
    assert [f.location.line for f in screen.new or ()] == [10]
    assert "### New (1; details under \"New in this change\" below)" in render_summary(rf.make_report(findings=marked))


def test_a_clean_review_passes() -> None:
    assert first_screen(rf.make_report(findings=[FINDINGS[-1]])).verdict == "PASS: no error and no warning"


def test_a_new_error_leads_the_errors_and_the_verdict_counts_it() -> None:
    old_error = _f("MXA122", Category.IMPORT, Severity.ERROR, FI, 50, "imports a name upstream removed")
    new_error = _f("MXA510", Category.LSE, Severity.ERROR, FI, 327, "base 2 reaches a base-e merge")
    marked = [replace(old_error, baseline=BaselineState.UNCHANGED), replace(new_error, baseline=BaselineState.NEW)]
    screen = first_screen(rf.make_report(findings=marked))
    # by the order of fixing alone the import error ranks first; what the change introduced comes before it
    assert [f.rule for f in screen.errors] == ["MXA510", "MXA122"]
    assert screen.verdict.startswith("FAIL: 2 errors (1 new in this change) break on the target stack")
    unmarked = first_screen(rf.make_report(findings=[new_error, old_error]))
    assert [f.rule for f in unmarked.errors] == ["MXA122", "MXA510"]


def test_errors_come_in_the_order_they_are_fixed_imports_then_calls_then_wrong_results() -> None:
    errors = [_f("MXA510", Category.LSE, Severity.ERROR, FI, 327, "base 2 reaches a base-e merge"),
              _f("MXA101", Category.SIGNATURE, Severity.ERROR, FI, 863, "keyword the installed kernel lacks"),
              _f("MXA170", Category.REGISTRATION, Severity.ERROR, FI, 900, "op nothing registers"),
              _f("MXA122", Category.IMPORT, Severity.ERROR, FI, 50, "imports a name upstream removed")]
    screen = first_screen(rf.make_report(findings=errors))
    assert [f.rule for f in screen.errors] == ["MXA122", "MXA101", "MXA170", "MXA510"]
    # each headline says the consequence in words
    assert [what_why(f).split(":")[0] for f in screen.errors] == [
        "module fails to import", "TypeError at this call", "the op is registered by nothing", "LSE in the wrong base or layout"]
    # an override's error sits at its def: the TypeError is where upstream calls it
    override = _f("MXA207", Category.SIGNATURE, Severity.ERROR, FI, 28, "renames `cache_dtype_str`")
    assert what_why(override).startswith("TypeError when upstream calls it through the base:")


def test_a_warning_line_never_cuts_a_code_excerpt() -> None:
    long = _f("MXA201", Category.UNDECLARED_DIFFERENCE, Severity.WARNING, "vllm_metax/a.py", 10,
              "changed in Impl.forward: differs at ...x [upstream: a * 2 | port: a]; upstream: y = a * 2 | port: y = a")
    line = what_why(long)
    assert "[upstream:" not in line and not line.endswith("...") and line.endswith(": f")
    short = _f("MXA203", Category.UPSTREAM_DRIFT, Severity.WARNING, FI, 374, "B.supports_window: upstream added B.supports_window(cls)")
    assert what_why(short).endswith("upstream added B.supports_window(cls)")


def test_an_untouched_files_line_counts_its_errors_too() -> None:
    with_error = [*FINDINGS, _f("MXA122", Category.IMPORT, Severity.ERROR, FI, 50, "imports a name upstream removed")]
    text = render_summary(rf.make_report(findings=with_error))
    assert any(line.startswith(f"- [`{FI}`](files/") and "followed none; 2 error (listed above), 1 warning" in line
               for line in text.splitlines())
