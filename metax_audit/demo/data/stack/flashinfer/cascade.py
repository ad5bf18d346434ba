# Demo FlashInfer cascade helpers: merging partial states and the multi-level cascade wrapper.
from __future__ import annotations

import math


def merge_state(v_a, s_a, v_b, s_b):
    """Merge two partial attention states.

    ``s_a`` and ``s_b`` are log-sum-exp values in base 2 (log2), as returned by the
    wrappers' ``run(..., return_lse=True)``. Returns ``(v, s)`` with ``s`` in base 2.
    """
    v, s = [], []
    for row_a, la, row_b, lb in zip(v_a, s_a, v_b, s_b, strict=True):
        m = max(la, lb)
        wa, wb = 2.0 ** (la - m), 2.0 ** (lb - m)
        v.append([(wa * x + wb * y) / (wa + wb) for x, y in zip(row_a, row_b, strict=True)])
        s.append(m + math.log2(wa + wb))
    return v, s


class MultiLevelCascadeAttentionWrapper:
    """Attention over a shared prefix level plus per-request levels."""

    def __init__(self, num_levels, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False):
        self._num_levels = num_levels
        self._workspace = float_workspace_buffer
        self._kv_layout = kv_layout
        self._planned = False

    def plan(
        self,
        qo_indptr_arr,
        paged_kv_indptr_arr,
        paged_kv_indices_arr,
        paged_kv_last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        causal=False,
        pos_encoding_mode="NONE",
        use_fp16_qk_reduction=False,
        sm_scale=None,
        window_left=-1,
        logits_soft_cap=None,
        rope_scale=None,
        rope_theta=None,
        q_data_type="float16",
    ):
        self._planned = True

    def run(self, q, paged_kv_cache):
        if not self._planned:
            raise RuntimeError("plan() must be called before run()")
        return q
