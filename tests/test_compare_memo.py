# Per-member reuse inside a changed file (compare/memo.py): a one-file edit recomputes the functions whose
# text or reads changed, and the comparison always equals one computed without any kept unit.
from __future__ import annotations

import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest

from metax_audit.cache.memo import review_memo
from tests.conftest import write_tree

PORT = "vllm_metax/v1/attention/backends/foo.py"
UP = "vllm/v1/attention/backends/foo.py"

PORT_TEXT = '''\
import torch


def use_fast_path():
    return False


class FooImpl:
    def __init__(self, num_heads, head_size):
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = 1.0

    def forward(self, q, k, v, out):
        out = kernel_call(q, k, v, scale=self.scale)
        if use_fast_path():
            out = fast_kernel(q, k, dtype=torch.float16)
        return out

    def _private_helper(self, x):
        return x.view(-1, self.head_size)

    def plan(self, batch, dtype, extra):
        y = batch.to(dtype)
        return y

    def run_moved(self, x):
        b = x + 2
        a = x * 1
        return a + b


def go(impl):
    return impl.plan(1, 2, 3)
'''

UP_TEXT = '''\
import torch


class FooImpl:
    def __init__(self, num_heads, head_size):
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = head_size ** -0.5

    def forward(self, q, k, v, out):
        out = kernel_call(q, k, v, scale=self.scale, window=(-1, -1))
        if is_device_capability(90):
            out = fast_kernel(q, k, dtype=torch.bfloat16)
        return out

    def _private_helper(self, x):
        return x.reshape(-1, self.head_size)

    def plan(self, batch, dtype):
        y = batch.to(dtype)
        return y

    def run_moved(self, x):
        a = x * 1
        b = x + 2
        return a + b
'''

UNITS = {"FooImpl.__init__", "FooImpl.forward", "FooImpl._private_helper", "FooImpl.plan", "FooImpl.run_moved"}


@pytest.fixture
def trees(tmp_path: Path, audit_cache: Path) -> tuple[Path, Path, Path]:
    port = write_tree(tmp_path / "port", {
        "vllm_metax/__init__.py": "", "vllm_metax/v1/__init__.py": "", "vllm_metax/v1/attention/__init__.py": "",
        "vllm_metax/v1/attention/backends/__init__.py": "", PORT: PORT_TEXT})
    up = write_tree(tmp_path / "up", {"vllm/__init__.py": "", UP: UP_TEXT})
    # the base release: upstream added the window argument since
    base = write_tree(tmp_path / "base", {"vllm/__init__.py": "", UP: UP_TEXT.replace(", window=(-1, -1)", "")})
    return port, up, base


def _compare(port: Path, up: Path, base: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, set[str]]:
    """The cached comparison, the one computed without any kept result, and the functions compared anew."""
    from metax_audit.core.config import load_config
    from metax_audit.stages import discover
    from metax_audit.stages.compare import compare, structure
    from metax_audit.stages.compare.per_file import cached_compare
    from metax_audit.stages.upstream import resolve_upstream

    upstream, release = resolve_upstream(str(up)), resolve_upstream(str(base))
    config = load_config(port)
    found = discover.discover(port, config)
    assert PORT in {f.path for f in found.files}
    computed: set[str] = set()
    original = structure._compare_function

    def counted(ctx: Any, qual: str, ufn: Any, pfn: Any) -> Any:
        if ctx.units is not None:
            computed.add(qual)
        return original(ctx, qual, ufn, pfn)

    monkeypatch.setattr(structure, "_compare_function", counted)
    comparison, findings, _ = cached_compare(found, config, upstream, release, memo=review_memo(True))
    monkeypatch.setattr(structure, "_compare_function", original)
    plain, plain_findings = compare(found, config, upstream, release)

    def shown(c: Any, fs: Any) -> Any:
        return c.files, c.drift, [(f.id, f.content, f.location, f.message, f.evidence, f.severity) for f in fs]

    return shown(comparison, findings), shown(plain, plain_findings), computed


def _edit(root: Path, rel: str, old: str, new: str) -> None:
    path = root / rel
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new), encoding="utf-8")


def _recomputed(port: Path, up: Path, base: Path, monkeypatch: pytest.MonkeyPatch, expected: set[str]) -> Any:
    """Compare again: the kept result equals a fresh comparison, and exactly `expected` were computed."""
    cached, fresh, computed = _compare(port, up, base, monkeypatch)
    assert cached == fresh and computed == expected
    return fresh


def test_an_edit_recomputes_the_functions_it_changes_and_equals_a_fresh_comparison(
        trees: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    port, up, base = trees
    cached, fresh, computed = _compare(port, up, base, monkeypatch)
    assert cached == fresh and computed == UNITS
    lines = {d.symbol: d.line for f in fresh[0] for d in f.differences}

    # an edit inside one function: that function only
    _edit(port, PORT, "x.view(-1, self.head_size)", "x.view(-1, self.head_size, 1)")
    fresh = _recomputed(port, up, base, monkeypatch, {"FooImpl._private_helper"})

    # lines inserted above every function: each is served with its lines moved, but a moved statement's
    # text names its port line, and forward's gate names the line of the constant function it reads
    _edit(port, PORT, "import torch\n", "import torch\n\n# three\n# more\n# lines\n")
    fresh = _recomputed(port, up, base, monkeypatch, {"FooImpl.run_moved", "FooImpl.forward"})
    moved = {d.symbol: d.line for f in fresh[0] for d in f.differences}
    assert moved["FooImpl.forward"] == lines["FooImpl.forward"] + 4 and moved["FooImpl.plan"] == lines["FooImpl.plan"] + 4

    # another port file calls the private helper: whether the port calls it is read again
    write_tree(port, {"vllm_metax/user.py": "def use(impl, x):\n    return impl._private_helper(x)\n"})
    fresh = _recomputed(port, up, base, monkeypatch, {"FooImpl._private_helper"})

    # the port's only call of the changed signature no longer binds: plan's note is read again
    _edit(port, PORT, "impl.plan(1, 2, 3)", "impl.plan(1, 2)")
    fresh = _recomputed(port, up, base, monkeypatch, {"FooImpl.plan"})

    # a constant the vendor platform answers changes: the function whose branch it decides
    _edit(port, PORT, "def use_fast_path():\n    return False", "def use_fast_path():\n    return True")
    fresh = _recomputed(port, up, base, monkeypatch, {"FooImpl.forward"})

    # a vendor comment above a def (outside the function's text) declares its signature change (and moves
    # run_moved, whose moved statement names its line)
    _edit(port, PORT, "    def plan(", "    # Metax: the vendor planner takes an extra argument\n    def plan(")
    fresh = _recomputed(port, up, base, monkeypatch, {"FooImpl.plan", "FooImpl.run_moved"})
    assert any(d.declared for f in fresh[0] for d in f.differences if d.symbol == "FooImpl.plan")


def test_a_changed_upstream_counterpart_is_compared_again(trees: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:
    port, up, base = trees
    cached, fresh, computed = _compare(port, up, base, monkeypatch)
    assert cached == fresh and computed == UNITS
    changed = tmp_path / "up2"
    shutil.copytree(up, changed)
    _edit(changed, UP, "x.reshape(-1, self.head_size)", "x.view(-1, self.head_size)")
    cached, fresh, computed = _compare(port, changed, base, monkeypatch)
    assert cached == fresh and "FooImpl._private_helper" in computed
    assert not any(d.symbol == "FooImpl._private_helper" for f in fresh[0] for d in f.differences)
    # and the port's own edit against it afterwards: that function only
    _edit(port, PORT, "y = batch.to(dtype)", "y = batch.to(dtype=dtype)")
    cached, fresh, computed = _compare(port, changed, base, monkeypatch)
    assert cached == fresh and computed == {"FooImpl.plan"}


def test_a_file_with_line_breaks_ast_does_not_count_is_compared_whole(trees: tuple[Path, Path, Path],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    port, up, base = trees
    _edit(port, PORT, "        return y\n", "        return y  # form\x0cfeed\n")
    for _ in range(2):
        cached, fresh, computed = _compare(port, up, base, monkeypatch)
        assert cached == fresh and computed == set()


def test_fixture_text_is_plain() -> None:
    assert textwrap.dedent(PORT_TEXT) == PORT_TEXT and textwrap.dedent(UP_TEXT) == UP_TEXT


def test_calls_named_finds_what_a_walk_of_the_whole_tree_finds() -> None:
    """_callers_bind's calls of a function: only the nodes whose source spells the name are walked."""
    import ast

    from metax_audit.core.comments import CommentMap
    from metax_audit.stages.compare.side import _callee, _Side
    from metax_audit.stages.compare.structure import _calls_named

    texts = [textwrap.dedent('''\
        # a comment — with ≥ non-ASCII text before the calls
        def name():
            pass

        class K:
            @deco.name(1)
            def f(self):
                (lambda: x.name)()
                s = "éé"; (a if c else b.name)()
                x.y[0].name(1)
                name(2); q = [name(3) for _ in name(4)]
                f"{name(5)} é {name(7)}"
                (x
                 .name)(6)
                other.name_2(8), name_3(9)
        '''), PORT_TEXT, UP_TEXT, "ｎａｍｅ(1)\nname(2)\n"]  # the last spells the name in full-width letters too
    for text in texts:
        tree = ast.parse(text)
        side = _Side("x.py", text, tree, CommentMap({}, (), frozenset()))
        for name in ("name", "plan", "kernel_call", "fast_kernel", "use_fast_path", "missing"):
            walked = [c for c in ast.walk(tree) if isinstance(c, ast.Call) and _callee(c).rsplit(".", 1)[-1] == name]
            assert sorted(map(id, _calls_named(side, name))) == sorted(map(id, walked)), (name, text[:40])
    assert len(_calls_named(_Side("x.py", texts[0], ast.parse(texts[0]), CommentMap({}, (), frozenset())), "name")) == 10
    assert len(_calls_named(_Side("x.py", texts[3], ast.parse(texts[3]), CommentMap({}, (), frozenset())), "name")) == 2
