# The port/upstream import check (MXA122) through the one symbol table: a table of import forms,
# each broken one with its guarded, dynamic or re-exported twin that must not be an error.
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from metax_audit.core.findings import make_finding
from metax_audit.core.models import Discovery, Location, Severity, SourceFile
from metax_audit.stages.checks.imports import (
    absorb_consequences,
    check_port_imports,
    check_type_checking_names,
    import_sites,
)
from metax_audit.stages.trace.symbols import Status, SymbolTable

UPSTREAM = {
    "up/__init__.py": "",
    "up/core.py": "def kept():\n    pass\n\nclass Base:\n    def nested_only(self):\n        pass\n# old_name was here\n",
    "up/lazy.py": "def __getattr__(name):\n    return name\n",
    "up/reexport.py": "from up.core import *\n",
    "up/pkg/__init__.py": "from .impl import Impl\n__all__ = ['Impl']\n",
    "up/pkg/impl.py": "class Impl:\n    pass\n",
    "up/pkg/extra.py": "X = 1\n",
    "up/cond.py": "try:\n    import fast\n    speed = 1\nexcept ImportError:\n    speed = 0\nif speed:\n    def turbo():\n        pass\n",
}
BASE = {**UPSTREAM, "up/core.py": UPSTREAM["up/core.py"] + "\ndef removed_helper():\n    pass\n"}
PORT_FILES = {
    "port/__init__.py": "",
    "port/own.py": "def mine():\n    pass\n",
    "port/ns/mod.py": "Y = 2\n",  # port/ns has no __init__.py: an implicit namespace package
}


@dataclass(frozen=True)
class Case:
    id: str
    source: str
    severity: Severity | None  # None: no finding
    evidence: str = ""  # substring of the evidence


CASES = [
    Case("defined", "from up.core import kept\n", None),
    Case("missing-name", "from up.core import kep\n", Severity.ERROR, "closest existing names: kept"),
    Case("removed-since-base", "from up.core import removed_helper\n", Severity.ERROR, "the base release defines it"),
    Case("mentioned-in-comment", "from up.core import old_name\n", Severity.ERROR),
    Case("module-getattr", "from up.lazy import anything\n", None),
    Case("star-reexport", "from up.reexport import Base\n", None),
    Case("star-reexport-missing", "from up.reexport import Nope\n", Severity.ERROR),
    Case("package-reexport", "from up.pkg import Impl\n", None),
    Case("submodule", "from up.pkg import extra\n", None),
    Case("conditional-def", "from up.cond import turbo, speed\n", None),
    Case("missing-module", "import up.nothere\n", Severity.ERROR, "no module up.nothere"),
    Case("missing-module-from", "from up.nothere import x\n", Severity.ERROR, "no module up.nothere"),
    Case("relative-ok", "from .own import mine\n", None),
    Case("relative-missing", "from .own import yours\n", Severity.ERROR, "port snapshot"),
    Case("namespace-package", "from port.ns.mod import Y\nfrom port.ns import mod\n", None),
    Case("namespace-missing", "from port.ns import other\n", Severity.ERROR),
    Case("compiled-extension", "import port._C\n", None),
    # a private submodule setup.py writes at build time (vllm-ascend's _build_info): not in the sources
    Case("build-time-submodule", "from port import _build_info\n", None),
    Case("private-name-of-a-module", "from port.own import _gone\n", Severity.ERROR),
    Case("outside-providers", "from torch import nothing_here\n", None),
    Case("try-guarded", "try:\n    from up.core import gone\nexcept ImportError:\n    gone = None\n", Severity.INFO,
         "guarded: except ImportError: gone = None"),
    Case("try-reraises", "try:\n    from up.core import gone\nexcept ImportError as e:\n    raise RuntimeError('x') from e\n",
         Severity.ERROR),
    Case("if-guarded", "import sys\nif sys.platform == 'linux':\n    from up.core import gone\n", Severity.WARNING,
         "guarded: if sys.platform == 'linux'"),
    Case("availability-guarded", "from up.core import kept as has_kernels\nif has_kernels():\n    from up.core import gone\n",
         Severity.INFO, "guarded: if has_kernels()"),
    Case("type-checking-annotation-only",
         "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from up.core import Gone\n\ndef f(x: 'Gone') -> None:\n    pass\n",
         Severity.INFO, "used only in annotations"),
    Case("type-checking-runtime-use",
         "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from up.core import Gone\n\ndef f():\n    return Gone()\n",
         Severity.ERROR, "used at runtime"),
    Case("lazy", "def f():\n    from up.core import gone\n    return gone(1)\n", Severity.ERROR, "fails when f runs"),
]


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def _setup(tmp_path: Path, source: str) -> tuple[Discovery, SymbolTable]:
    port, up, base = tmp_path / "port_repo", tmp_path / "up", tmp_path / "base"
    _write(port, {**PORT_FILES, "port/attn.py": source})
    _write(up, UPSTREAM)
    _write(base, BASE)
    d = Discovery(port, "port", (SourceFile("port/attn.py", "port.attn", "glob"),), (), (), (), {})
    symbols = SymbolTable.build(port, "port", up, "up", upstream_version="2.0", base_root=base, base_version="1.0")
    return d, symbols


# A port that follows two releases branches on its own version test (config version-tests): the branch is
# decided for the upstream release under review (2.0 here), never guessed for a pre-release.
_TEST = "from port.own import mine as up_is\n"
VERSION_CASES = [
    Case("version-branch-not-taken", _TEST + "if up_is('1.0'):\n    from up.core import gone\nelse:\n    from up.core import kept\n",
         Severity.INFO, "not taken with upstream up 2.0"),
    Case("version-else-not-taken", _TEST + "if up_is('2.0'):\n    from up.core import kept\nelse:\n    from up.core import gone\n",
         Severity.INFO, "if not (up_is('2.0'))"),
    Case("version-branch-taken", _TEST + "if up_is('2.0'):\n    from up.core import gone\n", Severity.ERROR,
         "holds with upstream up 2.0"),
    Case("version-else-taken", _TEST + "if up_is('1.0'):\n    pass\nelse:\n    from up.core import gone\n", Severity.ERROR),
    Case("version-and-not-taken", _TEST + "import sys\nif up_is('1.0') and sys.platform == 'linux':\n    from up.core import gone\n",
         Severity.INFO),
    Case("version-or-undecided", _TEST + "import sys\nif up_is('1.0') or sys.platform == 'linux':\n    from up.core import gone\n",
         Severity.WARNING),
    Case("version-pre-release", _TEST + "if up_is('2.0rc1'):\n    from up.core import gone\n", Severity.WARNING),
    Case("not-a-version-test", "from port.own import mine as other\nif other('1.0'):\n    from up.core import gone\n",
         Severity.WARNING),
    Case("version-lazy-not-taken", _TEST + "def f():\n    if up_is('1.0'):\n        from up.core import gone\n        return gone\n",
         Severity.INFO),
]


@pytest.mark.parametrize("case", VERSION_CASES, ids=[c.id for c in VERSION_CASES])
def test_version_branches(tmp_path: Path, case: Case) -> None:
    d, _ = _setup(tmp_path, case.source)
    symbols = SymbolTable.build(d.root, "port", tmp_path / "up", "up", upstream_version="2.0", base_root=tmp_path / "base",
                                base_version="1.0", version_tests={"up_is": "=="})
    found = list(check_port_imports(d, symbols))
    assert [f.severity for f in found] == [case.severity], [f.evidence for f in found]
    assert case.evidence in "\n".join(found[0].evidence)


def test_version_tests_need_the_release(tmp_path: Path) -> None:
    """Without the release under review (an upstream directory of unknown version) nothing is decided."""
    d, _ = _setup(tmp_path, _TEST + "if up_is('1.0'):\n    from up.core import gone\n")
    symbols = SymbolTable.build(d.root, "port", tmp_path / "up", "up", version_tests={"up_is": "=="})
    assert [f.severity for f in check_port_imports(d, symbols)] == [Severity.WARNING]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_import_table(tmp_path: Path, case: Case) -> None:
    d, symbols = _setup(tmp_path, case.source)
    found = list(check_port_imports(d, symbols))
    assert [f.severity for f in found] == ([case.severity] if case.severity else []), [f.evidence for f in found]
    if found:
        assert found[0].rule == "MXA122" and found[0].location.path == "port/attn.py"
        assert case.evidence in "\n".join(found[0].evidence)


def test_one_finding_per_root_cause_lists_uses_and_sites(tmp_path: Path) -> None:
    src = "from up.core import gone\nfrom up.core import gone as g2\n\ndef f():\n    return gone(1) + g2(2)\n"
    d, symbols = _setup(tmp_path, src)
    [f] = check_port_imports(d, symbols)
    ev = "\n".join(f.evidence)
    assert "port/attn.py:1" in ev and "port/attn.py:2" in ev  # both sites, one finding
    assert "fails with it: port/attn.py:5: return gone(1) + g2(2)" in ev
    assert "upstream up 2.0" in f.message and "the base release does not define it either" in ev
    unresolved = make_finding("MXA054", Location("port/attn.py", 5, "f"), "unresolved call gone", ())
    other = make_finding("MXA054", Location("port/attn.py", 4, "f"), "unresolved call other", ())
    assert absorb_consequences([f, unresolved, other]) == [f, other]


def test_import_sites_record_guards_and_functions(tmp_path: Path) -> None:
    src = "try:\n    import up.core\nexcept ImportError:\n    pass\n\nclass K:\n    def m(self):\n        from up import core as c\n"
    _, symbols = _setup(tmp_path, src)
    info = symbols.index.get("port.attn")
    assert info is not None
    sites = import_sites(info, "port/attn.py")
    assert [(s.module, s.name, s.local, s.function, [g.kind for g in s.guards]) for s in sites] == [
        ("up.core", None, "up", "", ["try"]), ("up", "core", "c", "K.m", [])]


def test_lookup_answers(tmp_path: Path) -> None:
    _, symbols = _setup(tmp_path, "")
    assert symbols.lookup_import("up.lazy", "x").status is Status.DYNAMIC
    assert symbols.lookup_import("up.pkg", "extra").status is Status.SUBMODULE
    assert symbols.lookup_import("up.core", "kept").status is Status.DEFINED  # from a definition line, unparsed
    first = symbols.lookup_import("up.core", "kept")
    symbols.index.get("up.core")
    # the answer is a function of the module's text, not of whether some earlier question parsed it
    assert symbols.lookup_import("up.core", "kept") == first
    assert symbols.lookup_import("up.core", "removed_helper").status is Status.MISSING_NAME
    assert symbols.at_base("up.core", "removed_helper") is True and symbols.at_base("up.core", "kept") is True
    assert symbols.at_base("port.own", "mine") is None  # the base is upstream's only


TC = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from up.core import Base\n"
TYPE_CHECKING_CASES = [
    Case("string-annotation", TC + "def f(x: 'Base') -> 'Base | None':\n    return x\n", None),
    Case("future-annotations", "from __future__ import annotations\n" + TC + "def f(x: Base | None) -> Base:\n    return x\n", None),
    Case("eager-annotation", TC + "def f(x: Base) -> None:\n    pass\n", Severity.ERROR, "is unbound: NameError"),
    Case("runtime-call", "from __future__ import annotations\n" + TC + "def f():\n    return Base()\n", Severity.ERROR),
    Case("local-rebind", "from __future__ import annotations\n" + TC + "def f():\n    from up.core import Base\n    return Base()\n", None),
    Case("placeholder-plain", TC + "else:\n    Base = None\n\ndef f(x: Base = None):\n    pass\n", None),
    Case("placeholder-union", TC + "else:\n    Base = None\n\ndef f(x: Base | None = None):\n    pass\n", Severity.ERROR,
         "placeholder None"),
    Case("runtime-binding-too", TC + "Base = object\n\ndef f(x: Base):\n    pass\n", None),
    Case("variable-annotation-in-function", TC + "def f():\n    y: Base = 1\n    return y\n", None),
]


@pytest.mark.parametrize("case", TYPE_CHECKING_CASES, ids=[c.id for c in TYPE_CHECKING_CASES])
def test_type_checking_names(tmp_path: Path, case: Case) -> None:
    d, symbols = _setup(tmp_path, case.source)
    found = list(check_type_checking_names(d, symbols))
    assert [f.severity for f in found] == ([case.severity] if case.severity else []), [f.evidence for f in found]
    if found:
        assert found[0].rule == "MXA123" and case.evidence in "\n".join(found[0].evidence)
