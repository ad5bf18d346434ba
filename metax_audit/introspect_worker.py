# Standalone introspection worker, run with the *target* interpreter: imports each dotted target
# and prints what is installed (signature, source, docs, dist/wheel) as JSON lines. Stdlib only.
#
# Protocol: a JSON request on stdin {"targets": [...], "extra_path": [...], "static_roots": [...],
# "static_only": bool}; stdout gets one JSON object per line: {"event": "start", "target": t}
# before each target (so a hang or crash is attributable), {"event": "fact", ...} after it, and a
# final {"event": "done", ...}. Every failure is a value; nothing here raises out of main().
# A first line {"preload": [packages], "extra_path": [...]} may come ahead of the request: the
# worker imports those while the parent is still working out the targets.
from __future__ import annotations

import ast
import contextlib
import json
import os
import platform
import re
import socket
import sys
import textwrap
import time
import traceback
from pathlib import Path
from typing import Any

sys.dont_write_bytecode = True  # also passed as -B; the worker never writes where it reads

# The port under review is never imported here: FENCE_ENV names its top-level packages (JSON list).
FENCE_ENV = "METAX_AUDIT_NEVER_IMPORT"


class Fence:
    """A meta-path finder, first in line, that refuses the port under review: its packages by name,
    and any module whose file lies in the checkout an (editable) install of it points at (a repo
    `sitecustomize.py`, `torch.py`, `json.py`). The parent starts us with -S and enter_site() runs
    site only once the fence stands, so .pth files and sitecustomize meet it too."""

    def __init__(self, names: list[str]) -> None:
        self.names = set(names)
        self._roots: tuple[tuple[str, ...], list[str]] | None = None  # (sys.path it was found on, roots)

    def _others(self) -> list[Any]:
        return [f for f in sys.meta_path if f is not self and hasattr(f, "find_spec")]

    def roots(self) -> list[str]:
        key = tuple(sys.path)  # site adds .pth paths (and finders) after the fence stands: look again
        if self._roots is None or self._roots[0] != key:
            found: list[str] = []
            for name in sorted(self.names):
                for finder in self._others():
                    try:
                        spec = finder.find_spec(name, None)
                    except Exception:
                        spec = None
                    locs = list(getattr(spec, "submodule_search_locations", None) or []) if spec else []
                    for loc in locs:
                        parent = os.path.dirname(os.path.abspath(loc))
                        # a checkout (editable install): the whole tree; site-packages: the package only
                        site_dir = os.path.basename(parent) in ("site-packages", "dist-packages")
                        found.append(os.path.abspath(loc) if site_dir else parent)
                    if spec is not None:
                        break
            self._roots = (key, found)
        return self._roots[1]

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"{name} is the port under review: metax-audit never imports it", name=name)
        if "." in name or not self.names:
            return None  # a submodule's package already passed the check
        roots = self.roots()
        if not roots:
            return None
        for finder in self._others():
            try:
                spec = finder.find_spec(name, path, target)
            except Exception:
                return None
            if spec is None:
                continue
            origin = os.path.abspath(spec.origin) if getattr(spec, "origin", None) and os.path.isabs(str(spec.origin)) else ""
            if any(origin == r or origin.startswith(r + os.sep) for r in roots):
                raise ModuleNotFoundError(f"{name} comes from the port's checkout ({origin}): metax-audit never imports it",
                                          name=name)
            return None
        return None


def enter_site(extra: tuple[str, ...] = ()) -> None:
    """Stand the fence (FENCE_ENV, plus `extra` names), then run site if the parent started us with
    -S for that."""
    try:
        names = [str(n) for n in json.loads(os.environ.get(FENCE_ENV) or "[]")] + list(extra)
    except ValueError:
        names = list(extra)
    if names and not any(isinstance(f, Fence) for f in sys.meta_path):
        sys.meta_path.insert(0, Fence(names))
    if sys.flags.no_site and os.environ.get(FENCE_ENV) is not None and "site" not in sys.modules:
        import site

        site.main()

_DOC_LINES = 6
# Decorators that leave the written signature intact, so a statically read one is still right.
_TRANSPARENT_DECORATORS = {"staticmethod", "classmethod", "property", "overload", "override", "wraps",
                           "lru_cache", "cache", "functools.wraps", "functools.lru_cache", "functools.cache",
                           "typing.overload", "typing_extensions.override", "torch.no_grad", "torch.inference_mode"}


def _fact(target: str, status: str, source: str = "import", **kw: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"target": target, "status": status, "source": source}
    out.update({k: v for k, v in kw.items() if v is not None})
    return out


def _short_error(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" (at {Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""
    return f"{type(exc).__name__}: {exc}{where}"[:2000]


# ---------------------------------------------------------------- signatures


def _param_kind_of(p: Any) -> str:
    return p.kind.name


def _params_from_signature(sig: Any) -> list[dict[str, Any]]:
    out = []
    for p in sig.parameters.values():
        default = None if p.default is p.empty else _safe_repr(p.default)
        out.append({"name": p.name, "kind": _param_kind_of(p), "default": default})
    return out


def _safe_repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:  # a broken __repr__ in the audited package must not stop us
        text = f"<{type(value).__name__}>"
    return text[:200]


def _split_top(text: str) -> list[str]:
    """Split on commas that are not nested in brackets (pybind docstring parameter lists)."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def pybind_signature(name: str, doc: str | None) -> tuple[str, list[dict[str, Any]]] | None:
    """pybind11 writes `name(arg0: int, x: float = 1.0) -> T` as the first docstring line."""
    if not doc:
        return None
    for line in doc.strip().splitlines():
        line = line.strip()
        if line.startswith("1. "):  # "Overloaded function." lists numbered alternatives
            line = line[3:]
        if not line.startswith(name + "("):
            continue
        depth, end = 0, -1
        for i, ch in enumerate(line[len(name):], start=len(name)):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                end = i
                break
        if end < 0:
            return None
        params = []
        for raw in _split_top(line[len(name) + 1:end]):
            if raw in ("*", "/"):
                continue
            pname, _, rest = raw.partition(":")
            default = rest.partition("=")[2].strip() or None if "=" in raw else None
            if "=" in pname:
                pname, _, default = pname.partition("=")
            pname = pname.strip()
            kind = "VAR_POSITIONAL" if pname.startswith("*") and not pname.startswith("**") else (
                "VAR_KEYWORD" if pname.startswith("**") else "POSITIONAL_OR_KEYWORD")
            pname = pname.lstrip("*")
            if pname == "self":
                continue
            # pybind11 names unnamed arguments argN; they cannot be passed by keyword
            if pname.startswith("arg") and pname[3:].isdigit() and kind == "POSITIONAL_OR_KEYWORD":
                kind = "POSITIONAL_ONLY"
            params.append({"name": pname, "kind": kind, "default": default.strip() if default else None})
        return line[len(name):], params  # "(...) -> T", like inspect's rendering
    return None


def _render(params: list[dict[str, Any]]) -> str:
    parts: list[str] = []
    saw_star = False
    for i, p in enumerate(params):
        kind = p["kind"]
        if kind == "KEYWORD_ONLY" and not saw_star:
            parts.append("*")
            saw_star = True
        if kind == "VAR_POSITIONAL":
            saw_star = True
            text = "*" + p["name"]
        elif kind == "VAR_KEYWORD":
            text = "**" + p["name"]
        else:
            text = p["name"] + (f"={p['default']}" if p.get("default") is not None else "")
        parts.append(text)
        nxt = params[i + 1]["kind"] if i + 1 < len(params) else None
        if kind == "POSITIONAL_ONLY" and nxt != "POSITIONAL_ONLY":
            parts.append("/")
    return "(" + ", ".join(parts) + ")"


# ---------------------------------------------------------------- **kwargs reads (ast)


def kwargs_usage(func_node: ast.AST) -> tuple[list[str], bool] | None:
    """Names a function reads out of its **kwargs and whether it forwards the dict; None without one."""
    args = getattr(func_node, "args", None)
    if args is None or args.kwarg is None:
        return None
    kw = args.kwarg.arg
    reads: list[str] = []
    forwarded = False

    def is_kw(node: ast.AST) -> bool:
        return isinstance(node, ast.Name) and node.id == kw

    for node in ast.walk(func_node):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and is_kw(f.value):
                if f.attr in {"get", "pop", "setdefault"} and node.args and isinstance(node.args[0], ast.Constant):
                    reads.append(str(node.args[0].value))
                elif f.attr in {"items", "keys", "values", "copy", "update"}:
                    forwarded = True  # iterated or merged: every name may be used
            for k in node.keywords:
                if k.arg is None and is_kw(k.value):
                    forwarded = True
            if any(is_kw(a) for a in node.args):
                forwarded = True  # handed whole to another callable
        elif isinstance(node, ast.Subscript) and is_kw(node.value) and isinstance(node.slice, ast.Constant):
            reads.append(str(node.slice.value))
        elif isinstance(node, ast.Compare) and any(is_kw(c) for c in node.comparators):
            if isinstance(node.left, ast.Constant) and any(isinstance(o, ast.In | ast.NotIn) for o in node.ops):
                reads.append(str(node.left.value))
        elif isinstance(node, ast.Dict) and any(k is None and is_kw(v) for k, v in zip(node.keys, node.values, strict=True)):
            forwarded = True
    return sorted(set(reads)), forwarded


def _kwargs_from_object(obj: Any) -> tuple[list[str], bool] | None:
    import inspect

    try:
        src = textwrap.dedent(inspect.getsource(obj))
        tree = ast.parse(src)
    except Exception:
        return None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            return kwargs_usage(node)
    return None


# ---------------------------------------------------------------- distributions


def _dist_info(module_name: str, cache: dict[str, dict[str, str]]) -> tuple[str | None, dict[str, str] | None]:
    try:
        from importlib import metadata

        top = module_name.split(".")[0]
        names = metadata.packages_distributions().get(top) or []
        if not names:
            return None, None
        name = names[0]
        if name not in cache:
            dist = metadata.distribution(name)
            info = {"version": dist.version or ""}
            wheel = dist.read_text("WHEEL") or ""
            tags = [ln.split(":", 1)[1].strip() for ln in wheel.splitlines() if ln.startswith("Tag:")]
            if tags:
                info["wheel_tag"] = ",".join(tags)
            if "+" in info["version"]:
                info["local_version"] = info["version"].split("+", 1)[1]
            direct = dist.read_text("direct_url.json")
            if direct:
                info["direct_url"] = direct.strip()[:300]
            cache[name] = info
        return name, cache[name]
    except Exception:
        return None, None


# ---------------------------------------------------------------- import resolution


def _import_longest(parts: list[str]) -> tuple[Any, int, str | None]:
    """Import the longest importable module prefix; (module, parts used, error) - error when it raised."""
    import importlib

    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        try:
            return importlib.import_module(name), i, None
        except ModuleNotFoundError as exc:
            # Only "this very prefix does not exist" lets us try a shorter one; a missing
            # dependency inside the package is an import error of the package.
            if exc.name is not None and (exc.name == name or name.startswith(exc.name + ".")) and i > 1:
                continue
            return None, i, _short_error(exc)
        except BaseException as exc:  # the audited package may raise anything, even SystemExit
            return None, i, _short_error(exc)
    return None, 0, f"no importable prefix of {'.'.join(parts)}"


def _torch_op_fact(target: str) -> dict[str, Any]:
    parts = target.split(".")
    try:
        import torch

        obj: Any = torch.ops
        for p in parts[2:]:
            obj = getattr(obj, p)
    except BaseException as exc:
        return _fact(target, "not-found", error=_short_error(exc))
    schemas = []
    params: list[dict[str, Any]] | None = None
    try:
        overloads = obj.overloads() if hasattr(obj, "overloads") else []
        packets = [getattr(obj, ov) for ov in overloads] or [obj]
        for pk in packets:
            schema = getattr(pk, "_schema", None)
            if schema is None:
                continue
            schemas.append(str(schema))
            if params is None:
                params = [{"name": a.name, "kind": "KEYWORD_ONLY" if a.kwarg_only else "POSITIONAL_OR_KEYWORD",
                           "default": None if a.default_value is None and not a.has_default_value() else _safe_repr(a.default_value)}
                          for a in schema.arguments]
    except BaseException as exc:
        return _fact(target, "no-signature", error=_short_error(exc))
    if not schemas:
        return _fact(target, "no-signature", error="torch op without a schema")
    return _fact(target, "ok", signature=" | ".join(schemas), params=params, doc=None)


def introspect_target(target: str, dist_cache: dict[str, dict[str, str]]) -> dict[str, Any]:
    import inspect

    if target.startswith("torch.ops."):
        return _torch_op_fact(target)
    parts = target.split(".")
    module, used, error = _import_longest(parts)
    if module is None:
        return _fact(target, "import-error", error=error)
    obj: Any = module
    owner: Any = None
    for i, name in enumerate(parts[used:]):
        owner = obj
        try:
            obj = inspect.getattr_static(obj, name) if inspect.isclass(obj) else getattr(obj, name)
        except AttributeError:
            try:
                obj = getattr(owner, name)
            except BaseException:
                missing = ".".join(parts[: used + i + 1])
                return _fact(target, "not-found", error=f"{missing} does not exist in {'.'.join(parts[: used + i])}",
                             sourcefile=_sourcefile(owner), **_dist_kw(module.__name__, dist_cache))
        except BaseException as exc:
            return _fact(target, "crash", error=_short_error(exc))
    return _describe(target, obj, owner, module.__name__, dist_cache)


def _dist_kw(module_name: str, cache: dict[str, dict[str, str]]) -> dict[str, Any]:
    name, info = _dist_info(module_name, cache)
    if not name or not info:
        return {}
    return {"distribution": name, "version": info.get("version"), "wheel_tag": info.get("wheel_tag")}


def _sourcefile(obj: Any) -> str | None:
    import inspect

    try:
        return inspect.getsourcefile(obj)
    except Exception:
        return None


def _describe(target: str, obj: Any, owner: Any, module_name: str, dist_cache: dict[str, dict[str, str]]) -> dict[str, Any]:
    import functools
    import inspect

    bound_method = False
    if inspect.isclass(owner):
        if isinstance(obj, staticmethod):
            obj = obj.__func__
        elif isinstance(obj, classmethod):
            obj, bound_method = obj.__func__, True
        elif isinstance(obj, property):
            obj = obj.fget
        elif inspect.isfunction(obj) or inspect.ismethoddescriptor(obj):
            bound_method = True  # called through an instance: `self` is not passed by the caller
    kw: dict[str, Any] = _dist_kw(module_name, dist_cache)
    inner = obj
    while isinstance(inner, functools.partial):
        inner = inner.func
    with contextlib.suppress(Exception):
        inner = inspect.unwrap(inner)
    if inspect.isclass(inner):
        init = getattr(inner, "__init__", None)
        inner_code = init if init is not None and init is not object.__init__ else inner
    else:
        inner_code = inner
    kw["sourcefile"] = _sourcefile(inner)
    with contextlib.suppress(Exception):
        kw["line"] = inspect.getsourcelines(inner)[1]
    doc = inspect.getdoc(obj) or (inspect.getdoc(inner) if inner is not obj else None)
    if doc and not (inspect.ismodule(obj)):
        kw["doc"] = "\n".join(doc.strip().splitlines()[:_DOC_LINES])
    if inspect.ismodule(obj):
        return _fact(target, "ok", kind="module", **kw)
    try:
        sig = inspect.signature(obj)  # follows __wrapped__ and applies functools.partial
        params = _params_from_signature(sig)
        if bound_method and params and params[0]["kind"] in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD"):
            params = params[1:]
        kw["signature"] = _render(params)
        kw["params"] = params
    except (ValueError, TypeError) as exc:
        name = getattr(obj, "__name__", target.rsplit(".", 1)[-1])
        parsed = pybind_signature(name, getattr(obj, "__doc__", None))
        if parsed is None and inspect.isclass(obj):  # pybind11 classes document __init__ instead
            parsed = pybind_signature("__init__", getattr(getattr(obj, "__init__", None), "__doc__", None))
        if parsed is None:
            return _fact(target, "no-signature", error=_short_error(exc), **kw)
        kw["signature"], kw["params"] = parsed[0], parsed[1]
        kw["signature_from"] = "pybind-docstring"
    if inner is not obj or isinstance(obj, functools.partial):
        kw["wrapped"] = f"{getattr(inner, '__module__', '?')}.{getattr(inner, '__qualname__', '?')}"
    usage = _kwargs_from_object(inner_code)
    if usage is not None:
        kw["kwargs_reads"], kw["kwargs_forwarded"] = usage
    return _fact(target, "ok", **kw)


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


def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8", errors="replace"), filename=str(path))
    except SyntaxError:
        return None


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


def static_target(target: str, static_roots: list[str], _depth: int = 0, *, search_path: bool = True) -> dict[str, Any]:
    """Read the target's signature from source without importing anything of the package."""
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
            fact = _static_walk(target, parts, i, path, tree, static_roots, _depth, search_path)
            fact.update({k: v for k, v in _sdist_info(root).items() if k not in fact})
            return fact
    return _fact(target, "import-error", "static", error=f"no source found for {parts[0]} (searched {len(static_roots)} static root(s) and the interpreter's path)")


# Ops registered from C++ (torch.ops.<ns>.X, or `pkg.X` aliases of them) have no Python definition;
# their packages document the schema (`pkg.X(Tensor q, *, int n=1) -> Tensor`) in docstrings or stubs.
_SCHEMA_TYPE = re.compile(r"^(Tensor|SymInt|int|float|bool|str|Scalar|ScalarType|Device|Layout|MemoryFormat|"
                          r"Generator|Dimname|Storage|Stream|Any|bytes|complex|number)\b")


def _schema_params(text: str) -> list[dict[str, Any]] | None:
    params: list[dict[str, Any]] = []
    kind = "POSITIONAL_OR_KEYWORD"
    for raw in _split_top(text):
        if raw == "*":
            kind = "KEYWORD_ONLY"
            continue
        decl, _, default = raw.partition("=")
        words = decl.split()
        if len(words) == 1 and words[0].isidentifier() and words[0] not in {"None", "True", "False"}:
            name = words[0]  # an untyped entry (`pkg.op(self, acl_format) -> Tensor`): names only
        elif _SCHEMA_TYPE.match(raw) and len(words) > 1:
            name = words[-1]
        else:
            return None  # not a torch schema (a call in an example, prose)
        if not name.isidentifier():
            return None
        params.append({"name": name, "kind": kind, "default": default.strip() or None if default else None})
    return params


def _wheel_info(root: Path, package: str) -> dict[str, str]:
    """Name and version from an unpacked wheel's dist-info beside the package (a public wheel read
    statically), so the evidence names the build the schema came from."""
    want = package.replace("-", "_").lower()
    for meta in sorted(root.glob("*.dist-info/METADATA")):
        info = {}
        with contextlib.suppress(OSError):
            for line in meta.read_text(encoding="utf-8", errors="replace").splitlines()[:20]:
                key, _, value = line.partition(": ")
                if key == "Name":
                    info["distribution"] = value.strip()
                elif key == "Version":
                    info["version"] = value.strip()
        if info.get("distribution", "").replace("-", "_").lower() == want:
            return info
    return {}


_META_DECORATORS = frozenset({"impl", "register_fake", "register_meta", "impl_abstract"})


def _meta_registration(tree: ast.Module, name: str) -> ast.FunctionDef | None:
    """The function registered as the op's meta/fake kernel (`@impl(m, "NAME")`,
    `@torch.library.impl(lib, "NAME", "Meta")`, `@register_fake("ns::NAME")`): torch binds it with
    the op's own arguments, so its parameters are the schema's."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef):
            continue
        for dec in node.decorator_list:
            if not isinstance(dec, ast.Call) or ast.unparse(dec.func).rsplit(".", 1)[-1] not in _META_DECORATORS:
                continue
            for arg in dec.args[:2]:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.split("::")[-1] == name:
                    return node
    return None


def schema_fact(target: str, package: str, name: str, static_roots: list[str]) -> dict[str, Any] | None:
    """The op's parameters as `package`'s Python sources state them, or None when none does.

    Two sources, neither complete alone: the documented schema (`pkg.X(Tensor q, *, int n=1) -> T` in
    a docstring) names every parameter as the op does but can lag the op; the meta (fake) kernel
    registration is code torch runs with the op's own arguments, so its count of positional parameters
    and its keyword-only names are the op's, while its positional names are free (torch passes those
    positionally). A signature is given when both agree on the positional count (names from the
    schema, keyword-only parameters from the kernel); otherwise the fact is "no-signature" with what
    was found, so no call is judged on a guess."""
    call = re.compile(r"(?<![\w])(?:" + re.escape(package) + r"\.)?" + re.escape(name) + r"\(")
    documented: tuple[str, list[dict[str, Any]], Path, int] | None = None
    meta: tuple[ast.FunctionDef, Path] | None = None
    info: dict[str, str] = {}
    seen: set[Path] = set()
    for root in _package_dirs(package, static_roots):
        pkg = root / package
        if not pkg.is_dir() or pkg.resolve() in seen:
            continue
        seen.add(pkg.resolve())
        info = info or _wheel_info(root, package)
        for path in sorted(pkg.rglob("*.py")):
            if meta is not None and documented is not None:
                break
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            if name not in text:
                continue
            if meta is None and (f'"{name}"' in text or f"'{name}'" in text or f"::{name}" in text):
                tree = _parse(path)
                fn = _meta_registration(tree, name) if tree is not None else None
                meta = (fn, path) if fn is not None else None
            if documented is None:
                documented = _documented_schema(text, call, name, path)
    if meta is None and documented is None:
        return None
    where = []
    if documented is not None:
        where.append(f"schema documented in {documented[2].name}:{documented[3]}")
    if meta is not None:
        where.append(f"meta registration {meta[0].name} in {meta[1].name}:{meta[0].lineno}")
    doc = f"{'; '.join(where)} of {package} (C++-registered op)"
    kernel = _static_params(meta[0], drop_first=False) if meta is not None else None
    if documented is not None and kernel is not None:
        doc_pos = [p for p in documented[1] if p["kind"] != "KEYWORD_ONLY"]
        ker_pos = [p for p in kernel if p["kind"] in {"POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD"}]
        if len(doc_pos) == len(ker_pos):
            params = [{**k, "name": d["name"], "kind": "POSITIONAL_OR_KEYWORD"} for d, k in zip(doc_pos, ker_pos, strict=True)]
            params += [p for p in kernel if p["kind"] not in {"POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD"}]
            path, line = documented[2], documented[3]
            return _fact(target, "ok", "static", signature=documented[0], params=params, sourcefile=str(path),
                         line=line, doc=doc, **info)
        why = (f"the documented schema has {len(doc_pos)} positional parameters, the meta kernel "
               f"{len(ker_pos)}: one of them lags the op")
    elif documented is not None:
        why = "only a documented schema (documentation can lag the op)"
    else:
        why = "only a meta kernel, whose positional parameter names need not be the op's"
    sig = documented[0] if documented is not None else f"{name}({ast.unparse(meta[0].args)})" if meta else None
    path, line = (documented[2], documented[3]) if documented is not None else (meta[1], meta[0].lineno) if meta else (None, None)
    return _fact(target, "no-signature", "static", signature=sig, sourcefile=str(path) if path else None, line=line,
                 doc=doc, error=f"{why}; calls are not judged against it", **info)


def _documented_schema(text: str, call: re.Pattern[str], name: str, path: Path) -> tuple[str, list[dict[str, Any]], Path, int] | None:
    for m in call.finditer(text):
        depth, end = 1, -1
        for i in range(m.end(), min(len(text), m.end() + 8000)):
            depth += text[i] == "("
            depth -= text[i] == ")"
            if depth == 0:
                end = i
                break
        if end < 0:
            continue
        ret = re.match(r"\s*->\s*([^\n]+)", text[end + 1: end + 400])
        inner = " ".join(text[m.end():end].split())
        params = _schema_params(inner) if ret else None
        if params is None or ret is None:
            continue
        sig = f"{name}({', '.join(_split_top(inner))}) -> {ret.group(1).strip()}"
        return sig, params, path, text.count("\n", 0, m.start()) + 1
    return None


def _static_walk(target: str, parts: list[str], used: int, path: Path, tree: ast.Module,
                 static_roots: list[str], depth: int, search_path: bool = True) -> dict[str, Any]:
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
        for alias in node.names:
            if (alias.asname or alias.name.split(".")[0]) != rest[0]:
                continue
            if isinstance(node, ast.Import):
                origin = alias.name
            else:
                base = node.module or ""
                if node.level:
                    pkg = parts[: used - (0 if path.name == "__init__.py" else 1)]
                    pkg = pkg[: len(pkg) - (node.level - 1)] if node.level > 1 else pkg
                    base = ".".join([*pkg, base] if base else pkg)
                origin = f"{base}.{alias.name}"
            return static_target(".".join([origin, *rest[1:]]), static_roots, depth + 1,
                                 search_path=origin.split(".")[0] != parts[0] or search_path)
    if isinstance(node, ast.Assign | ast.AnnAssign):
        return _fact(target, "no-signature", "static", sourcefile=str(path), line=node.lineno,
                     error=f"assigned at module level: {ast.unparse(node)[:200]}")
    bound = False
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


# ---------------------------------------------------------------- main


def _preload(head: dict[str, Any], emit: Any) -> list[str]:
    """Import the kernel packages before the targets are known (the parent starts us early, so
    the seconds this takes overlap its static stages). A failure here is no fact: the target
    import that follows meets it again and reports it. {"event": "preload"} before each import
    tells the parent which package a hang or a crash happened in."""
    import importlib

    extra = [str(p) for p in head.get("extra_path") or []]
    for p in reversed(extra):
        sys.path.insert(0, p)
    for name in head.get("preload") or []:
        emit({"event": "preload", "module": name})
        with contextlib.suppress(BaseException):  # anything, even SystemExit: see above
            importlib.import_module(name)
    emit({"event": "preloaded"})
    return extra



def _op_provider(target: str, op_namespaces: dict[str, str]) -> tuple[str, str] | None:
    """(package, op name) for `torch.ops.<ns>.<op>` of a configured namespace, or `<package>.<op>`
    where the package provides one (torch_npu.npu_x aliases torch.ops.npu.npu_x)."""
    parts = target.split(".")
    if len(parts) == 4 and parts[:2] == ["torch", "ops"] and parts[2] in op_namespaces:
        return op_namespaces[parts[2]], parts[3]
    if len(parts) == 2 and parts[0] in set(op_namespaces.values()):
        return parts[0], parts[1]
    return None


def main() -> int:
    if sys.argv[1:] == ["--sys-path"]:  # what the stack cache keys on: the path as the worker sees it
        enter_site(("sitecustomize", "usercustomize"))  # nothing to import here: run no one's code
        print(json.dumps(sys.path))
        return 0
    enter_site()
    # Keep our JSON on the real stdout; anything the imported packages print goes to stderr.
    out_fd = os.dup(1)
    os.dup2(2, 1)
    out = os.fdopen(out_fd, "w", buffering=1)
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]

    def emit(obj: dict[str, Any]) -> None:
        out.write(json.dumps(obj, default=str) + "\n")
        out.flush()

    first = sys.stdin.readline()
    head: Any = None
    with contextlib.suppress(ValueError):
        head = json.loads(first)
    preloaded_path = None
    if isinstance(head, dict) and "preload" in head:
        preloaded_path = _preload(head, emit)
        first = ""
    try:
        request = json.loads(first + sys.stdin.read() or "{}")
    except ValueError as exc:
        emit({"event": "done", "error": f"bad request: {exc}"})
        return 2
    if request.get("extra_path") != preloaded_path:
        for p in reversed(request.get("extra_path") or []):
            sys.path.insert(0, p)
    static_roots = [str(p) for p in request.get("static_roots") or []]
    op_namespaces = {str(k): str(v) for k, v in (request.get("op_namespaces") or {}).items()}
    never_import = set(request.get("never_import") or [])
    dist_cache: dict[str, dict[str, str]] = {}
    for target in request.get("targets") or []:
        emit({"event": "start", "target": target})
        try:
            if target.split(".")[0] in never_import:
                # the port under review: read from the snapshot, never from an (editable) install
                fact = static_target(target, static_roots, search_path=False)
            elif request.get("static_only"):
                fact = static_target(target, static_roots)
                fact.update({k: v for k, v in _dist_kw(target.split(".")[0], dist_cache).items() if k not in fact})
            else:
                fact = introspect_target(target, dist_cache)
                provider = _op_provider(target, op_namespaces)
                if provider is not None and fact["status"] in {"import-error", "not-found"}:
                    # a C++-registered op whose library is not loaded here: its documented schema
                    schema = schema_fact(target, provider[0], provider[1], static_roots)
                    if schema is not None:
                        why = f"{fact.get('error')}; read statically" if fact.get("error") else "read statically"
                        schema["error"] = f"{why}: {schema['error']}" if schema.get("error") else why
                        schema.update({k: v for k, v in _dist_kw(provider[0], dist_cache).items() if k not in schema})
                        fact = schema
                if fact["status"] == "import-error":
                    static = static_target(target, static_roots)
                    static["error"] = f"import failed, read statically: {fact.get('error')}" + (
                        f"; {static['error']}" if static.get("error") else "")
                    if static["status"] != "import-error":
                        static.update({k: v for k, v in _dist_kw(target.split(".")[0], dist_cache).items() if k not in static})
                        fact = static
        except BaseException as exc:  # keep going: one broken target is one fact
            fact = _fact(target, "crash", error=_short_error(exc))
        if fact.get("target") != target:  # a static read followed a re-export
            fact["defined_as"], fact["target"] = fact.get("target"), target
        emit({"event": "fact", **fact})
    emit({
        "event": "done",
        "python": sys.executable,
        "python_version": platform.python_version(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "captured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "distributions": dist_cache,
        "torch_ops": _torch_ops(),
    })
    return 0


def _torch_ops() -> dict[str, list[str]] | None:
    """Every op the dispatcher knows once the targets are imported, by namespace (None without torch)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        names = torch._C._dispatch_get_all_op_names()
    except Exception:  # an old or stripped torch: the manifest simply has no op list
        return None
    out: dict[str, set[str]] = {}
    for qualified in names:
        ns, _, op = str(qualified).partition("::")
        out.setdefault(ns, set()).add(op.split(".")[0])
    return {ns: sorted(ops) for ns, ops in sorted(out.items())}


if __name__ == "__main__":
    sys.exit(main())
