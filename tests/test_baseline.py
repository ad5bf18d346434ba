# New vs baseline on the demo port: `review --staged` compares with HEAD; the staged LSE regression
# is new and first everywhere; --new-only gates on it; unstaged, the same command passes.
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from metax_audit.cli import app

runner = CliRunner()


@pytest.fixture
def demo_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from metax_audit import demo as demo_mod

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(demo_mod.stack_root()), os.environ.get("PYTHONPATH", "")]))
    return demo_mod.build_demo_repo(tmp_path / "port")


def _review(repo: Path, out: Path, *extra: str):  # type: ignore[no-untyped-def]
    from metax_audit import demo as demo_mod

    return runner.invoke(app, ["review", "--repo", str(repo), "--upstream", str(demo_mod.upstream_root()),
                               "--output-dir", str(out), "--format", "json,sarif,md", *extra])


def test_staged_regression_is_new_first_and_gates_with_new_only(demo_repo: Path, tmp_path: Path) -> None:
    r = _review(demo_repo, tmp_path / "a", "--staged", "--new-only", "--fail-on", "error")
    assert r.exit_code == 1, r.output
    lines = [ln for ln in r.output.splitlines() if ln.startswith("  ") and " MXA" in ln]
    assert lines[0].split()[:3] == ["NEW", "error", "MXA510"]  # the first finding line is the staged bug
    data = json.loads((tmp_path / "a" / "report.json").read_text())
    states = [f["status"] for f in data["findings"]]
    # The staged hunk joins its function's existing MXA201 finding (one finding per function), which is then
    # "changed"; the staged MXA510 is "new". Both gate like new and come first.
    assert states[0] in ("new", "changed") and "new" in states and "unchanged" in states
    assert states == sorted(states, key=lambda s: s not in ("new", "changed"))  # new ones first
    assert data["baseline"]["rev"] == "HEAD" and data["baseline"]["new"] == states.count("new")
    assert all(f["status"] == "fixed" for f in data["fixed"])
    sarif = json.loads((tmp_path / "a" / "report.sarif").read_text())
    results = sarif["runs"][0]["results"]
    assert results[0]["baselineState"] in ("new", "updated") and {r["baselineState"] for r in results} <= {"new", "updated", "unchanged"}
    assert "new" in {r["baselineState"] for r in results}
    assert all("metaxAuditFindingId/v2" in r["partialFingerprints"] for r in results)
    summary = (tmp_path / "a" / "summary.md").read_text()
    assert "## New in this change (against `HEAD`" in summary and "NEW **error** `MXA510`" in summary
    # the whole review still gates on every error without --new-only; with it, only new ones count
    subprocess.run(["git", "reset", "-q"], cwd=demo_repo, check=True)  # unstage the regression
    r = _review(demo_repo, tmp_path / "b", "--staged", "--new-only", "--fail-on", "error")
    assert r.exit_code == 0, r.output
    assert "against HEAD" in r.output and ": 0 new, 0 changed" in r.output
    r = _review(demo_repo, tmp_path / "c", "--staged", "--fail-on", "error")
    assert r.exit_code == 1  # HEAD's own errors still count without --new-only


def test_new_only_without_a_baseline_is_refused(demo_repo: Path, tmp_path: Path) -> None:
    r = _review(demo_repo, tmp_path / "a", "--rev", "HEAD", "--new-only")
    assert r.exit_code == 2 and "--new-only needs a baseline" in r.output
    r = _review(demo_repo, tmp_path / "a", "--rev", "HEAD", "--baseline", "HEAD", "--merge-base", "master")
    assert r.exit_code == 2 and "choose one of --baseline" in r.output


def test_rev_against_itself_is_all_unchanged(demo_repo: Path, tmp_path: Path) -> None:
    r = _review(demo_repo, tmp_path / "a", "--rev", "HEAD", "--baseline", "HEAD", "--new-only", "--fail-on", "info")
    assert r.exit_code == 0, r.output
    data = json.loads((tmp_path / "a" / "report.json").read_text())
    assert {f["status"] for f in data["findings"]} == {"unchanged"} and data["fixed"] == []


def test_a_difference_folded_into_a_new_error_is_neither_fixed_nor_new_again() -> None:
    """Adding a keyword the kernel rejects to a call that already differed from upstream: the call's
    difference becomes the new error's root cause (triage). That reads as one new error, not also as
    the difference 'fixed'; and when the error goes, the difference standing alone again is not new."""
    from dataclasses import replace

    import metax_audit.stages.compare  # noqa: F401  (declares the compare rules)
    from metax_audit.core.findings import make_finding
    from metax_audit.core.models import Location, Site
    from metax_audit.pipeline.baseline import compare_with
    from metax_audit.stages.triage import merge_into_errors
    from tests.report_factory import FI, make_report

    hunk = f"{FI}:120 [call-changed] wrapper.run(-q_scale): upstream: wrapper.run(q, kv, q_scale=s) | port: wrapper.run(q, kv)"
    drift = make_finding("MXA203", Location(FI, 100, "Impl.forward"), "Impl.forward: 2 upstream changes not followed",
                         (f"{hunk} -- may change what a kernel computes or whether it runs",), key="fn:Impl.forward",
                         sites=[Site(FI, 120, "Impl.forward", "call-changed", "wrapper.run(-q_scale)")])
    error = make_finding("MXA101", Location(FI, 120, "Impl.forward"),
                         "wrapper.run(..., enable_pdl=...) - installed run has no parameter 'enable_pdl'", key="run:enable_pdl")
    before = replace(make_report(), findings=tuple(merge_into_errors([drift])))
    after = replace(make_report(), findings=tuple(merge_into_errors([drift, error])))
    assert [f.rule for f in after.findings] == ["MXA101"] and after.findings[0].joined == (drift.id,)

    out = compare_with(after, before, "HEAD")
    assert [(f.rule, f.baseline.value) for f in out.findings if f.baseline] == [("MXA101", "new")]
    assert out.fixed == () and out.baseline_info["fixed"] == 0

    back = compare_with(before, after, "HEAD")  # the error fixed: the difference stands alone again
    assert [(f.rule, f.baseline.value) for f in back.findings if f.baseline] == [("MXA203", "changed")]
    assert [f.rule for f in back.fixed] == ["MXA101"]
