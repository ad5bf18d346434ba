# The introspection worker in a real subprocess against tiny packages written to tmp_path:
# import errors, hangs and crashes become facts; partials, __wrapped__ and **kwargs reads are seen.
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import write_tree

from metax_audit.core.errors import IntrospectError
from metax_audit.stages.introspect import introspect, load_manifest, write_manifest
from metax_audit.stages.introspect_worker.signatures import kwargs_usage, pybind_signature

GOOD = '''
import functools

def kernel(q, k, v, *, scale=1.0, **kwargs):
    """Run the kernel.

    More text."""
    window = kwargs.get("window", -1)
    if "soft_cap" in kwargs:
        pass
    return kwargs.pop("sinks", None), kwargs["alibi"], window

def _logged(fn):
    @functools.wraps(fn)
    def inner(*args, **kwargs):
        return fn(*args, **kwargs)
    return inner

@_logged
def decorated(x, y=2):
    return x + y

def base(a, b, c=3):
    return a

bound = functools.partial(base, 1, c=4)

class Wrapper:
    def __init__(self, workspace, layout="NHD"):
        self.layout = layout

    def plan(self, indptr, indices, page_size, **kwargs):
        return helper(**kwargs)

    @staticmethod
    def static(a, b):
        return a

def helper(**kwargs):
    return kwargs
'''


@pytest.fixture
def site(tmp_path: Path) -> Path:
    return write_tree(tmp_path / "site", {
        "goodpkg/__init__.py": "from goodpkg.ops import kernel, Wrapper\n",
        "goodpkg/ops.py": GOOD,
        "boompkg/__init__.py": "raise RuntimeError('no MACA runtime found')\n",
        "boompkg/iface.py": "def attn(q, k, v, causal=False):\n    return q\n",
        "hangpkg/__init__.py": "import time\ntime.sleep(60)\n",
        "crashpkg/__init__.py": "import os\nos._exit(3)\n",
    })


def test_import_facts(site: Path) -> None:
    facts = introspect(
        ["goodpkg.kernel", "goodpkg.ops.decorated", "goodpkg.ops.bound", "goodpkg.Wrapper", "goodpkg.Wrapper.plan",
         "goodpkg.ops.Wrapper.static", "goodpkg.missing", "goodpkg.ops.Wrapper.nope"],
        extra_path=[site], timeout=30,
    ).facts
    k = facts["goodpkg.kernel"]
    assert (k.status, k.source) == ("ok", "import")
    assert k.signature == "(q, k, v, *, scale=1.0, **kwargs)"
    assert k.kwargs_reads == ("alibi", "sinks", "soft_cap", "window") and not k.kwargs_forwarded
    assert k.doc is not None and k.doc.startswith("Run the kernel.")
    assert k.sourcefile is not None and k.sourcefile.endswith("ops.py") and k.line == 4
    # __wrapped__ is followed: the signature is the decorated function's, not (*args, **kwargs)
    assert facts["goodpkg.ops.decorated"].signature == "(x, y=2)"
    assert facts["goodpkg.ops.decorated"].kwargs_reads is None
    # functools.partial: bound positional gone, bound keyword keeps its new default
    assert [p.name for p in facts["goodpkg.ops.bound"].params or ()] == ["b", "c"]
    assert facts["goodpkg.Wrapper"].signature == "(workspace, layout='NHD')"
    plan = facts["goodpkg.Wrapper.plan"]
    assert plan.signature == "(indptr, indices, page_size, **kwargs)"  # self dropped: called on an instance
    assert plan.kwargs_reads == () and plan.kwargs_forwarded
    assert facts["goodpkg.ops.Wrapper.static"].signature == "(a, b)"
    assert facts["goodpkg.missing"].status == "not-found"
    assert "goodpkg.missing" in (facts["goodpkg.missing"].error or "")
    assert facts["goodpkg.ops.Wrapper.nope"].status == "not-found"


def test_import_error_falls_back_to_static(site: Path) -> None:
    facts = introspect(["boompkg.iface.attn", "boompkg.iface.gone", "nosuchpkg.f"], extra_path=[site], timeout=30).facts
    attn = facts["boompkg.iface.attn"]
    assert (attn.status, attn.source, attn.signature) == ("ok", "static", "(q, k, v, causal=False)")
    assert "no MACA runtime found" in (attn.error or "")
    assert (facts["boompkg.iface.gone"].status, facts["boompkg.iface.gone"].source) == ("not-found", "static")
    assert facts["nosuchpkg.f"].status == "import-error"


def test_hang_and_crash_are_facts_not_our_crash(site: Path) -> None:
    facts = introspect(["hangpkg.f", "goodpkg.kernel", "crashpkg.g", "goodpkg.ops.base"], extra_path=[site], timeout=4).facts
    assert facts["hangpkg.f"].status == "timeout"
    assert facts["crashpkg.g"].status == "crash" and "exit 3" in (facts["crashpkg.g"].error or "")
    assert facts["goodpkg.kernel"].status == "ok" and facts["goodpkg.ops.base"].status == "ok"


def test_static_roots_read_an_sdist_without_importing(tmp_path: Path) -> None:
    sdist = write_tree(tmp_path / "fa-2.6.3", {
        "PKG-INFO": "Metadata-Version: 2.1\nName: fa-attn\nVersion: 2.6.3\n",
        "fa_attn/__init__.py": "from fa_attn.iface import varlen\n",
        "fa_attn/iface.py": "import fa_attn_cuda\n\ndef varlen(q, k, v, cu_q, *, softcap=0.0, **kw):\n    return kw.get('deterministic')\n",
    })
    facts = introspect(["fa_attn.varlen"], static_roots=[sdist], timeout=30).facts
    f = facts["fa_attn.varlen"]
    assert (f.status, f.source) == ("ok", "static")
    assert f.signature == "(q, k, v, cu_q, *, softcap=0.0, **kw)"
    assert f.kwargs_reads == ("deterministic",)
    assert (f.distribution, f.version) == ("fa-attn", "2.6.3")


def test_worker_writes_no_bytecode(site: Path) -> None:
    introspect(["goodpkg.kernel"], extra_path=[site], timeout=30)
    assert not list(site.rglob("__pycache__"))


def test_bad_interpreter_is_an_audit_error(tmp_path: Path) -> None:
    with pytest.raises(Exception) as info:
        introspect(["x.y"], python=str(tmp_path / "no-python"))
    assert isinstance(info.value, IntrospectError) or "cannot run" in str(info.value)


def test_manifest_round_trip(site: Path, tmp_path: Path) -> None:
    facts = introspect(["goodpkg.kernel", "goodpkg.missing", "goodpkg.Wrapper.plan", "goodpkg.ops.helper"], extra_path=[site], timeout=30)
    assert facts.facts["goodpkg.Wrapper.plan"].kwargs_reads == ()  # reads nothing: not "unknown"
    path = tmp_path / "stack.json"
    write_manifest(facts, path)
    data = json.loads(path.read_text())
    assert data["schema"] == "metax-audit/stack/v1" and data["captured_at"] and data["python"]
    again = load_manifest(path)
    assert again.source == f"manifest:{path}"
    assert again.facts == facts.facts
    path.write_text('{"schema": "other"}')
    with pytest.raises(IntrospectError):
        load_manifest(path)


@pytest.mark.parametrize(("doc", "signature", "names"), [
    ("plan(arg0: at::Tensor, arg1: int, causal: bool = False) -> list[int]\n", "(arg0: at::Tensor, arg1: int, causal: bool = False) -> list[int]", [("arg0", "POSITIONAL_ONLY"), ("arg1", "POSITIONAL_ONLY"), ("causal", "POSITIONAL_OR_KEYWORD")]),
    ("Overloaded function.\n\n1. plan(self: M, x: Dict[str, int]) -> None\n", "(self: M, x: Dict[str, int]) -> None", [("x", "POSITIONAL_OR_KEYWORD")]),
    ("Something else entirely", None, None),
])
def test_pybind_docstring(doc: str, signature: str | None, names: list[tuple[str, str]] | None) -> None:
    got = pybind_signature("plan", doc)
    if signature is None:
        assert got is None
        return
    assert got is not None
    assert got[0] == signature
    assert [(p["name"], p["kind"]) for p in got[1]] == names


@pytest.mark.parametrize(("body", "reads", "forwarded"), [
    ("x = kwargs.get('a')", ["a"], False),
    ("x = kwargs.pop('a', 1); y = kwargs['b']", ["a", "b"], False),
    ("if 'c' not in kwargs: pass", ["c"], False),
    ("g(**kwargs)", [], True),
    ("g(kwargs)", [], True),
    ("for k, v in kwargs.items(): pass", [], True),
    ("return 1", [], False),
])
def test_kwargs_usage(body: str, reads: list[str], forwarded: bool) -> None:
    import ast

    fn = ast.parse(f"def f(x, **kwargs):\n    {body}\n").body[0]
    assert kwargs_usage(fn) == (reads, forwarded)
    assert kwargs_usage(ast.parse("def f(x):\n    pass\n").body[0]) is None


def test_worker_is_stdlib_only_at_module_level() -> None:
    """Each module of the worker package imports the stdlib and its siblings (relative) only."""
    import ast

    files = sorted(Path(__file__).parents[1].joinpath("metax_audit", "stages", "introspect_worker").glob("*.py"))
    assert {f.name for f in files} >= {"__init__.py", "__main__.py", "protocol.py", "fence.py"}
    for path in files:
        body = ast.parse(path.read_text()).body
        tops = {a.name.split(".")[0] for n in body if isinstance(n, ast.Import) for a in n.names}
        tops |= {n.module.split(".")[0] for n in body if isinstance(n, ast.ImportFrom) and n.module and not n.level}
        assert tops <= set(sys.stdlib_module_names) | {"__future__"}, path.name


def test_port_is_read_from_the_snapshot_never_imported(tmp_path: Path) -> None:
    installed = write_tree(tmp_path / "site", {"portpkg/__init__.py": "raise SystemExit('imported the installed port')\n"})
    snapshot = write_tree(tmp_path / "snap", {"portpkg/__init__.py": "", "portpkg/ops.py": "def merge(out, lse, *, base=2.0):\n    return out\n"})
    facts = introspect(["portpkg.ops.merge"], extra_path=[installed], static_roots=[snapshot], never_import=["portpkg"]).facts
    f = facts["portpkg.ops.merge"]
    assert (f.status, f.source, f.signature) == ("ok", "static", "(out, lse, *, base=2.0)")
    assert f.sourcefile is not None and f.sourcefile.startswith(str(snapshot))


def test_stack_targets_adds_imported_kernel_names(tmp_path: Path) -> None:
    from metax_audit.core.models import Discovery, SourceFile, TraceResult
    from metax_audit.stages.introspect import stack_targets

    write_tree(tmp_path, {"port/a.py": "from kern.decode import _helper\nimport os\n"})
    d = Discovery(tmp_path, "port", (SourceFile("port/a.py", "port.a", "glob"),), (), (), (), {})
    assert stack_targets(d, TraceResult((), ()), ["kern"]) == ["kern.decode._helper"]


def test_stack_targets_keep_each_files_imports_under_its_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the cache, the targets equal a fresh read; an unchanged file is not read again, a changed one is."""
    from metax_audit.cache.memo import review_memo
    from metax_audit.core import pysource
    from metax_audit.core.models import Discovery, SourceFile, TraceResult
    from metax_audit.stages.introspect import stack_targets

    write_tree(tmp_path, {"port/a.py": "from kern.decode import _helper\nimport os\n",
                          "port/b.py": "def f():\n    from kern import run, _x\n    import kern.ops\n"})
    files = (SourceFile("port/a.py", "port.a", "glob"), SourceFile("port/b.py", "port.b", "glob"))
    d = Discovery(tmp_path, "port", files, (), (), (), {})
    fresh = stack_targets(d, TraceResult((), ()), ["kern"])
    assert fresh == ["kern.decode._helper", "kern.run", "kern._x", "kern.ops"]
    assert stack_targets(d, TraceResult((), ()), ["kern"], memo=review_memo(True)) == fresh
    read: list[list[str]] = []
    real = pysource.imported_names
    monkeypatch.setattr(pysource, "imported_names", lambda root, paths, packages: read.append(list(paths)) or real(root, paths, packages))
    assert stack_targets(d, TraceResult((), ()), ["kern"], memo=review_memo(True)) == fresh and read == []
    (tmp_path / "port/a.py").write_text("from kern.decode import _helper, other\n")
    assert stack_targets(d, TraceResult((), ()), ["kern"], memo=review_memo(True)) == [
        "kern.decode._helper", "kern.decode.other", "kern.run", "kern._x", "kern.ops"] and read == [["port/a.py"]]


def test_import_time_caches_go_to_a_throwaway_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = write_tree(tmp_path / "site", {"cachepkg/__init__.py": (
        "import os, pathlib\n"
        "d = pathlib.Path(os.environ['XDG_CACHE_HOME']) / 'cachepkg'\n"
        "d.mkdir(parents=True, exist_ok=True)\n"
        "(d / 'jit.log').write_text('x')\n"
        "def f(a):\n    return a\n")})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "usercache"))
    facts = introspect(["cachepkg.f"], extra_path=[site], timeout=30).facts
    assert facts["cachepkg.f"].status == "ok"
    assert not (tmp_path / "usercache").exists()


PORT_READ = {
    "portpkg/__init__.py": "from .ops import merge as merged\nfrom portpkg.layers import Layer\n",
    "portpkg/ops.py": ("import functools\n\ndef merge(out, lse, *, base=2.0, **kw):\n    '''Merge.'''\n"
                       "    return kw.get('scale')\n\n@functools.lru_cache\ndef cached(x):\n    return x\n\n"
                       "@custom\ndef wrapped(x, y=1):\n    return x\n\nLIMIT = 3\n"),
    "portpkg/layers.py": "class Layer:\n    def __init__(self, dim, heads=8):\n        pass\n\n    def forward(self, x):\n        return x\n",
    "portpkg/broken.py": "def f(:\n",
    "portpkg/away.py": "from otherpkg.impl import run\n",
    "otherpkg/__init__.py": "",
    "otherpkg/impl.py": "def run(a, b):\n    return a\n",
}
PORT_TARGETS = ["portpkg.ops.merge", "portpkg.merged", "portpkg.Layer", "portpkg.Layer.forward", "portpkg.ops.cached",
                "portpkg.ops.wrapped", "portpkg.ops.LIMIT", "portpkg.ops.nope", "portpkg.broken.f", "portpkg.missing.x",
                "portpkg.Layer.nope", "portpkg.ops"]


def test_the_port_read_in_process_equals_the_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from metax_audit.stages.introspect import stage

    snapshot = write_tree(tmp_path / "snap", PORT_READ)
    roots = [snapshot]
    worker = introspect(PORT_TARGETS, python=sys.executable, static_roots=roots, never_import=["portpkg"])
    here = stage._read_port_here(PORT_TARGETS, sys.executable, roots)
    assert here is not None and here.facts == worker.facts and here.host == worker.host
    assert {f.status for f in here.facts.values()} >= {"ok", "not-found", "no-signature"}
    assert here.facts["portpkg.merged"].sourcefile == str(snapshot / "portpkg" / "ops.py")  # a re-export followed
    # a re-export into another package is looked for on the interpreter's path too: the worker reads it
    assert stage._read_port_here([*PORT_TARGETS, "portpkg.away.run"], sys.executable, roots) is None
    assert stage._read_port_here(PORT_TARGETS, sys.executable, [Path("snap")]) is None  # the worker's cwd is not ours
    other = tmp_path / "other-python"
    other.write_text("#!/bin/sh\nexec true\n")
    assert stage._read_port_here(PORT_TARGETS, str(other), roots) is None
    # a review (cache=True) reads them here, without a worker
    monkeypatch.setattr(stage, "_run_worker", lambda *a, **k: pytest.fail("a worker was started"))
    cached = introspect(PORT_TARGETS, python=sys.executable, static_roots=roots, never_import=["portpkg"], cache=True)
    assert cached.facts == worker.facts


def test_the_fence_variable_is_one_name_on_both_sides() -> None:
    """The worker's fence is standalone (run by path), so subproc and the introspect stage name its
    variable themselves: the three must be the same name, or a fenced worker would fence nothing."""
    from metax_audit.core import subproc
    from metax_audit.stages.introspect import process
    from metax_audit.stages.introspect_worker import fence

    assert subproc.FENCE_ENV == process.FENCE_ENV == fence.FENCE_ENV
    assert subproc.fenced(["vllm_metax"])[1] == {fence.FENCE_ENV: '["vllm_metax"]'}
