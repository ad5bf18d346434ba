# CPU tests of the H2O score reference and the public API's CPU path: an independent loop-level
# formula, every cache form and page format, padding, mass, LSE bases, FP8, and block sums.
from __future__ import annotations

import math
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from metax_audit.probes.h2o import build_case, true_lse  # noqa: E402
from metax_audit.stages.probing.kernels import block_scores, block_scores_reference, h2o_scores, h2o_scores_reference  # noqa: E402

LENS = (37, 0, 300, 16, 129)


def _naive(case):
    """Loop-level formula from the definition, reading the cache through the table by hand."""
    kv = case.kv_cache
    bt, lens = case.paging["block_table"], case.lens
    hkv = kv.shape[3] if case.kv_layout == "NHD" else kv.shape[2]
    page = kv.shape[2] if case.kv_layout == "NHD" else kv.shape[3]
    out = torch.zeros(len(lens), hkv, max(lens))
    for r, n in enumerate(lens):
        for g in range(hkv):
            keys = []
            for t in range(n):
                p, s = int(bt[r, t // page]), t % page
                keys.append(kv[p, 0, s, g] if case.kv_layout == "NHD" else kv[p, 0, g, s])
            if not keys:
                continue
            k = torch.stack(keys).double()
            for h in range(g * case.group, (g + 1) * case.group):
                out[r, g, :n] += torch.softmax(k @ case.q[r, h].double() * case.scale, 0).float()
    return out


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_reference_matches_loop_formula(layout):
    case = build_case(lens=(5, 0, 40), q_heads=4, kv_heads=2, head_dim=16, page_size=16, kv_layout=layout, seed=3)
    got = h2o_scores_reference(case.q, case.kv_cache, **case.kwargs())
    want = _naive(case)
    assert got.shape == (3, 2, 40)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-6)


def test_layouts_and_page_formats_agree():
    base = build_case(lens=LENS, seed=1)
    ref = h2o_scores_reference(base.q, base.kv_cache, **base.kwargs())
    for layout in ("NHD", "HND"):
        for paging in ("block_table", "indptr"):
            c = build_case(lens=LENS, seed=1, kv_layout=layout, paging=paging)
            out = h2o_scores(c.q, c.kv_cache, **c.kwargs())
            assert torch.allclose(out, ref, rtol=1e-5, atol=1e-7), (layout, paging)


def test_cache_forms_are_equivalent():
    c = build_case(lens=LENS, seed=2)
    kw = c.kwargs()
    ref = h2o_scores_reference(c.q, c.kv_cache, **kw)
    forms = {
        "vllm-flash-attn [2, pages, ...]": c.kv_cache.transpose(0, 1).contiguous(),
        "(k, v) pair": (c.kv_cache[:, 0], c.kv_cache[:, 1]),
        "k alone": c.kv_cache[:, 0].contiguous(),
    }
    for name, cache in forms.items():
        assert torch.equal(h2o_scores_reference(c.q, cache, **kw), ref), name
    with pytest.raises(ValueError, match="K/V axis"):
        h2o_scores_reference(c.q, torch.zeros(3, 3, 16, 2, 64), **kw)


def test_padding_is_exactly_zero_and_poison_is_never_read():
    c = build_case(lens=LENS, seed=4)
    assert torch.isnan(c.kv_cache.float()).any()  # the poison is really there
    out = h2o_scores(c.q, c.kv_cache, **c.kwargs(), max_seq_len=320)
    assert out.shape == (5, 2, 320)
    assert torch.isfinite(out).all()
    for r, n in enumerate(LENS):
        assert (out[r, :, n:] == 0).all()
        if n:
            assert (out[r, :, :n] > 0).all()
    with pytest.raises(ValueError, match="shorter"):
        h2o_scores_reference(c.q, c.kv_cache, **c.kwargs(), max_seq_len=100)


@pytest.mark.parametrize(("reduce", "mass"), [("sum", 4.0), ("mean", 1.0)])
def test_mass_conservation(reduce, mass):
    c = build_case(lens=LENS, seed=5)
    out = h2o_scores(c.q, c.kv_cache, **c.kwargs(reduce=reduce))
    live = [i for i, n in enumerate(LENS) if n]
    assert torch.allclose(out[live].sum(-1), torch.full((len(live), 2), mass), atol=1e-4)
    assert (out[1] == 0).all()


@pytest.mark.parametrize("base", ["e", "2"])
def test_given_lse_matches_own_softmax_and_wrong_base_breaks_mass(base):
    c = build_case(lens=LENS, seed=6)
    own = h2o_scores(c.q, c.kv_cache, **c.kwargs())
    lse = true_lse(c, base)
    given = h2o_scores(c.q, c.kv_cache, **c.kwargs(lse=lse, lse_base=base))
    assert torch.allclose(given, own, rtol=1e-4, atol=1e-7)
    wrong = "2" if base == "e" else "e"
    mislabeled = h2o_scores(c.q, c.kv_cache, **c.kwargs(lse=lse, lse_base=wrong))
    assert (mislabeled[0].sum(-1) - 4.0).abs().min() > 0.1


def test_argument_errors():
    c = build_case(lens=(5,), seed=0)
    with pytest.raises(ValueError, match="lse_base"):
        h2o_scores(c.q, c.kv_cache, **c.kwargs(lse=torch.zeros(1, 8)))
    with pytest.raises(ValueError, match="reduce"):
        h2o_scores(c.q, c.kv_cache, **c.kwargs(reduce="max"))
    with pytest.raises(ValueError, match="kv_layout"):
        h2o_scores(c.q, c.kv_cache, **c.kwargs(kv_layout="HDN"))
    with pytest.raises(ValueError, match="backend"):
        h2o_scores(c.q, c.kv_cache, **c.kwargs(), backend="cuda")
    with pytest.raises(ValueError, match="not both"):
        h2o_scores(c.q, c.kv_cache, **c.kwargs(), indptr=torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="multiple"):
        h2o_scores_reference(c.q[:, :3], c.kv_cache, **c.kwargs())


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="this torch has no float8_e4m3fn")
def test_fp8_cache_applies_k_scale_as_float_or_tensor():
    c = build_case(lens=(40, 7), dtype="float8_e4m3fn", k_scale=0.125, seed=7)
    assert c.kv_cache.dtype == torch.float8_e4m3fn
    dequant = (c.kv_cache.float() * 0.125).to(torch.float32)
    want = h2o_scores_reference(c.q, dequant, **{k: v for k, v in c.kwargs().items() if k != "k_scale"})
    as_float = h2o_scores(c.q, c.kv_cache, **c.kwargs())
    as_tensor = h2o_scores(c.q, c.kv_cache, **c.kwargs(k_scale=torch.tensor(0.125)))
    ignored = h2o_scores(c.q, c.kv_cache, **c.kwargs(k_scale=None))
    assert torch.allclose(as_float, want, rtol=1e-5, atol=1e-7)
    assert torch.allclose(as_tensor, want, rtol=1e-5, atol=1e-7)
    assert not torch.allclose(ignored, want, rtol=1e-2, atol=1e-4)


def test_block_scores_follow_table_order():
    c = build_case(lens=LENS, seed=8)
    tok = h2o_scores(c.q, c.kv_cache, **c.kwargs())
    blk = block_scores(c.q, c.kv_cache, **c.kwargs())
    assert blk.shape == (5, 2, math.ceil(300 / 16))
    assert torch.allclose(blk[2, :, 3], tok[2, :, 48:64].sum(-1))
    assert torch.allclose(blk[0, :, 2], tok[0, :, 32:37].sum(-1))  # partial last page
    assert (blk[0, :, 3:] == 0).all() and (blk[1] == 0).all()
    assert torch.allclose(blk.sum(-1), tok.sum(-1), atol=1e-5)
    assert torch.equal(block_scores_reference(c.q, c.kv_cache, **c.kwargs()), blk)


def test_importing_the_kernels_loads_neither_torch_nor_triton():
    code = "import sys, metax_audit.stages.probing.kernels; print('torch' in sys.modules, 'triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split() == ["False", "False"]
