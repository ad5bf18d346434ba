# A hand-made set of stage outputs (a small port with a platform, two backends, a broken file)
# and the AuditReport built from it; the inventory and report tests and the golden files use it.
from __future__ import annotations

from pathlib import Path
from typing import Any

from metax_audit.core.findings import make_finding
from metax_audit.core.models import (
    AuditReport,
    BackendChain,
    CallArg,
    CallSite,
    Category,
    ChainHop,
    Comparison,
    ConfigSwitch,
    Difference,
    Discovery,
    FileComparison,
    Finding,
    Location,
    ParseProblem,
    ParseProblemKind,
    PriorityList,
    ProbeResult,
    Registration,
    Severity,
    SkippedFile,
    SnapshotInfo,
    SourceFile,
    StageRecord,
    TestRun,
    TraceResult,
    UpstreamInfo,
)
from metax_audit.stages.checks.inactive_path import check_inactive_paths
from metax_audit.stages.inventory import build_report

SNAP_ROOT = Path("/tmp/metax-audit-snap-k3j2")
PLATFORM = "vllm_metax/platform.py"
FI = "vllm_metax/v1/attention/backends/flashinfer.py"
TRITON = "vllm_metax/v1/attention/backends/triton_attn.py"
UTILS = "vllm_metax/v1/attention/backends/utils.py"
BROKEN = "vllm_metax/v1/attention/ops/broken.py"
GENERATED = "vllm_metax/v1/attention/ops/tuned_configs.py"
PKG = "vllm_metax.v1.attention.backends"

CASCADE_SWITCH = ConfigSwitch("vllm_config.model_config.disable_cascade_attn", "True", "vllm_config.model_config is not None", Location(PLATFORM, 88))


def _call(path: str, line: int, caller: str, text: str, resolved: str | None, origin: str, branch: str = "", **kw: Any) -> CallSite:
    return CallSite(Location(path, line), caller, text, resolved, origin, branch=branch, **kw)


def snapshot() -> SnapshotInfo:
    return SnapshotInfo("staged", "/srv/port", "0123456789abcdef0123456789abcdef01234567", True, SNAP_ROOT, "index", 412)


def discovery(switches: tuple[ConfigSwitch, ...] = (CASCADE_SWITCH,)) -> Discovery:
    return Discovery(
        root=SNAP_ROOT,
        port_package="vllm_metax",
        files=(
            SourceFile(TRITON, f"{PKG}.triton_attn", "glob", lines=310),
            SourceFile(PLATFORM, "vllm_metax.platform", "platform", lines=420),
            SourceFile(FI, f"{PKG}.flashinfer", "glob", lines=1200),
            SourceFile(BROKEN, "vllm_metax.v1.attention.ops.broken", "glob", problem=ParseProblem(ParseProblemKind.SYNTAX, "invalid syntax (line 3)", 3)),
            SourceFile(UTILS, f"{PKG}.utils", "reached-by-trace", lines=90),
            SourceFile(GENERATED, "vllm_metax.v1.attention.ops.tuned_configs", "glob", lines=41000),
        ),
        registrations=(
            Registration("attention-backend", "TRITON_ATTN", f"{PKG}.triton_attn.MacaTritonAttentionBackend", Location(PLATFORM, 41), True, TRITON),
            Registration("attention-backend", "FLASHINFER", f"{PKG}.flashinfer.MacaFlashInferBackend", Location(PLATFORM, 40), True, FI),
        ),
        priorities=(PriorityList("else", ("FLASHINFER", "TRITON_ATTN"), Location(PLATFORM, 60)),),
        switches=switches,
        callers={UTILS: (TRITON, FI, FI), FI: (PLATFORM,), TRITON: (PLATFORM,)},
        left_out=(SkippedFile("vllm_metax/v1/attention/backends/mla/common.py", "outside PATHS"),),
    )


def trace() -> TraceResult:
    decode = _call(FI, 120, f"{PKG}.flashinfer.FlashInferImpl.forward", "self._decode_wrapper.run",
                   "flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper.run", "external", "decode", via="self-attr",
                   args=(CallArg(None, 0, "query"), CallArg("k_scale", None, "layer._k_scale_float")))
    cascade = _call(FI, 151, f"{PKG}.flashinfer.FlashInferImpl.forward", "self._cascade_wrapper.run",
                    "flashinfer.cascade.MultiLevelCascadeAttentionWrapper.run", "external", "use_cascade / prefill")
    merge = _call(UTILS, 30, f"{PKG}.utils.merge", "merge_state", "vllm_metax.v1.attention.ops.merge_attn_states.merge_attn_states", "port")
    triton = _call(TRITON, 90, f"{PKG}.triton_attn.TritonAttentionImpl.forward", "unified_attention",
                   "vllm_metax.v1.attention.ops.triton_unified_attention.unified_attention", "port")
    fi_chain = BackendChain(
        name="FLASHINFER",
        class_path=f"{PKG}.flashinfer.MacaFlashInferBackend",
        registered_at=Location(PLATFORM, 40),
        active=True,
        chain=(
            ChainHop("backend", f"{PKG}.flashinfer.MacaFlashInferBackend", FI, 50),
            ChainHop("impl", f"{PKG}.flashinfer.FlashInferImpl", FI, 100),
            ChainHop("wrapper", "BatchDecodeWithPagedKVCacheWrapper", FI, 80, "flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper"),
        ),
        calls=(decode, cascade, merge),
        unresolved=(),
        capture_support="UNIFORM_SINGLE_TOKEN_DECODE",
    )
    tr_chain = BackendChain(
        name="TRITON_ATTN",
        class_path=f"{PKG}.triton_attn.MacaTritonAttentionBackend",
        registered_at=Location(PLATFORM, 41),
        active=False,
        chain=(ChainHop("backend", f"{PKG}.triton_attn.MacaTritonAttentionBackend", TRITON, 20),),
        calls=(triton,),
        unresolved=(),
    )
    return TraceResult(backends=(tr_chain, fi_chain), reached_files=(UTILS,), calls=(triton, decode))


def upstream() -> UpstreamInfo:
    return UpstreamInfo("vllm", "0.26.0", "pip:vllm==0.26.0 (cache ~/.cache/metax-audit)", Path("/cache/vllm-0.26.0"))


def comparison() -> Comparison:
    fi_diffs = (
        Difference("argument-commented-out", FI, 133, "FlashInferImpl.forward", False, "", "restore the argument or declare why the vendor kernel lacks it",
                   "probe fp8-scale on paged-decode", detail="k_scale=layer._k_scale_float is commented out", upstream_line=140),
        Difference("vendor-kernel-import", FI, 12, "<module>", True, "Metax Modification: use the MACA build of flashinfer", "keep",
                   "probe lse on paged-decode"),
        Difference("fallback-added", FI, 150, "FlashInferImpl.forward", True, "cascade path kept for parity", "keep while the switch is off",
                   "", detail="use_cascade branch calls the vendor cascade wrapper"),
        Difference("cosmetic", FI, 8, "Any", False, "", "none", "", detail="import Any from typing (not imported upstream)"),
        Difference("removed", FI, 0, "FlashInferTrtllmAPIDecode", False, "", "declare why the port drops it", "",
                   detail="upstream class FlashInferTrtllmAPIDecode has no port counterpart", upstream_line=412),
    )
    return Comparison(
        upstream=upstream(),
        base=UpstreamInfo("vllm", "0.25.0", "directory:/cache/vllm-0.25.0", Path("/cache/vllm-0.25.0")),
        files=(
            FileComparison(FI, "vllm/v1/attention/backends/flashinfer.py", False, {"MacaFlashInferBackend": "FlashInferBackend"}, fi_diffs, 2),
            FileComparison(TRITON, "vllm/v1/attention/backends/triton_attn.py", False),
            FileComparison(UTILS, None, True),
            FileComparison(PLATFORM, None, True),
        ),
    )


def findings() -> list[Finding]:
    return [
        make_finding("MXA001", Location(BROKEN, 3), "invalid syntax (line 3)", [f"{BROKEN}:3: `def f(:`"]),
        make_finding("MXA003", Location("."), "`pytest -x tests/attn` exited 1 on the snapshot", ["FAILED tests/attn/test_fi.py::test_decode"]),
        Finding("ZZZ100", Category.SIGNATURE, Severity.ERROR, Location(FI, 133, "FlashInferImpl.forward"),
                "call passes a keyword the installed kernel does not accept: kv_layout | 'HND'",
                (f"{FI}:133: self._decode_wrapper.run(..., kv_layout='HND')", "installed: flashinfer 0.2.6.post1 run(self, q, paged_kv_cache, *, k_scale=None, v_scale=None)")),
        Finding("ZZZ102", Category.KWARGS_SWALLOWED, Severity.WARNING, Location(TRITON, 90, "unified_attention"),
                "keyword `sinks` is swallowed by **kwargs of the vendor op", ("torch.ops.maca.unified_attention(q, k, v, **kwargs)",),
                True, "custom op, checked by probes"),
        make_finding("MXA002", Location(GENERATED), "file is 3.1 MB (limit 2 MB): generated code", ["size 3,145,728 bytes"]),
        Finding("ZZZ101", Category.UPSTREAM_DRIFT, Severity.INFO, Location(UTILS, 30, "merge"), "upstream renamed merge_attn_states' output argument", ()),
    ]


def probes() -> list[ProbeResult]:
    target = "flashinfer:BatchDecodeWithPagedKVCacheWrapper"
    return [
        ProbeResult("lse", "paged-decode", target, "matched", "base-e [T, H]", "base-e [T, H]", {"base-2 [T, H]": 0.693, "base-e [H, T]": 1.25, "base-e [T, H]": 2.4e-07}, 2.4e-07, "cpu"),
        ProbeResult("fp8-scale", "paged-decode", target, "mismatch", "ignored", "applied", {"applied": 0.5, "ignored": 1e-06, "inverted": 3.0, "swapped": 1.75}, 0.5, "cpu"),
        ProbeResult("layout", "paged-decode", target, "not-checkable", skipped_reason="control absent: run() has no kv_layout argument", device="cpu",
                    details={"signature": "run(self, q, paged_kv_cache)"}),
        ProbeResult("graph-capture", "ragged-prefill", "vllm_metax.v1.attention.ops.prefix_prefill:context_attention_fwd", "skipped",
                    skipped_reason="needs a CUDA device"),
    ]


def stages() -> list[StageRecord]:
    return [
        StageRecord("snapshot", True, 0.05, "staged index, 412 files"),
        StageRecord("discover", True, 0.12, "5 files, 2 registrations"),
        StageRecord("trace", True, 0.31, "2 backends"),
        StageRecord("introspect", False, 0.0, "no interpreter with flashinfer"),
        StageRecord("compare", True, 0.4, "4 files"),
        StageRecord("probe", True, 2.5, "4 probe results"),
    ]


def inputs(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = dict(
        snapshot=snapshot(),
        discovery=discovery(),
        trace=trace(),
        comparison=comparison(),
        findings=findings(),
        probes=probes(),
        stages=stages(),
        upstream=upstream(),
        environment={"python": "3.11.9", "torch": "2.13.0+cpu", "snapshot_site": f"{SNAP_ROOT}/vllm_metax", "stand_in": True},
        test_run=TestRun("pytest -x tests/attn", 1, 3.25, "FAILED tests/attn/test_fi.py::test_decode\n1 failed"),
        wall_seconds=3.44,
        waivers={"file": ".metax-audit-waivers.yaml", "applied": 1, "stale": []},
        tool_version="0.1.0",
        generated_at="2026-11-30T05:00:00+00:00",
    )
    data.update(overrides)
    if data["discovery"] is not None:  # the inactive-path check runs in the pipeline's checks stage
        data["findings"] = [*data["findings"], *check_inactive_paths(data["discovery"], data["comparison"], data["trace"])]
    return data


def make_report(**overrides: Any) -> AuditReport:
    return build_report(**inputs(**overrides))
