# One parsed side of a comparison (port, upstream target or base release), what every file's comparison
# shares (_Env, _PortRefs), and small text and AST helpers used by every step.
from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from metax_audit.core import fstree
from metax_audit.core.comments import CommentMap
from metax_audit.core.models import Attribution
from metax_audit.core.pysource import ast_walk, unparse
from metax_audit.stages.compare.consequence import VendorPlatform
from metax_audit.stages.compare.rules import _SM_TEXT, ARCH_CALLS


@dataclass
class _Tok:
    key: str
    node: ast.AST  # shallow copy (sub-bodies emptied)
    line: int
    end: int
    depth: int
    arch: bool = False  # holds a capability check (set once, text-prefiltered)


@dataclass
class _Side:
    path: str
    text: str
    tree: ast.Module
    comments: CommentMap
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    funcs: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = field(default_factory=dict)
    attrs: dict[str, ast.stmt] = field(default_factory=dict)  # "Cls.name" or "name" (module)
    imports: dict[str, tuple[str, int]] = field(default_factory=dict)  # bound name -> (module, line)
    order: list[str] = field(default_factory=list)  # member qualnames in file order
    other: list[ast.stmt] = field(default_factory=list)  # remaining module-level statements
    rename: dict[str, str] = field(default_factory=dict)  # port class -> upstream class, where they differ
    arch_lines: frozenset[int] = frozenset()  # lines whose text could hold a capability check
    lines: list[str] = field(default_factory=list)
    import_ends: dict[int, int] = field(default_factory=dict)  # import statement line -> last line


@dataclass(frozen=True)
class _Env:
    """What every file's comparison shares: the vendor platform's fixed answers, the port's references,
    the two release versions and whether the base release is known for the file."""

    platform: VendorPlatform
    refs: _PortRefs
    target: str | None
    base: str | None
    base_state: str = "none"  # "none": no --base | "same": upstream did not change the file | "side": three-way
    vendor_words: frozenset[str] = frozenset()  # the vendor's name as the modification markers spell it ("metax")

    def attribution(self, drift: bool) -> Attribution:
        if drift:
            return "drift"
        return "port-only" if self.base_state != "none" else ""


class _PortRefs:
    """Whole-word references to a name anywhere in the port package (read lazily, once): an index of
    which files name which identifiers, and the lines for the files that do."""

    def __init__(self, root: Path, package: str) -> None:
        self._dir = root / package.replace(".", "/")
        self._texts: dict[str, str] | None = None
        self._index: dict[str, list[str]] = {}
        self._cache: dict[tuple[str, str, int, int], list[tuple[str, int]]] = {}

    def _load(self) -> dict[str, str]:
        if self._texts is None:
            self._texts = {}
            index: defaultdict[str, list[str]] = defaultdict(list)
            for f in fstree.files(self._dir, ".py") if self._dir.is_dir() else []:
                try:
                    rel = f.relative_to(self._dir.parent).as_posix()
                    self._texts[rel] = f.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError, ValueError):
                    continue
                for ident in set(re.findall(r"[A-Za-z_]\w*", self._texts[rel])):
                    index[ident].append(rel)  # once per file: the set has each identifier once
            self._index = dict(index)
        return self._texts

    def texts(self) -> dict[str, str]:
        """Each port file's text by its path (relative to the root)."""
        return self._load()

    def files_naming(self, name: str) -> frozenset[str]:
        """The port files whose text names `name` (anywhere: code, strings, comments)."""
        self._load()
        return frozenset(self._index.get(name, ()))

    def uses(self, name: str, path: str, first: int, last: int) -> list[tuple[str, int]] | None:
        """Where `name` occurs in the port package outside lines first..last of `path` (its own definition);
        None when there is no port package to search."""
        key = (name, path, first, last)
        if key not in self._cache:
            texts = self._load()
            if not texts:
                return None
            pattern = re.compile(rf"(?<![\w]){re.escape(name)}(?![\w])")
            found: list[tuple[str, int]] = []
            for rel in sorted(self._index.get(name, ())):
                text = texts[rel]
                line, at = 1, 0
                for m in pattern.finditer(text):
                    line += text.count("\n", at, m.start())  # from the last match on: one pass per file
                    at = m.start()
                    if not (rel == path and first <= line <= last):
                        found.append((rel, line))
                        if len(found) > 20:
                            break
            self._cache[key] = found
        return self._cache[key]


def _default_env() -> _Env:
    return _Env(VendorPlatform(), _PortRefs(Path("/nonexistent"), "_"), None, None)


def _body(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.stmt]:
    body = list(fn.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
        body = body[1:]
    return body


def _calls(nodes: Iterable[ast.AST]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for n in nodes:
        for sub in ast_walk(n):
            if isinstance(sub, ast.Call):
                out.setdefault(_callee(sub), set()).update(k.arg for k in sub.keywords if k.arg)
    return out


def _callee(call: ast.Call) -> str:
    try:
        return unparse(call.func)
    except Exception:  # pragma: no cover - unparse of a parsed tree does not fail
        return "?"


def _arch_in(node: ast.AST) -> bool:
    for sub in ast_walk(node):
        if isinstance(sub, ast.Call):
            name = _callee(sub).rsplit(".", 1)[-1]
            if name in ARCH_CALLS:
                return True
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and _SM_TEXT.search(sub.value):
            return True
    return False


def _only_raises(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    body = _body(fn)
    return bool(body) and all(isinstance(s, ast.Raise) for s in body)


def _start(node: ast.AST | None) -> int:
    if node is None:
        return 0
    decs = getattr(node, "decorator_list", None) or []
    return min([node.lineno] + [d.lineno for d in decs])  # type: ignore[attr-defined]


def _stmt_span(side: _Side, line: int) -> tuple[int, int]:
    return line, side.import_ends.get(line, line)


def _source(side: _Side, node: ast.AST) -> str:
    return "\n".join(side.lines[node.lineno - 1 : node.end_lineno])  # type: ignore[attr-defined]


def _sig(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    return f"({unparse(fn.args)})"


def _value(stmt: ast.stmt) -> str:
    value = getattr(stmt, "value", None)
    text = unparse(value) if value is not None else unparse(getattr(stmt, "annotation", ast.Constant(None)))
    return _short(text, 100)


def _value_delta(u: ast.stmt, p: ast.stmt) -> str:
    """For literal collections (dtypes, block sizes) say what the port drops and adds."""
    uval, pval = getattr(u, "value", None), getattr(p, "value", None)
    if isinstance(uval, ast.List | ast.Tuple | ast.Set) and isinstance(pval, ast.List | ast.Tuple | ast.Set):
        utexts = [unparse(e) for e in uval.elts]
        ptexts = [unparse(e) for e in pval.elts]
        dropped = [t for t in utexts if t not in ptexts]
        added = [t for t in ptexts if t not in utexts]
        parts = ([f"port drops {', '.join(dropped)}"] if dropped else []) + ([f"port adds {', '.join(added)}"] if added else [])
        return "; ".join(parts) or "same values, different order"
    return f"upstream {_value(u)} / port {_value(p)}"


def _text(side: _Side, tok: _Tok) -> str:
    lines = side.lines[tok.line - 1 : tok.end]
    return _short(" ".join(ln.strip() for ln in lines), 120)


def _short(text: str, limit: int = 240) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# A file's legal header names the vendor too; it declares no change.
_LEGAL = re.compile(r"SPDX|copyright|all rights reserved|licen[cs]e", re.IGNORECASE)


def _is_code(text: str) -> bool:
    """A commented-out line of code (`# fa_version=self.fa_version,`), not prose."""
    if not any(ch in text for ch in "()=[]"):
        return False
    try:
        ast.parse(text.strip().rstrip(",") or "pass")
    except SyntaxError:
        return False
    return True


def _squash(text: str) -> str:
    return " ".join(text.lower().split())
