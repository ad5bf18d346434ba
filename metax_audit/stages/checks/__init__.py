# Checks: generators of findings over the traced, introspected and compared model.
# One module per concern; each declares its rules in metax_audit.core.findings at import time.
# This package runs them; the checks share helpers from checks.stack, which imports none of them.
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from metax_audit.core.memo import NO_MEMO, Kind, Memo
from metax_audit.core.models import CallSite, Discovery, Finding, StackFacts, TraceResult, Unresolved

# Every check module is imported with the package, so the rules of findings made in a forked
# child (binding checks, dataflow) are declared in the parent too (help text in SARIF, Markdown).
from metax_audit.stages.checks import (  # noqa: F401
    attributes,
    binding,
    claims,
    compiled_calls,
    custom_ops,
    graph_capture,
    imports,
    kwargs,
    names,
    signatures,
)
from metax_audit.stages.checks.capabilities import check_capabilities, counterpart_paths
from metax_audit.stages.checks.imports import absorb_consequences, caller_paths
from metax_audit.stages.checks.inactive_path import check_inactive_paths
from metax_audit.stages.checks.lse import check_dataflow
from metax_audit.stages.checks.memo import FileMemo
from metax_audit.stages.checks.omitted_keywords import check_omitted_keywords
from metax_audit.stages.checks.op_registrations import OpTable
from metax_audit.stages.checks.ops import op_findings, op_table_for_review
from metax_audit.stages.checks.signatures import checked_callers
from metax_audit.stages.checks.upstream_calls import upstream_calls

if TYPE_CHECKING:
    from metax_audit.core.config import AuditConfig
    from metax_audit.core.contracts import Contracts
    from metax_audit.stages.dataflow import LseFlow
    from metax_audit.stages.trace.symbols import SymbolTable

# The checks the pipeline runs itself: inactive paths (over the comparison) and the judgement of
# the dataflow stage's facts (run with it in the forked child).
__all__ = [
    "FileMemo",
    "absorb_consequences",
    "binding_checks",
    "check_capabilities",
    "check_dataflow",
    "check_inactive_paths",
    "check_omitted_keywords",
    "checked_callers",
    "checks_for_review",
    "counterpart_paths",
    "dataflow_for_review",
    "discovery_checks",
    "op_findings",
    "op_table_for_review",
    "run_checks",
    "upstream_calls",
]


def run_checks(
    discovery: Discovery,
    trace: TraceResult,
    facts: StackFacts,
    *,
    upstream_calls: Sequence[CallSite] = (),
    vendor_ops: OpTable | None = None,
    memo: FileMemo | None = None,
) -> Iterator[Finding]:
    """All stack checks in a fixed order: signature, kwargs-swallowed, import, graph-capture, claim."""
    yield from signatures.check_signatures(discovery.root, trace, facts, upstream_calls=upstream_calls,
                                           vendor_ops=vendor_ops, memo=memo)
    yield from kwargs.check_kwargs(discovery.root, trace, facts)
    yield from imports.check_imports(discovery, facts, memo)
    yield from compiled_calls.check_compiled_calls(discovery, facts, memo)
    yield from graph_capture.check_graph_capture(discovery, trace, memo)
    yield from claims.check_claims(discovery, memo)

def checks_for_review(
    discovery: Discovery,
    trace: TraceResult,
    facts: StackFacts | None,
    *,
    upstream_calls: Sequence[CallSite] = (),
    vendor_ops: OpTable | None = None,
    memo: FileMemo | None = None,
) -> Iterator[Finding]:
    """The stack checks (signature, kwargs-swallowed, import, graph-capture, claim).

    Without introspected facts the checks that need the installed stack see an empty stack, which
    they treat as "could not check", never as missing support.
    """
    if facts is None:
        facts = StackFacts(python="", captured_at="", host="", facts={}, source="none")
    yield from run_checks(discovery, trace, facts, upstream_calls=upstream_calls, vendor_ops=vendor_ops, memo=memo)


def discovery_checks(discovery: Discovery, symbols: SymbolTable, *, memo: Memo = NO_MEMO,
                     memo_common: list[str] | None = None) -> tuple[list[Finding], list[Finding]]:
    """The part of the binding checks that reads the discovery and the symbol table only, not the
    trace: imports and TYPE_CHECKING names (first), attribute reads (second). The pipeline may run
    it during the trace, on the discovery the trace is predicted to widen to (incremental.py). Its
    per-file memo is its own, under another kind (it runs in a process of its own). With `memo_common`
    each file's missing imports are a unit of the trace memo (check_port_imports)."""
    from metax_audit.stages.checks.attributes import check_attributes
    from metax_audit.stages.checks.imports import check_port_imports, check_type_checking_names

    records = FileMemo(discovery.root, memo=memo, kind=Kind.BINDING_FILE)
    units = None
    if memo_common is not None:
        from metax_audit.stages.trace.memo import TraceMemo

        units = TraceMemo(symbols.index, ["imports", *memo_common], memo=memo)
    scope = [sf.path for sf in discovery.files if sf.parse_error is None and sf.path.endswith(".py")]
    first = [*check_port_imports(discovery, symbols, records, units),
             *check_type_checking_names(discovery, symbols, records),
             *names.check_undefined_names(scope, symbols, records, caller_paths(discovery)),
             *custom_ops.check_custom_ops(discovery, _registering_files(discovery), caller_paths(discovery))]
    second = list(check_attributes(discovery, symbols, records))
    records.save()
    return first, second


def _registering_files(discovery: Discovery) -> list[str]:
    """The port's files that register custom ops (their text names a registration call)."""
    base = discovery.root / discovery.port_package.replace(".", "/")
    out = []
    for file in sorted(base.rglob("*.py")) if base.is_dir() else ():
        try:
            text = file.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if "direct_register_custom_op(" in text or "custom_op(" in text:
            out.append(file.relative_to(discovery.root).as_posix())
    return out


def binding_checks(discovery: Discovery, trace: TraceResult, symbols: SymbolTable, *, memo: Memo = NO_MEMO,
                   memo_common: list[str] | None = None, calls_only: bool = False) -> list[Finding]:
    """Imports, attributes and call bindings of port code against port and upstream sources, asked of
    the review's one symbol table. Needs no stack facts (kernel imports and calls are the stack
    checks' part), so the pipeline runs it beside compare and introspection. With `calls_only`, the
    call bindings alone (the rest, discovery_checks, ran during the trace). With `memo_common` each
    caller file's call bindings are a unit of the trace memo (check_bindings)."""
    from metax_audit.stages.checks.binding import check_bindings

    first, second = ([], []) if calls_only else discovery_checks(discovery, symbols, memo=memo, memo_common=memo_common)
    return [*first, *check_bindings(discovery.root, trace, symbols, memo_common, memo=memo), *second]


def dataflow_for_review(discovery: Discovery, config: AuditConfig, contracts: Contracts | None,
                        memo_common: list[str] | None = None, memo: Memo = NO_MEMO,
                        ) -> tuple[list[LseFlow], list[Finding], list[Unresolved]]:
    """LSE/layout/scale conventions followed from producing to consuming kernel calls."""
    if contracts is None:
        return [], [], []
    files = [f.path for f in discovery.files if f.parse_error is None]
    return check_dataflow(discovery.root, files, contracts, port_package=config.port_package, memo_common=memo_common,
                          memo=memo)
