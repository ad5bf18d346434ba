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
    for cmd in ("review", "trace", "probe", "evidence", "contracts", "rule", "rules", "demo"):
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
    from metax_audit.core.contracts import default_contracts_path

    path = default_contracts_path()
    assert path.is_file(), "metax_audit/core/component-contracts.md must exist (a link to the top-level file)"
    assert "observation" in path.read_text(encoding="utf-8")


PLAIN_REVIEWS = [
    ["review"],
    ["review", "--staged", "--upstream", "vllm==0.26.0", "--base", "vllm==0.25.0", "--python", "/opt/py/bin/python",
     "--output-dir", "out", "--fail-on", "never", "--format", "json"],
    ["review", "--rev", "v1.0", "--repo", "/r", "--stack", "s.json", "--config", "c.yaml", "--waivers", "w.yaml",
     "--generate-waivers", "g.yaml", "--test", "pytest -q", "--probe", "--baseline", "main", "--no-cache",
     "--new-only", "--format", "md,sarif", "--format", "junit", "port/a.py", "port/b/*.py"],
    ["review", "--worktree", "--merge-base", "origin/main"],
    ["review", "--installed", "--no-baseline", "--upstream", "", "--python", "py"],  # both exit 2: --upstream is empty
]
TYPER_ONLY = [
    ["review", "--help"], ["--debug", "review"], ["review", "--format=json"], ["review", "-x"],
    ["review", "--unknown"], ["review", "--rev"], ["review", "--rev", "-1"], ["review", "--", "a.py"],
    ["review", "--format", "pdf"], ["trace", "all"],
]


def test_a_plain_review_command_line_reaches_review_as_typer_would_pass_it(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """main() parses a plain `review` command line itself (typer builds a pydantic adapter per option:
    0.13 s a run): the arguments that reach the review equal typer's, and anything else goes to typer."""
    import typer

    from metax_audit import cli

    seen: list[tuple[object, ...]] = []

    def spy(*args: object, **kwargs: object) -> None:
        seen.append((*args, sorted(kwargs.items())))
        raise typer.Exit(0)

    monkeypatch.setattr(cli, "_review_and_render", spy)
    for argv in PLAIN_REVIEWS:
        r = runner.invoke(app, argv)
        call = cli._plain_review_call(argv)
        assert call is not None, argv
        try:
            cli._run_plain_review(call)
        except SystemExit as done:
            assert done.code == r.exit_code, (argv, r.output)
        if r.exit_code == 0:
            assert len(seen) == 2 and seen[0] == seen[1], argv
        seen.clear()
    for argv in TYPER_ONLY:
        assert cli._plain_review_call(argv) is None, argv


def test_main_takes_the_plain_path_without_pydantic(tmp_path: Path) -> None:
    """The plain path is what the console script runs: a review command line that fails in review()
    itself exits as typer's would (one line, exit 2) and never imported pydantic; an --opt=value
    spelling goes through typer (which imports it) to the same end."""
    code = ("import atexit, sys\n"
            "atexit.register(lambda: print('PYDANTIC', 'pydantic' in sys.modules))\n"
            "sys.argv = ['metax-audit', *sys.argv[1:]]\n"
            "from metax_audit.cli import main\n"
            "main()\n")
    for flag, pydantic in ((["--fail-on", "sometimes"], False), (["--fail-on=sometimes"], True)):
        out = subprocess.run([sys.executable, "-c", code, "review", "--repo", str(tmp_path), *flag],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2, out.stderr
        assert "--fail-on must be error, warning, info or never" in out.stderr and "Traceback" not in out.stderr
        assert f"PYDANTIC {pydantic}" in out.stdout
