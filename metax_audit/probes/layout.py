# The `layout` probe: does the kernel read the KV cache in the layout it is told (NHD or HND),
# honour the strides of views into a joint [N, 2, ...] allocation, and follow a shuffled block table.
from __future__ import annotations

from typing import Any

from metax_audit.probes import _scenario as sc
from metax_audit.probes.base import (
    CaseResult,
    ProbeContext,
    ProbeOutcome,
    ProbeSpec,
    Target,
    Tolerance,
    case_result,
    conclude,
)

TOL = Tolerance(atol=1e-2, rtol=1e-2)


def run(target: Target, ctx: ProbeContext) -> ProbeOutcome:
    target.require("kv_layout")
    fam = target.family
    lens: dict[str, Any] = dict(seq_lens=[37, 64, 5]) if fam == "paged-decode" else dict(seq_lens=[20, 6, 40], qo_lens=[1, 6, 17])
    cases: list[CaseResult] = []
    for i, (layout, joint) in enumerate([("NHD", False), ("HND", False), ("NHD", True), ("HND", True)]):
        s = sc.build(fam, device=ctx.device, seed=ctx.seed + i, layout=layout, joint=joint, **lens)
        out, _ = sc.split(s.call(target, kv_layout=layout))
        alt_k, alt_layout = sc.other_layout_view(s.k, layout)
        alt_v, _ = sc.other_layout_view(s.v, layout)
        hyps = {"as-told": s.ref()[0], "other-layout": s.ref(k=alt_k, v=alt_v, layout=alt_layout)[0]}
        if s.block_table is not None:
            hyps["block-table-ignored"] = s.ref(block_table=sc.identity_table(s.block_table))[0]
        if not (s.k.is_contiguous() and s.v.is_contiguous()):
            hyps["ignores-strides"] = s.ref(k=sc.ignoring_strides(s.k), v=sc.ignoring_strides(s.v))[0]
        name = f"{layout}/{'joint [N,2,...] views' if joint else 'split K,V'}" + ("/shuffled block table" if fam != "ragged-prefill" else "")
        cases.append(case_result(name, out, hyps, TOL, tensors={**s.tensors(), "out": out},
                                 note=f"k storage_offset={s.k.storage_offset()} v storage_offset={s.v.storage_offset()}"))
    return conclude("layout", target, cases, expected="as-told", tol=TOL,
                    details={"strides given": {c.name: {k: c.strides.get(k) for k in ("k_cache", "v_cache", "k", "v") if k in c.strides} for c in cases}})


PROBES = (ProbeSpec(name="layout", families=sc.ATTENTION_FAMILIES, run=run, category="layout",
                    summary="KV cache read in the layout it is told (NHD/HND), strides of joint views honoured, block table followed"),)
