# The calls of an upstream release by the name they call: `x.name(...)` and `name(...)`, each with the
# function it sits in. Compare by role asks which upstream calls pass what an override refuses; caller
# liveness asks who calls the function such a call sits in. Read statically, never imported.
from __future__ import annotations

import ast
import re
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from metax_audit.core import fstree
from metax_audit.core.pysource import parse
from metax_audit.stages.compare.roles import UpstreamClasses


@dataclass(frozen=True)
class CallSite:
    """One call in an upstream file."""

    line: int
    keywords: tuple[str | None, ...]
    positional: int
    starred: bool
    # The class and function it sits in, outermost first: ("KVBlockZeroer", "__init__") for a method,
    # ("_reshape_kv_cache",) for a module function (a nested function counts as the one it is in), ().
    scope: tuple[str, ...]
    in_class: bool  # scope[0] is a class
    bare: bool  # `name(...)`, not `x.name(...)`

    @property
    def function(self) -> str:
        return ".".join(self.scope)


# `.name(` as the text spells it: the files worth parsing for a method. A bare `name(` is searched for by name
# when asked (a handful of names per review): collecting every bare call of every file took 2 s of a 2,400-file
# release, 25x the attribute spellings.
_SPELLED_CALL = re.compile(r"\.(\w+)\(")


def _index(tree: ast.Module) -> dict[str, list[CallSite]]:
    """The file's calls by called name, in line order."""
    out: dict[str, list[CallSite]] = {}
    # (node, scope, in_class, in_function): a stack, not recursion (deep expressions in generated files)
    todo: list[tuple[ast.AST, tuple[str, ...], bool, bool]] = [(tree, (), False, False)]
    while todo:
        node, scope, in_class, in_function = todo.pop()
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            if name is not None:
                out.setdefault(name, []).append(CallSite(
                    node.lineno, tuple(k.arg for k in node.keywords), len(node.args),
                    any(isinstance(a, ast.Starred) for a in node.args), scope, in_class, isinstance(func, ast.Name)))
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef) and not scope:
                todo.append((child, (child.name,), True, False))
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) and not in_function:
                todo.append((child, (*scope, child.name), in_class, True))
            else:
                todo.append((child, scope, in_class, in_function))
    for sites in out.values():
        sites.sort(key=lambda s: s.line)
    return out


class UpstreamCalls:
    """The calls of an upstream package, read once per process: each file is read once for the names it
    spells as `name(`, and parsed and indexed once, the first time one of those is asked for (a port with
    many role pairs had the same files parsed and walked again for every method: 20 s on a 2,000-file
    release). Only the name sets stay in memory besides the indexes of the files asked for."""

    def __init__(self, upstream: UpstreamClasses) -> None:
        self._upstream = upstream
        self._files: list[tuple[str, Path, frozenset[str]]] | None = None
        self._calls: dict[str, dict[str, list[CallSite]] | None] = {}
        self._bare_files: dict[str, frozenset[str]] = {}

    def files(self) -> list[tuple[str, Path, frozenset[str]]]:
        """(path in the release, file, the names it spells `.name(`), in the release's file order."""
        if self._files is None:
            files: list[tuple[str, Path, frozenset[str]]] = []
            pkg = self._upstream.root / self._upstream.package.replace(".", "/")
            for path in fstree.files(pkg, ".py"):
                try:
                    text = path.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError):
                    continue
                files.append((path.relative_to(self._upstream.root).as_posix(), path,
                              frozenset(_SPELLED_CALL.findall(text))))
            self._files = files
        return self._files

    def calls(self, rel: str, path: Path) -> dict[str, list[CallSite]] | None:
        """The file's calls by called name; None when it does not parse."""
        if rel not in self._calls:
            try:
                tree = parse(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, SyntaxError, ValueError, RecursionError):
                self._calls[rel] = None
                return None
            self._calls[rel] = _index(tree)
        return self._calls[rel]

    def sites(self, name: str, bare: bool = False) -> Iterator[tuple[str, CallSite]]:
        """Every call `x.name(...)` in the release, with `bare` also `name(...)`, (path, site), in file order then
        line order."""
        bare_files = self._bare(name) if bare else frozenset()
        for rel, path, spelled in self.files():
            if name in spelled or rel in bare_files:
                yield from ((rel, site) for site in (self.calls(rel, path) or {}).get(name, ()) if bare or not site.bare)

    def _bare(self, name: str) -> frozenset[str]:
        """The files whose text holds `name(` (a substring test of each file, read again: names are few)."""
        if name not in self._bare_files:
            needle = f"{name}("
            found = set()
            for rel, path, _ in self.files():
                try:
                    if needle in path.read_text(encoding="utf-8"):
                        found.add(rel)
                except (OSError, UnicodeDecodeError):
                    continue
            self._bare_files[name] = frozenset(found)
        return self._bare_files[name]


# One index per compare run's upstream (its UpstreamClasses), as that object caches the release's parsed files.
_INDEXES: weakref.WeakKeyDictionary[UpstreamClasses, UpstreamCalls] = weakref.WeakKeyDictionary()


def calls_of(upstream: UpstreamClasses) -> UpstreamCalls:
    index = _INDEXES.get(upstream)
    if index is None:
        index = _INDEXES[upstream] = UpstreamCalls(upstream)
    return index
