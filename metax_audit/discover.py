# The discover stage: which port files are in scope, what the port registers (backends, MLA
# prefill backends, custom ops), the platform's priority lists and config switches, and callers.
from __future__ import annotations

import ast
import fnmatch
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from metax_audit.config import AuditConfig, python_files, scope_files
from metax_audit.errors import DiscoverError
from metax_audit.findings import make_finding, rule
from metax_audit.models import (
    Category,
    ConfigSwitch,
    Discovery,
    Finding,
    Location,
    ParseProblem,
    PriorityList,
    Registration,
    Severity,
    SkippedFile,
    SourceFile,
)
from metax_audit.pysource import (
    EXPR_DEPTH_LIMIT,
    ParsedSource,
    cached_parse,
    check_source,
    comments,
    find_module,
    line_numbers,
    module_name,
    read_source_cached,
    read_text,
    resolve_relative,
    scan_imports,
    too_deep_lines,
)
from metax_audit.selection import Selected, selections

# ------------------------------------------------------------------ rules

rule(
    "MXA010", Category.REGISTRATION, Severity.ERROR,
    "registration names a class path that does not resolve in the snapshot",
    "The registered module or class does not exist in the audited snapshot, so selecting this backend "
    "fails at runtime with an import error. Fix the class path or add the class.",
)
rule(
    "MXA011", Category.REGISTRATION, Severity.INFO,
    "registered attention backend is in no priority list of the platform",
    "The backend is only used when selected explicitly (--attention-backend); automatic selection never "
    "picks it. Commented-out priority entries are listed in the evidence. Add it to the priorities or waive.",
)
rule(
    "MXA012", Category.REGISTRATION, Severity.WARNING,
    "priority list names a backend the port does not register",
    "Automatic selection can pick this enum member, but the port registers no class for it, so the "
    "upstream (NVIDIA) class is loaded on the vendor platform. Register the port's class or remove the entry.",
)
rule(
    "MXA013", Category.REGISTRATION, Severity.WARNING,
    "the same backend is registered more than once with different class paths",
    "The last registration executed wins, which depends on import order. Keep one registration.",
)
rule(
    "MXA014", Category.REGISTRATION, Severity.INFO,
    "registration points outside the audited snapshot",
    "The class path names a package that is not part of the snapshot (typically upstream), so it cannot "
    "be checked here; the upstream class runs unchanged on the vendor platform.",
)
rule(
    "MXA015", Category.INACTIVE_PATH, Severity.INFO,
    "the platform turns a feature off in the config",
    "A config switch set by the platform disables (or forces) a feature, so the matching branches in the "
    "backends are inactive on this platform. They are still audited; probes of them cannot run end to end.",
)
rule(
    "MXA017", Category.REGISTRATION, Severity.WARNING,
    "decorator registration passes a class_path that is not a class path",
    "Given a class_path, vLLM's register_backend records that string for the enum member and returns a "
    "no-op decorator, so the decorated class is not registered and selecting the member imports the string. "
    "Info when the platform selects its backends by returning class paths (the registry entry is then unused).",
)
rule(
    "MXA016", Category.REGISTRATION, Severity.WARNING,
    "registration whose backend or class path is not a literal",
    "The class path (or enum member) is computed at runtime, so the audit cannot tell which class is "
    "registered. Write it as a string literal (and an enum attribute) so it can be checked.",
)

# ------------------------------------------------------------------ scope

_GLOB_CHARS = re.compile(r"[*?\[]")
_REG_WORDS = re.compile(r"register_backend|register_mla_prefill_backend|register_oot|\.register\b|direct_register_custom_op")


def _port_dir(config: AuditConfig) -> str:
    return config.port_package.replace(".", "/")


def _rel(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix()


def _scope(root: Path, config: AuditConfig) -> dict[str, str]:
    scoped = dict.fromkeys(scope_files(root, config), "glob")
    if config.platform_path in scoped:
        scoped[config.platform_path] = "platform"
    return scoped


def _normalise(path: str) -> str:
    p = path.replace("\\", "/").strip()
    while p.startswith("./"):
        p = p[2:]
    return p.rstrip("/")


def _selected(rel: str, wanted: Sequence[str]) -> bool:
    for w in wanted:
        if rel == w or rel.startswith(w + "/") or (_GLOB_CHARS.search(w) and fnmatch.fnmatchcase(rel, w)):
            return True
    return False


def _narrow(root: Path, scoped: dict[str, str], paths: Sequence[str]) -> tuple[dict[str, str], list[SkippedFile]]:
    wanted = [_normalise(p) for p in paths if _normalise(p)]
    for w in wanted:
        if w.startswith("/") or ".." in w.split("/"):
            raise DiscoverError(f"PATHS entry {w!r} must be relative to the repository root, inside it")
    kept = {rel: why for rel, why in scoped.items() if _selected(rel, wanted)}
    for w in wanted:
        if _GLOB_CHARS.search(w):
            extra = python_files(root, w)
        elif (root / w).is_dir():
            extra = python_files(root, f"{w}/**/*.py")
        else:
            extra = [w] if (root / w).is_file() else []
            if extra and not w.endswith(".py"):
                raise DiscoverError(f"PATHS entry {w!r} is not a Python file; the audit reads .py sources only")
        if not extra and not any(_selected(rel, [w]) for rel in scoped):
            raise DiscoverError(f"PATHS entry {w!r} matches no file in the snapshot; give a repo-relative path")
        for rel in extra:
            kept.setdefault(rel, "explicit")
    left_out = [SkippedFile(rel, "not selected by PATHS") for rel in sorted(scoped) if rel not in kept]
    return kept, left_out


class _Sources:
    """Reads each snapshot file at most once per run, with the configured size limit; parses on demand."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self._texts: dict[str, tuple[str | None, ParseProblem | None]] = {}
        self._parsed: dict[str, ParsedSource] = {}
        self.keep: set[str] = set()

    def text(self, rel: str) -> str | None:
        if rel not in self._texts:
            self._texts[rel] = read_text(self.root, rel, self.max_bytes)
        return self._texts[rel][0]

    def get(self, rel: str) -> ParsedSource:
        """The file with its tree, kept for later lookups (registrations, resolution, platform)."""
        if rel not in self._parsed:
            # the tree comes from the process-wide cache, so trace/compare/checks reuse it
            self._parsed[rel] = read_source_cached(self.root, rel, self.max_bytes)
        return self._parsed[rel]

    def status(self, rel: str) -> ParsedSource:
        """Whether the file parses, without keeping its tree: holding thousands of trees alive makes
        the garbage collector rescan them on every allocation burst, which dominated large scopes."""
        if rel in self._parsed:
            return self._parsed[rel]
        text = self.text(rel)
        if text is not None and (_REG_WORDS.search(text) or rel in self.keep):
            return self.get(rel)
        return check_source(rel, *self._texts[rel])


def _source_file(src: ParsedSource, reason: str) -> SourceFile:
    return SourceFile(path=src.path, module=module_name(src.path), reason=reason, problem=src.problem,
                      lines=src.lines)


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


def _binds(stmt: ast.stmt, name: str) -> bool:
    if isinstance(stmt, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        return stmt.name == name
    if isinstance(stmt, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets)
    if isinstance(stmt, ast.AnnAssign):
        return isinstance(stmt.target, ast.Name) and stmt.target.id == name
    return False


class _Resolver:
    """Finds the file defining a dotted name, following re-exports; never imports anything."""

    def __init__(self, sources: _Sources) -> None:
        self.sources = sources

    def resolve(self, dotted: str) -> str | None:
        parts = dotted.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            rel = find_module(self.sources.root, ".".join(parts[:cut]))
            if rel is not None:
                return self._lookup(rel, parts[cut:], depth=0)
        return None

    def _lookup(self, rel: str, qual: list[str], depth: int) -> str | None:
        tree = self.sources.get(rel).tree
        if tree is None or depth > 8:
            return None
        head, rest = qual[0], qual[1:]
        for stmt in _top_level_bindings(tree.body):
            if _binds(stmt, head):
                return rel if self._nested(stmt, rest) else None
            if isinstance(stmt, ast.ImportFrom):
                for alias in stmt.names:
                    if (alias.asname or alias.name) != head or alias.name == "*":
                        continue
                    mod = module_name(rel)
                    base = resolve_relative(mod, rel.endswith("__init__.py"), stmt.level, stmt.module)
                    sub = find_module(self.sources.root, f"{base}.{alias.name}")
                    if sub is not None and rest:  # `from pkg import module` then module.Class
                        return self._lookup(sub, rest, depth + 1)
                    target = find_module(self.sources.root, base)
                    return self._lookup(target, [alias.name, *rest], depth + 1) if target else None
        return None

    @staticmethod
    def _nested(stmt: ast.stmt, rest: list[str]) -> bool:
        for name in rest:
            if not isinstance(stmt, ast.ClassDef):
                return False
            inner = next((s for s in stmt.body if _binds(s, name)), None)
            if inner is None:
                return False
            stmt = inner
        return True


# ------------------------------------------------------------------ registrations

_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
_BACKEND_FUNCS = {"register_backend": "attention-backend", "register_mla_prefill_backend": "mla-prefill"}


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
        self.found: list[tuple[str, str, str, int, bool]] = []  # kind, name, class_path, line, literal
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
                for node in ast.walk(stmt):
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
                kind = "decorator" if name == "register_backend" else _BACKEND_FUNCS[name]
                literal = isinstance(backend, ast.Attribute) and (given is None or path is not None)
                self.found.append((kind, _member(backend), path or ast.unparse(given), dec.lineno, literal))
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


def _registrations(sources: _Sources, files: Iterable[str], resolver: _Resolver) -> tuple[Registration, ...]:
    out: list[Registration] = []
    for rel in files:
        text = sources.text(rel)
        if text is None or not _REG_WORDS.search(text):
            continue
        src = sources.get(rel)
        if src.tree is None or src.text is None:
            continue
        visitor = _RegistrationVisitor(rel, module_name(rel), src.text, src.tree)
        visitor.visit(src.tree.body)
        for kind, name, class_path, line, literal in visitor.found:
            where = resolver.resolve(class_path) if literal and _DOTTED.match(class_path) else None
            out.append(Registration(kind=kind, name=name, class_path=class_path,
                                    location=Location(rel, line, name), resolved=where is not None,
                                    resolved_path=where, literal=literal))
    return tuple(out)


# ------------------------------------------------------------------ platform: priorities and switches


def _branches(body: list[ast.stmt], conds: tuple[str, ...], else_text: str | None) -> Iterator[tuple[ast.stmt, tuple[str, ...]]]:
    """Every statement with the conditions that guard it, outermost first (not into nested defs)."""
    for stmt in body:
        yield stmt, conds
        if isinstance(stmt, ast.If):
            test = ast.unparse(stmt.test)
            yield from _branches(stmt.body, (*conds, test), else_text)
            if stmt.orelse:
                negated = else_text if else_text is not None else f"not ({test})"
                if len(stmt.orelse) == 1 and isinstance(stmt.orelse[0], ast.If):
                    yield from _branches(stmt.orelse, conds, else_text)  # elif: its own test says it
                else:
                    yield from _branches(stmt.orelse, (*conds, negated), else_text)
        elif isinstance(stmt, ast.For | ast.AsyncFor | ast.While | ast.With | ast.AsyncWith):
            yield from _branches(stmt.body, conds, else_text)
            yield from _branches(getattr(stmt, "orelse", []), conds, else_text)
        elif isinstance(stmt, ast.Try):
            for block in (stmt.body, stmt.orelse, stmt.finalbody, *[h.body for h in stmt.handlers]):
                yield from _branches(block, conds, else_text)
        elif isinstance(stmt, ast.Match):
            subject = ast.unparse(stmt.subject)
            for case in stmt.cases:
                yield from _branches(case.body, (*conds, f"{subject} matches {ast.unparse(case.pattern)}"), else_text)


def _functions(tree: ast.Module) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


_COMMENTED_MEMBER = re.compile(r"^(?:[A-Za-z_]\w*\.)+([A-Z][A-Z0-9_]*)\s*,?\s*$")


def _is_backend_list(node: ast.expr) -> bool:
    return isinstance(node, ast.List) and all(isinstance(e, ast.Attribute) for e in node.elts)


def _priorities(src: ParsedSource) -> tuple[PriorityList, ...]:
    if src.tree is None or src.text is None:
        return ()
    notes = comments(src.text)
    out: list[PriorityList] = []
    for func in _functions(src.tree):
        if "priorit" not in func.name.lower():
            continue
        for stmt, conds in _branches(func.body, (), "else"):
            value = stmt.value if isinstance(stmt, ast.Return | ast.Assign | ast.AnnAssign) else None
            if value is None or not _is_backend_list(value):
                continue
            assert isinstance(value, ast.List)
            end = value.end_lineno or value.lineno
            dropped = tuple(m.group(1) for line in range(value.lineno, end + 1)
                            if (m := _COMMENTED_MEMBER.match(notes.get(line, ""))))
            if not value.elts and not dropped:
                continue
            out.append(PriorityList(condition=" / ".join(conds), members=tuple(_member(e) for e in value.elts),
                                    location=Location(src.path, value.lineno, func.name), commented_out=dropped))
    return tuple(out)


_SWITCH_FUNC = re.compile(r"config|update|override", re.IGNORECASE)
_SWITCH_ATTR = re.compile(r"^(disable|enable|use|force|skip|allow)_")


def _switch_value(value: ast.expr) -> bool:
    if isinstance(value, ast.Constant):
        return True
    if isinstance(value, ast.UnaryOp) and isinstance(value.operand, ast.Constant):
        return True
    if isinstance(value, ast.Attribute) and value.attr.isupper():  # an enum member: Enum.FLASH_ATTN
        return True
    return isinstance(value, ast.Tuple | ast.List) and all(isinstance(e, ast.Constant) for e in value.elts)


def _switches(src: ParsedSource) -> tuple[ConfigSwitch, ...]:
    if src.tree is None:
        return ()
    out: list[ConfigSwitch] = []
    for func in _functions(src.tree):
        if not _SWITCH_FUNC.search(func.name):
            continue
        for stmt, conds in _branches(func.body, (), None):
            if isinstance(stmt, ast.Assign):
                targets, value = stmt.targets, stmt.value
            elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                targets, value = [stmt.target], stmt.value
            else:
                continue
            for target in targets:
                if not isinstance(target, ast.Attribute):
                    continue
                if _switch_value(value) or _SWITCH_ATTR.match(target.attr):
                    out.append(ConfigSwitch(target=ast.unparse(target), value=ast.unparse(value),
                                            condition=" / ".join(conds),
                                            location=Location(src.path, stmt.lineno, func.name)))
    return tuple(out)


# ------------------------------------------------------------------ callers


def _imported_modules(rel: str, text: str, known: set[str]) -> set[str]:
    """Modules in `known` that this file imports, in every form (absolute, relative, lazy)."""
    mod = module_name(rel)
    is_pkg = rel.endswith("__init__.py")
    found: set[str] = set()
    for stmt in scan_imports(text):
        if stmt.module is None and stmt.level == 0:  # import a.b.c
            found.update(n for n in stmt.names if n in known)
            continue
        base = resolve_relative(mod, is_pkg, stmt.level, stmt.module)
        if not base:
            continue
        if base in known:
            found.add(base)
        found.update(f"{base}.{n}" for n in stmt.names if f"{base}.{n}" in known)
    return found


def _callers(sources: _Sources, importers: Iterable[str], targets: Iterable[str]) -> dict[str, tuple[str, ...]]:
    targets = list(targets)
    by_module = {module_name(t): t for t in targets if module_name(t)}
    result: dict[str, set[str]] = {t: set() for t in targets}
    known = set(by_module)
    for rel in importers:
        text = sources.text(rel)
        if text is None:
            continue
        for imported in _imported_modules(rel, text, known):
            target = by_module[imported]
            if target != rel:
                result[target].add(rel)
    return {t: tuple(sorted(v)) for t, v in result.items()}


def _port_files(root: Path, config: AuditConfig) -> list[str]:
    base = root / _port_dir(config)
    if not base.is_dir():
        single = root / f"{_port_dir(config)}.py"
        if single.is_file():
            return [_rel(root, single)]
        raise DiscoverError(
            f"port package {config.port_package!r} not found in the snapshot (no {_port_dir(config)}/); "
            "set port-package in [tool.metax-audit] or .metax-audit.yaml"
        )
    return _package_files(root, base)


def _package_files(root: Path, base: Path) -> list[str]:
    if not base.is_dir():
        return []
    return sorted(_rel(root, p) for p in base.rglob("*.py") if p.is_file() and "__pycache__" not in p.parts)


# ------------------------------------------------------------------ public API


def discover(root: Path, config: AuditConfig, paths: Sequence[str] = ()) -> Discovery:
    """Scope, registrations, priorities, switches and callers of the port in snapshot `root`."""
    root = Path(root)
    if not root.is_dir():
        raise DiscoverError(f"snapshot directory {root} does not exist")
    port = _port_files(root, config)
    scoped = _scope(root, config)
    left_out: list[SkippedFile] = []
    if paths:
        scoped, left_out = _narrow(root, scoped, paths)
    platform = config.platform_path
    sources = _Sources(root, config.max_file_bytes)
    sources.keep.add(platform)
    files = tuple(_source_file(sources.status(rel), why) for rel, why in sorted(scoped.items()))

    has_platform = (root / platform).is_file()
    # The platform is read even when PATHS leaves it out: the registrations of the selected files live there.
    scan = sorted(set(scoped) | ({platform} if has_platform else set()))
    resolver = _Resolver(sources)
    registrations = _registrations(sources, scan, resolver)
    if has_platform:
        registrations += tuple(_returned_registrations(sources, platform, config, resolver))
    priorities = _priorities(sources.get(platform)) if has_platform else ()
    switches = _switches(sources.get(platform)) if has_platform else ()
    callers = _callers(sources, sorted(set(port) | set(scoped)), list(scoped))
    return Discovery(root=root, port_package=config.port_package, files=files, registrations=registrations,
                     priorities=priorities, switches=switches, callers=callers, left_out=tuple(left_out))


def widen(discovery: Discovery, root: Path, reached: Iterable[str], *, max_file_bytes: int | None = None) -> Discovery:
    """Add port files the trace reached (paths or dotted modules) as `reached-by-trace` records."""
    root = Path(root)
    limit = max_file_bytes if max_file_bytes is not None else AuditConfig().max_file_bytes
    port_dir = discovery.port_package.replace(".", "/")
    have = {f.path for f in discovery.files}
    new: list[str] = []
    for item in reached:
        rel = _normalise(item) if item.endswith(".py") else (find_module(root, item) or "")
        if rel and rel not in have and rel not in new and (rel == f"{port_dir}.py" or rel.startswith(port_dir + "/")) \
                and (root / rel).is_file():
            new.append(rel)
    if not new:
        return discovery
    sources = _Sources(root, limit)
    added = [_source_file(sources.status(rel), "reached-by-trace") for rel in new]
    port = _package_files(root, root / port_dir)
    callers = dict(discovery.callers)
    callers.update(_callers(sources, sorted(set(port) | have | set(new)), new))
    return replace(
        discovery,
        files=tuple(sorted((*discovery.files, *added), key=lambda f: f.path)),
        callers=callers,
        left_out=tuple(s for s in discovery.left_out if s.path not in set(new)),
    )


def coverage_findings(discovery: Discovery) -> Iterator[Finding]:
    """MXA001 for files in scope that could not be parsed, MXA002 for files skipped by size."""
    for f in discovery.files:
        problem = f.problem
        if problem is None:
            for line in _too_deep(discovery.root, f.path):
                yield make_finding("MXA002", Location(f.path, line, f.module), f"expression too deep to analyse at {f.path}:{line}",
                                   (f"{f.path}:{line}: an expression nests more than {EXPR_DEPTH_LIMIT} levels deep; what lies "
                                    "below that depth was not traced, compared or checked",), key=f"too-deep:{line}")
            continue
        if not problem.broken:
            yield make_finding("MXA002", Location(f.path, 0, f.module), f"{f.path} was not analysed: {problem.message}",
                               (f"{f.path}: {problem.message}", "discover: files over max_file_bytes are not parsed"))
            continue
        line = problem.line
        yield make_finding("MXA001", Location(f.path, line, f.module), f"{f.path} could not be parsed: {problem.message}",
                           (f"{f.path}:{line}: {problem.message}" if line else f"{f.path}: {problem.message}",))


def _too_deep(root: Path, rel: str) -> tuple[int, ...]:
    """The lines where the parse cut an expression of this file as too deep (pysource.prune_deep)."""
    try:
        return too_deep_lines(cached_parse(root / rel)[1])
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return ()


def registration_findings(discovery: Discovery) -> Iterator[Finding]:
    """Findings about what the port registers and how the platform orders and switches it."""
    packages = _snapshot_packages(discovery.root)
    selectors = sorted({r.selected_by for r in discovery.registrations if r.selected_by})
    for reg in discovery.registrations:
        where = f"{reg.location.path}:{reg.location.line}"
        literal = _DOTTED.match(reg.class_path) is not None
        if reg.kind == "custom-op" and not literal:
            continue  # an op function bound inside a function or computed: nothing to resolve statically
        if reg.kind == "decorator" and reg.literal and not literal:
            yield make_finding(
                "MXA017", reg.location,
                f"@register_backend({reg.name}, {reg.class_path!r}) registers the string {reg.class_path!r} for {reg.name},"
                " not the decorated class",
                (f"{where}: class_path={reg.class_path!r} is not a dotted class path",
                 "vLLM's register_backend with a class_path stores it and returns a no-op decorator",
                 *([f"the platform selects backends by returning class paths from {', '.join(selectors)}, "
                    "so selection does not read this entry"] if selectors else [])),
                severity=Severity.INFO if selectors else None)
        elif not literal or not reg.name.replace("_", "").isalnum():
            yield make_finding("MXA016", reg.location, f"{reg.kind} registration of {reg.name!r} is not a literal",
                               (f"{where}: class path {reg.class_path!r}",))
        elif not reg.resolved and reg.class_path.split(".")[0] in packages:
            yield make_finding("MXA010", reg.location,
                               f"{reg.kind} {reg.name} is registered to {reg.class_path}, which does not exist in the snapshot",
                               (f"{where}: class_path={reg.class_path!r}", _missing_part(discovery.root, reg.class_path)))
        elif not reg.resolved:
            yield make_finding("MXA014", reg.location,
                               f"{reg.kind} {reg.name} is registered to {reg.class_path}, outside the snapshot",
                               (f"{where}: class_path={reg.class_path!r}",
                                f"packages in the snapshot: {', '.join(sorted(packages)) or 'none'}"))
    yield from _duplicate_findings(discovery)
    yield from _priority_findings(discovery)
    for sw in discovery.switches:
        name = sw.target.rsplit(".", 1)[-1]
        turned_off = (name.startswith("disable_") and sw.value == "True") or (
            _SWITCH_ATTR.match(name) is not None and not name.startswith("disable_") and sw.value == "False")
        if turned_off:
            cond = f" when {sw.condition}" if sw.condition else ""
            yield make_finding("MXA015", sw.location, f"the platform sets {sw.target} = {sw.value}{cond}",
                               (f"{sw.location.path}:{sw.location.line}: {sw.target} = {sw.value}"
                                f" in {sw.location.symbol}" + (f" under `{sw.condition}`" if sw.condition else ""),))


def _backend_kinds() -> set[str]:
    return {"attention-backend", "decorator"}


def _duplicate_findings(discovery: Discovery) -> Iterator[Finding]:
    seen: dict[tuple[str, str], Registration] = {}
    for reg in discovery.registrations:
        if reg.kind == "custom-op":
            continue  # torch ops and CustomOp classes share names across separate registries
        kind = "attention" if reg.kind in _backend_kinds() else reg.kind
        first = seen.setdefault((kind, reg.name), reg)
        if first is not reg and first.class_path != reg.class_path:
            yield make_finding("MXA013", reg.location,
                               f"{reg.name} is registered again, to {reg.class_path} (first: {first.class_path})",
                               (f"{first.location.path}:{first.location.line}: {first.class_path}",
                                f"{reg.location.path}:{reg.location.line}: {reg.class_path}"))


def _priority_findings(discovery: Discovery) -> Iterator[Finding]:
    if not discovery.priorities:
        return
    listed = {m for p in discovery.priorities for m in p.members}
    commented = {m: p for p in discovery.priorities for m in p.commented_out}
    backend_regs = [r for r in discovery.registrations if r.kind in _backend_kinds()]
    for reg in backend_regs:
        if reg.name in listed or reg.selected_by:
            continue
        evidence = [f"{reg.location.path}:{reg.location.line}: registers {reg.name} -> {reg.class_path}"]
        evidence += [f"{p.location.path}:{p.location.line}: priorities ({p.condition or 'always'}): "
                     f"{', '.join(p.members) or 'empty'}" for p in discovery.priorities]
        if reg.name in commented:
            p = commented[reg.name]
            evidence.append(f"{p.location.path}:{p.location.line}: {reg.name} is commented out of this list")
        yield make_finding("MXA011", reg.location, f"registered backend {reg.name} is in no priority list", evidence)
    registered = {r.name for r in backend_regs}
    for p in discovery.priorities:
        for member in p.members:
            if member not in registered:
                yield make_finding(
                    "MXA012", Location(p.location.path, p.location.line, member),
                    f"priority list ({p.condition or 'always'}) names {member}, which the port does not register",
                    (f"{p.location.path}:{p.location.line}: {', '.join(p.members)}",
                     f"registered: {', '.join(sorted(registered)) or 'none'}"))


def _snapshot_packages(root: Path) -> set[str]:
    try:
        return {p.name if p.is_dir() else p.stem for p in root.iterdir()
                if (p.is_dir() and p.name.isidentifier()) or (p.suffix == ".py" and p.stem.isidentifier())}
    except OSError:
        return set()


def _missing_part(root: Path, class_path: str) -> str:
    parts = class_path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        mod = ".".join(parts[:cut])
        rel = find_module(root, mod)
        if rel is not None:
            rest = parts[cut:]
            if len(rest) > 1 and not rel.endswith("__init__.py"):
                return f"module {mod} exists ({rel}) but defines no {'.'.join(rest)}"
            if len(rest) > 1:
                return f"package {mod} exists ({rel}) but has no module {mod}.{rest[0]}"
            return f"module {mod} exists ({rel}) but defines no {rest[0]}"
    return f"no module of {class_path} exists in the snapshot (looked for {parts[0]}/...)"


__all__ = ["coverage_findings", "discover", "registration_findings", "widen"]
