# Triage: a finding at a call that runs only with a feature on, which the platform's config switch turns off on
# every run (`model_config.disable_cascade_attn = True` in check_and_update_config), has no consequence on the
# platform today: info, with the switch and the branch as its gate. "Runs only with the feature on": the call's
# own branch requires the feature (an early `if not use_cascade: return` counts: the trace carries it), or the
# function it sits in is called only from such calls, followed through the port's callers.
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from metax_audit.core.models import CallSite, Category, ConfigSwitch, Finding, Severity
from metax_audit.stages.checks.inactive_path import behind, feature_words, turns_off, unconditional

_MAX_HOPS = 3  # callers of the enclosing function followed
# Consequences that do not wait for the call to run: an import fails when the module loads, a class contract and a
# config-level list hold whatever path runs.
_NOT_AT_CALL = frozenset({Category.IMPORT, Category.REGISTRATION, Category.ENVIRONMENT, Category.COVERAGE,
                          Category.INACTIVE_PATH})
_CLASS_CONTRACT = frozenset({"MXA207", "MXA208", "MXA185"})


def demote_switched_off(findings: Sequence[Finding], calls: Sequence[CallSite],
                        switches: Sequence[ConfigSwitch]) -> list[Finding]:
    off = [(s, words) for s in switches if (words := feature_words(s)) and turns_off(s) and unconditional(s)]
    if not off:
        return list(findings)
    at: dict[tuple[str, int], list[CallSite]] = {}
    into: dict[str, list[CallSite]] = {}
    for c in calls:
        at.setdefault((c.location.path, c.location.line), []).append(c)
        if c.resolved:
            into.setdefault(c.resolved, []).append(c)
    out = []
    for f in findings:
        # Every place the finding stands for that nothing explains yet must be a call behind the feature.
        lines = dict.fromkeys([f.location.line, *(s.line for s in f.sites if s.path == f.location.path and not s.verdict)])
        places = [at.get((f.location.path, line)) for line in lines]
        if f.severity in (Severity.ERROR, Severity.WARNING) and f.category not in _NOT_AT_CALL \
                and f.rule not in _CLASS_CONTRACT and all(places):
            for switch, words in off:
                gates = [_gate(here, words, into, 0) for here in places if here]
                gate = "; ".join(dict.fromkeys(gates)) if all(gates) else ""
                if gate:
                    why = (f"gate: runs only with '{' '.join(words)}' on ({gate}); {switch.location.path}:{switch.location.line} "
                           f"sets {switch.target} = {switch.value} on every run (check_and_update_config)")
                    f = replace(f, severity=Severity.INFO, evidence=(*f.evidence, why))
                    break
        out.append(f)
    return out


def _gate(sites: Sequence[CallSite], words: tuple[str, ...], into: dict[str, list[CallSite]], hops: int) -> str:
    """How every one of these calls (one statement's) runs only with the feature on, or ""."""
    reasons = []
    for c in sites:
        if behind(c.branch, words):
            needs = [p for p in c.branch.split(" / ") if behind(p, words)]  # the conditions that name the feature
            reasons.append(f"{c.location.path}:{c.location.line} under `{' / '.join(needs)}`")
            continue
        callers = into.get(c.caller, [])
        if not callers or hops >= _MAX_HOPS:
            return ""  # reached from code not seen here (upstream, or the framework by name): may run
        via = [_gate([k], words, into, hops + 1) for k in callers]
        if not all(via):
            return ""
        short = c.caller.rsplit(".", 1)[-1]
        reasons.append(f"{short} is called only at {'; '.join(dict.fromkeys(via))}")
    return "; ".join(dict.fromkeys(reasons))
