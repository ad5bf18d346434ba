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
    assert "metax-audit review --rev ${{ github.sha }} --upstream vllm==" in runs
    assert "--format md,json,sarif,junit --output-dir reports" in runs
    assert "GITHUB_STEP_SUMMARY" in runs and "head -c" in runs
    uses = [s.get("uses", "") for s in steps]
    assert any(u.startswith("github/codeql-action/upload-sarif@") for u in uses)
    assert any(u.startswith("actions/upload-artifact@") for u in uses)
    assert wf["permissions"]["security-events"] == "write"


def test_pre_commit_hook():
    (hook,) = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text(encoding="utf-8"))
    assert hook["id"] == "metax-audit"
    assert hook["entry"] == "metax-audit review --staged"
    assert hook["pass_filenames"] is False
    assert hook["language"] == "python"
