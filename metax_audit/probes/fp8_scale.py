# The `fp8-scale` probe: with an FP8 (e4m3) KV cache and distinct non-unit k_scale=2, v_scale=0.25,
# is each scale applied, ignored (both, K only, V only), inverted, swapped, or applied twice; float vs tensor scales.
from __future__ import annotations

from typing import Any

from metax_audit.probes import _scenario as sc
from metax_audit.probes.base import ProbeContext, ProbeOutcome, ProbeSpec, Target, Tolerance, case_result, conclude

K_SCALE, V_SCALE = 2.0, 0.25  # every pair of hypotheses below differs (swapped != inverted)
TOL = Tolerance(atol=2e-2, rtol=2e-2)
HYPOTHESES = {
    "applied": (K_SCALE, V_SCALE),
    "ignored": (1.0, 1.0),
    "k-scale-ignored": (1.0, V_SCALE),
    "v-scale-ignored": (K_SCALE, 1.0),
    "inverted": (1 / K_SCALE, 1 / V_SCALE),
    "swapped": (V_SCALE, K_SCALE),
    "applied-twice": (K_SCALE**2, V_SCALE**2),
}


def _hyps(s: sc.Scenario) -> dict[str, Any]:
    return {name: s.ref(k_scale=ks, v_scale=vs)[0] for name, (ks, vs) in HYPOTHESES.items()}


def run(target: Target, ctx: ProbeContext) -> ProbeOutcome:
    import torch

    target.require("k_scale", "v_scale")
    fam = target.family
    lens: dict[str, Any] = dict(seq_lens=[37, 64, 5]) if fam == "paged-decode" else dict(seq_lens=[20, 6, 40], qo_lens=[1, 6, 17])
    fp8 = torch.float8_e4m3fn
    s = sc.build(fam, device=ctx.device, seed=ctx.seed, kv_dtype=fp8, **lens)
    out, _ = sc.split(s.call(target, k_scale=K_SCALE, v_scale=V_SCALE))
    cases = [case_result(f"{fam}/e4m3 cache/k_scale={K_SCALE} v_scale={V_SCALE} as float", out, _hyps(s), TOL,
                         tensors={**s.tensors(), "out": out})]
    details: dict[str, Any] = {}
    # The same scales as 0-dim device tensors (vLLM keeps them as layer tensors): recorded as
    # an observation; an API that takes only floats is a fact, not a wrong scale.
    try:
        ks = torch.tensor(K_SCALE, dtype=torch.float32, device=ctx.device)
        vs = torch.tensor(V_SCALE, dtype=torch.float32, device=ctx.device)
        out_t, _ = sc.split(s.call(target, k_scale=ks, v_scale=vs))
        c = case_result(f"{fam}/e4m3 cache/scales as 0-dim tensors", out_t, _hyps(s), TOL, check_separation=False)
        details["scales as tensors: matched"] = c.matched
        details["scales as tensors: errors"] = {h: e.abs for h, e in c.errors.items()}
    except Exception as exc:
        details["scales as tensors"] = f"target raised {type(exc).__name__}: {str(exc)[:200]}"
    return conclude("fp8-scale", target, cases, expected="applied", tol=TOL, details=details)


PROBES = (ProbeSpec(name="fp8-scale", families=sc.ATTENTION_FAMILIES, run=run, category="fp8-scale",
                    summary="FP8 KV cache k_scale/v_scale applied, ignored, inverted, swapped or applied twice"),)
