# The op-name check: torch.ops uses and "ns::op" strings against the port's Python and C++
# registrations, upstream's Python registrations and compiled-extension index, and a manifest.
from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from conftest import write_tree

from metax_audit.core.config import AuditConfig
from metax_audit.core.models import Discovery, Severity, SourceFile, StackFacts, UpstreamInfo
from metax_audit.stages.checks.op_registrations import cpp_registrations
from metax_audit.stages.checks.op_table import build_table
from metax_audit.stages.checks.ops import check_ops, op_findings
from metax_audit.stages.upstream import COMPILED_INDEX, compiled_op_names, schema_names, write_compiled_index

UPSTREAM = {
    "up/vllm/__init__.py": "",
    "up/vllm/utils/torch_utils.py": '''
        from torch.library import Library
        vllm_lib = Library("vllm", "FRAGMENT")
        def direct_register_custom_op(op_name, op_func, mutates_args=None, fake_impl=None, target_lib=None):
            pass
    ''',
    "up/vllm/attention.py": '''
        import torch
        from vllm.utils.torch_utils import direct_register_custom_op
        direct_register_custom_op(op_name="unified_attention", op_func=len)
        direct_register_custom_op(f"dyn_{len}", len)
        def f(x):
            return torch.ops._C.compiled_op(x)
    ''',
}
PORT = {
    "csrc/torch_bindings.cpp": '''
        #include "ops.h"
        void helper_only(int x) { }
        STABLE_TORCH_LIBRARY_FRAGMENT(_C, ops) {
          ops.def("cpp_op(Tensor x) -> ()");
          ops.def(
              "cpp_split(Tensor x, "
              "Tensor y) -> Tensor");
          ops.impl("cpp_op", &cpp_op);
        }
        TORCH_LIBRARY_EXPAND(CONCAT(TORCH_EXTENSION_NAME, _cache_ops), cache_ops) {
          cache_ops.def("macro_op(Tensor x) -> ()");
        }
    ''',
    "port/__init__.py": "",
    "port/ops.py": '''
        from vllm.utils.torch_utils import direct_register_custom_op
        import torch
        direct_register_custom_op(op_name="port_op", op_func=len)
        my_lib = torch.library.Library("port_ns", "FRAGMENT")
        my_lib.define("lib_op(Tensor x) -> Tensor")
        @torch.library.custom_op("port_ns::decorated", mutates_args=())
        def decorated(x):
            return x
    ''',
}
USES = {
    "port_op": "torch.ops.vllm.port_op(x)",
    "cpp_op": "torch.ops._C.cpp_op(x)",
    "cpp_split": "torch.ops._C.cpp_split.default(x)",
    "macro_op": "torch.ops._C_cache_ops.macro_op(x)",
    "lib_op": "torch.ops.port_ns.lib_op(x)",
    "decorated": "torch.ops.port_ns.decorated(x)",
    "upstream_py": "torch.ops.vllm.unified_attention(x)",
    "upstream_compiled": "torch.ops._C.compiled_op(x)",
    "aten": "torch.ops.aten.add(x, x)",
    "missing_cpp": "torch.ops._C.helper_only(x)",
    "missing_py": "torch.ops.vllm.unified_attention_v2(x)",
    "stale_string": 'ops_list.append("vllm::gone_op")',
    "renamed_string": 'ops_list.append("vllm::unified_attention_old")',
    "renamed_string_listed": 'ops_list.append("vllm::unified_attention_old") or ops_list.append("vllm::unified_attention")',
    "fake_of_missing": 'register_fake("vllm::nope")(len)',
    "guarded": 'torch.ops._C.guarded_op(x) if hasattr(torch.ops._C, "guarded_op") else None',
    "unknown_ns": "torch.ops.sgl_kernel.gate(x)",
    "dynamic": "torch.ops.vllm.dyn_abc(x)",
    "namespace_call": "torch.ops._C(x)",
    "namespace_call_guarded": "torch.ops.port_ns(x) if hasattr(torch.ops.port_ns, 'lib_op') else None",
}


def _setup(tmp_path: Path, use: str, compiled: bool = True) -> tuple[Discovery, UpstreamInfo]:
    write_tree(tmp_path, {**UPSTREAM, **PORT, "port/attn.py": f"import torch\n\ndef forward(x, ops_list):\n    return {use}\n"})
    up = UpstreamInfo("vllm", "9.9", "directory", tmp_path / "up")
    if compiled:
        (tmp_path / "up" / COMPILED_INDEX).write_text(json.dumps({"wheel": "w", "extensions": {"vllm/_C.so": ["compiled_op"]}}))
    disc = Discovery(tmp_path, "port", (SourceFile("port/attn.py", "port.attn", "glob"),), (), (), (), {})
    return disc, up


def _run(tmp_path: Path, use: str, compiled: bool = True, manifest: dict | None = None) -> list:
    disc, up = _setup(tmp_path, use, compiled)
    facts = None
    if manifest is not None:
        facts = StackFacts("py", "", "", {}, source="manifest:m.json", torch_ops=manifest)
    return op_findings(disc, AuditConfig(port_package="port"), up, facts)


@pytest.mark.parametrize(("case", "rule", "severity"), [
    ("port_op", None, None),  # the port's direct_register_custom_op, default namespace read from upstream
    ("cpp_op", None, None),  # registered in C++ (TORCH_LIBRARY_FRAGMENT)
    ("cpp_split", None, None),  # schema split over adjacent literals; .default overload
    ("macro_op", None, None),  # library named by a macro: matched by op name
    ("lib_op", None, None),  # Library("port_ns").define
    ("decorated", None, None),  # torch.library.custom_op("ns::op")
    ("upstream_py", None, None),
    ("upstream_compiled", None, None),  # in the wheel's compiled-extension index
    ("aten", None, None),  # torch's own namespace
    ("missing_cpp", "MXA170", Severity.ERROR),  # a C++ function, never .def'd
    ("missing_py", "MXA170", Severity.ERROR),
    ("stale_string", "MXA171", Severity.INFO),  # no registered op of a similar name: the entry asks for nothing
    ("renamed_string", "MXA171", Severity.WARNING),  # upstream's unified_attention is registered, the list names the old one
    ("renamed_string_listed", "MXA171", Severity.INFO),  # the successor is in the list too
    ("fake_of_missing", "MXA170", Severity.ERROR),
    ("guarded", "MXA173", Severity.INFO),
    ("unknown_ns", "MXA172", Severity.INFO),  # a namespace nothing read declares: maybe a compiled package
    ("dynamic", "MXA172", Severity.INFO),  # upstream registers computed names with this prefix
    ("namespace_call", "MXA174", Severity.ERROR),  # torch.ops._C(...): the namespace is not callable
    ("namespace_call_guarded", "MXA174", Severity.WARNING),
])
def test_op_table(tmp_path: Path, case: str, rule: str | None, severity: Severity | None) -> None:
    found = _run(tmp_path, USES[case])
    assert [(f.rule, f.severity) for f in found] == ([(rule, severity)] if rule else [])
    if rule == "MXA174" and severity is Severity.ERROR:
        assert "cpp_op" in "\n".join(found[0].evidence) and "TypeError" in found[0].message
    if rule == "MXA170":
        assert found[0].evidence[0].startswith("port: port/attn.py:4:")
        assert any(e.startswith("read: port C++ (1 files") for e in found[0].evidence)


def test_missing_cpp_op_names_the_unregistered_function(tmp_path: Path) -> None:
    found = _run(tmp_path, USES["missing_cpp"])
    assert any("defines a function helper_only at csrc/torch_bindings.cpp:3" in e for e in found[0].evidence)
    assert any("closest registered" in e for e in _run(tmp_path, "torch.ops._C.cpp_opp(x)")[0].evidence)


def test_miss_in_a_namespace_with_an_unread_compiled_provider_is_not_an_error(tmp_path: Path) -> None:
    # upstream calls torch.ops._C.* but its compiled op list was not read: no proof the op is missing
    found = _run(tmp_path, USES["missing_cpp"], compiled=False)
    assert [(f.rule, f.severity) for f in found] == [("MXA172", Severity.INFO)]
    assert "could not be read" in found[0].message
    assert _run(tmp_path, USES["cpp_op"], compiled=False) == []  # a C++ registration still resolves


def test_manifest_supplies_namespaces_of_the_stack(tmp_path: Path) -> None:
    assert _run(tmp_path, USES["unknown_ns"], manifest={"sgl_kernel": ("gate",)}) == []
    found = _run(tmp_path, "torch.ops.sgl_kernel.other(x)", manifest={"sgl_kernel": ("gate",)})
    assert [(f.rule, f.severity) for f in found] == [("MXA170", Severity.ERROR)]


def test_cpp_registrations_read_blocks_only() -> None:
    text = 'void f();\nTORCH_LIBRARY(myns, m) {\n  m.def("a(Tensor x) -> ()");\n  m.impl("b", &b);\n}\nm.def("outside() -> ()");\n'
    regs, macro = cpp_registrations(text, "x.cpp", "port C++")
    assert [(r.namespace, r.name, r.where) for r in regs] == [("myns", "", "x.cpp:2"), ("myns", "a", "x.cpp:3")]
    assert macro == {}


def test_schema_names_from_a_compiled_extension(tmp_path: Path) -> None:
    blob = b"\x7fELF\x00junk\x00rms_norm(Tensor! out, Tensor x) -> ()\x00other text\x00silu.out(Tensor x)->Tensor\x00"
    assert schema_names(blob) == {"rms_norm", "silu"}
    wheel = tmp_path / "vllm-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("vllm/_C.abi3.so", blob)
        zf.writestr("vllm/__init__.py", "")
    entry = tmp_path / "entry"
    assert write_compiled_index(wheel, entry) == 1
    names, note = compiled_op_names(UpstreamInfo("vllm", "1.0", "pip", entry), fetch=False)
    assert names == frozenset({"rms_norm", "silu"}) and "1 compiled extensions" in note
    missing, why = compiled_op_names(UpstreamInfo("vllm", "1.0", "directory:/x", tmp_path), fetch=False)
    assert missing is None and "Python sources only" in why


def test_table_records_what_was_read(tmp_path: Path) -> None:
    disc, up = _setup(tmp_path, "0")
    table = build_table(disc.root, "port", ("csrc", "nowhere"), up, compiled_names=frozenset())
    assert table.namespaces["_C"] == ("port C++", "upstream compiled extensions (vllm 9.9)")
    assert table.namespaces["port_ns"] == ("port python",)
    assert list(check_ops(disc, table)) == []


def test_manifest_keeps_the_torch_ops_of_the_stack(tmp_path: Path) -> None:
    from metax_audit.stages.introspect import load_manifest, write_manifest

    facts = StackFacts("py", "2026-01-01T00:00:00Z", "host", {}, torch_ops={"_flashmla_C": ("fwd_kvcache_mla",)})
    write_manifest(facts, tmp_path / "m.json")
    assert load_manifest(tmp_path / "m.json").torch_ops == {"_flashmla_C": ("fwd_kvcache_mla",)}
    write_manifest(StackFacts("py", "", "", {}), tmp_path / "n.json")  # captured without torch: no op list
    assert load_manifest(tmp_path / "n.json").torch_ops is None


def test_namespace_of_a_configured_kernel_package_is_not_checked_not_missing(tmp_path: Path) -> None:
    disc, up = _setup(tmp_path, USES["unknown_ns"])
    found = op_findings(disc, AuditConfig(port_package="port", op_namespaces={"sgl_kernel": "sgl-kernel"}), up, None)
    assert [(f.rule, f.severity) for f in found] == [("MXA172", Severity.INFO)]
    assert "kernel package sgl-kernel" in found[0].message


def test_port_registrations_are_kept_under_each_sources_text(tmp_path: Path, audit_cache: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from metax_audit.cache.memo import review_memo
    from metax_audit.stages.checks import op_table

    disc, up = _setup(tmp_path, "0")
    fresh = build_table(disc.root, "port", ("csrc",), up)
    read: list[str] = []
    for name in ("python_registrations", "cpp_registrations"):
        real = getattr(op_table, name)
        monkeypatch.setattr(op_table, name, lambda *a, _real=real: read.append(a[1]) or _real(*a))
    assert build_table(disc.root, "port", ("csrc",), up, memo=review_memo(True)) == fresh
    assert sorted(read) == ["csrc/torch_bindings.cpp", "port/ops.py"]
    read.clear()
    assert build_table(disc.root, "port", ("csrc",), up, memo=review_memo(True)) == fresh and read == []
    ops = tmp_path / "port" / "ops.py"
    ops.write_text(ops.read_text() + '\ndirect_register_custom_op(op_name="new_op", op_func=len)\n')
    edited = build_table(disc.root, "port", ("csrc",), up, memo=review_memo(True))
    assert read == ["port/ops.py"] and ("vllm", "new_op") in edited.ops
    assert edited == build_table(disc.root, "port", ("csrc",), up)
    # the port's default namespace comes from upstream: another one is another key
    read.clear()
    (tmp_path / "up" / "vllm" / "utils" / "torch_utils.py").write_text(
        'from torch.library import Library\nvllm_lib = Library("vllm2", "FRAGMENT")\n'
        "def direct_register_custom_op(op_name, op_func, mutates_args=None, fake_impl=None, target_lib=None):\n    pass\n")
    op_table._MEMO.clear()
    other = build_table(disc.root, "port", ("csrc",), up, memo=review_memo(True))
    assert "port/ops.py" in read and "csrc/torch_bindings.cpp" not in read and ("vllm2", "new_op") in other.ops
    assert other == build_table(disc.root, "port", ("csrc",), up)
