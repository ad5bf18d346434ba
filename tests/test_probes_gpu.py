# On a CUDA device: the probes against FlashInfer 0.2.x and the torch reference on the GPU (what
# reports/probes/ records); skipped cleanly where there is no device or no FlashInfer.
from __future__ import annotations

import importlib.util

import pytest

# Warnings raised inside the kernel stack (FlashInfer's JIT, torch's extension loader) are not ours.
pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("default")]


def _cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


needs_cuda = pytest.mark.skipif(not _cuda(), reason="no CUDA device")
needs_flashinfer = pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None, reason="flashinfer not installed")


@needs_cuda
@pytest.mark.parametrize("probe", ["lse", "layout", "fp8-scale", "padding"])
def test_reference_on_gpu(probe: str) -> None:
    from metax_audit.probes.base import ProbeContext
    from metax_audit.probes.runner import run_one

    out = run_one(probe, "paged-decode", "torch-reference", ProbeContext(device="cuda"))
    assert out.verdict == "matched", out.skipped_reason


@needs_cuda
@needs_flashinfer
def test_flashinfer_decode_lse_is_base2_and_dcp_pairs() -> None:
    from metax_audit.probes.base import ProbeContext
    from metax_audit.probes.runner import run_one

    fi = "flashinfer:BatchDecodeWithPagedKVCacheWrapper"
    lse = run_one("lse", "paged-decode", fi, ProbeContext(device="cuda"))
    assert lse.matched == "base-2/[T,H]" and lse.hypotheses["base-e/[T,H]"]["abs"] > 1.0
    bad = run_one("dcp", "paged-decode", fi, ProbeContext(device="cuda", options={"merge": "torch-reference:base-e"}))
    assert bad.verdict == "mismatch" and bad.matched == "producer-base-2/merge-base-e"
    good = run_one("dcp", "paged-decode", fi, ProbeContext(device="cuda", options={"merge": "flashinfer:merge_state"}))
    assert good.verdict == "matched"
    graph = run_one("graph-capture", "paged-decode", fi, ProbeContext(device="cuda"))
    assert graph.matched == "follows-new-inputs"


@needs_cuda
@pytest.mark.parametrize(("target", "needle"), [("metax_audit.probes.wrong_variants:HostSyncDecode()", 'int(m["seq_lens"][b])'),
                                                 ("metax_audit.probes.wrong_variants:h2d_scale_decode", "torch.tensor(1.0")])
def test_host_sync_during_capture_is_named_on_gpu(target: str, needle: str) -> None:
    import inspect

    from metax_audit.probes import wrong_variants
    from metax_audit.probes.base import ProbeContext
    from metax_audit.probes.runner import run_one

    out = run_one("graph-capture", "paged-decode", target, ProbeContext(device="cuda"))
    assert out.verdict == "mismatch" and (out.matched or "").startswith("not-capturable: host sync at "), (out.matched, out.skipped_reason)
    line = int(out.matched.rsplit(":", 1)[1])
    lines = inspect.getsource(wrong_variants).splitlines()
    assert needle in lines[line - 1], lines[line - 1]
