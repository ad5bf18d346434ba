# Rules `lse` and `layout` over the dataflow stage's facts: an LSE that reaches its merge or
# reduction in the other log base or layout, and a kernel result unpacked as if it held the LSE.
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from metax_audit.core.contracts import Contracts
from metax_audit.core.findings import make_finding, rule
from metax_audit.core.memo import NO_MEMO, Memo
from metax_audit.core.models import Category, Finding, Location, Severity, Unresolved
from metax_audit.stages.checks.scales import scale_findings
from metax_audit.stages.checks.stack import short_callee
from metax_audit.stages.dataflow import DataflowFacts, LseFlow, Unpacking, follow

RULE_BASE = rule(
    "MXA510",
    Category.LSE,
    Severity.ERROR,
    "an LSE produced in one log base reaches a merge or reduction that assumes the other",
    "The producing kernel's contract (component-contracts.md) gives its LSE base; the consumer "
    "weights partial outputs assuming another base, so the merged output is silently wrong. "
    "Convert on the way (`lse * math.log(2)` turns base 2 into base e) or pass the consumer's "
    "base flag. The evidence lists the value's path line by line; run the named probe to confirm.",
)
RULE_FLAG_OFF = rule(
    "MXA512",
    Category.LSE,
    Severity.ERROR,
    "a kernel result is unpacked as if it held the LSE, but the call does not ask for the LSE",
    "The kernel's contract returns the LSE only when a flag (e.g. return_lse, return_attn_probs, "
    "return_softmax_lse) is true. Without it the unpacking fails or binds something that is not an "
    "LSE, which a later merge then weights with. Pass the flag, or record the vendor build's "
    "different behaviour in component-contracts.md.",
)
RULE_LAYOUT = rule(
    "MXA511",
    Category.LAYOUT,
    Severity.ERROR,
    "an LSE reaches its consumer in the other layout ([tokens, heads] vs [heads, tokens])",
    "The consumer indexes the LSE as heads-first or tokens-first; the value arrives transposed "
    "relative to that. Transpose (and make contiguous) on the way. The evidence lists the path.",
)


def flow_finding(flow: LseFlow) -> Finding:
    rule_id = RULE_BASE.id if "base" in flow.mismatches else RULE_LAYOUT.id
    c, p = flow.consumer, flow.producer
    evidence = [
        f"producer {p.location}: {p.callee} returns LSE base {p.base}, {p.layout} (contract {p.convention})",
        *(f"  {s.location.path}:{s.location.line}: {s.text}  -> base {s.base}, {s.layout}" for s in flow.steps),
        f"consumer {c.location}: {c.callee}({c.arg}=...) expects base {c.base}, {c.layout} (contract {c.convention})",
        *flow.reasons,
        *(f"confirm: {req.command}" for req in flow.probes),
    ]
    msg = (f"LSE from {short_callee(p.callee)}"
           f" ({p.location.path}:{p.location.line}) reaches {short_callee(c.callee)}({c.arg}=) with "
           + "; ".join(flow.reasons))
    loc = Location(c.location.path, c.location.line, f"{c.location.symbol}:{c.arg}")
    # Identity is the flow (producer -> consumer argument); a new mismatch in it changes the content.
    return make_finding(rule_id, loc, msg, evidence, key=f"{p.callee} -> {c.callee}({c.arg}=)")


def unpacking_finding(u: Unpacking) -> Finding:
    return make_finding(
        RULE_FLAG_OFF.id, u.location,
        f"{u.callee.rsplit('.', 1)[-1]}(...) is unpacked into `{u.target_text}` as if it returned the LSE, "
        f"but {u.switch}: by its contract it then returns only the output",
        [u.statement,
         f"contract {u.convention}: {u.flag}={u.when_true!r} when true, {u.when_false!r} when false"
         + (f" (also spelled {', '.join(u.aliases)})" if u.aliases else ""),
         f"`{u.lse_name}` is then {'not an LSE' if u.lse_result else 'unbound'}; a vendor build that always returns the tuple "
         "must be declared in the contracts with its own version",
         *([f"confirm: {u.probe.command}"] if u.probe else [])],
    )


def too_deep_finding(u: Unresolved) -> Finding:
    """Coverage: a statement the dataflow walk could not analyse (its flows are unknown, not absent)."""
    return make_finding("MXA002", u.location, f"dataflow: {u.reason}", [f"{u.location.path}:{u.location.line}: {u.text}"])


def lse_findings(facts: DataflowFacts) -> tuple[list[Finding], list[Finding]]:
    """(one finding per mismatched flow, in flow order; the other LSE and coverage findings)."""
    seen: dict[tuple[str, int], Finding] = {}
    for u in facts.unpackings:  # the first visit of a call wins
        seen.setdefault((u.location.path, u.location.line), unpacking_finding(u))
    return ([flow_finding(f) for f in facts.flows if f.verdict == "mismatch"],
            [*seen.values(), *(too_deep_finding(u) for u in facts.too_deep)])


def dataflow_findings(facts: DataflowFacts) -> list[Finding]:
    """The dataflow stage's findings as the report lists them: mismatched flows first, then the
    unpackings, scale findings and coverage by location."""
    flows, others = lse_findings(facts)
    return [*flows, *sorted([*others, *scale_findings(facts)], key=lambda f: f.location)]


def check_dataflow(root: Path, files: Sequence[str], contracts: Contracts, *, port_package: str,
                   memo_common: list[str] | None = None, memo: Memo = NO_MEMO,
                   ) -> tuple[list[LseFlow], list[Finding], list[Unresolved]]:
    """The dataflow stage and its checks in one call: (every flow with its verdict, the findings,
    the values the walk could not follow). With `memo_common` each file's walk is kept in the
    dataflow memo (dataflow/memo.py)."""
    facts = follow(root, files, contracts, port_package=port_package, memo_common=memo_common, memo=memo)
    return list(facts.flows), dataflow_findings(facts), list(facts.unresolved)
