# The `lse` probe: which base (e or 2) and layout ([tokens, heads] or [heads, tokens]) an
# attention kernel's LSE has, its value for an empty sequence, and which base a merge assumes.
from __future__ import annotations

from typing import Any

from probes import _scenario as sc
from probes.base import ProbeContext, ProbeOutcome, ProbeSpec, Target, Tolerance, case_result, conclude, expected_for

LSE_TOL = Tolerance(atol=2e-2, rtol=2e-3)
OUT_TOL = Tolerance(atol=1e-2, rtol=1e-2)
HYPOTHESES = ("base-e/[T,H]", "base-2/[T,H]", "base-e/[H,T]", "base-2/[H,T]")


def lse_hypotheses(lse_e: Any) -> dict[str, Any]:
    from probes.reference import LN2

    lse2 = lse_e / LN2
    return {"base-e/[T,H]": lse_e, "base-2/[T,H]": lse2, "base-e/[H,T]": lse_e.T.contiguous(), "base-2/[H,T]": lse2.T.contiguous()}


def _attention(target: Target, ctx: ProbeContext) -> ProbeOutcome:
    target.require("return_lse")
    grids = {
        "paged-decode": [dict(seq_lens=[37, 64, 5])],
        "paged-prefill": [dict(seq_lens=[20, 6, 40], qo_lens=[1, 6, 17])],
        "ragged-prefill": [dict(seq_lens=[20, 6, 40], qo_lens=[1, 6, 17])],
    }[target.family]
    cases, details = [], {}
    for i, g in enumerate(grids):
        s = sc.build(target.family, device=ctx.device, seed=ctx.seed + i, **g)
        out, lse = sc.need_lse(target, s.call(target, return_lse=True))
        ref_out, ref_lse = s.ref()
        cases.append(case_result(f"{target.family}/lens={g['seq_lens']}", lse, lse_hypotheses(ref_lse), LSE_TOL, tensors={**s.tensors(), "lse": lse}))
        o = case_result("out", out, {"reference": ref_out}, OUT_TOL, check_separation=False)
        details[f"output error vs reference ({cases[-1].name})"] = o.errors["reference"].abs
    details.update(_empty_sequence(target, ctx))
    expected, source = expected_for(target, "lse", "base-e/[T,H]")
    return conclude("lse", target, cases, expected=expected, expected_source=source, tol=LSE_TOL, details=details)


def _empty_sequence(target: Target, ctx: ProbeContext) -> dict[str, Any]:
    """An observation, outside the verdict: what comes back for a request with no KV at all
    (the neutral answer is out 0 and lse -inf). Run last: some kernels fault on it."""
    g = dict(seq_lens=[0, 9]) if target.family == "paged-decode" else dict(seq_lens=[0, 9], qo_lens=[0, 3])
    try:
        s = sc.build(target.family, device=ctx.device, seed=ctx.seed + 99, **g)
        out, lse = sc.need_lse(target, s.call(target, return_lse=True))
        if target.family == "paged-decode":
            row_out, row_lse = out[0].float(), lse.reshape(-1)[: out.shape[1]].float()
            return {"empty sequence: out max |.|": float(row_out.abs().max()), "empty sequence: out has nan": bool(row_out.isnan().any()),
                    "empty sequence: lse values": [float(x) for x in row_lse.cpu()]}
        return {"zero-length request: rows returned": int(out.shape[0]), "zero-length request: expected rows": 3}
    except Exception as exc:  # recorded, never fatal to the verdict above
        return {"empty sequence": f"target raised {type(exc).__name__}: {str(exc)[:200]}"}


def _merge(target: Target, ctx: ProbeContext) -> ProbeOutcome:
    """Feed one set of partial states and see which base the merge assumed; rows with one side
    at -inf check that an empty segment contributes nothing."""
    import math

    import torch

    from probes.reference import merge_states

    g = torch.Generator().manual_seed(ctx.seed)
    T, H, D = 6, 4, 64
    v_a = (torch.randn(T, H, D, generator=g) + 2.0).to(torch.float16).to(ctx.device)
    v_b = (torch.randn(T, H, D, generator=g) - 2.0).to(torch.float16).to(ctx.device)
    s_a = (torch.randn(T, H, generator=g) * 1.5 + 2.0).to(ctx.device)
    s_b = (torch.randn(T, H, generator=g) * 1.5).to(ctx.device)
    s_b[-1] = -math.inf  # an empty segment: the merged row must equal side a
    got = target(v_a, s_a, v_b, s_b)
    hyps = {f"merge-base-{b}": merge_states(v_a, s_a, v_b, s_b, base=b) for b in ("e", "2")}
    case = case_result("merge two segments", tuple(got[:2]), hyps, Tolerance(2e-2, 1e-2),
                       tensors={"v_a": v_a, "s_a": s_a, "v_b": v_b, "s_b": s_b})
    exp_base, source = expected_for(target, "merge_base", "e")
    return conclude("lse", target, [case], expected=f"merge-base-{exp_base}", expected_source=source, tol=Tolerance(2e-2, 1e-2),
                    details={"row with s_b=-inf equals v_a": bool((got[0][-1].float() - v_a[-1].float()).abs().max() < 2e-2)})


def run(target: Target, ctx: ProbeContext) -> ProbeOutcome:
    return _merge(target, ctx) if target.family == "merge-states" else _attention(target, ctx)


PROBES = (ProbeSpec(name="lse", families=(*sc.ATTENTION_FAMILIES, "merge-states"), run=run, category="lse",
                    summary="LSE base (e or 2) and layout ([T,H] or [H,T]); empty-sequence value; the base a merge assumes"),)
