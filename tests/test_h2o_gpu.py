# On a CUDA device: the Triton H2O kernel against the dense fp32 reference on a small grid of
# dtypes, head dims, page sizes, layouts, page formats and LSE sources (skips cleanly without one).
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def _need_triton():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the Triton kernel cannot run here")
    pytest.importorskip("triton")
    return torch


GRID = [
    # dtype, head_dim, page, layout, paging, lse, reduce
    ("bfloat16", 128, 16, "NHD", "block_table", "2", "sum"),
    ("bfloat16", 64, 64, "HND", "indptr", None, "mean"),
    ("float16", 256, 16, "HND", "block_table", "e", "sum"),
    ("float8_e4m3fn", 128, 64, "NHD", "indptr", "2", "sum"),
    ("float8_e4m3fn", 64, 16, "HND", "block_table", None, "mean"),
]


@pytest.mark.parametrize(("dtype", "head_dim", "page", "layout", "paging", "lse", "reduce"), GRID)
def test_triton_kernel_matches_reference(dtype, head_dim, page, layout, paging, lse, reduce):
    torch = _need_triton()
    from metax_audit.probes.h2o import build_case, checks_pass, score_checks, true_lse
    from metax_audit.stages.probing.kernels import h2o_scores, h2o_scores_reference

    lens = (1, 0, 333, 2 * page, 20 * page + 3)
    fp8 = dtype == "float8_e4m3fn"
    case = build_case(lens=lens, q_heads=16, kv_heads=4, head_dim=head_dim, page_size=page, dtype=dtype, kv_layout=layout,
                      paging=paging, device="cuda", seed=head_dim + page, k_scale=0.125 if fp8 else None)
    call = {"reduce": reduce}
    if lse:
        call.update(lse=true_lse(case, lse), lse_base=lse)
    out = h2o_scores(case.q, case.kv_cache, backend="triton", **case.kwargs(**call))
    ref = h2o_scores_reference(case.q, case.kv_cache, **case.kwargs(**call))
    chk = score_checks(out, ref, case.lens, case.group, reduce)
    assert out.dtype == torch.float32 and out.is_cuda
    assert checks_pass(chk), chk


def test_block_scores_and_csr_agree_on_gpu():
    torch = _need_triton()
    from metax_audit.probes.h2o import build_case
    from metax_audit.stages.probing.kernels import block_scores

    bt = build_case(lens=(70, 0, 500), device="cuda", seed=11)
    csr = build_case(lens=(70, 0, 500), device="cuda", seed=11, paging="indptr")
    a = block_scores(bt.q, bt.kv_cache, backend="triton", **bt.kwargs())
    b = block_scores(csr.q, csr.kv_cache, backend="triton", **csr.kwargs())
    assert a.shape == (3, 2, 32)
    assert torch.allclose(a, b, rtol=1e-6, atol=1e-8)
    assert torch.allclose(a.sum(-1)[[0, 2]], torch.full((2, 2), 4.0, device="cuda"), atol=1e-3)


def test_h2o_probe_matches_on_cuda():
    _need_triton()
    from metax_audit.probes.base import ProbeContext
    from metax_audit.probes.runner import run_one

    out = run_one("h2o", "h2o-scores", "metax-audit", ProbeContext(device="cuda"))
    assert out.verdict == "matched", (out.matched, out.details)
