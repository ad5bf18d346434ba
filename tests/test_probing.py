# metax_audit.stages.probing: probes in real subprocesses (a crash and a hang become error results),
# backend and trace target mapping, findings with per-hypothesis evidence.
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from metax_audit.core.errors import ProbeError
from metax_audit.core.models import BackendChain, CallSite, Category, ChainHop, Location, ProbeResult, Severity
from metax_audit.stages.probing import (
    FAMILIES,
    PROBES,
    backend_targets,
    from_outcome,
    probe_findings,
    render_markdown,
    run_probes,
    targets_from_trace,
)

BAD = Path(__file__).parent / "fixtures" / "probing" / "bad_targets.py"
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")


def test_known_probes_and_families() -> None:
    for p in ("lse", "layout", "fp8-scale", "dcp", "query-count", "padding", "graph-capture"):
        assert p in PROBES
    for f in ("paged-decode", "paged-prefill", "ragged-prefill", "merge-states"):
        assert f in FAMILIES


@needs_torch
def test_subprocess_run_crash_and_timeout() -> None:
    ok = run_probes(target="torch-reference", family="paged-decode", probes=["lse"], device="cpu", timeout=120)
    assert [r.verdict for r in ok] == ["matched"]
    assert ok[0].matched == "base-e/[T,H]" and ok[0].hypotheses["base-2/[T,H]"] > 0.5
    assert ok[0].device and ok[0].device.startswith("cpu")

    crash = run_probes(target=f"{BAD}:segfault", family="paged-decode", probes=["layout"], device="cpu", timeout=120)
    assert crash[0].verdict == "error"
    assert "signal 11" in (crash[0].skipped_reason or "")

    hung = run_probes(target=f"{BAD}:hang", family="paged-decode", probes=["layout"], device="cpu", timeout=6)
    assert hung[0].verdict == "error" and "timed out" in (hung[0].skipped_reason or "")

    raised = run_probes(target=f"{BAD}:raises", family="paged-decode", probes=["layout"], device="cpu", timeout=120)
    assert raised[0].verdict == "error" and "illegal memory access" in (raised[0].skipped_reason or "")
    findings = list(probe_findings(crash + hung + raised))
    assert [f.rule for f in findings] == ["MXA411"] * 3
    assert all(f.severity is Severity.WARNING for f in findings)


def test_unknown_probe_and_family_are_could_not_audit() -> None:
    with pytest.raises(ProbeError):
        run_probes(target="torch-reference", family="paged-decode", probes=["nope"])
    with pytest.raises(ProbeError):
        run_probes(target="torch-reference", family="no-such-family", probes=["lse"])
    with pytest.raises(ProbeError):
        run_probes(target="x:y", family=None, probes=["lse"])


def test_backend_targets() -> None:
    fi = backend_targets("FLASHINFER")
    assert ("flashinfer:BatchDecodeWithPagedKVCacheWrapper", "paged-decode") in fi
    assert {f for _, f in fi} == {"paged-decode", "paged-prefill", "ragged-prefill", "merge-states"}
    assert ("torch-reference", "paged-decode") in backend_targets("torch-reference")
    with pytest.raises(ProbeError, match="MOD:CALLABLE"):
        backend_targets("triton")
    with pytest.raises(ProbeError):
        backend_targets("nonexistent")


def test_targets_from_trace() -> None:
    loc = Location("vllm_metax/v1/attention/backends/flashinfer.py", 10)
    calls = (
        CallSite(loc, "Impl.forward", "self._decode_wrapper.run", "flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper.run", "external"),
        CallSite(loc, "Impl.forward", "merge_state", "flashinfer.cascade.merge_state", "external"),
        CallSite(loc, "Impl.forward", "torch.empty", "torch.empty", "external"),
        CallSite(loc, "Impl.forward", "self._decode_wrapper.plan", "flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper.plan", "external"),
    )
    chain = BackendChain("FLASHINFER", "x.MacaFlashInferBackend", None, True,
                         (ChainHop("wrapper", "BatchPrefillWithRaggedKVCacheWrapper", "f.py", 3, "flashinfer.prefill.BatchPrefillWithRaggedKVCacheWrapper"),),
                         calls, ())
    assert targets_from_trace(chain) == [
        ("flashinfer:BatchDecodeWithPagedKVCacheWrapper", "paged-decode"),
        ("flashinfer:merge_state", "merge-states"),
        ("flashinfer:BatchPrefillWithRaggedKVCacheWrapper", "ragged-prefill"),
    ]
    assert targets_from_trace(BackendChain("X", "x.X", None, True, (), (), ())) == []


def _outcome(verdict: str, matched: str | None, **kw: object) -> dict:
    return {"probe": "lse", "family": "paged-decode", "target": "flashinfer:BatchDecodeWithPagedKVCacheWrapper", "verdict": verdict,
            "matched": matched, "expected": "base-e/[T,H]", "hypotheses": {"base-e/[T,H]": {"abs": 2.1, "rel": 0.4},
            "base-2/[T,H]": {"abs": 1e-6, "rel": 1e-7}, "base-e/[H,T]": {"abs": "inf", "rel": "inf"}}, "worst_error": 2.1,
            "device": {"device": "cuda", "gpu": "NVIDIA H200", "capability": "9.0", "torch": "2.11.0+cu130"},
            "cases": [{"name": "paged-decode/lens=[37, 64, 5]", "matched": matched}], **kw}


def test_mismatch_becomes_lse_finding_with_hypothesis_errors() -> None:
    r = from_outcome(_outcome("mismatch", "base-2/[T,H]"), rerun="python -m metax_audit.probes run ...")
    assert r.hypotheses["base-e/[H,T]"] == float("inf")
    [f] = list(probe_findings([r]))
    assert f.rule == "MXA400" and f.category is Category.LSE and f.severity is Severity.ERROR
    assert "matched 'base-2/[T,H]'" in f.message
    assert any("hypothesis base-2/[T,H]: worst abs error 1e-06" in e for e in f.evidence)
    assert any("NVIDIA H200" in e for e in f.evidence)
    assert any(e.startswith("rerun:") for e in f.evidence)


def test_matched_and_skipped_give_no_findings_not_checkable_gives_info() -> None:
    rs = [from_outcome(_outcome("matched", "base-e/[T,H]")),
          ProbeResult("graph-capture", "paged-decode", "t", "skipped", skipped_reason="needs CUDA"),
          ProbeResult("lse", "paged-decode", "torch-sdpa", "not-checkable", skipped_reason="control absent: return_lse")]
    fs = list(probe_findings(rs))
    assert [(f.rule, f.severity) for f in fs] == [("MXA420", Severity.INFO)]


def test_markdown_report_lists_every_result() -> None:
    rs = [from_outcome(_outcome("mismatch", "base-2/[T,H]")), ProbeResult("dcp", "merge-states", "m", "skipped", skipped_reason="needs CUDA")]
    md = render_markdown(rs, {"gpu": "NVIDIA H200", "packages": {"flashinfer-python": {"version": "0.2.6.post1"}}})
    assert "| lse | paged-decode |" in md and "**mismatch**" in md and "needs CUDA" in md and "0.2.6.post1" in md


def test_applicable_probes_per_family() -> None:
    from metax_audit.stages.probing import applicable

    assert "graph-capture" in applicable("paged-decode") and "query-count" not in applicable("paged-decode")
    assert applicable("merge-states") == ("lse", "dcp")
    assert applicable("no-such-family") == ()
