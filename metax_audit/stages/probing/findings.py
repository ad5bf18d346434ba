# The probe stage's rules (MXA400-MXA449) and the finding each mismatch, error or not-checkable
# result becomes.
from __future__ import annotations

from collections.abc import Iterable, Iterator

from metax_audit.core.findings import make_finding, rule
from metax_audit.core.models import Category, Finding, Location, ProbeEvidence, ProbeResult, Severity

# ---------------------------------------------------------------- rules (MXA400-MXA449)

_CATEGORY = {
    "lse": Category.LSE, "layout": Category.LAYOUT, "fp8-scale": Category.FP8_SCALE, "dcp": Category.DCP,
    "query-count": Category.QUERY_COUNT, "padding": Category.PADDING, "graph-capture": Category.GRAPH_CAPTURE,
}
_MISMATCH_RULE = {"lse": "MXA400", "layout": "MXA401", "fp8-scale": "MXA402", "dcp": "MXA403", "query-count": "MXA404",
                  "padding": "MXA405", "graph-capture": "MXA406"}
_ERROR_RULE = {"lse": "MXA410", "layout": "MXA411", "fp8-scale": "MXA412", "dcp": "MXA413", "query-count": "MXA414",
               "padding": "MXA415", "graph-capture": "MXA416"}
_HELP_MISMATCH = {
    "lse": "The kernel's LSE is not in the base or layout that was expected (the convention's base e, [tokens, heads], or what the target declares). A consumer that merges partial results (cascade, DCP, chunked prefill) with the other base silently mixes wrong weights. Convert at the call site or declare the base.",
    "layout": "The kernel read the KV cache in another layout than it was told (NHD vs HND), or ignored the strides of a view into a joint [N, 2, ...] allocation. Pass the layout the cache really has, or make the cache contiguous.",
    "fp8-scale": "With an FP8 KV cache and k_scale=2, v_scale=0.25, the output matched scales that were ignored, inverted, swapped or applied twice. Check how the call site passes k_scale/v_scale and whether the kernel already folds them in.",
    "dcp": "Partial attention over interleaved KV shards, merged with the given merge function, is not full attention: the producer's LSE base and the merger's assumed base differ, or the per-rank lengths are wrong. Convert the LSE before merging or use the matching merge.",
    "query-count": "With mixed query lengths in one batch the output matched another causal alignment (top-left or none) than bottom-right. Check qo_indptr/causal arguments at the call site.",
    "padding": "Padded requests (zero length, -1 block-table holes) changed real outputs, or padded heads were returned as real heads.",
    "graph-capture": "After capture, in-place changes of inputs and metadata and a replay, the output did not follow the new inputs: the target captured a stale pointer or a host-side value (e.g. a sequence length).",
}
for _p, _rid in _MISMATCH_RULE.items():
    rule(_rid, _CATEGORY[_p], Severity.ERROR, f"kernel semantics differ from the expected {_p} hypothesis (probe mismatch)", _HELP_MISMATCH[_p])
for _p, _rid in _ERROR_RULE.items():
    rule(_rid, _CATEGORY[_p], Severity.WARNING, f"the {_p} probe could not finish: the target raised, crashed or hung",
         "The probe ran in its own subprocess and the target raised an exception, died (signal) or timed out. The traceback or stderr tail is the evidence; until it runs, the semantics it checks are unvalidated.")
rule("MXA407", Category.COVERAGE, Severity.ERROR, "kernel semantics differ from the expected hypothesis of an add-on probe",
     "A probe outside the built-in set (e.g. h2o) found a mismatch; its per-hypothesis errors are the evidence.")
rule("MXA417", Category.COVERAGE, Severity.WARNING, "an add-on probe could not finish: the target raised, crashed or hung",
     "As MXA410-MXA416, for a probe outside the built-in set.")
rule("MXA420", Category.COVERAGE, Severity.INFO, "probe not checkable: the target lacks a control the probe needs",
     "The target's signature has no way to ask for what the probe needs (no LSE return, no scale argument, no layout switch). The probe failed closed; the contract stays unvalidated. The inspected signature is the evidence.")


# ---------------------------------------------------------------- findings


def probe_findings(results: Iterable[ProbeResult]) -> Iterator[Finding]:
    """A mismatch, an error (crash, hang, exception in the target) or a not-checkable result
    becomes a finding with the per-hypothesis errors and the device as evidence."""
    for r in results:
        loc = Location(path=f"probe:{r.target}", line=0, symbol=f"{r.probe}/{r.family}")
        ev = _evidence(r)
        probe = ProbeEvidence(r.probe, r.target, r.family, r.verdict,
                              (r.matched or "") if r.verdict == "mismatch" else (r.skipped_reason or ""), r.expected or "",
                              r.device or "")
        if r.verdict == "mismatch":
            rid = _MISMATCH_RULE.get(r.probe, "MXA407")
            got = r.matched or "no hypothesis"
            yield make_finding(rid, loc, f"{r.target} ({r.family}) {r.probe}: matched {got!r}, expected {r.expected!r}", ev, probe=probe)
        elif r.verdict == "error":
            rid = _ERROR_RULE.get(r.probe, "MXA417")
            yield make_finding(rid, loc, f"{r.target} ({r.family}) {r.probe}: {r.skipped_reason}", ev, probe=probe)
        elif r.verdict == "not-checkable":
            yield make_finding("MXA420", loc, f"{r.target} ({r.family}) {r.probe} not checkable: {r.skipped_reason}", ev, probe=probe)


def _evidence(r: ProbeResult) -> list[str]:
    ev = [f"probe {r.probe} on {r.target} ({r.family}), device {r.device}"]
    if r.expected:
        ev.append(f"expected {r.expected}, matched {r.matched}")
    for h, e in sorted(r.hypotheses.items(), key=lambda kv: (kv[1] is None, kv[1] or 0.0)):
        ev.append(f"hypothesis {h}: worst abs error {e:.3g}" if e is not None else f"hypothesis {h}: no error recorded")
    for c in r.details.get("cases", ())[:4]:
        ev.append(f"case {c.get('name')}: matched {c.get('matched')}")
    ev += [str(x) for x in r.details.get("evidence", ())][:3]
    if r.details.get("stderr_tail"):
        ev.append("stderr tail: " + r.details["stderr_tail"][-400:])
    if r.details.get("rerun"):
        ev.append(f"rerun: {r.details['rerun']}")
    return ev
