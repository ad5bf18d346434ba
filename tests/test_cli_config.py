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


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_another_ports_config_narrows_nothing_the_metax_defaults_name(tmp_path: Path) -> None:
    """docs/ports/vllm-ascend.yaml keeps its own scope and kernel modules: the MetaX default globs
    select nothing in an Ascend layout and no file imports flashinfer, so nothing is left out."""
    from metax_audit.core.config import _load_file, departures

    project = Path(__file__).resolve().parents[1]
    config = _load_file(project / "docs" / "ports" / "vllm-ascend.yaml")
    root = _tree(tmp_path / "ascend", {
        "vllm_ascend/platform.py": "import torch_npu\n",
        "vllm_ascend/attention/attention_v1.py": "import torch_npu\nfrom vllm_ascend.ops import x\n",
        "vllm_ascend/_310p/attention/attention_v1.py": "X = 1\n",
    })
    assert departures(config, root) == []
    # the same config on a tree where the defaults would reach more, and a kernel package it drops is imported
    _tree(root, {"vllm_ascend/models/qwen/attention.py": "from flashinfer import decode\n"})
    said = departures(config, root)
    assert said == ["scope leaves out 1 file(s) the default globs select (vllm_ascend/models/qwen/attention.py)",
                    "kernel-modules leaves out flashinfer, which the port imports"]


def test_a_metax_config_that_narrows_scope_names_the_files_left_out(tmp_path: Path) -> None:
    from dataclasses import replace

    from metax_audit.core.config import AuditConfig, departures

    root = _tree(tmp_path / "metax", {
        "vllm_metax/platform.py": "X = 1\n",
        **{f"vllm_metax/v1/attention/backends/b{i}.py": "import flash_attn\n" for i in range(7)},
    })
    config = replace(AuditConfig(), scope=("{port}/platform.py",), kernel_modules=())
    said = departures(config, root)
    assert said[0] == ("scope leaves out 7 file(s) the default globs select (vllm_metax/v1/attention/backends/b0.py, "
                       "vllm_metax/v1/attention/backends/b1.py, vllm_metax/v1/attention/backends/b2.py, "
                       "vllm_metax/v1/attention/backends/b3.py, vllm_metax/v1/attention/backends/b4.py and 2 more)")
    assert said[1] == "kernel-modules leaves out flash_attn, which the port imports"
    assert departures(AuditConfig(), root) == []
