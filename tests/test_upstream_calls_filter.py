# The upstream counterparts' call sites the signature check reads, traced for the functions of the names
# of the port's callers of checked targets only: the same sites as the whole trace keeps for those names.
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from conftest import write_tree

from metax_audit.core.config import AuditConfig
from metax_audit.core.models import (
    CallableFact,
    CallSite,
    Comparison,
    Discovery,
    FileComparison,
    Location,
    SourceFile,
    StackFacts,
    TraceResult,
    UpstreamInfo,
)
from metax_audit.stages.checks import checked_callers, upstream_calls
from metax_audit.stages.trace import trace_backends

UPSTREAM = {
    "vllm/__init__.py": "",
    "vllm/attn.py": '''
import kern
from kern import run as launch


def forward(q, k):
    helper(q)
    return kern.run(q, k, scale=1.0)


def helper(q):
    return launch(q, q)


class Impl:
    def forward(self, q, k):
        out = launch(k, q)
        return self.plan(out)

    def plan(self, out):
        def inner():
            return kern.run(out, out)
        return inner()

    build = forward
''',
}


def _discovery(root: Path) -> Discovery:
    files = (SourceFile("vllm/attn.py", "vllm.attn", "counterpart"),)
    return Discovery(root=root, port_package="vllm", files=files, registrations=(), priorities=(), switches=(), callers={})


def _caller(c: CallSite) -> str:
    return c.caller.rsplit(".", 1)[-1]


def test_the_filtered_trace_holds_exactly_the_sites_of_the_named_functions(tmp_path: Path) -> None:
    write_tree(tmp_path, UPSTREAM)
    config = AuditConfig(port_package="vllm")
    whole = trace_backends(_discovery(tmp_path), config, None).calls
    assert {_caller(c) for c in whole} >= {"forward", "helper", "plan"}
    for names in ({"forward"}, {"plan"}, {"helper", "plan"}, {"absent"}):
        only = trace_backends(_discovery(tmp_path), config, None, only_functions=frozenset(names)).calls
        assert list(only) == [c for c in whole if _caller(c) in names]


def test_upstream_calls_asks_only_for_the_checked_callers(tmp_path: Path) -> None:
    write_tree(tmp_path, UPSTREAM)
    up = UpstreamInfo("vllm", "9.9", "directory", root=tmp_path)
    comparison = Comparison(up, None, (FileComparison("port/attn.py", "vllm/attn.py", vendor_only=False),))
    whole = upstream_calls(comparison, up, AuditConfig())
    some = upstream_calls(comparison, up, AuditConfig(), callers=frozenset({"forward"}))
    assert list(some) == [c for c in whole if _caller(c) == "forward"] and some
    assert upstream_calls(comparison, up, AuditConfig(), callers=frozenset()) == ()


def test_the_checked_callers_are_the_callers_of_targets_the_facts_hold() -> None:
    def site(caller: str, resolved: str | None, line: int) -> CallSite:
        return CallSite(Location("port/attn.py", line), caller, "f", resolved, "external")

    calls = (site("port.attn.Impl.forward", "kern.run", 1), site("port.attn.Impl.plan", "kern.other", 2),
             site("port.attn.helper", None, 3))
    trace = TraceResult((), (), calls=calls)
    fact = CallableFact("kern.run", "ok", "import", signature="(q, k)")
    facts = StackFacts("python", "2026-01-01T00:00:00Z", "host", {"kern.run": fact})
    assert checked_callers(trace, facts) == frozenset({"forward"})
    assert checked_callers(trace, replace(facts, facts={})) == frozenset()
    assert checked_callers(trace, None) == frozenset()
