# The tracer on the bundled demo port (discovered, not hand-built): the FlashInfer chain reaches
# its wrappers, their plan/run calls and the port's merge, and the host sync in decode is visible.
from __future__ import annotations

import pytest

from metax_audit import demo
from metax_audit.core.config import AuditConfig
from metax_audit.stages import discover as discover_mod
from metax_audit.stages.trace import kernel_entry_points, trace_backends, trace_findings


@pytest.fixture(scope="module")
def result():
    config = AuditConfig()
    return trace_backends(discover_mod.discover(demo.port_root(), config), config, demo.upstream_root())


def _chain(result, name):
    return next(ch for ch in result.backends if ch.name == name)


def test_demo_flashinfer_chain(result):
    ch = _chain(result, "FLASHINFER")
    assert ch.active
    roles = {h.role for h in ch.chain}
    assert {"registration", "backend", "builder", "build", "metadata", "impl", "forward", "wrapper", "kernel", "layer"} <= roles
    resolved = {c.resolved for c in ch.calls}
    for target in (
        "flashinfer.BatchDecodeWithPagedKVCacheWrapper.plan",
        "flashinfer.BatchDecodeWithPagedKVCacheWrapper.run",
        "flashinfer.BatchPrefillWithPagedKVCacheWrapper.plan",
        "flashinfer.BatchPrefillWithPagedKVCacheWrapper.run",
        "vllm_metax.v1.attention.ops.merge_attn_states.merge_attn_states",
    ):
        assert target in resolved, target
    assert {"flashinfer.BatchDecodeWithPagedKVCacheWrapper", "flashinfer.BatchPrefillWithPagedKVCacheWrapper"} <= {
        h.resolved for h in ch.chain if h.role == "wrapper"
    }
    # the graph-capture check needs the host syncs, with the branch they sit under
    syncs = [c for c in ch.calls if c.resolved == "torch.Tensor.item"]
    assert syncs and all("decode_wrapper" in c.branch for c in syncs)
    # the decode plan carries an argument that exists only as a comment
    plans = [c for c in ch.calls if c.resolved == "flashinfer.BatchDecodeWithPagedKVCacheWrapper.plan"]
    assert any(a.commented_out for c in plans for a in c.args)
    # what stays unresolved is genuinely dynamic (fields typed Any that no code fills)
    assert all("Any" in u.reason for u in ch.unresolved)


def test_demo_triton_and_entry_points(result):
    ch = _chain(result, "TRITON_ATTN")
    assert "vllm.v1.attention.ops.triton_unified_attention.unified_attention" in {h.resolved for h in ch.chain if h.role == "kernel"}
    points = kernel_entry_points(result)
    assert "flashinfer.BatchDecodeWithPagedKVCacheWrapper.run" in points
    assert all(not p.startswith(("torch.Tensor", "builtins")) for p in points)
    rules = {f.rule for f in trace_findings(result)}
    assert "MXA050" not in rules and "MXA051" not in rules
