# CPU proof that the probes discriminate: the torch reference matches every expected hypothesis and
# each deliberately wrong variant is identified as its own wrong hypothesis (in-process, fast).
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from metax_audit.probes.base import ProbeContext  # noqa: E402
from metax_audit.probes.runner import run_one  # noqa: E402

WV = "metax_audit.probes.wrong_variants"

REFERENCE_CASES = [
    ("lse", "paged-decode", "torch-reference", {}, "base-e/[T,H]"),
    ("lse", "paged-prefill", "torch-reference", {}, "base-e/[T,H]"),
    ("lse", "ragged-prefill", "torch-reference", {}, "base-e/[T,H]"),
    ("lse", "merge-states", "torch-reference:base-e", {}, "merge-base-e"),
    ("lse", "merge-states", "torch-reference:base-2", {}, "merge-base-2"),
    ("layout", "paged-decode", "torch-reference", {}, "as-told"),
    ("layout", "paged-prefill", "torch-reference", {}, "as-told"),
    ("layout", "ragged-prefill", "torch-reference", {}, "as-told"),
    ("fp8-scale", "paged-decode", "torch-reference", {}, "applied"),
    ("fp8-scale", "paged-prefill", "torch-reference", {}, "applied"),
    ("fp8-scale", "ragged-prefill", "torch-reference", {}, "applied"),
    ("dcp", "paged-decode", "torch-reference", {}, "consistent"),
    ("dcp", "merge-states", "torch-reference:base-e", {}, "consistent"),
    ("dcp", "dcp-local-seq-lens", "torch-reference", {}, "correct"),
    ("query-count", "paged-prefill", "torch-reference", {}, "bottom-right-causal"),
    ("query-count", "ragged-prefill", "torch-reference", {}, "bottom-right-causal"),
    ("padding", "paged-decode", "torch-reference", {}, "neutral"),
    ("padding", "paged-prefill", "torch-reference", {}, "neutral"),
    ("padding", "ragged-prefill", "torch-reference", {}, "neutral"),
    ("graph-capture", "paged-decode", "torch-reference", {"simulate": "1"}, "follows-new-inputs"),
]


@pytest.mark.parametrize(("probe", "family", "target", "options", "hypothesis"), REFERENCE_CASES)
def test_reference_matches_expected(probe: str, family: str, target: str, options: dict, hypothesis: str) -> None:
    out = run_one(probe, family, target, ProbeContext(device="cpu", options=options))
    assert out.verdict == "matched", (out.skipped_reason, out.evidence)
    assert out.matched == hypothesis == out.expected
    assert out.worst_error is not None and out.worst_error < 0.02
    # every other hypothesis is far away: the inputs discriminate (cases with their own
    # expectation, such as an empty sequence's `neutral`, are judged on their own)
    others = [e.abs for c in out.cases if c.expected is None for h, e in c.errors.items() if h != hypothesis]
    assert others and min(others) > 0.1
    assert all(c.matched == c.expected for c in out.cases if c.expected is not None)


WRONG_CASES = [
    ("lse", "paged-decode", f"{WV}:log2_lse_decode", {}, "base-2/[T,H]"),
    ("lse", "paged-decode", f"{WV}:transposed_lse_decode", {}, "base-e/[H,T]"),
    ("lse", "merge-states", f"{WV}:merge_assumes_base2", {}, "merge-base-2"),
    ("fp8-scale", "paged-decode", f"{WV}:ignored_scale_decode", {}, "ignored"),
    ("fp8-scale", "paged-decode", f"{WV}:inverted_scale_decode", {}, "inverted"),
    ("fp8-scale", "paged-decode", f"{WV}:swapped_scale_decode", {}, "swapped"),
    ("fp8-scale", "paged-decode", f"{WV}:doubled_scale_decode", {}, "applied-twice"),
    ("dcp", "merge-states", f"{WV}:merge_assumes_base2", {}, "producer-base-e/merge-base-2"),
    ("dcp", "paged-decode", f"{WV}:log2_lse_decode", {}, "producer-base-2/merge-base-e"),
    ("dcp", "paged-decode", "torch-reference", {"merge": "torch-reference:base-2"}, "producer-base-e/merge-base-2"),
    ("query-count", "ragged-prefill", f"{WV}:top_left_causal_ragged", {}, "top-left-causal"),
    ("graph-capture", "paged-decode", f"{WV}:StaleLengthDecode()", {"simulate": "1"}, "stale-lengths"),
    ("fp8-scale", "paged-decode", f"{WV}:k_scale_ignored_decode", {}, "k-scale-ignored"),
    ("fp8-scale", "paged-decode", f"{WV}:v_scale_ignored_decode", {}, "v-scale-ignored"),
    ("layout", "paged-decode", f"{WV}:identity_block_table_decode", {}, "block-table-ignored"),
    ("lse", "paged-decode", f"{WV}:identity_block_table_decode", {}, "block-table-ignored"),
    ("lse", "paged-decode", f"{WV}:nan_on_empty_decode", {}, "nan-on-empty"),
    ("padding", "paged-decode", f"{WV}:nan_on_empty_decode", {}, "nan-in-padding"),
    ("dcp", "paged-decode", f"{WV}:nan_on_empty_decode", {}, "nan-on-empty"),
]


@pytest.mark.parametrize(("probe", "family", "target", "options", "wrong"), WRONG_CASES)
def test_wrong_variant_is_identified(probe: str, family: str, target: str, options: dict, wrong: str) -> None:
    out = run_one(probe, family, target, ProbeContext(device="cpu", options=options))
    assert out.verdict == "mismatch", (out.skipped_reason, out.evidence)
    assert out.matched == wrong
    assert out.hypotheses[wrong]["abs"] < 0.02


def _case_matches(out: object) -> dict[str, str | None]:
    return {c.name: c.matched for c in out.cases}  # type: ignore[attr-defined]


def test_hnd_read_as_nhd_is_caught_only_in_hnd_cases() -> None:
    out = run_one("layout", "paged-decode", f"{WV}:hnd_read_as_nhd_decode", ProbeContext(device="cpu"))
    assert out.verdict == "mismatch"
    per_case = _case_matches(out)
    assert {m for n, m in per_case.items() if n.startswith("HND")} == {"other-layout"}
    assert {m for n, m in per_case.items() if n.startswith("NHD")} == {"as-told"}


def test_ignored_strides_caught_on_joint_views() -> None:
    out = run_one("layout", "paged-decode", f"{WV}:ignores_strides_decode", ProbeContext(device="cpu"))
    assert out.verdict == "mismatch"
    per_case = _case_matches(out)
    assert {m for n, m in per_case.items() if "joint" in n} == {"ignores-strides"}
    assert {m for n, m in per_case.items() if "split" in n} == {"as-told"}
    assert any("strides" in k for k in out.details)


def test_padded_head_returned_is_caught() -> None:
    out = run_one("padding", "paged-decode", f"{WV}:padded_head_decode", ProbeContext(device="cpu"))
    assert out.verdict == "mismatch"
    assert _case_matches(out)["padded heads: Hq=6 Hkv=2"] == "padded-head-returned"


def test_compacted_padding_rows_are_caught() -> None:
    out = run_one("padding", "paged-decode", f"{WV}:compacting_decode", ProbeContext(device="cpu"))
    assert out.verdict == "mismatch"
    assert "rows-compacted" in (out.matched or "")


def test_dropped_interleave_offset_is_caught_only_with_interleave() -> None:
    out = run_one("dcp", "dcp-local-seq-lens", f"{WV}:dropped_interleave_offset_local_lens", ProbeContext(device="cpu"))
    assert out.verdict == "mismatch"
    per_case = _case_matches(out)
    assert {m for n, m in per_case.items() if n.endswith("interleave=1")} == {"correct"}
    assert {m for n, m in per_case.items() if not n.endswith("interleave=1")} == {"dropped-interleave-offset"}
    assert any(n.startswith("MTP") for n in per_case)


def test_missing_control_fails_closed_with_signature() -> None:
    out = run_one("lse", "paged-decode", "torch-sdpa", ProbeContext(device="cpu"))
    assert out.verdict == "not-checkable"
    assert out.skipped_reason == "control absent: return_lse"
    assert any("sdpa" in e or "sm_scale" in e for e in out.evidence)
    out = run_one("fp8-scale", "paged-decode", "torch-sdpa", ProbeContext(device="cpu"))
    assert out.verdict == "not-checkable" and "k_scale" in (out.skipped_reason or "")


def test_graph_capture_skips_on_cpu_without_simulation() -> None:
    out = run_one("graph-capture", "paged-decode", "torch-reference", ProbeContext(device="cpu"))
    assert out.verdict == "skipped" and "CUDA" in (out.skipped_reason or "")


def test_flashinfer_target_skips_without_cuda() -> None:
    out = run_one("lse", "paged-decode", "flashinfer:BatchDecodeWithPagedKVCacheWrapper", ProbeContext(device="cpu"))
    assert out.verdict == "skipped"


def test_triton_op_adapter_skips_with_the_import_error(tmp_path) -> None:
    from metax_audit.probes.base import ProbeSkip
    from metax_audit.probes.families.vllm_ops import load_op

    ops = tmp_path / "vllm" / "v1" / "attention" / "ops"
    ops.mkdir(parents=True)
    (ops / "triton_merge_attn_states.py").write_text("import no_such_module_for_probe_test\n")
    ctx = ProbeContext(device="cuda", options={"vllm_source": str(tmp_path)})
    with pytest.raises(ProbeSkip, match=r"import failed: ModuleNotFoundError"):
        load_op("vllm-triton:merge_attn_states", ctx)
    with pytest.raises(ProbeSkip, match="not found"):
        load_op("vllm-triton:decode_attention_fwd", ctx)


def test_triton_targets_skip_on_cpu() -> None:
    out = run_one("lse", "merge-states", "vllm-triton:merge_attn_states", ProbeContext(device="cpu"))
    assert out.verdict == "skipped" and "CUDA" in (out.skipped_reason or "")


def test_host_sync_during_capture_is_named_with_its_line() -> None:
    import inspect

    from metax_audit.probes import wrong_variants

    out = run_one("graph-capture", "paged-decode", f"{WV}:HostSyncDecode()", ProbeContext(device="cpu", options={"simulate": "1"}))
    assert out.verdict == "mismatch"
    src, first = inspect.getsourcelines(wrong_variants.HostSyncDecode.run)
    line = first + next(i for i, ln in enumerate(src) if "int(m[\"seq_lens\"][b])" in ln)
    assert out.matched == f"not-capturable: host sync at metax_audit/probes/wrong_variants.py:{line}"
    assert "Tensor.__int__()" in out.details["host sync"]


def test_plain_callable_graph_capture_is_not_checkable_on_cpu() -> None:
    out = run_one("graph-capture", "paged-decode", f"{WV}:host_sync_plain_decode", ProbeContext(device="cpu", options={"simulate": "1"}))
    assert out.verdict == "not-checkable"
    assert "plan/run" in (out.skipped_reason or "")


def test_declared_nan_on_empty_is_held_to_its_declaration() -> None:
    from metax_audit.probes import wrong_variants
    from metax_audit.probes.base import ProbeContext as Ctx
    from metax_audit.probes.lse import run as lse_run
    from metax_audit.probes.registry import wrap_callable

    fn = wrong_variants.nan_on_empty_decode
    target = wrap_callable("declared", "paged-decode", fn, ("sm_scale", "kv_layout", "k_scale", "v_scale", "return_lse"))
    target.declares["empty"] = "nan-on-empty"
    out = lse_run(target, Ctx(device="cpu"))
    assert out.verdict == "matched", [(c.name, c.matched, c.expected) for c in out.cases]
    target.declares["empty"] = "neutral"
    assert lse_run(target, Ctx(device="cpu")).matched == "nan-on-empty"


def test_identity_block_table_reads_stay_in_bounds_and_are_wrong() -> None:
    from metax_audit.probes import _scenario as sc

    for lens in ([37, 64, 5], [37, 0, 20, 0], [64, 64, 64]):
        s = sc.build("paged-decode", device="cpu", seed=0, seq_lens=lens)
        ident = sc.identity_table(s.block_table)
        assert int(ident.max()) < s.k.shape[0]
        used = s.block_table >= 0
        assert not bool((s.block_table[used] == ident[used]).any())
