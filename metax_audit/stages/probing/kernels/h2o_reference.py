# Dense fp32 torch reference for H2O scores over a paged KV cache, plus the cache/paging
# normalisation the Triton kernel shares, so both read the same positions by construction.
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

LSE_BASES = ("e", "2")
KV_LAYOUTS = ("NHD", "HND")
REDUCTIONS = ("sum", "mean")


@dataclass(frozen=True)
class Paging:
    """Where each request's pages live, whichever metadata format the caller used.

    `table` holds page ids; request r's j-th page is `table[row_start[r] + j]` (FlashInfer
    `indptr`/`indices`) or `table[r, j]` (vLLM `block_table`, `row_start` None).
    """

    table: Any  # torch.Tensor, int
    row_start: Any  # torch.Tensor [B] (indptr form) or None (block-table form)
    seq_lens: Any  # torch.Tensor [B] int32, tokens cached per request
    page_size: int

    @property
    def batch(self) -> int:
        return int(self.seq_lens.shape[0])

    def pages_of(self, r: int, n_pages: int) -> Any:
        if self.row_start is None:
            return self.table[r, :n_pages]
        start = int(self.row_start[r])
        return self.table[start : start + n_pages]


def key_cache_view(kv_cache: Any, kv_layout: str = "NHD") -> Any:
    """The K part of a cache as a 4-d view `[num_pages, page, kv_heads, head_dim]` (no copy).

    Accepted: a 5-d joint cache `[num_pages, 2, page, kv_heads, d]` (FlashInfer; HND swaps page
    and kv_heads), a 5-d `[2, num_pages, ...]` (vLLM FlashAttention style; used only when dim 1
    is not 2), a `(k_cache, v_cache)` pair, or a 4-d K cache alone (V is never read).
    """
    import torch

    if kv_layout not in KV_LAYOUTS:
        raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}, got {kv_layout!r}")
    if isinstance(kv_cache, tuple | list):
        if len(kv_cache) != 2:
            raise ValueError("a cache given as a sequence must be (k_cache, v_cache)")
        k = kv_cache[0]
    elif not isinstance(kv_cache, torch.Tensor):
        raise TypeError(f"kv_cache must be a tensor or a (k, v) pair, got {type(kv_cache).__name__}")
    elif kv_cache.dim() == 5:
        # FlashInfer's joint layout wins when both dims are 2 (a two-page cache): it is the
        # format this API documents first.
        if kv_cache.shape[1] == 2:
            k = kv_cache[:, 0]
        elif kv_cache.shape[0] == 2:
            k = kv_cache[0]
        else:
            raise ValueError(f"5-d cache needs a K/V axis of size 2 at dim 1 or 0, got shape {tuple(kv_cache.shape)}")
    elif kv_cache.dim() == 4:
        k = kv_cache
    else:
        raise ValueError(f"kv_cache must be 4-d or 5-d, got shape {tuple(kv_cache.shape)}")
    if k.dim() != 4:
        raise ValueError(f"K cache must be 4-d, got shape {tuple(k.shape)}")
    return k.transpose(1, 2) if kv_layout == "HND" else k


def resolve_paging(
    page_size: int,
    *,
    block_table: Any = None,
    seq_lens: Any = None,
    indptr: Any = None,
    indices: Any = None,
    last_page_len: Any = None,
) -> Paging:
    """Normalise vLLM (`block_table`, `seq_lens`) or FlashInfer (`indptr`, `indices`, `last_page_len`) metadata."""
    import torch

    vllm_style = block_table is not None or seq_lens is not None
    fi_style = indptr is not None or indices is not None or last_page_len is not None
    if vllm_style and fi_style:
        raise ValueError("give either block_table+seq_lens or indptr+indices+last_page_len, not both")
    if vllm_style:
        if block_table is None or seq_lens is None:
            raise ValueError("block_table and seq_lens go together")
        if block_table.dim() != 2 or seq_lens.dim() != 1 or block_table.shape[0] != seq_lens.shape[0]:
            raise ValueError("block_table must be [batch, max_pages] and seq_lens [batch]")
        return Paging(block_table, None, seq_lens.to(torch.int32), page_size)
    if indptr is None or indices is None or last_page_len is None:
        raise ValueError("paging metadata missing: pass block_table+seq_lens or indptr+indices+last_page_len")
    n_pages = (indptr[1:] - indptr[:-1]).to(torch.int64)
    lens = torch.where(n_pages > 0, (n_pages - 1) * page_size + last_page_len.to(torch.int64), 0)
    return Paging(indices, indptr[:-1], lens.to(torch.int32), page_size)


def lse_to_base2(lse: Any, lse_base: str | None) -> Any:
    """The caller's LSE in log2 units; the base must be declared because FlashInfer uses 2 and FlashAttention e."""
    import torch

    if lse_base not in LSE_BASES:
        raise ValueError(f"lse_base must be 'e' or '2' when lse is given, got {lse_base!r}")
    lse = lse.to(torch.float32)
    return lse if lse_base == "2" else lse * (1.0 / math.log(2.0))


def _dequant_keys(k: Any, k_scale: Any) -> Any:
    import torch

    kf = k.to(torch.float32)
    if k_scale is None:
        return kf
    scale = k_scale.to(torch.float32).reshape(()) if isinstance(k_scale, torch.Tensor) else float(k_scale)
    return kf * scale


def h2o_scores_reference(
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
) -> Any:
    """Dense fp32 H2O scores `[batch, kv_heads, max_seq_len]`, one request at a time.

    `score[r,g,t] = Σ_{h in group g} softmax_t(q[r,h]·k[r,t,g]·scale)`; with `lse` the softmax
    denominator is the caller's (so a wrong LSE shows up as lost or extra mass, as in the kernel).
    Positions at or past `seq_lens[r]` are exactly 0 and cache slots outside the sequence are never read.
    """
    import torch

    if reduce not in REDUCTIONS:
        raise ValueError(f"reduce must be 'sum' or 'mean', got {reduce!r}")
    kv = key_cache_view(kv_cache, kv_layout)
    page_size, kv_heads, head_dim = int(kv.shape[1]), int(kv.shape[2]), int(kv.shape[3])
    paging = resolve_paging(
        page_size, block_table=block_table, seq_lens=seq_lens, indptr=indptr, indices=indices, last_page_len=last_page_len
    )
    batch, q_heads = int(q.shape[0]), int(q.shape[1])
    if q.dim() != 3 or int(q.shape[2]) != head_dim:
        raise ValueError(f"q must be [batch, q_heads, {head_dim}], got {tuple(q.shape)}")
    if q_heads % kv_heads:
        raise ValueError(f"q_heads={q_heads} is not a multiple of kv_heads={kv_heads}")
    if batch != paging.batch:
        raise ValueError(f"q has batch {batch}, paging metadata has {paging.batch}")
    group = q_heads // kv_heads
    lens = [int(x) for x in paging.seq_lens.cpu()]
    width = max(lens, default=0) if max_seq_len is None else int(max_seq_len)
    if width < max(lens, default=0):
        raise ValueError(f"max_seq_len={width} is shorter than the longest sequence {max(lens)}")
    lse2 = None if lse is None else lse_to_base2(lse, lse_base)
    out = torch.zeros(batch, kv_heads, width, dtype=torch.float32, device=q.device)
    for r, n in enumerate(lens):
        if n == 0:
            continue
        pages = paging.pages_of(r, -(-n // page_size)).to(torch.int64)
        k = _dequant_keys(kv[pages].reshape(-1, kv_heads, head_dim)[:n], k_scale)  # [n, G, D]
        qr = q[r].to(torch.float32).reshape(kv_heads, group, head_dim)
        logits = torch.einsum("gjd,tgd->gjt", qr, k) * float(scale)  # [G, group, n]
        if lse2 is None:
            probs = torch.softmax(logits, dim=-1)
        else:
            ln_lse = lse2[r].reshape(kv_heads, group, 1) * math.log(2.0)
            probs = torch.exp(logits - ln_lse)
        out[r, :, :n] = probs.sum(dim=1)
    return out / group if reduce == "mean" else out


def block_scores_from_token_scores(scores: Any, page_size: int) -> Any:
    """Per-page sums `[batch, kv_heads, ceil(width/page)]`, page j being the request's j-th table entry."""
    import torch

    batch, heads, width = scores.shape
    n_blocks = -(-int(width) // page_size)
    padded = torch.nn.functional.pad(scores, (0, n_blocks * page_size - int(width)))
    return padded.reshape(batch, heads, n_blocks, page_size).sum(dim=-1)


def block_scores_reference(q: Any, kv_cache: Any, **kwargs: Any) -> Any:
    """`h2o_scores_reference` summed per cache block, in each request's block-table order."""
    kv = key_cache_view(kv_cache, kwargs.get("kv_layout", "NHD"))
    return block_scores_from_token_scores(h2o_scores_reference(q, kv_cache, **kwargs), int(kv.shape[1]))
