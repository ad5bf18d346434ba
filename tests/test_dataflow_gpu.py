# On a GPU with FlashInfer 0.2.x: the flow the dataflow check flags (FlashInfer prefill LSEs merged
# by a base-e merge) really gives wrong attention, and the `* ln 2` conversion it accepts fixes it.
from __future__ import annotations

import math

import pytest

# FlashInfer 0.2.6 imports torch's pybind helpers that warn on newer torch: third-party noise.
pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning"), pytest.mark.filterwarnings("ignore::UserWarning")]


def _need_gpu_flashinfer():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the FlashInfer kernels cannot run here")
    try:
        import flashinfer
    except Exception as exc:  # an sdist without a toolchain fails in many ways; all mean "cannot run"
        pytest.skip(f"flashinfer not importable: {type(exc).__name__}: {exc}")
    return torch, flashinfer


def _merge_base_e(o_a, lse_a, o_b, lse_b):
    """vLLM's merge_attn_states semantics in torch: weights exp(lse - max), LSE [heads, tokens]."""
    m = lse_a.maximum(lse_b)
    w_a, w_b = (lse_a - m).exp(), (lse_b - m).exp()
    w_a, w_b = (w_a / (w_a + w_b)).T.unsqueeze(-1), (w_b / (w_a + w_b)).T.unsqueeze(-1)
    return o_a.float() * w_a + o_b.float() * w_b


def test_flashinfer_prefill_lse_into_base_e_merge(record_property):
    torch, flashinfer = _need_gpu_flashinfer()
    g = torch.Generator(device="cpu").manual_seed(0)
    dev, H, D = "cuda", 4, 128
    ctx_lens, new_lens = [37, 64, 5], [6, 17, 1]
    scale = 1 / math.sqrt(D)
    ctx_total, new_total = sum(ctx_lens), sum(new_lens)
    q = torch.randn(new_total, H, D, generator=g).half().to(dev)
    k_ctx, v_ctx = (torch.randn(ctx_total, H, D, generator=g).half().to(dev) for _ in range(2))
    k_new, v_new = (torch.randn(new_total, H, D, generator=g).half().to(dev) for _ in range(2))
    qo = torch.tensor([0, *torch.tensor(new_lens).cumsum(0).tolist()], dtype=torch.int32, device=dev)
    kv_ctx = torch.tensor([0, *torch.tensor(ctx_lens).cumsum(0).tolist()], dtype=torch.int32, device=dev)
    ws = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=dev)

    context = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
    context.plan(qo, kv_ctx, H, H, D, causal=False, sm_scale=scale, q_data_type=torch.float16)
    o_ctx, lse_ctx = context.run(q, k_ctx, v_ctx, return_lse=True)
    new = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(torch.empty_like(ws), "NHD")
    new.plan(qo, qo, H, H, D, causal=True, sm_scale=scale, q_data_type=torch.float16)
    o_new, lse_new = new.run(q, k_new, v_new, return_lse=True)

    # fp32 reference: each new token sees its request's whole context and the new tokens up to itself.
    ref = torch.empty(new_total, H, D, device=dev)
    for r, (c, n) in enumerate(zip(ctx_lens, new_lens, strict=True)):
        qs, cs = int(qo[r]), int(kv_ctx[r])
        k = torch.cat([k_ctx[cs:cs + c], k_new[qs:qs + n]]).float()
        v = torch.cat([v_ctx[cs:cs + c], v_new[qs:qs + n]]).float()
        s = torch.einsum("qhd,khd->hqk", q[qs:qs + n].float(), k) * scale
        mask = torch.arange(c + n, device=dev)[None, :] > (c + torch.arange(n, device=dev))[:, None]
        s = s.masked_fill(mask[None], float("-inf"))
        ref[qs:qs + n] = torch.einsum("hqk,khd->qhd", s.softmax(-1), v)

    as_produced = _merge_base_e(o_ctx, lse_ctx.T, o_new, lse_new.T)  # what the port does
    converted = _merge_base_e(o_ctx, (lse_ctx * math.log(2)).T, o_new, (lse_new * math.log(2)).T)
    err_bad = (as_produced - ref).abs().max().item()
    err_ok = (converted - ref).abs().max().item()
    record_property("max_abs_error_unconverted", err_bad)
    record_property("max_abs_error_converted", err_ok)
    print(f"base-2 LSE merged as base e: max abs error {err_bad:.3g}; after * ln2: {err_ok:.3g}")
    assert err_ok < 2e-2
    assert err_bad > 10 * err_ok
