# Checks: generators of findings over the traced, introspected and compared model.
# One module per concern; each declares its rules in metax_audit.findings at import time.
from __future__ import annotations

from collections.abc import Iterator, Sequence

from metax_audit.models import CallSite, Discovery, Finding, StackFacts, TraceResult


def checks_for_review(
    discovery: Discovery,
    trace: TraceResult,
    facts: StackFacts | None,
    *,
    upstream_calls: Sequence[CallSite] = (),
) -> Iterator[Finding]:
    """The stack checks (signature, kwargs-swallowed, import, graph-capture, claim).

    Without introspected facts the checks that need the installed stack see an empty stack, which
    they treat as "could not check", never as missing support.
    """
    from metax_audit.checks.stack import run_checks

    if facts is None:
        facts = StackFacts(python="", captured_at="", host="", facts={}, source="none")
    yield from run_checks(discovery, trace, facts, upstream_calls=upstream_calls)
