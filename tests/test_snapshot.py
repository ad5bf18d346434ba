# Snapshots see exactly their mode's content and never write to the user's repository,
# including when the run is interrupted inside the context manager.
from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import fingerprint, git

from metax_audit.core.errors import SnapshotError
from metax_audit.stages.snapshot import default_mode, run_test_command, snapshot


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "port repo"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    (r / "pkg").mkdir()
    (r / "pkg" / "a.py").write_text("A = 'committed'\n")
    (r / "pkg" / "gone.py").write_text("G = 1\n")
    (r / "pkg" / "spaced name.py").write_text("S = 1\n")
    (r / "pkg" / "ünïcode.py").write_text("U = 1\n")
    os.symlink("a.py", r / "pkg" / "link.py")
    git(r, "add", "-A")
    git(r, "commit", "-q", "-m", "one")
    # staged change, then a different unstaged change on top, an untracked file, a staged deletion
    (r / "pkg" / "a.py").write_text("A = 'staged'\n")
    git(r, "add", "pkg/a.py")
    (r / "pkg" / "a.py").write_text("A = 'unstaged'\n")
    (r / "pkg" / "new.py").write_text("N = 'untracked'\n")
    git(r, "rm", "-q", "pkg/gone.py")
    (r / ".gitignore").write_text("ignored.py\n")
    (r / "ignored.py").write_text("I = 1\n")
    return r


@pytest.mark.parametrize(
    ("mode", "rev", "a_value", "has_new", "has_gone"),
    [
        ("staged", None, "staged", False, False),
        ("worktree", None, "unstaged", True, False),
        ("rev", "HEAD", "committed", False, True),
    ],
)
def test_each_mode_sees_exactly_its_content(repo: Path, mode: str, rev: str | None, a_value: str, has_new: bool, has_gone: bool) -> None:
    before = fingerprint(repo)
    with snapshot(mode, repo, rev) as snap:
        root = snap.root
        assert (root / "pkg" / "a.py").read_text() == f"A = '{a_value}'\n"
        assert (root / "pkg" / "new.py").exists() is has_new
        assert (root / "pkg" / "gone.py").exists() is has_gone
        assert not (root / "ignored.py").exists()
        assert (root / "pkg" / "spaced name.py").exists()
        assert (root / "pkg" / "ünïcode.py").exists()
        assert (root / "pkg" / "link.py").is_symlink()
        assert snap.mode == mode
        assert snap.commit and len(snap.commit) == 40
        assert str(root) not in snap.repo
    assert not root.exists()
    assert fingerprint(repo) == before


def test_interrupted_run_cleans_up_and_leaves_repo_untouched(repo: Path) -> None:
    before = fingerprint(repo)
    seen: list[Path] = []
    with pytest.raises(KeyboardInterrupt), snapshot("staged", repo) as snap:
        seen.append(snap.root)
        raise KeyboardInterrupt
    assert seen and not seen[0].exists()
    assert fingerprint(repo) == before


def test_errors_are_snapshot_errors(tmp_path: Path, repo: Path) -> None:
    with pytest.raises(SnapshotError, match="not inside a git repository"), snapshot("worktree", tmp_path):
        pass
    with pytest.raises(SnapshotError, match="unknown revision"), snapshot("rev", repo, "no-such-tag"):
        pass
    empty = tmp_path / "empty"
    empty.mkdir()
    git(empty, "init", "-q")
    with pytest.raises(SnapshotError, match="index is empty"), snapshot("staged", empty):
        pass
    with pytest.raises(SnapshotError, match="no commits"), snapshot("rev", empty, "HEAD"):
        pass


def test_repo_without_commits_can_be_reviewed_staged(tmp_path: Path) -> None:
    r = tmp_path / "fresh"
    r.mkdir()
    git(r, "init", "-q")
    (r / "x.py").write_text("X = 1\n")
    git(r, "add", "x.py")
    assert default_mode(r)[0] == "staged"
    with snapshot("staged", r) as snap:
        assert snap.commit is None
        assert (snap.root / "x.py").read_text() == "X = 1\n"


def test_default_mode_falls_back_to_head_with_a_note(tmp_path: Path) -> None:
    r = tmp_path / "clean"
    r.mkdir()
    git(r, "init", "-q")
    (r / "x.py").write_text("X = 1\n")
    git(r, "add", "x.py")
    git(r, "commit", "-q", "-m", "x")
    mode, rev, note = default_mode(r)
    assert (mode, rev) == ("rev", "HEAD") and "nothing is staged" in note


def test_submodule_is_recorded_not_followed(tmp_path: Path) -> None:
    sub = tmp_path / "sub"
    sub.mkdir()
    git(sub, "init", "-q")
    (sub / "s.py").write_text("S = 1\n")
    git(sub, "add", "s.py")
    git(sub, "commit", "-q", "-m", "s")
    top = tmp_path / "top"
    top.mkdir()
    git(top, "init", "-q")
    (top / "t.py").write_text("T = 1\n")
    git(top, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(sub), "vendor/sub")
    git(top, "add", "-A")
    git(top, "commit", "-q", "-m", "t")
    for mode, rev in (("staged", None), ("worktree", None), ("rev", "HEAD")):
        with snapshot(mode, top, rev) as snap:
            assert (snap.root / "t.py").exists()
            assert not (snap.root / "vendor" / "sub" / "s.py").exists()
            assert any("vendor/sub" in n for n in snap.notes), (mode, snap.notes)


def test_test_command_runs_against_the_snapshot_not_the_worktree(repo: Path) -> None:
    with snapshot("staged", repo) as snap:
        run = run_test_command("python -c \"import pkg.a as m; print(m.A)\"", snap.root)
        assert run.exit_code == 0 and "staged" in run.output_tail and "unstaged" not in run.output_tail
        missing = run_test_command("python -c 'import pkg.new'", snap.root)
        assert missing.exit_code != 0  # the untracked module must not satisfy the import


def test_installed_distribution_is_located_without_importing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    pkg = site / "fakeport"
    pkg.mkdir(parents=True)
    # importing the package would fail loudly: the snapshot must only copy it
    (pkg / "__init__.py").write_text("raise RuntimeError('imported!')\n")
    (pkg / "platform.py").write_text("P = 1\n")
    dist = site / "fakeport-1.2.3+metax3.8.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fakeport\nVersion: 1.2.3+metax3.8\n")
    (dist / "WHEEL").write_text("Wheel-Version: 1.0\nTag: cp311-cp311-linux_x86_64\n")
    (dist / "top_level.txt").write_text("fakeport\n")
    (dist / "RECORD").write_text(
        "fakeport/__init__.py,,\nfakeport/platform.py,,\nfakeport-1.2.3+metax3.8.dist-info/WHEEL,,\n"
        "fakeport-1.2.3+metax3.8.dist-info/METADATA,,\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(site))
    with snapshot("installed", package="fakeport") as snap:
        assert (snap.root / "fakeport" / "platform.py").read_text() == "P = 1\n"
        assert "1.2.3+metax3.8" in snap.label and "cp311-cp311-linux_x86_64" in snap.label
    with pytest.raises(SnapshotError, match="no installed distribution"), snapshot("installed", package="nosuchport_xyz"):
        pass


@pytest.mark.parametrize(("mode", "rev"), [("staged", None), ("worktree", None), ("rev", "HEAD")])
def test_only_limits_the_export_to_named_top_level_paths(repo: Path, mode: str, rev: str | None) -> None:
    (repo / "other").mkdir()
    (repo / "other" / "o.py").write_text("O = 1\n")
    git(repo, "add", "other/o.py")
    if mode == "rev":
        git(repo, "commit", "-q", "-m", "other")
    with snapshot(mode, repo, rev, only=("pkg", "missing.yaml")) as snap:
        assert (snap.root / "pkg" / "a.py").exists()
        assert not (snap.root / "other").exists()


@pytest.mark.parametrize(("mode", "rev"), [("staged", None), ("worktree", None), ("rev", "HEAD")])
def test_a_static_export_holds_the_packages_python_sources_and_every_file_of_the_rest(repo: Path, mode: str,
                                                                                     rev: str | None) -> None:
    from metax_audit.stages.snapshot import static_export

    files = {"pkg/configs/E=8,N=64.json": "{}\n", "pkg/stubs.pyi": "X: int\n", "pkg/README.md": "# pkg\n",
             "csrc/ops.cu": "// op\n", "csrc/registry.json": "{}\n", "requirements/vendor.txt": "flashinfer==0.2.6\n"}
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "add", *files)
    if mode == "rev":
        git(repo, "commit", "-q", "-m", "data files")
    with snapshot(mode, repo, rev, only=static_export("pkg")) as snap:
        assert (snap.root / "pkg" / "a.py").exists() and (snap.root / "pkg" / "stubs.pyi").exists()
        assert not (snap.root / "pkg" / "configs").exists() and not (snap.root / "pkg" / "README.md").exists()
        # native sources and stack pins are exported whole: the op-registration scan reads them by its own suffixes
        assert (snap.root / "csrc" / "ops.cu").exists() and (snap.root / "csrc" / "registry.json").exists()
        assert (snap.root / "requirements" / "vendor.txt").exists()
