# Function scopes for static resolution: a function's local bindings, parameters and annotations
# indexed from its body, and the walks over a body that stay out of nested definitions.
from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass, field

from metax_audit.stages.trace.modules import ModuleInfo, collect_imports
from metax_audit.stages.trace.values import Cls, Vals

# ---------------------------------------------------------------- function scopes


@dataclass
class Scope:
    """The names of one function (flow-insensitive): params, local assignments, lazy imports."""

    info: ModuleInfo
    node: ast.FunctionDef | ast.AsyncFunctionDef | None
    owner: Cls | None = None
    bindings: dict[str, Vals] = field(default_factory=dict)
    assigns: dict[str, list[ast.expr]] = field(default_factory=dict)
    lazy: dict[str, str] = field(default_factory=dict)
    params: dict[str, ast.arg] = field(default_factory=dict)
    loopvars: set[str] = field(default_factory=set)
    localdefs: dict[str, ast.AST] = field(default_factory=dict)
    parent: Scope | None = None

    @classmethod
    def of(cls, info: ModuleInfo, node: ast.FunctionDef | ast.AsyncFunctionDef | None, owner: Cls | None = None, bindings: dict[str, Vals] | None = None, parent: Scope | None = None) -> Scope:
        s = cls(info, node, owner, dict(bindings or {}), parent=parent)
        if node is None:
            return s
        # The names of a function do not change: index them once and share the tables.
        static = getattr(node, "_mxa_names", None)
        if static is None:
            static = _index_function(info, node)
            node._mxa_names = static  # type: ignore[union-attr]
        s.assigns, s.lazy, s.params, s.loopvars, s.localdefs = static
        return s


# A function's names: assigned expressions, lazy imports, parameters, loop variables, local definitions.
_FunctionNames = tuple[dict[str, list[ast.expr]], dict[str, str], dict[str, ast.arg], set[str], dict[str, ast.AST]]


def _index_function(info: ModuleInfo, node: ast.FunctionDef | ast.AsyncFunctionDef) -> _FunctionNames:
    assigns: dict[str, list[ast.expr]] = {}
    lazy: dict[str, str] = {}
    params: dict[str, ast.arg] = {}
    loopvars: set[str] = set()
    localdefs: dict[str, ast.AST] = {}
    a = node.args
    for p in [*a.posonlyargs, *a.args, *a.kwonlyargs, *(x for x in (a.vararg, a.kwarg) if x)]:
        params[p.arg] = p
    for sub in _walk_body(node):
        if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            localdefs[sub.name] = sub
        if isinstance(sub, ast.Assign):
            for t in sub.targets:
                for name, expr in _targets(t, sub.value):
                    assigns.setdefault(name, []).append(expr)
        elif isinstance(sub, ast.AnnAssign) and isinstance(sub.target, ast.Name):
            assigns.setdefault(sub.target.id, []).append(sub.value if sub.value is not None else sub.annotation)
        elif isinstance(sub, ast.NamedExpr):
            assigns.setdefault(sub.target.id, []).append(sub.value)
        elif isinstance(sub, ast.Import | ast.ImportFrom):
            stmts: list[ast.stmt] = [sub]
            collect_imports(stmts, info.package, lazy)
        elif isinstance(sub, ast.For | ast.comprehension):
            for n in ast.walk(sub.target):
                if isinstance(n, ast.Name):
                    loopvars.add(n.id)
        elif isinstance(sub, ast.withitem) and isinstance(sub.optional_vars, ast.Name):
            assigns.setdefault(sub.optional_vars.id, []).append(sub.context_expr)
    return assigns, lazy, params, loopvars, localdefs


def decorators(node: ast.AST) -> frozenset[str]:
    cached = getattr(node, "_mxa_decos", None)
    if cached is None:
        cached = frozenset(ast.unparse(d) for d in getattr(node, "decorator_list", []))
        node._mxa_decos = cached  # type: ignore[attr-defined]
    return cached


def _targets(t: ast.expr, value: ast.expr) -> list[tuple[str, ast.expr]]:
    if isinstance(t, ast.Name):
        return [(t.id, value)]
    if isinstance(t, ast.Tuple | ast.List) and isinstance(value, ast.Tuple | ast.List) and len(t.elts) == len(value.elts):
        return [pair for a, b in zip(t.elts, value.elts, strict=True) for pair in _targets(a, b)]
    return []


def _walk_body(node: ast.AST) -> Iterable[ast.AST]:
    """ast.walk that does not enter nested defs, classes or lambdas (their names are their own)."""
    stack = list(ast.iter_child_nodes(node))
    while stack:
        n = stack.pop()
        yield n
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        stack.extend(ast.iter_child_nodes(n))
