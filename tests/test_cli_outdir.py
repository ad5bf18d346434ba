# The default output directory is under the metax-audit cache, per repository, never inside the
# audited checkout; its summary.md path is the first line of output; writability is checked first.
from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from metax_audit.cli import app

runner = CliRunner()


@pytest.fixture
def demo_repo(tmp_path: Path) -> Path:
    from metax_audit import demo as demo_mod

    return demo_mod.build_demo_repo(tmp_path / "port")


def _args(repo: Path) -> list[str]:
    from metax_audit import demo as demo_mod

    return ["review", "--staged", "--repo", str(repo), "--upstream", str(demo_mod.upstream_root()), "--fail-on", "never"]


def test_default_output_dir_is_outside_the_checkout(demo_repo: Path, audit_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from metax_audit import demo as demo_mod

    monkeypatch.chdir(demo_repo / "vllm_metax")  # run from inside the package, as a maintainer might
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(demo_mod.stack_root()), os.environ.get("PYTHONPATH", "")]))
    r = runner.invoke(app, _args(demo_repo))
    assert r.exit_code == 0, r.output
    first = r.output.splitlines()[0]
    assert first.startswith("reports: ") and first.endswith("summary.md")
    summary = Path(first.removeprefix("reports: "))
    assert summary.is_file() and audit_cache in summary.parents
    assert demo_repo not in summary.parents and not list(demo_repo.rglob("summary.md"))
    assert summary.parent.name == "staged" and summary.parent.parent.name.startswith("port-")


def test_unwritable_output_dir_fails_before_the_review(demo_repo: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    r = runner.invoke(app, [*_args(demo_repo), "--output-dir", str(blocker / "out")])
    assert r.exit_code == 2
    assert "is not writable" in r.output and "Traceback" not in r.output
    assert "metax-audit review" not in r.output  # nothing ran
