# The process-wide source cache (one read, parse and tokenize per file) and the on-disk cache of
# stack facts: hits return the same thing, a changed file or distribution is never served stale.
from __future__ import annotations

import ast
import io
import json
import os
import sys
import tokenize
from pathlib import Path

import pytest

from metax_audit.core import pysource
from metax_audit.core.models import StackFacts
from metax_audit.stages import introspect as introspect_mod
from metax_audit.stages.introspect import cache as introspect_cache


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    pysource.clear_source_cache()


def _bump(path: Path, text: str) -> None:
    """Rewrite `path` and move its mtime forward, so a same-size edit within one clock tick counts."""
    st = path.stat()
    path.write_text(text, encoding="utf-8")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_parse_is_shared_until_the_file_changes(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("def f(a):\n    return a\n", encoding="utf-8")
    text, tree = pysource.cached_parse(f)
    again_text, again_tree = pysource.cached_parse(str(f))
    assert again_tree is tree and again_text is text
    assert pysource.cached_text(f) is text
    _bump(f, "def g(b):\n    return b\n")  # same size, new content
    _, fresh = pysource.cached_parse(f)
    assert fresh is not tree
    assert isinstance(fresh.body[0], ast.FunctionDef) and fresh.body[0].name == "g"


def test_many_small_files_are_parsed_once_each(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache is bounded by the bytes it holds: 5,000 small files (over the 4,096-file count the
    cache had) read in two passes, as the stages do, are parsed once each; a file read again is the
    most recent and outlives one read once before it."""
    files = []
    for i in range(5000):
        files.append(tmp_path / f"m{i}.py")
        files[-1].write_text(f"x = {i}\n", encoding="utf-8")
    parses = []
    real_parse = ast.parse
    monkeypatch.setattr(pysource.ast, "parse", lambda *a, **k: parses.append(1) or real_parse(*a, **k))
    for _ in range(2):
        for f in files:
            pysource.cached_parse(f)
    assert len(parses) == 5000
    pysource.clear_source_cache()
    monkeypatch.setattr(pysource, "_SOURCE_CACHE_BYTES", 3 * len("x = 0\n"))
    _, first = pysource.cached_parse(files[0])
    pysource.cached_parse(files[1])
    pysource.cached_parse(files[2])
    assert pysource.cached_parse(files[0])[1] is first  # read again: now the most recent
    pysource.cached_parse(files[3])  # evicts files[1], the least recently read
    assert pysource.cached_parse(files[0])[1] is first
    assert len(parses) == 5000 + 4


def test_parse_failures_are_remembered_and_raised_like_ast(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f(:\n", encoding="utf-8")
    for _ in range(2):
        with pytest.raises(SyntaxError) as info:
            pysource.cached_parse(bad)
        assert info.value.lineno == 1
    undecodable = tmp_path / "latin.py"
    undecodable.write_bytes(b"x = '\xff'\n")
    with pytest.raises(UnicodeDecodeError):
        pysource.cached_parse(undecodable)
    with pytest.raises(OSError):
        pysource.cached_parse(tmp_path / "missing.py")
    _bump(bad, "def f(a):\n    pass\n")
    assert pysource.cached_parse(bad)[1].body


@pytest.mark.parametrize(
    ("content", "max_bytes"),
    [
        ("import os\n# note\nx = 1\n", 10_000),
        ("def f(:\n", 10_000),
        ("x = 1\n" * 50, 20),
        ("# -*- coding: latin-1 -*-\ns = 'caf\xe9'\n", 10_000),
    ],
)
def test_read_source_cached_matches_read_source(tmp_path: Path, content: str, max_bytes: int) -> None:
    encoding = "latin-1" if "latin-1" in content else "utf-8"
    (tmp_path / "m.py").write_bytes(content.encode(encoding))
    plain = pysource.read_source(tmp_path, "m.py", max_bytes)
    cached = pysource.read_source_cached(tmp_path, "m.py", max_bytes)
    assert (cached.path, cached.text, cached.problem, cached.lines) == (plain.path, plain.text, plain.problem, plain.lines)
    assert (cached.tree is None) == (plain.tree is None)
    if plain.tree is not None:
        assert ast.dump(cached.tree) == ast.dump(plain.tree)  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["x = 1  # trailing\n# alone\ny = (2,\n", "def f():\n    pass\n  bad\n", "s = '''\n"])
def test_iter_tokens_replays_tokenize_including_its_error(text: str) -> None:
    def collect(tokens: object) -> tuple[list[tuple[int, str]], str | None]:
        out: list[tuple[int, str]] = []
        try:
            for tok in tokens:  # type: ignore[attr-defined]
                out.append((tok.type, tok.string))
        except (tokenize.TokenError, SyntaxError) as exc:
            return out, type(exc).__name__
        return out, None

    expected = collect(tokenize.generate_tokens(io.StringIO(text).readline))
    assert collect(pysource.iter_tokens(text)) == expected
    assert collect(pysource.iter_tokens(text)) == expected  # the cached replay too


# ---------------------------------------------------------------- stack facts on disk


def _kernel(site: Path, params: str) -> Path:
    pkg = site / "mxa_fake_kernel"
    pkg.mkdir(parents=True, exist_ok=True)
    init = pkg / "__init__.py"
    if init.exists():
        _bump(init, f"def run({params}):\n    return q\n")
    else:
        init.write_text(f"def run({params}):\n    return q\n", encoding="utf-8")
    return init


def _facts(site: Path, port_root: Path) -> StackFacts:
    return introspect_mod.introspect(
        ["mxa_fake_kernel.run", "mxa_fake_port.ops.call"], python=sys.executable, extra_path=(site,),
        static_roots=(port_root,), never_import=("mxa_fake_port",), cache=True, timeout=60)


def test_stack_facts_are_cached_and_invalidated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("METAX_AUDIT_CACHE", str(tmp_path / "cache"))
    site = tmp_path / "site"
    _kernel(site, "q, k, *, scale=1.0")
    port = tmp_path / "snap" / "mxa_fake_port"
    port.mkdir(parents=True)
    (port / "__init__.py").write_text("", encoding="utf-8")
    ops = port / "ops.py"
    ops.write_text("def call(x):\n    return x\n", encoding="utf-8")

    cold = _facts(site, tmp_path / "snap")
    assert cold.source == "import" and cold.cache_entry is None
    assert cold.facts["mxa_fake_kernel.run"].status == "ok"
    assert [p.name for p in cold.facts["mxa_fake_kernel.run"].params or ()] == ["q", "k", "scale"]
    assert len(list((tmp_path / "cache" / "stack").glob("*.json"))) == 1

    warm = _facts(site, tmp_path / "snap")
    assert warm.source == "import" and warm.cache_entry is not None
    assert warm.facts == cold.facts
    assert list(warm.facts) == list(cold.facts)

    # the port under review is never served from the cache
    _bump(ops, "def call(x, y):\n    return x\n")
    warm2 = _facts(site, tmp_path / "snap")
    assert warm2.cache_entry is not None
    assert [p.name for p in warm2.facts["mxa_fake_port.ops.call"].params or ()] == ["x", "y"]

    # an edited kernel package (no installed metadata beside it) is read again
    _kernel(site, "q, k, v, *, scale=1.0")
    edited = _facts(site, tmp_path / "snap")
    assert edited.cache_entry is None
    assert [p.name for p in edited.facts["mxa_fake_kernel.run"].params or ()] == ["q", "k", "v", "scale"]


def test_a_changed_distribution_invalidates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("METAX_AUDIT_CACHE", str(tmp_path / "cache"))
    site = tmp_path / "site"
    _kernel(site, "q")
    record = site / "mxa_fake_kernel-1.0.dist-info" / "RECORD"
    record.parent.mkdir()
    record.write_text("mxa_fake_kernel/__init__.py,,\n", encoding="utf-8")
    (tmp_path / "snap").mkdir()
    assert _facts(site, tmp_path / "snap").cache_entry is None
    assert _facts(site, tmp_path / "snap").cache_entry is not None
    _bump(record, "mxa_fake_kernel/__init__.py,sha256=x,1\n")  # what pip does on a reinstall
    assert _facts(site, tmp_path / "snap").cache_entry is None
    (record.parent).rename(site / "mxa_fake_kernel-2.0.dist-info")  # an upgrade
    assert _facts(site, tmp_path / "snap").cache_entry is None
    assert _facts(site, tmp_path / "snap").cache_entry is not None


def test_timeouts_are_not_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("METAX_AUDIT_CACHE", str(tmp_path / "cache"))
    site = tmp_path / "site"
    (site / "mxa_slow_kernel").mkdir(parents=True)
    (site / "mxa_slow_kernel" / "__init__.py").write_text("import time\ntime.sleep(30)\n", encoding="utf-8")
    facts = introspect_mod.introspect(["mxa_slow_kernel.run"], python=sys.executable, extra_path=(site,),
                                      cache=True, timeout=1.5)
    assert facts.facts["mxa_slow_kernel.run"].status == "timeout"
    assert not list((tmp_path / "cache" / "stack").glob("*.json"))


def test_walk_nodes_lists_ast_walk_once_per_tree(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("class A:\n    def f(self, x):\n        return [y for y in x]\n", encoding="utf-8")
    _, tree = pysource.cached_parse(f)
    nodes = pysource.walk_nodes(tree)
    assert list(nodes) == list(ast.walk(tree))
    assert pysource.walk_nodes(tree) is nodes
    other = ast.parse(f.read_text(encoding="utf-8"))
    assert pysource.walk_nodes(other) is not nodes  # a different tree, even with the same text


@pytest.mark.parametrize(
    "text",
    [
        "",
        "x = 1\n",
        "class A(B, metaclass=M):\n    @d(1)\n    def f(self, x: int = 2, *a, k=3, **kw) -> None:\n"
        "        return [y async for y in x if y] or {k: v for k, v in kw.items()}\n",
        "try:\n    import a\nexcept (ImportError, OSError) as e:\n    a = None\nelse:\n    pass\nfinally:\n    del a\n",
        "match p:\n    case [1, *rest] | {'k': _} if rest:\n        f'{p!r:>{w}}'\n    case _:\n        lambda q, /, r: q[r:2, ...]\n",
        "with a as (b, c), d:\n    global g\n    x: list[int]\n    y = yield from z\n",
    ],
)
def test_ast_walk_and_dump_are_ast_walk_and_dump(text: str) -> None:
    tree = ast.parse(text)
    assert [id(n) for n in pysource.ast_walk(tree)] == [id(n) for n in ast.walk(tree)]
    expr = tree.body[0] if tree.body else tree
    assert [id(n) for n in pysource.ast_walk(expr)] == [id(n) for n in ast.walk(expr)]
    made = ast.BinOp(left=ast.Name(id="a"), op=ast.Add())  # a node built by hand, `right` left unset
    assert [id(n) for n in pysource.ast_walk(made)] == [id(n) for n in ast.walk(made)]
    assert list(pysource.walk_nodes(tree)) == list(ast.walk(tree))
    for node in [*ast.walk(tree), made, ast.arg(arg="x", annotation=None), ast.Constant(value=b"\x00", kind=None)]:
        assert pysource.dump(node) == ast.dump(node)
        assert pysource.ast_children(node) == list(ast.iter_child_nodes(node))


def _tokenized_comments(text: str) -> dict[int, str]:
    lines = text.splitlines()
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT and lines[tok.start[0] - 1].lstrip().startswith("#"):
            out[tok.start[0]] = tok.string
    return out


@pytest.mark.parametrize(
    "text",
    [
        "x = 1\n# alone\ny = 2  # trailing\n",
        'def f():\n    """Doc.\n\n    # not a comment\n    """\n    # a comment\n    return 1\n',
        'x = ("abc"\n     # between implicitly joined pieces\n     "def")\n',
        "s = f'''\n# inside an f-string\n{1}'''\n",
        'call(a, """\n# in a literal opened inside a call\n""")\n',
        "x = 1\n",
    ],
)
def test_standalone_comments_agree_with_tokenize(text: str) -> None:
    assert pysource.standalone_comments(text, ast.parse(text)) == _tokenized_comments(text)


def test_standalone_comments_defer_on_odd_line_breaks() -> None:
    text = "x = 1\x0c\n# c\n"
    assert pysource.standalone_comments(text, ast.parse(text)) is None


def test_an_edited_editable_checkout_changes_the_fingerprint(tmp_path: Path) -> None:
    site, project = tmp_path / "site", tmp_path / "checkout"
    init = project / "src" / "mxa_fake_kernel" / "__init__.py"
    init.parent.mkdir(parents=True)
    init.write_text("def run(q):\n    return q\n", encoding="utf-8")
    meta = site / "mxa_fake_kernel-1.0.dist-info"
    meta.mkdir(parents=True)
    (meta / "RECORD").write_text("__editable___mxa_fake_kernel_finder.py,,\n", encoding="utf-8")
    (meta / "top_level.txt").write_text("mxa_fake_kernel\n", encoding="utf-8")
    (meta / "direct_url.json").write_text(
        json.dumps({"url": project.as_uri(), "dir_info": {"editable": True}}), encoding="utf-8")
    before = introspect_cache._path_entry_fingerprint(site, ["mxa_fake_kernel"])
    assert introspect_cache._path_entry_fingerprint(site, ["mxa_fake_kernel"]) == before
    _bump(init, "def run(q, k):\n    return q\n")
    assert introspect_cache._path_entry_fingerprint(site, ["mxa_fake_kernel"]) != before
    # a distribution that provides none of the targets is not walked
    assert [d[1] for d in introspect_cache._path_entry_fingerprint(site, ["other"])[1]] == ["RECORD"]
    assert [d[1] for d in before[1]] == ["RECORD", "editable"]


def test_a_complete_release_in_the_cache_is_fingerprinted_by_its_marker(audit_cache: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from metax_audit.stages.upstream import COMPLETE_MARKER

    release = audit_cache / "upstream" / "fakevllm-1.0"
    module = release / "fakevllm" / "ops.py"
    module.parent.mkdir(parents=True)
    module.write_text("def op(x):\n    return x\n", encoding="utf-8")
    (release / COMPLETE_MARKER).write_text("fakevllm==1.0\n", encoding="utf-8")
    walked: list[Path] = []
    real_walk = introspect_cache._tree_fingerprint
    monkeypatch.setattr(introspect_cache, "_tree_fingerprint", lambda root, *a: walked.append(root) or real_walk(root, *a))
    before = introspect_cache._root_fingerprint(release)
    assert walked == [] and before[1] == "complete"  # its files are not stat-ed
    (release / COMPLETE_MARKER).write_text("fakevllm==1.0 (extracted again)\n", encoding="utf-8")
    assert introspect_cache._root_fingerprint(release) != before  # a new extraction is a new key
    # an interrupted extraction (no marker), or a directory outside the cache: every file's stat
    (release / COMPLETE_MARKER).unlink()
    assert introspect_cache._root_fingerprint(release) == real_walk(release) and walked == [release]
    checkout = tmp_path / "checkout"
    (checkout / "fakevllm").mkdir(parents=True)
    (checkout / COMPLETE_MARKER).write_text("fakevllm==1.0\n", encoding="utf-8")
    first = introspect_cache._root_fingerprint(checkout)
    _bump(checkout / COMPLETE_MARKER, "fakevllm==1.0\n")
    (checkout / "fakevllm" / "new.py").write_text("x = 1\n", encoding="utf-8")
    assert introspect_cache._root_fingerprint(checkout) != first and walked[-1] == checkout


def test_a_module_is_walked_from_its_node_list(monkeypatch: pytest.MonkeyPatch) -> None:
    tree = ast.parse("y = g(a) + h(a)\n")
    listed: list[ast.AST] = []
    real = pysource._walk_all
    monkeypatch.setattr(pysource, "_walk_all", lambda t: listed.append(t) or real(t))
    first = [id(n) for n in pysource.ast_walk(tree)]
    for node in pysource.ast_walk(tree):  # a rename in place (the compare's) changes no node of the list
        if isinstance(node, ast.Name) and node.id == "g":
            node.id = "renamed"
    assert [id(n) for n in pysource.ast_walk(tree)] == first == [id(n) for n in ast.walk(tree)]
    assert len(listed) == 1 and listed[0] is tree  # listed once for the three walks
    body = tree.body[0]
    assert [id(n) for n in pysource.ast_walk(body)] == [id(n) for n in ast.walk(body)]  # a statement: walked afresh
    assert len(listed) == 1


def test_a_definition_is_walked_from_its_node_list_and_a_copy_afresh() -> None:
    import copy

    tree = ast.parse("class A:\n    def f(self):\n        return f'{self.x}'\n")
    cls = tree.body[0]
    assert [id(n) for n in pysource.ast_walk(cls)] == [id(n) for n in ast.walk(cls)]
    assert pysource._def_nodes(cls) is pysource._def_nodes(cls)
    shallow = copy.copy(cls)
    shallow.body = []  # the compare's shallow statement: its own walk, not the original's
    assert [id(n) for n in pysource.ast_walk(shallow)] == [id(n) for n in ast.walk(shallow)]
    deep = copy.deepcopy(cls)
    assert [type(n) for n in pysource.ast_walk(deep)] == [type(n) for n in ast.walk(cls)]
    assert not {id(n) for n in pysource.ast_walk(deep)} & {id(n) for n in ast.walk(cls)}


@pytest.mark.parametrize("text", ["q", "self.scale", "attn_metadata.prefill.seq_lens", "f(x).y", "(a + b).c", "x[0].y",
                                  "'s'.join", "(1).real", "a.b(c).d", "lambda: 0", "*args"[1:], "None", "x if y else z"])
def test_unparse_name_is_ast_unparse(text: str) -> None:
    node = ast.parse(text, mode="eval").body
    assert pysource.unparse_name(node) == ast.unparse(node)
    assert pysource.unparse(node) == ast.unparse(node)
