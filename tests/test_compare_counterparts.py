# Tests for counterpart mapping: path rules, config overrides, the registered enum member as
# the fallback for moved files and renamed classes, and the static read of upstream's registry.
from __future__ import annotations

import ast
from pathlib import Path

from metax_audit.core.config import AuditConfig
from metax_audit.stages.compare.counterparts import (
    default_upstream_path,
    map_classes,
    map_file,
    read_registry,
    registered_members,
    strip_prefix,
)

CFG = AuditConfig()


def _upstream(tmp_path: Path) -> Path:
    reg = tmp_path / "vllm" / "v1" / "attention" / "backends" / "registry.py"
    reg.parent.mkdir(parents=True)
    reg.write_text(
        "class AttentionBackendEnum(Enum):\n"
        "    FLASH = 'vllm.v1.attention.backends.fast.FlashBackend'\n"
        "    OTHER = (\n        'vllm.v1.attention.backends.'\n        'other.OtherBackend'\n    )\n"
        "    CUSTOM = None\n    TORCH_SDPA = ''\n"
        "class MambaBackendEnum(Enum):\n    FLASH = 'vllm.v1.mamba.MambaFlash'\n"
    )
    (reg.parent / "other.py").write_text("class OtherBackend:\n    pass\n")
    return tmp_path


def test_read_registry_is_static_and_qualified(tmp_path: Path) -> None:
    reg = read_registry(_upstream(tmp_path), "vllm")
    assert reg == {
        "AttentionBackendEnum.FLASH": "vllm.v1.attention.backends.fast.FlashBackend",
        "AttentionBackendEnum.OTHER": "vllm.v1.attention.backends.other.OtherBackend",
        "MambaBackendEnum.FLASH": "vllm.v1.mamba.MambaFlash",
    }
    assert read_registry(None, "vllm") == {}


def test_default_path_and_outside_package() -> None:
    assert default_upstream_path("vllm_metax/v1/x/y.py", CFG) == "vllm/v1/x/y.py"
    assert default_upstream_path("tools/x.py", CFG) is None


def test_moved_file_found_through_its_registration(tmp_path: Path) -> None:
    up = _upstream(tmp_path)
    registry = read_registry(up, "vllm")
    tree = ast.parse("@register_backend(AttentionBackendEnum.OTHER)\nclass MacaSparse:\n    pass\n")
    registered = registered_members(tree)
    assert registered == {"MacaSparse": "AttentionBackendEnum.OTHER"}
    cp = map_file("vllm_metax/models/x/sparse.py", CFG, up, registered, registry)
    assert cp.upstream_path == "vllm/v1/attention/backends/other.py"
    assert cp.how == "registration:AttentionBackendEnum.OTHER"
    assert map_classes(["MacaSparse"], ["OtherBackend"], CFG, "vllm.v1.attention.backends.other", registered, registry) == {
        "MacaSparse": "OtherBackend"
    }


def test_unregistered_missing_file_is_vendor_only(tmp_path: Path) -> None:
    cp = map_file("vllm_metax/v1/attention/backends/cp_utils.py", CFG, _upstream(tmp_path))
    assert cp.vendor_only and cp.how == "vendor-only"


def test_strip_prefix_needs_a_word_boundary() -> None:
    assert strip_prefix("MacaFlashInferBackend", CFG.class_prefixes) == "FlashInferBackend"
    assert strip_prefix("Macaroni", CFG.class_prefixes) == "Macaroni"
    assert strip_prefix("MetaXFoo", CFG.class_prefixes) == "Foo"
