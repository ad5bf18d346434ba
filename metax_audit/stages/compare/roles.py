# Counterparts by role: a port class that subclasses an upstream class (or that config maps to one)
# follows that class's contract, not a copied file. Read statically from both trees; never imported.
from __future__ import annotations

import ast
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from metax_audit.core.pysource import ast_walk, parse, resolve_relative

_MAX_HOPS = 6  # re-exports and base classes followed in upstream


@dataclass(frozen=True)
class RolePair:
    """A port class and the upstream class whose role it takes."""

    port_class: str
    upstream_path: str  # relative to the upstream root
    upstream_class: str
    relation: str  # "base" (subclasses it) | "base, through port class X" | "class-map" (config)
    # Methods the port's own intermediate classes define: their contract, not upstream's, binds these.
    via_methods: frozenset[str] = frozenset()


@dataclass(frozen=True)
class UpClass:
    node: ast.ClassDef
    path: str
    module: str
    tree: ast.Module


class UpstreamClasses:
    """Finds upstream classes by dotted module + name, following re-exports; caches parsed files."""

    def __init__(self, root: Path, package: str) -> None:
        self.root, self.package = root, package
        self._trees: dict[str, ast.Module | None] = {}

    def _file(self, module: str) -> str | None:
        base = module.replace(".", "/")
        for rel in (f"{base}.py", f"{base}/__init__.py"):
            if (self.root / rel).is_file():
                return rel
        return None

    def _tree(self, rel: str) -> ast.Module | None:
        if rel not in self._trees:
            try:
                self._trees[rel] = parse((self.root / rel).read_text(encoding="utf-8"))
            except (OSError, SyntaxError, UnicodeDecodeError, ValueError, RecursionError, MemoryError):
                self._trees[rel] = None
        return self._trees[rel]

    def find(self, module: str, name: str, hops: int = 0) -> UpClass | None:
        if hops > _MAX_HOPS or not (module == self.package or module.startswith(self.package + ".")):
            return None
        rel = self._file(module)
        tree = self._tree(rel) if rel else None
        if tree is None or rel is None:
            return None
        for stmt in tree.body:
            if isinstance(stmt, ast.ClassDef) and stmt.name == name:
                return UpClass(stmt, rel, module, tree)
        for stmt in tree.body:
            if isinstance(stmt, ast.ImportFrom):
                for alias in stmt.names:
                    if (alias.asname or alias.name) == name:
                        src = resolve_relative(module, rel.endswith("__init__.py"), stmt.level, stmt.module)
                        return self.find(src, alias.name, hops + 1) if src else None
        return None

    def bases(self, cls: UpClass) -> Iterator[UpClass]:
        for base in cls.node.bases:
            target = imported_class(cls.tree, cls.module, cls.path.endswith("__init__.py"), base)
            if target is None:
                name = _base_name(base)
                if name and any(isinstance(s, ast.ClassDef) and s.name == name for s in cls.tree.body):
                    target = (cls.module, name)
            if target is not None and (found := self.find(*target)) is not None:
                yield found

    def mro(self, cls: UpClass) -> list[UpClass]:
        out: list[UpClass] = []
        todo = [cls]
        while todo and len(out) < 32:
            c = todo.pop(0)
            if any(o.node is c.node for o in out):
                continue
            out.append(c)
            todo.extend(self.bases(c))
        return out


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Subscript):  # Generic[T] / Builder[Meta]
        node = node.value
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return ast.unparse(node)
    return ""


def imported_class(tree: ast.Module, module: str, is_package: bool, base: ast.expr) -> tuple[str, str] | None:
    """(module, class) an upstream/port base expression names through the file's imports."""
    text = _base_name(base)
    if not text:
        return None
    head, _, rest = text.partition(".")
    for stmt in ast_walk(tree):
        if isinstance(stmt, ast.ImportFrom):
            for alias in stmt.names:
                if (alias.asname or alias.name) != head:
                    continue
                src = resolve_relative(module, is_package, stmt.level, stmt.module)
                if not rest:
                    return src, alias.name
                return f"{src}.{alias.name}.{rest.rsplit('.', 1)[0]}".rstrip("."), rest.rsplit(".", 1)[-1]
        elif isinstance(stmt, ast.Import) and rest:
            for alias in stmt.names:
                if alias.asname == head:
                    mod = alias.name + ("." + rest.rsplit(".", 1)[0] if "." in rest else "")
                    return mod, rest.rsplit(".", 1)[-1]
                if alias.asname is None and text.startswith(alias.name + "."):
                    return text.rsplit(".", 1)[0], text.rsplit(".", 1)[1]
    return None


PortLoader = Callable[[str], "tuple[ast.Module, str] | None"]  # port module -> (tree, repo-relative path)


def role_pairs(
    tree: ast.Module,
    module: str,
    is_package: bool,
    upstream: UpstreamClasses,
    class_map: Mapping[str, str] = {},  # read only: port class -> "upstream.module.Class"
    port: PortLoader | None = None,
) -> list[RolePair]:
    """Module-level port classes whose bases (or config class-map entries) are upstream classes; with
    `port`, also through the port's own intermediate classes (Backend310(AscendBackend(AttentionBackend)))."""
    pairs: list[RolePair] = []
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        mapped = class_map.get(node.name)
        if mapped and "." in mapped:
            mapped_module, mapped_name = mapped.rsplit(".", 1)
            found = upstream.find(mapped_module, mapped_name)
            if found is not None:
                pairs.append(RolePair(node.name, found.path, found.node.name, "class-map"))
                continue
        for up, via, methods in _upstream_bases(tree, module, is_package, node, upstream, port, 0):
            relation = f"base, through port class {via}" if via else "base"
            pairs.append(RolePair(node.name, up.path, up.node.name, relation, methods))
    return pairs


def _upstream_bases(tree: ast.Module, module: str, is_package: bool, node: ast.ClassDef, upstream: UpstreamClasses,
                    port: PortLoader | None, depth: int, via: str = "",
                    methods: frozenset[str] = frozenset()) -> Iterator[tuple[UpClass, str, frozenset[str]]]:
    if depth > 4:
        return
    local = {s.name: s for s in tree.body if isinstance(s, ast.ClassDef)}
    for base in node.bases:
        name = _base_name(base)
        target = imported_class(tree, module, is_package, base)
        found = upstream.find(*target) if target else None
        if found is not None:
            yield found, via, methods
            continue
        if port is None:
            continue
        cls: ast.ClassDef | None
        if target is None and name in local and local[name] is not node:
            cls, sub = local[name], (tree, module, is_package)
        elif target is not None and (loaded := port(target[0])) is not None:
            other_tree, rel = loaded
            cls = next((s for s in other_tree.body if isinstance(s, ast.ClassDef) and s.name == target[1]), None)
            sub = (other_tree, target[0], rel.endswith("__init__.py"))
        else:
            continue
        if cls is not None:
            own = frozenset(s.name for s in cls.body if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef))
            yield from _upstream_bases(*sub, cls, upstream, port, depth + 1, via or cls.name, methods | own)


def main_path(pairs: list[RolePair]) -> str | None:
    """The upstream file most of the file's classes take their roles from (first one on a tie)."""
    counts: dict[str, int] = {}
    for p in pairs:
        counts[p.upstream_path] = counts.get(p.upstream_path, 0) + 1
    return max(counts, key=lambda k: counts[k]) if counts else None


__all__ = ["RolePair", "UpClass", "UpstreamClasses", "imported_class", "main_path", "role_pairs"]
