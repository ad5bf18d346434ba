# Names undefined at runtime (as ruff's F821 says): a name a function or the module reads that no
# scope on its path binds, neither the module (nor what it star-imports) nor the builtins: NameError.
from __future__ import annotations

import ast
import builtins
import difflib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial

from metax_audit.core.findings import make_finding, rule
from metax_audit.core.models import Category, Finding, Location, Severity
from metax_audit.core.pysource import ast_children, ast_walk
from metax_audit.stages.checks.imports import (
    FAILS_WITH,
    _future_annotations,
    _is_type_checking,
    _text,
    read_from,
)
from metax_audit.stages.checks.memo import FileMemo
from metax_audit.stages.trace.modules import ModuleInfo
from metax_audit.stages.trace.symbols import Status, SymbolTable

# Written here rather than taken from pyflakes: pyflakes is not a dependency (the bare pre-commit runner
# has only metax-audit), and what a module provides must be the one resolver's answer (star imports of
# port or upstream modules, globals() writes), not a second opinion.

rule("MXA127", Category.IMPORT, Severity.ERROR, "a name is undefined at runtime where the code reads it",
     "No scope on the path binds the name: not a local or parameter of the enclosing functions, not a name the module "
     "binds at its top level (nor one it star-imports from a module the audit reads), not a builtin. Reading it raises "
     "NameError when the code runs (at import for module-level code and eager annotations). A deleted import that is "
     "still used is the usual cause; the evidence lists every use and the closest names that are bound. Code under "
     "`if TYPE_CHECKING` and reads guarded by `except NameError` are not counted; a name imported only under "
     "TYPE_CHECKING is MXA123.")

_BUILTINS = frozenset(dir(builtins)) | {"__file__", "__name__", "__doc__", "__spec__", "__loader__", "__package__",
                                        "__builtins__", "__path__", "__annotations__", "__class__", "__dict__",
                                        "__module__", "__qualname__", "__debug__", "__cached__", "WindowsError"}


@dataclass(frozen=True)
class FreeName:
    """A read of a name that no local scope binds (the module's names are asked afterwards)."""

    name: str
    line: int
    function: str  # the enclosing def's qualified name ("" at module level)


class _Scope:
    __slots__ = ("bound", "is_class")

    def __init__(self, bound: set[str], is_class: bool = False) -> None:
        self.bound = bound
        self.is_class = is_class


def _targets(node: ast.AST) -> Iterator[str]:
    for n in ast_walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store | ast.Del):
            yield n.id
        elif isinstance(n, ast.Starred) and isinstance(n.value, ast.Name):
            yield n.value.id


# The node kinds _local_bindings reads (every other node only leads to its children).
_BINDING_KINDS = frozenset({
    ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.ListComp, ast.SetComp, ast.GeneratorExp,
    ast.DictComp, ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal, ast.ExceptHandler, ast.MatchAs, ast.MatchStar,
    ast.MatchMapping, ast.Name,
})


def _local_bindings(body: list[ast.stmt]) -> set[str]:
    """Names a function or class body binds (not those of nested functions, classes, lambdas and
    comprehensions, whose own scopes bind them; a walrus inside a comprehension binds here)."""
    out: set[str] = set()
    stack: list[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        if node.__class__ not in _BINDING_KINDS:  # most nodes: one type lookup instead of ten isinstance tests
            stack.extend(ast_children(node))
            continue
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(node.name)
            stack.extend(node.decorator_list)
            if not isinstance(node, ast.ClassDef):
                stack.extend(d for d in (*node.args.defaults, *node.args.kw_defaults) if d is not None)
            else:
                stack.extend((*node.bases, *(k.value for k in node.keywords)))
            continue
        if isinstance(node, ast.Lambda):
            stack.extend((*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)))
            continue
        if isinstance(node, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
            for n in ast_walk(node):
                if isinstance(n, ast.NamedExpr) and isinstance(n.target, ast.Name):
                    out.add(n.target.id)
            continue
        if isinstance(node, ast.Import):
            out.update(a.asname or a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            out.update(a.asname or a.name for a in node.names if a.name != "*")
        elif isinstance(node, ast.Global | ast.Nonlocal):
            out.update(node.names)
        elif isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and node.name:
            out.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            out.add(node.rest)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            out.add(node.id)
        stack.extend(ast_children(node))
    return out


def _params(args: ast.arguments) -> set[str]:
    names = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
    names.update(a.arg for a in (args.vararg, args.kwarg) if a is not None)
    return names


def _name_error_guard(node: ast.Try) -> bool:
    for h in node.handlers:
        types = [] if h.type is None else ([h.type] if not isinstance(h.type, ast.Tuple) else list(h.type.elts))
        if h.type is None or any(ast.unparse(t).rsplit(".", 1)[-1] in {"NameError", "Exception", "BaseException"} for t in types):
            return True
    return False


_CONTEXTS = frozenset({ast.Load, ast.Store, ast.Del})  # a name's context: no field, no read


def free_names(tree: ast.Module, *, eager_annotations: bool) -> list[FreeName]:
    """Every read of a name that no function, lambda, comprehension or (for its own body) class scope
    binds, outside `if TYPE_CHECKING` blocks, `except NameError` guards, strings and (under postponed
    evaluation) annotations. A function of the module's text: the module-level names are asked of the
    resolver afterwards."""
    out: list[FreeName] = []

    def read(name: str, line: int, scopes: list[_Scope], function: str) -> None:
        # The innermost scope sees its class body; enclosing class bodies are not visible to nested code.
        for i, sc in enumerate(reversed(scopes)):
            if sc.is_class and i > 0:
                continue
            if name in sc.bound:
                return
        out.append(FreeName(name, line, function))

    def expr(node: ast.AST | None, scopes: list[_Scope], function: str) -> None:
        if node is None:
            return
        while node.__class__ is ast.Attribute:  # `a.b.c` reads only what `a` is (its ctx reads nothing)
            node = node.value  # type: ignore[attr-defined]
        kind = node.__class__
        if kind is ast.Name:
            if node.ctx.__class__ is ast.Load:  # type: ignore[attr-defined]
                read(node.id, node.lineno, scopes, function)  # type: ignore[attr-defined]
            return
        if kind is ast.Constant or kind in _CONTEXTS:
            return
        if isinstance(node, ast.Lambda):
            args(node.args, scopes, function)
            expr(node.body, [*scopes, _Scope(_params(node.args) | _walrus(node.body))], function)
            return
        if isinstance(node, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
            bound = {t for g in node.generators for t in _targets(g.target)}
            inner = [*scopes, _Scope(bound)]
            for k, g in enumerate(node.generators):
                expr(g.iter, scopes if k == 0 else inner, function)  # the first iterable runs outside
                for cond in g.ifs:
                    expr(cond, inner, function)
            for part in ((node.key, node.value) if isinstance(node, ast.DictComp) else (node.elt,)):
                expr(part, inner, function)
            return
        if isinstance(node, ast.Constant):
            return
        for child in ast_children(node):
            expr(child, scopes, function)

    def annotation(node: ast.expr | None, scopes: list[_Scope], function: str) -> None:
        if node is not None and eager_annotations:
            expr(node, scopes, function)

    def args(a: ast.arguments, scopes: list[_Scope], function: str) -> None:
        for d in (*a.defaults, *a.kw_defaults):
            expr(d, scopes, function)

    def function_def(st: ast.FunctionDef | ast.AsyncFunctionDef, scopes: list[_Scope], function: str, prefix: str) -> None:
        for d in st.decorator_list:
            expr(d, scopes, function)
        args(st.args, scopes, function)
        for a in (*st.args.posonlyargs, *st.args.args, *st.args.kwonlyargs, st.args.vararg, st.args.kwarg):
            if a is not None:
                annotation(a.annotation, scopes, function)
        annotation(st.returns, scopes, function)
        qual = prefix + st.name
        body(st.body, [*scopes, _Scope(_params(st.args) | _local_bindings(st.body))], qual, qual + ".", in_function=True)

    def body(stmts: list[ast.stmt], scopes: list[_Scope], function: str, prefix: str, *, in_function: bool) -> None:
        for st in stmts:
            try:
                statement(st, scopes, function, prefix, in_function=in_function)
            except RecursionError:
                continue  # pathologically nested (generated) code: its reads are not checked, never a crash

    def statement(st: ast.stmt, scopes: list[_Scope], function: str, prefix: str, *, in_function: bool) -> None:
        if isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef):
            function_def(st, scopes, function, prefix)
        elif isinstance(st, ast.ClassDef):
            for d in (*st.decorator_list, *st.bases, *(k.value for k in st.keywords)):
                expr(d, scopes, function)
            body(st.body, [*scopes, _Scope(_local_bindings(st.body), is_class=True)], function, prefix + st.name + ".",
                 in_function=False)
        elif isinstance(st, ast.If) and _is_type_checking(st.test):
            body(st.orelse, scopes, function, prefix, in_function=in_function)
        elif isinstance(st, ast.Try | ast.TryStar):
            if not _name_error_guard(st):  # type: ignore[arg-type]
                body(st.body, scopes, function, prefix, in_function=in_function)
            for h in st.handlers:
                expr(h.type, scopes, function)
                body(h.body, scopes, function, prefix, in_function=in_function)
            body(st.orelse, scopes, function, prefix, in_function=in_function)
            body(st.finalbody, scopes, function, prefix, in_function=in_function)
        elif isinstance(st, ast.AnnAssign):
            # A local variable's annotation is never evaluated; a module's or class's is, unless postponed.
            if not in_function:
                annotation(st.annotation, scopes, function)
            expr(st.value, scopes, function)
            expr(st.target, scopes, function)
        elif isinstance(st, ast.Import | ast.ImportFrom | ast.Global | ast.Nonlocal | ast.Pass | ast.Break | ast.Continue):
            return
        else:
            blocks = [getattr(st, b, None) for b in ("body", "orelse", "finalbody")]
            for field, value in ast.iter_fields(st):
                if field in ("body", "orelse", "finalbody", "handlers", "cases"):
                    continue
                for v in value if isinstance(value, list) else [value]:
                    if isinstance(v, ast.AST):
                        expr(v, scopes, function)
            for case in getattr(st, "cases", []) or []:
                expr(case.guard, scopes, function)
                body(case.body, scopes, function, prefix, in_function=in_function)
            for b in blocks:
                if isinstance(b, list):
                    body(b, scopes, function, prefix, in_function=in_function)

    body(tree.body, [], "", "", in_function=False)
    return out


def _walrus(node: ast.AST) -> set[str]:
    return {n.target.id for n in ast_walk(node) if isinstance(n, ast.NamedExpr) and isinstance(n.target, ast.Name)}


def _global_declarations(info: ModuleInfo) -> set[str]:
    return {n for node in ast_walk(info.tree) if isinstance(node, ast.Global) for n in node.names}


def _kept_free_names(info: ModuleInfo, path: str, memo: FileMemo | None) -> list[FreeName]:
    compute = partial(free_names, info.tree, eager_annotations=not _future_annotations(info))
    if memo is None or not read_from(info, path):
        return compute()
    return memo.get(path, ("free-names",), compute)


def check_undefined_names(paths: list[str], symbols: SymbolTable, memo: FileMemo | None = None,
                          callers: Sequence[str] = ()) -> Iterator[Finding]:
    """One finding per (file, name) that no scope binds where the code reads it (MXA127), in the files in scope
    and in their `callers` outside it, each read whole (as ruff's F821 reads a file). A caller is the model or
    layer that runs the attention code: a NameError in any of its functions stops that model, though the
    function never names an attention class (94162c3^: DeepSeek-V4's hc_head called F.linear, F never imported;
    c4f62f7^: the DSA Indexer read q_scale after the line that set it was commented out). On the real ports'
    master, release and history reviews, reading callers whole added no other finding."""
    for path in [*paths, *callers]:
        info = symbols.index.module_for_path(path)
        if info is None:
            continue
        free = _kept_free_names(info, path, memo)
        if not free:
            continue
        module_names = symbols.module_names(info)
        declared = _global_declarations(info)  # `global x` in a function binds x in the module when it runs
        by_name: dict[str, list[FreeName]] = {}
        for f in free:
            if f.name in module_names or f.name in _BUILTINS or f.name in declared:
                continue
            by_name.setdefault(f.name, []).append(f)
        if not by_name:
            continue
        dynamic = symbols.dynamic_reason(info)
        if dynamic:
            continue  # names may be written at runtime (globals(), module __getattr__ is not for its own reads)
        lines = info.source.splitlines()
        for name, uses in by_name.items():
            status, _ = symbols.member(info, name)
            if status is not Status.MISSING_NAME:
                continue  # star-imported, a submodule, or provided at runtime
            yield _finding(path, info, name, uses, lines, module_names)


def _finding(path: str, info: ModuleInfo, name: str, uses: list[FreeName], lines: list[str],
             module_names: dict[str, int]) -> Finding:
    uses = sorted(set(uses), key=lambda u: (u.line, u.function))
    first = uses[0]
    where = [u.function for u in uses if u.function]
    near = difflib.get_close_matches(name, [n for n in module_names if not n.startswith("__")], n=3, cutoff=0.6)
    ev = [f"{FAILS_WITH}{path}:{u.line}: {_text(lines, u.line)}" + (f"  (in {u.function})" if u.function else "  (at import)")
          for u in uses[:8]]
    if len(uses) > 8:
        ev.append(f"... and {len(uses) - 8} more reads")
    ev.append(f"port snapshot: {name} is not bound in {info.name} ({path}): no import, def, class or assignment at its top "
              "level, nor in the enclosing functions, nor a builtin")
    if near:
        ev.append("closest bound names: " + ", ".join(near))
    when = f"NameError when {where[0]} runs" if where and all(u.function for u in uses) else "NameError at import"
    return make_finding("MXA127", Location(path, first.line, f"undefined:{name}"),
                        f"{name} is undefined at runtime ({len(uses)} read(s)): {when}", ev, key=f"undefined:{name}")
