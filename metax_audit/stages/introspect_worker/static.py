# A target read from source without importing anything of its package (the port under review,
# a package that does not import here): definitions, re-export chains and class bodies.
from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from .signatures import _DOC_LINES, _TRANSPARENT_DECORATORS, _fact, _render, _short_error, kwargs_usage

# ---------------------------------------------------------------- static fallback


def _package_dirs(top: str, static_roots: list[str]) -> list[Path]:
    """Where the package's source lives, found without executing it (find_spec of the top level)."""
    dirs = [Path(r) for r in static_roots]
    try:
        import importlib.util

        spec = importlib.util.find_spec(top)  # a top-level find_spec runs no package code
        if spec is not None:
            if spec.submodule_search_locations:
                dirs.extend(Path(p).parent for p in spec.submodule_search_locations)
            elif spec.origin and spec.origin.endswith(".py"):
                dirs.append(Path(spec.origin).parent)
    except BaseException:
        pass
    return dirs


def _sdist_info(root: Path) -> dict[str, str]:
    """Name and version from an unpacked sdist's PKG-INFO, when the static root is one."""
    try:
        text = (root / "PKG-INFO").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    info: dict[str, str] = {}
    for line in text.splitlines()[:20]:
        key, _, value = line.partition(": ")
        if key == "Name":
            info["distribution"] = value.strip()
        elif key == "Version":
            info["version"] = value.strip()
    return info


def _module_file(root: Path, parts: list[str]) -> Path | None:
    base = root.joinpath(*parts)
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand
    return None


_TREES: dict[tuple[str, int, int], ast.Module | None] = {}  # (path, mtime, size) -> its parse, read-only


def _parse(path: Path) -> ast.Module | None:
    """The file's tree, parsed once per process while it is unchanged: the targets of one module were
    each parsing it again (a worker reads tens of targets from a handful of files). Only read."""
    try:
        st = path.stat()
    except OSError:
        st = None
    key = (str(path), st.st_mtime_ns, st.st_size) if st is not None else None
    if key is not None and key in _TREES:
        return _TREES[key]
    try:
        tree: ast.Module | None = ast.parse(path.read_text(encoding="utf-8", errors="replace"), filename=str(path))
    except SyntaxError:
        tree = None
    if key is not None:
        if len(_TREES) >= 256:  # a bound on the memory it holds: the oldest goes
            _TREES.pop(next(iter(_TREES)))
        _TREES[key] = tree
    return tree


def _static_params(fn: ast.FunctionDef | ast.AsyncFunctionDef, drop_first: bool) -> list[dict[str, Any]]:
    a = fn.args
    positional = [*a.posonlyargs, *a.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    params = []
    for i, arg in enumerate(positional):
        kind = "POSITIONAL_ONLY" if i < len(a.posonlyargs) else "POSITIONAL_OR_KEYWORD"
        d = defaults[i]
        params.append({"name": arg.arg, "kind": kind, "default": ast.unparse(d) if d is not None else None})
    if a.vararg:
        params.append({"name": a.vararg.arg, "kind": "VAR_POSITIONAL", "default": None})
    for arg, d in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        params.append({"name": arg.arg, "kind": "KEYWORD_ONLY", "default": ast.unparse(d) if d is not None else None})
    if a.kwarg:
        params.append({"name": a.kwarg.arg, "kind": "VAR_KEYWORD", "default": None})
    if drop_first and params and params[0]["kind"] != "VAR_POSITIONAL":
        params = params[1:]
    return params


def _decorator_names(fn: ast.AST) -> list[str]:
    out = []
    for d in getattr(fn, "decorator_list", []):
        node = d.func if isinstance(d, ast.Call) else d
        out.append(ast.unparse(node))
    return out


def _find_def(body: list[ast.stmt], name: str) -> ast.AST | None:
    """The last top-level definition of `name` that is not an @overload stub (runtime wins)."""
    found: ast.AST | None = None
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
            if any(d.endswith("overload") for d in _decorator_names(node)):
                found = found or node
                continue
            found = node
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                found = node
        elif isinstance(node, ast.ImportFrom | ast.Import):
            for alias in node.names:
                if (alias.asname or alias.name.split(".")[0]) == name:
                    found = node
        elif isinstance(node, ast.If | ast.Try):
            inner = [*node.body, *getattr(node, "orelse", []), *[s for h in getattr(node, "handlers", []) for s in h.body]]
            sub = _find_def(inner, name)
            if sub is not None:
                found = sub
    return found


class NeedsInterpreter(Exception):
    """Raised instead of searching the interpreter's path (`offline` reads): a re-export chain left
    the package for one that is looked up there too."""


def port_target(target: str, static_roots: list[str], *, offline: bool = False) -> dict[str, Any]:
    """The fact of a target of the port under review: read from the static roots only, never
    imported (a failure is a "crash" fact); a followed re-export is named by `defined_as`. With
    `offline`, NeedsInterpreter is raised where the read would search the interpreter's path
    (the parent reads the port in its own process only when this interpreter is its own)."""
    try:
        fact = static_target(target, static_roots, search_path=False, offline=offline)
    except NeedsInterpreter:
        raise
    except BaseException as exc:  # keep going: one broken target is one fact
        fact = _fact(target, "crash", error=_short_error(exc))
    if fact.get("target") != target:  # a static read followed a re-export
        fact["defined_as"], fact["target"] = fact.get("target"), target
    return fact


def static_target(target: str, static_roots: list[str], _depth: int = 0, *, search_path: bool = True,
                  offline: bool = False) -> dict[str, Any]:
    """Read the target's signature from source without importing anything of the package."""
    if search_path and offline:
        raise NeedsInterpreter(target)
    parts = target.split(".")
    roots = _package_dirs(parts[0], static_roots) if search_path else [Path(r) for r in static_roots]
    for root in roots:
        for i in range(len(parts), 0, -1):
            path = _module_file(root, parts[:i])
            if path is None:
                continue
            tree = _parse(path)
            if tree is None:
                return _fact(target, "no-signature", "static", sourcefile=str(path), error="source does not parse")
            fact = _static_walk(target, parts, i, path, tree, static_roots, _depth, search_path, offline)
            fact.update({k: v for k, v in _sdist_info(root).items() if k not in fact})
            return fact
    return _fact(target, "import-error", "static", error=f"no source found for {parts[0]} (searched {len(static_roots)} static root(s) and the interpreter's path)")


def _static_walk(target: str, parts: list[str], used: int, path: Path, tree: ast.Module,
                 static_roots: list[str], depth: int, search_path: bool = True, offline: bool = False) -> dict[str, Any]:
    rest = parts[used:]
    if not rest:
        return _fact(target, "ok", "static", kind="module", sourcefile=str(path))
    node = _find_def(tree.body, rest[0])
    if node is None:
        has_star = any(isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names) for n in tree.body)
        dyn = any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body)
        note = " (the module has star imports or __getattr__; a dynamic export is possible)" if has_star or dyn else ""
        return _fact(target, "not-found", "static", sourcefile=str(path),
                     error=f"{'.'.join(parts[:used + 1])} is not defined in {path.name}{note}")
    if isinstance(node, ast.ImportFrom | ast.Import):
        if depth > 5:
            return _fact(target, "no-signature", "static", sourcefile=str(path), error="re-export chain too deep")
        origin = _import_origin(node, rest[0], parts[:used], path)
        if origin is not None:
            return static_target(".".join([origin, *rest[1:]]), static_roots, depth + 1,
                                 search_path=origin.split(".")[0] != parts[0] or search_path, offline=offline)
    if isinstance(node, ast.Assign | ast.AnnAssign):
        return _fact(target, "no-signature", "static", sourcefile=str(path), line=node.lineno,
                     error=f"assigned at module level: {ast.unparse(node)[:200]}")
    owner_is_class = False
    for name in rest[1:]:
        if not isinstance(node, ast.ClassDef):
            return _fact(target, "not-found", "static", sourcefile=str(path), error=f"{name} is looked up on a non-class")
        owner_is_class = True
        sub = _find_def(node.body, name)
        if sub is None:
            bases = ", ".join(ast.unparse(b) for b in node.bases)
            note = f" (it may be inherited from {bases})" if bases else ""
            return _fact(target, "not-found", "static", sourcefile=str(path),
                         error=f"{node.name}.{name} is not defined in {path.name}{note}")
        node = sub
    return _definition_fact(target, node, path, owner_is_class)


def _import_origin(node: ast.Import | ast.ImportFrom, name: str, module: list[str], path: Path) -> str | None:
    """The dotted name `name` is bound to by an import statement of `module` (read from `path`)."""
    for alias in node.names:
        if (alias.asname or alias.name.split(".")[0]) != name:
            continue
        if isinstance(node, ast.Import):
            return alias.name
        base = node.module or ""
        if node.level:
            pkg = module[: len(module) - (0 if path.name == "__init__.py" else 1)]
            pkg = pkg[: len(pkg) - (node.level - 1)] if node.level > 1 else pkg
            base = ".".join([*pkg, base] if base else pkg)
        return f"{base}.{alias.name}"
    return None


def _definition_fact(target: str, node: ast.AST, path: Path, owner_is_class: bool) -> dict[str, Any]:
    """The fact of a function or class definition found in source: its written signature (a class's
    __init__ less self), docstring, **kwargs reads, and a note when a decorator may change it."""
    bound = False
    doc = ast.get_docstring(node) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) else None
    kw: dict[str, Any] = {"sourcefile": str(path), "line": getattr(node, "lineno", None)}
    if doc:
        kw["doc"] = "\n".join(doc.strip().splitlines()[:_DOC_LINES])
    if isinstance(node, ast.ClassDef):
        init = _find_def(node.body, "__init__")
        if not isinstance(init, ast.FunctionDef):
            return _fact(target, "no-signature", "static", error=f"class {node.name} defines no __init__ in its own body", **kw)
        fn: ast.FunctionDef | ast.AsyncFunctionDef = init
        bound = True
    elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        fn = node
        decos = _decorator_names(fn)
        bound = owner_is_class and "staticmethod" not in decos
        opaque = [d for d in decos if d not in _TRANSPARENT_DECORATORS and not d.endswith(".setter")]
        if opaque:
            kw["error"] = f"decorated with {', '.join(opaque)}: the runtime signature may differ from the written one"
    else:
        return _fact(target, "no-signature", "static", error=f"unsupported definition {type(node).__name__}", **kw)
    params = _static_params(fn, bound)
    kw["params"] = params
    kw["signature"] = _render(params)
    usage = kwargs_usage(fn)
    if usage is not None:
        kw["kwargs_reads"], kw["kwargs_forwarded"] = usage
    return _fact(target, "ok", "static", **kw)
