# CPU tests of the h2o probe: the reference and the kernel's CPU path match, and each wrong
# variant (ignored LSE base, interleaved groups, mean for sum, leaking padding) is named.
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from metax_audit.probes.base import ProbeContext  # noqa: E402
from metax_audit.probes.h2o import CONTROLS, build_case, probe_h2o, score_checks, topk_agreement  # noqa: E402
from metax_audit.probes.registry import registry, wrap_callable  # noqa: E402
from metax_audit.probes.runner import run_one  # noqa: E402
from metax_audit.stages.probing.kernels import h2o_scores_reference  # noqa: E402

CTX = ProbeContext(device="cpu")


def _wrap(fn):
    return wrap_callable(f"test:{fn.__name__}", "h2o-scores", fn, CONTROLS)


def assumes_base_2(q, kv_cache, *, lse=None, lse_base=None, **kw):
    """Ignores the declared base: FlashInfer-style log2 LSE assumed whatever the caller says."""
    return h2o_scores_reference(q, kv_cache, lse=lse, lse_base=None if lse is None else "2", **kw)


def interleaved_groups(q, kv_cache, *, lse=None, **kw):
    """Maps query head h to kv head h % Hkv, a classic GQA indexing slip."""
    hq = q.shape[1]
    hkv = hq // 4
    order = torch.arange(hq).reshape(4, hkv).t().reshape(-1)
    return h2o_scores_reference(q[:, order], kv_cache, lse=None if lse is None else lse[:, order], **kw)


def mean_for_sum(q, kv_cache, *, reduce="sum", **kw):
    return h2o_scores_reference(q, kv_cache, reduce="mean", **kw)


def leaky_padding(q, kv_cache, **kw):
    out = h2o_scores_reference(q, kv_cache, **kw)
    return torch.where(out == 0, torch.full_like(out, 1e-3), out)


def no_scale_control(q, kv_cache, *, block_table, seq_lens):
    return h2o_scores_reference(q, kv_cache, block_table=block_table, seq_lens=seq_lens, scale=0.125)


def vllm_only(q, kv_cache, *, block_table, seq_lens, scale, kv_layout="NHD", reduce="sum"):
    return h2o_scores_reference(q, kv_cache, block_table=block_table, seq_lens=seq_lens, scale=scale,
                                kv_layout=kv_layout, reduce=reduce)


def test_family_and_probe_are_discovered():
    reg = registry()
    assert "h2o" in reg.probes and "h2o-scores" in reg.families
    assert "metax_audit.probes.h2o" not in reg.broken


@pytest.mark.parametrize("target", ["torch-reference", "metax-audit"])
def test_builtin_targets_match(target):
    out = run_one("h2o", "h2o-scores", target, CTX)
    assert out.verdict == "matched", (out.matched, out.evidence)
    assert out.details["wrong_base"]["detected_by_mass_check"] is True
    assert out.details["wrong_base"]["mass_dev_declared_wrong"] > 0.1
    for chk in out.details["checks"].values():
        assert chk["padding_zero"] and chk["mass_max_dev"] < 1e-3 and chk["rel_err"] < 1e-4


def test_ignored_lse_base_is_caught():
    out = probe_h2o(_wrap(assumes_base_2), CTX)
    assert out.verdict == "mismatch"
    per_case = {c.name: c.matched for c in out.cases}
    assert per_case["hnd-block-table-lse-base-e"] == "lse-read-as-base-2"
    assert per_case["nhd-flashinfer-csr-lse-base2"] == "correct"
    assert out.details["wrong_base"]["detected_by_mass_check"] is False


def test_interleaved_group_mapping_is_named():
    out = probe_h2o(_wrap(interleaved_groups), CTX)
    assert out.verdict == "mismatch"
    assert out.cases[0].matched == "interleaved-groups"


def test_mean_instead_of_sum_is_named():
    out = probe_h2o(_wrap(mean_for_sum), CTX)
    assert out.verdict == "mismatch"
    assert out.cases[0].matched == "reduce-mean"


def test_leaking_padding_fails_the_zero_check():
    out = probe_h2o(_wrap(leaky_padding), CTX)
    assert out.verdict == "mismatch"
    assert not out.details["checks"]["nhd-block-table-own-lse"]["padding_zero"]


def test_missing_scale_control_is_not_checkable():
    from metax_audit.probes.base import ControlAbsent

    with pytest.raises(ControlAbsent):
        probe_h2o(_wrap(no_scale_control), CTX)


def test_absent_optional_controls_are_reported_not_faked():
    out = probe_h2o(_wrap(vllm_only), CTX)
    assert out.verdict == "matched"
    assert len(out.cases) == 2
    assert any("indptr" in s for s in out.details["not_checked"])
    assert any("LSE" in s for s in out.details["not_checked"])
    assert "wrong_base" not in out.details


def test_topk_agreement_counts_swaps_and_near_ties():
    ref = torch.tensor([[[0.4, 0.3, 0.2, 0.1]]], dtype=torch.float64)
    swapped = torch.tensor([[[0.4, 0.2, 0.3, 0.1]]], dtype=torch.float64)
    assert topk_agreement(ref, ref, [4])["keep_50"] == {"rows": 1, "differ": 0, "near_ties": 0}
    assert topk_agreement(swapped, ref, [4])["keep_25"]["differ"] == 0
    assert topk_agreement(swapped, ref, [4])["keep_50"]["differ"] == 1
    tie_ref = torch.tensor([[[0.4, 0.3, 0.3 * (1 - 1e-9), 0.1]]], dtype=torch.float64)
    tie_out = torch.tensor([[[0.4, 0.3 * (1 - 1e-9), 0.3, 0.1]]], dtype=torch.float64)
    res = topk_agreement(tie_out, tie_ref, [4])["keep_50"]
    assert res == {"rows": 1, "differ": 0, "near_ties": 1}
    # equal scores: the lower position is kept
    flat = torch.tensor([[[0.25, 0.25, 0.25, 0.25]]], dtype=torch.float64)
    assert topk_agreement(flat, flat, [4])["keep_50"]["differ"] == 0


def test_score_checks_flag_nan_and_lost_mass():
    c = build_case(lens=(20, 5), seed=1)
    ref = h2o_scores_reference(c.q, c.kv_cache, **c.kwargs())
    bad = ref.clone()
    bad[0, 0, 3] = float("nan")
    chk = score_checks(bad, ref, c.lens, c.group)
    assert not chk["finite"]
    half = score_checks(ref * 0.5, ref, c.lens, c.group)
    assert half["mass_max_dev"] == pytest.approx(2.0, abs=1e-4)
