# Caller liveness: whether an upstream call that proves an override finding can run on the port. A call in
# an upstream function the port replaces (an assignment over the module attribute or class attribute) or
# overrides in every port class derived from its class never runs there; neither does one in a function
# reached only from such code. Static, over both trees; run after the compare on all its findings, since it
# reads the whole port (the per-file result cache keys on one file's reads).
from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from metax_audit.core.models import Finding, Severity, UpstreamCaller
from metax_audit.core.pysource import ast_walk, find_module, module_name, read_source_cached, resolve_relative
from metax_audit.stages.compare.roles import UpstreamClasses, imported_class
from metax_audit.stages.compare.side import _PortRefs
from metax_audit.stages.compare.upstream_calls import UpstreamCalls, calls_of

_MAX_DEPTH = 4  # callers of callers followed; beyond, a caller counts as live (what is not followed may run)
_MAX_CALLERS = 40  # a name called in more places is taken as live: too common to prove it dead
_CONSTRUCTORS = frozenset({"__init__", "__new__", "__post_init__"})


@dataclass(frozen=True)
class _PortClass:
    path: str
    line: int
    name: str
    methods: dict[str, ast.FunctionDef | ast.AsyncFunctionDef]
    bases: tuple[tuple[str, str], ...]  # (module, class) each base names through the file's imports

    def calls_super(self, method: str) -> bool:
        """The override calls super().<same name>: upstream's body still runs."""
        node = self.methods.get(method)
        return node is not None and any(
            isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == method
            and isinstance(n.func.value, ast.Call) and isinstance(n.func.value.func, ast.Name)
            and n.func.value.func.id == "super" for n in ast_walk(node))


@dataclass(frozen=True)
class _Reach:
    live: bool
    why: str  # evidence: the chain that reaches it, or what replaces it


class PortView:
    """What the port does to upstream code, read lazily from the port's sources: assignments over
    upstream module or class attributes, classes derived from upstream classes, calls by name."""

    def __init__(self, root: Path, package: str, refs: _PortRefs, max_bytes: int) -> None:
        self._root, self._package, self._refs, self._max_bytes = root, package, refs, max_bytes
        self._classes: dict[str, list[_PortClass]] = {}
        self._patches: dict[str, dict[str, tuple[str, int]]] = {}

    def _tree(self, rel: str) -> ast.Module | None:
        # the process-wide parse cache: the trace and the checks parsed most of these files already
        return read_source_cached(self._root, rel, self._max_bytes).tree

    def _parsed_naming(self, name: str, worth: re.Pattern[str]) -> Iterator[tuple[str, ast.Module]]:
        """(path, tree) of each port file that names `name` and whose text matches `worth` (the statement
        looked for could be there: most files naming a name are not parsed)."""
        texts = self._refs.texts()
        for rel in sorted(self._refs.files_naming(name)):
            if worth.search(texts.get(rel, "")) and (tree := self._tree(rel)) is not None:
                yield rel, tree

    def replaced(self, dotted: str) -> tuple[str, int] | None:
        """Where the port assigns over the upstream attribute `dotted` ("pkg.mod.func", "pkg.mod.Cls.meth")."""
        name = dotted.rsplit(".", 1)[-1]
        if name not in self._patches:
            found: dict[str, tuple[str, int]] = {}
            assigns = re.compile(rf"\.{re.escape(name)}\s*=(?!=)|setattr\([^)]*[\"']{re.escape(name)}[\"']")
            for rel, tree in self._parsed_naming(name, assigns):
                for target, line in _assigned_attributes(tree, module_name(rel), rel.endswith("__init__.py"), name):
                    found.setdefault(target, (rel, line))
            self._patches[name] = found
        return self._patches[name].get(dotted)

    def classes_naming(self, name: str) -> list[_PortClass]:
        """Port classes with a base spelled `name` (directly, any import)."""
        if name not in self._classes:
            derives = re.compile(rf"\bclass\s+\w+\s*\([^)]*\b{re.escape(name)}\b")
            self._classes[name] = [
                _port_class(rel, stmt, tree, module_name(rel), rel.endswith("__init__.py"))
                for rel, tree in self._parsed_naming(name, derives) for stmt in tree.body
                if isinstance(stmt, ast.ClassDef) and any(_spelled(b).rsplit(".", 1)[-1] == name for b in stmt.bases)]
        return self._classes[name]

    def port_class(self, path: str, name: str) -> _PortClass | None:
        tree = self._tree(path)
        if tree is None:
            return None
        for stmt in tree.body:
            if isinstance(stmt, ast.ClassDef) and stmt.name == name:
                return _port_class(path, stmt, tree, module_name(path), path.endswith("__init__.py"))
        return None

    def module_file(self, module: str) -> str | None:
        return find_module(self._root, module) if module.split(".", 1)[0] == self._package.split(".", 1)[0] else None

    def calls(self, name: str) -> tuple[str, int] | None:
        """The first place the port calls `name` (`name(` or `.name(`, not its own `def`). Every reference is
        read: the references index stops at 21 places, and a call past them would be missed."""
        pattern = re.compile(rf"(?<![\w]){re.escape(name)}\s*\(")
        texts = self._refs.texts()
        for rel in sorted(self._refs.files_naming(name)):
            text = texts.get(rel, "")
            for m in pattern.finditer(text):
                before = text[text.rfind("\n", 0, m.start()) + 1:m.start()]
                if not re.search(r"\b(?:def|class)\s+$", before) and "#" not in before:
                    return rel, text.count("\n", 0, m.start()) + 1
        return None


def _spelled(node: ast.expr) -> str:
    if isinstance(node, ast.Subscript):
        node = node.value
    try:
        return ast.unparse(node)
    except (ValueError, RecursionError):
        return ""


def _port_class(rel: str, node: ast.ClassDef, tree: ast.Module, module: str, is_pkg: bool) -> _PortClass:
    methods = {stmt.name: stmt for stmt in node.body if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef)}
    bases = tuple(t for b in node.bases if (t := imported_class(tree, module, is_pkg, b)) is not None)
    local = tuple((module, _spelled(b)) for b in node.bases
                  if isinstance(b, ast.Name) and any(isinstance(s, ast.ClassDef) and s.name == b.id for s in tree.body))
    return _PortClass(rel, node.lineno, node.name, methods, bases + local)


def _assigned_attributes(tree: ast.Module, module: str, is_pkg: bool, name: str) -> Iterable[tuple[str, int]]:
    """(dotted target, line) of each `x.y.name = ...` and `setattr(x.y, "name", ...)` in the file, the
    target's head resolved through the file's imports."""
    aliases = _aliases(tree, module, is_pkg)
    for node in ast_walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Attribute) and t.attr == name:
                    owner = _dotted(t.value, aliases)
                    if owner:
                        yield f"{owner}.{name}", node.lineno
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value == name:
            owner = _dotted(node.args[0], aliases)
            if owner:
                yield f"{owner}.{name}", node.lineno


def _aliases(tree: ast.Module, module: str, is_pkg: bool) -> dict[str, str]:
    out: dict[str, str] = {}
    for node in ast_walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    out[a.asname] = a.name
                else:
                    head = a.name.split(".", 1)[0]
                    out.setdefault(head, head)
        elif isinstance(node, ast.ImportFrom):
            src = resolve_relative(module, is_pkg, node.level, node.module)
            for a in node.names:
                if a.name != "*" and src:
                    out[a.asname or a.name] = f"{src}.{a.name}"
    return out


def _dotted(node: ast.expr, aliases: dict[str, str]) -> str:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in aliases:
        return ""
    return ".".join([aliases[node.id], *reversed(parts)])


class CallerLiveness:
    """Judges upstream callers on one port against one upstream release."""

    def __init__(self, port: PortView, upstream: UpstreamClasses) -> None:
        self._port, self._upstream = port, upstream
        self._calls: UpstreamCalls = calls_of(upstream)
        self._memo: dict[tuple[str, tuple[str, ...], int, str], _Reach] = {}
        self._busy: set[tuple[str, tuple[str, ...]]] = set()

    def judge(self, finding: Finding) -> Finding:
        """The finding with each caller judged; an error none of whose callers is live is a warning."""
        if not finding.callers:
            return finding
        own_name = finding.location.symbol.split(".", 1)[0]
        own = self._port.port_class(finding.location.path, own_name)
        judged = tuple(self.caller(c, own) for c in finding.callers)
        live = [c for c in judged if c.live]
        dead = [c for c in judged if c.live is False]
        shown = [*live[:3], *dead[:3]] if live else dead[:3]
        old = {str(c) for c in finding.callers}
        evidence = tuple(e for e in finding.evidence if e not in old) + tuple(map(str, shown))
        severity = finding.severity
        if finding.severity is Severity.ERROR and not live:
            severity = Severity.WARNING  # every upstream call that proves it is replaced on the port
            evidence += (f"no live caller: the {len(dead)} upstream call(s) passing it run only in code the port "
                         "replaces or overrides",)
        return replace(finding, severity=severity, evidence=evidence, callers=judged)

    def caller(self, caller: UpstreamCaller, own: _PortClass | None) -> UpstreamCaller:
        scope = tuple(caller.function.split(".")) if caller.function else ()
        in_class = len(scope) >= 2 or (len(scope) == 1 and self._is_class(caller.path, scope[0]))
        reach = self._reach(caller.path, scope, in_class, 0, own)
        return replace(caller, live=reach.live, why=reach.why)

    def _is_class(self, rel: str, name: str) -> bool:
        return self._upstream.find(module_name(rel), name) is not None

    def _reach(self, rel: str, scope: tuple[str, ...], in_class: bool, depth: int, own: _PortClass | None) -> _Reach:
        if not scope:
            return _Reach(True, "")  # module-level code runs on import
        key = (rel, scope, depth, own.name if own else "")
        if key in self._memo:
            return self._memo[key]
        if (rel, scope) in self._busy:
            return _Reach(False, "a cycle")
        self._busy.add((rel, scope))
        try:
            found = self._reach_uncached(rel, scope, in_class, depth, own)
        finally:
            self._busy.discard((rel, scope))
        self._memo[key] = found
        return found

    def _reach_uncached(self, rel: str, scope: tuple[str, ...], in_class: bool, depth: int,
                        own: _PortClass | None) -> _Reach:
        module = module_name(rel)
        qual = ".".join(scope)
        if in_class and len(scope) == 1:
            return _Reach(True, "")  # a class body runs on import
        patched = self._port.replaced(f"{module}.{qual}")
        if patched is not None:
            return _Reach(False, f"the port replaces {module}.{qual} ({patched[0]}:{patched[1]})")
        called = scope[-1]
        if in_class:
            cls, method = scope[0], scope[1]
            if method in _CONSTRUCTORS:
                called = cls  # who builds the class runs its constructor
            else:
                overridden = self._overridden(rel, cls, method, own)
                if overridden:
                    return _Reach(False, overridden)
        by_port = self._port.calls(called)
        if by_port is not None:
            return _Reach(True, f"which the port calls at {by_port[0]}:{by_port[1]}" if depth else
                          f"in {qual}, which the port calls at {by_port[0]}:{by_port[1]}")
        if depth >= _MAX_DEPTH:
            return _Reach(True, f"in {qual} (its callers are not followed further)")
        by_attribute = in_class and called[:1].islower()  # a method is called through an attribute only
        callers = [(r, s) for r, s in self._calls.sites(called, bare=not by_attribute)
                   if not (r == rel and s.scope[:len(scope)] == scope)]
        if not callers or len(callers) > _MAX_CALLERS:
            return _Reach(True, f"in {qual}" if depth == 0 else "")
        reasons: list[str] = []
        for r, site in callers:
            up = self._reach(r, site.scope, site.in_class, depth + 1, own)
            where = f"{r}:{site.line} {site.function or '(module level)'}"
            if up.live:
                chain = f"{where}" + (f", {up.why}" if up.why else "")
                return _Reach(True, f"in {qual}, reached from {chain}" if depth == 0 else f"from {chain}")
            reasons.append(f"{where}: {up.why}" if depth == 0 else where)
        shown = "; ".join(reasons[:3]) + (f"; {len(reasons) - 3} more" if len(reasons) > 3 else "")
        return _Reach(False, f"{qual} is called only from code the port replaces or overrides ({shown})")

    def _overridden(self, rel: str, cls: str, method: str, own: _PortClass | None) -> str:
        """Why `cls.method` (upstream) never runs on the port: "" when some port class still runs it or
        no port class derives from `cls` (upstream builds it itself). Where the port derives from a class it takes
        the port's classes to be the ones that run (a runner, a worker, a backend the platform selects); a class
        upstream also builds itself beside the port's subclass is not told apart: the finding then stays a warning,
        with the override as its evidence, never info."""
        target = self._upstream.find(module_name(rel), cls)
        if target is None:
            return ""
        if own is not None and self._derives(own, target.path, cls, 0):
            defined = self._defines(own, method, target.path, cls, 0)
            return f"{own.name} runs its own {method} ({defined})" if defined else ""
        leaves = self._derived(target.path, cls)
        if not leaves:
            return ""
        overrides: dict[str, list[str]] = {}  # the port definition -> the classes the port builds that run it
        for leaf in leaves:
            defined = self._defines(leaf, method, target.path, cls, 0)
            if not defined:
                return ""  # this port class runs upstream's method
            overrides.setdefault(defined, []).append(leaf.name)
        shown = ", ".join(f"{where}, run by {', '.join(sorted(names))}" for where, names in sorted(overrides.items())[:3])
        return f"every port class derived from {cls} runs the port's own {method} ({shown})"

    def _derived(self, up_path: str, cls: str) -> list[_PortClass]:
        """Port classes deriving from the upstream class, directly or through port classes, that no port
        class derives from in turn (the ones the port builds)."""
        out: list[_PortClass] = []
        todo = [c for c in self._port.classes_naming(cls) if self._names_upstream(c, up_path, cls)]
        seen: set[tuple[str, str]] = set()
        while todo and len(seen) < 64:
            c = todo.pop()
            if (c.path, c.name) in seen:
                continue
            seen.add((c.path, c.name))
            subs = [s for s in self._port.classes_naming(c.name)
                    if any(self._port.module_file(m) == c.path and n == c.name for m, n in s.bases)]
            if subs:
                todo.extend(subs)
            else:
                out.append(c)
        return out

    def _names_upstream(self, c: _PortClass, up_path: str, cls: str) -> bool:
        for module, name in c.bases:
            found = self._upstream.find(module, name)
            if found is not None and found.path == up_path and found.node.name == cls:
                return True
        return False

    def _derives(self, c: _PortClass, up_path: str, cls: str, hops: int) -> bool:
        if hops > 6:
            return False
        if self._names_upstream(c, up_path, cls):
            return True
        return any(self._derives(p, up_path, cls, hops + 1) for p in self._port_bases(c))

    def _port_bases(self, c: _PortClass) -> list[_PortClass]:
        out = []
        for module, name in c.bases:
            path = self._port.module_file(module)
            base = self._port.port_class(path, name) if path is not None else None
            if base is not None:
                out.append(base)
        return out

    def _defines(self, c: _PortClass, method: str, up_path: str, cls: str, hops: int) -> str:
        """"path:line" of the port definition of `method` that `c` runs instead of upstream `cls`'s, or ""."""
        if method in c.methods:
            return "" if c.calls_super(method) else f"{c.name}.{method} at {c.path}:{c.methods[method].lineno}"
        if hops > 6:
            return ""
        for base in self._port_bases(c):
            if self._derives(base, up_path, cls, 0) or self._names_upstream(base, up_path, cls):
                return self._defines(base, method, up_path, cls, hops + 1)
        return ""


def judge_callers(findings: list[Finding], root: Path, package: str, upstream_root: Path | None,
                  upstream_package: str, refs: _PortRefs | None = None, max_bytes: int = 2_000_000) -> list[Finding]:
    """Each override finding with its upstream callers judged for liveness on the port."""
    if upstream_root is None or not any(f.callers for f in findings):
        return findings
    view = PortView(root, package, refs or _PortRefs(root, package), max_bytes)
    judge = CallerLiveness(view, UpstreamClasses(upstream_root, upstream_package))
    return [judge.judge(f) if f.callers else f for f in findings]
