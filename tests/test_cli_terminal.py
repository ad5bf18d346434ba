# The terminal as people use it: what `review --staged` says and exits with when nothing is staged,
# the width, --quiet and --color of the first screen, --format text, and the `rule`/`rules` pages.
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from metax_audit.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def committed_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo port with everything committed: nothing staged, HEAD has errors."""
    from metax_audit import demo as demo_mod

    repo = demo_mod.build_demo_repo(tmp_path_factory.mktemp("demo") / "port")
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "all"], cwd=repo, check=True)
    return repo


@pytest.fixture
def demo_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    from metax_audit import demo as demo_mod

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(demo_mod.stack_root()), os.environ.get("PYTHONPATH", "")]))


def _review(repo: Path, out: Path, *extra: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    from metax_audit import demo as demo_mod

    return runner.invoke(app, ["review", "--repo", str(repo), "--upstream", str(demo_mod.upstream_root()),
                               "--output-dir", str(out), *extra], env=env)


def test_staged_with_nothing_staged_reviews_head_and_says_so(committed_demo: Path, demo_stack: None, tmp_path: Path) -> None:
    # the pre-commit hook's command line: nothing of HEAD's own is new, so the gate passes (exit 0) ...
    r = _review(committed_demo, tmp_path / "a", "--staged", "--new-only", "--fail-on", "error", "--format", "md")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    note = next(i for i, line in enumerate(lines) if "nothing is staged: the index equals HEAD" in line)
    verdict = next(i for i, line in enumerate(lines) if line.startswith("FAIL: "))
    assert note < verdict  # said before the headline, which is HEAD's own
    assert "exit 0" in r.output  # the gate's line says why a FAIL exits 0
    assert "nothing is staged: the index equals HEAD" in (tmp_path / "a" / "summary.md").read_text(encoding="utf-8")
    # ... and without --new-only HEAD's errors gate as in any review (exit 1, never the 2 of "could not audit")
    r = _review(committed_demo, tmp_path / "b", "--staged", "--fail-on", "error", "--format", "json")
    assert r.exit_code == 1, r.output
    assert "nothing is staged" in r.output


def test_staged_with_something_staged_has_no_such_note(committed_demo: Path, demo_stack: None, tmp_path: Path) -> None:
    from metax_audit.snapshot import snapshot

    with snapshot("staged", repo=committed_demo) as snap:
        assert any("nothing is staged" in n for n in snap.notes)
    (committed_demo / "vllm_metax" / "__init__.py").write_text("# staged\n", encoding="utf-8")
    subprocess.run(["git", "add", "vllm_metax/__init__.py"], cwd=committed_demo, check=True)
    try:
        with snapshot("staged", repo=committed_demo) as snap:
            assert not any("nothing is staged" in n for n in snap.notes)
    finally:
        subprocess.run(["git", "reset", "-q", "--hard"], cwd=committed_demo, check=True)
