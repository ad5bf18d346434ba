# The `import` check: names the port imports from a kernel package, against introspection facts
# (installed or read statically), including private helpers; unknown facts are info, never errors.
from __future__ import annotations

from pathlib import Path

import pytest

from metax_audit.core.models import CallableFact, Discovery, Severity, SourceFile, StackFacts
from metax_audit.stages.checks.imports import check_imports, imported_names

PORT = '''\
from kern import Wrapper, NewWrapper
from kern.decode import _range_buf
import kern.jit
try:
    from kern.fancy import turbo
except ImportError:
    turbo = None

def lazy():
    from kern.utils import helper
    from os import path
    return helper, path
'''


def discovery(root: Path, text: str = PORT) -> Discovery:
    (root / "port").mkdir(parents=True, exist_ok=True)
    (root / "port/attn.py").write_text(text)
    return Discovery(root, "port", (SourceFile("port/attn.py", "port.attn", "glob"),), (), (), (), {})


def fact(target: str, status: str = "ok", source: str = "import") -> CallableFact:
    return CallableFact(target, status, source, distribution="kern", version="0.2.6", error=None if status == "ok" else "x")


def test_imported_names_include_lazy_and_guarded(tmp_path: Path) -> None:
    d = discovery(tmp_path)
    names = [(i.target, i.line, i.guarded) for i in imported_names(tmp_path, ["port/attn.py"], ["kern"])]
    assert names == [("kern.Wrapper", 1, False), ("kern.NewWrapper", 1, False), ("kern.decode._range_buf", 2, False),
                     ("kern.jit", 3, False), ("kern.fancy.turbo", 5, True), ("kern.utils.helper", 10, False)]
    assert d.files


@pytest.mark.parametrize(("target", "status", "source", "rule", "severity"), [
    ("kern.Wrapper", "ok", "import", None, None),
    ("kern.NewWrapper", "not-found", "import", "MXA120", Severity.ERROR),
    ("kern.decode._range_buf", "not-found", "import", "MXA120", Severity.ERROR),  # private names count too
    ("kern.decode._range_buf", "not-found", "static", "MXA120", Severity.WARNING),  # static read may miss dynamic exports
    ("kern.fancy.turbo", "not-found", "import", "MXA120", Severity.INFO),  # guarded by try/except ImportError: the guard is the evidence
    ("kern.utils.helper", "import-error", "import", "MXA121", Severity.INFO),
    ("kern.jit", "timeout", "import", "MXA121", Severity.INFO),
])
def test_import_table(tmp_path: Path, target: str, status: str, source: str, rule: str | None, severity: Severity | None) -> None:
    facts = StackFacts("py", "", "", {target: fact(target, status, source)})
    found = list(check_imports(discovery(tmp_path), facts))
    assert [(f.rule, f.severity) for f in found] == ([(rule, severity)] if rule else [])
    if rule == "MXA120":
        assert found[0].evidence[0].startswith("port: port/attn.py:")
        assert "kern 0.2.6" in found[0].message


def test_no_fact_no_finding(tmp_path: Path) -> None:
    assert list(check_imports(discovery(tmp_path), StackFacts("py", "", "", {}))) == []


def test_one_finding_per_missing_kernel_name(tmp_path: Path) -> None:
    text = "from kern import NewWrapper\n\ndef lazy():\n    from kern import NewWrapper\n    return NewWrapper\n"
    facts = StackFacts("py", "", "", {"kern.NewWrapper": fact("kern.NewWrapper", "not-found")})
    [f] = check_imports(discovery(tmp_path, text), facts)
    assert f.severity is Severity.ERROR and "1 more import site" in f.message
    assert [e for e in f.evidence if e.startswith("port: ")] == ["port: port/attn.py:1: from kern import NewWrapper",
                                                                 "port: port/attn.py:4: from kern import NewWrapper  (lazy, in lazy)"]
    assert "unguarded: importing the module fails" in f.evidence  # the module-level site stops the module


def test_a_kernel_name_imported_only_in_functions_fails_when_they_run(tmp_path: Path) -> None:
    # v0.21.0's mla_attention.py imported cudnn_batch_prefill_with_kv_cache inside two methods: the module imports fine
    from metax_audit.report.first_screen import consequence

    text = ("class Impl:\n    def prefill_cudnn(self):\n        from kern import NewWrapper\n        return NewWrapper\n\n"
            "    def chunk_cudnn(self):\n        from kern import NewWrapper\n        return NewWrapper\n")
    facts = StackFacts("py", "", "", {"kern.NewWrapper": fact("kern.NewWrapper", "not-found")})
    [f] = check_imports(discovery(tmp_path, text), facts)
    assert f.severity is Severity.ERROR and "fails when Impl.prefill_cudnn runs" in f.evidence
    assert "port: port/attn.py:3: from kern import NewWrapper  (lazy, in Impl.prefill_cudnn)" in f.evidence
    assert consequence(f) == (1, "ImportError when Impl.prefill_cudnn runs")
