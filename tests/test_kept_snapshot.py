# The snapshot of `--staged` kept in the cache dir between reviews: after any change of the index it
# holds exactly what a fresh export holds, a concurrent review exports afresh, a file written into it
# is repaired, a run killed mid-update is rebuilt, and the user's repository is never written.
from __future__ import annotations

import fcntl
import marshal
import os
import stat
import time
from pathlib import Path

import pytest
from conftest import fingerprint, git, write_tree

from metax_audit.cache import kept_snapshot, resultcache
from metax_audit.core import gitcmd, subproc
from metax_audit.stages import snapshot as snapshot_mod
from metax_audit.stages.snapshot import snapshot

ONLY = ("pkg", "pyproject.toml")


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "port"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    write_tree(r, {
        "pkg/__init__.py": "",
        "pkg/a.py": "A = 1\n",
        "pkg/sub/b.py": "B = 2\n",
        "pkg/sub/deep/c.py": "C = 3\n",
        "pkg/data.txt": "some data\r\nwith a CR\n",
        "pyproject.toml": "[project]\nname = 'pkg'\n",
        "docs/outside.md": "not exported\n",
    })
    git(r, "add", "-A")
    git(r, "commit", "-q", "-m", "one")
    return r


def contents(root: Path) -> dict[str, object]:
    """Every entry under root: a file's bytes and executable bit, a link's target, a directory."""
    out: dict[str, object] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(full))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = "dir"
            else:
                out[rel] = (full.read_bytes(), bool(st.st_mode & stat.S_IXUSR))
    return out


def kept_root(repo: Path, mode: str = "staged") -> Path:
    return kept_snapshot.store_dir(repo.resolve(), "index" if mode == "staged" else mode) / "tree"


def manifest_key(repo: Path, path: str) -> object:
    with open(kept_snapshot.store_dir(repo.resolve(), "worktree") / "manifest", "rb") as fh:
        return marshal.load(fh)[2][path][0]


def review_both(repo: Path, only: tuple[str, ...] = ONLY, mode: str = "staged") -> tuple[Path, dict[str, object]]:
    """The kept snapshot's root and contents, checked against a fresh export of the same index
    (same files, bytes, modes, notes, count; the kept digest is tree_digest's)."""
    before = fingerprint(repo)
    with snapshot(mode, repo, only=only) as fresh:  # type: ignore[arg-type]
        want = contents(fresh.root)
        fresh_info = (fresh.files, fresh.notes, fresh.dirty, fresh.commit)
    with snapshot(mode, repo, only=only, keep=kept_snapshot.KEPT_TREES) as kept:  # type: ignore[arg-type]
        got = contents(kept.root)
        assert (kept.files, kept.notes, kept.dirty, kept.commit) == fresh_info
        digest = snapshot_mod.known_digest(kept.root)
        if kept.root == kept_root(repo, mode):
            assert digest == resultcache.tree_digest(kept.root)
        else:
            assert digest is None
        root = kept.root
    assert got == want
    assert fingerprint(repo) == before
    return root, got


def test_kept_snapshot_follows_adds_edits_deletes_modes_and_renames(repo: Path) -> None:
    root, got = review_both(repo)
    assert root == kept_root(repo) and "pkg/sub/deep/c.py" in got and "docs/outside.md" not in got
    stamp = os.stat(root / "pkg" / "sub" / "b.py").st_ctime_ns
    (repo / "pkg" / "a.py").write_text("A = 'edited'\n")
    (repo / "pkg" / "new.py").write_text("N = 1\n")
    git(repo, "rm", "-q", "pkg/sub/deep/c.py")
    git(repo, "add", "-A")
    git(repo, "update-index", "--chmod=+x", "pkg/__init__.py")
    root, got = review_both(repo)
    assert root == kept_root(repo)
    assert got["pkg/a.py"] == (b"A = 'edited'\n", False) and got["pkg/__init__.py"] == (b"", True)
    assert "pkg/sub/deep" not in got  # the emptied directory went with its last file
    assert os.stat(root / "pkg" / "sub" / "b.py").st_ctime_ns == stamp  # unchanged files are not rewritten
    # a file becomes a directory of the same name and a directory becomes a file
    git(repo, "mv", "pkg/new.py", "pkg/tmp.py")
    git(repo, "mv", "pkg/sub", "pkg/new.py")
    git(repo, "mv", "pkg/tmp.py", "pkg/sub")
    root, got = review_both(repo)
    assert got["pkg/sub"] == (b"N = 1\n", False) and got["pkg/new.py"] == "dir"
    # the selection changes: what it no longer names goes, what it newly names comes
    root, got = review_both(repo, ("pkg/new.py", "docs"))
    assert set(got) == {"pkg", "pkg/new.py", "pkg/new.py/b.py", "docs", "docs/outside.md"}
    review_both(repo)


def test_kept_worktree_snapshot_follows_the_worktree(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    time.sleep(0.06)  # the fixture's files are older than RACY_NS when first copied
    root, got = review_both(repo, mode="worktree")
    assert root == kept_root(repo, "worktree") and "pkg/sub/deep/c.py" in got
    stamp = os.stat(root / "pkg" / "sub" / "b.py").st_ctime_ns
    (repo / "pkg" / "a.py").write_text("A = 'unstaged'\n")
    (repo / "pkg" / "untracked.py").write_text("U = 1\n")
    (repo / ".gitignore").write_text("pkg/ignored.py\n")
    (repo / "pkg" / "ignored.py").write_text("I = 1\n")
    (repo / "pkg" / "sub" / "deep" / "c.py").unlink()
    os.chmod(repo / "pkg" / "data.txt", 0o600)
    root, got = review_both(repo, mode="worktree")
    assert got["pkg/data.txt"] == (b"some data\r\nwith a CR\n", False)
    assert stat.S_IMODE(os.stat(root / "pkg" / "data.txt").st_mode) == 0o600
    assert root == kept_root(repo, "worktree")
    assert got["pkg/a.py"] == (b"A = 'unstaged'\n", False) and "pkg/untracked.py" in got
    assert "pkg/ignored.py" not in got and "pkg/sub/deep" not in got
    assert os.stat(root / "pkg" / "sub" / "b.py").st_ctime_ns == stamp
    # a file changed too close to its copy for its stat to tell is copied again next time
    assert manifest_key(repo, "pkg/sub/b.py") is not None
    racy_ns = kept_snapshot.RACY_NS
    monkeypatch.setattr(kept_snapshot, "RACY_NS", 10**18)
    os.utime(repo / "pkg" / "sub" / "b.py")
    review_both(repo, mode="worktree")
    assert manifest_key(repo, "pkg/sub/b.py") is None
    monkeypatch.setattr(kept_snapshot, "RACY_NS", racy_ns)
    time.sleep(0.06)
    review_both(repo, mode="worktree")
    assert manifest_key(repo, "pkg/sub/b.py") == kept_snapshot._source_key(os.lstat(repo / "pkg" / "sub" / "b.py"))
    # a directory replaced by a symlink, a symlinked file: exported afresh, with the fresh export's notes
    os.rename(repo / "pkg" / "sub", repo / "elsewhere")
    os.symlink("../elsewhere", repo / "pkg" / "sub")
    root, got = review_both(repo, mode="worktree")
    assert root != kept_root(repo, "worktree")
    (repo / "pkg" / "sub").unlink()
    os.rename(repo / "elsewhere", repo / "pkg" / "sub")
    assert review_both(repo, mode="worktree")[0] == kept_root(repo, "worktree")
    # staged and worktree snapshots are kept apart
    assert review_both(repo)[0] == kept_root(repo) != kept_root(repo, "worktree")


def test_a_concurrent_review_exports_afresh(repo: Path) -> None:
    review_both(repo)
    with snapshot("staged", repo, only=ONLY, keep=kept_snapshot.KEPT_TREES) as first:
        assert first.root == kept_root(repo)
        with snapshot("staged", repo, only=ONLY, keep=kept_snapshot.KEPT_TREES) as second:
            assert second.root != first.root and second.root.name.startswith("metax-audit-snap-")
            assert snapshot_mod.known_digest(second.root) is None
            assert contents(second.root) == contents(first.root)
    # a lock held by another process too
    fd = os.open(kept_snapshot.store_dir(repo.resolve()) / "lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        root, _ = review_both(repo)
        assert root != kept_root(repo)
    finally:
        os.close(fd)
    assert review_both(repo)[0] == kept_root(repo)


def test_what_is_written_into_the_kept_snapshot_is_repaired(repo: Path) -> None:
    root, want = review_both(repo)
    (root / "pkg" / "__pycache__").mkdir()
    (root / "pkg" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"junk")
    (root / ".pytest_cache").mkdir()
    (root / "pkg" / "stray.py").write_text("X = 1\n")
    os.symlink("/etc/passwd", root / "pkg" / "link.py")
    # an edit of the same size with the recorded mtime put back: ctime still moves
    st = os.stat(root / "pkg" / "a.py")
    (root / "pkg" / "a.py").write_text("A = 9\n")
    os.utime(root / "pkg" / "a.py", ns=(st.st_atime_ns, st.st_mtime_ns))
    os.chmod(root / "pkg" / "sub" / "b.py", 0o755)
    (root / "pkg" / "sub" / "deep" / "c.py").unlink()
    (root / "pkg" / "data.txt").unlink()
    (root / "pkg" / "data.txt").mkdir()
    assert review_both(repo) == (root, want)


def test_a_run_killed_mid_update_is_rebuilt(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = review_both(repo)
    (repo / "pkg" / "a.py").write_text("A = 'second'\n")
    git(repo, "add", "-A")
    real = gitcmd.write_blobs

    def killed(repo_: Path, dest: Path, *args: object, **kw: object) -> int:
        if dest == root:
            os.unlink(root / "pkg" / "sub" / "b.py")  # the update got this far
            raise KeyboardInterrupt
        return real(repo_, dest, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(gitcmd, "write_blobs", killed)
    with pytest.raises(KeyboardInterrupt), snapshot("staged", repo, only=ONLY, keep=kept_snapshot.KEPT_TREES):
        pass
    monkeypatch.setattr(gitcmd, "write_blobs", real)
    assert not (root.parent / "manifest").exists()
    again, got = review_both(repo)
    assert again == root and got["pkg/a.py"] == (b"A = 'second'\n", False) and "pkg/sub/b.py" in got


def test_unusual_trees_are_exported_afresh(repo: Path) -> None:
    os.symlink("a.py", repo / "pkg" / "link.py")
    os.symlink("/etc/hostname", repo / "pkg" / "out.py")
    git(repo, "add", "-A")
    root, got = review_both(repo)
    assert root != kept_root(repo) and got["pkg/link.py"] == ("link", "a.py") and "pkg/out.py" not in got
    git(repo, "rm", "-q", "-f", "pkg/link.py", "pkg/out.py")
    assert review_both(repo)[0] == kept_root(repo)
    # an attribute that would convert the bytes on checkout never applies: blobs are exported raw
    # (gitcmd: no filter or eol conversion of the repo runs), so the tree is kept, with the blob's bytes
    (repo / ".gitattributes").write_text("*.txt text eol=crlf\n")
    (repo / "pkg" / "data.txt").write_text("line one\nline two\n")
    git(repo, "add", "-A")
    root, got = review_both(repo)
    assert root == kept_root(repo) and got["pkg/data.txt"] == (b"line one\nline two\n", False)
    (repo / ".gitattributes").write_text("*.txt -text\n")
    root, got = review_both(repo)
    assert got["pkg/data.txt"] == (b"line one\nline two\n", False)


def test_a_staged_review_asks_git_little(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    review_both(repo)
    calls: list[str] = []
    real = subproc.run

    def counted(args: list[str], **kw: object) -> subproc.Completed:
        if args[0] == "git":
            at = args.index("-C") + 2
            calls.append(" ".join(args[at:at + 2]))
        return real(args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(subproc, "run", counted)
    with snapshot_mod.remembered_git():
        snapshot_mod.find_repo(repo)
        with snapshot("staged", repo, only=ONLY, keep=kept_snapshot.KEPT_TREES):
            pass
        assert snapshot_mod.resolve_commit(repo.resolve(), "HEAD") == git(repo, "rev-parse", "HEAD").strip()
    assert calls == ["rev-parse --show-toplevel", "ls-files -z", "diff-index -z"]  # -z: dirty and staged from one call
    # outside one review nothing is remembered: a new commit is seen
    git(repo, "commit", "-q", "--allow-empty", "-m", "two")
    assert snapshot_mod.head_commit(repo.resolve()) == git(repo, "rev-parse", "HEAD").strip()
