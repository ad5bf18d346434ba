# Tests for waivers: matching by rule/category, path glob, symbol and message substring; stale
# entries (unmatched, expired) become findings; generated files round-trip.
from __future__ import annotations

import textwrap
from datetime import date
from pathlib import Path

import pytest

import metax_audit.stages.compare  # noqa: F401 - declares the MXA2xx rules used below
from metax_audit.core.errors import ConfigError
from metax_audit.core.findings import make_finding
from metax_audit.core.models import Location
from metax_audit.pipeline.waivers import apply_waivers, generate_waivers

TODAY = date(2026, 11, 30)
F_UNDECLARED = make_finding("MXA201", Location("vllm_metax/v1/a.py", 10, "Impl.forward"), "changed in Impl.forward: kernel(q)")
F_ARCH = make_finding("MXA202", Location("vllm_metax/v1/b.py", 20, "Impl.__init__"), "kept from upstream: has_device_capability(89)")
FINDINGS = [F_UNDECLARED, F_ARCH]


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "waivers.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_no_file_changes_nothing() -> None:
    out, summary = apply_waivers(FINDINGS, None, TODAY)
    assert out == FINDINGS and summary["entries"] == 0


@pytest.mark.parametrize(
    "entry",
    [
        "rule: MXA201\n  path: vllm_metax/v1/a.py",
        "rule: undeclared-difference\n  path: 'vllm_metax/**'",
        "rule: 'MXA20*'\n  path: '*/a.py'\n  symbol: Impl.forward",
        "rule: MXA201\n  message: kernel(q)",
    ],
)
def test_entry_waives_matching_finding(tmp_path: Path, entry: str) -> None:
    path = _file(tmp_path, f"- {entry}\n  reason: vendor kernel has no out=\n")
    out, summary = apply_waivers(FINDINGS, path, TODAY)
    waived = [f for f in out if f.waived]
    assert [f.rule for f in waived] == ["MXA201"]
    assert waived[0].waiver_reason == "vendor kernel has no out="
    assert summary["waived"] == 1 and summary["unmatched"] == 0
    assert len(out) == 2  # no stale-entry finding


def test_unmatched_and_expired_entries_are_findings(tmp_path: Path) -> None:
    path = _file(tmp_path, """\
        waivers:
          - rule: MXA201
            path: vllm_metax/v1/a.py
            reason: accepted until the vendor ships out=
            expires: 2026-01-31
          - rule: MXA202
            path: vllm_metax/v1/zzz.py
            reason: typo in path
          - rule: MXA202
            path: vllm_metax/v1/b.py
            reason: still valid
            expires: "2026-11-30"
        """)
    out, summary = apply_waivers(FINDINGS, path, TODAY)
    by_rule = {f.rule: f for f in out if f.rule in {"MXA210", "MXA211"}}
    assert by_rule["MXA211"].location.line == 2 and "expired on 2026-01-31" in by_rule["MXA211"].message
    assert by_rule["MXA210"].location.line == 6
    assert not next(f for f in out if f.rule == "MXA201").waived  # an expired entry suppresses nothing
    assert next(f for f in out if f.rule == "MXA202").waived  # valid through its expiry day
    assert summary == {"file": str(path), "entries": 3, "waived": 1, "unmatched": 1, "expired": 1, "changed": 0,
                       "by_rule": {"MXA202": 1}}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- rule: MXA201\n", "non-empty `reason`"),
        ("- rule: MXA201\n  reason: x\n  expires: soon\n", "YYYY-MM-DD"),
        ("- rule: MXA201\n  reason: x\n  colour: red\n", "unknown waiver key"),
        ("waivers: 3\n", "expected a list"),
        ("- [unclosed\n", "not valid YAML"),
    ],
)
def test_invalid_file_is_a_config_error(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        apply_waivers(FINDINGS, _file(tmp_path, text), TODAY)


def test_generated_file_round_trips(tmp_path: Path) -> None:
    text = generate_waivers(FINDINGS)
    assert text.count("- id:") == 2 and "TODO" in text
    out, summary = apply_waivers(FINDINGS, _file(tmp_path, text), TODAY)
    assert all(f.waived for f in out) and summary["waived"] == 2 and summary["unmatched"] == 0


def test_an_all_digit_content_hash_round_trips(tmp_path: Path) -> None:
    """A content hash of digits only (real port master: 6383681306462449) is quoted when generated, so
    YAML keeps it a string; an unquoted one in an older file is still read as that hash."""
    digits = make_finding("MXA201", Location("vllm_metax/v1/c.py", 5, "f"), "changed in f: g(x)")
    object.__setattr__(digits, "content", "6383681306462449")  # the cached property's slot
    text = generate_waivers([digits])
    assert 'content: "6383681306462449"' in text
    out, summary = apply_waivers([digits], _file(tmp_path, text), TODAY)
    assert out[0].waived and summary["waived"] == 1 and summary["unmatched"] == 0
    old = _file(tmp_path, text.replace('"6383681306462449"', "6383681306462449"))
    out, summary = apply_waivers([digits], old, TODAY)
    assert out[0].waived and summary["unmatched"] == 0


def test_generate_with_nothing_to_waive_is_valid(tmp_path: Path) -> None:
    text = generate_waivers([])
    out, summary = apply_waivers([], _file(tmp_path, text), TODAY)
    assert out == [] and summary["entries"] == 0


def test_changed_content_is_reported_again(tmp_path: Path) -> None:
    accepted = make_finding("MXA201", Location("vllm_metax/v1/a.py", 10, "Impl.forward"), "flow: base 2 vs e", key="p -> c")
    path = _file(tmp_path, generate_waivers([accepted]))
    now = make_finding("MXA201", Location("vllm_metax/v1/a.py", 12, "Impl.forward"), "flow: base 2 vs e; layout", key="p -> c")
    assert now.id == accepted.id
    out, summary = apply_waivers([now], path, TODAY)
    (f,) = out  # the entry matched (no stale-entry finding), but no longer waives
    assert not f.waived and "changed since waived" in f.evidence[-1]
    assert summary["changed"] == 1 and summary["unmatched"] == 0 and summary["waived"] == 0


# ---------------------------------------------------------------- on the demo port, the whole review


def _demo_review(repo: Path, waivers: Path | None = None, *, generate: bool = False):  # type: ignore[no-untyped-def]
    from metax_audit import demo as demo_mod
    from metax_audit.pipeline.review import ReviewOptions, review

    options = ReviewOptions(mode="worktree", repo=repo, upstream=str(demo_mod.upstream_root()),
                            extra_path=(demo_mod.stack_root(),), waivers=waivers, today=TODAY)
    return review(options, generate_waivers=generate)


def test_generate_then_apply_on_the_demo_is_clean_and_a_changed_flow_comes_back(tmp_path: Path) -> None:
    import subprocess

    from metax_audit import demo as demo_mod

    repo = demo_mod.build_demo_repo(tmp_path / "repo")
    first = _demo_review(repo, generate=True)
    rules = {f.rule for f in first.report.findings}
    assert {"MXA300", "MXA510", "MXA110"} <= rules  # every rule is written, inactive-path included
    path = tmp_path / "waivers.yaml"
    path.write_text(first.generated_waivers or "", encoding="utf-8")
    assert path.read_text().count("- id:") == len(first.report.findings)
    again = _demo_review(repo, path).report
    assert [f for f in again.findings if not f.waived] == []
    assert again.waivers["unmatched"] == again.waivers["expired"] == again.waivers["changed"] == 0
    # Transpose the context LSE before the merge: the flow keeps its id, says something else now.
    fi = repo / "vllm_metax/v1/attention/backends/flashinfer.py"
    text = fi.read_text(encoding="utf-8")
    call = "                merge_attn_states(output[num_decode_tokens:], ctx_out, ctx_lse, new_out, new_lse)\n"
    assert call in text
    fi.write_text(text.replace(call, "                ctx_lse = ctx_lse.transpose(0, 1)\n" + call), encoding="utf-8")
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    changed = _demo_review(repo, path).report
    back = [f for f in changed.findings if not f.waived]
    (flow,) = [f for f in back if f.rule == "MXA510"]
    assert "changed since waived" in flow.evidence[-1]
    # The edit is also an undeclared hunk in forward. Before it, forward's only hunk was the dropped ln 2 at the
    # merge call, which joined the MXA510 there as its root cause (so no MXA201 was waived); now forward's
    # differences are a finding of their own, unwaived; no entry goes stale.
    assert sorted(f.rule for f in back) == ["MXA201", "MXA510"]
    assert changed.waivers["changed"] == 1 and changed.waivers["unmatched"] == 0
