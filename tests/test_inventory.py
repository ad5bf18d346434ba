# The inventory: one record per file in scope, statuses with reasons, inactive-path findings,
# probe coverage, partial runs, the --fail-on gate and the summary line.
from __future__ import annotations

import random
from dataclasses import replace

import pytest
import report_factory as rf

from metax_audit.core.errors import ConfigError
from metax_audit.core.findings import make_finding
from metax_audit.core.models import CallSite, Category, ConfigSwitch, Finding, Location, Severity
from metax_audit.core.pysource import too_large
from metax_audit.stages.inventory import _reaches, build_report, exit_code, summary_line


def _record(report, path):
    (rec,) = [r for r in report.files if r.path == path]
    return rec


def test_one_record_per_file_in_scope_sorted():
    report = rf.make_report()
    assert [r.path for r in report.files] == sorted(
        [rf.PLATFORM, rf.FI, rf.TRITON, rf.UTILS, rf.BROKEN, rf.GENERATED]
    )
    assert report.coverage.in_scope == 6
    assert report.coverage.analysed == 4
    assert [s.path for s in report.coverage.skipped] == [rf.BROKEN, rf.GENERATED]
    assert [s.path for s in report.coverage.left_out] == ["vllm_metax/v1/attention/backends/mla/common.py"]


def test_record_contents():
    report = rf.make_report()
    fi = _record(report, rf.FI)
    assert fi.upstream_path == "vllm/v1/attention/backends/flashinfer.py"
    assert [r.name for r in fi.registrations] == ["FLASHINFER"]
    assert fi.callers == (rf.PLATFORM,)
    assert [d.line for d in fi.differences] == [0, 8, 12, 133, 150]
    assert fi.status == "needs-action"
    assert "1 error" in fi.status_reason
    platform = _record(report, rf.PLATFORM)
    # The platform holds both registrations (where they are written).
    assert [r.name for r in platform.registrations] == ["FLASHINFER", "TRITON_ATTN"]
    utils = _record(report, rf.UTILS)
    assert utils.reason == "reached-by-trace"
    assert utils.callers == (rf.FI, rf.TRITON)  # deduplicated and sorted
    assert utils.status == "ok"  # an info finding does not need action


def test_waived_warning_does_not_need_action():
    report = rf.make_report()
    assert _record(report, rf.TRITON).status == "ok"
    unwaived = [replace(f, waived=False) if f.rule == "ZZZ102" else f for f in rf.findings()]
    report = rf.make_report(findings=unwaived)
    rec = _record(report, rf.TRITON)
    assert rec.status == "needs-action"
    assert rec.status_reason == "unwaived findings: 1 warning"


def test_not_analysed_carries_reason():
    report = rf.make_report()
    assert _record(report, rf.BROKEN).status_reason == "parse error: invalid syntax (line 3)"
    assert _record(report, rf.GENERATED).status == "not-analysed"
    assert "generated code" in _record(report, rf.GENERATED).status_reason


def test_finding_ids_located_in_file():
    report = rf.make_report()
    ids = {f.id: f for f in report.findings}
    for rec in report.files:
        assert all(ids[i].location.path == rec.path for i in rec.findings)
    fi = _record(report, rf.FI)
    assert [ids[i].rule for i in fi.findings] == ["ZZZ100", "MXA300"]


def test_inactive_path_finding_for_disabled_cascade():
    report = rf.make_report()
    (f,) = [f for f in report.findings if f.category is Category.INACTIVE_PATH]
    assert f.rule == "MXA300"
    assert f.location.path == rf.FI and f.location.line == 150
    assert f.evidence[0] == f"switch: {rf.PLATFORM}:88: vllm_config.model_config.disable_cascade_attn = True when vllm_config.model_config is not None"
    assert any(":151: call self._cascade_wrapper.run" in e for e in f.evidence)
    assert any(":150: declared fallback-added" in e for e in f.evidence)


@pytest.mark.parametrize(
    ("target", "value", "expected"),
    [
        ("model_config.disable_cascade_attn", "True", 1),
        ("model_config.disable_cascade_attn", "False", 0),  # the feature stays on
        ("scheduler_config.enable_cascade", "False", 1),
        ("scheduler_config.use_cascade_attention", "None", 1),
        ("scheduler_config.use_cascade_attention", "True", 0),
        ("model_config.disable_sliding_window", "True", 0),  # nothing behind it in the fixture
    ],
)
def test_inactive_path_depends_on_switch_direction(target, value, expected):
    switch = ConfigSwitch(target, value, "", Location(rf.PLATFORM, 90))
    report = rf.make_report(discovery=rf.discovery(switches=(switch,)))
    hits = [f for f in report.findings if f.rule == "MXA300"]
    assert len(hits) == expected


def test_probe_coverage_follows_traced_calls():
    report = rf.make_report()
    assert _record(report, rf.FI).probes == (
        "fp8-scale/paged-decode/flashinfer:BatchDecodeWithPagedKVCacheWrapper",
        "layout/paged-decode/flashinfer:BatchDecodeWithPagedKVCacheWrapper",
        "lse/paged-decode/flashinfer:BatchDecodeWithPagedKVCacheWrapper",
    )
    assert _record(report, rf.TRITON).probes == ()


@pytest.mark.parametrize(
    ("resolved", "target", "expected"),
    [
        ("flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper.run", "flashinfer:BatchDecodeWithPagedKVCacheWrapper", True),
        ("flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper.run", "flashinfer.decode:BatchDecodeWithPagedKVCacheWrapper.run", True),
        ("flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper.run", "flashinfer:BatchDecodeWithPagedKVCacheWrapper", False),
        ("flash_attn.flash_attn_varlen_func", "flashinfer:flash_attn_varlen_func", False),
        ("pkg.ops.kernel", "pkg.ops.kernel", True),
        (None, "flashinfer:BatchDecodeWithPagedKVCacheWrapper", False),
    ],
)
def test_reaches(resolved, target, expected):
    call = CallSite(Location("a.py", 1), "f", "x()", resolved, "external")
    assert _reaches(call, target) is expected


def test_partial_runs_say_what_is_known():
    report = build_report(**rf.inputs(trace=None, comparison=None))
    assert {r.status for r in report.files} == {"not-analysed"}
    assert _record(report, rf.FI).status_reason == "trace and compare did not run"
    assert _record(report, rf.FI).registrations  # discovery's part is still there
    assert report.backends == ()

    only_trace = build_report(**rf.inputs(comparison=None, upstream=None))
    fi = _record(only_trace, rf.FI)
    assert fi.upstream_path is None and fi.differences == ()
    assert fi.status == "needs-action"
    assert _record(only_trace, rf.UTILS).status_reason == "compare did not run"
    assert only_trace.upstream is None

    empty = build_report(**rf.inputs(discovery=None, trace=None, comparison=None, findings=[], probes=[]))
    assert empty.files == () and empty.coverage.in_scope == 0


def test_upstream_falls_back_to_comparison():
    report = build_report(**rf.inputs(upstream=None))
    assert report.upstream is not None and report.upstream.version == "0.26.0"


def test_order_does_not_depend_on_input_order():
    base = rf.make_report()
    shuffled_findings = rf.findings()
    shuffled_probes = rf.probes()
    random.Random(7).shuffle(shuffled_findings)
    random.Random(7).shuffle(shuffled_probes)
    again = rf.make_report(findings=shuffled_findings, probes=shuffled_probes)
    assert again == base
    keys = [(f.location.path, f.location.line, f.rule) for f in base.findings]
    assert keys == sorted(keys)


def test_duplicate_findings_keep_one_id():
    dup = rf.findings()[2]
    report = rf.make_report(findings=[*rf.findings(), replace(dup, message="said differently", evidence=("other",))])
    ids = [f.id for f in report.findings]
    assert len(ids) == len(set(ids))
    (kept,) = [f for f in report.findings if f.id == dup.id]
    assert "also: said differently" in kept.evidence


def _with(*sevs: tuple[Severity, bool]) -> object:
    findings = [
        Finding(f"ZZZ{i}", Category.SIGNATURE, sev, Location("a.py", i), "m", (), waived)
        for i, (sev, waived) in enumerate(sevs)
    ]
    return rf.make_report(findings=findings, discovery=None, trace=None, comparison=None)


@pytest.mark.parametrize(
    ("sevs", "fail_on", "code"),
    [
        ((), "error", 0),
        (((Severity.WARNING, False),), "error", 0),
        (((Severity.WARNING, False),), "warning", 1),
        (((Severity.INFO, False),), "warning", 0),
        (((Severity.INFO, False),), "info", 1),
        (((Severity.ERROR, True),), "info", 0),  # waived findings never gate
        (((Severity.ERROR, False),), "error", 1),
        (((Severity.ERROR, False),), "never", 0),
    ],
)
def test_exit_code(sevs, fail_on, code):
    assert exit_code(_with(*sevs), fail_on) == code


def test_exit_code_rejects_unknown_threshold():
    with pytest.raises(ConfigError, match="--fail-on"):
        exit_code(rf.make_report(), "fatal")


def test_summary_line():
    assert summary_line(rf.make_report()) == "6 files, 2 backends, findings: 2 error, 1 warning, 3 info (1 waived), 3.4 s"
    bare = rf.make_report(findings=[], discovery=None, trace=None, comparison=None, wall_seconds=0.84)
    assert summary_line(bare) == "0 files, 0 backends, findings: 0 error, 0 warning, 0 info, 0.8 s"


def test_empty_validation_is_filled_from_probes_on_the_same_line():
    comp = rf.comparison()
    fi = comp.files[0]
    at_call = replace(fi.differences[1], line=120, validation="")  # the decode wrapper call
    elsewhere = replace(fi.differences[1], line=140, validation="")
    comp = replace(comp, files=(replace(fi, differences=(at_call, elsewhere)), *comp.files[1:]))
    diffs = {d.line: d for d in _record(rf.make_report(comparison=comp), rf.FI).differences}
    assert diffs[120].validation.startswith("probe fp8-scale/paged-decode/flashinfer:BatchDecodeWithPagedKVCacheWrapper: mismatch;")
    assert "lse/paged-decode/flashinfer:BatchDecodeWithPagedKVCacheWrapper: matched" in diffs[120].validation
    assert diffs[140].validation == "unvalidated: no probe reaches a kernel called on this line"
    no_probes = {d.line: d for d in _record(rf.make_report(comparison=comp, probes=[]), rf.FI).differences}
    assert no_probes[140].validation == "unvalidated: no probes ran"
    # What compare wrote is kept.
    assert _record(rf.make_report(), rf.FI).differences[2].validation == "probe lse on paged-decode"


def test_size_skip_is_not_called_a_parse_error():
    disc = rf.discovery()
    files = tuple(replace(f, problem=too_large(3145728, 2000000)) if f.path == rf.GENERATED else f for f in disc.files)
    report = rf.make_report(discovery=replace(disc, files=files))
    assert _record(report, rf.GENERATED).status_reason == "not parsed: too large: 3145728 bytes > max_file_bytes 2000000"


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        ("", 1),
        ("vllm_config.model_config is not None", 1),
        ("model_config is not None / model_config.hf_config.model_type in ('gemma4',)", 0),  # only some models
        ("envs.VLLM_MACA_NO_CASCADE", 0),
    ],
)
def test_inactive_path_only_for_unconditional_switches(condition, expected):
    switch = ConfigSwitch("model_config.disable_cascade_attn", "True", condition, Location(rf.PLATFORM, 90))
    report = rf.make_report(discovery=rf.discovery(switches=(switch,)))
    assert len([f for f in report.findings if f.rule == "MXA300"]) == expected


@pytest.mark.parametrize(
    ("text", "target", "expected"),
    [
        ("attn_metadata.use_cascade", "disable_cascade_attn", True),
        ("MultiLevelCascadeAttentionWrapper", "disable_cascade_attn", True),
        ("prefix_output", "is_mm_prefix_lm", False),  # one shared word is not the feature
        ("supports_mm_prefix", "is_mm_prefix_lm", False),
        ("self.is_mm_prefix_lm and x", "is_mm_prefix_lm", True),
        ("cascaded_thing", "disable_cascade_attn", False),
    ],
)
def test_feature_words_match_whole_words(text, target, expected):
    from metax_audit.stages.checks.inactive_path import _mentions, feature_words

    assert _mentions(text, feature_words(ConfigSwitch(target, "True", "", Location("p.py", 1)))) is expected


def test_removed_items_are_not_retained_adaptations():
    comp = rf.comparison()
    fi = comp.files[0]
    removed = replace(fi.differences[2], kind="removed", line=0, symbol="MultiLevelCascadeAttentionWrapper")
    comp = replace(comp, files=(replace(fi, differences=(removed,)), *comp.files[1:]))
    (f,) = [f for f in rf.make_report(comparison=comp).findings if f.rule == "MXA300"]
    assert f.location.line == 151  # only the retained call under the use_cascade branch
    assert len(f.evidence) == 2


@pytest.mark.parametrize(
    ("branch", "expected"),
    [
        ("use_cascade", True),
        ("not (self.dcp_world_size > 1) / use_cascade", True),
        ("prefill and attn_metadata.use_cascade", True),
        ("not attn_metadata.use_cascade / self.dcp_world_size > 1", False),  # the path that runs
        ("use_cascade is False", False),
        ("use_cascade or force", False),
        ("decode", False),
    ],
)
def test_calls_behind_the_feature(branch, expected):
    from metax_audit.stages.checks.inactive_path import behind

    assert behind(branch, ("cascade",)) is expected


def test_contract_probe_is_named_for_an_unvalidated_difference_on_a_kernel_call() -> None:
    from metax_audit.core.models import CallSite, Difference, Location
    from metax_audit.stages.inventory import _validated

    call = CallSite(Location("p/fi.py", 12), "Impl.forward", "w.run", "flashinfer.Wrapper.run", "external")
    other = CallSite(Location("p/fi.py", 30), "Impl.forward", "x.run", "flashinfer.Other.run", "external")
    diff = Difference("call-changed", "p/fi.py", 12, "Impl.forward", False, "", "declare it", "")
    suggest = {"flashinfer.Wrapper.run": "metax-audit probe --target flashinfer:Wrapper --family paged-decode --probes lse"}.get
    got = _validated(diff, [call, other], [], suggest)
    assert got.validation == ("unvalidated: no probes ran; run "
                              "`metax-audit probe --target flashinfer:Wrapper --family paged-decode --probes lse`")
    kept = _validated(Difference("changed", "p/fi.py", 30, "Impl.forward", False, "", "a", "port tests"), [call, other], [], suggest)
    assert kept.validation == "port tests"  # no contract for the kernel called on line 30


def test_a_finding_is_listed_on_the_page_of_every_file_it_stands_for():
    """Sites are data: an import error whose second import is in another file is on both files' records,
    in the JSON's `sites` and in SARIF's locations (it was only in an evidence string before)."""
    from metax_audit.core.models import Site
    from metax_audit.report.json_report import to_json_dict
    from metax_audit.report.sarif import to_sarif_dict

    f = make_finding("MXA122", Location(rf.FI, 26, "import:up.x:gone"), "imports 'gone' from up.x, which upstream does not define",
                     ["port: two sites"], sites=[Site(rf.FI, 26, "", "import"), Site(rf.TRITON, 30, "", "import")])
    report = build_report(**rf.inputs(findings=[f]))
    assert f.id in _record(report, rf.FI).findings and f.id in _record(report, rf.TRITON).findings
    assert _record(report, rf.TRITON).status == "needs-action"
    data = next(x for x in to_json_dict(report)["findings"] if x["id"] == f.id)
    assert [(s["path"], s["line"]) for s in data["sites"]] == [(rf.FI, 26), (rf.TRITON, 30)]
    result = next(r for r in to_sarif_dict(report)["runs"][0]["results"] if r["partialFingerprints"]["metaxAuditFindingId/v2"] == f.id)
    assert [(loc["physicalLocation"]["artifactLocation"]["uri"], loc["physicalLocation"]["region"]["startLine"])
            for loc in result["locations"]] == [(rf.FI, 26), (rf.TRITON, 30)]
