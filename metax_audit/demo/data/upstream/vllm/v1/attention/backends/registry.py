# Demo backend registry: enum members name backends, register_backend binds a class path to one.
from __future__ import annotations

import enum
from collections.abc import Callable

_OVERRIDES: dict[str, str] = {}
_MLA_PREFILL_OVERRIDES: dict[str, str] = {}


class AttentionBackendEnum(enum.Enum):
    FLASH_ATTN = "vllm.v1.attention.backends.flash_attn.FlashAttentionBackend"
    FLASHINFER = "vllm.v1.attention.backends.flashinfer.FlashInferBackend"
    TRITON_ATTN = "vllm.v1.attention.backends.triton_attn.TritonAttentionBackend"
    TRITON_MLA = "vllm.v1.attention.backends.mla.triton_mla.TritonMLABackend"
    FLASHMLA = "vllm.v1.attention.backends.mla.flashmla.FlashMLABackend"
    CUSTOM = ""

    def get_path(self) -> str:
        return _OVERRIDES.get(self.name, self.value)


class MLAPrefillBackendEnum(enum.Enum):
    FLASH_ATTN = "vllm.v1.attention.backends.mla.prefill.flash_attn.FlashAttnPrefillBackend"
    TRITON = "vllm.v1.attention.backends.mla.prefill.triton.TritonPrefillBackend"


def register_backend(backend: AttentionBackendEnum, class_path: str | None = None) -> Callable[[type], type] | None:
    """Bind `backend` to `class_path`; without a class path, return a class decorator."""
    if class_path is not None:
        _OVERRIDES[backend.name] = class_path
        return None

    def decorator(cls: type) -> type:
        _OVERRIDES[backend.name] = f"{cls.__module__}.{cls.__qualname__}"
        return cls

    return decorator


def register_mla_prefill_backend(backend: MLAPrefillBackendEnum, class_path: str) -> None:
    _MLA_PREFILL_OVERRIDES[backend.name] = class_path
