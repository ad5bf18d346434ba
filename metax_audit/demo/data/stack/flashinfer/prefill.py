# Demo FlashInfer batch prefill wrapper over a paged KV cache (signatures in the 0.2.x shape).
from __future__ import annotations


class BatchPrefillWithPagedKVCacheWrapper:
    """Prefill attention over a paged KV cache.

    The log-sum-exp returned with ``return_lse=True`` is in base 2 (log2), laid out
    ``[num_tokens, num_heads]``.
    """

    def __init__(
        self,
        float_workspace_buffer,
        kv_layout="NHD",
        use_cuda_graph=False,
        qo_indptr_buf=None,
        paged_kv_indptr_buf=None,
        paged_kv_indices_buf=None,
        paged_kv_last_page_len_buf=None,
        custom_mask_buf=None,
        mask_indptr_buf=None,
        backend="auto",
        jit_args=None,
    ):
        self._workspace = float_workspace_buffer
        self._kv_layout = kv_layout
        self._use_cuda_graph = use_cuda_graph
        self._plan = None

    def plan(
        self,
        qo_indptr,
        paged_kv_indptr,
        paged_kv_indices,
        paged_kv_last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim_qk,
        page_size,
        head_dim_vo=None,
        custom_mask=None,
        packed_custom_mask=None,
        causal=False,
        pos_encoding_mode="NONE",
        use_fp16_qk_reduction=False,
        sm_scale=None,
        window_left=-1,
        logits_soft_cap=None,
        rope_scale=None,
        rope_theta=None,
        q_data_type="float16",
        kv_data_type=None,
        non_blocking=True,
    ):
        self._plan = {"causal": causal, "sm_scale": sm_scale, "window_left": window_left}

    def run(self, q, paged_kv_cache, *, return_lse=False, **kwargs):
        # Only these keywords are honoured; anything else passed in **kwargs is ignored.
        k_scale = kwargs.get("k_scale")
        v_scale = kwargs.get("v_scale")
        out = kwargs.get("out")
        if self._plan is None:
            raise RuntimeError("plan() must be called before run()")
        result = (out, k_scale, v_scale)
        return (result, None) if return_lse else result
