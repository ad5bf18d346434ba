# The first screen of every report (summary.md and the terminal): the verdict, each error on one line,
# what is new in the change, the warnings most likely to change a kernel's result, and one line per file
# the last sync left behind. Everything else is below it or on the per-file pages.
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from metax_audit.core.models import AuditReport, Category, Finding, Severity
from metax_audit.report.rules_doc import rule_of
from metax_audit.report.text import cut_words

# Most consequential first: a proven break of a kernel's semantics, then a call that does not bind,
# then what upstream changed and the port did not follow, then capability questions, then differences.
_CATEGORY_RANK = {c: i for i, c in enumerate((
    Category.LSE, Category.LAYOUT, Category.FP8_SCALE, Category.DCP, Category.PADDING, Category.QUERY_COUNT,
    Category.INDEX_MAPPING, Category.SIGNATURE, Category.KWARGS_SWALLOWED, Category.IMPORT, Category.REGISTRATION,
    Category.GRAPH_CAPTURE, Category.UPSTREAM_DRIFT, Category.ARCH_CHECK, Category.UNDECLARED_DIFFERENCE,
    Category.CLAIM, Category.INACTIVE_PATH, Category.ENVIRONMENT, Category.COVERAGE))}
# Errors in the order a maintainer fixes them: a module that does not import hides every other break in
# it (nothing of it runs until it imports), then ops and calls that raise at their first run, then the
# silent wrong results that only show once the code runs. Each says its consequence in words.
_WRONG_NUMBERS = {Category.LSE: "LSE in the wrong base or layout", Category.LAYOUT: "KV cache read in the wrong layout",
                  Category.FP8_SCALE: "FP8 scales applied wrongly", Category.DCP: "DCP merge gives wrong results",
                  Category.PADDING: "padded rows returned as real ones", Category.QUERY_COUNT: "wrong query count",
                  Category.INDEX_MAPPING: "wrong index mapping", Category.GRAPH_CAPTURE: "graph replay reads stale inputs"}
_RAISES_AT_RUN = {"MXA125": "AttributeError when this runs", "MXA126": "AttributeError when this runs",
                  "MXA170": "the op is registered by nothing: fails at its first call",
                  "MXA183": "AssertionError on a non-causal request", "MXA184": "NotImplementedError on an advertised configuration",
                  "MXA180": "the model fails to load for an advertised value", "MXA181": "requests of an advertised value fail",
                  # at the override's def, not at a call: the TypeError is raised where upstream calls it
                  "MXA207": "TypeError when upstream calls it through the base",
                  "MXA208": "TypeError when vLLM instantiates the class"}


def consequence(f: Finding) -> tuple[int, str]:
    """(impact rank, the consequence in words) of an error: 0 the module or backend fails to import or load, 1 a call
    that cannot bind or raises when it runs, 2 wrong numbers."""
    if f.category is Category.IMPORT and f.rule not in _RAISES_AT_RUN:
        lazy = next((e for e in f.evidence if e.startswith("fails when ")), "")
        return (1, f"ImportError {lazy.removeprefix('fails ')}") if lazy else (0, "module fails to import")
    if f.category is Category.COVERAGE:
        return 0, "file does not parse: nothing in it runs"
    if f.rule in _RAISES_AT_RUN:
        return 1, _RAISES_AT_RUN[f.rule]
    if f.category in (Category.SIGNATURE, Category.KWARGS_SWALLOWED):
        return 1, "TypeError at this call"
    if f.category is Category.REGISTRATION:
        return 0, "the backend or op cannot be loaded"
    return 2, _WRONG_NUMBERS.get(f.category, "wrong results")
KERNEL_HUNK = "-- may change what a kernel computes or whether it runs"
DRIFT_RULE, FOLLOWED_RULE = "MXA203", "MXA204"


@dataclass(frozen=True)
class Untouched:
    """A file whose upstream counterpart changed since the base release with none of it followed."""

    path: str
    not_followed: int
    warnings: int
    infos: int
    errors: int = 0  # listed with the errors above; counted here so the line says the file's whole state


@dataclass(frozen=True)
class FirstScreen:
    verdict: str
    errors: tuple[Finding, ...]
    new: tuple[Finding, ...] | None  # None when the review had no baseline
    warnings: tuple[Finding, ...]  # ranked by consequence; those of untouched files are in `untouched`
    untouched: tuple[Untouched, ...]
    infos: int


def first_screen(report: AuditReport) -> FirstScreen:
    live = [f for f in report.findings if not f.waived]
    has_baseline = any(getattr(f, "baseline", None) is not None for f in report.findings)
    # What the change introduced leads the errors: a pre-commit user looks for their own break first.
    errors = tuple(sorted((f for f in live if f.severity is Severity.ERROR),
                          key=lambda f: (not _is_new(f), consequence(f)[0], _rank(f))))
    new = tuple(sorted((f for f in live if _is_new(f)), key=_rank)) if has_baseline else None
    # Each upstream change not followed, wherever triage put it (its own finding, a file's MXA209, an import error's
    # evidence): the sites of kind upstream-not-followed, or the drift finding itself when it lists none.
    drift: Counter[str] = Counter()
    for f in live:
        hunks = [x.path for x in f.sites if x.kind == "upstream-not-followed"]
        drift.update(hunks or ([f.location.path] if f.rule == DRIFT_RULE else []))
    followed = {f.location.path for f in report.findings if f.rule == FOLLOWED_RULE}
    left = {p for p in drift if p not in followed}
    # One count per (file, severity), not one pass over every finding per untouched file.
    by_file = Counter((f.location.path, f.severity) for f in live if f.location.path in left)
    untouched = tuple(Untouched(p, drift[p], by_file[p, Severity.WARNING], by_file[p, Severity.INFO],
                                by_file[p, Severity.ERROR]) for p in sorted(left))
    # Every warning is listed (the counts the terminal, summary.md and the footer give are one number): those that
    # stand alone first, by consequence, then those that group a root cause's sites (a file the sync left behind, one
    # callee's keywords at N calls), which are read as one task.
    warnings = tuple(sorted((f for f in live if f.severity is Severity.WARNING), key=lambda f: (grouped(f), _rank(f))))
    n_err = len(errors)
    n_warn = sum(f.severity is Severity.WARNING for f in live)
    new_err = sum(_is_new(f) for f in errors)
    new_part = f" ({new_err} new in this change)" if has_baseline else ""
    if n_err:
        verdict = f"FAIL: {n_err} error{'s' * (n_err != 1)}{new_part} break on the target stack; {n_warn} warning{'s' * (n_warn != 1)} to review"
    elif n_warn:
        verdict = f"REVIEW: no error; {n_warn} warning{'s' * (n_warn != 1)} can change what a kernel computes or whether it runs"
    else:
        verdict = "PASS: no error and no warning"
    from metax_audit.stages.inventory import unchecked_headline

    incomplete = unchecked_headline(report)
    if incomplete:  # what went unchecked leads: a pass over a partly unchecked stack is not a pass
        verdict = f"{incomplete}. {verdict}"
    return FirstScreen(verdict, errors, new, warnings, untouched, sum(f.severity is Severity.INFO for f in live))


def grouped(f: Finding) -> bool:
    """A finding that stands for the sites of one root cause found at several places."""
    return f.rule in _GROUPING_RULES or len({(x.path, x.symbol) for x in f.sites if x.symbol}) > 2


_GROUPING_RULES = frozenset({"MXA209", "MXA212"})


def _is_new(f: Finding) -> bool:
    state = getattr(f, "baseline", None)
    return bool(state is not None and getattr(state, "is_new", str(state) in {"new", "changed"}))


def _rank(f: Finding) -> tuple[int, int, int, str, int]:
    kernel_hunks = sum(KERNEL_HUNK in e for e in f.evidence)
    return (-f.severity.rank, _CATEGORY_RANK.get(f.category, 99), -kernel_hunks, f.location.path, f.location.line)


def where(f: Finding) -> str:
    return f"{f.location.path}:{f.location.line}" if f.location.line else f.location.path


def what_why(f: Finding, limit: int = 220) -> str:
    """An error: its consequence in words, then why (the finding's message, whole). A warning: the rule's title and
    what it is about, never a cut snippet (the message whole when it is short and holds no code excerpt)."""
    if f.severity is Severity.ERROR:
        words = consequence(f)[1]
        message = " ".join(f.message.split())
        return cut_words(message if message.startswith(words.split(":")[0]) else f"{words}: {message}", limit)
    return statement(f, limit)


def statement(f: Finding, limit: int = 220) -> str:
    """What a warning says in whole words: its message when that fits and quotes no code, else the rule's title,
    the symbol and the number of places (the excerpts are on the file page)."""
    known = rule_of(f.rule)
    title = known.title if known is not None else f.rule
    message = " ".join(f.message.split())
    if len(title) + len(message) + 2 <= limit and not _EXCERPT.search(message):
        return f"{title}: {message}"
    # A site with a verdict is explained (an installed signature, the vendor platform): the count is of what is
    # left to judge, as the finding's message counts it, with the explained ones said beside it.
    left = {(x.path, x.line) for x in f.sites if not x.verdict}
    explained = {(x.path, x.line) for x in f.sites if x.verdict} - left
    where = ""
    if len(left) + len(explained) > 1:
        where = f" ({len(left)} places" + (f" left, {len(explained)} explained)" if explained else ")")
    return f"{title}: {f.location.symbol or f.location.path}{where}"


# Text that quotes code: compare's hunk excerpts ("differs at ...x [upstream: a | port: b]", "upstream: ... | port: ...").
_EXCERPT = re.compile(r"\[upstream: |\| port: |differs at \.\.\.|\.\.\.")


def one_line(f: Finding, limit: int = 220) -> str:
    """file:line, rule, what breaks and why."""
    return f"{where(f)} {f.rule} {what_why(f, limit)}"


def untouched_line(u: Untouched) -> str:
    return (f"{u.path}: upstream changed it in {u.not_followed} place{'s' * (u.not_followed != 1)} since the base release "
            f"and the last sync followed none; " + (f"{u.errors} error (listed above), " if u.errors else "")
            + f"{u.warnings} warning, {u.infos} info")
