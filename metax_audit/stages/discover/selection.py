# The platform's selection function read as registrations: every class-path string that
# `get_attn_backend_cls` (or a helper it calls) can return, with the condition that returns it.
from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from metax_audit.core.pysource import always_exits

# Hand-written rather than a type checker or griffe: neither evaluates string values, and what is
# needed is a small partial evaluator of str-valued expressions (constants, f-strings, `+`, `x if c
# else y`, dict maps and `.get`, local/module/class constants, helper calls with bound arguments).

_MAX_DEPTH = 4  # helper calls followed from the selector
_MAX_VALUES = 64  # string values one expression may stand for (f-strings over maps multiply)
_CLASS_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
_ENUM_OWNER = re.compile(r"(Enum|_Backend|Backend)$")

Cond = tuple[str, ...]
Loader = Callable[[str], "tuple[ast.Module, str] | None"]  # module -> (tree, repo-relative path)


@dataclass(frozen=True)
class Selected:
    """One class path the selector can return, under one condition (the branches and map keys)."""

    class_path: str
    condition: str  # " and "-joined, outermost first; "" when unconditional
    path: str  # repo-relative file of the `return`
    line: int
    function: str  # the selector (or helper) holding the return
    member: str  # the enum member the condition compares the selected backend with, "" if none


@dataclass(frozen=True)
class _Module:
    tree: ast.Module
    path: str
    name: str


class _Env:
    """Names bound in one function activation: parameters (to caller expressions) and locals."""

    def __init__(self, module: _Module, func: ast.FunctionDef | ast.AsyncFunctionDef | None,
                 owner: ast.ClassDef | None, params: dict[str, tuple[ast.expr, _Env]], parent: _Env | None) -> None:
        self.module, self.func, self.owner, self.params, self.parent = module, func, owner, params, parent
        self.locals: dict[str, list[tuple[ast.expr, Cond]]] = {}
        self.nested: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        if func is not None:
            for stmt, conds in _walk(func.body, ()):
                if isinstance(stmt, ast.Assign):
                    for target in stmt.targets:
                        if isinstance(target, ast.Name):
                            self.locals.setdefault(target.id, []).append((stmt.value, conds))
                elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
                    self.locals.setdefault(stmt.target.id, []).append((stmt.value, conds))
                elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                    self.nested[stmt.name] = stmt


def _negate(test: str) -> str:
    try:
        node = ast.parse(test, mode="eval").body
    except SyntaxError:
        return f"not ({test})"
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return ast.unparse(node.operand)
    if isinstance(node, ast.Name | ast.Attribute | ast.Call | ast.Subscript):
        return f"not {test}"
    return f"not ({test})"


def _walk(body: list[ast.stmt], conds: Cond) -> Iterator[tuple[ast.stmt, Cond]]:
    """Statements with the conditions under which they run: branch tests, and the negated test of
    every earlier `if` that always returns (so code after `if x: return A` runs under `not x`)."""
    for stmt in body:
        yield stmt, conds
        if isinstance(stmt, ast.If):
            test = ast.unparse(stmt.test)
            yield from _walk(stmt.body, (*conds, test))
            if stmt.orelse:
                yield from _walk(stmt.orelse, (*conds, _negate(test)))
            if always_exits(stmt.body) and not stmt.orelse:
                conds = (*conds, _negate(test))
        elif isinstance(stmt, ast.For | ast.AsyncFor | ast.While | ast.With | ast.AsyncWith):
            yield from _walk(stmt.body, conds)
            yield from _walk(getattr(stmt, "orelse", []), conds)
        elif isinstance(stmt, ast.Try):
            for block in (stmt.body, stmt.orelse, stmt.finalbody, *[h.body for h in stmt.handlers]):
                yield from _walk(block, conds)
        elif isinstance(stmt, ast.Match):
            subject = ast.unparse(stmt.subject)
            for case in stmt.cases:
                yield from _walk(case.body, (*conds, f"{subject} matches {ast.unparse(case.pattern)}"))


class _Evaluator:
    def __init__(self, loader: Loader) -> None:
        self.loader = loader
        self._modules: dict[str, _Module | None] = {}

    def module(self, name: str) -> _Module | None:
        if name not in self._modules:
            got = self.loader(name)
            self._modules[name] = _Module(got[0], got[1], name) if got else None
        return self._modules[name]

    # ---- names

    def _module_binding(self, mod: _Module, name: str, depth: int) -> tuple[str, object, _Module] | None:
        """('const', expr) / ('func', def) / ('class', def) for a module-level name, following `from x import`."""
        for stmt in mod.tree.body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef) and stmt.name == name:
                return "func", stmt, mod
            if isinstance(stmt, ast.ClassDef) and stmt.name == name:
                return "class", stmt, mod
            if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets):
                return "const", stmt.value, mod
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == name and stmt.value:
                return "const", stmt.value, mod
        if depth > 3:
            return None
        for stmt in mod.tree.body:
            if isinstance(stmt, ast.ImportFrom) and stmt.module and stmt.level == 0:
                for alias in stmt.names:
                    if (alias.asname or alias.name) == name and (other := self.module(stmt.module)) is not None:
                        return self._module_binding(other, alias.name, depth + 1)
        return None

    @staticmethod
    def _class_attr(cls: ast.ClassDef, name: str) -> ast.expr | ast.FunctionDef | ast.AsyncFunctionDef | None:
        for stmt in cls.body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef) and stmt.name == name:
                return stmt
            if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets):
                return stmt.value
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == name:
                return stmt.value
        return None

    def _name(self, name: str, env: _Env, depth: int) -> list[tuple[str, Cond]]:
        if name in env.params:
            expr, caller = env.params[name]
            return self.strings(expr, caller, depth)
        if name in env.locals:
            out: list[tuple[str, Cond]] = []
            for expr, conds in env.locals[name]:
                out += [(s, (*conds, *c)) for s, c in self.strings(expr, env, depth)]
            return out
        if env.parent is not None:  # a nested def reads its enclosing function's names
            return self._name(name, env.parent, depth)
        found = self._module_binding(env.module, name, 0)
        if found and found[0] == "const":
            assert isinstance(found[1], ast.expr)
            return self.strings(found[1], _Env(found[2], None, None, {}, None), depth)
        return []

    # ---- expressions

    def strings(self, node: ast.expr | None, env: _Env, depth: int) -> list[tuple[str, Cond]]:
        """Every str the expression can evaluate to, each with the condition that gives it."""
        if node is None:
            return []
        if isinstance(node, ast.Constant):
            return [(node.value, ())] if isinstance(node.value, str) else []
        if isinstance(node, ast.JoinedStr):
            parts: list[list[tuple[str, Cond]]] = []
            for value in node.values:
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    parts.append([(value.value, ())])
                elif isinstance(value, ast.FormattedValue) and value.conversion == -1 and value.format_spec is None:
                    parts.append(self.strings(value.value, env, depth))
                else:
                    return []
            return self._product(parts)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self._product([self.strings(node.left, env, depth), self.strings(node.right, env, depth)])
        if isinstance(node, ast.IfExp):
            test = ast.unparse(node.test)
            return ([(s, (test, *c)) for s, c in self.strings(node.body, env, depth)]
                    + [(s, (_negate(test), *c)) for s, c in self.strings(node.orelse, env, depth)])
        if isinstance(node, ast.Name):
            return self._name(node.id, env, depth)
        if isinstance(node, ast.Attribute):
            owner = self._owner_class(node.value, env)
            if owner is not None:
                attr = self._class_attr(owner[0], node.attr)
                if isinstance(attr, ast.expr):
                    return self.strings(attr, _Env(owner[1], None, owner[0], {}, None), depth)
            return []
        if isinstance(node, ast.Subscript):
            return self._subscript(node.value, node.slice, None, env, depth)
        if isinstance(node, ast.Call):
            return self._call(node, env, depth)
        return []

    @staticmethod
    def _product(parts: list[list[tuple[str, Cond]]]) -> list[tuple[str, Cond]]:
        if any(not p for p in parts):
            return []
        out = []
        for combo in itertools.islice(itertools.product(*parts), _MAX_VALUES):
            out.append(("".join(s for s, _ in combo), tuple(c for _, cs in combo for c in cs)))
        return out

    def _dict_entries(self, node: ast.expr, env: _Env) -> tuple[str, list[tuple[ast.expr, ast.expr, Cond]]] | None:
        """(name of the map, [(key, value, conds)]) for a dict literal or a name bound to one."""
        if isinstance(node, ast.Dict):
            return "", [(k, v, ()) for k, v in zip(node.keys, node.values, strict=True) if k is not None]
        if isinstance(node, ast.Name):
            bound: list[tuple[ast.expr, Cond]] = []
            if node.id in env.locals:
                bound = env.locals[node.id]
            else:
                found = self._module_binding(env.module, node.id, 0)
                if found and found[0] == "const" and isinstance(found[1], ast.expr):
                    bound = [(found[1], ())]
            entries = [(k, v, conds) for expr, conds in bound if isinstance(expr, ast.Dict)
                       for k, v in zip(expr.keys, expr.values, strict=True) if k is not None]
            return (node.id, entries) if entries else None
        if isinstance(node, ast.Attribute):
            owner = self._owner_class(node.value, env)
            attr = self._class_attr(owner[0], node.attr) if owner else None
            if isinstance(attr, ast.Dict):
                return node.attr, [(k, v, ()) for k, v in zip(attr.keys, attr.values, strict=True) if k is not None]
        return None

    def _subscript(self, mapping: ast.expr, key: ast.expr, default: ast.expr | None, env: _Env,
                   depth: int) -> list[tuple[str, Cond]]:
        entries = self._dict_entries(mapping, env)
        if entries is None:
            return []
        name, items = entries
        key_text = ast.unparse(key)
        out: list[tuple[str, Cond]] = []
        key_value = _value_of(key)
        for k, v, conds in items:
            entry = _value_of(k)
            if key_value is not _UNKNOWN and entry is not _UNKNOWN:
                if key_value != entry:
                    continue  # a literal key picks its one entry
                cond: Cond = ()
            else:
                cond = (f"{key_text} == {ast.unparse(k)}",)
            out += [(s, (*conds, *cond, *c)) for s, c in self.strings(v, env, depth)]
        if default is not None:
            missing = f"{key_text} not in {name or 'the map'}"
            out += [(s, (missing, *c)) for s, c in self.strings(default, env, depth)]
        return out

    def _owner_class(self, node: ast.expr, env: _Env) -> tuple[ast.ClassDef, _Module] | None:
        if isinstance(node, ast.Name):
            if node.id in {"cls", "self"} and env.owner is not None:
                return env.owner, env.module
            found = self._module_binding(env.module, node.id, 0)
            if found and found[0] == "class":
                assert isinstance(found[1], ast.ClassDef)
                return found[1], found[2]
        return None

    def _call(self, node: ast.Call, env: _Env, depth: int) -> list[tuple[str, Cond]]:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "get" and node.args:
            default = node.args[1] if len(node.args) > 1 else None
            return self._subscript(func.value, node.args[0], default, env, depth)
        if depth >= _MAX_DEPTH:
            return []
        target: tuple[ast.FunctionDef | ast.AsyncFunctionDef, _Module, ast.ClassDef | None, _Env | None] | None = None
        if isinstance(func, ast.Name):
            scope: _Env | None = env
            while scope is not None and target is None:
                if func.id in scope.nested:
                    target = (scope.nested[func.id], scope.module, scope.owner, scope)
                scope = scope.parent
            if target is None:
                found = self._module_binding(env.module, func.id, 0)
                if found and found[0] == "func":
                    assert isinstance(found[1], ast.FunctionDef | ast.AsyncFunctionDef)
                    target = (found[1], found[2], None, None)
        elif isinstance(func, ast.Attribute):
            owner = self._owner_class(func.value, env)
            attr = self._class_attr(owner[0], func.attr) if owner else None
            if owner and isinstance(attr, ast.FunctionDef | ast.AsyncFunctionDef):
                target = (attr, owner[1], owner[0], None)
        if target is None:
            return []
        fn, mod, owner_cls, parent = target
        params = self._bind(fn, node, env, method=isinstance(func, ast.Attribute))
        inner = _Env(mod, fn, owner_cls, params, parent)
        return [(s, c) for s, c, _ in self.returns(inner, depth + 1)]

    @staticmethod
    def _bind(fn: ast.FunctionDef | ast.AsyncFunctionDef, call: ast.Call, env: _Env, *, method: bool) -> dict[str, tuple[ast.expr, _Env]]:
        names = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
        if method and names and names[0] in {"self", "cls"}:
            names = names[1:]
        bound: dict[str, tuple[ast.expr, _Env]] = {}
        for name, arg in zip(names, call.args, strict=False):
            if isinstance(arg, ast.Starred):
                break
            bound[name] = (arg, env)
        for kw in call.keywords:
            if kw.arg is not None:
                bound[kw.arg] = (kw.value, env)
        defaults = fn.args.defaults
        for name, default in zip(names[len(names) - len(defaults):], defaults, strict=False):
            bound.setdefault(name, (default, env))
        return bound

    def returns(self, env: _Env, depth: int) -> list[tuple[str, Cond, int]]:
        assert env.func is not None
        out: list[tuple[str, Cond, int]] = []
        for stmt, conds in _walk(env.func.body, ()):
            if isinstance(stmt, ast.Return) and stmt.value is not None:
                out += [(s, (*conds, *c), stmt.lineno) for s, c in self.strings(stmt.value, env, depth)]
        return out


_UNKNOWN = object()


def _value_of(node: ast.expr) -> object:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _UNKNOWN


def _member(conds: Cond) -> str:
    for cond in conds:
        try:
            test = ast.parse(cond, mode="eval").body
        except SyntaxError:
            continue
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq | ast.Is):
            for side in (test.left, test.comparators[0]):
                if isinstance(side, ast.Attribute) and isinstance(side.value, ast.Name) and _ENUM_OWNER.search(side.value.id):
                    return side.attr
    return ""


def _equality(cond: str) -> tuple[str, str] | None:
    """(left, right) of `left == right`, else None."""
    try:
        test = ast.parse(cond, mode="eval").body
    except SyntaxError:
        return None
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
        return ast.unparse(test.left), ast.unparse(test.comparators[0])
    return None


def _literal(text: str) -> bool:
    try:
        ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False
    return True


def _simplify(conds: Cond) -> Cond:
    """Drop repeats, literal tautologies (`(1, 2) == (1, 2)`, from a map's default entry) and the
    `not (x == A)` of an elif chain once a later `x == B` implies it."""
    conds = tuple(dict.fromkeys(conds))
    eqs = [e for c in conds if (e := _equality(c))]
    out: list[str] = []
    for cond in conds:
        eq = _equality(cond)
        if eq and eq[0] == eq[1] and _literal(eq[0]):
            continue
        neg = _equality(cond[5:-1]) if cond.startswith("not (") and cond.endswith(")") else None
        if neg and any(left == neg[0] and right != neg[1] for left, right in eqs):
            continue
        out.append(cond)
    return tuple(out)


def selections(tree: ast.Module, path: str, module: str, selectors: tuple[str, ...], loader: Loader) -> list[Selected]:
    """Class paths returned by the `selectors` (functions or methods of classes in `tree`)."""
    evaluator = _Evaluator(loader)
    here = _Module(tree, path, module)
    evaluator._modules[module] = here
    found: list[Selected] = []
    for owner, fn in _selector_defs(tree, selectors):
        env = _Env(here, fn, owner, {}, None)
        for value, conds, line in evaluator.returns(env, 0):
            if not _CLASS_PATH.match(value) or not value.rsplit(".", 1)[1][:1].isupper():
                continue  # a log message or a module path, not a class
            conds = _simplify(conds)
            found.append(Selected(value, " and ".join(conds), path, line, fn.name, _member(conds)))
    return found


def _selector_defs(tree: ast.Module, selectors: tuple[str, ...]) -> Iterator[tuple[ast.ClassDef | None, ast.FunctionDef | ast.AsyncFunctionDef]]:
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef) and stmt.name in selectors:
            yield None, stmt
        elif isinstance(stmt, ast.ClassDef):
            for item in stmt.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name in selectors:
                    yield stmt, item


__all__ = ["Selected", "selections"]
