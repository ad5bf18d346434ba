# What the port registers (attention backends, MLA prefill backends, custom ops, selector-returned
# class paths), each class path resolved to the file defining it without importing anything.
from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from metax_audit.core.config import AuditConfig
from metax_audit.core.models import Location, Registration, RegistrationKind
from metax_audit.core.pysource import ParsedSource, ast_walk, find_module, line_numbers, module_name, resolve_relative
from metax_audit.stages.discover.scope import _REG_WORDS, _Sources
from metax_audit.stages.discover.selection import Selected, selections

# ------------------------------------------------------------------ class-path resolution


def _top_level_bindings(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    # Module-level names may be bound under `if`/`try` (optional imports, version switches).
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.If):
            yield from _top_level_bindings(stmt.body)
            yield from _top_level_bindings(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            for block in (stmt.body, stmt.orelse, stmt.finalbody, *[h.body for h in stmt.handlers]):
                yield from _top_level_bindings(block)


# A file's top-level bindings as the resolver reads them, in statement order: a _Bind for a def,
# class or assignment, a _From for `from m import ...`.
_Shape = dict[str, "_Shape"] | None  # None, or for a class: the shape of the first statement binding each name


class _Bind(NamedTuple):
    names: frozenset[str]
    shape: _Shape


class _From(NamedTuple):
    level: int
    module: str | None
    aliases: tuple[tuple[str, str | None], ...]


_Binding = _Bind | _From


def _bound_names(stmt: ast.stmt) -> frozenset[str]:
    """The names a def, class or assignment to plain names binds at the top of its block."""
    if isinstance(stmt, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        return frozenset((stmt.name,))
    if isinstance(stmt, ast.Assign):
        return frozenset(t.id for t in stmt.targets if isinstance(t, ast.Name))
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
        return frozenset((stmt.target.id,))
    return frozenset()


def _shape(stmt: ast.stmt) -> _Shape:
    if not isinstance(stmt, ast.ClassDef):
        return None
    inner: dict[str, _Shape] = {}
    for sub in stmt.body:
        for name in _bound_names(sub):
            if name not in inner:
                inner[name] = _shape(sub)
    return inner


def _bindings(tree: ast.Module | None) -> tuple[_Binding, ...] | None:
    if tree is None:
        return None
    out: list[_Binding] = []
    for stmt in _top_level_bindings(tree.body):
        if isinstance(stmt, ast.ImportFrom):
            out.append(_From(stmt.level, stmt.module, tuple((a.name, a.asname) for a in stmt.names)))
        elif names := _bound_names(stmt):
            out.append(_Bind(names, _shape(stmt)))
    return tuple(out)


class _Resolver:
    """Finds the file defining a dotted name, following re-exports; never imports anything. Reads each
    file's top-level bindings (a product of its text, see _Sources.product), not its tree: parsing
    the registered backends' files only to resolve their class paths was 0.03 s a review."""

    def __init__(self, sources: _Sources) -> None:
        self.sources = sources

    def resolve(self, dotted: str) -> str | None:
        parts = dotted.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            rel = find_module(self.sources.root, ".".join(parts[:cut]))
            if rel is not None:
                return self._lookup(rel, parts[cut:], depth=0)
        return None

    def _bindings(self, rel: str) -> tuple[_Binding, ...] | None:
        text = self.sources.text(rel)
        if text is None:
            return None
        return self.sources.product("bindings", rel, text, lambda r, _: _bindings(self.sources.get(r).tree))

    def _lookup(self, rel: str, qual: list[str], depth: int) -> str | None:
        bindings = self._bindings(rel)
        if bindings is None or depth > 8:
            return None
        head, rest = qual[0], qual[1:]
        for entry in bindings:
            if isinstance(entry, _Bind):
                if head in entry.names:
                    return rel if self._nested(entry.shape, rest) else None
                continue
            for name, asname in entry.aliases:
                if (asname or name) != head or name == "*":
                    continue
                base = resolve_relative(module_name(rel), rel.endswith("__init__.py"), entry.level, entry.module)
                sub = find_module(self.sources.root, f"{base}.{name}")
                if sub is not None and rest:  # `from pkg import module` then module.Class
                    return self._lookup(sub, rest, depth + 1)
                target = find_module(self.sources.root, base)
                return self._lookup(target, [name, *rest], depth + 1) if target else None
        return None

    @staticmethod
    def _nested(shape: _Shape, rest: list[str]) -> bool:
        for name in rest:
            if shape is None or name not in shape:  # not a class, or its body binds no such name
                return False
            shape = shape[name]
        return True


# ------------------------------------------------------------------ registrations


_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
_BACKEND_FUNCS: dict[str, RegistrationKind] = {"register_backend": "attention-backend",
                                               "register_mla_prefill_backend": "mla-prefill"}


def _tail(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _arg(call: ast.Call, position: int, keyword: str) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == keyword:
            return kw.value
    if len(call.args) > position and not any(isinstance(a, ast.Starred) for a in call.args[: position + 1]):
        return call.args[position]
    return None


def _member(node: ast.expr | None) -> str:
    if node is None:
        return ""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return ast.unparse(node)


def _literal_str(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


class _RegistrationVisitor:
    """Walks statements only, and expressions only on lines that spell a registration word: a full
    NodeVisitor pass over every node costs more than parsing on a large backend file."""

    def __init__(self, rel: str, module: str, text: str, tree: ast.Module | None = None) -> None:
        self.rel, self.module = rel, module
        self.stack: list[str] = []
        self.found: list[tuple[RegistrationKind, str, str, int, bool]] = []  # kind, name, class_path, line, literal
        self.lines = set(line_numbers(text, (m.start() for m in _REG_WORDS.finditer(text))))
        # Module-level dict literals (enum-keyed maps of class paths) and the loop names bound to one
        # entry while the body of `for member, path in MAP.items():` is visited.
        self.maps = {t.id: stmt.value for stmt in (tree.body if tree else []) if isinstance(stmt, ast.Assign)
                     and isinstance(stmt.value, ast.Dict) for t in stmt.targets if isinstance(t, ast.Name)}
        self.bound: dict[str, ast.expr] = {}

    def _map_loop(self, stmt: ast.For) -> list[dict[str, ast.expr]] | None:
        """One binding per entry for `for k, v in MAP.items():` over a dict literal, else None."""
        it, target = stmt.iter, stmt.target
        if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and it.func.attr == "items"
                and not it.args and isinstance(target, ast.Tuple) and len(target.elts) == 2
                and all(isinstance(e, ast.Name) for e in target.elts)):
            return None
        mapping = it.func.value
        if isinstance(mapping, ast.Name):
            mapping = self.maps.get(mapping.id, mapping)
        if not isinstance(mapping, ast.Dict):
            return None
        k, v = (e.id for e in target.elts)  # type: ignore[attr-defined]
        return [{k: key, v: value} for key, value in zip(mapping.keys, mapping.values, strict=True) if key is not None]

    def _sub(self, node: ast.expr | None) -> ast.expr | None:
        return self.bound.get(node.id, node) if isinstance(node, ast.Name) else node

    def _mentions(self, node: ast.AST) -> bool:
        first = getattr(node, "lineno", 0)
        last = getattr(node, "end_lineno", None) or first
        return any(first <= line <= last for line in self.lines)

    def visit(self, body: list[ast.stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                self._defined(stmt)
            elif isinstance(stmt, ast.For) and self._mentions(stmt) and (entries := self._map_loop(stmt)) is not None:
                saved = self.bound
                for entry in entries:
                    self.bound = {**saved, **entry}
                    self.visit(stmt.body)
                self.bound = saved
            elif isinstance(stmt, ast.If | ast.For | ast.AsyncFor | ast.While | ast.With | ast.AsyncWith | ast.Try):
                for block in (stmt.body, getattr(stmt, "orelse", []), getattr(stmt, "finalbody", []),
                              *[h.body for h in getattr(stmt, "handlers", [])]):
                    self.visit(block)
            elif self._mentions(stmt):
                for node in ast_walk(stmt):
                    if isinstance(node, ast.Call):
                        self._call(node)

    def _defined(self, node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        qual = ".".join([*self.stack, node.name])
        own_path = f"{self.module}.{qual}" if self.module else qual
        for dec in node.decorator_list:
            if not self._mentions(dec):
                continue
            call = dec if isinstance(dec, ast.Call) else None
            func = call.func if call else dec
            name = _tail(func)
            if name in _BACKEND_FUNCS and call is not None:
                backend = _arg(call, 0, "backend")
                given = _arg(call, 1, "class_path")
                path = _literal_str(given) if given is not None else own_path
                kind: RegistrationKind = "decorator" if name == "register_backend" else _BACKEND_FUNCS[name]
                literal = isinstance(backend, ast.Attribute) and (given is None or path is not None)
                self.found.append((kind, _member(backend), path or (ast.unparse(given) if given else own_path), dec.lineno, literal))
            elif isinstance(func, ast.Attribute) and (
                name == "register_oot" or (name == "register" and ast.unparse(func.value).endswith("CustomOp"))
            ):
                op = _literal_str(_arg(call, 0, "name")) if call else None
                self.found.append(("custom-op", op or ast.unparse(func.value), own_path, dec.lineno, True))
        self.stack.append(node.name)
        self.visit(node.body)
        self.stack.pop()

    def _call(self, node: ast.Call) -> None:
        name = _tail(node.func)
        if name in _BACKEND_FUNCS:
            backend, given = self._sub(_arg(node, 0, "backend")), self._sub(_arg(node, 1, "class_path"))
            # Other registries have register_backend(...) too (torch.distributed, vLLM's sleep-mode
            # factory, both keyed by strings); a backend registration names an enum member.
            if given is None or not isinstance(backend, ast.Attribute):
                return
            path = _literal_str(given)
            literal = path is not None and isinstance(backend, ast.Attribute)
            line = given.lineno if self.bound and given.lineno != node.lineno else node.lineno  # the map entry
            self.found.append((_BACKEND_FUNCS[name], _member(backend), path or ast.unparse(given), line, literal))
        elif name == "direct_register_custom_op":
            op_name, func = _arg(node, 0, "op_name"), _arg(node, 1, "op_func")
            if isinstance(func, ast.Name) and self.module and not self.stack:
                target = f"{self.module}.{func.id}"
            else:
                target = ast.unparse(func) if func is not None else ""
            literal = _literal_str(op_name) is not None and _DOTTED.match(target) is not None
            self.found.append(("custom-op", _literal_str(op_name) or _member(op_name), target, node.lineno, literal))
        elif name == "register_oot" and isinstance(node.func, ast.Attribute):
            cls = _arg(node, 0, "_decorated_op_cls")
            if isinstance(cls, ast.Name) and self.module:
                op = _literal_str(_arg(node, 1, "name")) or ast.unparse(node.func.value)
                self.found.append(("custom-op", op, f"{self.module}.{cls.id}", node.lineno, True))


def _returned_registrations(sources: _Sources, platform: str, config: AuditConfig, resolver: _Resolver) -> list[Registration]:
    """One registration per class path the platform's selectors return, its conditions OR-ed."""
    src = sources.get(platform)
    if src.tree is None or not config.selectors:
        return []

    def load(module: str) -> tuple[ast.Module, str] | None:
        rel = find_module(sources.root, module)
        tree = sources.get(rel).tree if rel is not None else None
        return (tree, rel) if tree is not None and rel is not None else None

    by_path: dict[str, list[Selected]] = {}
    for sel in selections(src.tree, platform, module_name(platform), tuple(config.selectors), load):
        by_path.setdefault(sel.class_path, []).append(sel)
    out: list[Registration] = []
    for class_path, sels in by_path.items():
        conds = list(dict.fromkeys(s.condition for s in sels))
        condition = "" if "" in conds else (conds[0] if len(conds) == 1 else " or ".join(f"({c})" for c in conds))
        name = next((s.member for s in sels if s.member), "") or class_path.rsplit(".", 1)[1]
        where = resolver.resolve(class_path)
        first = sels[0]
        out.append(Registration(kind="attention-backend", name=name, class_path=class_path,
                                location=Location(first.path, first.line, first.function), resolved=where is not None,
                                resolved_path=where, selected_by=first.function, condition=condition))
    return out


def _visited(src: ParsedSource) -> list[tuple[RegistrationKind, str, str, int, bool]] | None:
    """What the file registers (_RegistrationVisitor.found); None when it has no tree."""
    if src.tree is None or src.text is None:
        return None
    visitor = _RegistrationVisitor(src.path, module_name(src.path), src.text, src.tree)
    visitor.visit(src.tree.body)
    return visitor.found


def _registrations(sources: _Sources, files: Iterable[str], resolver: _Resolver) -> tuple[Registration, ...]:
    out: list[Registration] = []
    for rel in files:
        text = sources.text(rel)
        if text is None or not _REG_WORDS.search(text):
            continue
        found = sources.product("registrations", rel, text, lambda r, _: _visited(sources.get(r)))
        for kind, name, class_path, line, literal in found or ():
            where = resolver.resolve(class_path) if literal and _DOTTED.match(class_path) else None
            out.append(Registration(kind=kind, name=name, class_path=class_path,
                                    location=Location(rel, line, name), resolved=where is not None,
                                    resolved_path=where, literal=literal))
    return tuple(out)
