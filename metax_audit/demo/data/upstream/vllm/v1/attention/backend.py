# Demo base classes of an attention backend: the backend names its builder and impl classes,
# the builder turns scheduler output into metadata, the impl runs attention in forward().
from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar


class AttentionCGSupport(enum.Enum):
    """How much of the backend a CUDA graph may capture."""

    ALWAYS = 3
    UNIFORM_BATCH = 2
    UNIFORM_SINGLE_TOKEN_DECODE = 1
    NEVER = 0


@dataclass
class CommonAttentionMetadata:
    query_start_loc: Any
    query_start_loc_cpu: Any
    seq_lens: Any
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    block_table_tensor: Any
    slot_mapping: Any


class AttentionBackend(ABC):
    accept_output_buffer: bool = False
    supported_dtypes: ClassVar[list[str]] = ["float16", "bfloat16"]

    @staticmethod
    @abstractmethod
    def get_name() -> str: ...

    @staticmethod
    @abstractmethod
    def get_impl_cls() -> type[AttentionImpl]: ...

    @staticmethod
    @abstractmethod
    def get_builder_cls() -> type[AttentionMetadataBuilder]: ...

    @staticmethod
    @abstractmethod
    def get_kv_cache_shape(
        num_blocks: int, block_size: int, num_kv_heads: int, head_size: int, cache_dtype_str: str = "auto"
    ) -> tuple[int, ...]: ...

    @staticmethod
    def get_kv_cache_stride_order() -> tuple[int, ...]:
        raise NotImplementedError

    @classmethod
    def supports_compute_capability(cls, capability: Any) -> bool:
        return True


M = TypeVar("M")


class AttentionMetadataBuilder(ABC, Generic[M]):
    cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.NEVER
    reorder_batch_threshold: ClassVar[int | None] = None

    def __init__(self, kv_cache_spec: Any, layer_names: list[str], vllm_config: Any, device: Any) -> None:
        self.kv_cache_spec = kv_cache_spec
        self.layer_names = layer_names
        self.vllm_config = vllm_config
        self.device = device

    @abstractmethod
    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata, fast_build: bool = False) -> M: ...

    def build_for_cudagraph_capture(self, common_attn_metadata: CommonAttentionMetadata) -> M:
        return self.build(0, common_attn_metadata)


class AttentionImpl(ABC):
    @abstractmethod
    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int | None = None,
        alibi_slopes: list[float] | None = None,
        sliding_window: int | None = None,
        kv_cache_dtype: str = "auto",
        logits_soft_cap: float | None = None,
        attn_type: str = "decoder",
        kv_sharing_target_layer_name: str | None = None,
        sinks: Any = None,
    ) -> None: ...

    @abstractmethod
    def forward(
        self,
        layer: Any,
        query: Any,
        key: Any,
        value: Any,
        kv_cache: Any,
        attn_metadata: Any,
        output: Any = None,
        output_scale: Any = None,
        output_block_scale: Any = None,
    ) -> Any: ...
