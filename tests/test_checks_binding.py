# Attributes (MXA125/126) and call binding (MXA107-109) of port code against port and upstream
# sources, through the one symbol table: a table per check, each positive case beside the
# negative twins a maintainer would reject as findings (inherited, dynamic, guarded, generated).
from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import write_tree

from metax_audit.cache.memo import review_memo
from metax_audit.core.config import AuditConfig
from metax_audit.core.models import Discovery, Finding, Severity, SourceFile
from metax_audit.stages.checks import binding_checks
from metax_audit.stages.trace import trace_backends
from metax_audit.stages.trace.symbols import SymbolTable

UPSTREAM = {
    "up/__init__.py": "",
    "up/base.py": textwrap.dedent('''
        class UpBase:
            upstream_flag = True

            def __init__(self, size, *, dtype=None):
                self.size = size
                self.from_upstream_init = 1

            def run(self, q, k, scale=1.0):
                return q

            def hook(self):
                return 1

        def helper(a, b, *, mode="x"):
            return a

        def open_ended(a, **kwargs):
            return a

        class WithGetattr:
            def __getattr__(self, name):
                return name
        '''),
    "up/lazy.py": "def __getattr__(name):\n    return name\n\nREAL = 1\n",
}
BASE = {**UPSTREAM, "up/base.py": UPSTREAM["up/base.py"].replace("def helper(a, b, *, mode=\"x\")", "def helper(a, b, *, mode=\"x\", legacy=0)")}


def _run(tmp_path: Path, source: str, extra: dict[str, str] | None = None) -> list[Finding]:
    port, up, base = tmp_path / "repo", tmp_path / "up", tmp_path / "base"
    files = {"port/__init__.py": "", "port/own.py": "def mine(x, y=1):\n    return x\n", **(extra or {}),
             "port/attn.py": textwrap.dedent(source)}
    write_tree(port, files)
    write_tree(up, UPSTREAM)
    write_tree(base, BASE)
    d = Discovery(port, "port", (SourceFile("port/attn.py", "port.attn", "glob"),), (), (), (), {})
    config = AuditConfig(port_package="port", upstream_package="up")
    symbols = SymbolTable.build(port, "port", up, "up", upstream_version="2.0", base_root=base, base_version="1.0")
    trace = trace_backends(d, config, up, symbols)
    found = binding_checks(d, trace, symbols)
    # the per-file memo (cold, then read back) changes nothing; nor do the call bindings as trace-memo
    # units per caller file (resolvers of their own), computed, stored, then served
    assert binding_checks(d, trace, symbols, memo=review_memo(True)) == found
    assert binding_checks(d, trace, symbols, memo=review_memo(True)) == found
    for use_cache in (False, True, True):
        assert binding_checks(d, trace, symbols, memo=review_memo(use_cache), memo_common=["test"]) == found
    return found


@dataclass(frozen=True)
class Case:
    id: str
    source: str
    rules: tuple[str, ...]  # expected rule ids, in order; () for none
    evidence: str = ""


CLASS = "from up.base import UpBase, WithGetattr\nimport up.lazy as lazy\nimport up.base as ub\n"
ATTRIBUTE_CASES = [
    Case("own-attribute", CLASS + "class P(UpBase):\n    def __init__(self):\n        self.x = 1\n    def f(self):\n        return self.x\n", ()),
    Case("inherited-from-upstream-init", CLASS + "class P(UpBase):\n    def f(self):\n        return self.from_upstream_init + self.upstream_flag\n", ()),
    Case("missing", CLASS + "class P(UpBase):\n    def f(self):\n        return self.is_v4\n    def g(self):\n        return self.is_v4\n",
         ("MXA125",), "read: port/attn.py:6: return self.is_v4"),
    Case("missing-no-base", "class P:\n    def f(self):\n        return self.nothing\n", ("MXA125",)),
    Case("getattr-base", CLASS + "class P(WithGetattr):\n    def f(self):\n        return self.anything\n", ()),
    Case("unreadable-base", "import torch\nclass P(torch.nn.Module):\n    def f(self):\n        return self.weight\n", ()),
    Case("hasattr-guard", CLASS + "class P(UpBase):\n    def f(self):\n        if hasattr(self, 'maybe'):\n            return self.maybe\n", ()),
    Case("set-from-outside", CLASS + "class P(UpBase):\n    def f(self):\n        return self.filled\n\ndef fill(p):\n    p.filled = 1\n", ()),
    # self.x set in an unrelated class's method defines x for that class, not for another that reads self.x
    Case("set-on-self-of-an-unrelated-class", CLASS + "class Q(UpBase):\n    def __init__(self):\n        self.shared = 1\n\n"
         "class P(UpBase):\n    def f(self):\n        return self.shared\n", ("MXA125",), "reads 'shared' on P"),
    # ... but a subclass that sets it answers for the base's (or mixin's) read on its instances
    Case("set-on-self-by-a-subclass", CLASS + "class Mixin:\n    def f(self):\n        return self.made\n\n"
         "class Concrete(Mixin, UpBase):\n    def __init__(self):\n        self.made = 1\n", ()),
    Case("set-on-a-class-attribute-elsewhere", CLASS + "class P(UpBase):\n    def f(self):\n        return self.late\n\n"
         "class Q:\n    @classmethod\n    def g(cls, p):\n        p.late = 1\n", ()),
    # a base whose import does not resolve gives the class unknown attributes: the import is the finding
    Case("base-import-broken", "from up.base import NotThere\nclass P(NotThere):\n    def f(self):\n        return self.from_the_lost_base\n", ()),
    Case("setattr-computed", CLASS + "class P(UpBase):\n    def __init__(self, **kw):\n        for k, v in kw.items():\n            setattr(self, k, v)\n    def f(self):\n        return self.any\n", ()),
    Case("dataclass-field", "from dataclasses import dataclass\n@dataclass\nclass P:\n    a: int\n    def f(self):\n        return self.a\n", ()),
    Case("super-method", CLASS + "class P(UpBase):\n    def hook(self):\n        return super().hook() + super().gone()\n", ("MXA125",), "super().gone"),
    Case("module-attribute", CLASS + "def f():\n    return ub.helper(1, 2) + ub.missing_fn()\n", ("MXA126",), "has no __getattr__"),
    Case("module-getattr", CLASS + "def f():\n    return lazy.anything + lazy.REAL\n", ()),
    # the object is switched to a subclass at runtime (`self.__class__ = Sub`): Sub's method is there when read
    Case("class-swapped-at-runtime", CLASS + "class P(UpBase):\n    def f(self):\n        self.__class__ = Sub\n        return self.view()\n\n"
         "class Sub(P):\n    def view(self):\n        return 1\n", ()),
    Case("class-swapped-other-name", CLASS + "class P(UpBase):\n    def f(self):\n        self.__class__ = Sub\n        return self.nowhere()\n\n"
         "class Sub(P):\n    def view(self):\n        return 1\n", ("MXA125",)),
    Case("module-alias-shadowed", CLASS + "def f(ub):\n    return ub.missing_fn()\n", ()),
]

BINDING_CASES = [
    Case("ok", "from up.base import helper\ndef f():\n    return helper(1, 2, mode='y')\n", ()),
    Case("unknown-keyword", "from up.base import helper\ndef f():\n    return helper(1, 2, legacy=3)\n", ("MXA107",),
         "base up 1.0: the call binds against"),
    Case("too-many-positional", "from up.base import helper\ndef f():\n    return helper(1, 2, 3)\n", ("MXA108",)),
    Case("missing-required", "from up.base import helper\ndef f():\n    return helper(1)\n", ("MXA109",)),
    Case("kwargs-swallow", "from up.base import open_ended\ndef f():\n    return open_ended(1, anything=2)\n", ()),
    Case("port-to-port", "from port.own import mine\ndef f():\n    return mine(1, z=2)\n", ("MXA107",), "port snapshot: port/own.py:1"),
    Case("constructor", "from up.base import UpBase\ndef f():\n    return UpBase(1, dtype=2, device=3)\n", ("MXA107",)),
    Case("bound-method", "from up.base import UpBase\nclass P(UpBase):\n    def f(self, q):\n        return self.run(q, q, scale=2.0, causal=True)\n", ("MXA107",)),
    Case("unbound-method", "from up.base import UpBase\nclass P(UpBase):\n    def f(self, q):\n        return UpBase.run(self, q, q)\n", ()),
    Case("super-init", "from up.base import UpBase\nclass P(UpBase):\n    def __init__(self):\n        super().__init__(4, dtype=None)\n", ()),
    Case("super-two-args", "from up.base import UpBase\nclass P(UpBase):\n    def __init__(self):\n        super(UpBase, self).__init__()\n", ()),
    Case("classmethod-via-class", "class K:\n    @classmethod\n    def make(cls, a, b=0):\n        return cls()\n\ndef f():\n    return K.make(1, 2)\n", ()),
    Case("decorated-callee", "import functools\ndef deco(fn):\n    return fn\n@deco\ndef g(a):\n    return a\ndef f():\n    return g(1, 2, 3)\n", ()),
    Case("dataclass-constructor", "from dataclasses import dataclass\n@dataclass\nclass D:\n    a: int\ndef f():\n    return D(a=1, b=2)\n", ()),
    Case("star-args", "from up.base import helper\ndef f(xs):\n    return helper(*xs)\n", ()),
]


@pytest.mark.parametrize("case", ATTRIBUTE_CASES + BINDING_CASES, ids=[c.id for c in ATTRIBUTE_CASES + BINDING_CASES])
def test_binding_table(tmp_path: Path, case: Case) -> None:
    found = [f for f in _run(tmp_path, case.source) if f.rule != "MXA122"]
    assert tuple(f.rule for f in found) == case.rules, [(f.rule, f.message) for f in found]
    if case.evidence:
        assert case.evidence in "\n".join([found[0].message, *found[0].evidence])


def test_one_finding_per_attribute_lists_every_read(tmp_path: Path) -> None:
    [f] = _run(tmp_path, ATTRIBUTE_CASES[2].source)
    assert f.location.line == 6 and "2 read(s)" in f.message
    assert sum(e.startswith("read: ") for e in f.evidence) == 2
    assert any("upstream:up.base.UpBase" in e for e in f.evidence)  # the upstream base was read


def test_binding_checks_keep_each_files_reads_in_their_own_memo(tmp_path: Path) -> None:
    """_run asserts equality with the memo cold and warm; here: what the warm run read back."""
    from metax_audit.cache.resultcache import STORE, results_dir
    from metax_audit.cache.store import Key, Kind

    _run(tmp_path, ATTRIBUTE_CASES[2].source)
    units = {u[0] for f in (results_dir() / "binding-file").glob("*.entry") for u in STORE.get(Key(Kind.BINDING_FILE, f.stem))}
    assert units == {"import-sites", "type-checking-uses", "method-reads", "assigned-elsewhere", "stored-names", "class-facts", "free-names",
                     "attribute-loads"}
    assert not (results_dir() / "checks-file").exists()  # the parent's records are another kind


def test_a_read_only_a_subclass_defines_is_info_when_the_port_swaps_the_object_to_it_outside_the_scope(tmp_path: Path) -> None:
    """The class an attribute is read on is the object's real class: a file out of the review's scope (a quantization
    method) swaps the impl to the subclass that defines the name (`layer.impl.__class__ = Sub`)."""
    source = CLASS + "class P(UpBase):\n    def f(self):\n        return self.view()\n\nclass Sub(P):\n    def view(self):\n        return 1\n"
    swap = {"port/quant.py": "from port.attn import Sub\n\ndef upgrade(layer):\n    layer.impl.__class__ = Sub\n"}
    found = [f for f in _run(tmp_path, source, swap) if f.rule == "MXA125"]
    assert [(f.severity, "only its subclass Sub defines" in f.message) for f in found] == [(Severity.INFO, True)]
    assert "port/quant.py:4" in found[0].evidence[-1]
    alone = [f for f in _run(tmp_path / "no-swap", source) if f.rule == "MXA125"]  # nothing makes it a Sub: an error
    assert [f.severity for f in alone] == [Severity.ERROR]


def test_a_module_level_name_stands_for_the_first_class_or_import_of_the_body() -> None:
    import ast

    from metax_audit.stages.checks.attributes import _dotted_in
    from metax_audit.stages.trace.modules import ModuleInfo

    source = ("from .enums import Backend as B, Kind\nfrom x import *\nclass Kind:\n    pass\n"
              "from y import Kind as Other, Backend\nclass Local:\n    pass\n")
    info = ModuleInfo("pkg.mod", "pkg/mod.py", "port", False, ast.parse(source), source)
    assert _dotted_in(info, "B") == "pkg.enums.Backend"
    assert _dotted_in(info, "B.FLASH.value") == "pkg.enums.Backend.FLASH.value"
    assert _dotted_in(info, "Kind") == "pkg.enums.Kind"  # the import comes first
    assert _dotted_in(info, "Other") == "y.Kind"
    assert _dotted_in(info, "Backend") == "y.Backend"
    assert _dotted_in(info, "Local.attr") == "pkg.mod.Local.attr"
    assert _dotted_in(info, "missing") is None and _dotted_in(info, "*") is None
