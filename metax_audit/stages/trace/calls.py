# Call-site extraction: walks function bodies in order, keeps the enclosing branch conditions and
# isinstance narrowing, turns each call into a CallSite (or an Unresolved) and follows port calls.
from __future__ import annotations

import ast
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from metax_audit.core.models import CallArg, CallOrigin, CallSite, Location, Unresolved
from metax_audit.core.pysource import always_exits, ast_children, ast_walk, unparse_name
from metax_audit.stages.trace.modules import ModuleInfo
from metax_audit.stages.trace.resolve import Resolver
from metax_audit.stages.trace.values import (
    Cls,
    Ext,
    Func,
    Inst,
    Layer,
    Partial,
    Scope,
    Super,
    Unknown,
    UnknownKind,
    Val,
    Vals,
    decorators,
    first_unknown,
    known,
)

# Receiver-unknown method calls that are tensor/container plumbing, not kernels: skipping them keeps
# the unresolved list readable. Host syncs stay (the graph-capture check needs them).
HOST_SYNC = frozenset({"item", "tolist", "cpu", "numpy", "synchronize"})
PLUMBING = frozenset(
    ["view", "view_as", "reshape", "reshape_as", "contiguous", "size", "dim", "numel", "stride", "shape", "t", "transpose", "permute", "unsqueeze", "squeeze", "flatten", "unflatten", "expand", "expand_as", "repeat", "repeat_interleave", "narrow", "select", "split", "chunk", "unbind", "index_select", "gather", "scatter", "scatter_", "masked_fill", "masked_fill_", "fill_", "zero_", "copy_", "clone", "detach", "to", "type", "type_as", "float", "half", "bfloat16", "int", "long", "bool", "double", "sum", "mean", "max", "min", "amax", "amin", "abs", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "pow", "mul", "mul_", "add", "add_", "sub", "sub_", "div", "div_", "neg", "clamp", "clamp_", "cumsum", "cumsum_", "argmax", "argmin", "sort", "topk", "any", "all", "eq", "ne", "lt", "le", "gt", "ge", "nonzero", "new_empty", "new_zeros", "new_full", "new_ones", "new_tensor", "data_ptr", "element_size", "storage_offset", "untyped_storage", "is_contiguous", "get_device", "pin_memory", "cuda", "record_stream", "index_put_", "index_add_", "index_copy_", "index_fill_", "copy_to_gpu", "tensor", "append", "extend", "insert", "pop", "popitem", "remove", "clear", "update", "get", "setdefault", "items", "keys", "values", "count", "index", "join", "format", "startswith", "endswith", "strip", "lstrip", "rstrip", "lower", "upper", "replace", "encode", "decode", "add_", "discard", "issubset", "union", "movedim", "scatter_reduce", "scatter_reduce_", "softmax", "log_softmax", "float8", "masked_scatter_", "roll", "flip", "debug", "info", "warning", "warning_once", "info_once", "debug_once", "error", "exception", "critical", "log"]
)
_COMMENTED_ARG = re.compile(r"^#\s*([A-Za-z_]\w*)\s*=\s*(.+?)\s*,?\s*$")
_BUILTIN_TOPS = frozenset({"builtins", "torch", "numpy", "np", *sys.stdlib_module_names}) - {"__future__"}


def _unknown_site(t: Unknown, method: str | None, site: Callable[..., CallSite], loc: Location, text: str
                  ) -> CallSite | Unresolved | None:
    """A call of a value the resolver could not tell: a tensor method (skipped, or a host sync), a
    layer attribute, or an unresolved call with the resolver's reason."""
    if method in PLUMBING:
        return None
    if method is not None and t.kind is UnknownKind.TORCH_RESULT and method not in HOST_SYNC:
        return None  # a method of a tensor a torch factory returned
    if method in HOST_SYNC:
        return site(f"torch.Tensor.{method}", "builtin", "tensor-method")
    if t.kind is UnknownKind.LAYER_ATTRIBUTE:
        return site(None, "unresolved", "layer")
    return Unresolved(loc, text, t.reason)


@dataclass
class Budget:
    max_depth: int = 6
    max_functions: int = 1500
    analysed: int = 0


@dataclass
class Collected:
    calls: dict[tuple, CallSite] = field(default_factory=dict)
    unresolved: dict[tuple, Unresolved] = field(default_factory=dict)
    layer_reads: dict[str, tuple[str, int]] = field(default_factory=dict)  # attr -> first (path, line)
    walked: dict[str, Func] = field(default_factory=dict)  # qualname -> function walked
    files: set[str] = field(default_factory=set)
    self_attrs: dict[tuple[str, str], tuple[Vals, str, int]] = field(default_factory=dict)


class Classifier:
    def __init__(self, resolver: Resolver, kernel_tops: frozenset[str]) -> None:
        self.resolver = resolver
        self.kernel_tops = kernel_tops

    def origin(self, dotted: str) -> CallOrigin:
        o = self.resolver.index.origin_of(dotted)
        if o is not None:
            return o
        top = dotted.split(".")[0]
        if dotted.startswith("torch.ops") or top in self.kernel_tops:
            return "external"
        if top in _BUILTIN_TOPS:
            return "builtin"
        return "external"


def literal_of(node: ast.expr) -> str | None:
    try:
        return repr(ast.literal_eval(node))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def call_args(call: ast.Call, info: ModuleInfo, skip_first: int = 0) -> tuple[tuple[CallArg, ...], bool, bool]:
    # Arguments do not depend on the calling context: computed once per call node.
    cached = getattr(call, "_mxa_args", None)
    if cached is not None and cached[0] == skip_first:
        return cached[1]
    result = _call_args(call, info, skip_first)
    call._mxa_args = (skip_first, result)  # type: ignore[attr-defined]
    return result


def _call_args(call: ast.Call, info: ModuleInfo, skip_first: int) -> tuple[tuple[CallArg, ...], bool, bool]:
    args: list[CallArg] = []
    star_a = star_k = False
    pos = 0
    for i, a in enumerate(call.args):
        if i < skip_first:
            continue
        if isinstance(a, ast.Starred):
            star_a = True
            args.append(CallArg(None, None, "*" + unparse_name(a.value)))
            continue
        args.append(CallArg(None, pos, unparse_name(a), literal_of(a)))
        pos += 1
    for k in call.keywords:
        if k.arg is None:
            star_k = True
            args.append(CallArg(None, None, "**" + unparse_name(k.value)))
        else:
            args.append(CallArg(k.arg, None, unparse_name(k.value), literal_of(k.value)))
    args.extend(commented_args(call, info))
    return tuple(args), star_a, star_k


def commented_args(call: ast.Call, info: ModuleInfo) -> list[CallArg]:
    """`# name=value,` lines inside this call's parentheses (not inside a nested call's)."""
    end = getattr(call, "end_lineno", None)
    if end is None or end == call.lineno or not info.has_comment_between(call.lineno, end):
        return []
    comments = info.comment_lines()
    if not comments:
        return []
    inner: list[tuple[int, int]] = []
    for sub in [*call.args, *(k.value for k in call.keywords)]:
        for n in ast_walk(sub):
            if isinstance(n, ast.Call) and getattr(n, "end_lineno", None):
                inner.append((n.lineno, n.end_lineno))  # type: ignore[arg-type]
    start = call.func.end_lineno or call.lineno
    out = []
    for line in range(start, end + 1):
        text = comments.get(line)
        if text is None or any(a < line < b for a, b in inner):
            continue
        m = _COMMENTED_ARG.match(text)
        if m and not m.group(2).startswith("="):
            value = m.group(2).rstrip(",").strip()
            out.append(CallArg(m.group(1), None, value, _lit_text(value), commented_out=True))
    return out


def _lit_text(text: str) -> str | None:
    try:
        return literal_of(ast.parse(text, mode="eval").body)
    except SyntaxError:
        return None


class Walker:
    """Walks one function (with argument bindings), records calls, follows port callees."""

    def __init__(self, resolver: Resolver, classifier: Classifier, out: Collected, budget: Budget, follow_upstream_methods: bool = True, record_attrs: bool = True) -> None:
        self.record_attrs = record_attrs
        self.r = resolver
        self.c = classifier
        self.out = out
        self.budget = budget
        self.follow_upstream_methods = follow_upstream_methods
        self._done: set[tuple] = set()

    def walk(self, fn: Func, bindings: dict[str, Vals] | None = None, depth: int = 0) -> None:
        key = (fn.dotted, id(fn.node), _bkey(bindings))
        if key in self._done or depth > self.budget.max_depth:
            return
        if self.budget.analysed >= self.budget.max_functions:
            # Say that the walk was cut, instead of silently returning fewer call sites.
            loc = Location(fn.info.path, fn.node.lineno, fn.dotted)
            self.out.unresolved.setdefault(("budget",), Unresolved(loc, fn.dotted, f"not traced: the {self.budget.max_functions}-function budget of this walk was used up"))
            return
        self._done.add(key)
        self.budget.analysed += 1
        scope = Scope.of(fn.info, fn.node, owner=fn.owner, bindings=bindings, parent=fn.closure)
        if fn.bound is not None and fn.node.args.args and fn.node.args.args[0].arg not in scope.bindings:
            decos = decorators(fn.node)
            if "staticmethod" not in decos:
                scope.bindings[fn.node.args.args[0].arg] = (fn.bound,) if not isinstance(fn.bound, Super) else (fn.bound.inst,)
        self.out.walked.setdefault(fn.dotted, fn)
        if fn.info.origin == "port":
            self.out.files.add(fn.info.path)
        self._block(fn.node.body, scope, [], {}, fn, depth)

    # ---- statements

    def _block(self, stmts: list[ast.stmt], scope: Scope, conds: list[str], narrow: dict[str, Vals], fn: Func, depth: int) -> None:
        narrow = dict(narrow)
        for st in stmts:
            if isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            if isinstance(st, ast.If):
                self._exprs(st.test, scope, conds, narrow, fn, depth)
                test = ast.unparse(st.test)
                body_narrow = dict(narrow)
                body_narrow.update(self._isinstance_facts(st.test, scope))
                self._block(st.body, scope, [*conds, test], body_narrow, fn, depth)
                if st.orelse:
                    self._block(st.orelse, scope, [*conds, _negate(test)], narrow, fn, depth)
                # An early exit (`if not use_cascade: ... return`): what follows runs only when the
                # branch that exits was not taken, so its calls carry that condition too.
                if always_exits(st.body) and not always_exits(st.orelse):
                    conds = [*conds, _negate(test)]
                elif st.orelse and always_exits(st.orelse) and not always_exits(st.body):
                    conds = [*conds, test]
                continue
            if isinstance(st, ast.Assert):
                self._exprs(st.test, scope, conds, narrow, fn, depth)
                narrow.update(self._isinstance_facts(st.test, scope))
                continue
            if isinstance(st, ast.Assign | ast.AnnAssign):
                self._record_self_attr(st, scope, fn)
                self._record_obj_attr(st, self._scope_with(scope, narrow))
            # Assignments invalidate a narrowing of the same name.
            for t in _assigned_names(st):
                narrow.pop(t, None)
            nested = [getattr(st, n) for n in ("body", "orelse", "finalbody") if isinstance(getattr(st, n, None), list)]
            handlers = [h.body for h in getattr(st, "handlers", []) or []]
            for child in ast_children(st):
                if isinstance(child, ast.expr):
                    self._exprs(child, scope, conds, narrow, fn, depth)
                elif isinstance(child, ast.withitem):
                    self._exprs(child.context_expr, scope, conds, narrow, fn, depth)
                elif isinstance(child, ast.match_case):
                    self._block(child.body, scope, [*conds, "case " + ast.unparse(child.pattern)], narrow, fn, depth)
            for block in [*nested, *handlers]:
                self._block(block, scope, conds, narrow, fn, depth)

    def _isinstance_facts(self, test: ast.expr, scope: Scope) -> dict[str, Vals]:
        facts: dict[str, Vals] = {}
        tests = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
        for t in tests:
            if isinstance(t, ast.Call) and isinstance(t.func, ast.Name) and t.func.id == "isinstance" and len(t.args) == 2 and isinstance(t.args[0], ast.Name):
                types = t.args[1].elts if isinstance(t.args[1], ast.Tuple) else [t.args[1]]
                vals: list[Val] = []
                for ty in types:
                    for v in self.r.eval(ty, scope):
                        if isinstance(v, Cls | Ext):
                            vals.append(Inst(v, via=v.via))
                if vals:
                    facts[t.args[0].id] = tuple(vals)
        return facts

    def _record_obj_attr(self, st: ast.Assign | ast.AnnAssign, scope: Scope) -> None:
        """`meta.wrapper = make()` on a port object: the attribute's value for later readers."""
        if not self.record_attrs or not isinstance(st.value, ast.Call | ast.Name):
            return
        targets = st.targets if isinstance(st, ast.Assign) else [st.target]
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id not in {"self", "cls"}:
                for v in self.r.name(t.value.id, scope):
                    if isinstance(v, Inst) and isinstance(v.cls, Cls) and v.cls.info.origin == "port":
                        self.r.record_assignment(v.cls, t.attr, st.value, scope)

    def _record_self_attr(self, st: ast.Assign | ast.AnnAssign, scope: Scope, fn: Func) -> None:
        if not self.record_attrs or fn.owner is None or not fn.node.args.args:
            return
        if not isinstance(st.value, ast.Call | ast.Name):
            return  # wrappers are constructed (or built by a helper and kept by name)
        selfname = fn.node.args.args[0].arg
        targets = st.targets if isinstance(st, ast.Assign) else [st.target]
        if st.value is None:
            return
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == selfname:
                vals = known(self.r.eval(st.value, scope))
                if any(isinstance(v, Inst | Partial) for v in vals):
                    self.out.self_attrs.setdefault((fn.owner.dotted, t.attr), (vals, fn.info.path, st.lineno))

    # ---- expressions

    def _exprs(self, expr: ast.expr, scope: Scope, conds: list[str], narrow: dict[str, Vals], fn: Func, depth: int) -> None:
        if isinstance(expr, ast.IfExp):
            self._exprs(expr.test, scope, conds, narrow, fn, depth)
            test = ast.unparse(expr.test)
            self._exprs(expr.body, scope, [*conds, test], narrow, fn, depth)
            self._exprs(expr.orelse, scope, [*conds, _negate(test)], narrow, fn, depth)
            return
        if isinstance(expr, ast.Lambda):
            return
        if isinstance(expr, ast.Attribute):
            self._layer_read(expr, scope, narrow, fn)
        for child in ast_children(expr):
            if isinstance(child, ast.expr):
                self._exprs(child, scope, conds, narrow, fn, depth)
            elif isinstance(child, ast.keyword):
                self._exprs(child.value, scope, conds, narrow, fn, depth)
            elif isinstance(child, ast.comprehension):
                for sub in [child.iter, *child.ifs]:
                    self._exprs(sub, scope, conds, narrow, fn, depth)
        if isinstance(expr, ast.Call):
            self._call(expr, scope, conds, narrow, fn, depth)

    def _scope_with(self, scope: Scope, narrow: dict[str, Vals]) -> Scope:
        if not narrow:
            return scope
        return replace(scope, bindings={**scope.bindings, **narrow})

    def _layer_read(self, expr: ast.Attribute, scope: Scope, narrow: dict[str, Vals], fn: Func) -> None:
        # The layer only enters a function through its arguments (bindings), so no lookup is needed.
        if isinstance(expr.value, ast.Name) and expr.value.id not in narrow:
            vals = scope.bindings.get(expr.value.id, ())
            if any(isinstance(v, Layer) for v in vals):
                self.out.layer_reads.setdefault(expr.attr, (fn.info.path, expr.lineno))

    def _call(self, call: ast.Call, scope: Scope, conds: list[str], narrow: dict[str, Vals], fn: Func, depth: int) -> None:
        s = self._scope_with(scope, narrow)
        f = call.func
        targets = known(self.r.callee(f, s))
        loc = Location(fn.info.path, call.lineno, fn.dotted)
        text = unparse_name(f)
        branch = " / ".join(conds)
        args, star_a, star_k = call_args(call, fn.info)
        method = f.attr if isinstance(f, ast.Attribute) else None
        for t in targets:
            site = self._site(t, call, s, loc, text, branch, args, star_a, star_k, method, fn, depth)
            if site is None:
                continue
            if isinstance(site, Unresolved):
                self.out.unresolved.setdefault((loc.path, loc.line, text), site)
            else:
                self.out.calls.setdefault((loc.path, loc.line, call.col_offset, site.resolved), site)

    def _site(self, t: Val, call: ast.Call, s: Scope, loc: Location, text: str, branch: str, args, star_a: bool, star_k: bool, method: str | None, fn: Func, depth: int):
        def site(resolved: str | None, origin: CallOrigin, via: str, partial_args: tuple[CallArg, ...] = ()) -> CallSite:
            return CallSite(loc, fn.dotted, text, resolved, origin, args, star_a, star_k, branch, via, partial_args)

        if isinstance(t, Unknown):
            return _unknown_site(t, method, site, loc, text)
        if isinstance(t, Partial):
            pargs, _, _ = call_args(t.call, t.info, skip_first=1)
            inner = t.func
            dotted = getattr(inner, "dotted", None)
            if isinstance(inner, Func) and inner.info.origin == "port":
                self._follow(inner, call, s, depth, bind=False)  # positions shift behind partial's own arguments
            origin = self.c.origin(dotted) if dotted else "unresolved"
            return site(dotted, origin, "partial", pargs)
        if isinstance(t, Cls):
            init = known(self.r.class_member(t, "__init__", Inst(t)))
            if t.info.origin == "port":
                self.out.files.add(t.info.path)
                for i in init:
                    if isinstance(i, Func) and i.info.origin == "port":
                        self._follow(replace_bound(i, Inst(t)), call, s, depth)
            return site(t.dotted, t.info.origin, t.via or "local")
        if isinstance(t, Func):
            if is_triton_kernel(t.node):
                self.out.files.add(t.info.path) if t.info.origin == "port" else None
                return site(t.dotted, t.info.origin, "kernel-launch")
            bound_port = isinstance(t.bound, Inst | Cls | Super) and _bound_origin(t.bound) == "port"
            if t.info.origin == "port" or (self.follow_upstream_methods and bound_port):
                self._follow(t, call, s, depth)
            return site(t.dotted, t.info.origin, t.via or ("self-method" if t.bound is not None else "local"))
        if isinstance(t, Ext):
            return self._ext_site(t, method, site, loc, text)
        if isinstance(t, Inst):
            if isinstance(t.cls, Ext):
                return site(f"{t.cls.dotted}.__call__", self.c.origin(t.cls.dotted), "instance-call")
            for m in known(self.r.class_member(t.cls, "__call__", t)):
                if isinstance(m, Func):
                    if m.info.origin == "port":
                        self._follow(m, call, s, depth)
                    return site(m.dotted, m.info.origin, "instance-call")
                if isinstance(m, Ext):
                    return site(m.dotted, self.c.origin(m.dotted), "instance-call")
            return Unresolved(loc, text, f"an instance of {t.cls.dotted} is called but the class defines no __call__")
        if isinstance(t, Layer):
            return None
        return Unresolved(loc, text, f"call of a {type(t).__name__.lower()}")

    def _ext_site(self, t: Ext, method: str | None, site: Callable[..., CallSite], loc: Location, text: str
                  ) -> CallSite | Unresolved | None:
        """A call of an external dotted name; None for tensor and container plumbing."""
        if t.dotted == "builtins.None":
            return None
        if t.lazy and self.r.index.defines_text(t.dotted) is False:
            # Not parsed (lazy), but the upstream module does not even mention the name.
            return Unresolved(loc, text, f"{t.dotted.rpartition('.')[2]} is not defined in upstream {t.dotted.rpartition('.')[0]}")
        origin = self.c.origin(t.dotted)
        if origin == "builtin" and t.dotted.startswith("torch.Tensor.") and method not in HOST_SYNC:
            return None
        if method in PLUMBING and not t.dotted.startswith("torch.ops."):
            owner = t.dotted.rsplit(".", 2)[-2] if t.dotted.count(".") >= 2 else ""
            if owner and not owner[:1].isupper() and self.r.index.origin_of(t.dotted) is None:
                return None  # buffer.copy_() on an attribute of an external object
        return site(t.dotted, origin, t.via or "import-alias")

    def _follow(self, target: Func, call: ast.Call, scope: Scope, depth: int, bind: bool = True) -> None:
        if depth + 1 > self.budget.max_depth:
            return  # walk() would stop at once: binding the arguments would be wasted work
        bindings = self._bind_args(target, call, scope) if bind else {}
        self.walk(target, bindings, depth + 1)

    def _bind_args(self, target: Func, call: ast.Call, scope: Scope) -> dict[str, Vals]:
        a = target.node.args
        params = [p.arg for p in [*a.posonlyargs, *a.args]]
        decos = decorators(target.node)
        if target.owner is not None and "staticmethod" not in decos and params:
            if target.bound is not None:
                b = target.bound.inst if isinstance(target.bound, Super) else target.bound
                out: dict[str, Vals] = {params[0]: (b,)}
            else:
                out = {}
            params = params[1:]
        else:
            out = {}
        for i, arg in enumerate(call.args):
            if isinstance(arg, ast.Starred) or i >= len(params):
                break
            vals = self._arg_vals(arg, scope)
            if vals:
                out[params[i]] = vals
        names = set(params) | {p.arg for p in a.kwonlyargs}
        for k in call.keywords:
            if k.arg in names:
                vals = self._arg_vals(k.value, scope)
                if vals:
                    out[k.arg] = vals
        return out

    def _arg_vals(self, arg: ast.expr, scope: Scope) -> Vals:
        """What an argument tells about the callee's parameter; None and unknowns tell nothing."""
        vals = tuple(v for v in known(self.r.eval(arg, scope)) if not (isinstance(v, Ext) and v.dotted == "builtins.None"))
        return () if not vals or first_unknown(vals) else vals


def replace_bound(fn: Func, bound: Val) -> Func:
    return replace(fn, bound=bound)


def _bound_origin(b: Val) -> str | None:
    if isinstance(b, Super):
        b = b.inst
    if isinstance(b, Inst) and isinstance(b.cls, Cls):
        return b.cls.info.origin
    if isinstance(b, Cls):
        return b.info.origin
    return None


def is_triton_kernel(node: ast.AST) -> bool:
    for d in getattr(node, "decorator_list", []):
        text = ast.unparse(d.func if isinstance(d, ast.Call) else d)
        if (text.split(".")[-1] in {"jit", "autotune", "heuristics"} and "triton" in text) or text in {"jit", "triton_jit"}:
            return True
    return False


def _negate(test: str) -> str:
    simple = all(ch.isalnum() or ch in "._" for ch in test)
    if test.startswith("not ") and all(ch.isalnum() or ch in "._" for ch in test[4:]):
        return test[4:]
    return f"not {test}" if simple else f"not ({test})"


def _assigned_names(st: ast.stmt) -> list[str]:
    out = []
    if isinstance(st, ast.Assign):
        for t in st.targets:
            out += [n.id for n in ast_walk(t) if isinstance(n, ast.Name)]
    elif isinstance(st, ast.AnnAssign | ast.AugAssign) and isinstance(st.target, ast.Name):
        out.append(st.target.id)
    return out


def _bkey(bindings: dict[str, Vals] | None) -> tuple:
    if not bindings:
        return ()
    return tuple(sorted(bindings.items(), key=lambda kv: kv[0]))
