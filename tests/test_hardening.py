# Hardening, round 2 (issue 31): what the audited repository configures never runs, deep trees and
# leftovers never break a run, closed streams keep the exit code, FIFOs never hang, names never break
# a report, bad input and hostile output dirs are one line and exit 2. Each test names its attack.
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import git

from metax_audit import demo

PROJECT = Path(__file__).resolve().parents[1]


def run_tool(cwd: Path, *args: str, env: dict[str, str] | None = None, **kw: object) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(PROJECT), "CI": "1", "COLUMNS": "500", **(env or {})}
    full.pop("PYTHONSAFEPATH", None)
    return subprocess.run([sys.executable, "-m", "metax_audit", *args], cwd=cwd, env=full,  # type: ignore[call-overload]
                          capture_output=True, text=True, timeout=300, **kw)


def review_args(out: Path, *extra: str) -> list[str]:
    return ["review", "--upstream", str(demo.upstream_root()), "--output-dir", str(out), "--format", "json,md,sarif",
            "--fail-on", "never", *extra]


def one_line_error(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("metax-audit: error: "), err
    assert "Traceback" not in err and "internal error" not in err, err
    return lines[0]


@pytest.fixture()
def demo_repo(tmp_path: Path) -> Path:
    return demo.build_demo_repo(tmp_path / "port")


# ---------------------------------------------------------------- 1. repo-configured code never runs


def marker_script(tmp_path: Path, name: str) -> tuple[str, Path]:
    """A shell command that touches <markers>/<name> and passes stdin through (a filter must)."""
    markers = tmp_path / "markers"
    markers.mkdir(exist_ok=True)
    script = tmp_path / f"run-{name}.sh"
    script.write_text(f"#!/bin/sh\ntouch '{markers}/{name}'\ncat\n")
    script.chmod(0o755)
    return str(script), markers


def arm(repo: Path, tmp_path: Path, mechanism: str) -> Path:
    """Configure `mechanism` in the demo repo so that git would run a marker-writing command; the
    attributes naming a driver are committed (the revision review reads them) and staged."""
    cmd, markers = marker_script(tmp_path, mechanism)
    if mechanism in ("filter", "textconv", "extdiff"):
        attr = {"filter": "filter=evil", "textconv": "diff=evil", "extdiff": "diff=evil"}[mechanism]
        (repo / ".gitattributes").write_text(f"*.py {attr}\n*.txt {attr}\n")
        git(repo, "add", ".gitattributes")
        git(repo, "commit", "-q", "-m", "attributes", "--", ".gitattributes")
    if mechanism == "fsmonitor":
        git(repo, "config", "core.fsmonitor", cmd)
    elif mechanism == "filter":
        for var in ("clean", "smudge"):
            git(repo, "config", f"filter.evil.{var}", cmd)
        git(repo, "config", "filter.evil.required", "true")
    elif mechanism == "filter-process":
        (repo / ".gitattributes").write_text("*.py filter=proc\n")
        git(repo, "add", ".gitattributes")
        git(repo, "commit", "-q", "-m", "attributes", "--", ".gitattributes")
        git(repo, "config", "filter.proc.process", cmd)
        git(repo, "config", "filter.proc.required", "true")
    elif mechanism == "textconv":
        git(repo, "config", "diff.evil.textconv", cmd)
    elif mechanism == "extdiff":
        git(repo, "config", "diff.external", cmd)
        git(repo, "config", "diff.evil.command", cmd)
    elif mechanism == "hooks":
        hooks = tmp_path / "hooks"
        hooks.mkdir()
        for name in ("post-checkout", "post-index-change", "reference-transaction", "pre-auto-gc", "post-merge",
                     "pre-commit", "post-rewrite", "fsmonitor-watchman"):
            for where in (hooks, repo / ".git" / "hooks"):
                (where / name).write_text(f"#!/bin/sh\ntouch '{markers}/hook-{name}'\n")
                (where / name).chmod(0o755)
        git(repo, "config", "core.hooksPath", str(hooks))
    elif mechanism == "pager-ssh-askpass":
        for key in ("core.pager", "core.sshCommand", "core.askPass", "credential.helper", "gpg.program",
                    "core.editor", "sequence.editor"):
            git(repo, "config", key, cmd)
    # every entry racily clean: git compares contents (running a clean filter) instead of trusting stat
    os.utime(repo / ".git" / "index", (1, 1))
    return markers


MECHANISMS = ["fsmonitor", "filter", "filter-process", "textconv", "extdiff", "hooks", "pager-ssh-askpass"]


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_nothing_the_audited_repo_configures_runs(tmp_path: Path, demo_repo: Path, mechanism: str) -> None:
    markers = arm(demo_repo, tmp_path, mechanism)
    for mode in (["--staged"], ["--worktree"], ["--rev", "HEAD"], ["--rev", "HEAD", "--merge-base", "main"]):
        r = run_tool(demo_repo, *review_args(tmp_path / "out", *mode))
        assert r.returncode == 0, (mode, r.stderr)
        assert sorted(p.name for p in markers.iterdir()) == [], (mechanism, mode)


def test_an_upstream_clone_s_filter_never_runs(tmp_path: Path, demo_repo: Path) -> None:
    import shutil

    clone = tmp_path / "vllm-clone"
    shutil.copytree(demo.upstream_root(), clone)
    (clone / ".gitattributes").write_text("*.py filter=evil\n")
    git(clone, "init", "-q", "-b", "main")
    git(clone, "add", "-A")
    git(clone, "commit", "-q", "-m", "upstream")
    cmd, markers = marker_script(tmp_path, "upstream-smudge")
    git(clone, "config", "filter.evil.smudge", cmd)
    git(clone, "config", "filter.evil.required", "true")
    r = run_tool(demo_repo, "review", "--upstream", f"{clone}@HEAD", "--output-dir", str(tmp_path / "out"),
                 "--format", "json", "--fail-on", "never")
    assert r.returncode == 0, r.stderr
    assert list(markers.iterdir()) == []


def test_every_git_command_goes_through_the_wrapper() -> None:
    """No module but gitcmd starts git itself (a new call site would miss the safe flags)."""
    offenders = []
    for path in (PROJECT / "metax_audit").rglob("*.py"):
        if path.name == "gitcmd.py":
            continue
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"""\[\s*["']git["']\s*,""", text):
            offenders.append(f"{path.relative_to(PROJECT)}:{text.count(chr(10), 0, m.start()) + 1}")
        if re.search(r"^\s*(import git\b|from git import)", text, re.M):
            offenders.append(f"{path.relative_to(PROJECT)}: GitPython")
    assert offenders == []
