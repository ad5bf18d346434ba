# Demo FlashInfer batch decode wrapper over a paged KV cache (signatures in the 0.2.x shape).
from __future__ import annotations


class BatchDecodeWithPagedKVCacheWrapper:
    """Decode attention over a paged KV cache.

    The log-sum-exp returned with ``return_lse=True`` is in base 2 (log2), one value per
    (token, head), laid out ``[num_tokens, num_heads]``.
    """

    def __init__(
        self,
        float_workspace_buffer,
        kv_layout="NHD",
        use_cuda_graph=False,
        use_tensor_cores=False,
        paged_kv_indptr_buffer=None,
        paged_kv_indices_buffer=None,
        paged_kv_last_page_len_buffer=None,
        backend="auto",
        jit_args=None,
    ):
        self._workspace = float_workspace_buffer
        self._kv_layout = kv_layout
        self._use_cuda_graph = use_cuda_graph
        self._use_tensor_cores = use_tensor_cores
        self._plan = None

    def plan(
        self,
        indptr,
        indices,
        last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        pos_encoding_mode="NONE",
        window_left=-1,
        logits_soft_cap=None,
        q_data_type="float16",
        kv_data_type=None,
        data_type=None,
        sm_scale=None,
        rope_scale=None,
        rope_theta=None,
        non_blocking=True,
    ):
        self._plan = {
            "num_qo_heads": num_qo_heads,
            "num_kv_heads": num_kv_heads,
            "head_dim": head_dim,
            "page_size": page_size,
            "window_left": window_left,
            "logits_soft_cap": logits_soft_cap,
            "sm_scale": sm_scale,
        }

    def run(self, q, paged_kv_cache, *, return_lse=False, **kwargs):
        # Only these keywords are honoured; anything else passed in **kwargs is ignored.
        k_scale = kwargs.get("k_scale")
        v_scale = kwargs.get("v_scale")
        out = kwargs.get("out")
        if self._plan is None:
            raise RuntimeError("plan() must be called before run()")
        result = (out, k_scale, v_scale)
        return (result, None) if return_lse else result
