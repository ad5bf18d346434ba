# Rule `fp8-scale` over the dataflow stage's facts: a KV scale passed in the other form than the
# kernel's contract (float vs tensor), and K and V scales swapped at a kernel call.
from __future__ import annotations

from collections.abc import Iterator

from metax_audit.core.findings import make_finding, rule
from metax_audit.core.models import Category, Finding, Location, Severity
from metax_audit.stages.checks.stack import short_callee
from metax_audit.stages.dataflow import DataflowFacts, ScaleCall

RULE_SCALE_FORM = rule(
    "MXA513",
    Category.FP8_SCALE,
    Severity.WARNING,
    "a KV scale is passed in the other form than the kernel's contract (Python float vs tensor)",
    "FlashInfer 0.2.x wrappers take k_scale/v_scale as Python floats; vLLM's cache ops and Triton "
    "kernels load one-element tensors. A tensor where a float is expected forces a device sync "
    "(and breaks graph capture) or fails; a float where a tensor is expected fails or is ignored. "
    "Pass the layer attribute of the right form (e.g. `_k_scale_float` vs `_k_scale`).",
)
RULE_SCALE_SWAP = rule(
    "MXA514",
    Category.FP8_SCALE,
    Severity.ERROR,
    "the K and V scales are swapped at a kernel call",
    "The argument for the K scale is named after the V scale and the one for the V scale after "
    "the K scale. With different K and V scales the dequantised attention is wrong. (One scale "
    "passed for both, as MLA's single latent cache does, is not reported.)",
)


def _confirm(call: ScaleCall) -> list[str]:
    return [f"confirm: {call.probe.command}"] if call.probe else []


def _call_findings(call: ScaleCall) -> Iterator[tuple[tuple[str, int, str], Finding]]:
    """(dedupe key, finding) for one visit of a call: each argument in the wrong form, then a swap."""
    path, line = call.location.path, call.location.line
    for a in call.arguments:
        if a.form is not None and a.form != a.expected:
            yield (path, line, a.param), make_finding(
                RULE_SCALE_FORM.id, Location(path, line, f"{call.location.symbol}:{a.param}"),
                f"{short_callee(call.callee)}({a.param}={a.text}) passes a {a.form} where the contract takes a {a.expected}",
                [call.statement, f"`{a.text}` reads as a {a.form} ({a.why})",
                 f"contract {call.convention}: {a.param} is a {a.expected} ({call.scale_form})", *_confirm(call)],
            )
    by_name = {a.param: a for a in call.arguments}
    k, v = by_name.get("k_scale"), by_name.get("v_scale")
    if k is not None and v is not None:
        kt, vt = k.text.lower(), v.text.lower()
        if "v_scale" in kt and "k_scale" not in kt and "k_scale" in vt and "v_scale" not in vt:
            yield (path, line, "swap"), make_finding(
                RULE_SCALE_SWAP.id, Location(path, line, f"{call.location.symbol}:k_scale"),
                f"{short_callee(call.callee)} gets k_scale={k.text} and v_scale={v.text}",
                [call.statement, f"contract {call.convention}: k_scale scales the keys (logits), v_scale the values (output)",
                 *_confirm(call)],
            )


def scale_findings(facts: DataflowFacts) -> list[Finding]:
    """One finding per place (the first visit of a call wins), in the order the walk saw them."""
    seen: dict[tuple[str, int, str], Finding] = {}
    for call in facts.scale_calls:
        for key, finding in _call_findings(call):
            seen.setdefault(key, finding)
    return list(seen.values())
