# Demo entry point of the Triton paged attention kernel (signature only; the body is inert).
from __future__ import annotations


def unified_attention(
    q, k, v, out, cu_seqlens_q, max_seqlen_q, seqused_k, max_seqlen_k, softmax_scale, causal, window_size,
    block_table, softcap, q_descale, k_descale, v_descale, alibi_slopes=None, sinks=None,
):
    """Paged attention over a block table; q/k/v descales are fp8 dequantisation factors."""
    return out
