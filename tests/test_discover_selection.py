# Registrations read from a platform that selects backends by returning class-path strings: direct
# returns, dict maps (and .get defaults), enum-keyed maps, conditional expressions, f-strings over a
# constant prefix, helper calls; each with the condition that returns it. Fixture: tests/fixtures/npu_port.
from __future__ import annotations

import ast
import shutil
import textwrap
from pathlib import Path

import pytest

from metax_audit.core.config import AuditConfig
from metax_audit.stages.discover import discover, registration_findings
from metax_audit.stages.discover.selection import selections

FIXTURE = Path(__file__).parent / "fixtures" / "npu_port"
CFG = AuditConfig(port_package="vllm_npu", scope=("{port}/attention/**/*.py", "{port}/platform.py"),
                  class_prefixes=("Npu",))


@pytest.fixture
def port(tmp_path: Path) -> Path:
    shutil.copytree(FIXTURE / "port", tmp_path / "port")
    return tmp_path / "port"


def _returned(root: Path) -> dict[str, tuple[str, str]]:
    d = discover(root, CFG)
    return {r.class_path.rsplit(".", 1)[1]: (r.name, r.condition) for r in d.registrations if r.selected_by}


def test_every_style_of_returned_class_path_is_a_registration_with_its_condition(port: Path) -> None:
    got = _returned(port)
    assert got == {
        # enum-keyed class attribute map, the member named by the key
        "NpuFlashAttentionBackend": ("FLASH_ATTN", "selected_backend in cls._ENUM_MAP and "
                                                     "selected_backend == AttentionBackendEnum.FLASH_ATTN"),
        "NpuTritonBackend": ("TRITON_ATTN", "selected_backend in cls._ENUM_MAP and "
                                             "selected_backend == AttentionBackendEnum.TRITON_ATTN"),
        # helper method returning an f-string over a module constant, with its argument bound
        "NpuSparseMLABackend": ("NpuSparseMLABackend",
                                "not (selected_backend in cls._ENUM_MAP) and attn_selector_config.use_sparse"),
        # a conditional expression and a dict map reach the same class: alternatives are OR-ed
        "NpuMLABackend": ("NpuMLABackend",
                          "(not (selected_backend in cls._ENUM_MAP) and not attn_selector_config.use_sparse"
                          " and is_device_b() and key[0]) or (not (selected_backend in cls._ENUM_MAP)"
                          " and not attn_selector_config.use_sparse and not is_device_b() and key == (True, False))"),
        "NpuAttentionBackendB": ("NpuAttentionBackendB",
                                 "not (selected_backend in cls._ENUM_MAP) and not attn_selector_config.use_sparse"
                                 " and is_device_b() and not key[0]"),
        # a .get with a default that is itself a map entry: the key, or any key not in the map
        "NpuAttentionBackend": ("NpuAttentionBackend",
                                "(not (selected_backend in cls._ENUM_MAP) and not attn_selector_config.use_sparse"
                                " and not is_device_b() and key == (False, False)) or (not (selected_backend in"
                                " cls._ENUM_MAP) and not attn_selector_config.use_sparse and not is_device_b()"
                                " and key not in backend_map)"),
    }


def test_returned_registrations_resolve_and_stay_beside_register_backend_calls(port: Path) -> None:
    d = discover(port, CFG)
    returned = [r for r in d.registrations if r.selected_by]
    assert all(r.resolved and r.kind == "attention-backend" for r in returned)
    assert {r.resolved_path for r in returned} >= {"vllm_npu/attention/device_a/flash_attn.py", "vllm_npu/attention/mla_v1.py"}
    assert all(r.selected_by == "get_attn_backend_cls" and r.location.path == "vllm_npu/platform.py" for r in returned)
    call = [r for r in d.registrations if not r.selected_by and r.kind == "attention-backend"]
    assert [(r.name, r.class_path) for r in call] == [("TREE_ATTN", "vllm_npu.attention.attention_v1.NpuTreeBackend")]


def test_decorator_with_a_name_as_class_path_is_reported_as_registering_the_string(port: Path) -> None:
    findings = [f for f in registration_findings(discover(port, CFG)) if f.rule == "MXA017"]
    assert len(findings) == 1
    f = findings[0]
    assert f.location.path == "vllm_npu/attention/attention_v1.py"
    assert "registers the string 'NPU' for CUSTOM" in f.message
    # the platform selects by returned class paths, so the entry is unused: info, with that evidence
    assert f.severity.value == "info" and any("get_attn_backend_cls" in e for e in f.evidence)


def test_returned_backends_are_not_reported_as_missing_from_priority_lists(port: Path) -> None:
    rules = {f.rule for f in registration_findings(discover(port, CFG))}
    assert "MXA011" not in rules and "MXA016" not in rules and "MXA010" not in rules


def test_selector_names_come_from_config(port: Path) -> None:
    d = discover(port, AuditConfig(port_package="vllm_npu", scope=CFG.scope, selectors=()))
    assert not [r for r in d.registrations if r.selected_by]


def _sel(source: str, selectors: tuple[str, ...] = ("get_attn_backend_cls",)) -> list[tuple[str, str]]:
    tree = ast.parse(textwrap.dedent(source))
    return [(s.class_path, s.condition) for s in selections(tree, "p/platform.py", "p.platform", selectors, lambda m: None)]


def test_elif_chain_on_the_selected_backend_and_early_returns() -> None:
    got = _sel('''
        A = "p.a.ABackend"
        def get_attn_backend_cls(selected_backend, use_mla):
            if use_mla:
                return "p.mla.MLABackend"
            if selected_backend == _Backend.A:
                return A
            elif selected_backend == _Backend.B:
                return "p.b.BBackend"
            return "p.default." + "DefaultBackend"
    ''')
    assert got == [
        ("p.mla.MLABackend", "use_mla"),
        ("p.a.ABackend", "not use_mla and selected_backend == _Backend.A"),
        ("p.b.BBackend", "not use_mla and selected_backend == _Backend.B"),
        ("p.default.DefaultBackend", "not use_mla"),
    ]


def test_nested_helper_with_closure_and_fstring_suffix() -> None:
    got = _sel('''
        def get_attn_backend_cls(selected_backend, use_v1):
            def _version(suffix):
                if use_v1:
                    return f"p.v1.backends.{suffix}"
                raise AssertionError("v0")
            return _version("flash.FlashBackend")
    ''')
    assert got == [("p.v1.backends.flash.FlashBackend", "use_v1")]


def test_strings_that_are_not_class_paths_and_unknown_values_are_ignored() -> None:
    got = _sel('''
        def get_attn_backend_cls(selected_backend, name):
            if name:
                return name
            if selected_backend:
                return "not a path"
            return "p.module_only"
    ''')
    assert got == []


def test_similarly_named_function_is_not_a_selector() -> None:
    assert _sel('def get_attn_backend_cls_old():\n    return "p.a.ABackend"\n') == []


def test_review_of_the_fixture_port_by_configuration_alone(tmp_path: Path) -> None:
    """The whole review of a string-return port: every selectable backend traced with its condition to
    its kernel calls, counterparts by registration and role, kernel signatures from static schemas."""
    import json
    import subprocess

    from typer.testing import CliRunner

    from metax_audit.cli import app

    repo = tmp_path / "repo"
    shutil.copytree(FIXTURE / "port", repo)
    config = (FIXTURE / "metax-audit.yaml").read_text(encoding="utf-8")
    (repo / ".metax-audit.yaml").write_text(config + f"kernel-sources: [{str(FIXTURE / 'stack')!r}]\n", encoding="utf-8")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["review", "--staged", "--repo", str(repo), "--upstream", str(FIXTURE / "upstream"),
                                 "--format", "json", "--output-dir", str(out), "--fail-on", "never"])
    assert r.exit_code == 0, r.output
    data = json.loads((out / "report.json").read_text())
    backends = {b["class_path"].rsplit(".", 1)[1]: b for b in data["backends"]}
    assert set(backends) == {"NpuFlashAttentionBackend", "NpuTritonBackend", "NpuSparseMLABackend", "NpuMLABackend",
                             "NpuAttentionBackendB", "NpuAttentionBackend", "NpuTreeBackend"}
    assert all(b["active"] for n, b in backends.items() if n != "NpuTreeBackend")
    assert backends["NpuFlashAttentionBackend"]["condition"].endswith("selected_backend == AttentionBackendEnum.FLASH_ATTN")
    assert "condition" not in backends["NpuTreeBackend"]  # a register_backend call: no selector condition
    kernels = {h["resolved"] for h in backends["NpuAttentionBackend"]["chain"] if h["role"] == "kernel"}
    assert {"npu_kernels.fused_attention", "torch.ops.npu_ops.reshape_and_cache"} <= kernels
    assert "npu_kernels.mla_decode" in {h["resolved"] for h in backends["NpuMLABackend"]["chain"] if h["role"] == "kernel"}
    files = {f["path"]: f["upstream_path"] for f in data["files"]}
    assert files["vllm_npu/attention/device_a/flash_attn.py"] == "vllm/v1/attention/backends/flash_attn.py"
    assert files["vllm_npu/attention/mla_v1.py"] == "vllm/v1/attention/backend.py"
    rules = {(f["rule"], f["severity"]) for f in data["findings"]}
    assert ("MXA207", "warning") in rules and ("MXA017", "info") in rules
    assert not [f for f in data["findings"] if f["severity"] == "error"], [f["message"] for f in data["findings"] if f["severity"] == "error"]


def test_documented_vllm_ascend_configuration_loads() -> None:
    from metax_audit.core.config import load_config

    docs = Path(__file__).resolve().parents[1] / "docs" / "ports"
    cfg = load_config(Path("."), docs / "vllm-ascend.yaml")
    assert cfg.port_package == "vllm_ascend" and cfg.op_namespaces["npu"] == "torch_npu"
    text = (docs / "vllm-ascend.md").read_text(encoding="utf-8")
    for line in (docs / "vllm-ascend.yaml").read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            assert line.split("#")[0].rstrip() in text  # the page shows the same file


def test_register_backend_in_a_loop_over_an_enum_keyed_map(tmp_path: Path) -> None:
    root = tmp_path / "port"
    (root / "vllm_npu/attention").mkdir(parents=True)
    (root / "vllm_npu/__init__.py").write_text("")
    (root / "vllm_npu/attention/__init__.py").write_text("")
    (root / "vllm_npu/attention/impls.py").write_text("class FastBackend:\n    pass\n\n\nclass SlowBackend:\n    pass\n")
    (root / "vllm_npu/platform.py").write_text(textwrap.dedent('''\
        from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

        _BACKENDS = {
            AttentionBackendEnum.FLASH_ATTN: "vllm_npu.attention.impls.FastBackend",
            AttentionBackendEnum.TRITON_ATTN: "vllm_npu.attention.impls.SlowBackend",
        }


        def register_attention_backends():
            for member, path in _BACKENDS.items():
                register_backend(member, path)
            for member, path in {AttentionBackendEnum.TREE_ATTN: "vllm_npu.attention.impls.Missing"}.items():
                register_backend(member, path)
    '''))
    d = discover(root, CFG)
    got = [(r.name, r.class_path.rsplit(".", 1)[1], r.location.line, r.resolved) for r in d.registrations]
    assert got == [("FLASH_ATTN", "FastBackend", 4, True), ("TRITON_ATTN", "SlowBackend", 5, True),
                   ("TREE_ATTN", "Missing", 12, False)]
    assert [f.rule for f in registration_findings(d)] == ["MXA010"]  # the dangling entry, not the loop


def test_trace_takes_the_config_file_of_a_port_that_has_none(tmp_path: Path) -> None:
    import subprocess

    from typer.testing import CliRunner

    from metax_audit.cli import app

    repo = tmp_path / "repo"
    shutil.copytree(FIXTURE / "port", repo)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    r = CliRunner().invoke(app, ["trace", "NpuSparseMLABackend", "--staged", "--repo", str(repo),
                                 "--config", str(FIXTURE / "metax-audit.yaml")])
    assert r.exit_code == 0, r.output
    assert "selected when" in r.output and "attn_selector_config.use_sparse" in r.output
    assert "vllm_npu/platform.py" in r.output
