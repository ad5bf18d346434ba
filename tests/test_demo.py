# Tests of the bundled demo data (it parses, the stub has the 0.2.x shape) and of the builder
# (a repo whose index, worktree and untracked files differ in the documented ways).
from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import git

from metax_audit.core.errors import AuditError
from metax_audit.demo import build_demo_repo, data_root, port_root, stack_root, upstream_root


def _py_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def test_demo_roots_hold_their_packages() -> None:
    assert (upstream_root() / "vllm" / "v1" / "attention" / "backends" / "registry.py").is_file()
    assert (stack_root() / "flashinfer" / "__init__.py").is_file()
    assert (port_root() / "vllm_metax" / "platform.py").is_file()
    assert upstream_root().parent == stack_root().parent == data_root()


def test_every_demo_file_parses() -> None:
    files = _py_files(data_root())
    assert len(files) >= 20
    for path in files:
        ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def test_port_registers_shapes_the_audit_expects() -> None:
    text = (port_root() / "vllm_metax" / "platform.py").read_text(encoding="utf-8")
    tree = ast.parse(text)
    calls = [n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    assert calls.count("register_backend") == 3
    assert calls.count("register_mla_prefill_backend") == 1
    assert "# AttentionBackendEnum.FLASH_ATTN," in text
    assert "disable_cascade_attn = True" in text


def _import_in_subprocess(code: str, *paths: Path) -> str:
    # A subprocess keeps the demo's `vllm`/`flashinfer` out of this interpreter's sys.modules.
    env_path = ":".join(str(p) for p in paths)
    done = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": env_path, "PYTHONDONTWRITEBYTECODE": "1"}, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_stub_and_port_import_without_torch() -> None:
    code = (
        "import sys, flashinfer, vllm_metax.platform, vllm_metax.v1.attention.backends.flashinfer\n"
        "import vllm.v1.attention.backends.flashinfer\n"
        "print(flashinfer.__version__, 'torch' in sys.modules)\n"
    )
    out = _import_in_subprocess(code, stack_root(), upstream_root(), port_root())
    assert out.split() == ["0.2.6+demo", "False"]


def test_stub_signatures_have_the_flashinfer_02_shape() -> None:
    sys.path.insert(0, str(stack_root()))
    # No bytecode next to the package data: it would be copied into wheels and demo repos.
    saved, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        from flashinfer.decode import BatchDecodeWithPagedKVCacheWrapper
    finally:
        sys.path.remove(str(stack_root()))
        sys.dont_write_bytecode = saved
        for name in [m for m in sys.modules if m == "flashinfer" or m.startswith("flashinfer.")]:
            del sys.modules[name]
    plan = inspect.signature(BatchDecodeWithPagedKVCacheWrapper.plan)
    run = inspect.signature(BatchDecodeWithPagedKVCacheWrapper.run)
    assert "fixed_split_size" not in plan.parameters
    assert not any(p.kind is p.VAR_KEYWORD for p in plan.parameters.values())
    assert run.parameters["return_lse"].kind is inspect.Parameter.KEYWORD_ONLY
    assert any(p.kind is p.VAR_KEYWORD for p in run.parameters.values())


def test_build_demo_repo_has_staged_unstaged_and_untracked(tmp_path: Path) -> None:
    repo = build_demo_repo(tmp_path / "demo")
    status = git(repo, "status", "--porcelain").splitlines()
    assert "MM vllm_metax/v1/attention/backends/flashinfer.py" in status
    assert "?? vllm_metax/v1/attention/ops/lse_utils.py" in status
    assert len(git(repo, "log", "--oneline").splitlines()) == 1

    staged = git(repo, "show", ":vllm_metax/v1/attention/backends/flashinfer.py")
    head = git(repo, "show", "HEAD:vllm_metax/v1/attention/backends/flashinfer.py")
    work = (repo / "vllm_metax/v1/attention/backends/flashinfer.py").read_text(encoding="utf-8")
    bundled = (port_root() / "vllm_metax/v1/attention/backends/flashinfer.py").read_text(encoding="utf-8")
    assert staged == bundled
    assert "_LN2 for x in ctx_lse" in head and "_LN2 for x in ctx_lse" not in staged
    assert "                fixed_split_size=None,\n" in staged
    assert "# fixed_split_size=None," in work and "# fixed_split_size=None," not in staged
    for text in (head, staged, work):
        ast.parse(text)
    assert 'port-package = "vllm_metax"' in (repo / "pyproject.toml").read_text(encoding="utf-8")


def test_build_demo_repo_refuses_a_non_empty_destination(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("x", encoding="utf-8")
    with pytest.raises(AuditError, match="not empty"):
        build_demo_repo(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]
