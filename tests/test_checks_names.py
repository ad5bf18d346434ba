# Names undefined at runtime (MXA127) and the imports of callers outside the scope (MXA122 under the
# caller): tables of forms, each broken one with the twin that must not be reported.
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from metax_audit.core.models import Discovery, SourceFile
from metax_audit.stages.checks import discovery_checks
from metax_audit.stages.checks.imports import check_port_imports
from metax_audit.stages.checks.names import check_undefined_names
from metax_audit.stages.trace.symbols import SymbolTable

UPSTREAM = {"up/__init__.py": "", "up/core.py": "def kept():\n    pass\nNAMES = 1\n", "up/star.py": "from up.core import *\n"}


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def _setup(tmp_path: Path, files: dict[str, str], scope: tuple[str, ...] = ("port/attn.py",),
           callers: dict[str, tuple[str, ...]] | None = None) -> tuple[Discovery, SymbolTable]:
    port, up = tmp_path / "port_repo", tmp_path / "up"
    _write(port, {"port/__init__.py": "", **files})
    _write(up, UPSTREAM)
    d = Discovery(port, "port", tuple(SourceFile(p, p[:-3].replace("/", "."), "glob") for p in scope), (), (), (), callers or {})
    return d, SymbolTable.build(port, "port", up, "up", upstream_version="2.0")


@dataclass(frozen=True)
class Case:
    id: str
    source: str
    names: tuple[str, ...]  # the undefined names reported, in order


CASES = [
    Case("deleted-import-still-used", "import torch\n\ndef f(x):\n    return F.linear(x, torch.ones(1))\n", ("F",)),
    Case("module-level-read", "X = Y + 1\n", ("Y",)),
    Case("import-kept", "import torch.nn.functional as F\n\ndef f(x):\n    return F.linear(x)\n", ()),
    Case("builtins-and-dunders", "def f():\n    return len(__file__), __name__, NotImplemented\n", ()),
    Case("locals-params-closures", "def f(a, *args, k=1, **kw):\n    b = a\n    def g():\n        return a + b + k + len(args) + len(kw)\n    return g\n", ()),
    Case("comprehension-and-lambda", "def f(xs):\n    h = lambda y: y + 1\n    return [h(x) for x in xs if x] + [z for z in {w for w in xs}]\n", ()),
    Case("class-body-not-visible-in-methods", "class K:\n    attr = 1\n    def m(self):\n        return attr\n", ("attr",)),
    Case("class-body-reads-its-names", "class K:\n    attr = 1\n    other = attr + 1\n", ()),
    Case("except-as-and-with-as", "def f():\n    try:\n        pass\n    except ValueError as e:\n        return e\n    with open('x') as fh:\n        return fh\n", ()),
    Case("type-checking-block-skipped", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    x = Gone\n", ()),
    Case("name-error-guard", "try:\n    v = maybe_defined\nexcept NameError:\n    v = None\n", ()),
    Case("future-annotations-not-evaluated", "from __future__ import annotations\n\ndef f(x: Missing) -> Other:\n    y: Local = 1\n    return y\n", ()),
    Case("eager-annotation", "def f(x: Missing) -> None:\n    pass\n", ("Missing",)),
    Case("local-annotation-never-evaluated", "def f():\n    y: Missing = 1\n    return y\n", ()),
    Case("global-declared-elsewhere", "def init():\n    global STATE\n    STATE = 1\n\ndef read():\n    return STATE\n", ()),
    Case("star-import-of-a-read-module", "from up.star import *\n\ndef f():\n    return kept() + NAMES\n", ()),
    Case("star-import-without-the-name", "from up.star import *\n\ndef f():\n    return gone()\n", ("gone",)),
    Case("globals-write-makes-it-dynamic", "globals()['late'] = 1\n\ndef f():\n    return late\n", ()),
    Case("walrus-in-comprehension", "def f(xs):\n    [y := x for x in xs]\n    return y\n", ()),
    Case("match-capture", "def f(p):\n    match p:\n        case [a, *rest]:\n            return a, rest\n        case {'k': v, **others}:\n            return v, others\n", ()),
    Case("decorator-and-default", "@undefined_deco\ndef f(x=undefined_default):\n    pass\n", ("undefined_deco", "undefined_default")),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_undefined_names(tmp_path: Path, case: Case) -> None:
    _, symbols = _setup(tmp_path, {"port/attn.py": case.source})
    found = list(check_undefined_names(["port/attn.py"], symbols))
    assert [f.location.symbol.removeprefix("undefined:") for f in found] == list(case.names), [f.evidence for f in found]
    assert all(f.rule == "MXA127" and f.severity.value == "error" for f in found)


def test_undefined_name_evidence_lists_every_read_and_near_names(tmp_path: Path) -> None:
    src = "import torch.nn as nn\n\ndef f(x):\n    return n.Linear(x)\n\ndef g(x):\n    return n.ReLU(x)\n"
    _, symbols = _setup(tmp_path, {"port/attn.py": src})
    [f] = check_undefined_names(["port/attn.py"], symbols)
    ev = "\n".join(f.evidence)
    assert f.location.line == 4 and "2 read(s)" in f.message and "NameError when f runs" in f.message
    assert "fails with it: port/attn.py:4: return n.Linear(x)  (in f)" in ev and "port/attn.py:7" in ev
    assert "closest bound names: nn" in ev


def test_discovery_checks_run_the_undefined_names_of_the_scope(tmp_path: Path) -> None:
    d, symbols = _setup(tmp_path, {"port/attn.py": "def f():\n    return F.relu(1)\n"})
    first, _ = discovery_checks(d, symbols)
    assert [f.rule for f in first] == ["MXA127"]


def test_caller_outside_the_scope_imports_a_name_the_backend_no_longer_defines(tmp_path: Path) -> None:
    files = {
        "port/attn.py": "class MacaIndexerBackend:\n    pass\n",
        # a model (outside the scope) imports the old name from the backend, and an unrelated missing name
        # from a module outside the scope (not what touches the attention code: not bound here)
        "port/model.py": "from port.attn import IndexerBackend\nfrom port.other import whatever\n\nB = IndexerBackend\n",
        "port/other.py": "X = 1\n",
    }
    d, symbols = _setup(tmp_path, files, callers={"port/attn.py": ("port/model.py",)})
    [f] = check_port_imports(d, symbols)
    assert f.rule == "MXA122" and f.location.path == "port/model.py" and f.location.line == 1
    ev = "\n".join(f.evidence)
    assert "IndexerBackend" in f.message and "closest existing names: MacaIndexerBackend" in ev
    assert "fails with it: port/model.py:4: B = IndexerBackend" in ev
    # the same model with the name the backend defines binds
    files["port/model.py"] = "from port.attn import MacaIndexerBackend as IndexerBackend\n"
    d, symbols = _setup(tmp_path, files, callers={"port/attn.py": ("port/model.py",)})
    assert list(check_port_imports(d, symbols)) == []


def test_inventory_lists_callers_outside_the_scope_with_their_findings(tmp_path: Path) -> None:
    from metax_audit.core.models import SnapshotInfo
    from metax_audit.stages.inventory import CALLER, build_report

    files = {"port/attn.py": "class MacaIndexerBackend:\n    pass\n", "port/model.py": "from port.attn import IndexerBackend\n"}
    d, symbols = _setup(tmp_path, files, callers={"port/attn.py": ("port/model.py",)})
    found = list(check_port_imports(d, symbols))
    report = build_report(snapshot=SnapshotInfo(mode="rev", repo=str(tmp_path), commit="0" * 40, dirty=False, root=tmp_path), discovery=d,
                          trace=None, comparison=None, findings=found, probes=(), stages=(), upstream=None, environment={},
                          test_run=None, wall_seconds=0.0, waivers={}, tool_version="t", generated_at="now")
    [caller] = [r for r in report.files if r.reason == CALLER]
    assert caller.path == "port/model.py" and caller.findings == (found[0].id,) and caller.status == "needs-action"
    assert report.coverage.in_scope == 1  # the caller is listed, not counted as a file in scope


GETATTR_CASES = [
    # (the module's text, name asked, expected status)
    ("TABLE = {'A': lambda: 1, 'B': lambda: 2}\n\ndef __getattr__(name):\n    if name in TABLE:\n        return TABLE[name]()\n"
     "    raise AttributeError(name)\n", "A", "dynamic"),
    ("TABLE = {'A': lambda: 1, 'B': lambda: 2}\n\ndef __getattr__(name):\n    if name in TABLE:\n        return TABLE[name]()\n"
     "    raise AttributeError(name)\n", "C", "missing-name"),
    ("env: dict = {'X': 1}\n\ndef __getattr__(name: str):\n    '''lazy'''\n    if name in env:\n        return env[name]\n"
     "    raise AttributeError(f'no {name}')\n", "Y", "missing-name"),
    ("def __getattr__(name):\n    if name == 'one':\n        return 1\n    elif name in ('two', 'three'):\n        return 2\n"
     "    raise AttributeError(name)\n", "three", "dynamic"),
    ("def __getattr__(name):\n    if name == 'one':\n        return 1\n    elif name in ('two', 'three'):\n        return 2\n"
     "    raise AttributeError(name)\n", "four", "missing-name"),
    # the table grows at runtime, the function computes, or it never raises: every name may exist
    ("TABLE = {'A': 1}\nTABLE.update(other())\n\ndef __getattr__(name):\n    if name in TABLE:\n        return TABLE[name]\n"
     "    raise AttributeError(name)\n", "C", "dynamic"),
    ("def __getattr__(name):\n    return load(name)\n", "C", "dynamic"),
    ("def __getattr__(name):\n    if name.startswith('x'):\n        return 1\n    raise AttributeError(name)\n", "C", "dynamic"),
]


@pytest.mark.parametrize(("text", "name", "status"), GETATTR_CASES)
def test_module_getattr_is_evaluated(tmp_path: Path, text: str, name: str, status: str) -> None:
    _, symbols = _setup(tmp_path, {"port/envs.py": text, "port/attn.py": ""})
    answer = symbols.lookup_import("port.envs", name)
    assert answer.status.value == status, answer
    if status == "missing-name":
        assert "module __getattr__ in port/envs.py" in answer.reason and "raises AttributeError for any other" in answer.reason


def test_import_and_attribute_read_of_a_name_the_getattr_does_not_map(tmp_path: Path) -> None:
    from metax_audit.stages.checks.attributes import check_attributes

    envs = "variables = {'USE_FP8': lambda: False}\n\ndef __getattr__(name):\n    if name in variables:\n" \
           "        return variables[name]()\n    raise AttributeError(name)\n"
    src = "import port.envs as envs\nfrom port.envs import USE_FP8, USE_FP4\n\ndef f():\n    return envs.USE_INT8 or envs.USE_FP8\n"
    d, symbols = _setup(tmp_path, {"port/envs.py": envs, "port/attn.py": src})
    [imp] = check_port_imports(d, symbols)
    assert "USE_FP4" in imp.message and "maps only 1 name(s) (USE_FP8)" in "\n".join(imp.evidence)
    [read] = [f for f in check_attributes(d, symbols) if f.rule == "MXA126"]
    assert "USE_INT8" in read.message and read.severity.value == "error"
    assert "maps only 1 name(s)" in "\n".join(read.evidence)


def test_undefined_names_of_a_caller_are_read_in_the_whole_file(tmp_path: Path) -> None:
    # a NameError anywhere in a caller (the model running the attention) stops that model: 94162c3^'s hc_head
    files = {
        "port/attn.py": "class IndexerBackend:\n    pass\n",
        "port/model.py": ("from port.attn import IndexerBackend\n\n"
                          "class Indexer:\n    def forward(self, q):\n        backend = IndexerBackend\n        return q * q_scale\n\n"
                          "def unrelated():\n    return other_missing\n"),
    }
    d, symbols = _setup(tmp_path, files, callers={"port/attn.py": ("port/model.py",)})
    first, _ = discovery_checks(d, symbols)
    assert [(f.rule, f.location.path, f.location.symbol) for f in first] == [
        ("MXA127", "port/model.py", "undefined:q_scale"), ("MXA127", "port/model.py", "undefined:other_missing")]


ENUM_UP = ("from enum import Enum, EnumMeta\n\nclass _Meta(EnumMeta):\n    def __getitem__(cls, name):\n        return super().__getitem__(name)\n\n"
           "class Backend(Enum, metaclass=_Meta):\n    FLASH = 'a'\n    TRITON = 'b'\n\n    def path(self):\n        return self.value\n\n"
           "class Lazy(Enum):\n    X = 1\n\nclass LazyMeta(EnumMeta):\n    def __getattr__(cls, name):\n        return 1\n\n"
           "class Open(Enum, metaclass=LazyMeta):\n    Y = 1\n")


@pytest.mark.parametrize(("read", "missing"), [
    ("Backend.FLASH", None), ("Backend.TREE", "TREE"), ("Backend.FLASH.value", None), ("Backend.__members__", None),
    ("Backend.path", None), ("Open.ANYTHING", None),  # a metaclass __getattr__: members may be dynamic
])
def test_enum_member_reads_bind_against_the_enum(tmp_path: Path, read: str, missing: str | None) -> None:
    from metax_audit.stages.checks.attributes import check_attributes

    d, symbols = _setup(tmp_path, {"port/attn.py": f"from up.reg import Backend, Open\n\nPRIORITY = [{read}]\n"})
    (tmp_path / "up" / "up" / "reg.py").write_text(ENUM_UP)
    d, symbols = _setup(tmp_path, {"port/attn.py": f"from up.reg import Backend, Open\n\nPRIORITY = [{read}]\n"})
    found = [f for f in check_attributes(d, symbols) if f.rule == "MXA125"]
    assert [f.location.symbol.rsplit(".", 1)[-1] for f in found] == ([missing] if missing else []), [f.message for f in found]
    if missing:
        ev = "\n".join(found[0].evidence)
        assert found[0].severity.value == "error" and "enum Backend" in ev and "FLASH, TRITON" in ev


@pytest.mark.parametrize(("read", "missing"), [
    ("self.batch.num_reqs", None), ("self.batch.upstream_only_field", "upstream_only_field"), ("self.batch.added_later", None),
    ("self.other.anything", None),  # self.other is assigned two different things: not bound
])
def test_reads_on_an_object_the_class_constructs_bind_against_that_class(tmp_path: Path, read: str, missing: str | None) -> None:
    from metax_audit.stages.checks.attributes import check_attributes

    batch = "class MacaInputBatch:\n    def __init__(self):\n        self.num_reqs = 0\n"
    runner = ("from port.batch import MacaInputBatch\n\nclass Runner:\n    def __init__(self, x):\n"
              "        self.batch = MacaInputBatch()\n        self.batch.added_later = 1\n"
              "        self.other = MacaInputBatch() if x else None\n\n"
              f"    def step(self):\n        return {read}\n")
    d, symbols = _setup(tmp_path, {"port/batch.py": batch, "port/attn.py": runner})
    found = [f for f in check_attributes(d, symbols) if f.rule == "MXA125"]
    assert [f.location.symbol.rsplit(".", 1)[-1] for f in found] == ([missing] if missing else []), [f.message for f in found]
    if missing:
        assert "MacaInputBatch (the class Runner constructs)" in found[0].message
        assert any("self.batch is only ever a MacaInputBatch" in e for e in found[0].evidence)
