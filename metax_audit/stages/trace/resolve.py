# Static name resolution over the module index: what a name, attribute or call result denotes
# (module, class, function, instance, partial, external dotted path), never by importing.
from __future__ import annotations

import ast
import builtins
import sys
from dataclasses import replace

from metax_audit.core.pysource import unparse_name
from metax_audit.stages.trace.modules import ModuleIndex, ModuleInfo
from metax_audit.stages.trace.values import (
    Cls,
    Ext,
    Func,
    Inst,
    Layer,
    Mod,
    Partial,
    Scope,
    Super,
    Unknown,
    UnknownKind,
    Val,
    Vals,
    _result_of,
    _walk_body,
    decorators,
    first_unknown,
    force_via,
    known,
    plain,
    with_via,
)

_BUILTIN_NAMES = frozenset(dir(builtins))
MAX_DEPTH = 80
_STDLIB = frozenset(sys.stdlib_module_names) | {"typing_extensions"}


# ---------------------------------------------------------------- the resolver


class Resolver:
    def __init__(self, index: ModuleIndex) -> None:
        self.index = index
        self._active: set[tuple] = set()
        self._attr_cache: dict[str, dict[str, list[tuple[ast.expr, ast.AST, Func]]]] = {}
        self._ret_cache: dict[tuple, Vals] = {}
        # `obj.attr = value` written outside the class (a builder filling its metadata object).
        self.assigned: dict[tuple[str, str], list[tuple[ast.expr, Scope]]] = {}

    def record_assignment(self, cls: Cls, attr: str, value: ast.expr, scope: Scope) -> None:
        entries = self.assigned.setdefault((cls.dotted, attr), [])
        if all(e is not value for e, _ in entries):
            entries.append((value, scope))

    def assigned_attr(self, cls: Cls, name: str, depth: int) -> Vals:
        out: list[Val] = []
        for expr, scope in self.assigned.get((cls.dotted, name), []):
            key = ("assigned", cls.dotted, name, id(expr))
            if key in self._active:
                continue
            self._active.add(key)
            try:
                out.extend(self.eval(expr, scope, depth + 1))
            finally:
                self._active.discard(key)
        out = [v for v in out if not (isinstance(v, Ext) and v.dotted == "builtins.None")]
        return force_via(known(out), "attr-assigned") if out else ()

    # ---- modules and dotted paths

    def lookup(self, dotted: str, depth: int = 0) -> Vals:
        if self.index.origin_of(dotted) is None:
            return (Ext(dotted),)
        parts = dotted.split(".")
        for i in range(len(parts), 0, -1):
            mod = self.index.get(".".join(parts[:i]))
            if mod is not None:
                break
        else:
            return (Ext(dotted),)
        vals: Vals = (Mod(mod, mod.name),)
        for attr in parts[i:]:
            vals = known(v2 for v in vals for v2 in self.attr(v, attr, depth + 1))
        return vals

    def module_member(self, mod: ModuleInfo, name: str, depth: int = 0) -> Vals:
        return plain(self._module_member(mod, name, depth))

    def _module_member(self, mod: ModuleInfo, name: str, depth: int = 0) -> Vals:
        if depth > MAX_DEPTH:
            return (Unknown(f"import chain too deep at {mod.name}.{name}"),)
        node = mod.defs.get(name)
        if isinstance(node, ast.ClassDef):
            return (Cls(f"{mod.name}.{name}", mod, node),)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            return (Func(f"{mod.name}.{name}", mod, node),)
        if name in mod.imports:
            target = mod.imports[name]
            key = ("imp", mod.name, name)
            if key in self._active:
                return (Unknown(f"circular import of {target}"),)
            self._active.add(key)
            try:
                return self.lookup(target, depth + 1)
            finally:
                self._active.discard(key)
        if name in mod.assigns:
            return self.eval(mod.assigns[name], Scope.of(mod, None), depth + 1)
        sub = f"{mod.name}.{name}"
        if self.index.exists(sub):
            info = self.index.get(sub)
            if info is not None:
                return (Mod(info, info.name),)
            return (Unknown(f"module {sub} could not be parsed"),)
        for star in mod.star_imports:
            smod = self.index.get(star) if self.index.origin_of(star) else None
            if smod is not None:
                got = known(self.module_member(smod, name, depth + 1))
                if not first_unknown(got):
                    return got
            else:
                return (Unknown(f"star import from {star} may define {name}"),)
        if mod.star_imports:
            return (Unknown(f"star import in {mod.name}: {name} not found"),)
        if "__getattr__" in mod.defs:
            # A module-level __getattr__ (lazy attribute) is resolved by name, as imported.
            return (Ext(f"{mod.name}.{name}", via="module-getattr"),)
        return (Unknown(f"{name} is not defined in {mod.name}"),)

    # ---- classes

    def bases(self, cls: Cls, depth: int = 0) -> list[Cls | Ext]:
        out: list[Cls | Ext] = []
        for b in cls.node.bases:
            expr = b.value if isinstance(b, ast.Subscript) else b
            for v in self.materialize(self.eval(expr, Scope.of(cls.info, None), depth + 1), depth):
                if isinstance(v, Cls | Ext) and v != cls:
                    out.append(v)
        return out

    def mro(self, cls: Cls) -> list[Cls | Ext]:
        """Depth-first left-to-right, good enough for the single-inheritance chains of backends."""
        seen: list[Cls | Ext] = []
        stack: list[Cls | Ext] = [cls]
        while stack and len(seen) < 40:
            c = stack.pop(0)
            if c in seen:
                continue
            seen.append(c)
            if isinstance(c, Cls):
                stack = self.bases(c) + stack
        return seen

    def class_member(self, cls: Cls, name: str, bound: Val | None, skip_first: bool = False, depth: int = 0) -> Vals:
        got = self._class_member(cls, name, bound, skip_first, depth)
        return tuple(v if v.via in {"self-attr", "inherited", "attr-assigned"} else replace(v, via="") for v in got)

    def _class_member(self, cls: Cls, name: str, bound: Val | None, skip_first: bool = False, depth: int = 0) -> Vals:
        chain = self.mro(cls)
        if skip_first:
            chain = chain[1:]
        plain_base: str | None = None
        for c in chain:
            if isinstance(c, Ext):
                if _is_plain_base(c.dotted):
                    # stdlib bases (NamedTuple, ArgumentParser, ABC) last: port and upstream classes win
                    plain_base = plain_base or c.dotted
                    continue
                via = "inherited" if c is not chain[0] else ""
                return (Ext(f"{c.dotted}.{name}", via=via),)
            node = _class_body_def(c.node, name)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                return (Func(f"{c.dotted}.{name}", c.info, node, owner=c, bound=bound, via="inherited" if c != cls else ""),)
            if isinstance(node, ast.ClassDef):
                return (Cls(f"{c.dotted}.{name}", c.info, node),)
            if node is not None and (c.dotted, name) in self.assigned:
                got = known(self.assigned_attr(c, name, depth))
                if got and not first_unknown(got):
                    return got
            if node is not None:  # class attribute
                value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
                if isinstance(node, ast.AnnAssign):
                    # The declared type says more than a default or a Field(...) factory.
                    got = known(self.annotation(node.annotation, c.info, depth + 1))
                    if got and not first_unknown(got):
                        return got
                    if value is None or _is_none(value):
                        why = first_unknown(got)
                        seen = [ast.unparse(e) for e, _ in self.assigned.get((c.dotted, name), [])]
                        tail = f"; assigned only from {', '.join(seen)} (no known type)" if seen else "; no assignment gives it a type"
                        return (Unknown(f"{c.node.name}.{name} is {why.reason if why else 'untyped'}{tail}"),)
                if value is not None:
                    return self.eval(value, Scope.of(c.info, None, owner=c), depth + 1)
            if isinstance(bound, Inst):
                got = self.instance_attr(c, name, depth) or self.assigned_attr(c, name, depth)
                if got:
                    return got
        if plain_base is not None and not plain_base.startswith(("abc.", "typing.Generic")):
            return (Ext(f"{plain_base}.{name}", via="inherited"),)
        if name.startswith("__") and name.endswith("__") and name != "__call__":
            return (Ext(f"builtins.object.{name}", via="inherited"),)
        return (Unknown(f"{cls.dotted} has no attribute {name}"),)

    def instance_attr(self, cls: Cls, name: str, depth: int = 0) -> Vals:
        """`self.name = ...` anywhere in the class's own methods (helpers included)."""
        table = self._attr_cache.get(cls.dotted)
        if table is None:
            table = {}
            for item in cls.node.body:
                if not isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                fn = Func(f"{cls.dotted}.{item.name}", cls.info, item, owner=cls)
                selfname = item.args.args[0].arg if item.args.args else None
                if selfname is None:
                    continue
                for sub in _walk_body(item):
                    targets: list[ast.expr] = []
                    value: ast.expr | None = None
                    if isinstance(sub, ast.Assign):
                        targets, value = sub.targets, sub.value
                    elif isinstance(sub, ast.AnnAssign):
                        attr = _self_attr(sub.target, selfname)
                        if attr:
                            table.setdefault(attr, []).append((sub.annotation, "annotation", fn))  # type: ignore[arg-type]
                        continue
                    for t in targets:
                        attr = _self_attr(t, selfname)
                        if attr and value is not None:
                            table.setdefault(attr, []).append((value, sub, fn))
            self._attr_cache[cls.dotted] = table
        entries = table.get(name)
        if not entries:
            return ()
        out: list[Val] = []
        for expr, stmt, fn in entries:
            key = ("attr", cls.dotted, name, id(expr))
            if key in self._active:
                continue
            self._active.add(key)
            try:
                if stmt == "annotation":
                    out.extend(self.annotation(expr, cls.info, depth + 1))
                else:
                    scope = Scope.of(fn.info, fn.node, owner=cls)
                    out.extend(self.eval(expr, scope, depth + 1))
            finally:
                self._active.discard(key)
        out = [v for v in out if not (isinstance(v, Ext) and v.dotted == "builtins.None")]
        return force_via(known(out), "self-attr") if out else ()

    def materialize(self, vals: Vals, depth: int = 0) -> Vals:
        out: list[Val] = []
        for v in vals:
            if isinstance(v, Ext) and v.lazy:
                out.extend(self.lookup(v.dotted, depth + 1))
            elif isinstance(v, Inst) and isinstance(v.cls, Ext) and v.cls.lazy:
                out.extend(Inst(c, via=v.via) if isinstance(c, Cls | Ext) else c for c in self.lookup(v.cls.dotted, depth + 1))
            else:
                out.append(v)
        return tuple(out)

    def lazy_lookup(self, dotted: str, depth: int = 0) -> Vals:
        if self.index.origin_of(dotted) == "upstream":
            return (Ext(dotted, lazy=True),)
        return self.lookup(dotted, depth)

    # ---- attributes

    def attr(self, val: Val, name: str, depth: int = 0) -> Vals:
        if depth > MAX_DEPTH:
            return (Unknown("resolution too deep"),)
        if (isinstance(val, Ext) and val.lazy) or (isinstance(val, Inst) and isinstance(val.cls, Ext) and val.cls.lazy):
            return known(v2 for v in with_via(self.materialize((val,), depth), val.via) for v2 in self.attr(v, name, depth + 1))
        if isinstance(val, Mod):
            got = self.module_member(val.info, name, depth + 1)
            return with_via(got, val.via) if val.via else got
        if isinstance(val, Cls):
            return with_via(self.class_member(val, name, val, depth=depth + 1), val.via) if val.via else self.class_member(val, name, val, depth=depth + 1)
        if isinstance(val, Inst):
            if isinstance(val.cls, Ext):
                return (Ext(f"{val.cls.dotted}.{name}", via=val.via),)
            got = self.class_member(val.cls, name, val, depth=depth + 1)
            return with_via(got, val.via) if val.via else got
        if isinstance(val, Super):
            return self.class_member(val.cls, name, val.inst, skip_first=True, depth=depth + 1)
        if isinstance(val, Ext):
            if val.via == "inherited":
                # self.x where x is neither a method nor an attribute of the readable classes.
                return (Unknown(f"{val.dotted} is not defined in the port class; its base has no readable source"),)
            return (Ext(f"{val.dotted}.{name}", via=val.via),)
        if isinstance(val, Layer):
            return (Unknown(f"layer attribute {val.name}.{name}", UnknownKind.LAYER_ATTRIBUTE),)
        if isinstance(val, Unknown):
            return (val,)
        return (Unknown(f"attribute {name} of a {type(val).__name__.lower()}"),)

    # ---- names and expressions

    def name(self, ident: str, scope: Scope, depth: int = 0) -> Vals:
        if ident in scope.bindings:
            return scope.bindings[ident]
        if scope.node is not None:
            if ident in scope.localdefs:
                sub = scope.localdefs[ident]
                dotted = f"{scope.info.name}.{scope.node.name}.<locals>.{ident}"
                if isinstance(sub, ast.ClassDef):
                    return (Cls(dotted, scope.info, sub, via="local"),)
                return (Func(dotted, scope.info, sub, via="local", closure=scope),)  # type: ignore[arg-type]
            if ident in scope.lazy:
                return force_via(self.lazy_lookup(scope.lazy[ident], depth + 1), "lazy-import")
            if ident in scope.assigns:
                key = ("local", id(scope.node), ident)
                if key in self._active:
                    return (Unknown(f"recursive definition of {ident}"),)
                self._active.add(key)
                try:
                    vals = known(v for e in scope.assigns[ident] for v in self.eval(e, scope, depth + 1))
                finally:
                    self._active.discard(key)
                return tuple(v for v in vals if not (isinstance(v, Ext) and v.dotted == "builtins.None")) or vals
            if ident in scope.params:
                return self.param(ident, scope, depth)
            if ident in scope.loopvars:
                return (Unknown(f"loop variable {ident}"),)
        if scope.parent is not None:
            return self.name(ident, scope.parent, depth + 1)
        info = scope.info
        if ident in info.defs or ident in info.assigns:
            return self.module_member(info, ident, depth + 1)
        if ident in info.imports:
            target = info.imports[ident]
            via = "relative-import" if _is_relative(info, ident) else "import-alias"
            vals = plain(self.lazy_lookup(target, depth + 1))
            if any(isinstance(v, Cls | Func) and v.dotted != target for v in vals):
                via = "re-export"  # the name is defined elsewhere and re-exported by the imported module
            return with_via(vals, via)
        if ident in _BUILTIN_NAMES:
            return (Ext(f"builtins.{ident}"),)
        if info.star_imports:
            return self.module_member(info, ident, depth + 1)
        return (Unknown(f"name {ident} is not defined"),)

    def param(self, ident: str, scope: Scope, depth: int = 0) -> Vals:
        node = scope.node
        assert node is not None
        arg = scope.params[ident]
        first = (node.args.posonlyargs + node.args.args)[:1]
        decos = decorators(node)
        if first and first[0] is arg and scope.owner is not None and "staticmethod" not in decos:
            return (scope.owner,) if "classmethod" in decos else (Inst(scope.owner),)
        if arg.annotation is not None:
            vals = known(self.annotation(arg.annotation, scope.info, depth + 1))
            if not first_unknown(vals):
                return vals
        return (Unknown(f"call on a parameter of unknown type ({ident})"),)

    def annotation(self, ann: ast.expr, info: ModuleInfo, depth: int = 0) -> Vals:
        if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
            text = ann.value
            try:
                ann = ast.parse(text, mode="eval").body
            except SyntaxError:
                return (Unknown(f"unparsable annotation {text!r}"),)
        if isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):
            return known((*self.annotation(ann.left, info, depth + 1), *self.annotation(ann.right, info, depth + 1)))
        if isinstance(ann, ast.Constant) and ann.value is None:
            return ()
        if isinstance(ann, ast.Subscript):
            head = ast.unparse(ann.value).rsplit(".", 1)[-1]
            inner = ann.slice
            if head in {"Optional", "ClassVar", "Final", "Annotated"}:
                target = inner.elts[0] if isinstance(inner, ast.Tuple) else inner
                return self.annotation(target, info, depth + 1)
            if head == "Union" and isinstance(inner, ast.Tuple):
                return known(v for e in inner.elts for v in self.annotation(e, info, depth + 1))
            if head in {"type", "Type"}:
                return tuple(v.cls if isinstance(v, Inst) else v for v in self.annotation(inner, info, depth + 1))
            if head == "Callable":
                return (Unknown(f"a callable stored with declared type {_short(ann)}"),)
            return self._instances(self.eval(ann.value, Scope.of(info, None), depth + 1))
        if isinstance(ann, ast.Name | ast.Attribute):
            if (ann.attr if isinstance(ann, ast.Attribute) else ann.id) in {"Any", "object"}:
                return (Unknown(f"declared as {ast.unparse(ann)}"),)
            alias = info.assigns.get(ann.id) if isinstance(ann, ast.Name) and ann.id not in info.defs else None
            if isinstance(alias, ast.Subscript | ast.BinOp) and depth < MAX_DEPTH:
                return self.annotation(alias, info, depth + 1)  # a type alias: Foo = Callable[...]
            return self._instances(self.eval(ann, Scope.of(info, None), depth + 1))
        return (Unknown(f"annotation {ast.unparse(ann)}"),)

    @staticmethod
    def _instances(vals: Vals) -> Vals:
        out: list[Val] = []
        for v in vals:
            if isinstance(v, Cls | Ext):
                if isinstance(v, Ext) and v.dotted == "builtins.None":
                    continue
                out.append(Inst(v, via=v.via))
            else:
                out.append(v)
        return tuple(out)

    def eval(self, expr: ast.expr, scope: Scope, depth: int = 0) -> Vals:
        if depth > MAX_DEPTH:
            return (Unknown("resolution too deep"),)
        if isinstance(expr, ast.Name):
            return self.name(expr.id, scope, depth + 1)
        if isinstance(expr, ast.Attribute):
            base = self.eval(expr.value, scope, depth + 1)
            return known(v2 for v in base for v2 in self.attr(v, expr.attr, depth + 1))
        if isinstance(expr, ast.Call):
            return self.call_result(expr, scope, depth + 1)
        if isinstance(expr, ast.IfExp):
            return known((*self.eval(expr.body, scope, depth + 1), *self.eval(expr.orelse, scope, depth + 1)))
        if isinstance(expr, ast.BoolOp):
            return known(v for e in expr.values for v in self.eval(e, scope, depth + 1))
        if isinstance(expr, ast.Constant) and expr.value is None:
            return (Ext("builtins.None"),)
        if isinstance(expr, ast.Subscript):
            return (Unknown(f"value read from a container: {_short(expr)}"),)
        return (Unknown(f"value of {type(expr).__name__.lower()} {_short(expr)}"),)

    def callee(self, func: ast.expr, scope: Scope, depth: int = 0) -> Vals:
        """What a call's function expression denotes; `kernel[grid](...)` launches `kernel`."""
        if isinstance(func, ast.Subscript):
            return force_via(self.eval(func.value, scope, depth + 1), "kernel-launch")
        if isinstance(func, ast.Call) and isinstance(func.func, ast.Name) and func.func.id == "super" and scope.owner is not None:
            return ()
        return self.eval(func, scope, depth + 1)

    def call_result(self, call: ast.Call, scope: Scope, depth: int = 0) -> Vals:
        f = call.func
        if isinstance(f, ast.Name) and f.id == "super" and scope.owner is not None and "super" not in scope.info.defs:
            inst = self.name(scope.node.args.args[0].arg, scope, depth + 1) if scope.node is not None and scope.node.args.args else (Inst(scope.owner),)
            start = scope.owner
            if call.args:
                # super(X, self): the lookup starts after X in self's MRO, not after the enclosing class.
                named = [v for v in self.eval(call.args[0], scope, depth + 1) if isinstance(v, Cls)]
                if not named:
                    return (Unknown(f"super() of {_short(call.args[0])}, a class the audit cannot read"),)
                start = named[0]
            return (Super(start, inst[0] if inst else Inst(scope.owner)),)
        fvals = self.materialize(self.callee(f, scope, depth + 1), depth)
        out: list[Val] = []
        for fv in fvals:
            if isinstance(fv, Ext) and fv.dotted == "typing.cast" and call.args:
                out.extend(self.annotation(call.args[0], scope.info, depth + 1))
            elif isinstance(fv, Ext) and fv.dotted == "builtins.getattr" and len(call.args) >= 2:
                name = call.args[1]
                if isinstance(name, ast.Constant) and isinstance(name.value, str):
                    obj = self.eval(call.args[0], scope, depth + 1)
                    out.extend(force_via(known(v2 for v in obj for v2 in self.attr(v, name.value, depth + 1)), "getattr"))
                else:
                    out.append(Unknown(f"dynamic attribute: getattr with a computed name ({_short(name)})"))
            elif isinstance(fv, Ext | Func) and _is_partial(fv) and call.args:
                target = self.eval(call.args[0], scope, depth + 1)
                out.extend(Partial(t, call, scope.info, via="partial") for t in known(target))
            elif isinstance(fv, Cls):
                out.append(Inst(fv, via=fv.via))
            elif isinstance(fv, Ext):
                last = fv.dotted.rsplit(".", 1)[-1]
                if last[:1].isupper() and not last.isupper():
                    out.append(Inst(fv, via=fv.via))
                else:
                    out.append(_result_of(fv.dotted))  # return type unknown
            elif isinstance(fv, Func):
                out.extend(self.returns(fv, depth + 1))
            elif isinstance(fv, Partial):
                out.extend(self.returns(fv.func, depth + 1) if isinstance(fv.func, Func) else (Unknown("result of a partial"),))
            elif isinstance(fv, Unknown):
                out.append(fv)
            else:
                out.append(Unknown(f"result of calling a {type(fv).__name__.lower()}"))
        return known(out) if out else (Unknown("call result"),)

    def returns(self, fn: Func, depth: int = 0) -> Vals:
        """Return annotation when it names something, else the union of the returned values."""
        key = ("ret", fn.dotted, id(fn.node), fn.bound)
        if key in self._ret_cache:
            return self._ret_cache[key]
        if key in self._active or depth > MAX_DEPTH:
            return (Unknown(f"recursive return of {fn.dotted}"),)
        self._active.add(key)
        try:
            vals: Vals = ()
            # In readable port code the returned values are more precise than the annotation
            # (get_impl_cls -> type[AbstractImpl] returns the concrete class).
            if fn.info.origin == "port":
                scope = Scope.of(fn.info, fn.node, owner=fn.owner, parent=fn.closure)
                if isinstance(fn.bound, Inst | Cls) and fn.node.args.args:
                    scope.bindings[fn.node.args.args[0].arg] = (fn.bound,)
                rets = [r.value for r in _walk_body(fn.node) if isinstance(r, ast.Return) and r.value is not None]
                vals = known(v for r in rets for v in self.eval(r, scope, depth + 1))
                if first_unknown(vals):
                    vals = ()
            if not vals and fn.node.returns is not None:
                vals = known(self.annotation(fn.node.returns, fn.info, depth + 1))
                if first_unknown(vals):
                    vals = ()
            if not vals:
                vals = (_result_of(fn.dotted),)
        finally:
            self._active.discard(key)
        self._ret_cache[key] = vals
        return vals


def _class_body_def(node: ast.ClassDef, name: str) -> ast.AST | None:
    found = None
    for item in node.body:
        if (isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name == name) or (isinstance(item, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in item.targets)) or (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.target.id == name) or (isinstance(item, ast.ClassDef) and item.name == name):
            found = item
    return found


def _self_attr(t: ast.expr, selfname: str) -> str | None:
    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == selfname:
        return t.attr
    return None


def _is_plain_base(dotted: str) -> bool:
    return dotted.split(".")[0] in _STDLIB or dotted.startswith("builtins.")


def _is_none(e: ast.expr) -> bool:
    return isinstance(e, ast.Constant) and e.value is None


def _is_partial(v: Val) -> bool:
    d = v.dotted if isinstance(v, Ext | Func) else ""
    return d in {"functools.partial", "functools.partialmethod"}


def _is_relative(info: ModuleInfo, ident: str) -> bool:
    for node in info.tree.body:
        if isinstance(node, ast.ImportFrom) and node.level and any((a.asname or a.name) == ident for a in node.names):
            return True
    return False


def _short(e: ast.AST) -> str:
    text = unparse_name(e)
    return text if len(text) <= 60 else text[:57] + "..."
