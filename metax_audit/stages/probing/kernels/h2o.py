# H2O attention-mass scores read straight from a paged KV cache: the public API, its argument
# checks, and the Triton kernels (built on first use, so importing this module needs no torch/triton).
from __future__ import annotations

import functools
import math
from typing import Any

from metax_audit.stages.probing.kernels.h2o_reference import (
    REDUCTIONS,
    block_scores_from_token_scores,
    h2o_scores_reference,
    key_cache_view,
    lse_to_base2,
    resolve_paging,
)

LOG2E = 1.0 / math.log(2.0)

# Per head-dim launch defaults (positions per tile, tiles per program, warps, pipeline stages).
# d=128 is the best of benchmarks/h2o_bench.py --tune on the H200 (reports/h2o/); 64 and 256 keep
# the same program shape (two warps, eight tiles) and a similar tile size in bytes, untuned.
DEFAULT_LAUNCH: dict[int, dict[str, int]] = {
    64: {"BLOCK_N": 64, "TILES": 8, "num_warps": 2, "num_stages": 3},
    128: {"BLOCK_N": 64, "TILES": 8, "num_warps": 2, "num_stages": 3},
    256: {"BLOCK_N": 32, "TILES": 8, "num_warps": 2, "num_stages": 3},
}


def triton_available() -> bool:
    """True when the Triton path can run: triton imports and a CUDA (or ROCm/MACA-as-CUDA) device exists."""
    try:
        import torch
        import triton  # noqa: F401
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@functools.cache
def _kernels() -> Any:
    """Define the Triton kernels once; closures keep `triton` out of this module's import."""
    import triton
    import triton.language as tl

    @triton.jit
    def h2o_pass(
        q_ptr, qlo_ptr, k_ptr, table_ptr, row_ptr, len_ptr, lse_ptr, ks_ptr, out_ptr, part_ptr,
        qk_scale, lse_mul, out_mul, width,
        s_qb, s_qh, s_kp, s_ks, s_kh, s_tb, s_lb, s_lh, s_ob, s_oh, s_pb, s_ph,
        GROUP: tl.constexpr, BLOCK_H: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
        BLOCK_N: tl.constexpr, TILES: tl.constexpr, INDPTR: tl.constexpr, LOGITS: tl.constexpr,
        TWO_TERM: tl.constexpr, KS_PTR: tl.constexpr, DOT_DT: tl.constexpr, BLOCKS: tl.constexpr,
    ):
        # One program per (kv head, span of BLOCK_N*TILES positions, request); the kv head varies
        # fastest so neighbouring programs read neighbouring bytes of the same cache pages.
        # BLOCKS: store per-page sums (width counts pages; needs BLOCK_N % PAGE == 0).
        g = tl.program_id(0)
        blk = tl.program_id(1)
        r = tl.program_id(2).to(tl.int64)
        n = tl.load(len_ptr + r)
        offs_h = tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, HEAD_DIM)
        hmask = offs_h < GROUP
        heads = g * GROUP + offs_h
        q_off = r * s_qb + heads[:, None] * s_qh + offs_d[None, :]
        q = tl.load(q_ptr + q_off, mask=hmask[:, None], other=0.0).to(DOT_DT)
        if TWO_TERM:
            qlo = tl.load(qlo_ptr + q_off, mask=hmask[:, None], other=0.0).to(DOT_DT)
        c = qk_scale
        if KS_PTR:
            c = c * tl.load(ks_ptr).to(tl.float32)
        if INDPTR:  # noqa: SIM108 (a constexpr branch; Triton specialises it away)
            row = tl.load(row_ptr + r).to(tl.int64)
        else:
            row = r * s_tb
        if LOGITS:
            m_i = tl.full([BLOCK_H], -1.0e30, tl.float32)
            l_i = tl.zeros([BLOCK_H], tl.float32)
        else:
            lse2 = tl.load(lse_ptr + r * s_lb + heads * s_lh, mask=hmask, other=0.0) * lse_mul
        base = blk * (BLOCK_N * TILES)
        # Only tiles holding live positions touch K: spans past the sequence (about half the grid
        # for mixed lengths) cost a few zero stores instead of a full masked pass.
        n_tiles = tl.cdiv(tl.minimum(tl.maximum(n - base, 0), BLOCK_N * TILES), BLOCK_N)
        if BLOCKS:
            for i in tl.static_range(TILES):
                offs_zb = (base + i * BLOCK_N) // PAGE + tl.arange(0, BLOCK_N // PAGE)
                zero_b = tl.zeros([BLOCK_N // PAGE], tl.float32)
                tl.store(out_ptr + r * s_ob + g * s_oh + offs_zb, zero_b, mask=(offs_zb * PAGE >= n) & (offs_zb < width))
        elif not LOGITS:
            for i in tl.static_range(TILES):
                offs_z = base + i * BLOCK_N + tl.arange(0, BLOCK_N)
                zero = tl.zeros([BLOCK_N], tl.float32)
                tl.store(out_ptr + r * s_ob + g * s_oh + offs_z, zero, mask=(offs_z >= n) & (offs_z < width))
        for i in range(0, n_tiles):
            offs_n = base + i * BLOCK_N + tl.arange(0, BLOCK_N)
            valid = offs_n < n
            # Slots past the sequence (and pages past the last one) are never read: NaN in an
            # unused slot or garbage in an unused table entry cannot leak into a score.
            page = tl.load(table_ptr + row + offs_n // PAGE, mask=valid, other=0).to(tl.int64)
            k_row = page * s_kp + (offs_n % PAGE) * s_ks + g * s_kh
            k_row = tl.multiple_of(k_row, 8)
            k = tl.load(k_ptr + k_row[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0).to(DOT_DT)
            s = tl.dot(q, tl.trans(k))
            if TWO_TERM:
                s += tl.dot(qlo, tl.trans(k))
            s = s * c
            if LOGITS:
                x_off = r * s_ob + heads[:, None] * s_oh + offs_n[None, :]
                tl.store(out_ptr + x_off, s, mask=hmask[:, None] & valid[None, :])
                s_m = tl.where(valid[None, :], s, -1.0e30)
                m_new = tl.maximum(m_i, tl.max(s_m, axis=1))
                e = tl.where(valid[None, :], tl.exp2(s_m - m_new[:, None]), 0.0)
                l_i = l_i * tl.exp2(m_i - m_new) + tl.sum(e, axis=1)
                m_i = m_new
            else:
                p = tl.where(hmask[:, None] & valid[None, :], tl.exp2(s - lse2[:, None]), 0.0)
                tok = tl.sum(p, axis=0) * out_mul
                if BLOCKS:
                    offs_b = (base + i * BLOCK_N) // PAGE + tl.arange(0, BLOCK_N // PAGE)
                    bsum = tl.sum(tl.reshape(tok, [BLOCK_N // PAGE, PAGE]), axis=1)
                    tl.store(out_ptr + r * s_ob + g * s_oh + offs_b, bsum, mask=(offs_b * PAGE < n) & (offs_b < width))
                else:
                    tl.store(out_ptr + r * s_ob + g * s_oh + offs_n, tok, mask=valid & (offs_n < width))
        if LOGITS:
            p_off = r * s_pb + heads * s_ph + blk * 2
            tl.store(part_ptr + p_off, m_i, mask=hmask)
            tl.store(part_ptr + p_off + 1, l_i, mask=hmask)

    @triton.jit
    def lse_reduce(part_ptr, lse_ptr, nblk, q_heads, s_pb, s_ph, NB: tl.constexpr):
        # Merge the per-span (max, sum) partials of one (request, query head) into a log2 LSE;
        # NB is the span count rounded up to a power of two (4096 spans cover 1M tokens).
        h = tl.program_id(0)
        r = tl.program_id(1).to(tl.int64)
        base = part_ptr + r * s_pb + h * s_ph
        offs = tl.arange(0, NB)
        msk = offs < nblk
        m = tl.load(base + offs * 2, mask=msk, other=-1.0e30)
        ll = tl.load(base + offs * 2 + 1, mask=msk, other=0.0)
        mx = tl.max(m, axis=0)
        total = tl.sum(ll * tl.exp2(m - mx), axis=0)
        tl.store(lse_ptr + r * q_heads + h, mx + tl.log2(total))

    @triton.jit
    def scores_from_logits(
        x_ptr, lse_ptr, len_ptr, out_ptr, out_mul, width, q_heads, s_xb, s_xh, s_ob, s_oh,
        GROUP: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, PAGE: tl.constexpr, BLOCKS: tl.constexpr,
    ):
        g = tl.program_id(0)
        blk = tl.program_id(1)
        r = tl.program_id(2).to(tl.int64)
        n = tl.load(len_ptr + r)
        offs_h = tl.arange(0, BLOCK_H)
        hmask = offs_h < GROUP
        heads = g * GROUP + offs_h
        offs_n = blk * BLOCK_N + tl.arange(0, BLOCK_N)
        valid = offs_n < n
        lse2 = tl.load(lse_ptr + r * q_heads + heads, mask=hmask, other=0.0)
        msk = hmask[:, None] & valid[None, :]
        x = tl.load(x_ptr + r * s_xb + heads[:, None] * s_xh + offs_n[None, :], mask=msk, other=0.0)
        p = tl.where(msk, tl.exp2(x - lse2[:, None]), 0.0)
        tok = tl.sum(p, axis=0) * out_mul
        if BLOCKS:
            offs_b = blk * (BLOCK_N // PAGE) + tl.arange(0, BLOCK_N // PAGE)
            bsum = tl.sum(tl.reshape(tok, [BLOCK_N // PAGE, PAGE]), axis=1)
            tl.store(out_ptr + r * s_ob + g * s_oh + offs_b, bsum, mask=offs_b < width)
        else:
            tl.store(out_ptr + r * s_ob + g * s_oh + offs_n, tok, mask=offs_n < width)

    return type("H2OKernels", (), {"h2o_pass": h2o_pass, "lse_reduce": lse_reduce, "scores_from_logits": scores_from_logits})


def _dot_dtypes(q: Any, k: Any) -> tuple[Any, Any, bool]:
    """(torch dtype for the dot, triton dtype, two_term): keys are never rounded; q is split hi+lo
    when its dtype differs, so the dot keeps about 16 mantissa bits of q in fp32 accumulation."""
    import torch
    import triton.language as tl

    to_tl = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}
    if k.dtype in to_tl:
        dt = k.dtype
    elif k.dtype == getattr(torch, "float8_e4m3fn", None):
        dt = q.dtype if q.dtype in to_tl else torch.bfloat16
    else:
        raise ValueError(f"unsupported KV cache dtype {k.dtype}: bf16, fp16 or float8_e4m3fn")
    return dt, to_tl[dt], q.dtype != dt


def _triton_scores(
    q: Any, k: Any, paging: Any, *, width: int, scale: float, lse2: Any, group_mean: bool, k_scale: Any,
    launch: dict[str, int] | None, blocks: bool = False,
) -> Any:
    """Launch the kernels; `blocks` makes them store per-page sums instead of per-position scores."""
    import torch
    import triton

    kern = _kernels()
    batch, q_heads, head_dim = (int(x) for x in q.shape)
    page_size, kv_heads = int(k.shape[1]), int(k.shape[2])
    group = q_heads // kv_heads
    if head_dim & (head_dim - 1) or head_dim < 16:
        raise ValueError(f"head_dim must be a power of two >= 16 for the Triton path, got {head_dim}")
    if k.stride(3) != 1:
        raise ValueError("the K cache's head_dim axis must be contiguous (stride 1)")
    cfg = dict(DEFAULT_LAUNCH.get(head_dim, DEFAULT_LAUNCH[128]))
    cfg.update(launch or {})
    block_n, tiles = cfg.pop("BLOCK_N"), cfg.pop("TILES")
    if blocks:
        block_n = max(block_n, page_size)  # a tile must hold whole pages to sum them
    dev = q.device
    dot_dt, tl_dt, two_term = _dot_dtypes(q, k)
    q = q.contiguous() if q.stride(2) != 1 else q
    q_hi = q.to(dot_dt)
    q_lo = (q.to(torch.float32) - q_hi.to(torch.float32)).to(dot_dt) if two_term else q_hi
    table = paging.table if paging.table.stride(-1) == 1 else paging.table.contiguous()
    indptr_mode = paging.row_start is not None
    row_start = paging.row_start.contiguous() if indptr_mode else paging.seq_lens
    lens = paging.seq_lens.to(device=dev, dtype=torch.int32).contiguous()
    qk_scale = float(scale) * LOG2E
    ks_ptr = torch.empty(1, device=dev, dtype=torch.float32)
    ks_is_ptr = isinstance(k_scale, torch.Tensor)
    if ks_is_ptr:
        ks_ptr = k_scale.to(device=dev, dtype=torch.float32).reshape(-1)[:1]
    elif k_scale is not None:
        qk_scale *= float(k_scale)
    out_width = triton.cdiv(width, page_size) if blocks else width
    out = torch.empty(batch, kv_heads, out_width, device=dev, dtype=torch.float32)
    out_mul = 1.0 / group if group_mean else 1.0
    span = block_n * tiles
    n_spans = max(1, triton.cdiv(width, span))
    grid = (kv_heads, n_spans, batch)
    block_h = max(16, triton.next_power_of_2(group))
    t_stride = 0 if indptr_mode else table.stride(0)
    common = {
        "GROUP": group, "BLOCK_H": block_h, "HEAD_DIM": head_dim, "PAGE": page_size, "BLOCK_N": block_n,
        "TILES": tiles, "INDPTR": indptr_mode, "TWO_TERM": two_term, "KS_PTR": ks_is_ptr, "DOT_DT": tl_dt,
    }
    if width == 0:
        return out
    if lse2 is not None:
        lse2 = lse2.to(device=dev, dtype=torch.float32)
        kern.h2o_pass[grid](
            q_hi, q_lo, k, table, row_start, lens, lse2, ks_ptr, out, out,
            qk_scale, 1.0, out_mul, out_width,
            q_hi.stride(0), q_hi.stride(1), k.stride(0), k.stride(1), k.stride(2), t_stride,
            lse2.stride(0), lse2.stride(1), out.stride(0), out.stride(1), 0, 0,
            LOGITS=False, BLOCKS=blocks, **common, **cfg,
        )
        return out
    # No LSE: one pass over K writes base-2 logits and per-span (max, sum) partials; a tiny
    # reduction makes the LSE; a last pass turns logits into scores. K is read once.
    logits = torch.empty(batch, q_heads, width, device=dev, dtype=torch.float32)
    parts = torch.empty(batch, q_heads, n_spans, 2, device=dev, dtype=torch.float32)
    kern.h2o_pass[grid](
        q_hi, q_lo, k, table, row_start, lens, lens, ks_ptr, logits, parts,
        qk_scale, 1.0, out_mul, width,
        q_hi.stride(0), q_hi.stride(1), k.stride(0), k.stride(1), k.stride(2), t_stride,
        0, 0, logits.stride(0), logits.stride(1), parts.stride(0), parts.stride(1),
        LOGITS=True, BLOCKS=False, **common, **cfg,
    )
    lse_out = torch.empty(batch, q_heads, device=dev, dtype=torch.float32)
    kern.lse_reduce[(q_heads, batch)](parts, lse_out, n_spans, q_heads, parts.stride(0), parts.stride(1), NB=triton.next_power_of_2(n_spans))
    blk2 = 256
    kern.scores_from_logits[(kv_heads, triton.cdiv(width, blk2), batch)](
        logits, lse_out, lens, out, out_mul, out_width, q_heads, logits.stride(0), logits.stride(1),
        out.stride(0), out.stride(1), GROUP=group, BLOCK_H=block_h, BLOCK_N=blk2, PAGE=page_size, BLOCKS=blocks,
    )
    return out


def h2o_scores(
    q: Any,
    kv_cache: Any,
    *,
    block_table: Any = None,
    seq_lens: Any = None,
    scale: float,
    kv_layout: str = "NHD",
    lse: Any = None,
    lse_base: str | None = None,
    reduce: str = "sum",
    k_scale: Any = None,
    indptr: Any = None,
    indices: Any = None,
    last_page_len: Any = None,
    max_seq_len: int | None = None,
    backend: str = "auto",
    launch: dict[str, int] | None = None,
) -> Any:
    """Attention mass each cached position receives at this decode step: float32 `[batch, kv_heads, max_seq_len]`.

    `score[r, g, t] = Σ_{h in group g} softmax_t(q[r, h] · k[r, t, g] · scale)`, accumulated in fp32;
    positions at or past the request's length are exactly 0; `reduce="mean"` divides by the group size.
    Per (request, kv head) the scores sum to the group size (1 with "mean").

    q: `[batch, q_heads, head_dim]`. kv_cache: `[num_pages, 2, page, kv_heads, d]` (NHD; HND swaps
    page and kv_heads), `[2, num_pages, ...]`, a `(k, v)` pair or a K cache alone; bf16, fp16 or
    float8_e4m3fn with `k_scale` (float or one-element tensor). Paging: vLLM `block_table`
    `[batch, max_pages]` + `seq_lens`, or FlashInfer `indptr`/`indices`/`last_page_len`.
    lse: `[batch, q_heads]` from the attention kernel; `lse_base` ("e" or "2"; FlashInfer's is 2)
    is then required. With it K is read once and V never; without it the LSE is computed from the
    same single pass over K (logits are kept, 4 bytes per query head and position).
    max_seq_len: output width (default: the longest sequence; passing it avoids a device sync).
    backend: "auto" (Triton on a CUDA device, else the torch reference), "triton" or "torch".
    launch: Triton tuning override (BLOCK_N, TILES, num_warps, num_stages).
    """
    if reduce not in REDUCTIONS:
        raise ValueError(f"reduce must be 'sum' or 'mean', got {reduce!r}")
    if backend not in ("auto", "triton", "torch"):
        raise ValueError(f"backend must be 'auto', 'triton' or 'torch', got {backend!r}")
    if lse is not None and lse_base is None:
        raise ValueError("lse given without lse_base: declare 'e' (FlashAttention) or '2' (FlashInfer)")
    use_triton = backend == "triton" or (backend == "auto" and q.is_cuda and triton_available())
    if not use_triton:
        return h2o_scores_reference(
            q, kv_cache, block_table=block_table, seq_lens=seq_lens, scale=scale, kv_layout=kv_layout, lse=lse,
            lse_base=lse_base, reduce=reduce, k_scale=k_scale, indptr=indptr, indices=indices,
            last_page_len=last_page_len, max_seq_len=max_seq_len,
        )
    return _run_triton(
        q, kv_cache, block_table=block_table, seq_lens=seq_lens, scale=scale, kv_layout=kv_layout, lse=lse,
        lse_base=lse_base, reduce=reduce, k_scale=k_scale, indptr=indptr, indices=indices,
        last_page_len=last_page_len, max_seq_len=max_seq_len, launch=launch, blocks=False,
    )


def _run_triton(q: Any, kv_cache: Any, *, kv_layout: str, lse: Any, lse_base: str | None, reduce: str, scale: float,
                k_scale: Any, max_seq_len: int | None, launch: dict[str, int] | None, blocks: bool, **paging_kw: Any) -> Any:
    k = key_cache_view(kv_cache, kv_layout)
    paging = resolve_paging(int(k.shape[1]), **paging_kw)
    if q.dim() != 3 or q.shape[2] != k.shape[3] or q.shape[1] % k.shape[2] or q.shape[0] != paging.batch:
        raise ValueError(f"q {tuple(q.shape)} does not fit the cache's K {tuple(k.shape)} and batch {paging.batch}")
    longest = int(paging.seq_lens.max()) if max_seq_len is None and paging.batch else 0
    width = int(max_seq_len) if max_seq_len is not None else longest
    lse2 = None if lse is None else lse_to_base2(lse, lse_base)
    return _triton_scores(
        q, k, paging, width=width, scale=scale, lse2=lse2, group_mean=reduce == "mean", k_scale=k_scale, launch=launch,
        blocks=blocks,
    )


def block_scores(q: Any, kv_cache: Any, **kwargs: Any) -> Any:
    """`h2o_scores` summed per cache block: float32 `[batch, kv_heads, ceil(max_seq_len / page)]`.

    Block j of request r is the request's j-th page (`block_table[r, j]`, or
    `indices[indptr[r] + j]`); blocks past the request's last page are 0. Takes h2o_scores' keywords.
    On the Triton path with a power-of-two page of at most 256 slots the kernel stores the page
    sums directly (per-position scores never reach memory).
    """
    page = int(key_cache_view(kv_cache, kwargs.get("kv_layout", "NHD")).shape[1])
    backend = kwargs.get("backend", "auto")
    fused = page & (page - 1) == 0 and page <= 256 and backend != "torch"
    if fused and (backend == "triton" or (q.is_cuda and triton_available())):
        if kwargs.get("reduce", "sum") not in REDUCTIONS:
            raise ValueError(f"reduce must be 'sum' or 'mean', got {kwargs.get('reduce')!r}")
        if kwargs.get("lse") is not None and kwargs.get("lse_base") is None:
            raise ValueError("lse given without lse_base: declare 'e' (FlashAttention) or '2' (FlashInfer)")
        kw = {"kv_layout": "NHD", "lse": None, "lse_base": None, "reduce": "sum", "k_scale": None, "max_seq_len": None,
              "launch": None, **{k: v for k, v in kwargs.items() if k != "backend"}}
        return _run_triton(q, kv_cache, blocks=True, **kw)
    return block_scores_from_token_scores(h2o_scores(q, kv_cache, **kwargs), page)
