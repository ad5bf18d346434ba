# The h2o-scores family (per-position attention mass from a paged KV cache) and the `h2o` probe:
# reference agreement, mass conservation, top-k stability, zero padding, and LSE-base honesty.
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from metax_audit.probes.base import (
    CaseResult,
    FamilySpec,
    ProbeContext,
    ProbeOutcome,
    ProbeSpec,
    Target,
    Tolerance,
    case_result,
    conclude,
    inspect_controls,
)

NAME = "h2o-scores"
CONTROLS = (
    "block_table", "seq_lens", "scale", "kv_layout", "lse", "lse_base", "reduce", "k_scale",
    "indptr", "indices", "last_page_len",
)
CONVENTION = """\
h2o-scores: target(q, kv_cache, *, block_table=None, seq_lens=None, scale, kv_layout="NHD", lse=None,
                   lse_base=None, reduce="sum", k_scale=None, indptr=None, indices=None,
                   last_page_len=None) -> float32 [B, Hkv, max(seq_lens)]
  q             [B, Hq, D], one decode query per request; query head h belongs to kv head h // (Hq/Hkv)
  kv_cache      [num_pages, 2, page, Hkv, D] (NHD; HND: [num_pages, 2, Hkv, page, D]), a (k, v) pair,
                or a K cache alone; bf16/fp16, or float8_e4m3fn with k_scale (k = k_fp8 * k_scale)
  block_table   int32 [B, max_pages] + seq_lens int32 [B] (vLLM), or indptr/indices/last_page_len
                (FlashInfer CSR); entries past a request's pages may be -1 and must not be read
  lse           [B, Hq] fp32 log-sum-exp of q.k*scale from the attention kernel; lse_base "e" or "2"
                says which log it is (FlashInfer: 2, FlashAttention: e) and is required with lse
  reduce        "sum" over the group's query heads, or "mean" (divides by Hq/Hkv)
  returns       score[r,g,t] = sum_{h in g} softmax_t(q[r,h].k[r,t,g]*scale), fp32; 0 for t >= seq_lens[r];
                per (r, g) the scores sum to the group size (1 with "mean")"""

KEEP_RATIOS = (0.25, 0.5, 0.75)
DEFAULT_TOL = Tolerance(atol=1e-6, rtol=1e-3)


# ---------------------------------------------------------------- inputs


@dataclass
class H2OCase:
    """One batch: a poisoned paged cache (NaN in every slot no sequence owns) and its metadata."""

    q: Any
    kv_cache: Any
    paging: dict[str, Any]  # block_table+seq_lens or indptr+indices+last_page_len
    lens: list[int]
    scale: float
    kv_layout: str
    group: int
    k_scale: Any = None
    notes: dict[str, Any] = field(default_factory=dict)

    def kwargs(self, **extra: Any) -> dict[str, Any]:
        kw: dict[str, Any] = {**self.paging, "scale": self.scale, "kv_layout": self.kv_layout}
        if self.k_scale is not None:
            kw["k_scale"] = self.k_scale
        kw.update(extra)
        return kw


def build_case(
    *,
    lens: tuple[int, ...] | list[int],
    q_heads: int = 8,
    kv_heads: int = 2,
    head_dim: int = 64,
    page_size: int = 16,
    dtype: str = "bfloat16",
    kv_layout: str = "NHD",
    paging: str = "block_table",
    device: str = "cpu",
    seed: int = 0,
    k_scale: float | None = None,
    logit_spread: float = 2.0,
) -> H2OCase:
    """Random q and keys on shuffled pages; unused slots, spare pages and table holes are poison.

    `logit_spread` scales q so that logits have roughly that standard deviation (peaky enough that
    top-k sets are well separated, flat enough that every position keeps some mass)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    fp8 = dtype == "float8_e4m3fn"
    store_dt = getattr(torch, dtype)
    pages_per = [-(-n // page_size) for n in lens]
    spare = 3
    num_pages = sum(pages_per) + spare
    shape = (num_pages, 2, page_size, kv_heads, head_dim) if kv_layout == "NHD" else (num_pages, 2, kv_heads, page_size, head_dim)
    cache32 = torch.full(shape, float("nan"))
    kview = cache32[:, 0] if kv_layout == "NHD" else cache32[:, 0].transpose(1, 2)
    vview = cache32[:, 1] if kv_layout == "NHD" else cache32[:, 1].transpose(1, 2)
    perm = torch.randperm(num_pages, generator=gen)
    table = torch.full((len(lens), max(pages_per, default=0) + 1), -1, dtype=torch.int32)
    used = 0
    for r, n in enumerate(lens):
        for j in range(pages_per[r]):
            p = int(perm[used])
            used += 1
            table[r, j] = p
            fill = min(page_size, n - j * page_size)
            keys = torch.randn(fill, kv_heads, head_dim, generator=gen)
            if fp8:
                keys = keys * 8.0  # stored values span the e4m3 range; k_scale brings them back
            kview[p, :fill] = keys
            vview[p, :fill] = torch.randn(fill, kv_heads, head_dim, generator=gen)
    cache = cache32.to(store_dt).to(device)
    q_dt = torch.bfloat16 if fp8 else store_dt
    scale = 1.0 / math.sqrt(head_dim)
    key_std = 8.0 * (k_scale or 1.0) if fp8 else 1.0
    q = (torch.randn(len(lens), q_heads, head_dim, generator=gen) * logit_spread / key_std).to(q_dt).to(device)
    meta = _paging(paging, table, pages_per, lens, page_size, device)
    return H2OCase(q=q, kv_cache=cache, paging=meta, lens=list(lens), scale=scale, kv_layout=kv_layout,
                   group=q_heads // kv_heads, k_scale=k_scale)


def _paging(paging: str, table: Any, pages_per: list[int], lens: tuple[int, ...] | list[int], page_size: int,
            device: str) -> dict[str, Any]:
    """The paging metadata a kernel reads: a block table with sequence lengths, or FlashInfer's
    indptr / indices / last_page_len over the same pages."""
    import torch

    seq = torch.tensor(list(lens), dtype=torch.int32)
    if paging == "block_table":
        return {"block_table": table.to(device), "seq_lens": seq.to(device)}
    if paging == "indptr":
        indptr = torch.tensor([0, *torch.tensor(pages_per, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32)
        indices = torch.cat([table[r, : pages_per[r]] for r in range(len(lens))]) if lens else torch.zeros(0, dtype=torch.int32)
        last = torch.tensor([n - (p - 1) * page_size if p else 0 for n, p in zip(lens, pages_per, strict=True)], dtype=torch.int32)
        return {"indptr": indptr.to(device), "indices": indices.to(device), "last_page_len": last.to(device)}
    raise ValueError(f"paging must be 'block_table' or 'indptr', got {paging!r}")


def true_lse(case: H2OCase, base: str = "e") -> Any:
    """The exact log-sum-exp of q.k*scale per (request, query head), fp64 then fp32, in `base`."""
    import torch

    from metax_audit.stages.probing.kernels.h2o_reference import key_cache_view, resolve_paging

    k = key_cache_view(case.kv_cache, case.kv_layout)
    pg = resolve_paging(int(k.shape[1]), **case.paging)
    hkv, d = int(k.shape[2]), int(k.shape[3])
    ks = 1.0 if case.k_scale is None else float(case.k_scale)
    out = torch.full(tuple(case.q.shape[:2]), float("-inf"), dtype=torch.float64)
    for r, n in enumerate(case.lens):
        if n == 0:
            continue
        pages = pg.pages_of(r, -(-n // int(k.shape[1]))).to(torch.int64)
        kr = k[pages].reshape(-1, hkv, d)[:n].to(torch.float64).cpu() * ks
        qr = case.q[r].to(torch.float64).cpu().reshape(hkv, case.group, d)
        out[r] = torch.logsumexp(torch.einsum("gjd,tgd->gjt", qr, kr) * case.scale, dim=-1).reshape(-1)
    if base == "2":
        out = out / math.log(2.0)
    return out.to(torch.float32).to(case.q.device)


# ---------------------------------------------------------------- checks


def topk_agreement(out: Any, ref: Any, lens: list[int], ratios: tuple[float, ...] = KEEP_RATIOS) -> dict[str, Any]:
    """Per keep ratio: (request, kv head) rows whose top-k sets differ, ties broken by position.

    A differing row whose swapped positions all lie within 1e-6 relative of the reference's k-th
    score is a near-tie (rounding can legitimately order them either way) and is counted apart."""
    import torch

    res: dict[str, Any] = {}
    o64, r64 = out.detach().double().cpu(), ref.detach().double().cpu()
    for ratio in ratios:
        differ = near = rows = 0
        for r, n in enumerate(lens):
            k = max(1, int(n * ratio)) if n else 0
            if k == 0:
                continue
            for g in range(o64.shape[1]):
                rows += 1
                # a stable sort breaks ties by position: the lower position wins among equal scores
                so = torch.sort(o64[r, g, :n], descending=True, stable=True).indices[:k]
                sr = torch.sort(r64[r, g, :n], descending=True, stable=True).indices[:k]
                a, b = set(so.tolist()), set(sr.tolist())
                if a == b:
                    continue
                kth = float(torch.sort(r64[r, g, :n], descending=True).values[k - 1])
                swapped = torch.tensor(sorted(a ^ b))
                if bool(((r64[r, g, swapped] - kth).abs() <= 1e-6 * abs(kth) + 1e-12).all()):
                    near += 1
                else:
                    differ += 1
        res[f"keep_{int(ratio * 100)}"] = {"rows": rows, "differ": differ, "near_ties": near}
    return res


def score_checks(out: Any, ref: Any, lens: list[int], group: int, reduce: str = "sum") -> dict[str, Any]:
    """Everything the Done-when asks of one output: agreement, mass, top-k, exact-zero padding."""
    import torch

    o = out.detach().double().cpu()
    r = ref.detach().double().cpu()
    want = 1.0 if reduce == "mean" else float(group)
    live = [i for i, n in enumerate(lens) if n > 0]
    mass = o[live].sum(-1) if live else torch.zeros(0)
    pad_ok = all(bool((o[i, :, n:] == 0).all()) for i, n in enumerate(lens))
    finite = bool(torch.isfinite(o).all())
    rel = float((o - r).norm() / r.norm()) if float(r.norm()) > 0 else float((o - r).norm())
    return {
        "shape_ok": tuple(o.shape) == tuple(r.shape),
        "finite": finite,
        "rel_err": rel,
        "max_abs_err": float((o - r).abs().nan_to_num(math.inf).max()) if o.numel() else 0.0,
        "mass_expected": want,
        "mass_max_dev": float((mass - want).abs().max()) if mass.numel() else 0.0,
        "padding_zero": pad_ok,
        "topk": topk_agreement(o, r, lens),
    }


def checks_pass(c: dict[str, Any], *, rel_tol: float = 1e-4, mass_tol: float = 1e-3) -> bool:
    topk_ok = all(v["differ"] == 0 for v in c["topk"].values())
    return bool(
        c["shape_ok"] and c["finite"] and c["padding_zero"] and c["rel_err"] <= rel_tol
        and c["mass_max_dev"] <= mass_tol and topk_ok
    )


# ---------------------------------------------------------------- family


def _reference_target(q: Any, kv_cache: Any, **kw: Any) -> Any:
    from metax_audit.stages.probing.kernels.h2o_reference import h2o_scores_reference

    return h2o_scores_reference(q, kv_cache, **kw)


def _kernel_target(q: Any, kv_cache: Any, **kw: Any) -> Any:
    from metax_audit.stages.probing.kernels.h2o import h2o_scores

    return h2o_scores(q, kv_cache, **kw)


BUILTIN = ("metax-audit", "torch-reference")


def load(spec: str, ctx: ProbeContext) -> Target:
    """`metax-audit`: the Triton kernel on CUDA (its CPU path elsewhere); `torch-reference`: the dense reference."""
    fn = {"metax-audit": _kernel_target, "torch-reference": _reference_target}[spec]
    sig, _ = inspect_controls(fn, CONTROLS)
    notes: tuple[str, ...] = ()
    if spec == "metax-audit":
        from metax_audit.stages.probing.kernels.h2o import triton_available

        path = "triton" if ctx.device.startswith("cuda") and triton_available() else "torch reference (CPU path)"
        notes = (f"metax_audit.stages.probing.kernels.h2o_scores runs its {path}",)
        sig = "(q, kv_cache, *, block_table, seq_lens, scale, kv_layout, lse, lse_base, reduce, k_scale, indptr, indices, last_page_len)"
    return Target(name=spec, family=NAME, fn=fn, signature=sig, controls=frozenset(CONTROLS), notes=notes)


FAMILIES = (FamilySpec(name=NAME, convention=CONVENTION, load=load, builtin_targets=BUILTIN, controls=CONTROLS),)


# ---------------------------------------------------------------- probe


def _tol(ctx: ProbeContext) -> Tolerance:
    return Tolerance(float(ctx.options.get("atol", DEFAULT_TOL.atol)), float(ctx.options.get("rtol", DEFAULT_TOL.rtol)))


def _hypotheses(case: H2OCase, *, lse: Any = None, lse_base: str | None = None, reduce: str = "sum") -> dict[str, Any]:
    """Each plausible semantics of the same call, so the case says which one the target follows."""
    import torch

    from metax_audit.stages.probing.kernels.h2o_reference import h2o_scores_reference

    kw = case.kwargs(reduce=reduce)
    if lse is not None:
        kw.update(lse=lse, lse_base=lse_base)
    correct = h2o_scores_reference(case.q, case.kv_cache, **kw)
    hyps = {"correct": correct}
    other = "mean" if reduce == "sum" else "sum"
    hyps[f"reduce-{other}"] = h2o_scores_reference(case.q, case.kv_cache, **{**kw, "reduce": other})
    hyps["scale-ignored"] = h2o_scores_reference(case.q, case.kv_cache, **{**kw, "scale": 1.0, **({"lse": None, "lse_base": None} if lse is not None else {})})
    # query head h mapped to kv head h % Hkv (interleaved) instead of h // group (contiguous)
    hkv = int(correct.shape[1])
    order = torch.arange(case.q.shape[1]).reshape(case.group, hkv).t().reshape(-1)
    if case.group > 1 and hkv > 1:
        kw_i = dict(kw)
        if lse is not None:
            kw_i["lse"] = lse[:, order.to(lse.device)]
        hyps["interleaved-groups"] = h2o_scores_reference(case.q[:, order.to(case.q.device)], case.kv_cache, **kw_i)
    if lse is not None:
        flipped = "e" if lse_base == "2" else "2"
        hyps[f"lse-read-as-base-{flipped}"] = h2o_scores_reference(case.q, case.kv_cache, **{**kw, "lse_base": flipped})
    return hyps


def _run_case(target: Target, name: str, case: H2OCase, tol: Tolerance, **call: Any) -> tuple[CaseResult, dict[str, Any]]:
    out = target(case.q, case.kv_cache, **case.kwargs(**call))
    hyps = _hypotheses(case, lse=call.get("lse"), lse_base=call.get("lse_base"), reduce=call.get("reduce", "sum"))
    res = case_result(name, out, hyps, tol, tensors={"q": case.q, "kv_cache": case.kv_cache, "out": out})
    return res, score_checks(out, hyps["correct"], case.lens, case.group, call.get("reduce", "sum"))


def probe_h2o(target: Target, ctx: ProbeContext) -> ProbeOutcome:
    """Agreement, mass, top-k, zero padding across layouts, page formats and LSE bases; then a
    mislabeled LSE (base-2 values declared base e) must move the mass, or the target ignores lse_base."""
    target.require("block_table", "seq_lens", "scale")
    tol = _tol(ctx)
    dev = ctx.device
    lens = (37, 0, 300, 16, 129)
    plans: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
        ("nhd-block-table-own-lse", {"kv_layout": "NHD"}, {}),
        ("hnd-block-table-mean", {"kv_layout": "HND"}, {"reduce": "mean"}),
    ]
    not_checked: list[str] = []
    have = target.controls
    if {"indptr", "indices", "last_page_len"} <= have:
        plans.append(("nhd-flashinfer-csr-lse-base2", {"paging": "indptr"}, {"lse": "2"}))
    else:
        not_checked.append("FlashInfer indptr/indices/last_page_len paging: control absent")
    if {"lse", "lse_base"} <= have:
        plans.append(("hnd-block-table-lse-base-e", {"kv_layout": "HND", "page_size": 64}, {"lse": "e"}))
    else:
        not_checked.append("caller-supplied LSE: control absent")
    cases: list[CaseResult] = []
    checks: dict[str, Any] = {}
    for i, (name, build, call) in enumerate(plans):
        case = build_case(lens=lens, device=dev, seed=ctx.seed + i, **build)
        if "lse" in call:
            base = call["lse"]
            call = {**call, "lse": true_lse(case, base), "lse_base": base}
        res, chk = _run_case(target, name, case, tol, **call)
        cases.append(res)
        checks[name] = chk
    details: dict[str, Any] = {"checks": checks, "not_checked": not_checked}
    failed = [n for n, c in checks.items() if not checks_pass(c, rel_tol=max(tol.rtol, 1e-4), mass_tol=1e-3)]
    if {"lse", "lse_base"} <= have:
        case = build_case(lens=lens, device=dev, seed=ctx.seed + 99)
        lse2 = true_lse(case, "2")
        honest = target(case.q, case.kv_cache, **case.kwargs(lse=lse2, lse_base="2"))
        lying = target(case.q, case.kv_cache, **case.kwargs(lse=lse2, lse_base="e"))
        mass_ok = score_checks(honest, honest, case.lens, case.group)["mass_max_dev"]
        mass_bad = score_checks(lying, lying, case.lens, case.group)["mass_max_dev"]
        detected = mass_bad > 1e-2 and mass_ok <= 1e-3
        details["wrong_base"] = {"mass_dev_declared_right": mass_ok, "mass_dev_declared_wrong": mass_bad, "detected_by_mass_check": detected}
        if not detected:
            failed.append("wrong-base LSE not detected by the mass check (the target ignores lse_base?)")
    out = conclude("h2o", target, cases, expected="correct", tol=tol, details=details,
                   evidence=tuple(f"check failed: {f}" for f in failed))
    if failed and out.verdict == "matched":
        out = replace(out, verdict="mismatch", matched=f"correct values, but failed: {', '.join(failed)}")
    return out


PROBES = (
    ProbeSpec(
        name="h2o",
        families=(NAME,),
        run=probe_h2o,
        category="coverage",
        summary="H2O scores: reference agreement, mass = group size, identical top-k at 25/50/75%, exact zeros "
        "past seq_len with NaN-poisoned unused slots, and a mislabeled LSE base caught by the mass check",
    ),
)
