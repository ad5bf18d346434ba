# Fixtures and helpers shared by the test modules: writing small source trees from strings, running
# git in a throwaway repo, and an isolated metax-audit cache (so no test reads or fills the user's).
from __future__ import annotations

import hashlib
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from hypothesis import settings as _hypothesis_settings

# CI runs the property suites on examples derived from each test (derandomized): a gate must not go red on
# the luck of a draw; a developer's run draws fresh examples and finds what CI then pins with @example.
_hypothesis_settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    _hypothesis_settings.load_profile("ci")

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"]


def write_tree(root: Path, files: dict[str, str]) -> Path:
    """Write {relative path: source} under root (each source dedented), creating folders; returns root."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return root


def git(repo: Path, *args: str) -> str:
    """Run git in repo with a fixed identity and no signing; returns stdout, raises on failure."""
    return subprocess.run([*GIT, "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def fingerprint(repo: Path) -> dict[str, str]:
    """status, index bytes and every worktree file's bytes (excluding .git internals but the index)."""
    out = {"status": git(repo, "status", "--porcelain=v1", "--untracked-files=all")}
    out["index"] = hashlib.sha256((repo / ".git" / "index").read_bytes()).hexdigest() if (repo / ".git" / "index").exists() else ""
    for p in sorted(repo.rglob("*")):
        if ".git" in p.relative_to(repo).parts:
            continue
        if p.is_symlink():
            out[str(p)] = "link:" + os.readlink(p)
        elif p.is_file():
            out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    heads = subprocess.run(["git", "-C", str(repo), "for-each-ref"], capture_output=True, text=True).stdout
    out["refs"] = heads
    out["worktrees"] = str(sorted((repo / ".git").glob("worktrees/*")))
    return out


@pytest.fixture
def audit_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh METAX_AUDIT_CACHE for this test (stack facts, upstream sources, per-file results)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("METAX_AUDIT_CACHE", str(cache))
    return cache


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test gets an empty METAX_AUDIT_CACHE unless it asks for `audit_cache`: the result cache
    must never serve one test (or the user's last review) to another, and reviews with default
    output directories must not write into the user's ~/.cache."""
    monkeypatch.setenv("METAX_AUDIT_CACHE", str(tmp_path_factory.mktemp("cache")))
