# A port whose package is not vllm_metax (config says so) is exported and reviewed: the package to
# snapshot comes from the repo's own [tool.metax-audit] config, not from the default.
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from typer.testing import CliRunner

from metax_audit.cli import app

runner = CliRunner()


def test_port_package_from_the_repos_config(tmp_path: Path) -> None:
    repo = tmp_path / "ascend"
    (repo / "vllm_ascend" / "v1" / "attention" / "backends").mkdir(parents=True)
    (repo / "pyproject.toml").write_text('[tool.metax-audit]\nport-package = "vllm_ascend"\n')
    (repo / "vllm_ascend" / "__init__.py").write_text("")
    (repo / "vllm_ascend" / "platform.py").write_text("X = 1\n")
    (repo / "vllm_ascend" / "v1" / "attention" / "backends" / "npu.py").write_text("class AscendBackend:\n    pass\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    r = runner.invoke(app, ["review", "--staged", "--repo", str(repo), "--format", "json",
                            "--output-dir", str(tmp_path / "out"), "--fail-on", "never"])
    assert r.exit_code == 0, r.output
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert "vllm_ascend/v1/attention/backends/npu.py" in [f["path"] for f in data["files"]]
    t = runner.invoke(app, ["trace", "all", "--staged", "--repo", str(repo)])
    assert t.exit_code == 2 and "registered: none" in t.output
