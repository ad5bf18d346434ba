# The CI example and the pre-commit hook are shipped text; they must stay valid YAML and keep
# the pieces a port maintainer relies on (SARIF upload, job summary under 1 MiB, staged review).
from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_github_actions_example():
    wf = yaml.safe_load((ROOT / "docs" / "github-actions-review.yml").read_text(encoding="utf-8"))
    on = wf.get("on", wf.get(True))  # YAML 1.1 reads a bare `on` as true
    assert "pull_request" in on
    steps = wf["jobs"]["review"]["steps"]
    runs = "\n".join(s.get("run", "") for s in steps)
    assert "metax-audit review $gate --upstream vllm==" in runs
    # pull requests gate on new findings against the merge base; pushes to main give the baseline
    assert "--merge-base origin/${{ github.base_ref }} --new-only" in runs and "push" in on
    assert "--format md,json,sarif,junit --output-dir reports" in runs
    assert "GITHUB_STEP_SUMMARY" in runs and "head -c" in runs
    uses = [s.get("uses", "") for s in steps]
    assert any(u.startswith("github/codeql-action/upload-sarif@") for u in uses)
    assert any(u.startswith("actions/upload-artifact@") for u in uses)
    assert wf["permissions"]["security-events"] == "write"


def test_pre_commit_hook():
    (hook,) = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text(encoding="utf-8"))
    assert hook["id"] == "metax-audit"
    assert hook["entry"] == "metax-audit review --staged --new-only --fail-on error"
    assert hook["pass_filenames"] is False
    assert hook["language"] == "python"


def test_pre_commit_config_example_uses_the_hook():
    cfg = yaml.safe_load((ROOT / "docs" / "pre-commit-config.example.yaml").read_text(encoding="utf-8"))
    (hook,) = cfg["repos"][0]["hooks"]
    assert hook["id"] == "metax-audit" and "--upstream" in hook["args"]


def test_cli_accepts_every_option_the_examples_use():
    import re

    from typer.testing import CliRunner

    from metax_audit.cli import app

    help_text = CliRunner().invoke(app, ["review", "--help"], env={"COLUMNS": "200"}).output
    text = (ROOT / "docs" / "github-actions-review.yml").read_text() + (ROOT / ".pre-commit-hooks.yaml").read_text()
    for option in sorted(set(re.findall(r"(--[a-z][a-z-]+)", text)) - {"--upstream"}):
        assert option in help_text, option
