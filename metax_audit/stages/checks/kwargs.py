# Rule `kwargs-swallowed`: a keyword the installed kernel accepts only through **kwargs is not
# proof it is implemented; say which names the callee reads from kwargs and flag the ones it never reads.
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from metax_audit.core.findings import make_finding, rule
from metax_audit.core.models import Category, Finding, Location, Severity, StackFacts, TraceResult
from metax_audit.stages.checks.signatures import bind
from metax_audit.stages.checks.stack import call_text, checked_calls, installed_record, usable

rule("MXA110", Category.KWARGS_SWALLOWED, Severity.WARNING, "keyword lands in the kernel's **kwargs and the kernel never reads it",
     "The installed callable accepts the keyword only through **kwargs, its body never reads that name and does not "
     "forward kwargs: the value is silently ignored. Drop it or use a kernel that implements it.")
rule("MXA111", Category.KWARGS_SWALLOWED, Severity.INFO, "keyword lands in the kernel's **kwargs and is only forwarded",
     "The callee does not read the name itself but forwards kwargs (or its body could not be read); whether the "
     "keyword takes effect depends on the next callable. Verify it with a probe.")


def check_kwargs(root: Path, trace: TraceResult, facts: StackFacts) -> Iterator[Finding]:
    for call in checked_calls(trace):
        fact = facts.facts.get(call.resolved or "")
        if fact is None or not usable(fact):
            continue  # signature.py reports what could not be checked, once
        assert fact.params is not None
        b = bind(call, fact.params)
        if not b.swallowed:
            continue
        reads = fact.kwargs_reads
        var = b.var_keyword.name if b.var_keyword else "kwargs"
        read_text = (f"callee reads from **{var}: {', '.join(reads) if reads else '(nothing)'}"
                     + ("; forwards it" if fact.kwargs_forwarded else "; does not forward it")) if reads is not None \
            else f"callee body not readable ({fact.source}); reads from **{var} unknown"
        for arg in b.swallowed:
            installed = installed_record(fact, facts)
            evidence = [call_text(root, call), str(installed), read_text]
            loc = Location(call.location.path, call.location.line, f"{call.caller}:{call.resolved}:{arg.name}")
            if reads is not None and arg.name in reads:
                continue  # read by name: accepted and used
            if reads is not None and not fact.kwargs_forwarded:
                yield make_finding("MXA110", loc, f"{call.callee_text}(..., {arg.name}=...) is swallowed by **{var} of {fact.target}, which never reads {arg.name!r}", evidence,
                                   installed=installed)
            else:
                yield make_finding("MXA111", loc, f"{call.callee_text}(..., {arg.name}=...) goes through **{var} of {fact.target} without being read there", evidence,
                                   installed=installed)
