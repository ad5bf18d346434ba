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
    assert "--format md,json,sarif,junit,github --output-dir reports" in runs
    # installed from this project's own source, never a package-index name that does not exist
    assert "pip install metax-audit\n" not in runs + "\n" and 'pip install "metax-audit @ git+' in runs
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
    # a local hook installed from this project's source; the gate's settings live in the port's config
    from packaging.requirements import Requirement

    cfg = yaml.safe_load((ROOT / "docs" / "pre-commit-config.example.yaml").read_text(encoding="utf-8"))
    repo = cfg["repos"][0]
    (hook,) = repo["hooks"]
    (shipped,) = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text(encoding="utf-8"))
    assert repo["repo"] == "local" and hook["id"] == shipped["id"] and hook["entry"] == shipped["entry"]
    assert hook["language"] == "python" and "args" not in hook
    (dep,) = hook["additional_dependencies"]
    req = Requirement(dep)
    assert req.name == "metax-audit" and (req.url or "").startswith("file:///")


def test_the_examples_gate_settings_are_valid_config(tmp_path: Path) -> None:
    # the .metax-audit.yaml the example shows (its commented lines) is a config this version accepts
    import re

    from metax_audit.core.config import _load_file

    text = (ROOT / "docs" / "pre-commit-config.example.yaml").read_text(encoding="utf-8")
    lines = [m.group(1) for m in re.finditer(r"^#     ([a-z-]+: .*?)(?:\s+#.*)?$", text, re.M)]
    assert [ln.split(":")[0] for ln in lines] == ["upstream", "base", "stack", "allow-unbound"]
    path = tmp_path / ".metax-audit.yaml"
    path.write_text("\n".join(lines) + "\n")
    config = _load_file(path)
    assert (config.upstream, config.stack, config.allow_unbound) == ("vllm==0.26.0", ".metax-audit/stack.json", ())


def test_cli_accepts_every_option_the_examples_use():
    import re

    from typer.testing import CliRunner

    from metax_audit.cli import app

    help_text = CliRunner().invoke(app, ["review", "--help"], env={"COLUMNS": "200"}).output
    text = (ROOT / "docs" / "github-actions-review.yml").read_text() + (ROOT / ".pre-commit-hooks.yaml").read_text()
    for option in sorted(set(re.findall(r"(--[a-z][a-z-]+)", text)) - {"--upstream"}):
        assert option in help_text, option


def test_the_wheel_ships_every_data_file_the_code_reads() -> None:
    # the hook's venv installs a built wheel, not an editable checkout: a data file left out of package-data
    # is missing there (the contracts file after it moved to core/: the dataflow stage did not run)
    import subprocess
    import tomllib

    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["metax_audit"]
    package = ROOT / "metax_audit"
    shipped = {p.relative_to(package).as_posix() for pattern in patterns for p in package.glob(pattern) if p.is_file()}
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", "metax_audit"], capture_output=True, text=True,
                             check=True).stdout.split()
    data = {Path(t).relative_to("metax_audit").as_posix() for t in tracked
            if not t.endswith(".py") and Path(t).name != "README.md" and not t.startswith("metax_audit/demo/")}
    assert data and data <= shipped, data - shipped
