# fp64 torch references every hypothesis is computed with: paged gather (NHD/HND through a block
# table), dense attention with its natural-log LSE, merge of attention states in base e or 2.
from __future__ import annotations

import math
from typing import Any

LN2 = math.log(2.0)


def gather_pages(cache: Any, block_row: Any, seq_len: int, layout: str) -> Any:
    """Tokens 0..seq_len-1 of one request as [seq_len, H, D] in fp64.

    NHD cache: [num_blocks, page, H, D]; HND cache: [num_blocks, H, page, D]."""
    import torch

    if cache.element_size() == 1:  # fp8: CPU indexing of float8 is not implemented everywhere
        cache = cache.to(torch.float32)
    page = cache.shape[1] if layout == "NHD" else cache.shape[2]
    n_pages = -(-seq_len // page)
    if n_pages == 0:
        h, d = (cache.shape[2], cache.shape[3]) if layout == "NHD" else (cache.shape[1], cache.shape[3])
        return torch.zeros((0, h, d), dtype=torch.float64, device=cache.device)
    idx = block_row[:n_pages].long().to(cache.device)
    pages = cache[idx].to(torch.float64)
    if layout == "HND":
        pages = pages.transpose(1, 2)
    return pages.reshape(-1, pages.shape[2], pages.shape[3])[:seq_len]


def attention(q: Any, k: Any, v: Any, scale: float, q_pos: Any | None = None) -> tuple[Any, Any]:
    """Dense attention in fp64. q [Tq, Hq, D], k/v [L, Hkv, D] (GQA by repeat), optional
    causal positions q_pos [Tq] (query t sees keys 0..q_pos[t]). Returns (out, lse base e);
    a query that sees no key gets out 0 and lse -inf."""
    import torch

    q64, k64, v64 = (x.to(torch.float64) for x in (q, k, v))
    group = q64.shape[1] // max(k64.shape[1], 1)
    if k64.shape[0] == 0:
        return (torch.zeros(q64.shape[0], q64.shape[1], v64.shape[2], dtype=torch.float64, device=q.device),
                torch.full(q64.shape[:2], -math.inf, dtype=torch.float64, device=q.device))
    k64 = k64.repeat_interleave(group, dim=1)
    v64 = v64.repeat_interleave(group, dim=1)
    logits = torch.einsum("thd,lhd->thl", q64, k64) * scale
    if q_pos is not None:
        keys = torch.arange(k64.shape[0], device=q.device)
        masked = keys[None, :] > q_pos.to(q.device).long()[:, None]
        logits = logits.masked_fill(masked[:, None, :], -math.inf)
    lse = torch.logsumexp(logits, dim=-1)
    p = torch.exp(logits - lse[..., None])
    p = torch.nan_to_num(p, nan=0.0)
    out = torch.einsum("thl,lhd->thd", p, v64)
    return out, lse


def paged_decode(q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any, *, sm_scale: float,
                 kv_layout: str = "NHD", k_scale: float = 1.0, v_scale: float = 1.0) -> tuple[Any, Any]:
    """Decode (one query per request) over a paged cache: (out [B,Hq,D], lse_e [B,Hq]) in fp64."""
    import torch

    outs, lses = [], []
    for b, L in enumerate(seq_lens.tolist()):
        k = gather_pages(k_cache, block_table[b], L, kv_layout) * k_scale
        v = gather_pages(v_cache, block_table[b], L, kv_layout) * v_scale
        o, lse = attention(q[b : b + 1], k, v, sm_scale)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def paged_prefill(q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any, qo_lens: Any, *,
                  sm_scale: float, kv_layout: str = "NHD", causal: bool = True, k_scale: float = 1.0,
                  v_scale: float = 1.0, causal_align: str = "bottom-right") -> tuple[Any, Any]:
    """Prefill/append over a paged cache; query i of request r sits at position
    kv_len - qo_len + i (bottom-right causal, vLLM's and FlashInfer's convention)."""
    import torch

    outs, lses, start = [], [], 0
    for b, (L, n) in enumerate(zip(seq_lens.tolist(), qo_lens.tolist(), strict=True)):
        k = gather_pages(k_cache, block_table[b], L, kv_layout) * k_scale
        v = gather_pages(v_cache, block_table[b], L, kv_layout) * v_scale
        qb = q[start : start + n]
        start += n
        pos = None
        if causal:
            offset = L - n if causal_align == "bottom-right" else 0
            pos = torch.arange(n) + offset
        o, lse = attention(qb, k, v, sm_scale, pos)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def ragged_prefill(q: Any, k: Any, v: Any, qo_lens: Any, kv_lens: Any, *, sm_scale: float, causal: bool = True,
                   kv_layout: str = "NHD", causal_align: str = "bottom-right") -> tuple[Any, Any]:
    """Prefill over ragged K/V: NHD k [nnz_kv, Hkv, D], HND k [Hkv, nnz_kv, D]."""
    import torch

    if kv_layout == "HND":
        k, v = k.transpose(0, 1), v.transpose(0, 1)
    outs, lses, qs, ks = [], [], 0, 0
    for n, L in zip(qo_lens.tolist(), kv_lens.tolist(), strict=True):
        pos = None
        if causal:
            offset = L - n if causal_align == "bottom-right" else 0
            pos = torch.arange(n) + offset
        o, lse = attention(q[qs : qs + n], k[ks : ks + L], v[ks : ks + L], sm_scale, pos)
        outs.append(o)
        lses.append(lse)
        qs += n
        ks += L
    return torch.cat(outs), torch.cat(lses)


def merge_states(v_a: Any, s_a: Any, v_b: Any, s_b: Any, base: str = "e") -> tuple[Any, Any]:
    """Merge two partial attention states whose LSEs are in `base` ("e" or "2"); fp64.
    v [T, H, D], s [T, H]. A side with s = -inf contributes nothing; both -inf gives v 0, s -inf."""
    import torch

    f = 1.0 if base == "e" else LN2  # natural-log units per unit of s
    a = s_a.to(torch.float64) * f
    b = s_b.to(torch.float64) * f
    m = torch.maximum(a, b)
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    wa = torch.exp(a - m_safe)
    wb = torch.exp(b - m_safe)
    tot = wa + wb
    v = (wa[..., None] * v_a.to(torch.float64) + wb[..., None] * v_b.to(torch.float64)) / torch.where(tot == 0, 1.0, tot)[..., None]
    s = (m_safe + torch.log(tot)) / f
    return v, s
