# The `query-count` and `padding` probes: mixed query lengths in one batch (decode-like, short and
# long prefill, append) with bottom-right causal masking; zero-length padded requests, -1 holes in
# the block table, and padded heads that must not come back as real heads.
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
    compare,
    conclude,
)

TOL = Tolerance(atol=1e-2, rtol=1e-2)


def run_query_count(target: Target, ctx: ProbeContext) -> ProbeOutcome:
    target.require("causal")
    s = sc.build(target.family, device=ctx.device, seed=ctx.seed, seq_lens=[9, 7, 60, 30], qo_lens=[1, 7, 33, 2])
    out, _ = sc.split(s.call(target, causal=True))
    hyps = {"bottom-right-causal": s.ref()[0], "top-left-causal": s.ref(causal_align="top-left")[0], "non-causal": s.ref(causal=False)[0]}
    case = case_result("qo_lens=[1, 7, 33, 2] kv_lens=[9, 7, 60, 30]", out, hyps, TOL, tensors={**s.tensors(), "out": out})
    return conclude("query-count", target, [case], expected="bottom-right-causal", tol=TOL)


def _real_rows(s: sc.Scenario) -> tuple[list[int], list[int]]:
    """Output rows that belong to real requests, and the padded decode rows."""
    if s.family == "paged-decode":
        lens = s.seq_lens.tolist()
        return [b for b, L in enumerate(lens) if L > 0], [b for b, L in enumerate(lens) if L == 0]
    rows, start = [], 0
    assert s.qo_lens is not None  # the prefill families carry query lengths
    for n in s.qo_lens.tolist():
        rows += list(range(start, start + n))
        start += n
    return rows, []


def run_padding(target: Target, ctx: ProbeContext) -> ProbeOutcome:
    fam = target.family
    if fam == "paged-decode":
        g: dict[str, Any] = dict(seq_lens=[37, 0, 20, 0])
    else:
        g = dict(seq_lens=[20, 0, 9, 0], qo_lens=[5, 0, 3, 0])
    s = sc.build(fam, device=ctx.device, seed=ctx.seed, **g)
    out, _ = sc.split(s.call(target))
    ref = s.ref()[0]
    real, pad = _real_rows(s)
    n_real = len(real)
    compacted = ref.new_zeros(ref.shape)
    compacted[:n_real] = ref[real]
    hyps = {"neutral": ref[real]}
    if pad:  # decode keeps a row per request: a kernel that skips padded requests shifts the rows
        hyps["rows-compacted"] = compacted[real]
    cases = [case_result(f"zero-length padded requests, -1 holes in block table ({g})", out[real], hyps, TOL,
                         tensors={**s.tensors(), "out": out})]
    details: dict[str, Any] = {}
    if pad:
        p = out[pad].float()
        details["padded rows: max |out|"] = float(p.nan_to_num(nan=float("inf")).abs().max())
        details["padded rows: finite"] = bool(p.isfinite().all())
        cases.append(_padded_rows(p, pad, target.declares.get("padding", "neutral")))
    try:
        cases.append(_padded_heads(target, ctx))
    except Exception as exc:  # a kernel without this group size is a fact about it, recorded
        details["padded heads (Hq=6, Hkv=2)"] = f"target raised {type(exc).__name__}: {str(exc)[:200]}"
    return conclude("padding", target, cases, expected="neutral", tol=TOL, details=details)


def _padded_rows(rows: Any, pad: list[int], expected: str) -> CaseResult:
    """The convention: a padded request's output row holds finite values (the reference writes 0;
    vLLM discards the row, so any finite value is accepted). NaN/inf there is `nan-in-padding`,
    unless the target declares {"padding": "nan-in-padding"}: a NaN row can still poison batch-wide
    reductions (an fp8 output quantiser's amax, a sum for logging)."""
    import torch

    r = rows.detach().double().cpu()
    finite = bool(torch.isfinite(r).all())
    bad = int((~torch.isfinite(r)).sum())
    errors = {"neutral": HypothesisError(abs=0.0 if finite else float("inf"), rel=0.0, within=finite),
              "nan-in-padding": HypothesisError(abs=float("inf") if finite else 0.0, rel=0.0, within=not finite)}
    return CaseResult(name=f"padded rows {pad} finite", matched="neutral" if finite else "nan-in-padding", errors=errors,
                      shapes={"padded rows": list(r.shape)}, note=f"{bad} non-finite value(s)" if bad else "", expected=expected)


def _padded_heads(target: Target, ctx: ProbeContext) -> CaseResult:
    """Hq=6 (group size 3): a kernel that pads heads to 8 must still return exactly 6."""
    fam = target.family
    g: dict[str, Any] = dict(seq_lens=[37, 20]) if fam == "paged-decode" else dict(seq_lens=[20, 9], qo_lens=[5, 3])
    s = sc.build(fam, device=ctx.device, seed=ctx.seed + 1, hq=6, hkv=2, **g)
    out, _ = sc.split(s.call(target))
    ref = s.ref()[0]
    hq = ref.shape[1]
    absent = HypothesisError(abs=float("inf"), rel=float("inf"), within=False, shape_ok=False)
    if out.shape[1] == hq:
        errors = {"neutral": compare(out, ref, TOL), "padded-head-returned": absent}
    else:
        errors = {"neutral": absent, "padded-head-returned": compare(out[:, :hq], ref, TOL)}
    within = [h for h, e in errors.items() if e.within]
    return CaseResult(name="padded heads: Hq=6 Hkv=2", matched=within[0] if len(within) == 1 else None, errors=errors,
                      shapes={"q": list(s.q.shape), "out": list(out.shape)}, dtypes={"q": str(s.q.dtype).replace("torch.", "")},
                      note=f"target returned {out.shape[1]} heads for {hq} query heads")


PROBES = (
    ProbeSpec(name="query-count", families=("paged-prefill", "ragged-prefill"), run=run_query_count, category="query-count",
              summary="mixed query lengths in one batch with bottom-right causal masking"),
    ProbeSpec(name="padding", families=sc.ATTENTION_FAMILIES, run=run_padding, category="padding",
              summary="zero-length padded requests and block-table holes are neutral; padded heads are not returned"),
)
