# The abstract values static resolution works with (module, class, function, instance, partial,
# external dotted path, the layer, unknown with its reason) and the helpers over sets of them; and
# the function scopes that hold them (a Func keeps its enclosing Scope: one module, no cycle).
from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import Enum

from metax_audit.core.pysource import ast_children, ast_walk
from metax_audit.stages.trace.modules import ModuleInfo, collect_imports

# ---------------------------------------------------------------- abstract values


@dataclass(frozen=True)
class Val:
    via: str = field(default="", compare=False, kw_only=True)


@dataclass(frozen=True)
class Mod(Val):
    info: ModuleInfo = field(compare=False, hash=False)
    name: str = ""


@dataclass(frozen=True)
class Cls(Val):
    dotted: str
    info: ModuleInfo = field(compare=False, hash=False)
    node: ast.ClassDef = field(compare=False, hash=False)

    @property
    def origin(self) -> str:
        return self.info.origin


@dataclass(frozen=True)
class Func(Val):
    dotted: str
    info: ModuleInfo = field(compare=False, hash=False)
    node: ast.FunctionDef | ast.AsyncFunctionDef = field(compare=False, hash=False)
    owner: Cls | None = None  # defining class for methods
    bound: Val | None = None  # the instance (or class) the method was looked up on
    closure: Scope | None = field(default=None, compare=False, hash=False)  # enclosing function's names


@dataclass(frozen=True)
class Ext(Val):
    """Something outside the readable sources, kept as the dotted path it was imported by.

    `lazy` marks an upstream name not read yet: a direct call needs only its dotted path, so the
    upstream module is parsed only when an attribute, a call result or a base class needs it."""

    dotted: str
    lazy: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class Inst(Val):
    cls: Cls | Ext


@dataclass(frozen=True)
class Partial(Val):
    func: Val
    call: ast.Call = field(compare=False, hash=False)
    info: ModuleInfo = field(compare=False, hash=False)


@dataclass(frozen=True)
class Layer(Val):
    """The attention layer passed to forward(): its attribute reads are the layer binding."""

    name: str = "layer"


@dataclass(frozen=True)
class Super(Val):
    cls: Cls
    inst: Val


class UnknownKind(Enum):
    OTHER = "other"
    TORCH_RESULT = "result of a torch callable"  # a tensor (or tensors): its methods are no kernels
    LAYER_ATTRIBUTE = "layer attribute"  # read off the attention layer passed to forward()


@dataclass(frozen=True)
class Unknown(Val):
    reason: str
    kind: UnknownKind = UnknownKind.OTHER


def _result_of(dotted: str) -> Unknown:
    """What calling `dotted` returns when its return type is unknown."""
    kind = UnknownKind.TORCH_RESULT if dotted.startswith("torch.") else UnknownKind.OTHER
    return Unknown(f"result of {dotted}", kind)


Vals = tuple[Val, ...]


def known(vals: Iterable[Val]) -> Vals:
    """Drop unknowns when something is known: a union keeps the candidates we can follow."""
    vals = tuple(dict.fromkeys(vals))
    good = tuple(v for v in vals if not isinstance(v, Unknown))
    return good if good else vals[:1]


def first_unknown(vals: Vals) -> Unknown | None:
    return next((v for v in vals if isinstance(v, Unknown)), None)


def with_via(vals: Iterable[Val], via: str) -> Vals:
    return tuple(v if v.via else replace(v, via=via) for v in vals)


def force_via(vals: Iterable[Val], via: str) -> Vals:
    return tuple(replace(v, via=via) for v in vals)


_KEEP_VIA = frozenset({"module-getattr", "inherited", "attr-assigned"})


def plain(vals: Iterable[Val]) -> Vals:
    """Forget how another module named a value: `via` describes the caller's own step."""
    return tuple(v if not v.via or v.via in _KEEP_VIA else replace(v, via="") for v in vals)


# ---------------------------------------------------------------- function scopes
# A function's local bindings, parameters and annotations indexed from its body, and the walks over
# a body that stay out of nested definitions.


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


_OWN_SCOPES = frozenset({ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda})  # the walks of a body do not enter them
_INDEXED = frozenset({ast.Assign, ast.AnnAssign, ast.NamedExpr, ast.Import, ast.ImportFrom, ast.For, ast.comprehension,
                      ast.withitem})


def _index_function(info: ModuleInfo, node: ast.FunctionDef | ast.AsyncFunctionDef) -> _FunctionNames:
    assigns: dict[str, list[ast.expr]] = {}
    lazy: dict[str, str] = {}
    params: dict[str, ast.arg] = {}
    loopvars: set[str] = set()
    localdefs: dict[str, ast.AST] = {}
    a = node.args
    for p in [*a.posonlyargs, *a.args, *a.kwonlyargs, *(x for x in (a.vararg, a.kwarg) if x)]:
        params[p.arg] = p
    # _walk_body's nodes in its order, walked here: most nodes are none of the kinds below, and one
    # type lookup instead of seven isinstance tests each was a third of this index (450 functions per review)
    stack = ast_children(node)
    while stack:
        sub = stack.pop()
        kind = sub.__class__
        if kind in _OWN_SCOPES:
            if kind is not ast.Lambda:
                localdefs[sub.name] = sub  # type: ignore[attr-defined]
            continue
        stack.extend(ast_children(sub))
        if kind not in _INDEXED:
            continue
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
            for n in ast_walk(sub.target):
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
    stack = list(ast_children(node))
    while stack:
        n = stack.pop()
        yield n
        if n.__class__ in _OWN_SCOPES:
            continue
        stack.extend(ast_children(n))
