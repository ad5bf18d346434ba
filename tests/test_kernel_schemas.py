# Kernel stacks whose ops are registered from C++ (torch.ops.<ns>.X, pkg.X): read statically from the
# package's documented schemas and meta kernels when it cannot be imported; config names the namespaces.
from __future__ import annotations

import sys
from pathlib import Path

from metax_audit.core.config import AuditConfig, _from_mapping
from metax_audit.core.errors import ConfigError
from metax_audit.stages.introspect import introspect
from metax_audit.stages.introspect_worker.schemas import schema_fact

STACK = Path(__file__).parent / "fixtures" / "npu_port" / "stack"
ROOTS = [str(STACK)]


def test_documented_schema_names_and_meta_kernel_keywords_make_the_signature() -> None:
    fact = schema_fact("npu_kernels.fused_attention", "npu_kernels", "fused_attention", ROOTS)
    assert fact is not None and fact["status"] == "ok" and fact["source"] == "static"
    names = [(p["name"], p["kind"]) for p in fact["params"]]
    # positional names from the documented schema (the meta kernel calls them q, k, v) ...
    assert names[:3] == [("query", "POSITIONAL_OR_KEYWORD"), ("key", "POSITIONAL_OR_KEYWORD"), ("value", "POSITIONAL_OR_KEYWORD")]
    # ... keyword-only parameters from the meta kernel, which knows one the documentation lacks
    assert ("sink", "KEYWORD_ONLY") in names
    assert "schema documented in __init__.py" in fact["doc"] and "meta registration fused_attention_meta in meta.py" in fact["doc"]
    assert fact["signature"].startswith("fused_attention(Tensor query, Tensor key, Tensor value, *")


def test_disagreeing_or_single_sources_give_no_signature_with_the_reason() -> None:
    stale = schema_fact("npu_kernels.stale_doc_op", "npu_kernels", "stale_doc_op", ROOTS)
    assert stale is not None and stale["status"] == "no-signature"
    assert "2 positional parameters, the meta kernel 3" in stale["error"]
    doc_only = schema_fact("npu_kernels.doc_only_op", "npu_kernels", "doc_only_op", ROOTS)
    # a decorator that is not a kernel registration (a graph pass keyed by the op name) is not a meta kernel
    assert doc_only is not None and doc_only["status"] == "no-signature"
    assert "only a documented schema" in doc_only["error"]
    assert schema_fact("npu_kernels.nothing", "npu_kernels", "nothing", ROOTS) is None


def test_introspection_falls_back_to_the_schema_for_configured_namespaces_only() -> None:
    targets = ["npu_kernels.fused_attention", "torch.ops.npu_ops.mla_decode", "torch.ops.other_ns.mla_decode"]
    facts = introspect(targets, python=sys.executable, static_roots=[STACK], timeout=60,
                       op_namespaces={"npu_ops": "npu_kernels"}).facts
    fused = facts["npu_kernels.fused_attention"]
    assert fused.status == "ok" and fused.source == "static" and "read statically" in (fused.error or "")
    decode = facts["torch.ops.npu_ops.mla_decode"]
    assert decode.status == "ok" and [p.name for p in decode.params or ()] == ["q", "kv_cache", "block_table", "mode"]
    assert facts["torch.ops.other_ns.mla_decode"].status != "ok"  # no namespace configured: not guessed


def test_config_reads_kernel_stack_settings_and_rejects_bad_maps() -> None:
    cfg = _from_mapping({"op-namespaces": {"npu": "torch_npu"}, "kernel-sources": ["torch-npu==2.10.0.post2"],
                         "class-map": {"A": "vllm.x.B"}, "selectors": ["get_attn_backend_cls"]}, "test")
    assert cfg.op_namespaces == {"npu": "torch_npu"} and cfg.kernel_sources == ("torch-npu==2.10.0.post2",)
    assert AuditConfig().op_namespaces == {} and AuditConfig().kernel_sources == ()  # MetaX defaults unchanged
    for bad in ({"op-namespaces": ["npu"]}, {"class-map": {"A": 1}}):
        try:
            _from_mapping(bad, "test")
        except ConfigError as exc:
            assert "must be a mapping of strings to strings" in str(exc)
        else:
            raise AssertionError(f"{bad} accepted")
