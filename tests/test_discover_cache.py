# discover with the result cache: what it reads from single files (the compiler's verdict, the
# registrations, the imports, the platform's priorities and switches) is kept under each file's text;
# an edited file is read again, an unchanged one is not, and the answer always equals discovering afresh.
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from metax_audit import pysource
from metax_audit.config import AuditConfig
from metax_audit.demo import port_root
from metax_audit.discover import coverage_findings, discover, registrations, scope, stage

CFG = AuditConfig()
FLASHINFER = "vllm_metax/v1/attention/backends/flashinfer.py"


@pytest.fixture
def port(tmp_path: Path) -> Path:
    root = tmp_path / "port"
    shutil.copytree(port_root(), root)
    return root


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every product computed: (kind, file)."""
    computed: list[tuple[str, str]] = []

    def count(module: object, name: str, kind: str, path_of: object) -> None:
        real = getattr(module, name)

        def wrapper(*args: object) -> object:
            computed.append((kind, path_of(*args)))  # type: ignore[operator]
            return real(*args)
        monkeypatch.setattr(module, name, wrapper)

    count(stage, "_import_candidates", "imports", lambda rel, text: rel)
    count(scope, "_compile_status", "compiled", lambda rel, text: rel)
    count(registrations, "_visited", "registrations", lambda src: src.path)
    count(stage, "_priorities", "priorities", lambda src: src.path)
    count(stage, "_switches", "switches", lambda src: src.path)
    return computed


def _discover(root: Path, use_cache: bool) -> tuple[object, list[object]]:
    pysource.clear_source_cache()
    found = discover(root, CFG, use_cache=use_cache)
    return found, list(coverage_findings(found))


def test_cached_discovery_equals_a_fresh_one_and_reads_only_edited_files(port: Path, audit_cache: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    fresh = _discover(port, False)
    assert fresh[0].registrations and fresh[0].priorities and any(fresh[0].callers.values())  # type: ignore[attr-defined]
    computed = _counting(monkeypatch)
    assert _discover(port, True) == fresh
    kinds = {k for k, _ in computed}
    assert kinds == {"imports", "compiled", "registrations", "priorities", "switches"}
    computed.clear()
    assert _discover(port, True) == fresh and computed == []  # nothing read again
    # an edit: a registration and an import added to one file; only that file is read again
    path = port / FLASHINFER
    path.write_text(path.read_text(encoding="utf-8") + "\nfrom vllm_metax.v1.attention.ops import merge_attn_states\n"
                    "\n@register_backend(AttentionBackendEnum.FLASHINFER, 'vllm_metax.v1.attention.backends.flashinfer.X')\n"
                    "class X:\n    pass\n", encoding="utf-8")
    edited = _discover(port, True)
    assert computed and {f for _, f in computed} == {FLASHINFER}
    assert {k for k, _ in computed} == {"imports", "registrations"}
    assert edited == _discover(port, False) and edited != fresh
    computed.clear()
    assert _discover(port, True) == edited and computed == []
    # another interpreter parses by other rules: nothing it kept is served
    monkeypatch.setattr(sys, "version", sys.version + " (another build)")
    assert _discover(port, True) == edited and {k for k, _ in computed} == kinds


def test_a_broken_file_keeps_its_verdict_under_its_text(port: Path, audit_cache: Path) -> None:
    (port / "vllm_metax/v1/attention/backends/broken.py").write_text("def f(:\n    register_backend\n", encoding="utf-8")
    (port / "vllm_metax/v1/attention/backends/bad_return.py").write_text("return 1\n", encoding="utf-8")
    fresh = _discover(port, False)
    assert _discover(port, True) == fresh == _discover(port, True)
    problems = {f.path: f.problem for f in fresh[0].files if f.problem}  # type: ignore[attr-defined]
    assert set(problems) >= {"vllm_metax/v1/attention/backends/broken.py", "vllm_metax/v1/attention/backends/bad_return.py"}
