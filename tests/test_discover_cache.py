# discover with the result cache: what it reads from single files (the compiler's verdict, the
# registrations, the imports, the platform's priorities and switches) is kept under each file's text;
# an edited file is read again, an unchanged one is not, and the answer always equals discovering afresh.
from __future__ import annotations

import ast
import shutil
import sys
from pathlib import Path

import pytest

from metax_audit.cache.memo import review_memo
from metax_audit.core import pysource
from metax_audit.core.config import AuditConfig
from metax_audit.core.pysource import find_module, module_name, resolve_relative
from metax_audit.demo import port_root
from metax_audit.stages.discover import coverage_findings, discover, registrations, scope, stage

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
    count(scope._Sources, "_parse_status", "parsed", lambda sources, rel: rel)
    count(registrations, "_visited", "registrations", lambda src: src.path)
    count(registrations, "_bindings", "bindings", lambda tree: "?")
    count(stage, "_priorities", "priorities", lambda src: src.path)
    count(stage, "_switches", "switches", lambda src: src.path)
    return computed


def _discover(root: Path, use_cache: bool) -> tuple[object, list[object]]:
    pysource.clear_source_cache()
    found = discover(root, CFG, memo=review_memo(use_cache))
    return found, list(coverage_findings(found))


def test_cached_discovery_equals_a_fresh_one_and_reads_only_edited_files(port: Path, audit_cache: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    fresh = _discover(port, False)
    assert fresh[0].registrations and fresh[0].priorities and any(fresh[0].callers.values())  # type: ignore[attr-defined]
    computed = _counting(monkeypatch)
    assert _discover(port, True) == fresh
    kinds = {k for k, _ in computed}
    assert kinds == {"imports", "parsed", "compiled", "registrations", "bindings", "priorities", "switches"}
    computed.clear()
    assert _discover(port, True) == fresh and computed == []  # nothing read again
    # an edit: a registration and an import added to one file; only that file is read again
    path = port / FLASHINFER
    path.write_text(path.read_text(encoding="utf-8") + "\nfrom vllm_metax.v1.attention.ops import merge_attn_states\n"
                    "\n@register_backend(AttentionBackendEnum.FLASHINFER, 'vllm_metax.v1.attention.backends.flashinfer.X')\n"
                    "class X:\n    pass\n", encoding="utf-8")
    edited = _discover(port, True)
    assert computed and {f for _, f in computed} <= {FLASHINFER, "?"}
    assert {k for k, _ in computed} == {"imports", "parsed", "registrations", "bindings"}
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


# ------------------------------------------------------------------ the resolver on kept bindings

def _oracle_lookup(sources: scope._Sources, rel: str, qual: list[str], depth: int) -> str | None:
    """The resolver as it read syntax trees before it read kept bindings (the oracle)."""
    def binds(stmt: ast.stmt, name: str) -> bool:
        if isinstance(stmt, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            return stmt.name == name
        if isinstance(stmt, ast.Assign):
            return any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets)
        if isinstance(stmt, ast.AnnAssign):
            return isinstance(stmt.target, ast.Name) and stmt.target.id == name
        return False

    def nested(stmt: ast.stmt, rest: list[str]) -> bool:
        for name in rest:
            if not isinstance(stmt, ast.ClassDef):
                return False
            inner = next((s for s in stmt.body if binds(s, name)), None)
            if inner is None:
                return False
            stmt = inner
        return True

    tree = sources.get(rel).tree
    if tree is None or depth > 8:
        return None
    head, rest = qual[0], qual[1:]
    for stmt in registrations._top_level_bindings(tree.body):
        if binds(stmt, head):
            return rel if nested(stmt, rest) else None
        if isinstance(stmt, ast.ImportFrom):
            for alias in stmt.names:
                if (alias.asname or alias.name) != head or alias.name == "*":
                    continue
                base = resolve_relative(module_name(rel), rel.endswith("__init__.py"), stmt.level, stmt.module)
                sub = find_module(sources.root, f"{base}.{alias.name}")
                if sub is not None and rest:
                    return _oracle_lookup(sources, sub, rest, depth + 1)
                target = find_module(sources.root, base)
                return _oracle_lookup(sources, target, [alias.name, *rest], depth + 1) if target else None
    return None


RESOLVER_TREE = {
    "pkg/__init__.py": "from .a import A as Alias, B\nfrom . import sub\nfrom .missing import Gone\n",
    "pkg/a.py": (
        "import os\n"
        "try:\n    from pkg.b import B\nexcept ImportError:\n    B = None\n"
        "if os.name:\n    class A:\n        x: int = 1\n        class Inner:\n            def run(self): ...\n"
        "        Inner = 3\n        def Inner(self): ...\nelse:\n    A = object\n"
        "C, D = 1, 2\nE: int\nF = G = 5\n"
    ),
    "pkg/b.py": "class B:\n    class Deep:\n        class Deeper:\n            pass\n",
    "pkg/sub/__init__.py": "from pkg.sub.mod import *\nfrom .mod import Klass\n",
    "pkg/sub/mod.py": "class Klass:\n    def method(self): ...\n",
    "pkg/loop.py": "from pkg.loop2 import L\n",
    "pkg/loop2.py": "from pkg.loop import L\n",
    "pkg/bad.py": "def (:\n",
}


def test_the_resolver_on_kept_bindings_answers_like_the_tree_walk(tmp_path: Path, port: Path, audit_cache: Path) -> None:
    from conftest import write_tree

    root = write_tree(tmp_path / "r", RESOLVER_TREE)
    names = ["pkg.Alias", "pkg.Alias.Inner", "pkg.Alias.Inner.run", "pkg.Alias.x", "pkg.Alias.nope", "pkg.B.Deep.Deeper",
             "pkg.B.Deep.nope", "pkg.a.A.Inner.run", "pkg.a.C", "pkg.a.D", "pkg.a.E", "pkg.a.F", "pkg.a.G", "pkg.a.os",
             "pkg.sub.Klass.method", "pkg.sub.mod.Klass", "pkg.Gone", "pkg.loop.L", "pkg.bad.X", "pkg.sub.Klass.method.x"]
    answers = set()
    for tree_root, dotted in [(root, names), (port, [r.class_path for r in discover(port, CFG).registrations])]:
        for use_cache in (False, True, True):
            sources = scope._Sources(tree_root, CFG.max_file_bytes, memo=review_memo(use_cache))
            resolver = registrations._Resolver(sources)
            for name in dotted:
                parts = name.split(".")
                expected = None
                for cut in range(len(parts) - 1, 0, -1):
                    rel = find_module(tree_root, ".".join(parts[:cut]))
                    if rel is not None:
                        expected = _oracle_lookup(sources, rel, parts[cut:], 0)
                        break
                assert resolver.resolve(name) == expected, name
                answers.add(expected)
            sources.save()
    assert {"pkg/a.py", "pkg/b.py", "pkg/sub/mod.py", None} <= answers
