# Helper predicates evaluated over the vendor platform: a condition such as `Backend.supports_sink()` or a
# local set from `can_use_trtllm_attention(...)` followed into the helpers' bodies (upstream's or the port's), with
# the platform class's fixed answers and the device capability config gives; anything else stays unknown.
from __future__ import annotations

import ast
import copy
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metax_audit.core.pysource import find_module, module_name, read_source_cached
from metax_audit.stages.compare.consequence import VendorPlatform

# Questions about the NVIDIA architecture the device reports; answered from the capability when the port's
# platform class does not answer them with a constant itself.
_CAPABILITY_QUESTIONS = frozenset({"is_device_capability", "has_device_capability", "is_device_capability_family"})
_MAX_DEPTH = 6
_MAX_BYTES = 5_000_000


@dataclass(frozen=True)
class Known:
    """A value known on the vendor platform, and why (each platform answer and helper it took)."""

    value: object
    why: tuple[str, ...] = ()
    exact: bool = True  # False: only its truth is known (`x and False` is falsy whatever x is)


@dataclass(frozen=True)
class Capability:
    """The device capability the vendor device reports: (major, minor), None when it reports none, or unknown."""

    value: tuple[int, int] | None = None
    known: bool = False
    source: str = ""

    @classmethod
    def parse(cls, text: str, source: str) -> Capability:
        """"8.0" -> (8, 0); "none" -> reports none; "" -> unknown."""
        text = text.strip().lower()
        if not text:
            return cls()
        if text == "none":
            return cls(None, True, source)
        major, _, minor = text.partition(".")
        return cls((int(major), int(minor or 0)), True, source)


@dataclass
class _Module:
    path: str
    tree: ast.Module
    imports: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # bound -> (module, name or None)

    def top(self, name: str) -> ast.AST | None:
        return next((n for n in self.tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name == name), None)


@dataclass
class _Scope:
    module: _Module
    cls: ast.ClassDef | None = None
    args: dict[str, Known | None] = field(default_factory=dict)
    assigned: dict[str, ast.expr | None] = field(default_factory=dict)  # locals stored once -> value; twice -> None
    imports: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # imports inside the function
    depth: int = 0
    seen: frozenset[str] = frozenset()


_COMPARE: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Is: operator.is_, ast.IsNot: operator.is_not,
    ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
}
_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Mod: operator.mod, ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
}


class Evaluator:
    """Conditions over the vendor platform. `roots` maps a top-level package ("vllm", the port's) to the
    directory holding it; `platform` holds the port platform class's fixed answers."""

    def __init__(self, platform: VendorPlatform, capability: Capability, roots: dict[str, Path]) -> None:
        self.platform = platform
        self.capability = capability
        self.roots = roots
        self._modules: dict[str, _Module | None] = {}

    # ------------------------------------------------------------ modules

    def module(self, dotted: str) -> _Module | None:
        if dotted not in self._modules:
            self._modules[dotted] = None
            root = self.roots.get(dotted.split(".")[0])
            rel = find_module(root, dotted) if root is not None else None
            if root is not None and rel is not None:
                self._modules[dotted] = self.module_at(root, rel)
        return self._modules[dotted]

    def module_at(self, root: Path, rel: str) -> _Module | None:
        src = read_source_cached(root, rel, _MAX_BYTES)
        if src.tree is None:
            return None
        mod = _Module(rel, src.tree)
        package = module_name(rel)
        mod.imports = _imports(src.tree.body, package, rel.endswith("__init__.py"))
        return mod

    def scope_in(self, module: _Module, fn: ast.FunctionDef | ast.AsyncFunctionDef | None, cls: ast.ClassDef | None) -> _Scope:
        """The scope of code inside `fn` (its parameters unknown), to evaluate a statement of it in place."""
        scope = _Scope(module, cls)
        if fn is not None:
            _bind_locals(scope, fn)
        return scope

    # ------------------------------------------------------------ values

    def value(self, expr: ast.expr, scope: _Scope) -> Known | None:
        if isinstance(expr, ast.Constant):
            return Known(expr.value)
        if isinstance(expr, ast.Name):
            return self._name(expr.id, scope)
        if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
            inner = self.value(expr.operand, scope)
            return Known(not inner.value, inner.why) if inner is not None else None
        if isinstance(expr, ast.BoolOp):
            return self._boolop(expr, scope)
        if isinstance(expr, ast.Compare) and len(expr.ops) == 1 and type(expr.ops[0]) in _COMPARE:
            left, right = self.value(expr.left, scope), self.value(expr.comparators[0], scope)
            if left is None or right is None or not (left.exact and right.exact):
                return None
            try:
                return Known(bool(_COMPARE[type(expr.ops[0])](left.value, right.value)), left.why + right.why)
            except TypeError:
                return None
        if isinstance(expr, ast.BinOp) and type(expr.op) in _BINARY:
            left, right = self.value(expr.left, scope), self.value(expr.right, scope)
            if left is None or right is None or not (left.exact and right.exact):
                return None
            try:
                return Known(_BINARY[type(expr.op)](left.value, right.value), left.why + right.why)
            except (TypeError, ZeroDivisionError, ValueError):
                return None
        if isinstance(expr, ast.Call):
            return self._call(expr, scope)
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "self" and scope.cls is not None:
            return self._self_attribute(expr.attr, scope)
        return None

    def _self_attribute(self, attr: str, scope: _Scope) -> Known | None:
        """`self.x` where every assignment of it in the class is `self.x = <expression>` and all of them agree (v0.21.0:
        `self._use_fi_prefill = use_flashinfer_prefill()`): their value, or their truth alone when only that agrees."""
        assert scope.cls is not None
        key = f"{scope.module.path}:{scope.cls.name}.{attr}"
        if scope.depth >= _MAX_DEPTH or key in scope.seen:
            return None
        values: list[Known | None] = []
        for method in (m for m in scope.cls.body if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)):
            for node in ast.walk(method):
                if not isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
                    continue
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if not any(_is_self_attr(t, attr) for target in targets for t in ast.walk(target)):
                    continue
                # only `self.x = <one expression>` says what x holds; unpacking, `+=` or an annotation alone do not
                if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and _is_self_attr(node.targets[0], attr)):
                    return None
                inner = self.scope_in(scope.module, method, scope.cls)
                inner.depth, inner.seen = scope.depth + 1, scope.seen | {key}
                values.append(self.value(node.value, inner))
        if not values or any(v is None for v in values):
            return None
        first = values[0]
        assert first is not None
        why = (*dict.fromkeys(w for v in values if v is not None for w in v.why),
               f"every assignment of self.{attr} in {scope.cls.name} gives it that value")
        if all(v is not None and v.exact and v.value == first.value and type(v.value) is type(first.value) for v in values):
            return Known(first.value, why)
        truths = {bool(v.value) for v in values if v is not None}
        return Known(truths.pop(), why, exact=False) if len(truths) == 1 else None

    def _name(self, name: str, scope: _Scope) -> Known | None:
        if name in scope.args:
            return scope.args[name]
        if name in scope.assigned:
            value = scope.assigned[name]
            if value is None or name in scope.seen:
                return None
            inner = _Scope(scope.module, scope.cls, scope.args, scope.assigned, scope.imports, scope.depth, scope.seen | {name})
            return self.value(value, inner)
        return None

    def _boolop(self, expr: ast.BoolOp, scope: _Scope) -> Known | None:
        decisive = isinstance(expr.op, ast.Or)  # a truthy operand decides an `or`, a falsy one an `and`
        values = [self.value(v, scope) for v in expr.values]
        exact = True
        why: tuple[str, ...] = ()
        for v in values:
            if v is None:
                exact = False
                continue
            why += v.why
            if bool(v.value) == decisive:
                return Known(v.value if exact else decisive, why, exact and v.exact)
        if any(v is None for v in values):
            return None
        last = values[-1]
        assert last is not None
        return Known(last.value, why, last.exact)

    # ------------------------------------------------------------ calls

    def _call(self, call: ast.Call, scope: _Scope) -> Known | None:
        func = call.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            receiver, name = func.value.id, func.attr
            if receiver == "current_platform" and (name in self.platform.answers or name in _CAPABILITY_QUESTIONS):
                return self._platform(name, call, scope)
            found = (scope.cls, scope.module) if receiver == "cls" and scope.cls is not None else self._class(receiver, scope)
            if found is not None:
                cls, module = found
                method = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
                if method is not None and _is_class_level(method):
                    return self._invoke(method, call, scope, module, cls, f"{cls.name}.{name}")
            return None
        if isinstance(func, ast.Name):
            found_fn = self._function(func.id, scope)
            if found_fn is not None:
                fn, module = found_fn
                return self._invoke(fn, call, scope, module, None, fn.name)
        return None

    def _platform(self, name: str, call: ast.Call, scope: _Scope) -> Known | None:
        if name in self.platform.answers:
            value, why = self.platform.answers[name]
            return Known(value, (f"{name}() is {value}: {why}",))
        if name not in _CAPABILITY_QUESTIONS or not self.capability.known or len(call.args) != 1:
            return None
        arg = self.value(call.args[0], scope)
        if arg is None:
            return None
        wanted = arg.value
        if isinstance(wanted, tuple) and len(wanted) == 2 and all(isinstance(x, int) for x in wanted):
            wanted = wanted[0] * 10 + wanted[1]
        if not isinstance(wanted, int) or isinstance(wanted, bool):
            return None
        cap = self.capability.value
        shown = "none" if cap is None else f"{cap[0]}.{cap[1]}"
        if cap is None:
            answer = False
        else:
            have = cap[0] * 10 + cap[1]
            answer = {"is_device_capability": have == wanted, "has_device_capability": have >= wanted,
                      "is_device_capability_family": have // 10 == wanted // 10}[name]
        return Known(answer, (f"{name}({wanted}) is {answer}: the device reports capability {shown} ({self.capability.source})",))

    def _class(self, name: str, scope: _Scope) -> tuple[ast.ClassDef, _Module] | None:
        node = scope.module.top(name)
        if isinstance(node, ast.ClassDef):
            return node, scope.module
        target = scope.imports.get(name) or scope.module.imports.get(name)
        if target is not None and target[1] is not None:
            mod = self.module(target[0])
            node = mod.top(target[1]) if mod is not None else None
            if isinstance(node, ast.ClassDef) and mod is not None:
                return node, mod
        return None

    def _function(self, name: str, scope: _Scope) -> tuple[ast.FunctionDef, _Module] | None:
        if name in scope.assigned or name in scope.args:
            return None
        target = scope.imports.get(name) or scope.module.imports.get(name)
        if target is None:
            node = scope.module.top(name)
            return (node, scope.module) if isinstance(node, ast.FunctionDef) else None
        if target[1] is None:
            return None
        mod = self.module(target[0])
        node = mod.top(target[1]) if mod is not None else None
        return (node, mod) if isinstance(node, ast.FunctionDef) and mod is not None else None

    def _invoke(self, fn: ast.FunctionDef, call: ast.Call, caller: _Scope, module: _Module, cls: ast.ClassDef | None,
                shown: str) -> Known | None:
        key = f"{module.path}:{fn.lineno}"
        if caller.depth >= _MAX_DEPTH or key in caller.seen or any(isinstance(a, ast.Starred) for a in call.args) \
                or any(k.arg is None for k in call.keywords):
            return None
        scope = _Scope(module, cls, depth=caller.depth + 1, seen=caller.seen | {key})
        params = [*fn.args.posonlyargs, *fn.args.args]
        if params and any(isinstance(d, ast.Name) and d.id == "classmethod" for d in fn.decorator_list):
            params = params[1:]  # cls
        defaults = dict(zip([p.arg for p in params][len(params) - len(fn.args.defaults):], fn.args.defaults, strict=True))
        defaults.update({p.arg: d for p, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults, strict=True) if d is not None})
        bound: dict[str, Known | None] = {p.arg: None for p in [*params, *fn.args.kwonlyargs]}
        for p, a in zip(params, call.args, strict=False):
            bound[p.arg] = self.value(a, caller)
        for k in call.keywords:
            bound[k.arg or ""] = self.value(k.value, caller)
        given = {p.arg for p in params[: len(call.args)]} | {k.arg for k in call.keywords}
        for name, default in defaults.items():
            if name not in given:
                bound[name] = self.value(default, scope)
        scope.args = bound
        _bind_locals(scope, fn)
        outcomes = self._block(fn.body, scope)
        if not outcomes or any(o is None for o in outcomes):
            return None
        first = outcomes[0]
        assert first is not None
        why = tuple(dict.fromkeys(w for o in outcomes if o is not None for w in o.why))
        if not all(o is not None and o.exact and o.value == first.value and type(o.value) is type(first.value) for o in outcomes):
            # `return a and b and is_device_capability_family(100)`: falsy on every path, its exact value unknown
            truths = {bool(o.value) for o in outcomes if o is not None}
            if len(truths) != 1:
                return None
            truth = truths.pop()
            return Known(truth, (*why, f"{shown}() is {'truthy' if truth else 'falsy'} on every path there "
                                       f"({module.path}:{fn.lineno})"), exact=False)
        return Known(first.value, (*why, f"{shown}() returns {first.value!r} on every path there ({module.path}:{fn.lineno})"))

    def _block(self, stmts: list[ast.stmt], scope: _Scope) -> list[Known | None] | None:
        """The values the statements return on each path the platform can take; None when a statement is
        beyond this evaluation (a loop, a try, a with): then the function's value is unknown."""
        for i, st in enumerate(stmts):
            if isinstance(st, ast.Expr | ast.Pass | ast.Import | ast.ImportFrom | ast.Assign | ast.AnnAssign):
                continue  # bindings are read from _bind_locals; an expression statement returns nothing
            if isinstance(st, ast.Return):
                return [self.value(st.value, scope) if st.value is not None else Known(None)]
            if isinstance(st, ast.Raise):
                return []  # this path raises: it returns no value
            if isinstance(st, ast.If):
                test = self.value(st.test, scope)
                branches = [st.body] if test is not None and test.value else [st.orelse] if test is not None else [st.body, st.orelse]
                out: list[Known | None] = []
                for branch in branches:
                    got = self._block([*branch, *stmts[i + 1:]], scope)
                    if got is None:
                        return None
                    out += [Known(o.value, (*test.why, *o.why), o.exact) if o is not None and test is not None else o for o in got]
                return out
            return None
        return [Known(None)]  # falls off the end: returns None


def _is_self_attr(node: ast.AST, attr: str) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == attr and isinstance(node.value, ast.Name) and node.value.id == "self"


def _is_class_level(fn: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id in {"classmethod", "staticmethod"} for d in fn.decorator_list)


def _imports(body: list[ast.stmt], package: str, is_package: bool) -> dict[str, tuple[str, str | None]]:
    out: dict[str, tuple[str, str | None]] = {}
    for node in body:
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                keep = len(parts) - node.level + (1 if is_package else 0)
                base = ".".join([*parts[:max(keep, 0)], *([base] if base else [])])
            for a in node.names:
                out[a.asname or a.name] = (base, a.name)
        elif isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = (a.name if a.asname else a.name.split(".")[0], None)
    return out


def _bind_locals(scope: _Scope, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
    """A function's locals stored exactly once (their value) or more (unknown), and its lazy imports."""
    package = module_name(scope.module.path)
    for node in ast.walk(fn):
        if isinstance(node, ast.ImportFrom | ast.Import) and node is not fn:
            scope.imports.update(_imports([node], package, scope.module.path.endswith("__init__.py")))
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign | ast.AugAssign | ast.For | ast.With | ast.NamedExpr):
            targets = [getattr(node, "target", None) or next(iter(getattr(node, "items", [])), None)]  # type: ignore[list-item]
        for t in targets:
            for n in ast.walk(t) if t is not None else ():
                if isinstance(n, ast.Name):
                    single = value is not None and len(targets) == 1 and t is n
                    scope.assigned[n.id] = value if single and n.id not in scope.assigned else None


def fold(expr: ast.expr, evaluator: Evaluator, scope: _Scope, why: list[str], truth: bool = False) -> ast.expr:
    """`expr` with every part the vendor platform decides replaced by its value (`not Backend.supports_sink()`
    -> True); the answers used are appended to `why`. Where only a part's truth is known (`x and False`), it is
    replaced only where its truth is all that counts (`truth`: a condition, an operand of `not`, `and`, `or` there)."""
    known = evaluator.value(expr, scope) if not isinstance(expr, ast.Constant) else None
    if known is not None and isinstance(known.value, bool | int | str | type(None)) and (known.exact or truth):
        why.extend(known.why)
        return ast.Constant(known.value if known.exact else bool(known.value))
    node = copy.copy(expr)
    inner = (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)) or (truth and isinstance(node, ast.BoolOp))
    for name, value in ast.iter_fields(node):
        if isinstance(value, ast.expr):
            setattr(node, name, fold(value, evaluator, scope, why, inner))
        elif isinstance(value, list) and value and all(isinstance(v, ast.expr) for v in value):
            setattr(node, name, [fold(v, evaluator, scope, why, inner) for v in value])
    return node


def platform_capability(platform_file: Path, shown: str) -> Capability:
    """The capability the port's platform class answers itself: `get_device_capability` returning one constant
    (`return None`: the device reports none); unknown when it asks the device."""
    src = read_source_cached(platform_file.parent, platform_file.name, _MAX_BYTES) if platform_file.is_file() else None
    if src is None or src.tree is None:
        return Capability()
    for cls in (n for n in src.tree.body if isinstance(n, ast.ClassDef)):
        for fn in cls.body:
            if isinstance(fn, ast.FunctionDef) and fn.name == "get_device_capability":
                body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
                if len(body) == 1 and isinstance(body[0], ast.Return) and (body[0].value is None or (
                        isinstance(body[0].value, ast.Constant) and body[0].value.value is None)):
                    return Capability(None, True, f"{shown}:{fn.lineno} {cls.name}.get_device_capability returns None")
                return Capability()
    return Capability()


def _statement_at(tree: ast.Module, line: int) -> tuple[ast.stmt, list[ast.stmt], int, ast.FunctionDef | None, ast.ClassDef | None] | None:
    """The statement starting at `line` (outermost), the body holding it and its index, its function and class."""
    def walk(body: list[ast.stmt], fn: ast.FunctionDef | None, cls: ast.ClassDef | None):  # type: ignore[no-untyped-def]
        for i, st in enumerate(body):
            start = min([st.lineno, *(d.lineno for d in getattr(st, "decorator_list", []))])
            if not (start <= line <= (st.end_lineno or st.lineno)):
                continue
            if st.lineno == line and not isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                return st, body, i, fn, cls
            inner_fn = st if isinstance(st, ast.FunctionDef) else fn
            inner_cls = st if isinstance(st, ast.ClassDef) else cls
            for name in ("body", "orelse", "finalbody"):
                sub = getattr(st, name, None)
                if isinstance(sub, list) and sub and isinstance(sub[0], ast.stmt):
                    found = walk(sub, inner_fn, inner_cls)
                    if found is not None:
                        return found
            for h in getattr(st, "handlers", []) or []:
                found = walk(h.body, inner_fn, inner_cls)
                if found is not None:
                    return found
        return None

    return walk(tree.body, None, None)


def _shallow(st: ast.stmt) -> ast.stmt:
    node = copy.copy(st)
    for name in ("body", "orelse", "finalbody", "handlers"):
        if isinstance(getattr(node, name, None), list):
            setattr(node, name, [])
    return node


def _next_statement(st: ast.stmt, body: list[ast.stmt], i: int) -> str:
    """What comes right after the statement's own line in file order: its first inner statement, else the next one."""
    inner = getattr(st, "body", None)
    if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
        return ast.dump(_shallow(inner[0]))
    return ast.dump(_shallow(body[i + 1])) if i + 1 < len(body) else ""


def same_on_platform(evaluator: Evaluator, port_root: Path, port_path: str, port_line: int, up_root: Path, up_path: str,
                     up_line: int) -> str:
    """Evidence that one changed statement computes the same on the vendor platform on both sides: folded over
    the platform's facts (the helpers each side calls followed into their bodies) the two are the same code,
    and the statements after them match (the hunk is this one statement); "" otherwise (unknown stays unknown)."""
    port_mod, up_mod = evaluator.module_at(port_root, port_path), evaluator.module_at(up_root, up_path)
    p = _statement_at(port_mod.tree, port_line) if port_mod is not None else None
    u = _statement_at(up_mod.tree, up_line) if up_mod is not None else None
    if p is None or u is None or port_mod is None or up_mod is None or type(p[0]) is not type(u[0]):
        return ""
    if _next_statement(*p[:3]) != _next_statement(*u[:3]):
        return ""
    sides = []
    for (st, _body, _i, fn, cls), mod in ((p, port_mod), (u, up_mod)):
        scope = evaluator.scope_in(mod, fn, cls)
        why: list[str] = []
        node = _shallow(st)
        for name, value in ast.iter_fields(node):
            if isinstance(value, ast.expr):
                setattr(node, name, fold(value, evaluator, scope, why, truth=name == "test"))
        sides.append((ast.dump(node), ast.unparse(node), why, ast.unparse(_shallow(st))))
    (p_dump, p_text, p_why, p_was), (u_dump, _u_text, u_why, u_was) = sides
    if p_dump != u_dump or not (p_why or u_why):
        return ""
    first = lambda text: " ".join(text.split("\n", 1)[0].split())  # noqa: E731 - a header line, short
    answers = "; ".join(dict.fromkeys([*u_why, *p_why]))
    return (f"the same on the vendor platform: upstream `{first(u_was)}` and the port's `{first(p_was)}` both read "
            f"`{first(p_text)}` there ({answers})")


def statement_run(tree: ast.Module, line: int, own: Callable[[ast.stmt], bool]) -> list[ast.stmt]:
    """The statements from the one starting at `line` on, in its body, while `own` holds for each (the hunk's
    statements: up to the next one upstream shares); [] when the first does not hold or none starts there."""
    found = _statement_at(tree, line)
    if found is None:
        return []
    _st, body, i, _fn, _cls = found
    out: list[ast.stmt] = []
    for st in body[i:]:
        if not own(st):
            break
        out.append(st)
    return out


def unsupported_feature_branch(evaluator: Evaluator, port_root: Path, port_path: str, up_root: Path, up_path: str,
                               up_line: int) -> str:
    """Evidence that a branch the port drops, upstream's `if <feature> is not None:`, handles a feature the port's
    backend says it does not support on the vendor platform (its `supports_<feature>()` evaluates False there):
    vLLM selects no backend for a layer with that feature whose hook says False, so the branch never runs; ""
    otherwise."""
    up_mod, port_mod = evaluator.module_at(up_root, up_path), evaluator.module_at(port_root, port_path)
    found = _statement_at(up_mod.tree, up_line) if up_mod is not None else None
    if found is None or port_mod is None or not isinstance(found[0], ast.If):
        return ""
    test = found[0].test
    if not (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and len(test.ops) == 1
            and isinstance(test.ops[0], ast.IsNot) and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value is None) or found[0].orelse:
        return ""
    feature = test.left.id
    hooks = {f"supports_{feature}", f"supports_{feature.rstrip('s')}"}
    for cls in (n for n in port_mod.tree.body if isinstance(n, ast.ClassDef)):
        for fn in cls.body:
            if isinstance(fn, ast.FunctionDef) and fn.name in hooks and _is_class_level(fn):
                call = ast.Call(func=ast.Attribute(value=ast.Name(id=cls.name, ctx=ast.Load()), attr=fn.name, ctx=ast.Load()),
                                args=[], keywords=[])
                value = evaluator.value(call, evaluator.scope_in(port_mod, None, None))
                if value is not None and value.exact and value.value is False:
                    return (f"upstream's `if {feature} is not None:` handles {feature}, which {cls.name}.{fn.name}() says the "
                            f"backend does not support on the vendor platform, and vLLM selects no backend for such a layer "
                            f"when its hook says False ({'; '.join(value.why)})")
    return ""


_REGISTER = "direct_register_custom_op"


def registered_by_imported_upstream(port_root: Path, port_path: str, port_line: int, up_root: Path, up_path: str,
                                    up_line: int) -> str:
    """Evidence that a hunk only drops upstream's module-level op registrations (`direct_register_custom_op(...)`)
    for a statement that does nothing at run time (`pass`, an `if TYPE_CHECKING:` block), in a port file that
    imports from that very upstream module: importing it runs upstream's registrations, so the ops are registered
    once, by upstream (registering them again would fail); "" otherwise."""
    port = read_source_cached(port_root, port_path, _MAX_BYTES).tree if (port_root / port_path).is_file() else None
    up = read_source_cached(up_root, up_path, _MAX_BYTES).tree if (up_root / up_path).is_file() else None
    if port is None or up is None:
        return ""
    p = next((i for i, st in enumerate(port.body) if st.lineno == port_line), None)
    u = next((i for i, st in enumerate(up.body) if st.lineno == up_line), None)
    if p is None or u is None or not _no_op(port.body[p]):
        return ""
    ops = []
    for st in up.body[u:]:
        if isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue  # members are compared on their own; the module's other statements make up its hunks
        if not (isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and ast.unparse(st.value.func).endswith(_REGISTER)):
            break
        name = next((k.value.value for k in st.value.keywords if k.arg == "op_name" and isinstance(k.value, ast.Constant)), None)
        ops.append(str(name) if name is not None else "?")
    module = module_name(up_path)
    imports = [st.lineno for st in port.body if isinstance(st, ast.ImportFrom) and not st.level and st.module == module]
    if not ops or not imports:
        return ""
    return (f"upstream's {module} registers {', '.join(ops)} when it is imported ({up_path}:{up_line}), and the port file "
            f"imports from that module (line {imports[0]}): the ops are registered once, by upstream")


def _no_op(st: ast.stmt) -> bool:
    """A statement that does nothing at run time: `pass`, a docstring, an `if TYPE_CHECKING:` block."""
    if isinstance(st, ast.Pass) or (isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant)):
        return True
    return isinstance(st, ast.If) and ast.unparse(st.test).endswith("TYPE_CHECKING") and not st.orelse
