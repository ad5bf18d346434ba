# Counterparts when no upstream file has the port file's path: a move into an upstream subfolder, the
# registered enum member's file, the upstream classes the port's classes subclass (or config maps), and
# the by-role comparison (override signatures, abstract methods, upstream drift). Fixture: npu_port.
from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

from metax_audit.cache.memo import review_memo
from metax_audit.core.config import AuditConfig
from metax_audit.core.models import UpstreamInfo
from metax_audit.stages.compare import compare
from metax_audit.stages.compare.counterparts import map_file
from metax_audit.stages.discover import discover

FIXTURE = Path(__file__).parent / "fixtures" / "npu_port"
CFG = AuditConfig(port_package="vllm_npu", scope=("{port}/attention/**/*.py", "{port}/platform.py"),
                  class_prefixes=("Npu",))


@pytest.fixture
def trees(tmp_path: Path) -> tuple[Path, Path]:
    shutil.copytree(FIXTURE / "port", tmp_path / "port")
    shutil.copytree(FIXTURE / "upstream", tmp_path / "upstream")
    return tmp_path / "port", tmp_path / "upstream"


def _review(port: Path, up: Path, base: Path | None = None, config: AuditConfig = CFG):
    d = discover(port, config)
    target = UpstreamInfo("vllm", "0.99.0", "directory:test", up)
    old = UpstreamInfo("vllm", "0.98.0", "directory:base", base) if base else None
    comparison, findings = compare(d, config, target, old)
    return {f.path: f for f in comparison.files}, findings


def test_counterparts_by_registration_role_and_vendor_only(trees: tuple[Path, Path]) -> None:
    files, _ = _review(*trees)
    flash = files["vllm_npu/attention/device_a/flash_attn.py"]  # returned for FLASH_ATTN, a copy of upstream's
    assert flash.upstream_path == "vllm/v1/attention/backends/flash_attn.py"
    assert flash.class_map == {"NpuFlashAttentionBackend": "FlashAttentionBackend", "NpuFlashAttentionImpl": "FlashAttentionImpl"}
    mla = files["vllm_npu/attention/mla_v1.py"]  # a rewrite: its classes subclass upstream's
    assert mla.upstream_path == "vllm/v1/attention/backend.py"
    assert mla.class_map == {"NpuMLAMetadataBuilder": "MLACommonMetadataBuilder", "NpuMLAImpl": "AttentionImpl",
                             "NpuMLABackend": "AttentionBackend",
                             "NpuSparseMLABackend": "AttentionBackend"}  # through the port's NpuMLABackend
    assert mla.differences == ()  # a role counterpart is not diffed line by line
    assert files["vllm_npu/attention/__init__.py"].vendor_only


def test_override_findings_name_the_dropped_parameters_with_both_signatures(trees: tuple[Path, Path]) -> None:
    _, findings = _review(*trees)
    got = {(f.rule, f.location.symbol): f for f in findings if f.rule in {"MXA207", "MXA208"}}
    assert set(got) == {("MXA207", "NpuMLAMetadataBuilder.build"), ("MXA207", "NpuMLAImpl.forward"),
                        ("MXA207", "NpuAttentionImpl.forward"), ("MXA207", "NpuAttentionBackend.get_kv_cache_shape")}
    build = got[("MXA207", "NpuMLAMetadataBuilder.build")]
    assert "drops the optional parameter `fast_build`" in build.message
    assert any("mla_attention.py" in e and "MLACommonMetadataBuilder.build(" in e for e in build.evidence)
    forward = got[("MXA207", "NpuMLAImpl.forward")].message
    # q / kv_c_and_k_pe_cache are renamed in place (positional calls still bind); value and kv_cache are gone
    assert "`query`" not in forward and "`key`" not in forward
    assert "drops the required parameter `value`" in forward and "drops the required parameter `kv_cache`" in forward


def test_abstract_method_missing_and_only_raising_override(trees: tuple[Path, Path]) -> None:
    port, up = trees
    mla = port / "vllm_npu/attention/mla_v1.py"
    mla.write_text(mla.read_text() + "\n\nclass NpuIndexerImpl(AttentionImpl):\n    def helper(self):\n        return 1\n\n\n"
                   "class NpuDisabledImpl(AttentionImpl):\n    def forward(self, layer):\n"
                   "        raise NotImplementedError('not on this device')\n")
    _, findings = _review(port, up)
    abstract = [f for f in findings if f.rule == "MXA208"]
    assert [(f.location.symbol, f.severity.value) for f in abstract] == [("NpuIndexerImpl.forward", "warning")]
    # a static abstract method (get_impl_cls on a backend) is answered by upstream's body: not reported
    assert not any("get_impl_cls" in f.message for f in findings)
    assert not any(f.location.symbol == "NpuDisabledImpl.forward" for f in findings if f.rule == "MXA207")


def test_upstream_signature_change_not_followed_is_drift(trees: tuple[Path, Path], tmp_path: Path) -> None:
    port, up = trees
    base = tmp_path / "base"
    shutil.copytree(up, base)
    # base release: build(common_prefix_len, common_attn_metadata); the target added fast_build
    mla_common = base / "vllm/model_executor/layers/attention/mla_attention.py"
    mla_common.write_text(mla_common.read_text().replace("def build(self, common_prefix_len, common_attn_metadata, fast_build=False)",
                                                         "def build(self, common_prefix_len, common_attn_metadata)"))
    _, findings = _review(port, up, base)
    drift = [f for f in findings if f.rule == "MXA203"]
    assert [f.location.symbol for f in drift] == ["NpuMLAMetadataBuilder.build"]
    assert "0.98.0 -> 0.99.0" in drift[0].message and "still has the old form" in drift[0].message
    assert any(e.startswith("upstream vllm/model_executor/layers/attention/mla_attention.py:") for e in drift[0].evidence)


def test_same_path_without_shared_definitions_is_not_a_counterpart(tmp_path: Path) -> None:
    up = tmp_path / "up"
    (up / "vllm/distributed").mkdir(parents=True)
    (up / "vllm/distributed/utils.py").write_text("def divide(a, b):\n    return a // b\n")
    cfg = AuditConfig(port_package="vllm_npu")
    other = ast.parse("def all_gather_async(x):\n    return x\n")
    copy = ast.parse("def divide(a, b):\n    return a // b\n\ndef extra():\n    return 1\n")
    cp = map_file("vllm_npu/distributed/utils.py", cfg, up, port_tree=other)
    assert cp.vendor_only and "shares no class or function" in cp.why_not
    assert map_file("vllm_npu/distributed/utils.py", cfg, up, port_tree=copy).how == "path"


def test_file_moved_into_an_upstream_platform_subfolder(tmp_path: Path) -> None:
    up = tmp_path / "up"
    for sub in ("amd", "nvidia"):
        (up / f"vllm/models/m/{sub}").mkdir(parents=True)
        (up / f"vllm/models/m/{sub}/flashmla.py").write_text("class FlashMLABackend:\n    pass\n")
    tree = ast.parse("class MacaFlashMLABackend:\n    pass\n")
    cp = map_file("vllm_metax/models/m/flashmla.py", AuditConfig(), up, port_tree=tree)
    assert (cp.upstream_path, cp.how) == ("vllm/models/m/nvidia/flashmla.py", "subfolder")
    only_amd = AuditConfig(upstream_subfolders=("rocm",))
    assert map_file("vllm_metax/models/m/flashmla.py", only_amd, up, port_tree=tree).vendor_only  # ambiguous


def test_file_moved_under_a_folder_inserted_higher_up(tmp_path: Path) -> None:
    # vLLM 0.26 keeps vllm/models/deepseek_v4/common/ops/fused_indexer_q.py; the port models/deepseek_v4/ops/
    up = tmp_path / "up"
    (up / "vllm/models/m/common/ops").mkdir(parents=True)
    (up / "vllm/models/m/common/ops/fused_q.py").write_text("def fused_q(x):\n    return x\n")
    (up / "vllm/models/m/nvidia/ops").mkdir(parents=True)
    (up / "vllm/models/m/nvidia/ops/fused_q_cutedsl.py").write_text("def fused_q(x):\n    return x\n")
    tree = ast.parse("def fused_q(x):\n    return x\n")
    cp = map_file("vllm_metax/models/m/ops/fused_q.py", AuditConfig(), up, port_tree=tree)
    assert (cp.upstream_path, cp.how) == ("vllm/models/m/common/ops/fused_q.py", "subfolder")
    assert map_file("vllm_metax/models/m/ops/other.py", AuditConfig(), up, port_tree=tree).vendor_only  # no such name


def test_config_class_map_names_the_role_of_a_class_that_neither_copies_nor_subclasses(trees: tuple[Path, Path]) -> None:
    port, up = trees
    (port / "vllm_npu/attention/standalone.py").write_text(
        "class NpuStandaloneBuilder:\n    def build(self, common_prefix_len):\n        return None\n")
    cfg = AuditConfig(port_package="vllm_npu", scope=CFG.scope, class_prefixes=("Npu",),
                      class_map={"NpuStandaloneBuilder": "vllm.model_executor.layers.attention.mla_attention.MLACommonMetadataBuilder"})
    files, findings = _review(port, up, config=cfg)
    assert files["vllm_npu/attention/standalone.py"].upstream_path == "vllm/model_executor/layers/attention/mla_attention.py"
    assert any(f.rule == "MXA207" and f.location.symbol == "NpuStandaloneBuilder.build" for f in findings)
    files, _ = _review(port, up)
    assert files["vllm_npu/attention/standalone.py"].vendor_only


def test_required_parameter_dropped_and_passed_by_an_upstream_caller_is_an_error(trees: tuple[Path, Path]) -> None:
    port, up = trees
    (up / "vllm/v1/engine.py").write_text("def run(backend):\n    return backend.get_kv_cache_shape(1, 16, 8, 128)\n"
                                          "\n\ndef step(model, x):\n    return model.forward(x, 1, 2, 3, 4, 5, 6)\n")
    att = port / "vllm_npu/attention/attention_v1.py"
    att.write_text(att.read_text().replace("def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size):",
                                           "def get_kv_cache_shape(num_blocks, block_size, num_kv_heads):"))
    _, findings = _review(port, up)
    shape = next(f for f in findings if f.rule == "MXA207" and f.location.symbol == "NpuAttentionBackend.get_kv_cache_shape")
    assert shape.severity.value == "error"
    assert "upstream caller vllm/v1/engine.py:2 passes 4 positional arguments, in run" in shape.evidence
    # `.forward(...)` is called on every nn.Module upstream: evidence, but no proof the interface is called
    forward = next(f for f in findings if f.rule == "MXA207" and f.location.symbol == "NpuMLAImpl.forward")
    assert forward.severity.value == "warning"


def test_optional_parameter_dropped_and_passed_positionally_by_an_upstream_caller_is_an_error(trees: tuple[Path, Path]) -> None:
    """The override drops an optional parameter that an upstream caller passes by position (one argument more than the
    override takes): TypeError when that call runs. A caller that leaves it out keeps the finding a warning."""
    port, up = trees
    (up / "vllm/v1/engine.py").write_text("def run(backend):\n    return backend.get_kv_cache_shape(1, 16, 8, 128)\n")
    _, findings = _review(port, up)
    shape = next(f for f in findings if f.rule == "MXA207" and f.location.symbol == "NpuAttentionBackend.get_kv_cache_shape")
    assert shape.severity.value == "warning" and "drops the optional parameter `cache_dtype_str`" in shape.message
    (up / "vllm/v1/engine.py").write_text("def run(backend):\n    return backend.get_kv_cache_shape(1, 16, 8, 128, 'fp8')\n")
    _, findings = _review(port, up)
    shape = next(f for f in findings if f.rule == "MXA207" and f.location.symbol == "NpuAttentionBackend.get_kv_cache_shape")
    assert shape.severity.value == "error"
    assert "upstream caller vllm/v1/engine.py:2 passes 5 positional arguments, in run" in shape.evidence


def test_role_through_the_ports_own_base_class_in_another_file(trees: tuple[Path, Path]) -> None:
    port, up = trees
    (port / "vllm_npu/attention/base_b.py").write_text(
        "from vllm.v1.attention.backend import AttentionImpl\n\n\nclass NpuBaseImpl(AttentionImpl):\n"
        "    def helper(self):\n        return 1\n")
    (port / "vllm_npu/attention/device_b.py").write_text(
        "from vllm_npu.attention.attention_v1 import NpuAttentionImpl\nfrom vllm_npu.attention.base_b import NpuBaseImpl\n\n\n"
        "class NpuImplB(NpuBaseImpl):\n    def forward(self, layer, query):\n        return query\n\n\n"
        "class NpuImplC(NpuAttentionImpl):\n    def forward(self, layer, x):\n        return x\n")
    files, findings = _review(port, up)
    assert files["vllm_npu/attention/device_b.py"].upstream_path == "vllm/v1/attention/backend.py"
    got = next(f for f in findings if f.rule == "MXA207" and f.location.symbol == "NpuImplB.forward")
    assert "NpuImplB takes the role of upstream AttentionImpl (base, through port class NpuBaseImpl)" in got.evidence
    # NpuAttentionImpl redefines forward: its contract, not upstream's, binds NpuImplC.forward
    assert not [f for f in findings if f.location.symbol == "NpuImplC.forward"]
    # abstract methods are not judged through another file's class
    assert not [f for f in findings if f.rule == "MXA208" and f.location.symbol.startswith(("NpuImplB.", "NpuImplC."))]


def test_abstract_check_skips_classes_with_a_mixin_from_elsewhere(trees: tuple[Path, Path]) -> None:
    port, up = trees
    (port / "vllm_npu/attention/mixed.py").write_text(
        "from vllm.v1.attention.backend import AttentionImpl\nfrom vllm_npu.attention.base_b import Mixin\n\n\n"
        "class NpuMixedImpl(Mixin, AttentionImpl):\n    pass\n")
    (port / "vllm_npu/attention/base_b.py").write_text("class Mixin:\n    def forward(self, *a):\n        return a\n")
    _, findings = _review(port, up)
    assert not [f for f in findings if f.location.symbol.startswith("NpuMixedImpl.")]


def test_per_file_compare_cache_follows_the_ports_intermediate_class(trees: tuple[Path, Path]) -> None:
    from metax_audit.stages.compare.per_file import cached_compare

    port, up = trees
    (port / "vllm_npu/attention/base_b.py").write_text(
        "from vllm.v1.attention.backend import AttentionImpl\n\n\nclass NpuBaseImpl(AttentionImpl):\n    pass\n")
    (port / "vllm_npu/attention/device_b.py").write_text(
        "from vllm_npu.attention.base_b import NpuBaseImpl\n\n\n"
        "class NpuImplB(NpuBaseImpl):\n    def forward(self, layer, query):\n        return query\n")
    target = UpstreamInfo("vllm", "0.99.0", "directory:test", up)

    def flagged() -> bool:
        _, found, _ = cached_compare(discover(port, CFG), CFG, target, memo=review_memo(True))
        return any(f.rule == "MXA207" and f.location.symbol == "NpuImplB.forward" for f in found)

    assert flagged()
    # the intermediate class now defines forward itself: device_b.py's bytes are unchanged, its result is not
    (port / "vllm_npu/attention/base_b.py").write_text(
        "from vllm.v1.attention.backend import AttentionImpl\n\n\nclass NpuBaseImpl(AttentionImpl):\n"
        "    def forward(self, layer, query):\n        return query\n")
    assert not flagged()


def test_parameter_renamed_in_place_is_reported_only_when_upstream_passes_it_by_keyword(trees: tuple[Path, Path]) -> None:
    port, up = trees
    att = port / "vllm_npu/attention/attention_v1.py"
    att.write_text(att.read_text().replace("def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size):",
                                           "def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_type=''):"))
    _, findings = _review(port, up)
    assert not [f for f in findings if f.location.symbol == "NpuAttentionBackend.get_kv_cache_shape"]  # no keyword caller
    (up / "vllm/v1/engine.py").write_text("def run(b):\n    return b.get_kv_cache_shape(1, 16, 8, 128, cache_dtype_str='auto')\n")
    _, findings = _review(port, up)
    got = next(f for f in findings if f.location.symbol == "NpuAttentionBackend.get_kv_cache_shape")
    assert "renames `cache_dtype_str` to `cache_type`, which upstream callers pass by keyword" in got.message
    # the upstream call names the parameter the override no longer has: TypeError whenever it runs
    assert got.severity.value == "error" and "upstream caller vllm/v1/engine.py:2 passes cache_dtype_str=, in run" in got.evidence


def test_abstract_method_missing_is_an_error_when_the_class_is_instantiated(trees: tuple[Path, Path]) -> None:
    port, up = trees
    mla = port / "vllm_npu/attention/mla_v1.py"
    mla.write_text(mla.read_text() + "\n\nclass NpuIndexerImpl(AttentionImpl):\n    def helper(self):\n        return 1\n\n\n"
                   "class NpuIndexerBackend:\n    @staticmethod\n    def get_impl_cls():\n        return NpuIndexerImpl\n")
    _, findings = _review(port, up)
    [abstract] = [f for f in findings if f.rule == "MXA208"]
    assert abstract.severity.value == "error" and any("get_impl_cls() returns NpuIndexerImpl" in e for e in abstract.evidence)
