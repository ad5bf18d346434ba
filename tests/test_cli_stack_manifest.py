# A stack manifest captured where the kernels are installed gives the same review findings on a
# machine without them (issue: review --stack), shown on the demo port with its stub kernel package.
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from metax_audit import demo
from metax_audit.cli import app

runner = CliRunner()


def _findings(out: Path) -> set[tuple[str, str]]:
    data = json.loads((out / "report.json").read_text())
    return {(f["id"], f["message"]) for f in data["findings"]}


def test_manifest_review_equals_live_review(tmp_path: Path, audit_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = demo.build_demo_repo(tmp_path / "repo")
    up = str(demo.upstream_root())
    manifest = tmp_path / "stack.json"
    monkeypatch.setenv("PYTHONPATH", str(demo.stack_root()))
    cap = runner.invoke(app, ["evidence", "--capture-stack", str(manifest), "--repo", str(repo), "--upstream", up])
    assert cap.exit_code == 0, cap.output
    assert json.loads(manifest.read_text())["facts"]
    live = runner.invoke(app, ["review", "--staged", "--repo", str(repo), "--upstream", up, "--format", "json",
                               "--output-dir", str(tmp_path / "live"), "--fail-on", "never"])
    assert live.exit_code == 0, live.output
    monkeypatch.delenv("PYTHONPATH")
    offline = runner.invoke(app, ["review", "--staged", "--repo", str(repo), "--upstream", up, "--stack", str(manifest),
                                  "--format", "json", "--output-dir", str(tmp_path / "offline"), "--fail-on", "never"])
    assert offline.exit_code == 0, offline.output
    live_f, offline_f = _findings(tmp_path / "live"), _findings(tmp_path / "offline")
    assert any(rule.startswith("MXA101") for rule, _ in live_f), "the demo's unknown keyword must be found"
    assert live_f == offline_f
