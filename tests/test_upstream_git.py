# `--upstream PATH@REV`: a git clone of upstream read at a revision with git archive (nothing checked
# out, the clone untouched), cached by commit, the commit recorded; its C++ sources give the op names.
from __future__ import annotations

from pathlib import Path

import pytest
from conftest import fingerprint, git, write_tree

from metax_audit.core.errors import UpstreamError
from metax_audit.stages.checks.op_table import upstream_cpp_ops
from metax_audit.stages.upstream import resolve_upstream


@pytest.fixture
def clone(tmp_path: Path) -> tuple[Path, str, str]:
    repo = tmp_path / "vllm-src"
    repo.mkdir()
    git(repo, "init", "-q")
    write_tree(repo, {"vllm/__init__.py": "", "vllm/attn.py": "def f(a): ...\n", "docs/x.md": "doc\n",
                      "csrc/torch_bindings.cpp": 'TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {\n  ops.def("rms_norm(Tensor x) -> ()");\n}\n'})
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    first = git(repo, "rev-parse", "HEAD").strip()
    write_tree(repo, {"vllm/attn.py": "def f(a, b): ...\n"})
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-am", "two")
    git(repo, "tag", "v9.0")
    (repo / "vllm/attn.py").write_text("uncommitted\n")  # a dirty work tree is not what REV means
    return repo, first, git(repo, "rev-parse", "HEAD").strip()


def test_path_at_rev_reads_the_commit_not_the_work_tree(tmp_path: Path, clone: tuple[Path, str, str]) -> None:
    repo, first, second = clone
    before = fingerprint(repo)
    old = resolve_upstream(f"{repo}@{first}", cache_dir=tmp_path / "cache")
    new = resolve_upstream(f"{repo}@v9.0", cache_dir=tmp_path / "cache")
    assert (old.root / "vllm/attn.py").read_text() == "def f(a): ...\n"
    assert (new.root / "vllm/attn.py").read_text() == "def f(a, b): ...\n"
    assert new.source == f"git:{repo.resolve()}@v9.0 (commit {second})" and new.version == "v9.0"
    assert old.version == first[:7] or old.version.startswith(first[:7])  # no tag: git describe --always
    assert not (new.root / "docs").exists() and (new.root / "csrc/torch_bindings.cpp").is_file()
    assert fingerprint(repo) == before  # index, work tree and refs untouched
    names, note = upstream_cpp_ops(new.root)
    assert names == frozenset({"rms_norm"}) and "C++ sources" in note


def test_path_at_rev_is_cached_by_commit(tmp_path: Path, clone: tuple[Path, str, str]) -> None:
    repo, _, second = clone
    info = resolve_upstream(f"{repo}@HEAD", cache_dir=tmp_path / "cache")
    assert info.root == tmp_path / "cache" / "upstream" / f"git-{second}"
    (info.root / "vllm" / "marker.py").write_text("")
    assert (resolve_upstream(f"{repo}@v9.0", cache_dir=tmp_path / "cache").root / "vllm" / "marker.py").is_file()


@pytest.mark.parametrize(("spec", "message"), [
    ("{repo}@no-such-rev", "unknown revision 'no-such-rev'"),
    ("{plain}@HEAD", "is not a git repository"),
])
def test_bad_path_at_rev_is_one_line(tmp_path: Path, clone: tuple[Path, str, str], spec: str, message: str) -> None:
    (tmp_path / "plain").mkdir()
    with pytest.raises(UpstreamError, match=message):
        resolve_upstream(spec.format(repo=clone[0], plain=tmp_path / "plain"), cache_dir=tmp_path / "cache")
