# The CLI surface: help is instant and imports no heavy stack, bad input is one line and exit 2.
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from metax_audit.cli import app

runner = CliRunner()


def test_help_imports_no_torch_triton_or_vllm() -> None:
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from metax_audit.cli import app\n"
        "r = CliRunner().invoke(app, ['--help'])\n"
        "assert r.exit_code == 0, r.output\n"
        "heavy = [m for m in ('torch', 'triton', 'vllm', 'flashinfer') if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout


def test_every_command_has_help() -> None:
    for cmd in ("review", "trace", "probe", "evidence", "contracts", "demo"):
        r = runner.invoke(app, [cmd, "--help"])
        assert r.exit_code == 0, (cmd, r.output)


def test_not_a_git_repo_is_one_line_and_exit_2(tmp_path: Path) -> None:
    r = runner.invoke(app, ["review", "--worktree", "--repo", str(tmp_path)])
    assert r.exit_code == 2
    assert "not inside a git repository" in r.output
    assert "Traceback" not in r.output


def test_conflicting_modes_exit_2(tmp_path: Path) -> None:
    r = runner.invoke(app, ["review", "--staged", "--worktree", "--repo", str(tmp_path)])
    assert r.exit_code == 2 and "choose one of" in r.output


def test_unknown_revision_exit_2(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "a.py").write_text("A = 1\n")
    subprocess.run(["git", "-C", str(tmp_path), "add", "a.py"], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "a"], check=True)
    r = runner.invoke(app, ["review", "--rev", "v9.9.9", "--repo", str(tmp_path)])
    assert r.exit_code == 2 and "unknown revision 'v9.9.9'" in r.output


def test_bad_format_and_fail_on_are_rejected(tmp_path: Path) -> None:
    r = runner.invoke(app, ["review", "--format", "pdf", "--repo", str(tmp_path)])
    assert r.exit_code == 2
    r = runner.invoke(app, ["review", "--fail-on", "sometimes", "--repo", str(tmp_path)])
    assert r.exit_code == 2 and "--fail-on" in r.output


def test_probe_needs_exactly_one_target_kind() -> None:
    r = runner.invoke(app, ["probe"])
    assert r.exit_code == 2 and "exactly one of" in r.output
    r = runner.invoke(app, ["probe", "--target", "m:f"])
    assert r.exit_code == 2 and "--family" in r.output


def test_repo_without_the_port_package_is_exit_2(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "a.py").write_text("A = 1\n")
    subprocess.run(["git", "-C", str(tmp_path), "add", "a.py"], check=True)
    r = runner.invoke(app, ["review", "--staged", "--repo", str(tmp_path), "--output-dir", str(tmp_path / "out")])
    assert r.exit_code == 2 and "port package 'vllm_metax' not found" in r.output


def test_contracts_ship_inside_the_package() -> None:
    from metax_audit.contracts import default_contracts_path

    path = default_contracts_path()
    assert path.is_file(), "metax_audit/component-contracts.md must exist (a link to the top-level file)"
    assert "observation" in path.read_text(encoding="utf-8")
