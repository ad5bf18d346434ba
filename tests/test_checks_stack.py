# run_checks chains the five stack checks over one hand-made model, and installed_calls lists
# every call site with a fact beside the installed signature.
from __future__ import annotations

from pathlib import Path

from metax_audit.core.models import (
    BackendChain,
    CallableFact,
    CallArg,
    CallSite,
    ChainHop,
    Discovery,
    Location,
    ParamFact,
    SourceFile,
    StackFacts,
    TraceResult,
)
from metax_audit.stages.checks import run_checks
from metax_audit.stages.checks.stack import installed_calls

PORT = '''\
# Note: the vendor kernel does not support fp8 in:
#   - FancyWrapper
from kern import Wrapper
from kern.decode import _gone


class Impl:
    def forward(self, q, kv):
        n = q.max().item()
        return self._w.run(q, kv, window=4, o_dtype=n)
'''


def test_run_checks_chains_all_five(tmp_path: Path) -> None:
    (tmp_path / "port").mkdir()
    (tmp_path / "port/impl.py").write_text(PORT)
    d = Discovery(tmp_path, "port", (SourceFile("port/impl.py", "port.impl", "glob"),), (), (), (), {})
    call = CallSite(Location("port/impl.py", 10), "Impl.forward", "self._w.run", "kern.Wrapper.run", "external",
                    args=(CallArg(None, 0, "q"), CallArg(None, 1, "kv"), CallArg("window", None, "4"), CallArg("o_dtype", None, "n")))
    backend = BackendChain("FAKE", "port.impl.Backend", None, True, (ChainHop("forward", "Impl.forward", "port/impl.py", 8),),
                           (call,), (), capture_support="AttentionCGSupport.ALWAYS")
    facts = StackFacts("py", "t", "h", {
        "kern.Wrapper.run": CallableFact("kern.Wrapper.run", "ok", "import", "(q, kv, *, window=-1, **kwargs)",
                                         (ParamFact("q", "POSITIONAL_OR_KEYWORD"), ParamFact("kv", "POSITIONAL_OR_KEYWORD"),
                                          ParamFact("window", "KEYWORD_ONLY", "-1"), ParamFact("kwargs", "VAR_KEYWORD")),
                                         kwargs_reads=()),
        "kern.Wrapper": CallableFact("kern.Wrapper", "ok", "import", "()", ()),
        "kern.decode._gone": CallableFact("kern.decode._gone", "not-found", "import", error="missing"),
    })
    got = sorted((f.rule, f.location.line) for f in run_checks(d, TraceResult((backend,), ("port/impl.py",)), facts))
    assert got == [("MXA110", 10), ("MXA120", 4), ("MXA130", 9), ("MXA140", 1)]
    rows = installed_calls(tmp_path, TraceResult((backend,), ()), facts, "kern.")
    assert rows == [("call: port/impl.py:10: return self._w.run(q, kv, window=4, o_dtype=n)",
                     "installed: kern.Wrapper.run(q, kv, *, window=-1, **kwargs)  [import]")]


def test_build_note_tells_vendor_from_upstream_builds() -> None:
    from metax_audit.stages.checks.stack import build_note

    vendor = CallableFact("k.f", "ok", "import", distribution="flashinfer", version="0.2.6+metax3.1.0")
    upstream = CallableFact("k.f", "ok", "import", distribution="flashinfer-python", version="0.2.6.post1")
    assert "local label +metax3.1.0" in build_note(vendor)[0]
    assert "upstream build" in build_note(upstream)[0]
    assert build_note(CallableFact("k.f", "ok", "static")) == []
