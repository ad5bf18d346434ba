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
    from metax_audit.stages.snapshot import snapshot

    with snapshot("staged", repo=committed_demo) as snap:
        assert any("nothing is staged" in n for n in snap.notes)
    (committed_demo / "vllm_metax" / "__init__.py").write_text("# staged\n", encoding="utf-8")
    subprocess.run(["git", "add", "vllm_metax/__init__.py"], cwd=committed_demo, check=True)
    try:
        with snapshot("staged", repo=committed_demo) as snap:
            assert not any("nothing is staged" in n for n in snap.notes)
    finally:
        subprocess.run(["git", "reset", "-q", "--hard"], cwd=committed_demo, check=True)


def test_a_review_served_whole_from_the_cache_still_names_what_breaks(committed_demo: Path, demo_stack: None,
                                                                      tmp_path: Path) -> None:
    """A second run imports none of the stages that declare the rules; its first screen and SARIF
    must still carry the rule titles, as the computed run's do."""
    import json
    import sys

    first = _review(committed_demo, tmp_path / "a", "--rev", "HEAD", "--format", "md,sarif", "--fail-on", "never")
    assert first.exit_code == 0, first.output
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom metax_audit.cli import app\n"
            "r = CliRunner().invoke(app, sys.argv[1:])\nprint(r.output)\nsys.exit(r.exit_code)\n")
    from metax_audit import demo as demo_mod

    served = subprocess.run([sys.executable, "-c", code, "review", "--rev", "HEAD", "--repo", str(committed_demo),
                             "--upstream", str(demo_mod.upstream_root()), "--output-dir", str(tmp_path / "b"),
                             "--format", "md,sarif", "--fail-on", "never"], capture_output=True, text=True, timeout=300)
    assert served.returncode == 0, served.stdout + served.stderr
    title = "registration names a class path that does not resolve in the snapshot"
    # An error's line on the first screen is headed by its consequence in words (the rule's title is in SARIF).
    consequence = "the backend or op cannot be loaded"
    for out in ("a", "b"):
        assert consequence in (tmp_path / out / "summary.md").read_text(encoding="utf-8"), out
        rules = json.loads((tmp_path / out / "report.sarif").read_text(encoding="utf-8"))["runs"][0]["tool"]["driver"]["rules"]
        assert any(r["id"] == "MXA010" and r["shortDescription"]["text"] == title for r in rules), out
    assert consequence in " ".join(served.stdout.split()), served.stdout


def _demo_review(repo: Path, out: Path, *extra: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return _review(repo, out, "--rev", "HEAD", "--fail-on", "never", *extra, env=env)


def test_lines_wrap_at_the_terminal_width_between_words(committed_demo: Path, demo_stack: None, tmp_path: Path) -> None:
    narrow = _demo_review(committed_demo, tmp_path / "a", "--format", "md", env={"COLUMNS": "60"}).output
    wide = _demo_review(committed_demo, tmp_path / "b", "--format", "md", env={"COLUMNS": "200"}).output
    path = "vllm_metax/v1/attention/backends/flashinfer.py:252"
    for out, width in ((narrow, 60), (wide, 200)):
        lines = out.splitlines()
        # a line is longer than the width only when it is one token longer than the width (and a cut's " ...")
        assert all(len(line) <= width or len(line.split()) == 1 or line.split()[1:] == ["..."] for line in lines
                   if not line.startswith("reports: ")), out
        assert any(path in line for line in lines)  # the path whole, never split across lines
    assert max(map(len, wide.splitlines())) > 60  # the wide terminal is used, not a fixed width
    assert len(narrow.splitlines()) > len(wide.splitlines())
    # a pipe without COLUMNS: each finding on one line, whole words
    piped = _demo_review(committed_demo, tmp_path / "c", "--format", "md", env={"COLUMNS": ""}).output
    assert any(line.startswith("  error   MXA510 " + path + " ") for line in piped.splitlines())


def test_quiet_prints_the_headline_and_the_counts_only(committed_demo: Path, demo_stack: None, tmp_path: Path) -> None:
    out = _demo_review(committed_demo, tmp_path / "a", "--format", "md", "--quiet").output.splitlines()
    assert out[0].startswith("FAIL: ") and "error" in out[0]
    assert len(out) == 2 and "findings:" in out[1]  # the counts line (stderr)


@pytest.mark.parametrize(("args", "env", "escapes"), [
    (("--color", "always"), {}, True),
    (("--color", "never"), {"FORCE_COLOR": "1"}, False),
    ((), {"FORCE_COLOR": "1"}, True),
    ((), {"NO_COLOR": "1", "FORCE_COLOR": "1"}, False),
    ((), {}, False),  # CliRunner's output is not a terminal
])
def test_color_follows_the_flag_then_no_color_then_force_color(committed_demo: Path, demo_stack: None, tmp_path: Path,
                                                              args: tuple[str, ...], env: dict[str, str],
                                                              escapes: bool) -> None:
    base = {"NO_COLOR": "", "FORCE_COLOR": ""}
    r = _demo_review(committed_demo, tmp_path / "a", "--format", "md", *args, env={**base, **env})
    assert r.exit_code == 0, r.output
    assert ("\x1b[" in r.output) is escapes


def test_bad_color_is_exit_2(tmp_path: Path) -> None:
    r = runner.invoke(app, ["review", "--color", "sometimes", "--repo", str(tmp_path)])
    assert r.exit_code == 2 and "--color" in r.output


def test_format_text_prints_one_compiler_line_per_finding(committed_demo: Path, demo_stack: None, tmp_path: Path) -> None:
    import json

    r = _demo_review(committed_demo, tmp_path / "a", "--format", "text,json")
    assert r.exit_code == 0, r.output
    data = json.loads((tmp_path / "a" / "report.json").read_text(encoding="utf-8"))
    live = [f for f in data["findings"] if not f.get("waived")]
    lines = [line for line in r.stdout.splitlines() if not line.startswith("reports: ")]
    assert len(lines) == len(live)
    f = next(f for f in live if f["rule"] == "MXA010")
    assert f"{f['path']}:{f['line']}: error MXA010 {' '.join(f['message'].split())}" in lines
    assert lines == sorted(lines, key=lambda s: (s.split(":")[0], int(s.split(":")[1]) if s.split(":")[1].isdigit() else 0))
    # text alone writes no file and prints no "reports:" path
    r = _demo_review(committed_demo, tmp_path / "b", "--format", "text")
    assert not (tmp_path / "b").exists() and "reports:" not in r.output


def _options(command: str) -> set[str]:
    import typer.main

    sub = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    return {o for p in sub.params if p.param_type_name == "option" and not p.hidden for o in p.opts}


def test_help_shows_flags_without_a_type_and_keeps_every_word() -> None:
    r = runner.invoke(app, ["review", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0
    assert "<bool>" not in r.output
    assert "[tool.metax-audit]" in r.output  # rich markup used to eat it: "or  in the port"
    assert "<str>" in r.output  # valued options still show what they take


def test_trace_and_evidence_name_the_snapshot_options_as_review_does() -> None:
    shared = {"--staged", "--worktree", "--rev", "--repo", "--upstream", "--config", "--color"}
    assert shared <= _options("review")
    for command in ("trace", "evidence"):
        assert shared | {"--format"} <= _options(command), command
    assert {"--format", "--color"} <= _options("contracts")
    r = runner.invoke(app, ["evidence", "--format", "yaml"])
    assert r.exit_code == 2 and "--format must be text or json" in r.output


def test_an_unknown_backend_lists_each_registered_name_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from contextlib import contextmanager
    from types import SimpleNamespace

    from metax_audit.core.errors import AuditError
    from metax_audit.pipeline import commands

    chains = [SimpleNamespace(name="FLASH_ATTN", class_path="a.FlashAttentionBackend"),
              SimpleNamespace(name="FLASH_ATTN", class_path="b.FlashAttnMLABackend"),
              SimpleNamespace(name="TRITON_ATTN", class_path="c.TritonAttentionBackend")]

    @contextmanager
    def traced(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        yield None, None, None, SimpleNamespace(backends=chains), None

    monkeypatch.setattr(commands, "_traced", traced)
    with pytest.raises(AuditError) as err:
        commands.trace_only(mode="rev", repo=None, rev="HEAD", upstream=None, backend="NOPE")
    assert str(err.value) == "no registered backend named 'NOPE' (registered: FLASH_ATTN (2 classes), TRITON_ATTN)"


def test_rule_explains_itself_from_the_table_docs_rules_md_is_made_of() -> None:
    from metax_audit.report.rules_doc import load_all_rules
    from metax_audit.report.severity_doc import SEVERITY

    r = runner.invoke(app, ["rule", "mxa101"], env={"COLUMNS": "70"})
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    rule = load_all_rules()["MXA101"]
    assert text.startswith(f"MXA101 {rule.title}")
    assert " ".join(rule.help.split()) in text
    assert SEVERITY["MXA101"]
    for severity, when, example in SEVERITY["MXA101"]:
        assert f"{severity} when {' '.join(when.split())}." in text and " ".join(example.split()) in text
    assert "- rule: MXA101" in r.output and "reason:" in r.output and "docs/rules.md#mxa101" in text
    # wrapped at the terminal's width, but for the waiver entry, which is YAML to copy as it stands
    assert all(len(line) <= 70 for line in r.output.splitlines() if not line.startswith("    "))


def test_an_unknown_rule_is_one_line_and_exit_2() -> None:
    r = runner.invoke(app, ["rule", "MXA999"])
    assert r.exit_code == 2
    assert r.output.strip().splitlines() == ["metax-audit: error: no rule 'MXA999' (`metax-audit rules` lists them)"]


def test_rules_lists_every_rule_once() -> None:
    from metax_audit.report.rules_doc import load_all_rules

    r = runner.invoke(app, ["rules"], env={"COLUMNS": ""})
    assert r.exit_code == 0
    ids = [line.split()[0] for line in r.output.splitlines() if line.startswith("MXA")]
    assert ids == list(load_all_rules())


@pytest.mark.parametrize(("change", "dirty", "staged"), [
    ("none", False, False),
    ("worktree-only", True, False),
    ("staged", True, True),
    ("staged-then-reverted", True, True),
    ("staged-delete", True, True),
    ("staged-new", True, True),
])
def test_dirty_and_staged_from_one_git_call(tmp_path: Path, change: str, dirty: bool, staged: bool) -> None:
    from metax_audit.stages import snapshot as snapshot_mod

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True)

    git("init", "-q")
    (tmp_path / "a.py").write_text("A = 1\n")
    (tmp_path / "b.py").write_text("B = 1\n")
    git("add", "-A")
    git("commit", "-qm", "one")
    if change in ("worktree-only", "staged-then-reverted", "staged"):
        (tmp_path / "a.py").write_text("A = 2\n")
    if change in ("staged", "staged-then-reverted"):
        git("add", "a.py")
    if change == "staged-then-reverted":
        (tmp_path / "a.py").write_text("A = 1\n")
    if change == "staged-delete":
        git("rm", "-q", "b.py")
    if change == "staged-new":
        (tmp_path / "c.py").write_text("C = 1\n")
        git("add", "c.py")
    entries = snapshot_mod._index_entries(tmp_path)
    assert snapshot_mod._dirty_and_staged(tmp_path, entries) == (dirty, staged)
    assert snapshot_mod._index_differs(tmp_path) is staged  # the plain question agrees


@pytest.mark.parametrize(("text", "budget", "cut"), [
    ("short enough", 40, "short enough"),
    ("registered to vllm_metax.v1.attention.backends.mla.triton_mla.MacaTritonMLABackend, which", 40,
     "registered to ..."),
    ("vllm_metax/v1/attention/backends/flashinfer.py:252 is long", 20, "vllm_metax/v1/attention/backends/flashinfer.py:252 ..."),
    ("  spaces   folded  ", 40, "spaces folded"),
])
def test_cut_words_never_cuts_inside_a_token(text: str, budget: int, cut: str) -> None:
    from metax_audit.report.text import cut_words

    assert cut_words(text, budget) == cut


def test_summary_md_cuts_the_first_screen_after_whole_words() -> None:
    from dataclasses import replace

    import report_factory as rf

    from metax_audit.core.models import Category, Finding, Location, Severity
    from metax_audit.report.markdown import render_summary

    name = "vllm_metax.v1.attention.backends.mla.triton_mla.MacaTritonMLABackend"
    f = Finding("MXA010", Category.REGISTRATION, Severity.ERROR, Location("vllm_metax/platform.py", 40, "f"),
                "attention-backend TRITON_MLA is registered to " + name + ", which does not exist " * 8, ())
    text = render_summary(rf.make_report(findings=[replace(f)]))
    line = next(line for line in text.splitlines() if "`MXA010`" in line)
    assert line.endswith(" ...") and ("MacaTritonMLABackend" in line or "triton" not in line)


def test_a_run_that_writes_no_report_prints_no_reports_line(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "a.py").write_text("A = 1\n")
    subprocess.run(["git", "-C", str(tmp_path), "add", "a.py"], check=True)
    r = runner.invoke(app, ["review", "--staged", "--repo", str(tmp_path), "--output-dir", str(tmp_path / "out")])
    assert r.exit_code == 2 and "port package 'vllm_metax' not found" in r.output
    assert "reports:" not in r.output
