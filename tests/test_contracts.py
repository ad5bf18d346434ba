# component-contracts.md parsing and rechecking: malformed blocks name file:line, probe results
# confirm, contradict or leave observations not checkable, and stale versions are reported.
from __future__ import annotations

from pathlib import Path

import pytest

from metax_audit.core.contracts import (
    ContractError,
    check_contracts,
    contract_findings,
    contracts_to_dict,
    load_contracts,
    parse_contracts,
    pattern_matches,
    validation_for,
)
from metax_audit.core.errors import AuditError, ProbeError
from metax_audit.core.models import Category, ProbeResult, Severity

REPO = Path(__file__).resolve().parents[1]

DOC = '''# contracts

```yaml
convention:
  component: ["fakeinfer.*.Decode.run"]
  role: producer
  lse_base: "2"
  lse_layout: "[tokens, heads]"
  lse_result: 1
  probe: {family: paged-decode, target: "fakeinfer:Decode"}
```

```yaml
observation:
  id: OBS-A
  component: "fakeinfer.*.Decode.run"
  version: "fakeinfer==1.0"
  device: "GPU"
  date: "2026-11-30"
  claim: "LSE is base 2"
  probe: {name: lse, family: paged-decode, target: "fakeinfer:Decode"}
  expect: "base-2"
  result: confirmed
```
'''


def _probe(verdict: str, matched: str | None = None, reason: str | None = None):
    def run(target: str, family: str, name: str) -> ProbeResult:
        return ProbeResult(probe=name, family=family, target=target, verdict=verdict, matched=matched,
                           worst_error=1e-6 if matched else None, device="cpu", skipped_reason=reason)
    return run


def test_real_contracts_file_loads_and_covers_the_families():
    c = load_contracts(REPO / "component-contracts.md")
    assert len(c.observations) >= 10 and len(c.conventions) >= 10
    assert c.convention_for("flashinfer.BatchDecodeWithPagedKVCacheWrapper.run").lse_base == "2"
    assert c.convention_for("flashinfer.prefill.BatchPrefillWithRaggedKVCacheWrapper.run").lse_base == "2"
    assert c.convention_for("vllm.v1.attention.ops.merge_attn_states.merge_attn_states").lse_layout == "[heads, tokens]"
    assert c.convention_for("vllm.v1.attention.ops.common.cp_lse_ag_out_rs").flag.name == "is_lse_base_on_e"
    ids = {o.id: o for o in c.observations}
    assert ids["OBS-FI-DECODE-LSE-BASE"].result == "confirmed"
    assert all(o.probe.name in {"lse", "layout", "fp8-scale", "dcp", "query-count", "padding", "graph-capture", "h2o"}
               for o in c.observations)
    assert all(o.probe.family in {"paged-decode", "paged-prefill", "ragged-prefill", "merge-states", "h2o-scores"}
               for o in c.observations)


def test_pattern_matching_on_dotted_names():
    assert pattern_matches("flashinfer.*.W.run", "flashinfer.W.run")
    assert pattern_matches("flashinfer.*.W.run", "flashinfer.decode.W.run")
    assert not pattern_matches("flashinfer.*.W.run", "other.W.run")
    assert not pattern_matches("*.merge_state", "x.merge_states")


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("convention:\n  component: x\n  role: maker\n  lse_base: '2'\n", "role"),
        ("convention:\n  component: x\n  role: producer\n  lse_base: '10'\n", "lse_base"),
        ("convention:\n  component: x\n  role: consumer\n  lse_base: param-dependent\n", "flag"),
        ("observation:\n  id: X\n  component: c\n", "missing"),
        ("convention: [unclosed\n", "malformed yaml"),
        ("something: 1\n", "unknown block kind"),
    ],
)
def test_malformed_block_names_file_and_line(tmp_path, bad, message):
    p = tmp_path / "component-contracts.md"
    p.write_text("# title\n\ntext\n\n```yaml\n" + bad + "```\n")
    with pytest.raises(ContractError) as exc:
        load_contracts(p)
    assert isinstance(exc.value, AuditError)
    assert "component-contracts.md:" in str(exc.value) and message in str(exc.value)
    line = int(str(exc.value).split("component-contracts.md:")[1].split(":")[0])
    assert 5 <= line <= 7


def test_missing_file_is_an_audit_error(tmp_path):
    with pytest.raises(ContractError, match="cannot read"):
        load_contracts(tmp_path / "nope.md")


@pytest.mark.parametrize(
    ("runner", "status"),
    [
        (_probe("matched", "base-2/[T,H]"), "confirmed"),
        # The target declared nothing, so the probe's verdict is "mismatch", yet it matched the claim.
        (_probe("mismatch", "base-2/[T,H]"), "confirmed"),
        (_probe("matched", "base-e/[T,H]"), "contradicted"),
        (_probe("mismatch", None), "contradicted"),
        (_probe("not-checkable", reason="control absent: no return_lse"), "not-checkable"),
        (_probe("skipped", reason="no CUDA device"), "not-checkable"),
    ],
)
def test_check_marks_each_observation(runner, status):
    c = parse_contracts(DOC)
    (chk,) = check_contracts(c, run_probe=runner, installed_versions={"fakeinfer": "1.0"})
    assert chk.status == status and not chk.stale
    if status == "not-checkable":
        assert "control absent" in chk.reason or "no CUDA" in chk.reason
    findings = list(contract_findings([chk]))
    assert len(findings) == (status == "contradicted")
    if findings:
        assert findings[0].category is Category.LSE and findings[0].severity is Severity.ERROR
        assert findings[0].location.path == "component-contracts.md" and findings[0].location.line > 0


def test_stale_and_not_installed_and_failing_probe():
    c = parse_contracts(DOC)
    (stale,) = check_contracts(c, run_probe=_probe("matched", "base-2/[T,H]"), installed_versions={"FakeInfer": "2.0"})
    assert stale.status == "confirmed" and stale.stale and stale.installed_version == "2.0"
    (f,) = contract_findings([stale])
    assert f.rule == "MXA501" and "2.0" in f.message
    (absent,) = check_contracts(c, run_probe=_probe("matched", "base-2/[T,H]"), installed_versions={})
    assert absent.status == "not-checkable" and "not installed" in absent.reason

    def boom(target: str, family: str, name: str) -> ProbeResult:
        raise ProbeError("worker timed out after 300 s")

    (failed,) = check_contracts(c, run_probe=boom, installed_versions={"fakeinfer": "1.0"})
    assert failed.status == "not-checkable" and "timed out" in failed.reason


def test_validation_for_names_a_probe_command():
    c = parse_contracts(DOC)
    cmd = validation_for("fakeinfer.Decode.run", c)
    assert cmd == "metax-audit probe --target fakeinfer:Decode --family paged-decode --probes lse"
    assert validation_for("torch.cat", c) is None


def test_probe_arguments_order_and_dict_view():
    seen = []

    def spy(target: str, family: str, name: str) -> ProbeResult:
        seen.append((target, family, name))
        return ProbeResult(probe=name, family=family, target=target, verdict="matched", matched="base-2/[T,H]")

    c = parse_contracts(DOC)
    checks = check_contracts(c, run_probe=spy, installed_versions={"fakeinfer": "1.0"})
    assert seen == [("fakeinfer:Decode", "paged-decode", "lse")]
    data = contracts_to_dict(c, checks)
    (obs,) = data["observations"]
    assert obs["status"] == "confirmed" and obs["recorded"] == "confirmed" and obs["stale"] is False
    assert data["conventions"][0]["lse_base"] == "2"


def test_project_contracts_are_kept_under_the_files_bytes(tmp_path: Path, audit_cache: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import metax_audit.core.contracts as contracts_mod
    from metax_audit.pipeline.review import kept_project_contracts

    doc = tmp_path / "component-contracts.md"
    doc.write_text(DOC, encoding="utf-8")
    monkeypatch.setattr(contracts_mod, "default_contracts_path", lambda: doc)
    fresh = contracts_to_dict(contracts_mod.project_contracts())
    first = kept_project_contracts()  # parsed and kept
    assert contracts_to_dict(first) == fresh
    # the dataflow memo keys on the contracts as the cache keeps them: a served copy encodes to the same bytes
    from metax_audit.cache.records import registry

    assert registry().dumps(kept_project_contracts()) == registry().dumps(first)
    parsed: list[str] = []
    real_parse = contracts_mod.parse_contracts
    monkeypatch.setattr(contracts_mod, "parse_contracts", lambda text, path: parsed.append(path) or real_parse(text, path))
    assert contracts_to_dict(kept_project_contracts()) == fresh and parsed == []  # unchanged: not parsed
    doc.write_text(DOC.replace("LSE is base 2", "LSE is base e"), encoding="utf-8")
    edited = contracts_to_dict(kept_project_contracts())
    assert parsed == ["component-contracts.md"] and edited != fresh
    assert edited["observations"][0]["claim"] == "LSE is base e"
    assert contracts_to_dict(contracts_mod.project_contracts()) == edited and parsed == ["component-contracts.md"] * 2
