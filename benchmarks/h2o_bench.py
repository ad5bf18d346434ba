# H2O score kernel on the GPU in one run: correctness grid, the h2o probe, and timings against a
# device-to-device copy, FlashInfer 0.2.6 batch decode and the naive torch path, as ratios.
from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# (BLOCK_N, TILES, num_warps, num_stages) tried on the benchmark shape; the best is reported.
TUNE_CONFIGS = (
    (64, 4, 2, 3), (64, 8, 2, 3), (64, 8, 2, 4), (32, 8, 1, 4), (64, 4, 1, 3), (128, 2, 2, 3),
    (128, 4, 4, 4), (32, 16, 2, 4), (64, 16, 4, 4), (128, 4, 2, 3), (64, 4, 4, 3), (64, 2, 2, 2),
)


def bench_ms(fn: Any, *, rep: int = 200) -> dict[str, float]:
    """Median and spread of a GPU callable with CUDA events (triton's do_bench, after its warm-up)."""
    import triton.testing

    q = triton.testing.do_bench(fn, warmup=25, rep=rep, quantiles=[0.5, 0.2, 0.8], return_mode="median")
    med, lo, hi = q if isinstance(q, list | tuple) else (q, q, q)
    return {"median_ms": float(med), "p20_ms": float(lo), "p80_ms": float(hi)}


def device_evidence() -> dict[str, Any]:
    import torch

    from metax_audit.core.subproc import run
    from metax_audit.probes.device import describe

    ev = describe("cuda")
    props = torch.cuda.get_device_properties(0)
    ev.update({"sm_count": props.multi_processor_count, "total_mem_gib": round(props.total_memory / 2**30, 1),
               "l2_mb": round(getattr(props, "L2_cache_size", 0) / 2**20, 1)})
    try:
        smi = run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.draw,temperature.gpu",
                   "--format=csv,noheader"], timeout=20)
        ev["nvidia_smi"] = smi.stdout.strip()
    except Exception as exc:  # evidence is best effort; a missing tool is a recorded fact
        ev["nvidia_smi"] = f"<error: {exc}>"
    return ev


# ---------------------------------------------------------------- correctness grid


def run_grid(
    device: str = "cuda",
    dtypes: tuple[str, ...] = ("bfloat16", "float16", "float8_e4m3fn"),
    head_dims: tuple[int, ...] = (64, 128, 256),
) -> list[dict[str, Any]]:
    """Every dtype x head dim x page size x layout once; page format, LSE source and reduction rotate."""
    import torch

    from metax_audit.probes.h2o import build_case, checks_pass, score_checks, true_lse
    from metax_audit.stages.probing.kernels.h2o import h2o_scores
    from metax_audit.stages.probing.kernels.h2o_reference import h2o_scores_reference

    rows = []
    i = 0
    for dtype in dtypes:
        for head_dim in head_dims:
            for page in (16, 64):
                for layout in ("NHD", "HND"):
                    paging = ("block_table", "indptr")[i % 2]
                    lse_mode = ("none", "2", "e")[i % 3]
                    reduce = ("sum", "mean")[(i // 2) % 2]
                    lens = (1, 0, 700 + 13 * i, 3 * page, 257, 64 * page + 5)
                    ks = None
                    if dtype == "float8_e4m3fn":
                        ks = 0.125 if i % 2 else torch.tensor(0.125, device=device)
                    case = build_case(lens=lens, q_heads=16, kv_heads=4, head_dim=head_dim, page_size=page, dtype=dtype,
                                      kv_layout=layout, paging=paging, device=device, seed=i,
                                      k_scale=None if ks is None else 0.125)
                    case.k_scale = ks
                    call: dict[str, Any] = {"reduce": reduce}
                    if lse_mode != "none":
                        call.update(lse=true_lse(case, lse_mode), lse_base=lse_mode)
                    t0 = time.perf_counter()
                    err = None
                    try:
                        out = h2o_scores(case.q, case.kv_cache, backend="triton", **case.kwargs(**call))
                        if device.startswith("cuda"):
                            torch.cuda.synchronize()
                    except Exception as exc:  # a failing combination is a row, not the end of the run
                        err = f"{type(exc).__name__}: {str(exc)[:300]}"
                    secs = time.perf_counter() - t0
                    row: dict[str, Any] = {"dtype": dtype, "head_dim": head_dim, "page": page, "layout": layout,
                                           "paging": paging, "lse": lse_mode, "reduce": reduce,
                                           "k_scale": None if ks is None else ("tensor" if torch.is_tensor(ks) else "float"),
                                           "first_call_s": round(secs, 2)}
                    if err:
                        row.update(ok=False, error=err)
                    else:
                        ref = h2o_scores_reference(case.q, case.kv_cache, **case.kwargs(**call))
                        chk = score_checks(out, ref, case.lens, case.group, reduce)
                        # ties are a rounding artefact, not a kernel error: they are reported, not failed
                        row.update(checks=chk, ok=checks_pass(chk))
                    rows.append(row)
                    print(f"grid {i:2d} {dtype:14s} d={head_dim:3d} p={page:2d} {layout} {paging:11s} lse={lse_mode:4s} "
                          f"{reduce:4s} ok={row['ok']} rel={row.get('checks', {}).get('rel_err', float('nan')):.2e} "
                          f"mass={row.get('checks', {}).get('mass_max_dev', float('nan')):.1e} {row.get('error', '')}", flush=True)
                    i += 1
    return rows


# ---------------------------------------------------------------- benchmark


def build_bench_cache(*, batch: int, q_heads: int, kv_heads: int, head_dim: int, page: int, seed: int) -> dict[str, Any]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    lens = torch.linspace(1024, 32768, batch).round().to(torch.int64)
    lens = lens[torch.randperm(batch, generator=gen)]
    pages_per = (lens + page - 1) // page
    total = int(pages_per.sum())
    num_pages = total + 64
    perm = torch.randperm(num_pages, generator=gen)[:total].to(torch.int32)
    table = torch.full((batch, int(pages_per.max())), -1, dtype=torch.int32)
    indptr = torch.zeros(batch + 1, dtype=torch.int32)
    off = 0
    for r in range(batch):
        n = int(pages_per[r])
        table[r, :n] = perm[off : off + n]
        off += n
        indptr[r + 1] = off
    last = (lens - (pages_per - 1) * page).to(torch.int32)
    dev = "cuda"
    cache = torch.empty(num_pages, 2, page, kv_heads, head_dim, device=dev, dtype=torch.bfloat16)
    g = torch.Generator(device=dev).manual_seed(seed)
    for start in range(0, num_pages, 4096):  # chunked so the fp32 temporaries stay small
        stop = min(num_pages, start + 4096)
        cache[start:stop] = torch.randn(stop - start, 2, page, kv_heads, head_dim, device=dev, generator=g).to(torch.bfloat16)
    q = torch.randn(batch, q_heads, head_dim, device=dev, generator=g).to(torch.bfloat16)
    return {
        "q": q, "cache": cache, "block_table": table.to(dev), "seq_lens": lens.to(torch.int32).to(dev),
        "indptr": indptr.to(dev), "indices": perm.to(dev), "last_page_len": last.to(dev),
        "lens": [int(x) for x in lens], "max_len": int(lens.max()), "num_pages": num_pages,
    }


def dense_lse2(q: Any, cache: Any, block_table: Any, lens: list[int], scale: float, page: int) -> Any:
    """Base-2 LSE per (request, query head) in fp32 torch, for runs where FlashInfer is missing."""
    import torch

    out = []
    hkv, d = cache.shape[-2], cache.shape[-1]
    group = q.shape[1] // hkv
    for r, n in enumerate(lens):
        k = cache[:, 0][block_table[r, : -(-n // page)].long()].reshape(-1, hkv, d)[:n].float()
        s = torch.einsum("gjd,tgd->gjt", q[r].float().reshape(hkv, group, d), k) * scale
        out.append(torch.logsumexp(s, -1).reshape(-1))
    return torch.stack(out) / math.log(2.0)


def naive_torch(q: Any, cache: Any, block_table: Any, seq_lens: Any, scale: float, max_len: int) -> Any:
    """The straightforward path: gather pages to dense K, matmul, masked softmax, sum over the group."""
    import torch

    b, hq, d = q.shape
    k = cache[:, 0][block_table.clamp_min(0).long()]  # [B, pages, page, Hkv, D]
    k = k.reshape(b, -1, k.shape[-2], d)[:, :max_len].float()  # [B, T, Hkv, D]
    hkv = k.shape[2]
    qg = q.float().reshape(b, hkv, hq // hkv, d)
    logits = torch.einsum("bgjd,btgd->bgjt", qg, k) * scale
    pos = torch.arange(max_len, device=q.device)
    logits = logits.masked_fill((pos[None, :] >= seq_lens[:, None].long())[:, None, None, :], float("-inf"))
    return torch.softmax(logits, dim=-1).sum(dim=2)


def gather_only_ms(c: dict[str, Any], kv_heads: int, head_dim: int, page: int, block_n: int = 64, tiles: int = 4,
                   num_warps: int = 4) -> dict[str, float]:
    """Ceiling of this access pattern: the same paged K gather and grid as the kernel, with the
    dot/exp/sum replaced by a plain row sum. What the kernel loses beyond this is its compute."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def gather(k_ptr, table_ptr, len_ptr, out_ptr, s_kp, s_ks, s_kh, s_tb, n_spans,
               HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr, TILES: tl.constexpr):
        g = tl.program_id(0)
        blk = tl.program_id(1)
        r = tl.program_id(2).to(tl.int64)
        n = tl.load(len_ptr + r)
        base = blk * (BLOCK_N * TILES)
        n_tiles = tl.cdiv(tl.minimum(tl.maximum(n - base, 0), BLOCK_N * TILES), BLOCK_N)
        acc = tl.zeros([BLOCK_N], tl.float32)
        offs_d = tl.arange(0, HEAD_DIM)
        for i in range(0, n_tiles):
            offs_n = base + i * BLOCK_N + tl.arange(0, BLOCK_N)
            valid = offs_n < n
            pg = tl.load(table_ptr + r * s_tb + offs_n // PAGE, mask=valid, other=0).to(tl.int64)
            k_row = tl.multiple_of(pg * s_kp + (offs_n % PAGE) * s_ks + g * s_kh, 8)
            k = tl.load(k_ptr + k_row[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
            acc += tl.sum(k.to(tl.float32), axis=1)
        tl.store(out_ptr + (r * n_spans + blk) * 8 + g, tl.sum(acc, axis=0))

    k = c["cache"][:, 0]
    bt = c["block_table"]
    span = block_n * tiles
    n_spans = triton.cdiv(c["max_len"], span)
    out = torch.empty(bt.shape[0] * n_spans * 8, device="cuda")
    grid = (kv_heads, n_spans, bt.shape[0])

    def go() -> None:
        gather[grid](k, bt, c["seq_lens"], out, k.stride(0), k.stride(1), k.stride(2), bt.stride(0), n_spans,
                     HEAD_DIM=head_dim, PAGE=page, BLOCK_N=block_n, TILES=tiles, num_warps=num_warps, num_stages=3)

    return {**bench_ms(go), "launch": {"BLOCK_N": block_n, "TILES": tiles, "num_warps": num_warps}}


def measure_ceilings(n_bytes: int = 2 * 2**30) -> dict[str, Any]:
    """The two memory ceilings of this card, in this run: a copy (read+write) and a bf16 read reduction."""
    import torch

    src = torch.randn(n_bytes // 2, device="cuda").to(torch.bfloat16)
    dst = torch.empty_like(src)
    t = bench_ms(lambda: dst.copy_(src))
    res = {"copy": {**t, "bytes_moved": 2 * n_bytes, "tb_s": 2 * n_bytes / (t["median_ms"] * 1e-3) / 1e12}}
    t = bench_ms(lambda: src.sum(dtype=torch.float32))
    res["read_reduce"] = {**t, "bytes_read": n_bytes, "tb_s": n_bytes / (t["median_ms"] * 1e-3) / 1e12}
    return res


def run_bench(tune: bool) -> dict[str, Any]:
    import torch

    from metax_audit.stages.probing.kernels.h2o import block_scores, h2o_scores
    from metax_audit.stages.probing.kernels.h2o_reference import h2o_scores_reference

    res: dict[str, Any] = measure_ceilings()
    torch.cuda.empty_cache()

    shape = {"batch": 32, "q_heads": 32, "kv_heads": 8, "head_dim": 128, "page": 16}
    c = build_bench_cache(**shape, seed=0)
    scale = 1.0 / math.sqrt(shape["head_dim"])
    tokens = sum(c["lens"])
    k_bytes = tokens * shape["kv_heads"] * shape["head_dim"] * 2
    res["shape"] = {**shape, "dtype": "bfloat16", "lens_min": min(c["lens"]), "lens_max": max(c["lens"]), "tokens": tokens,
                    "k_bytes": k_bytes, "kv_bytes": 2 * k_bytes, "lens": c["lens"]}
    paging = {"block_table": c["block_table"], "seq_lens": c["seq_lens"]}

    # FlashInfer 0.2.6 batch decode on the same cache (reads K and V); its base-2 LSE feeds h2o
    fi_lse = None
    try:
        import flashinfer

        ws = torch.empty(128 * 2**20, dtype=torch.uint8, device="cuda")
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, kv_layout="NHD")
        w.plan(c["indptr"], c["indices"], c["last_page_len"], shape["q_heads"], shape["kv_heads"], shape["head_dim"],
               shape["page"], q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16, sm_scale=scale)
        t0 = time.perf_counter()
        _, fi_lse = w.run(c["q"], c["cache"], return_lse=True)
        torch.cuda.synchronize()
        res["flashinfer_first_call_s"] = round(time.perf_counter() - t0, 1)
        t = bench_ms(lambda: w.run(c["q"], c["cache"], return_lse=True))
        res["flashinfer_decode"] = {**t, "version": flashinfer.__version__, "use_tensor_cores": False,
                                    "kv_bytes_tb_s": 2 * k_bytes / (t["median_ms"] * 1e-3) / 1e12}
    except Exception as exc:
        res["flashinfer_decode"] = {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
        print("flashinfer failed:", res["flashinfer_decode"]["error"], flush=True)

    # correctness on the benchmark shape: own LSE vs the dense reference, FlashInfer's LSE vs it
    ref = h2o_scores_reference(c["q"], c["cache"], **paging, scale=scale)
    own = h2o_scores(c["q"], c["cache"], **paging, scale=scale, max_seq_len=c["max_len"])
    from metax_audit.probes.h2o import score_checks

    res["check_own_lse"] = score_checks(own, ref, c["lens"], 4)
    lse_src = "flashinfer (base 2)"
    if fi_lse is None:
        lse_src = "dense torch logsumexp (FlashInfer unavailable)"
        fi_lse = dense_lse2(c["q"], c["cache"], c["block_table"], c["lens"], scale, shape["page"])
    with_lse = {"lse": fi_lse, "lse_base": "2"}
    got = h2o_scores(c["q"], c["cache"], **paging, scale=scale, max_seq_len=c["max_len"], **with_lse)
    res["check_given_lse"] = {**score_checks(got, ref, c["lens"], 4), "lse_source": lse_src}
    del ref, own, got

    for bn, tiles, nw in ((64, 4, 4), (64, 8, 2), (128, 4, 4)):
        try:
            gt = gather_only_ms(c, shape["kv_heads"], shape["head_dim"], shape["page"], bn, tiles, nw)
            gt["k_tb_s"] = k_bytes / (gt["median_ms"] * 1e-3) / 1e12
        except Exception as exc:
            gt = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        res.setdefault("gather_only", []).append(gt)
        print("gather-only", gt, flush=True)
    configs = TUNE_CONFIGS if tune else TUNE_CONFIGS[:1]
    tuned = []
    for bn, tiles, nw, ns in configs:
        launch = {"BLOCK_N": bn, "TILES": tiles, "num_warps": nw, "num_stages": ns}
        try:
            t = bench_ms(lambda launch=launch: h2o_scores(c["q"], c["cache"], **paging, scale=scale, max_seq_len=c["max_len"],
                                                          launch=launch, **with_lse), rep=100)
            tuned.append({"launch": launch, **t, "k_tb_s": k_bytes / (t["median_ms"] * 1e-3) / 1e12})
        except Exception as exc:
            tuned.append({"launch": launch, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
        print("tune", tuned[-1], flush=True)
    res["tuning"] = tuned
    best = min((x for x in tuned if "median_ms" in x), key=lambda x: x["median_ms"])
    res["best_tuned"] = best
    # the headline is the shipped default launch, not the best of this run's tuning (no cherry-picking)
    from metax_audit.stages.probing.kernels.h2o import DEFAULT_LAUNCH

    launch = dict(DEFAULT_LAUNCH[shape["head_dim"]])
    res["h2o_lse_given"] = bench_ms(lambda: h2o_scores(c["q"], c["cache"], **paging, scale=scale, max_seq_len=c["max_len"],
                                                       launch=launch, **with_lse), rep=300)
    res["h2o_lse_given"]["launch"] = launch
    res["h2o_lse_given_repeat"] = bench_ms(lambda: h2o_scores(c["q"], c["cache"], **paging, scale=scale,
                                                              max_seq_len=c["max_len"], launch=launch, **with_lse), rep=300)
    res["h2o_lse_given_csr"] = bench_ms(lambda: h2o_scores(
        c["q"], c["cache"], indptr=c["indptr"], indices=c["indices"], last_page_len=c["last_page_len"], scale=scale,
        max_seq_len=c["max_len"], launch=launch, **with_lse))
    res["h2o_own_lse"] = bench_ms(lambda: h2o_scores(c["q"], c["cache"], **paging, scale=scale, max_seq_len=c["max_len"], launch=launch))
    res["block_scores_lse_given"] = bench_ms(lambda: block_scores(c["q"], c["cache"], **paging, scale=scale,
                                                                  max_seq_len=c["max_len"], launch=launch, **with_lse))
    try:
        res["naive_torch"] = bench_ms(lambda: naive_torch(c["q"], c["cache"], c["block_table"], c["seq_lens"], scale, c["max_len"]), rep=300)
    except Exception as exc:
        res["naive_torch"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}

    t_h2o = res["h2o_lse_given"]["median_ms"]
    k_bw = k_bytes / (t_h2o * 1e-3) / 1e12
    summary: dict[str, Any] = {
        "h2o_ms": t_h2o,
        "k_bandwidth_tb_s": k_bw,
        "fraction_of_copy_bw": k_bw / res["copy"]["tb_s"],
        "fraction_of_read_bw": k_bw / res["read_reduce"]["tb_s"],
        "h2o_own_lse_ms": res["h2o_own_lse"]["median_ms"],
    }
    if "median_ms" in res.get("flashinfer_decode", {}):
        summary["ratio_to_flashinfer_decode"] = t_h2o / res["flashinfer_decode"]["median_ms"]
        summary["own_lse_ratio_to_flashinfer_decode"] = res["h2o_own_lse"]["median_ms"] / res["flashinfer_decode"]["median_ms"]
    if "median_ms" in res.get("naive_torch", {}):
        summary["speedup_vs_naive_torch"] = res["naive_torch"]["median_ms"] / t_h2o
    summary["targets"] = {
        "copy_bw_ge_85pct": summary["fraction_of_copy_bw"] >= 0.85,
        "flashinfer_ratio_le_0_55": summary.get("ratio_to_flashinfer_decode", math.inf) <= 0.55,
        "naive_speedup_ge_40x": summary.get("speedup_vs_naive_torch", 0.0) >= 40,
    }
    res["summary"] = summary
    return res


def render_md(doc: dict[str, Any]) -> str:
    lines = ["# H2O score kernel on the device", "", f"Generated by `benchmarks/h2o_bench.py` at {doc['generated_at']}.", ""]
    ev = doc.get("device", {})
    lines += ["## Device", "", *[f"- {k}: {v}" for k, v in ev.items()], ""]
    b = doc.get("bench")
    if b:
        s = b["summary"]
        sh = b["shape"]
        lines += [
            "## Benchmark", "",
            f"Batch {sh['batch']}, context {sh['lens_min']}..{sh['lens_max']} (mixed, {sh['tokens']} tokens), "
            f"{sh['q_heads']} q heads, {sh['kv_heads']} KV heads, head dim {sh['head_dim']}, bf16, page {sh['page']}; "
            f"K read: {sh['k_bytes'] / 1e9:.3f} GB. Medians of CUDA-event timings (triton do_bench) after warm-up.", "",
            "| measurement | median ms | figure |", "|---|---|---|",
            f"| device-to-device copy (2 GiB, read+write) | {b['copy']['median_ms']:.3f} | {b['copy']['tb_s']:.2f} TB/s |",
            f"| bf16 read reduction (2 GiB) | {b['read_reduce']['median_ms']:.3f} | {b['read_reduce']['tb_s']:.2f} TB/s |",
            f"| h2o_scores, LSE given (block table; default launch {b['h2o_lse_given']['launch']}) | {s['h2o_ms']:.3f} | K at {s['k_bandwidth_tb_s']:.2f} TB/s = "
            f"{100 * s['fraction_of_copy_bw']:.1f}% of copy, {100 * s['fraction_of_read_bw']:.1f}% of read |",
            f"| same, timed again (spread check) | {b['h2o_lse_given_repeat']['median_ms']:.3f} | |",
            *[f"| gather-only diagnostic {x['launch']} (same K reads, no math) | {x['median_ms']:.3f} | K at {x['k_tb_s']:.2f} TB/s |"
              for x in b.get("gather_only", []) if "median_ms" in x],
            f"| h2o_scores, LSE given (FlashInfer CSR) | {b['h2o_lse_given_csr']['median_ms']:.3f} | |",
            f"| h2o_scores, own LSE (one K pass + logits) | {b['h2o_own_lse']['median_ms']:.3f} | |",
            f"| block_scores, LSE given (page sums stored by the kernel) | {b['block_scores_lse_given']['median_ms']:.3f} | |",
        ]
        fi = b.get("flashinfer_decode", {})
        if "median_ms" in fi:
            lines.append(f"| FlashInfer {fi['version']} batch decode (K+V) | {fi['median_ms']:.3f} | KV at {fi['kv_bytes_tb_s']:.2f} TB/s; "
                         f"h2o/decode = {s['ratio_to_flashinfer_decode']:.3f} |")
        else:
            lines.append(f"| FlashInfer batch decode | - | {fi.get('error', 'not run')} |")
        nt = b.get("naive_torch", {})
        if "median_ms" in nt:
            lines.append(f"| naive torch (gather, matmul, softmax, sum) | {nt['median_ms']:.3f} | h2o is {s['speedup_vs_naive_torch']:.0f}x faster |")
        lines += ["", "Targets: " + ", ".join(f"{k}: {'met' if v else 'MISSED'}" for k, v in s["targets"].items()), ""]
        lines += ["Correctness on this shape: own LSE rel err "
                  f"{b['check_own_lse']['rel_err']:.2e}, mass dev {b['check_own_lse']['mass_max_dev']:.1e}; LSE from "
                  f"{b['check_given_lse']['lse_source']}: rel err {b['check_given_lse']['rel_err']:.2e}, mass dev "
                  f"{b['check_given_lse']['mass_max_dev']:.1e}.", ""]
        lines += ["### Launch configurations tried (LSE given)", "", "| BLOCK_N | TILES | warps | stages | median ms | K TB/s |", "|---|---|---|---|---|---|"]
        for x in b["tuning"]:
            la = x["launch"]
            fig = f"{x['median_ms']:.3f} | {x['k_tb_s']:.2f}" if "median_ms" in x else f"error | {x.get('error', '')}"
            lines.append(f"| {la['BLOCK_N']} | {la['TILES']} | {la['num_warps']} | {la['num_stages']} | {fig} |")
        lines.append("")
    g = doc.get("grid")
    if g:
        ok = sum(1 for r in g if r["ok"])
        lines += ["## Correctness grid (Triton kernel vs dense fp32 reference)", "",
                  f"{ok}/{len(g)} combinations pass (rel err <= 1e-4, mass within 1e-3, identical top-k at 25/50/75% "
                  "except near-ties, exact zeros past seq_len, NaN-poisoned unused slots never read).", "",
                  "| dtype | d | page | layout | paging | lse | reduce | rel err | mass dev | top-k differ (near-ties) | ok |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in g:
            c = r.get("checks")
            if c:
                tk = ", ".join(f"{v['differ']}({v['near_ties']})" for v in c["topk"].values())
                lines.append(f"| {r['dtype']} | {r['head_dim']} | {r['page']} | {r['layout']} | {r['paging']} | {r['lse']} | {r['reduce']} | "
                             f"{c['rel_err']:.1e} | {c['mass_max_dev']:.1e} | {tk} | {r['ok']} |")
            else:
                lines.append(f"| {r['dtype']} | {r['head_dim']} | {r['page']} | {r['layout']} | {r['paging']} | {r['lse']} | {r['reduce']} | "
                             f"- | - | - | {r.get('error', '')} |")
        lines.append("")
    p = doc.get("probe")
    if p:
        lines += ["## h2o probe (metax-audit target, CUDA)", "", f"verdict: **{p['verdict']}**, matched: {p['matched']}; "
                  f"wrong-base detection: {p.get('details', {}).get('wrong_base')}", ""]
    return "\n".join(lines)


def run_probe() -> dict[str, Any]:
    from metax_audit.probes.base import ProbeContext
    from metax_audit.probes.runner import run_one

    res = run_one("h2o", "h2o-scores", "metax-audit", ProbeContext(device="cuda")).to_json()
    print("probe", res["verdict"], res["matched"], res.get("skipped_reason"), flush=True)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=str(ROOT / "reports" / "h2o"))
    ap.add_argument("--grid", action="store_true", help="run the correctness grid")
    ap.add_argument("--probe", action="store_true", help="run the h2o probe on the metax-audit target")
    ap.add_argument("--bench", action="store_true", help="run the benchmark")
    ap.add_argument("--tune", action="store_true", help="try every launch configuration in TUNE_CONFIGS")
    ap.add_argument("--render", metavar="JSON", help="only rewrite the Markdown next to an existing result JSON (no GPU)")
    args = ap.parse_args(argv)
    if args.render:
        src = Path(args.render)
        src.with_suffix(".md").write_text(render_md(json.loads(src.read_text())))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to benchmark", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"schema": "metax-audit/h2o-bench/v1", "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                           "device": device_evidence()}
    t0 = time.perf_counter()
    sections = [("grid", args.grid, run_grid), ("probe", args.probe, run_probe), ("bench", args.bench, lambda: run_bench(args.tune))]
    for name, wanted, fn in sections:
        if not wanted:
            continue
        try:
            doc[name] = fn()
        except Exception:  # one broken section must not lose the others' numbers
            doc[f"{name}_error"] = traceback.format_exc()[-3000:]
            print(f"section {name} failed:\n{doc[f'{name}_error']}", flush=True)
        (out / "h2o_bench.json").write_text(json.dumps(doc, indent=1, default=str))
    doc["wall_s"] = round(time.perf_counter() - t0, 1)
    (out / "h2o_bench.json").write_text(json.dumps(doc, indent=1, default=str))
    (out / "h2o_bench.md").write_text(render_md(doc))
    if "bench" in doc:
        print(json.dumps(doc["bench"]["summary"], indent=1))
    if "grid" in doc:
        print("grid ok:", sum(r["ok"] for r in doc["grid"]), "/", len(doc["grid"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
