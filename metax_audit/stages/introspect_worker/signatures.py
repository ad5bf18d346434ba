# The fact record every answer of the worker is, and the readers of a signature: inspect's, a
# pybind11 docstring's, and the names a function reads out of its **kwargs.
from __future__ import annotations

import ast
import textwrap
import traceback
from pathlib import Path
from typing import Any

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
    return str(p.kind.name)


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
