# Demo MACA Triton attention backend: the upstream Triton backend with vendor class names,
# plus a decode-only variant registered by decorator and an MLA prefill backend.
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from vllm import _custom_ops as ops
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionImpl,
    AttentionMetadataBuilder,
)
from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend
from vllm.v1.attention.ops.triton_unified_attention import unified_attention


class MacaTritonAttentionBackend(AttentionBackend):
    accept_output_buffer = True

    @staticmethod
    def get_name() -> str:
        return "TRITON_ATTN"

    @staticmethod
    def get_impl_cls() -> type[MacaTritonAttentionImpl]:
        return MacaTritonAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[MacaTritonAttentionMetadataBuilder]:
        return MacaTritonAttentionMetadataBuilder

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        return (num_blocks, 2, block_size, num_kv_heads, head_size)


@register_backend(AttentionBackendEnum.CUSTOM)
class MacaTritonDecodeOnlyBackend(MacaTritonAttentionBackend):
    """Decode-only variant kept for the MACA graph runner."""

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"


class MacaTritonPrefillBackend:
    """MLA prefill through the Triton kernel."""

    @staticmethod
    def get_name() -> str:
        return "TRITON"


@dataclass
class TritonAttentionMetadata:
    num_actual_tokens: int
    max_query_len: int
    query_start_loc: Any
    max_seq_len: int
    seq_lens: Any
    block_table: Any
    slot_mapping: Any


class MacaTritonAttentionMetadataBuilder(AttentionMetadataBuilder[TritonAttentionMetadata]):
    cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.ALWAYS

    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        m = common_attn_metadata
        return TritonAttentionMetadata(
            num_actual_tokens=m.num_actual_tokens,
            max_query_len=m.max_query_len,
            query_start_loc=m.query_start_loc,
            max_seq_len=m.max_seq_len,
            seq_lens=m.seq_lens,
            block_table=m.block_table_tensor,
            slot_mapping=m.slot_mapping,
        )


class MacaTritonAttentionImpl(AttentionImpl):
    def __init__(self, num_heads, head_size, scale, num_kv_heads=None, alibi_slopes=None, sliding_window=None,
                 kv_cache_dtype="auto", logits_soft_cap=None, attn_type="decoder",
                 kv_sharing_target_layer_name=None, sinks=None):
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = scale
        self.num_kv_heads = num_kv_heads or num_heads
        self.alibi_slopes = alibi_slopes
        self.sliding_window = (-1, -1) if sliding_window is None else (sliding_window - 1, 0)
        self.kv_cache_dtype = kv_cache_dtype
        self.logits_soft_cap = logits_soft_cap or 0.0
        self.sinks = sinks

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None, output_scale=None,
                output_block_scale=None):
        if attn_metadata is None:
            return output
        key_cache, value_cache = kv_cache[:, 0], kv_cache[:, 1]
        ops.reshape_and_cache_flash(key, value, key_cache, value_cache, attn_metadata.slot_mapping,
                                    self.kv_cache_dtype, layer._k_scale, layer._v_scale)
        unified_attention(
            q=query,
            k=key_cache,
            v=value_cache,
            out=output,
            cu_seqlens_q=attn_metadata.query_start_loc,
            max_seqlen_q=attn_metadata.max_query_len,
            seqused_k=attn_metadata.seq_lens,
            max_seqlen_k=attn_metadata.max_seq_len,
            softmax_scale=self.scale,
            causal=True,
            window_size=self.sliding_window,
            block_table=attn_metadata.block_table,
            softcap=self.logits_soft_cap,
            q_descale=None,
            k_descale=layer._k_scale,
            v_descale=layer._v_scale,
            alibi_slopes=self.alibi_slopes,
            # sinks=self.sinks,
        )
        return output
