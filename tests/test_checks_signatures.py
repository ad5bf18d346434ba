# Stubtest-style tables for the `signature` and `kwargs-swallowed` checks: a call site as the
# tracer records it, an installed signature as introspection records it, the expected findings.
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from metax_audit.cache.memo import review_memo
from metax_audit.core.models import (
    CallableFact,
    CallArg,
    CallSite,
    Location,
    ParamFact,
    Severity,
    StackFacts,
    TraceResult,
)
from metax_audit.stages.checks.kwargs import check_kwargs
from metax_audit.stages.checks.memo import FileMemo
from metax_audit.stages.checks.signatures import check_signatures

TARGET = "kern.decode.Wrapper.run"


def P(spec: str) -> tuple[ParamFact, ...]:
    """'q, k, *args, scale=1.0, **kw' -> ParamFacts (a '*' alone starts keyword-only)."""
    out: list[ParamFact] = []
    kw_only = False
    for raw in (s.strip() for s in spec.split(",") if s.strip()):
        if raw == "/":
            out = [ParamFact(p.name, "POSITIONAL_ONLY", p.default) for p in out]
        elif raw == "*":
            kw_only = True
        elif raw.startswith("**"):
            out.append(ParamFact(raw[2:], "VAR_KEYWORD"))
        elif raw.startswith("*"):
            out.append(ParamFact(raw[1:], "VAR_POSITIONAL"))
            kw_only = True
        else:
            name, _, default = raw.partition("=")
            out.append(ParamFact(name, "KEYWORD_ONLY" if kw_only else "POSITIONAL_OR_KEYWORD", default or None))
    return tuple(out)


def C(text: str, *, star: bool = False, partial: str = "", commented: str = "", callee: str = "self._w.run",
      line: int = 10) -> CallSite:
    """'a, b, x=c' -> a CallSite of TARGET with those arguments."""
    def args(spec: str, commented_out: bool = False) -> list[CallArg]:
        out, pos = [], 0
        for raw in (s.strip() for s in spec.split(",") if s.strip()):
            if "=" in raw:
                name, _, value = raw.partition("=")
                out.append(CallArg(name, None, value, commented_out=commented_out))
            else:
                out.append(CallArg(None, pos, raw, commented_out=commented_out))
                pos += 1
        return out
    return CallSite(Location("port/attn.py", line, ""), "Impl.forward", callee, TARGET, "external",
                    args=tuple(args(text) + args(commented, True)), star_kwargs=star, partial_args=tuple(args(partial)))


def facts_for(params: tuple[ParamFact, ...] | None, *, status: str = "ok", reads: tuple[str, ...] | None = None,
              forwarded: bool = False) -> StackFacts:
    sig = "(" + ", ".join(p.name for p in params) + ")" if params is not None else None
    fact = CallableFact(TARGET, status, "import", signature=sig, params=params, kwargs_reads=reads,
                        kwargs_forwarded=forwarded, distribution="kern", version="0.2.6", error=None if status == "ok" else "boom")
    return StackFacts("python", "2026-01-01T00:00:00Z", "host", {TARGET: fact})


@dataclass
class Case:
    call: CallSite
    params: str
    rules: list[str]
    reads: tuple[str, ...] | None = None
    forwarded: bool = False
    upstream: list[CallSite] = field(default_factory=list)


SIG_CASES = {
    "exact match": Case(C("q, kv, k_scale=a, v_scale=b"), "q, kv, *args, k_scale=None, v_scale=None", []),
    "unknown keyword": Case(C("q, kv, o_data_type=d"), "q, kv, *, k_scale=None", ["MXA101"]),
    "commented-out keyword is not passed": Case(C("q, kv", commented="o_data_type=d"), "q, kv", []),
    "too many positionals": Case(C("q, kv, a, b"), "q, kv, c=1", ["MXA102"]),
    "extra positionals into *args": Case(C("q, kv, a, b"), "q, kv, *args", []),
    "required missing": Case(C("q"), "q, kv", ["MXA103"]),
    "required passed by keyword": Case(C("q, kv=x"), "q, kv", []),
    "star kwargs may supply it": Case(C("q", star=True), "q, kv", []),
    "positional-only by keyword": Case(C("q, kv=x"), "q, kv, /", ["MXA104", "MXA103"]),
    "twice": Case(C("q, kv, q=x"), "q, kv", ["MXA104"]),
    "partial binds first": Case(C("kv", partial="q, scale=1"), "q, kv, scale=0", []),
    "partial keyword overridden at call": Case(C("q, kv, scale=2", partial="scale=1"), "q, kv, scale=0", []),
    "keyword into **kwargs is not a signature error": Case(C("q, kv, window=w"), "q, kv, **kw", []),
    "moved: upstream passes it by another keyword": Case(
        C("q, kv, lse_buf"), "q, kv, out=None, lse=None", ["MXA105"],
        upstream=[CallSite(Location("up/attn.py", 5), "Impl.forward", "self._w.run", TARGET, "external",
                           args=(CallArg(None, 0, "q"), CallArg(None, 1, "kv"), CallArg("lse", None, "lse_buf")))]),
    # An extra positional shifts every later value: one finding for the call, not one per shifted value.
    "inserted positional shifts the rest: one finding": Case(
        C("src, dst, table, seq_lens, starts, n"), "src, dst, table, starts, n, seq_starts=None", ["MXA105"],
        upstream=[CallSite(Location("up/attn.py", 5), "Impl.forward", "self._w.run", TARGET, "external",
                           args=(CallArg(None, 0, "src"), CallArg(None, 1, "dst"), CallArg(None, 2, "table"),
                                 CallArg(None, 3, "starts"), CallArg(None, 4, "n")))]),
    "same meaning as upstream": Case(
        C("q, kv, o"), "q, kv, out=None", [],
        upstream=[CallSite(Location("up/attn.py", 5), "Impl.forward", "self._w.run", TARGET, "external",
                           args=(CallArg(None, 0, "q"), CallArg(None, 1, "kv"), CallArg("out", None, "o")))]),
    "unbound method call passes self": Case(C("w, q, kv", callee="Wrapper.run"), "q, kv", []),
    "**kw recorded as an argument supplies the rest": Case(C("q, **kw"), "q, kv", []),
    "triton launch options are not kernel parameters": Case(C("x, BLOCK=b, num_warps=4, num_stages=2", callee="_k[grid]"), "x, BLOCK", []),
    "launch options on a plain call are unknown": Case(C("x, num_warps=4"), "x", ["MXA101"]),
}


@pytest.mark.parametrize("case", SIG_CASES.values(), ids=SIG_CASES.keys())
def test_signature_table(case: Case, tmp_path: Path) -> None:
    trace = TraceResult((), (), calls=(case.call,))
    got = [f.rule for f in check_signatures(tmp_path, trace, facts_for(P(case.params)), upstream_calls=case.upstream)]
    assert sorted(got) == sorted(case.rules)


def test_evidence_shows_both_sides(tmp_path: Path) -> None:
    (tmp_path / "port").mkdir()
    (tmp_path / "port/attn.py").write_text("\n" * 9 + "        self._w.run(q, kv, o_data_type=d)\n")
    trace = TraceResult((), (), calls=(C("q, kv, o_data_type=d"),))
    [finding] = check_signatures(tmp_path, trace, facts_for(P("q, kv, *, k_scale=None")))
    assert finding.severity is Severity.ERROR and finding.location.path == "port/attn.py"
    assert finding.evidence[0] == "call: port/attn.py:10: self._w.run(q, kv, o_data_type=d)"
    assert finding.evidence[1].startswith(f"installed: {TARGET}(q, kv, k_scale)  [import, kern 0.2.6]")
    assert "o_data_type" in finding.message
    assert finding.evidence[2].startswith("build: kern 0.2.6 has no local version label")


@pytest.mark.parametrize("status", ["import-error", "timeout", "crash", "no-signature"])
def test_uncheckable_callee_is_info_never_error(status: str, tmp_path: Path) -> None:
    trace = TraceResult((), (), calls=(C("q, kv, o_data_type=d"), C("q", line=12)))
    found = list(check_signatures(tmp_path, trace, facts_for(None, status=status)))
    assert [(f.rule, f.severity) for f in found] == [("MXA106", Severity.INFO)]
    assert "2 call(s)" in found[0].message
    assert list(check_kwargs(tmp_path, trace, facts_for(None, status=status))) == []


def test_calls_without_a_fact_are_out_of_scope(tmp_path: Path) -> None:
    trace = TraceResult((), (), calls=(C("q, kv, o_data_type=d"),))
    empty = StackFacts("python", "", "", {})
    assert list(check_signatures(tmp_path, trace, empty)) == []


KW_CASES = {
    "read by name": Case(C("q, window=w"), "q, **kwargs", [], reads=("window",)),
    "never read": Case(C("q, window=w"), "q, **kwargs", ["MXA110"], reads=("sinks",)),
    "forwarded only": Case(C("q, window=w"), "q, **kwargs", ["MXA111"], reads=(), forwarded=True),
    "body unreadable": Case(C("q, window=w"), "q, **kwargs", ["MXA111"], reads=None),
    "named parameter is not swallowed": Case(C("q, window=w"), "q, window=-1, **kwargs", [], reads=()),
    "two swallowed, one read": Case(C("q, a=1, b=2"), "q, **kwargs", ["MXA110"], reads=("a",)),
}


@pytest.mark.parametrize("case", KW_CASES.values(), ids=KW_CASES.keys())
def test_kwargs_table(case: Case, tmp_path: Path) -> None:
    trace = TraceResult((), (), calls=(case.call,))
    facts = facts_for(P(case.params), reads=case.reads, forwarded=case.forwarded)
    found = list(check_kwargs(tmp_path, trace, facts))
    assert [f.rule for f in found] == case.rules
    for f in found:
        assert any(e.startswith("callee reads") or e.startswith("callee body") for e in f.evidence)


def test_manifest_source_in_evidence_not_message(tmp_path: Path) -> None:
    from dataclasses import replace

    trace = TraceResult((), (), calls=(C("q, kv, o_data_type=d"),))
    live = facts_for(P("q, kv"))
    manifest = replace(live, source="manifest:stack.json")
    a, b = next(check_signatures(tmp_path, trace, live)), next(check_signatures(tmp_path, trace, manifest))
    assert (a.id, a.message) == (b.id, b.message)
    assert "via manifest:stack.json" in b.evidence[1] and "manifest" not in a.evidence[1]


def test_opaque_decorator_downgrades_to_warning(tmp_path: Path) -> None:
    from dataclasses import replace

    facts = facts_for(P("q, kv"))
    fact = replace(facts.facts[TARGET], source="static", error="decorated with torch.compile: the runtime signature may differ")
    trace = TraceResult((), (), calls=(C("q, kv, extra=1"),))
    [found] = check_signatures(tmp_path, trace, replace(facts, facts={TARGET: fact}))
    assert (found.rule, found.severity) == ("MXA101", Severity.WARNING)
    autotuned = replace(fact, error="decorated with triton.autotune, triton.jit: the runtime signature may differ")
    launch = TraceResult((), (), calls=(C("q", callee="_k[grid]"),))
    assert list(check_signatures(tmp_path, launch, replace(facts, facts={TARGET: autotuned}))) == []


def test_shifted_call_names_the_inserted_positional(tmp_path: Path) -> None:
    case = SIG_CASES["inserted positional shifts the rest: one finding"]
    trace = TraceResult((), (), calls=(case.call,))
    [finding] = check_signatures(tmp_path, trace, facts_for(P(case.params)), upstream_calls=case.upstream)
    assert "'starts' binds to installed parameter 'n'" in finding.message
    assert "'n' binds to installed parameter 'seq_starts'" in finding.message
    assert "'seq_lens'" in finding.message and "not in upstream's call" in finding.message
    assert finding.severity is Severity.ERROR  # a stale call against a changed signature breaks


def test_value_moved_without_extra_positional_stays_a_warning(tmp_path: Path) -> None:
    case = SIG_CASES["moved: upstream passes it by another keyword"]
    trace = TraceResult((), (), calls=(case.call,))
    [finding] = check_signatures(tmp_path, trace, facts_for(P(case.params)), upstream_calls=case.upstream)
    assert finding.severity is Severity.WARNING


# A wrapper that only forwards its parameters by position to a torch op: the values land on the op's
# parameters as the port's own library registers it (MetaX's csrc kept 0.25's order of
# cp_gather_and_upconvert_fp8_kv_cache while vLLM 0.26's wrapper names follow the new order).
WRAPPER = '''
import torch


def gather(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None):
    """Gather."""
    torch.ops._C_cache_ops.gather(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts)
'''
OLD_ORDER = ('ops.def("gather(Tensor src_cache, Tensor! dst, Tensor block_table, Tensor seq_lens, '
             'Tensor workspace_starts, int batch_size) -> ()");')
NEW_ORDER = ('ops.def("gather(Tensor src_cache, Tensor! dst, Tensor block_table, Tensor workspace_starts, '
             'int batch_size, Tensor? seq_starts) -> ()");')
PORT_CALL = "kv, ws, chunk.block_table, chunk.seq_lens, chunk.workspace_starts, len(chunk.block_table)"
UP_CALL = (CallArg(None, 0, "kv"), CallArg(None, 1, "ws"), CallArg(None, 2, "chunk.block_table"),
           CallArg(None, 3, "chunk.workspace_starts"), CallArg(None, 4, "len(chunk.block_table)"))


@pytest.mark.parametrize(("registered", "body", "severity"), [
    ("port", OLD_ORDER, Severity.INFO),  # lands as the port's op takes it: works on the vendor stack
    ("port", NEW_ORDER, Severity.ERROR),  # the port's op has the wrapper's order: values shift
    ("upstream", OLD_ORDER, Severity.ERROR),  # only upstream registers it: the installed names count
    ("reorders", OLD_ORDER, Severity.ERROR),  # the wrapper does more than forward: nothing assumed
], ids=["port-keeps-old-order", "port-has-new-order", "not-the-port's-op", "wrapper-not-a-passthrough"])
def test_positional_shift_judged_by_the_ops_schema_the_port_registers(registered: str, body: str, severity: Severity,
                                                                      tmp_path: Path) -> None:
    from metax_audit.stages.checks.op_table import build_table

    wrapper = tmp_path / "up" / "_custom_ops.py"
    wrapper.parent.mkdir()
    text = WRAPPER if registered != "reorders" else WRAPPER.replace("block_table, workspace_starts, batch_size, seq",
                                                                     "workspace_starts, block_table, batch_size, seq")
    wrapper.write_text(text)
    native = tmp_path / ("csrc" if registered != "upstream" else "elsewhere")
    native.mkdir()
    (native / "bindings.cpp").write_text("STABLE_TORCH_LIBRARY_FRAGMENT(_C_cache_ops, ops) {\n  " + body + "\n}\n")
    (tmp_path / "port").mkdir()
    table = build_table(tmp_path, "port", ("csrc",), None)
    target = "vllm._custom_ops.gather"
    params = P("src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None")
    fact = CallableFact(target, "ok", "static", signature="(...)", params=params, sourcefile=str(wrapper), line=5)
    facts = StackFacts("python", "2026-01-01T00:00:00Z", "host", {target: fact})
    call = replace(C(PORT_CALL, callee="ops.gather"), resolved=target)
    upstream = [CallSite(Location("up/mla.py", 5), "Impl.forward", "ops.gather", target, "external", args=UP_CALL)]
    [finding] = check_signatures(tmp_path, TraceResult((), (), calls=(call,)), facts, upstream_calls=upstream,
                                 vendor_ops=table)
    assert finding.rule == "MXA105" and finding.severity is severity
    for _ in range(2):  # what the wrapper forwards, kept per file: cold, then read back
        memo = FileMemo(tmp_path, memo=review_memo(True))
        assert list(check_signatures(tmp_path, TraceResult((), (), calls=(call,)), facts, upstream_calls=upstream,
                                     vendor_ops=table, memo=memo)) == [finding]
        memo.save()
    assert (memo.hits, memo.misses) == (1, 0)
    if severity is Severity.INFO:
        assert any(e.startswith("port registers _C_cache_ops::gather at csrc/bindings.cpp:2: gather(") for e in finding.evidence)
        assert any("chunk.seq_lens -> seq_lens (same name)" in e for e in finding.evidence)
