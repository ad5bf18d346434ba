# The static `graph-capture` check: host syncs, tensor-valued branches and per-call allocations in
# the forward path of a backend whose declared cudagraph support says it is capturable.
from __future__ import annotations

from pathlib import Path

import pytest

from metax_audit.core.models import (
    BackendChain,
    CallSite,
    ChainHop,
    Discovery,
    Location,
    Severity,
    SourceFile,
    TraceResult,
)
from metax_audit.stages.checks.graph_capture import capturable, check_graph_capture

IMPL = '''\
import torch


class Impl:
    def forward(self, q, kv, out, meta):
        n = meta.seq_lens.max().item()
        if (meta.seq_lens > 0).any():
            pass
        lse = torch.empty((q.size(0),), device=q.device)
        if meta.num_prefills > 0:
            lens = meta.query_start_loc.tolist()
        if not torch.cuda.is_current_stream_capturing():
            host = meta.block_table.cpu()
        self._helper(q)
        if self._scale is None:
            self._scale = meta.scale.cpu().item()
        return out

    def _helper(self, q):
        return q.sum().item()

    def build(self, meta):
        return meta.seq_lens.cpu()
'''


def setup(root: Path, level: str | None) -> tuple[Discovery, TraceResult]:
    (root / "port").mkdir()
    (root / "port/impl.py").write_text(IMPL)
    d = Discovery(root, "port", (SourceFile("port/impl.py", "port.impl", "glob"),), (), (), (), {})
    chain = (ChainHop("forward", "Impl.forward", "port/impl.py", 5), ChainHop("build", "Impl.build", "port/impl.py", 22))
    helper = CallSite(Location("port/impl.py", 14), "Impl.forward", "self._helper", "port.impl.Impl._helper", "port")
    backend = BackendChain("FAKE", "port.impl.Backend", None, True, chain, (helper,), (), capture_support=level)
    return d, TraceResult((backend,), ("port/impl.py",))


@pytest.mark.parametrize(("level", "expected"), [
    (None, False), ("", False), ("AttentionCGSupport.NEVER", False),
    ("AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE", True), ("AttentionCGSupport.ALWAYS", True),
    ("UNIFORM_BATCH if trtllm else UNIFORM_SINGLE_TOKEN_DECODE", True),
])
def test_capturable(level: str | None, expected: bool) -> None:
    assert capturable(level) is expected


def test_findings_in_capturable_forward(tmp_path: Path) -> None:
    d, trace = setup(tmp_path, "AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE")
    got = sorted((f.location.line, f.rule, f.severity) for f in check_graph_capture(d, trace))
    assert got == [
        (6, "MXA130", Severity.WARNING),  # .item() in forward
        (7, "MXA131", Severity.WARNING),  # if on tensor value
        (9, "MXA132", Severity.INFO),  # per-call allocation
        (11, "MXA130", Severity.INFO),  # under a prefill-only branch
        (16, "MXA130", Severity.INFO),  # one-time init under `is None`
        (20, "MXA130", Severity.WARNING),  # in a port helper forward calls
    ]  # line 13 is guarded by is_current_stream_capturing; build() is not captured


def test_never_capturable_backend_has_no_findings(tmp_path: Path) -> None:
    d, trace = setup(tmp_path, "AttentionCGSupport.NEVER")
    assert list(check_graph_capture(d, trace)) == []


def test_evidence_names_the_declared_level(tmp_path: Path) -> None:
    d, trace = setup(tmp_path, "AttentionCGSupport.ALWAYS")
    first = next(iter(check_graph_capture(d, trace)))
    assert first.evidence[0] == "code: port/impl.py:6: n = meta.seq_lens.max().item()"
    assert "AttentionCGSupport.ALWAYS" in first.evidence[1]
