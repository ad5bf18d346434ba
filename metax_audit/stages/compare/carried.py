# A port-only change the port already had at its previous sync is a vendor feature carried over, not something
# this sync introduced: its hunk is info with "carried since <commit>" as evidence. Pure over the texts it is given.
from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from metax_audit.core.models import Site
from metax_audit.core.pysource import ast_walk, dump, read_source_cached
from metax_audit.stages.compare.predicates import statement_run

_MAX_BYTES = 5_000_000
# Hunks whose port side is code of the port's own (a removed upstream statement has no port text to carry).
_PORT_TEXT_KINDS = frozenset({"changed", "added", "call-changed", "fallback-added", "class-attribute", "argument-commented-out"})


def _dumps(tree: ast.Module | None) -> frozenset[str]:
    """Every statement of a file, bodies emptied, without positions."""
    if tree is None:
        return frozenset()
    out = set()
    for node in ast_walk(tree):
        if isinstance(node, ast.stmt) and not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(_shallow_dump(node))
    return frozenset(out)


def _shallow_dump(node: ast.stmt) -> str:
    import copy

    shallow = copy.copy(node)
    for name in ("body", "orelse", "finalbody", "handlers"):
        if isinstance(getattr(shallow, name, None), list):
            setattr(shallow, name, [])
    return dump(shallow)


@dataclass
class Carried:
    """Which hunks the port carried from its previous sync. `old_text(path)` is a port file as the previous sync
    left it (None: absent); `since` says which commit that is; roots of the port, the target and the base release."""

    port_root: Path
    upstream_root: Path
    base_root: Path
    old_text: Callable[[str], str | None]
    since: Callable[[], str]  # the previous sync's commit, as evidence ("" when the history does not say)
    base: str
    target: str
    _old: dict[str, frozenset[str]] = field(default_factory=dict)
    _releases: dict[str, frozenset[str]] = field(default_factory=dict)  # upstream path -> both releases' statements

    def _tree(self, root: Path, rel: str) -> ast.Module | None:
        return read_source_cached(root, rel, _MAX_BYTES).tree if (root / rel).is_file() else None

    def _old_dumps(self, path: str) -> frozenset[str]:
        if path not in self._old:
            text = self.old_text(path)
            try:
                self._old[path] = _dumps(ast.parse(text)) if text is not None else frozenset()
            except (SyntaxError, ValueError):
                self._old[path] = frozenset()
        return self._old[path]

    def explain(self, site: Site) -> str:
        """Evidence that the hunk's port statements are the port's own (neither release has them) and the port
        already had them at its previous sync; "" otherwise."""
        up_path = site.upstream.rpartition(":")[0]
        if site.kind not in _PORT_TEXT_KINDS or not up_path:
            return ""
        port_tree, up_tree, base_tree = (self._tree(self.port_root, site.path), self._tree(self.upstream_root, up_path),
                                         self._tree(self.base_root, up_path))
        if port_tree is None or up_tree is None or base_tree is None:
            return ""  # the port-only attribution needs both releases
        own_def = _def_at(port_tree, site.line)
        if own_def is not None:  # a whole member the port writes itself (a def where upstream imports the name)
            return self._carried_def(own_def, site.path, _defs(up_tree) | _defs(base_tree))
        if up_path not in self._releases:  # once per file: a file the sync left behind has many hunks
            self._releases[up_path] = _dumps(up_tree) | _dumps(base_tree)
        releases = self._releases[up_path]
        run = statement_run(port_tree, site.line, lambda st: _shallow_dump(st) not in releases)
        if not run:
            return ""
        old = self._old_dumps(site.path)
        if not old:
            return ""  # no previous sync in the history, or the file did not exist then
        inner = [n for st in run for n in ast.walk(st) if isinstance(n, ast.stmt)]
        if not all(_shallow_dump(n) in old for n in inner if _shallow_dump(n) not in releases):
            return ""  # some statement of it (a nested one too) is new since the previous sync
        lines = f"{run[0].lineno}-{run[-1].end_lineno or run[-1].lineno}" if len(run) > 1 or run[0].end_lineno != run[0].lineno else str(run[0].lineno)
        return (f"a vendor change carried since the previous sync: the port had the same code (lines {lines}) at {self.since()}, "
                f"and neither {self.base} nor {self.target} has it")

    def _carried_def(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef, path: str, releases: frozenset[str]) -> str:
        text = self.old_text(path)
        try:
            old = _defs(ast.parse(text)) if text is not None else frozenset()
        except (SyntaxError, ValueError):
            return ""
        if dump(node) in releases or dump(node) not in old:
            return ""
        return (f"a vendor change carried since the previous sync: the port had the same {node.name} "
                f"(lines {node.lineno}-{node.end_lineno}) at {self.since()}, and neither {self.base} nor {self.target} has it")


def _def_at(tree: ast.Module, line: int) -> ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | None:
    """The module-level or class-level function or class whose `def` line (or first decorator) is `line`."""
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if line in {node.lineno, *(d.lineno for d in node.decorator_list)}:
                return node
            if isinstance(node, ast.ClassDef) and node.lineno <= line <= (node.end_lineno or node.lineno):
                todo.extend(node.body)
    return None


def _defs(tree: ast.Module | None) -> frozenset[str]:
    """Every function and class of a file, whole, without positions."""
    return frozenset(dump(n) for n in ast_walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)) \
        if tree is not None else frozenset()
