# Demo MACA platform: registers the port's attention backends, orders them, and overrides the
# config for features the vendor stack does not support yet.
from __future__ import annotations

from functools import cache

from vllm.v1.attention.backends.registry import (
    AttentionBackendEnum,
    MLAPrefillBackendEnum,
    register_backend,
    register_mla_prefill_backend,
)


@cache
def _get_backend_priorities(use_mla: bool, device_capability: tuple[int, int] | None = None) -> list[AttentionBackendEnum]:
    """Backends in the order the selector tries them."""
    if use_mla:
        return [
            AttentionBackendEnum.TRITON_MLA,
            # AttentionBackendEnum.FLASHMLA,
        ]
    else:
        return [
            AttentionBackendEnum.FLASHINFER,
            AttentionBackendEnum.TRITON_ATTN,
            # AttentionBackendEnum.FLASH_ATTN,
        ]


def register_attention_backends() -> None:
    register_backend(
        AttentionBackendEnum.FLASHINFER,
        class_path="vllm_metax.v1.attention.backends.flashinfer.MacaFlashInferBackend",
    )
    register_backend(
        backend=AttentionBackendEnum.TRITON_ATTN,
        class_path="vllm_metax.v1.attention.backends.triton_attn.MacaTritonAttentionBackend",
    )
    register_backend(
        backend=AttentionBackendEnum.TRITON_MLA,
        class_path="vllm_metax.v1.attention.backends.mla.triton_mla.MacaTritonMLABackend",
    )
    register_mla_prefill_backend(
        backend=MLAPrefillBackendEnum.TRITON,
        class_path="vllm_metax.v1.attention.backends.triton_attn.MacaTritonPrefillBackend",
    )


class MacaPlatform:
    device_name = "maca"
    device_type = "cuda"

    @classmethod
    def get_device_capability(cls, device_id: int = 0) -> tuple[int, int]:
        return (8, 0)

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        model_config = vllm_config.model_config
        compilation_config = vllm_config.compilation_config

        # Cascade attention needs MultiLevelCascadeAttentionWrapper, absent from the MACA build.
        if model_config is not None:
            model_config.disable_cascade_attn = True

        if compilation_config is not None and compilation_config.cudagraph_mode == "FULL":
            compilation_config.cudagraph_mode = "PIECEWISE"

        if attention_config := vllm_config.attention_config:
            attention_config.mla_prefill_backend = MLAPrefillBackendEnum.TRITON

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, use_mla: bool = False) -> str:
        if selected_backend is not None:
            return selected_backend.get_path()
        return _get_backend_priorities(use_mla, cls.get_device_capability())[0].get_path()
