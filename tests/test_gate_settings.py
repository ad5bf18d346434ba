# The gate's settings in the port's config (upstream, stack, fail-on, new-only, allow-unbound...), flags over
# them, the report's record of where each came from; a pinned kernel package accepted unbound, said in every
# format's headline; the subject's config governing its baseline; `--format github`; SARIF help for every rule.
from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import git, write_tree
from typer.testing import CliRunner

from metax_audit import demo
from metax_audit.cli import app
from metax_audit.stages.introspect import pkgindex

runner = CliRunner()
PIN = {"requirements/vendor.txt": "flashinfer==0.2.6+vendor1.2\n"}


@pytest.fixture
def no_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """No public base can be had: no index and no find-links (nothing leaves this machine)."""
    monkeypatch.setattr(pkgindex, "configured_sources", lambda **kw: pkgindex.Sources(()))


@pytest.fixture
def pinned(tmp_path: Path) -> Path:
    repo = demo.build_demo_repo(tmp_path / "repo")
    write_tree(repo, PIN)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "pin the vendor kernel build")
    return repo


def _config(repo: Path, lines: str) -> None:
    text = (repo / "pyproject.toml").read_text(encoding="utf-8")
    (repo / "pyproject.toml").write_text(text.replace("[tool.metax-audit]\n", "[tool.metax-audit]\n" + lines, 1),
                                         encoding="utf-8")


def _review(repo: Path, out: Path, *extra: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, ["review", "--worktree", "--repo", str(repo), "--format", "md,json,sarif,junit,github",
                               "--output-dir", str(out), "--no-baseline", *extra])


def test_an_unbound_pin_stops_the_review_with_one_line_and_the_ways_out(pinned: Path, tmp_path: Path, no_index: None) -> None:
    r = _review(pinned, tmp_path / "out", "--upstream", str(demo.upstream_root()))
    assert r.exit_code == 2, r.output
    [line] = [ln for ln in r.output.splitlines() if ln.startswith("metax-audit: error:")]
    assert "flashinfer: the pinned flashinfer==0.2.6+vendor1.2 (requirements/vendor.txt:1) cannot be bound" in line
    assert "--allow-unbound flashinfer" in line and "kernel-sources" in line
    assert not (tmp_path / "out" / "report.json").exists()


@pytest.mark.parametrize("where", ["flag", "config"])
def test_accepted_unbound_every_headline_says_how_many_calls_went_unchecked(pinned: Path, tmp_path: Path, no_index: None,
                                                                            where: str) -> None:
    _config(pinned, f"upstream = {str(demo.upstream_root())!r}\nfail-on = \"never\"\n"
            + ("allow-unbound = [\"flashinfer\"]\n" if where == "config" else ""))
    out = tmp_path / "out"
    r = _review(pinned, out, *(["--allow-unbound", "flashinfer"] if where == "flag" else []))
    assert r.exit_code == 0, r.output
    data = json.loads((out / "report.json").read_text())
    [u] = data["unbound"]
    accepted = "--allow-unbound" if where == "flag" else "allow-unbound in the config"
    assert (u["module"], u["pin"], u["accepted_by"]) == ("flashinfer", "flashinfer==0.2.6+vendor1.2", accepted)
    assert u["calls"] > 0
    headline = f"INCOMPLETE: {u['calls']} calls unchecked, into flashinfer ({u['calls']}): pinned but not bound"
    assert data["incomplete"].startswith(headline)
    assert headline.replace("_", "\\_") in (out / "summary.md").read_text().splitlines()[2]
    assert headline in " ".join(r.output.split())  # the terminal (its verdict line may wrap)
    sarif = json.loads((out / "report.sarif").read_text())["runs"][0]
    assert sarif["properties"]["incomplete"].startswith(headline)
    assert sarif["invocations"][0]["toolExecutionNotifications"][0]["message"]["text"].startswith(headline)
    junit = ET.fromstring((out / "report.junit.xml").read_text())
    [case] = [c for c in junit.iter("testcase") if c.get("name") == "bind flashinfer==0.2.6+vendor1.2"]
    assert case.find("skipped").get("message").startswith(headline)  # type: ignore[union-attr]
    assert "::warning title=metax-audit%3A review incomplete::" + headline in r.output
    settings = next(s["note"] for s in data["stages"] if s["name"] == "settings")
    assert f"upstream={demo.upstream_root()} (pyproject.toml [tool.metax-audit])" in settings
    assert "fail-on=never (pyproject.toml [tool.metax-audit])" in settings
    assert f"allow-unbound=flashinfer ({'--allow-unbound' if where == 'flag' else 'pyproject.toml [tool.metax-audit]'})" in settings


def test_flags_override_the_configs_gate(pinned: Path, tmp_path: Path, no_index: None) -> None:
    _config(pinned, f"upstream = {str(demo.upstream_root())!r}\nfail-on = \"never\"\nallow-unbound = [\"flashinfer\"]\n")
    r = _review(pinned, tmp_path / "out", "--fail-on", "error")  # the demo port has errors
    assert r.exit_code == 1, r.output
    settings = next(s["note"] for s in json.loads((tmp_path / "out" / "report.json").read_text())["stages"]
                    if s["name"] == "settings")
    assert "fail-on=error (--fail-on)" in settings
    bad = runner.invoke(app, ["review", "--worktree", "--repo", str(pinned), "--fail-on", "never", "--no-baseline",
                              "--output-dir", str(tmp_path / "o2")], catch_exceptions=False)
    assert bad.exit_code == 0, bad.output
    (pinned / ".metax-audit.yaml").write_text("fail-on: sometimes\n")
    bad = runner.invoke(app, ["review", "--worktree", "--repo", str(pinned), "--output-dir", str(tmp_path / "o3")])
    assert bad.exit_code == 2 and "fail-on must be one of error, warning, info, never" in bad.output


def test_github_annotations_one_per_counted_finding_capped_with_the_rest_counted() -> None:
    from report_factory import make_report

    from metax_audit.core.findings import make_finding
    from metax_audit.core.models import Location, Severity
    from metax_audit.report.github import workflow_commands
    from metax_audit.report.rules_doc import load_all_rules

    load_all_rules()
    findings = [make_finding(f"MXA10{1 + i % 3}", Location(f"port/a,{i}.py", i + 1), f"bad: 100% wrong\nline {i}",
                             severity=Severity.ERROR if i < 3 else Severity.WARNING) for i in range(6)]
    findings.append(make_finding("MXA201", Location("port/b.py", 2), "harmless", severity=Severity.INFO))
    lines = workflow_commands(make_report(findings=findings, discovery=None), cap=4)
    assert len(lines) == 5 and lines[-1] == "::notice title=metax-audit::2 more findings not annotated (at most 4): see summary.md"
    assert lines[0].startswith("::error file=port/a%2C0.py,line=1,title=metax-audit MXA101")
    assert lines[0].endswith("::bad: 100%25 wrong%0Aline 0")
    assert [ln.split(" ", 1)[0] for ln in lines[:4]] == ["::error", "::error", "::error", "::warning"]


def test_sarif_has_help_text_for_every_rule_of_a_report_whose_checks_were_never_imported(tmp_path: Path) -> None:
    # a review served from the result cache imports none of the modules that declare its rules
    import pickle

    from report_factory import make_report

    from metax_audit.core.findings import make_finding
    from metax_audit.core.models import Location
    from metax_audit.report.rules_doc import load_all_rules

    ids = sorted(load_all_rules())
    report = make_report(findings=[make_finding(r, Location("port/a.py", i + 1), "x") for i, r in enumerate(ids)],
                         discovery=None)
    (tmp_path / "report.pickle").write_bytes(pickle.dumps(report))
    code = ("import pickle, sys, json\nfrom metax_audit.report import sarif\n"
            "report = pickle.loads(open(sys.argv[1], 'rb').read())\n"
            "rules = sarif.to_sarif_dict(report)['runs'][0]['tool']['driver']['rules']\n"
            "print(json.dumps([r['id'] for r in rules if 'No help text' in r['fullDescription']['text']]), len(rules))\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "report.pickle")], capture_output=True, text=True,
                          check=True, cwd=Path(__file__).resolve().parents[1])
    assert done.stdout.split() == ["[]", str(len(ids))], done.stdout + done.stderr


def test_the_subjects_config_governs_its_baseline(tmp_path: Path) -> None:
    # a port whose package is not the default, its config not yet committed: HEAD is reviewed under it too
    repo = tmp_path / "ascendish"
    for path in sorted(demo.port_root().rglob("*.py")):
        rel = path.relative_to(demo.port_root()).as_posix().replace("vllm_metax", "ascendish", 1)
        write_tree(repo, {rel: path.read_text(encoding="utf-8").replace("vllm_metax", "ascendish")})
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "port")
    (repo / ".metax-audit.yaml").write_text(f"port-package: ascendish\nupstream: {demo.upstream_root()}\n"
                                            "platform-file: ascendish/platform.py\n")
    r = runner.invoke(app, ["review", "--worktree", "--repo", str(repo), "--format", "json", "--output-dir",
                            str(tmp_path / "out"), "--fail-on", "never"])
    assert r.exit_code == 0, r.output
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert data["baseline"]["rev"] == "HEAD" and data["baseline"]["new"] == 0, data["baseline"]
    assert any(f["path"].startswith("ascendish/") for f in data["files"])


def test_new_only_from_the_config_on_a_review_without_baseline_counts_every_finding(tmp_path: Path) -> None:
    # the hook's new-only in the config must not break the push workflow's plain --rev review
    repo = demo.build_demo_repo(tmp_path / "repo")
    _config(repo, f"upstream = {str(demo.upstream_root())!r}\nnew-only = true\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "the gate in the config")
    r = runner.invoke(app, ["review", "--rev", "HEAD", "--repo", str(repo), "--format", "json", "--output-dir",
                            str(tmp_path / "out")])
    assert r.exit_code == 1, r.output  # the demo port's errors count: the stricter gate
    settings = next(s["note"] for s in json.loads((tmp_path / "out" / "report.json").read_text())["stages"]
                    if s["name"] == "settings")
    assert "new-only=True ignored: no baseline, every finding counts (pyproject.toml [tool.metax-audit])" in settings
    flag = runner.invoke(app, ["review", "--rev", "HEAD", "--repo", str(repo), "--new-only", "--output-dir", str(tmp_path / "o2")])
    assert flag.exit_code == 2 and "--new-only needs a baseline" in flag.output


def test_a_review_with_an_accepted_unbound_pin_is_kept_while_the_indexs_answer_is(pinned: Path, tmp_path: Path,
                                                                                   no_index: None,
                                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Every index answered "not there": the review is kept whole, served while that answer is kept (a day),
    never with another allow-unbound (unaccepted, the pin stops the review again) nor after the day."""
    from metax_audit.stages.introspect import stack_pins

    _config(pinned, f"upstream = {str(demo.upstream_root())!r}\nfail-on = \"never\"\n")
    log = tmp_path / "asked"  # a file, not a list: the pins are bound in a forked child of the review
    real = pkgindex.fetch

    def fetch(name: str, version: str, dest: Path, sources: pkgindex.Sources) -> object:
        with log.open("a", encoding="utf-8") as fh:
            fh.write(name + "\n")
        return real(name, version, dest, sources)

    def asked() -> list[str]:
        return log.read_text(encoding="utf-8").split() if log.exists() else []

    monkeypatch.setattr(pkgindex, "fetch", fetch)

    def review(*extra: str) -> tuple[int, list[str]]:
        stack_pins._ANSWERS.clear()  # each review its own process
        r = _review(pinned, tmp_path / "out", "--allow-unbound", "flashinfer", *extra)
        stages = [s["name"] for s in json.loads((tmp_path / "out" / "report.json").read_text())["stages"]] if r.exit_code == 0 else []
        return r.exit_code, stages

    code, stages = review()
    assert code == 0 and "result-cache" not in stages and asked() == ["flashinfer-python"]
    log.unlink(missing_ok=True)
    code, stages = review()
    assert code == 0 and "result-cache" in stages and asked() == []  # served whole: the index not asked
    r = _review(pinned, tmp_path / "o2")  # not accepted: the kept answer still says "not there", so exit 2
    assert r.exit_code == 2 and "cannot be bound" in r.output and asked() == []
    code, stages = review("--no-cache")
    assert code == 0 and "result-cache" not in stages and asked() == ["flashinfer-python"]
    later = stack_pins._now() + stack_pins.KEPT_MISS_S
    monkeypatch.setattr(stack_pins, "_now", lambda: later)
    log.unlink(missing_ok=True)
    code, stages = review()
    assert code == 0 and "result-cache" not in stages and asked() == ["flashinfer-python"]  # a day later: asked again


def test_the_pins_are_bound_in_a_child_whose_index_answers_the_review_keeps(pinned: Path, tmp_path: Path, no_index: None,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The index lookup (its imports and SSL context) runs in a forked child, off the review's process; the
    answer comes back with the bindings, so a baseline review in the same process does not ask again."""
    import os

    from metax_audit.stages.introspect import stack_pins

    _config(pinned, f"upstream = {str(demo.upstream_root())!r}\nfail-on = \"never\"\n")
    log = tmp_path / "pids"
    real = pkgindex.fetch

    def fetch(name: str, version: str, dest: Path, sources: pkgindex.Sources) -> object:
        with log.open("a", encoding="utf-8") as fh:
            fh.write(f"{os.getpid()}\n")
        return real(name, version, dest, sources)

    monkeypatch.setattr(pkgindex, "fetch", fetch)
    stack_pins._ANSWERS.clear()
    r = _review(pinned, tmp_path / "out", "--allow-unbound", "flashinfer", "--no-cache")
    assert r.exit_code == 0, r.output
    pids = log.read_text(encoding="utf-8").split()
    assert len(pids) == 1 and pids[0] != str(os.getpid())  # asked once, by a child
    answers = stack_pins.index_answers()
    assert [why for _, why in answers.values()] and all(entry is None for entry, _ in answers.values())
    assert any("flashinfer" in asked for asked, _ in answers)  # the child's answer, kept by this process


def test_where_fork_is_refused_the_pins_are_bound_on_a_thread(pinned: Path, tmp_path: Path, no_index: None,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Another thread alive (Forked refuses to fork beside it): bind runs on a thread of the review's process."""
    import os
    import threading

    from metax_audit.stages.introspect import stack_pins

    _config(pinned, f"upstream = {str(demo.upstream_root())!r}\nfail-on = \"never\"\n")
    log = tmp_path / "pids"
    real = pkgindex.fetch

    def fetch(name: str, version: str, dest: Path, sources: pkgindex.Sources) -> object:
        with log.open("a", encoding="utf-8") as fh:
            fh.write(f"{os.getpid()}\n")
        return real(name, version, dest, sources)

    monkeypatch.setattr(pkgindex, "fetch", fetch)
    stack_pins._ANSWERS.clear()
    hold = threading.Event()
    beside = threading.Thread(target=hold.wait)
    beside.start()
    try:
        r = _review(pinned, tmp_path / "out", "--allow-unbound", "flashinfer", "--no-cache")
    finally:
        hold.set()
        beside.join()
    assert r.exit_code == 0, r.output
    assert log.read_text(encoding="utf-8").split() == [str(os.getpid())]  # asked once, here
    stages = [s["name"] for s in json.loads((tmp_path / "out" / "report.json").read_text())["stages"]]
    assert "stack-pins" in stages


def test_a_review_with_an_unbound_pin_the_index_could_not_answer_is_not_kept(pinned: Path, tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    _config(pinned, f"upstream = {str(demo.upstream_root())!r}\nfail-on = \"never\"\n")
    from metax_audit.stages.introspect import stack_pins

    monkeypatch.setattr(pkgindex, "configured_sources", lambda **kw: pkgindex.Sources(()))
    monkeypatch.setattr(pkgindex, "fetch", lambda *a: pkgindex.NotFetched("could not ask http://x: down", definitive=False))
    for _ in range(2):
        stack_pins._ANSWERS.clear()
        r = _review(pinned, tmp_path / "out", "--allow-unbound", "flashinfer")
        assert r.exit_code == 0, r.output
        stages = [s["name"] for s in json.loads((tmp_path / "out" / "report.json").read_text())["stages"]]
        assert "result-cache" not in stages and "stack-pins" in stages
