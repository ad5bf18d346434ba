# The parameters of an op registered from C++ (torch.ops.<ns>.X), read from its package's Python
# sources: the documented schema and the meta (fake) kernel registration.
from __future__ import annotations

import ast
import contextlib
import re
from pathlib import Path
from typing import Any

from .signatures import _fact, _split_top
from .static import _package_dirs, _parse, _static_params

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
    documented, meta, info = _schema_sources(package, name, static_roots)
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
    if documented is not None:
        sig, path, line = documented[0], documented[2], documented[3]
    else:
        assert meta is not None  # one of the two was found
        sig, path, line = f"{name}({ast.unparse(meta[0].args)})", meta[1], meta[0].lineno
    return _fact(target, "no-signature", "static", signature=sig, sourcefile=str(path), line=line,
                 doc=doc, error=f"{why}; calls are not judged against it", **info)


_Documented = tuple[str, list[dict[str, Any]], Path, int]  # signature, parameters, file, line


def _schema_sources(package: str, name: str, static_roots: list[str]
                    ) -> tuple[_Documented | None, tuple[ast.FunctionDef, Path] | None, dict[str, str]]:
    """The first documented schema and the first meta registration of `name` in `package`'s
    sources (either may be None), and the wheel's name and version."""
    call = re.compile(r"(?<![\w])(?:" + re.escape(package) + r"\.)?" + re.escape(name) + r"\(")
    documented: _Documented | None = None
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
    return documented, meta, info


def _documented_schema(text: str, call: re.Pattern[str], name: str, path: Path) -> _Documented | None:
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
