# Parsed trees of an extracted upstream release kept beside the cache: a later process loads the tree
# instead of parsing, the same tree; a changed, foreign or damaged kept file is never served.
from __future__ import annotations

import ast
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from metax_audit.core import pysource
from metax_audit.stages.upstream import COMPLETE_MARKER, resolve_upstream

SOURCE = "import torch\n\n\ndef f(x, *, scale=1.0):\n    return torch.exp(x) * scale\n\nY = " + "-" * 120 + "1\n"


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    pysource.clear_source_cache()
    pysource.forget_kept_trees()
    yield
    pysource.clear_source_cache()
    pysource.forget_kept_trees()


def _release(tmp_path: Path) -> tuple[Path, Path]:
    root, store = tmp_path / "release", tmp_path / "trees"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text(SOURCE, encoding="utf-8")
    return root, store


def _no_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(text: str, filename: str = "<unknown>") -> ast.Module:
        raise AssertionError(f"parsed {filename} although its tree was kept")

    monkeypatch.setattr(pysource, "parse", refuse)


def test_a_kept_tree_is_loaded_instead_of_parsed_and_is_the_same_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, store = _release(tmp_path)
    pysource.keep_trees_under(root, store)
    _, first = pysource.cached_parse(root / "pkg" / "mod.py")
    kept = list(store.rglob("*.pickle"))
    assert [p.name for p in kept] == ["mod.py.pickle"] and "pkg" in kept[0].parts
    pysource.clear_source_cache()  # as a later process: nothing in memory
    _no_parse(monkeypatch)
    _, again = pysource.cached_parse(root / "pkg" / "mod.py")
    assert again is not first and ast.dump(again, include_attributes=True) == ast.dump(first, include_attributes=True)
    assert pysource.too_deep_lines(again) == pysource.too_deep_lines(first) == (7,)  # the cut is kept with it


def test_an_edited_file_is_parsed_again_not_served_its_old_tree(tmp_path: Path) -> None:
    root, store = _release(tmp_path)
    pysource.keep_trees_under(root, store)
    path = root / "pkg" / "mod.py"
    pysource.cached_parse(path)
    pysource.clear_source_cache()
    st = path.stat()
    path.write_text("def g():\n    pass\n", encoding="utf-8")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    _, tree = pysource.cached_parse(path)
    assert [n.name for n in tree.body if isinstance(n, ast.FunctionDef)] == ["g"]
    pysource.clear_source_cache()
    _, kept = pysource.cached_parse(path)  # the new tree replaced the old one in the store
    assert [n.name for n in kept.body if isinstance(n, ast.FunctionDef)] == ["g"]


@pytest.mark.parametrize("damage", [b"", b"not a pickle", b"\x80\x05K\x01."])
def test_a_damaged_or_foreign_kept_file_is_a_parse_and_is_written_anew(tmp_path: Path, damage: bytes) -> None:
    root, store = _release(tmp_path)
    pysource.keep_trees_under(root, store)
    pysource.cached_parse(root / "pkg" / "mod.py")
    (kept,) = store.rglob("*.pickle")
    kept.write_bytes(damage)
    pysource.clear_source_cache()
    _, tree = pysource.cached_parse(root / "pkg" / "mod.py")
    assert [n.name for n in tree.body if isinstance(n, ast.FunctionDef)] == ["f"]
    assert kept.read_bytes() != damage


def test_files_outside_a_kept_root_are_never_stored(tmp_path: Path) -> None:
    root, store = _release(tmp_path)
    pysource.keep_trees_under(root, store)
    other = tmp_path / "port" / "mod.py"
    other.parent.mkdir()
    other.write_text(SOURCE, encoding="utf-8")
    (tmp_path / "release-2").mkdir()  # a sibling whose name starts like the root's
    (tmp_path / "release-2" / "m.py").write_text("x = 1\n", encoding="utf-8")
    pysource.cached_parse(other)
    pysource.cached_parse(tmp_path / "release-2" / "m.py")
    assert not store.exists()


def test_a_pip_cache_entry_keeps_its_trees_in_the_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    entry = cache / "upstream" / "vllm-9.9.9"
    (entry / "vllm").mkdir(parents=True)
    (entry / "vllm" / "__init__.py").write_text('__version__ = "9.9.9"\n', encoding="utf-8")
    (entry / "vllm" / "layer.py").write_text(SOURCE, encoding="utf-8")
    (entry / COMPLETE_MARKER).write_text("vllm==9.9.9\n", encoding="utf-8")
    info = resolve_upstream("vllm==9.9.9", cache_dir=cache)
    assert info.root == entry
    pysource.cached_parse(entry / "vllm" / "layer.py")
    kept = sorted(p.relative_to(cache).as_posix() for p in cache.rglob("*.pickle"))
    assert len(kept) == 1 and kept[0].startswith("upstream-trees/vllm-9.9.9/") and kept[0].endswith("vllm/layer.py.pickle")
    assert not list(entry.rglob("*.pickle"))  # the entry itself holds only the release's files


def test_a_directory_upstream_keeps_nothing(tmp_path: Path) -> None:
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "vllm" / "layer.py").write_text(SOURCE, encoding="utf-8")
    resolve_upstream(str(tmp_path), cache_dir=tmp_path / "cache")  # a working directory may change at any time
    pysource.cached_parse(tmp_path / "vllm" / "layer.py")
    assert not list(tmp_path.rglob("*.pickle"))


def test_a_cache_entry_named_by_its_path_keeps_its_trees_too(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    entry = cache / "upstream" / "vllm-9.9.9"
    (entry / "vllm").mkdir(parents=True)
    (entry / "vllm" / "layer.py").write_text(SOURCE, encoding="utf-8")
    (entry / COMPLETE_MARKER).write_text("vllm==9.9.9\n", encoding="utf-8")
    resolve_upstream(str(entry), cache_dir=cache)
    pysource.cached_parse(entry / "vllm" / "layer.py")
    assert [p.name for p in (cache / "upstream-trees" / "vllm-9.9.9").rglob("*.pickle")] == ["layer.py.pickle"]
    (entry / COMPLETE_MARKER).unlink()  # an extraction under way is not kept
    pysource.forget_kept_trees()
    pysource.clear_source_cache()
    resolve_upstream(str(entry), cache_dir=cache)
    (entry / "vllm" / "other.py").write_text(SOURCE, encoding="utf-8")
    pysource.cached_parse(entry / "vllm" / "other.py")
    assert not list(cache.rglob("other.py.pickle"))


def test_the_class_level_list_declarations_are_the_first_of_the_paths(tmp_path: Path) -> None:
    from metax_audit.stages.checks import capabilities

    root = tmp_path / "release"
    (root / "vllm" / "b").mkdir(parents=True)
    (root / "vllm" / "a.py").write_text("class A:\n    modes: ClassVar[list[str]] = []\n", encoding="utf-8")
    (root / "vllm" / "b" / "c.py").write_text(
        "import typing\nclass C:\n    modes: typing.ClassVar[list[int]] = []\n    kinds: ClassVar[ list ] = []\n", encoding="utf-8")
    (root / "vllm" / "d.py").write_text("x: ClassVar[dict] = {}\n", encoding="utf-8")
    (root / "vllm" / "e.py").write_bytes(b"class E:\n    kinds: ClassVar[list] = []  # \xff not utf-8\n")
    want = {"modes": ("vllm/a.py", 2, "modes: ClassVar[list[str]] = []"), "kinds": ("vllm/b/c.py", 4, "kinds: ClassVar[ list ] = []")}
    assert capabilities._class_level_lists(root, {"modes", "kinds", "x"}) == want


def test_trees_kept_by_another_build_of_the_parser_are_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, store = _release(tmp_path)
    pysource.keep_trees_under(root, store)
    pysource.cached_parse(root / "pkg" / "mod.py")
    (mine,) = [p.relative_to(store).parts[0] for p in store.rglob("*.pickle")]
    assert mine.startswith(f"py{sys.version_info[0]}{sys.version_info[1]}-")
    monkeypatch.setattr(pysource, "_tree_format", lambda: "py311-an-edited-pysource")
    pysource.forget_kept_trees()
    pysource.clear_source_cache()
    pysource.keep_trees_under(root, store)
    parsed: list[str] = []
    real = pysource.parse
    monkeypatch.setattr(pysource, "parse", lambda text, filename="<unknown>": parsed.append(filename) or real(text, filename))
    pysource.cached_parse(root / "pkg" / "mod.py")
    # the other build's trees were removed when this one first kept its own
    assert parsed and [q.relative_to(store).parts[0] for q in store.rglob("*.pickle")] == ["py311-an-edited-pysource"]
