# The `lse` probe: which base (e or 2) and layout ([tokens, heads] or [heads, tokens]) an
# attention kernel's LSE has, its value for an empty sequence, and which base a merge assumes.
from __future__ import annotations

from typing import Any

from metax_audit.probes import _scenario as sc
from metax_audit.probes.base import (
    CaseResult,
    HypothesisError,
    ProbeContext,
    ProbeOutcome,
    ProbeSpec,
    Target,
    Tolerance,
    case_result,
    conclude,
    expected_for,
)

LSE_TOL = Tolerance(atol=2e-2, rtol=2e-3)
OUT_TOL = Tolerance(atol=1e-2, rtol=1e-2)
HYPOTHESES = ("base-e/[T,H]", "base-2/[T,H]", "base-e/[H,T]", "base-2/[H,T]")


def lse_hypotheses(lse_e: Any) -> dict[str, Any]:
    from metax_audit.probes.reference import LN2

    lse2 = lse_e / LN2
    return {"base-e/[T,H]": lse_e, "base-2/[T,H]": lse2, "base-e/[H,T]": lse_e.T.contiguous(), "base-2/[H,T]": lse2.T.contiguous()}


def _attention(target: Target, ctx: ProbeContext) -> ProbeOutcome:
    target.require("return_lse")
    grids: list[dict[str, Any]] = {
        "paged-decode": [dict(seq_lens=[37, 64, 5])],
        "paged-prefill": [dict(seq_lens=[20, 6, 40], qo_lens=[1, 6, 17])],
        "ragged-prefill": [dict(seq_lens=[20, 6, 40], qo_lens=[1, 6, 17])],
    }[target.family]
    expected, source = expected_for(target, "lse", "base-e/[T,H]")
    cases, details = [], {}
    for i, g in enumerate(grids):
        s = sc.build(target.family, device=ctx.device, seed=ctx.seed + i, **g)
        out, lse = sc.need_lse(target, s.call(target, return_lse=True))
        ref_out, ref_lse = s.ref()
        hyps = lse_hypotheses(ref_lse)
        if s.block_table is not None:  # the identity mapping, in the expected base and layout
            hyps["block-table-ignored"] = hyps[expected] if expected not in hyps else lse_hypotheses(
                s.ref(block_table=sc.identity_table(s.block_table))[1])[expected]
        cases.append(case_result(f"{target.family}/lens={g['seq_lens']}", lse, hyps, LSE_TOL, tensors={**s.tensors(), "lse": lse}))
        o = case_result("out", out, {"reference": ref_out}, OUT_TOL, check_separation=False)
        details[f"output error vs reference ({cases[-1].name})"] = o.errors["reference"].abs
    layout = "[H,T]" if any("[H,T]" in (c.matched or "") for c in cases) else "[T,H]"
    empty, observed = _empty_sequence(target, ctx, layout)
    details.update(observed)
    if empty is not None:
        cases.append(empty)
    return conclude("lse", target, cases, expected=expected, expected_source=source, tol=LSE_TOL, details=details)


# What the convention says an empty sequence (a request with no KV at all) returns: out 0 and an LSE
# that gives it no weight in a merge: -inf, or a finite sentinel at or below this (FlashInfer: -5e4).
EMPTY_LSE_CEILING = -1e4


def _empty_sequence(target: Target, ctx: ProbeContext, layout: str) -> tuple[CaseResult | None, dict[str, Any]]:
    """A decode batch [0, 9]: the empty request must hold out 0 (finite) and an LSE that weighs
    nothing (-inf or <= EMPTY_LSE_CEILING); NaN/inf in its out or a NaN LSE is `nan-on-empty`
    (unless the target declares {"empty": "nan-on-empty"}). Prefill: the zero-length request
    returns no rows. The LSE row is read in the layout the main cases matched. Run last: some
    kernels fault on it (recorded, outside the verdict)."""
    g: dict[str, Any] = dict(seq_lens=[0, 9]) if target.family == "paged-decode" else dict(seq_lens=[0, 9], qo_lens=[0, 3])
    try:
        s = sc.build(target.family, device=ctx.device, seed=ctx.seed + 99, **g)
        out, lse = sc.need_lse(target, s.call(target, return_lse=True))
    except Exception as exc:  # recorded, never fatal to the verdict above
        return None, {"empty sequence": f"target raised {type(exc).__name__}: {str(exc)[:200]}"}
    if target.family != "paged-decode":
        return None, {"zero-length request: rows returned": int(out.shape[0]), "zero-length request: expected rows": 3}
    h = out.shape[1]
    row_lse = (lse.reshape(h, -1)[:, 0] if layout == "[H,T]" else lse.reshape(-1, h)[0]).float()
    row_out = out[0].float()
    observed = {"empty sequence: out max |.|": float(row_out.nan_to_num(nan=float("inf")).abs().max()),
                "empty sequence: out has nan": bool(row_out.isnan().any()),
                "empty sequence: lse values": [float(x) for x in row_lse.cpu()]}
    return empty_case("empty sequence (seq_lens=[0, 9]): out 0, lse -inf or <= -1e4", row_out, row_lse,
                      target.declares.get("empty", "neutral")), observed


def empty_case(name: str, row_out: Any, row_lse: Any | None, expected: str = "neutral") -> CaseResult:
    """The verdict for an empty sequence's row: `neutral`, `nan-on-empty` or no hypothesis."""
    import math

    import torch

    o = row_out.detach().double().cpu()
    finite = bool(torch.isfinite(o).all())
    out_err = float(o.nan_to_num(nan=math.inf).abs().max()) if o.numel() else 0.0
    lse_ok, lse_nan = True, False
    if row_lse is not None:
        lv = row_lse.detach().double().cpu()
        lse_nan = bool(lv.isnan().any())
        lse_ok = not lse_nan and bool((lv <= EMPTY_LSE_CEILING).all())
    neutral = finite and out_err <= OUT_TOL.atol and lse_ok
    nan = (not finite) or lse_nan
    errors = {"neutral": HypothesisError(abs=out_err, rel=0.0, within=neutral),
              "nan-on-empty": HypothesisError(abs=0.0 if nan else math.inf, rel=0.0, within=nan)}
    matched = "neutral" if neutral else ("nan-on-empty" if nan else None)
    note = "" if matched else "finite but not neutral: out not 0, or an LSE above -1e4 gives the empty request weight"
    return CaseResult(name=name, matched=matched, errors=errors, shapes={"out row": list(o.shape)}, note=note, expected=expected)


def _merge(target: Target, ctx: ProbeContext) -> ProbeOutcome:
    """Feed one set of partial states and see which base the merge assumed; rows with one side
    at -inf check that an empty segment contributes nothing."""
    import math

    import torch

    from metax_audit.probes.reference import merge_states

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
