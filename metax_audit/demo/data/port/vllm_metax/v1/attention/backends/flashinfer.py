# Demo MACA FlashInfer attention backend: the upstream FlashInfer backend ported to the MACA
# FlashInfer build (vendor class names, vendor merge kernel, no cascade wrapper).
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

# /------------------------- Metax Modification -------------------------\
# The MACA FlashInfer build has no MultiLevelCascadeAttentionWrapper.
# \------------------------- Metax Modification -------------------------/
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
)

from vllm import _custom_ops as ops
from vllm.platforms import current_platform
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionImpl,
    AttentionMetadataBuilder,
    CommonAttentionMetadata,
)

# /------------------------- Metax Modification -------------------------\
# Use MACA's merge_attn_states so the vendor kernel is invoked.
from vllm_metax.v1.attention.ops.merge_attn_states import merge_attn_states

# \------------------------- Metax Modification -------------------------/

FLASHINFER_WORKSPACE_BUFFER_SIZE = 256 * 1024 * 1024
_LN2 = math.log(2.0)


class MacaFlashInferBackend(AttentionBackend):
    accept_output_buffer = True
    supported_dtypes: ClassVar[list[str]] = ["float16", "bfloat16"]

    @staticmethod
    def get_name() -> str:
        return "FLASHINFER"

    @staticmethod
    def get_impl_cls() -> type[MacaFlashInferImpl]:
        return MacaFlashInferImpl

    @staticmethod
    def get_builder_cls() -> type[MacaFlashInferMetadataBuilder]:
        return MacaFlashInferMetadataBuilder

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        return (num_blocks, 2, block_size, num_kv_heads, head_size)

    @staticmethod
    def get_kv_cache_stride_order() -> tuple[int, ...]:
        return (0, 1, 2, 3, 4)

    @classmethod
    def supports_compute_capability(cls, capability: Any) -> bool:
        return capability.major >= 8


@dataclass
class FlashInferMetadata:
    num_actual_tokens: int
    num_decodes: int
    num_decode_tokens: int
    num_prefills: int
    slot_mapping: Any
    use_cascade: bool = False
    prefill_wrapper: Any = None
    prefill_new_wrapper: Any = None
    decode_wrapper: Any = None
    cascade_wrapper: Any = None


class MacaFlashInferMetadataBuilder(AttentionMetadataBuilder[FlashInferMetadata]):
    cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    reorder_batch_threshold: ClassVar[int | None] = 1

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.num_qo_heads = vllm_config.model_config.num_heads
        self.num_kv_heads = kv_cache_spec.num_kv_heads
        self.head_dim = kv_cache_spec.head_size
        self.page_size = kv_cache_spec.block_size
        self.sm_scale = 1.0 / math.sqrt(self.head_dim)
        self.window_left = -1
        self.logits_soft_cap = None
        self.q_data_type = vllm_config.model_config.dtype
        self.kv_data_type = kv_cache_spec.dtype
        self.prefill_fixed_split_size = 4096
        self.disable_split_kv = False
        self.enable_cuda_graph = vllm_config.compilation_config.cudagraph_mode != "NONE"
        # SM 10.0 decodes through TRT-LLM kernels instead of the FlashInfer wrappers.
        self.use_trtllm_decode = current_platform.is_device_capability(100)
        self._workspace_buffer = None
        self._prefill_wrapper = None
        self._prefill_new_wrapper = None
        self._decode_wrapper = None
        self._cascade_wrapper = None

    def _get_workspace_buffer(self):
        if self._workspace_buffer is None:
            self._workspace_buffer = bytearray(FLASHINFER_WORKSPACE_BUFFER_SIZE)
        return self._workspace_buffer

    def _get_prefill_wrapper(self):
        if self._prefill_wrapper is None:
            self._prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self._get_workspace_buffer(), "NHD")
        return self._prefill_wrapper

    def _get_prefill_new_wrapper(self):
        if self._prefill_new_wrapper is None:
            self._prefill_new_wrapper = BatchPrefillWithPagedKVCacheWrapper(self._get_workspace_buffer(), "NHD")
        return self._prefill_new_wrapper

    def _get_decode_wrapper(self, batch_size: int, use_cudagraph: bool = False):
        if self._decode_wrapper is None:
            self._decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
                self._get_workspace_buffer(),
                "NHD",
                use_cuda_graph=use_cudagraph,
                use_tensor_cores=False,
            )
        return self._decode_wrapper

    # ----- Metax Modification -----
    # MACA does not support cascade attention for now.
    # ----- Metax Modification -----
    def _get_cascade_wrapper(self):
        raise NotImplementedError("MACA FlashInfer backend does not support cascade attention.")

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata, fast_build: bool = False):
        m = common_attn_metadata
        num_decodes = sum(1 for n in m.query_start_loc_cpu if n == 1)
        num_prefills = m.num_reqs - num_decodes
        qo_indptr, kv_indptr, kv_indices, last_page_len = _paged_kv_layout(m, self.page_size)
        attn_metadata = FlashInferMetadata(
            num_actual_tokens=m.num_actual_tokens,
            num_decodes=num_decodes,
            num_decode_tokens=num_decodes,
            num_prefills=num_prefills,
            slot_mapping=m.slot_mapping,
            use_cascade=common_prefix_len > 0,
        )
        if attn_metadata.use_cascade:
            attn_metadata.cascade_wrapper = self._get_cascade_wrapper()
            return attn_metadata
        if num_prefills > 0:
            attn_metadata.prefill_wrapper = self._get_prefill_wrapper()
            attn_metadata.prefill_wrapper.plan(
                qo_indptr,
                kv_indptr,
                kv_indices,
                last_page_len,
                self.num_qo_heads,
                self.num_kv_heads,
                self.head_dim,
                self.page_size,
                causal=True,
                sm_scale=self.sm_scale,
                window_left=self.window_left,
                logits_soft_cap=self.logits_soft_cap,
                q_data_type=self.q_data_type,
                kv_data_type=self.kv_data_type,
                # fixed_split_size=self.prefill_fixed_split_size,
                # disable_split_kv=self.disable_split_kv,
            )
        if num_decodes > 0 and not self.use_trtllm_decode:
            use_cudagraph = self.enable_cuda_graph and num_decodes <= 512
            attn_metadata.decode_wrapper = self._get_decode_wrapper(num_decodes, use_cudagraph)
            attn_metadata.decode_wrapper.plan(
                indptr=kv_indptr[: num_decodes + 1],
                indices=kv_indices,
                last_page_len=last_page_len[:num_decodes],
                num_qo_heads=self.num_qo_heads,
                num_kv_heads=self.num_kv_heads,
                head_dim=self.head_dim,
                page_size=self.page_size,
                pos_encoding_mode="NONE",
                window_left=self.window_left,
                logits_soft_cap=self.logits_soft_cap,
                q_data_type=self.q_data_type,
                kv_data_type=self.kv_data_type,
                sm_scale=self.sm_scale,
                fixed_split_size=None,
                # disable_split_kv=self.disable_split_kv,
            )
        return attn_metadata


def _paged_kv_layout(m: CommonAttentionMetadata, page_size: int):
    """Indptr/indices/last-page-length arrays of the paged KV cache, as plain lists."""
    qo_indptr = list(m.query_start_loc_cpu)
    kv_indptr, kv_indices, last_page_len = [0], [], []
    for req, seq_len in enumerate(m.seq_lens):
        pages = -(-seq_len // page_size)
        kv_indices.extend(m.block_table_tensor[req][:pages])
        kv_indptr.append(kv_indptr[-1] + pages)
        last_page_len.append(seq_len - (pages - 1) * page_size)
    return qo_indptr, kv_indptr, kv_indices, last_page_len


class MacaFlashInferImpl(AttentionImpl):
    def __init__(
        self,
        num_heads,
        head_size,
        scale,
        num_kv_heads=None,
        alibi_slopes=None,
        sliding_window=None,
        kv_cache_dtype="auto",
        logits_soft_cap=None,
        attn_type="decoder",
        kv_sharing_target_layer_name=None,
        sinks=None,
    ):
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = scale
        self.num_kv_heads = num_kv_heads or num_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.logits_soft_cap = logits_soft_cap
        self.sinks = sinks
        self.dcp_world_size = 1

    def forward(
        self, layer, query, key, value, kv_cache, attn_metadata, output=None, output_scale=None, output_block_scale=None
    ):
        if attn_metadata is None:
            return output
        ops.reshape_and_cache_flash(
            key, value, kv_cache[:, 0], kv_cache[:, 1], attn_metadata.slot_mapping, self.kv_cache_dtype,
            layer._k_scale, layer._v_scale,
        )
        if attn_metadata.use_cascade:
            output[:] = attn_metadata.cascade_wrapper.run(query, kv_cache)
            return output
        num_decode_tokens = attn_metadata.num_decode_tokens
        if attn_metadata.prefill_wrapper is not None:
            prefill_query = query[num_decode_tokens:]
            if self.dcp_world_size > 1:
                ctx_out, ctx_lse = attn_metadata.prefill_wrapper.run(
                    prefill_query, kv_cache, k_scale=layer._k_scale_float, v_scale=layer._v_scale_float, return_lse=True
                )
                new_out, new_lse = attn_metadata.prefill_new_wrapper.run(prefill_query, kv_cache, return_lse=True)
                merge_attn_states(output[num_decode_tokens:], ctx_out, ctx_lse, new_out, new_lse)
            else:
                attn_metadata.prefill_wrapper.run(
                    prefill_query,
                    kv_cache,
                    k_scale=layer._k_scale_float,
                    v_scale=layer._v_scale_float,
                    out=output[num_decode_tokens:],
                )
        if attn_metadata.decode_wrapper is not None:
            # ----- Metax Modification -----
            # MACA keeps the KV scales as device tensors only.
            k_scale = layer._k_scale.item()
            v_scale = layer._v_scale.item()
            # ----- Metax Modification -----
            attn_metadata.decode_wrapper.run(
                query[:num_decode_tokens],
                kv_cache,
                k_scale=k_scale,
                v_scale=v_scale,
                out=output[:num_decode_tokens],
                sinks=self.sinks,
            )
        return output
