# The `dcp` probe: decode context parallelism simulated on one device. KV is dealt to N virtual
# ranks in interleaved runs, each rank's partial (out, lse) comes from the producer kernel, the
# merge function combines them, and the result must equal full attention; plus per-rank lengths.
from __future__ import annotations

from typing import Any

from metax_audit.probes import _scenario as sc
from metax_audit.probes.base import ProbeContext, ProbeOutcome, ProbeSpec, Target, Tolerance, case_result, conclude
from metax_audit.probes.registry import load_target

TOL = Tolerance(atol=2e-2, rtol=2e-2)
LENS_TOL = Tolerance(atol=0.5, rtol=0.0)
GRID = ((2, 1), (4, 8))  # (ranks, interleave size): interleave 1 and > 1, as vLLM allows
LENS = (37, 64, 45, 5)  # the last request has no KV on ranks 1-3 at interleave 8: empty ranks must weigh nothing


def owner(t: int, ranks: int, interleave: int) -> int:
    return (t // interleave) % ranks


def _simulate(producer: Target, merger: Target, ctx: ProbeContext, ranks: int, interleave: int) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    import math

    import torch

    from metax_audit.probes import reference
    from metax_audit.probes.reference import LN2

    g = torch.Generator().manual_seed(ctx.seed + 10 * ranks + interleave)
    seq_lens, hq, hkv, d, page = list(LENS), 4, 2, 128, 16
    B = len(seq_lens)
    q = torch.randn(B, hq, d, generator=g).to(torch.float16)
    ks, vs = [], []
    for L in seq_lens:
        rank = torch.tensor([owner(t, ranks, interleave) for t in range(L)], dtype=torch.float32)
        # rank-dependent key sharpness and value offset: partial LSEs and outputs then differ
        # enough that a merge in the wrong base moves the result far past the tolerance
        ks.append((torch.randn(L, hkv, d, generator=g) * (1.0 + 1.5 * rank)[:, None, None]).to(torch.float16))
        vs.append((torch.randn(L, hkv, d, generator=g) + 4.0 * rank[:, None, None] - 2.0).to(torch.float16))
    scale = 1.0 / math.sqrt(d)
    full = torch.cat([reference.attention(q[b : b + 1], ks[b], vs[b], scale)[0] for b in range(B)])
    acc = None
    ref_parts = []
    for r in range(ranks):
        sel = [[t for t in range(L) if owner(t, ranks, interleave) == r] for L in seq_lens]
        lk = [ks[b][sel[b]] for b in range(B)]
        lv = [vs[b][sel[b]] for b in range(B)]
        kc, bt, lens = sc.page_tokens(lk, page, ctx.device)
        vc, _, _ = sc.page_tokens(lv, page, ctx.device)
        res = producer(q.to(ctx.device), kc, vc, bt, lens, sm_scale=scale, return_lse=True)
        if not isinstance(res, tuple | list) or len(res) < 2:
            from metax_audit.probes.base import ControlAbsent

            raise ControlAbsent("return_lse", f"{producer.name}{producer.signature} (returned no LSE)")
        o, s = res[0], res[1]
        acc = (o, s) if acc is None else tuple(merger(acc[0], acc[1], o, s)[:2])
        parts = [reference.attention(q[b : b + 1], lk[b], lv[b], scale) for b in range(B)]
        ref_parts.append((torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])))

    def merged(conv: float, base: str) -> Any:
        o, s = ref_parts[0][0], ref_parts[0][1] * conv
        for po, ps in ref_parts[1:]:
            o, s = reference.merge_states(o, s, po, ps * conv, base=base)
        return o

    hyps = {
        "consistent": full,
        "producer-base-2/merge-base-e": merged(1 / LN2, "e"),
        "producer-base-e/merge-base-2": merged(1.0, "2"),
    }
    assert acc is not None
    return acc[0], hyps, {"q": q, "k_rank0": ks[0]}


def _has_empty_rank(ranks: int, interleave: int) -> bool:
    return any(len({owner(t, ranks, interleave) for t in range(L)}) < ranks for L in LENS)


def _attention_pair(producer: Target, merger: Target, probed: Target, ctx: ProbeContext) -> ProbeOutcome:
    producer.require("return_lse")
    cases = []
    for ranks, inter in GRID:
        out, hyps, tensors = _simulate(producer, merger, ctx, ranks, inter)
        cases.append(case_result(f"ranks={ranks} interleave={inter} lens={list(LENS)}", out, hyps, TOL, tensors={**tensors, "out": out},
                                 nonfinite="nan-on-empty" if _has_empty_rank(ranks, inter) else "non-finite"))
    details = {"producer": producer.name, "producer declares": producer.declares.get("lse", "(nothing)"),
               "merger": merger.name, "merger declares base": merger.declares.get("merge_base", "(nothing)")}
    return conclude("dcp", probed, cases, expected="consistent", tol=TOL, details=details,
                    evidence=(f"producer {producer.name}{producer.signature}", f"merger {merger.name}{merger.signature}"))


def _local_lens(target: Target, ctx: ProbeContext) -> ProbeOutcome:
    import torch

    from metax_audit.probes.families.merge_states import reference_local_seq_lens

    def wrong(sl: Any, n: int, r: int, i: int) -> Any:  # the rank offset counted in tokens, not runs
        base = sl // (i * n) * i
        rem = sl - base * n
        return base + torch.clamp(rem - r, 0, i)

    plain = torch.tensor([1, 5, 16, 17, 37, 64, 100], dtype=torch.int32)
    q_len = 3  # multi-token prediction: each request verifies 3 query tokens, each with its own KV length
    mtp = torch.stack([plain - q_len + 1 + j for j in range(q_len)], dim=1).reshape(-1).clamp(min=0)
    cases = []
    for label, sl in (("plain decode", plain), (f"MTP-expanded ({q_len} query tokens per request)", mtp)):
        for n, i in ((2, 1), (4, 8), (2, 16)):
            got = target(sl.to(ctx.device), dcp_size=n, dcp_rank=None, cp_kv_cache_interleave_size=i)
            per_rank = torch.stack([target(sl.to(ctx.device), dcp_size=n, dcp_rank=r, cp_kv_cache_interleave_size=i).reshape(-1)
                                    for r in range(n)], dim=1)
            ref = reference_local_seq_lens(sl, n, None, i)
            hyps = {"correct": (ref, ref)}
            if i > 1:
                bad = torch.stack([wrong(sl, n, r, i) for r in range(n)], dim=1)
                hyps["dropped-interleave-offset"] = (bad, bad)
            cases.append(case_result(f"{label}/ranks={n} interleave={i}", (got, per_rank), hyps, LENS_TOL, tensors={"seq_lens": sl}))
    return conclude("dcp", target, cases, expected="correct", tol=LENS_TOL)


def run(target: Target, ctx: ProbeContext) -> ProbeOutcome:
    if target.family == "dcp-local-seq-lens":
        return _local_lens(target, ctx)
    if target.family == "merge-states":
        producer = load_target(ctx.options.get("producer", "torch-reference"), "paged-decode", ctx)
        return _attention_pair(producer, target, target, ctx)
    if ctx.options.get("world_size"):  # real ranks: N processes, the reduction with its collectives
        from metax_audit.probes.dcp_ranks import run_ranks

        return run_ranks(target, ctx)
    merger = load_target(ctx.options.get("merge", "torch-reference:base-e"), "merge-states", ctx)
    return _attention_pair(target, merger, target, ctx)


PROBES = (ProbeSpec(name="dcp", families=("paged-decode", "merge-states", "dcp-local-seq-lens"), run=run, category="dcp",
                    summary="decode context parallelism: interleaved KV shards merged equal full attention; producer/merger LSE bases agree; per-rank lengths"),)
