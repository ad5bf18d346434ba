# Compare by role: a port class that takes an upstream class's role (subclass or config class-map)
# is checked against that class's contract: overridden signatures, abstract methods, upstream drift.
from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

from metax_audit.core.findings import make_finding, rule
from metax_audit.core.models import Category, Difference, Finding, Location, Severity, UpstreamCaller
from metax_audit.core.pysource import ast_walk, dump, unparse
from metax_audit.stages.compare.roles import RolePair, UpClass, UpstreamClasses, imported_class
from metax_audit.stages.compare.upstream_calls import calls_of

# Not the file-by-file compare of a copied file: a rewritten backend shares the contract of its
# upstream base, not its code, so only what callers through the base can observe is compared.

R_OVERRIDE = rule(
    "MXA207", Category.SIGNATURE, Severity.WARNING,
    "override does not accept what the upstream method it overrides accepts",
    "vLLM calls this method through the upstream base class's interface. The override drops a parameter "
    "the base method takes (a call passing it raises TypeError) or adds a required one (calls through the "
    "base do not pass it). An error when the dropped parameter is required by the base and an upstream call "
    "site passes it, or when an upstream call names the dropped parameter by keyword (TypeError whenever that call "
    "runs) and that call can run on the port: a caller in upstream code the port assigns over, overrides in every "
    "class derived from its class, or reaches only through such code is listed as no evidence, and with no live "
    "caller left the finding is a warning. When the port's own code is the only caller, waive it with that reason.",
).id
R_ABSTRACT = rule(
    "MXA208", Category.SIGNATURE, Severity.WARNING,
    "port class does not define an abstract method of its upstream base",
    "The upstream base class is an ABC and declares the method abstract; the port class (and its bases in "
    "the same file) do not define it, so instantiating the class raises TypeError, and a static call of it "
    "reaches upstream's body (which usually raises NotImplementedError). An error when the port's module "
    "constructs the class or returns it from a get_*_cls method (vLLM constructs the impl and builder classes).",
).id

_Func = ast.FunctionDef | ast.AsyncFunctionDef
# Method names called on many unrelated objects upstream (nn.Module.forward, builders, ...): a call of
# one of them is no evidence that the base class's interface is what is called.
_GENERIC = frozenset({"forward", "__call__", "build", "run", "get", "update", "apply", "process", "step", "execute"})


@dataclass(frozen=True)
class _Params:
    positional: tuple[str, ...]
    required: frozenset[str]
    keyword_only: tuple[str, ...]
    varargs: bool
    varkw: bool

    @property
    def names(self) -> frozenset[str]:
        return frozenset((*self.positional, *self.keyword_only))


def _decorators(fn: _Func) -> set[str]:
    return {unparse(d).rsplit(".", 1)[-1] for d in fn.decorator_list}


def _params(fn: _Func) -> _Params:
    a = fn.args
    positional = [p.arg for p in (*a.posonlyargs, *a.args)]
    if "staticmethod" not in _decorators(fn) and positional:
        positional = positional[1:]  # self / cls
    with_default = set(positional[len(positional) - len(a.defaults):]) if a.defaults else set()
    kw_required = {p.arg for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is None}
    required = frozenset({p for p in positional if p not in with_default} | kw_required)
    return _Params(tuple(positional), required, tuple(p.arg for p in a.kwonlyargs), a.vararg is not None, a.kwarg is not None)


def _only_raises(fn: _Func) -> bool:
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return len(body) == 1 and isinstance(body[0], ast.Raise)


def _sig(fn: _Func) -> str:
    return f"{fn.name}({unparse(fn.args)})"


def _methods(cls: ast.ClassDef) -> dict[str, _Func]:
    return {s.name: s for s in cls.body if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)}


def _is_abstract(fn: _Func) -> bool:
    return "abstractmethod" in _decorators(fn)


def _is_abc(mro: list[UpClass]) -> bool:
    for c in mro:
        if any(_tail(b) == "ABC" for b in c.node.bases) or any(
                k.arg == "metaclass" and _tail(k.value) == "ABCMeta" for k in c.node.keywords):
            return True
    return False


def _tail(node: ast.expr) -> str:
    return unparse(node).rsplit(".", 1)[-1]


def incompatibility(up: _Func, port: _Func, passed_by_keyword: Callable[[str], bool] = lambda _: False) -> str | None:
    """Why a call written for `up` can fail on `port`; None when the override accepts it."""
    u, p = _params(up), _params(port)
    problems: list[str] = []
    missing = [n for n in (*u.positional, *u.keyword_only) if n not in p.names]
    # A parameter renamed in place still binds positional calls; a caller passing it by name does not.
    renamed = {n: p.positional[i] for i, n in enumerate(u.positional) if n in missing and i < len(p.positional)
               and p.positional[i] not in u.names}
    for name in missing:
        if p.varkw:  # **kwargs takes any name passed by keyword
            continue
        if name in renamed:
            if passed_by_keyword(name):
                problems.append(f"renames `{name}` to `{renamed[name]}`, which upstream callers pass by keyword")
            continue
        how = "required" if name in u.required else "optional"
        problems.append(f"drops the {how} parameter `{name}`")
    extra = sorted(n for n in p.required if n not in u.names and n not in set(p.positional[: len(u.positional)]))
    # A constructor's extra arguments come from the layer that builds it, not from the base's interface.
    if extra and not u.varkw and up.name != "__init__":
        problems.append("requires " + ", ".join(f"`{n}`" for n in extra) + ", which calls through the base do not pass")
    return "; ".join(problems) or None


def _port_methods(tree: ast.Module, cls: ast.ClassDef, is_upstream: Callable[[ast.expr], bool],
                  seen: set[str] | None = None) -> dict[str, _Func] | None:
    """Methods of the port class and its bases defined in the same file; None when a base is neither
    in this file nor upstream (a mixin elsewhere: its methods cannot be seen, so none is "missing")."""
    seen = seen if seen is not None else set()
    if cls.name in seen:
        return {}
    seen.add(cls.name)
    local = {s.name: s for s in tree.body if isinstance(s, ast.ClassDef)}
    out: dict[str, _Func] = {}
    for base in cls.bases:
        name = _tail(base.value if isinstance(base, ast.Subscript) else base)
        if name in local:
            inherited = _port_methods(tree, local[name], is_upstream, seen)
            if inherited is None:
                return None
            out.update(inherited)
        elif not is_upstream(base) and name not in {"object", "Generic", "ABC", "Protocol"}:
            return None
    out.update(_methods(cls))
    return out


def _lookup(mro: list[UpClass], name: str) -> tuple[UpClass, _Func] | None:
    for c in mro:
        fn = _methods(c.node).get(name)
        if fn is not None:
            return c, fn
    return None


def _interface_method(name: str, fn: _Func) -> bool:
    if name.startswith("__") and name.endswith("__"):
        return name == "__init__" and _is_abstract(fn)  # constructors differ unless the base fixes them
    return not name.startswith("_")


def compare_roles(
    port_path: str,
    tree: ast.Module,
    pairs: list[RolePair],
    upstream: UpstreamClasses,
    base: UpstreamClasses | None,
    versions: str,
) -> tuple[list[tuple[Difference, str]], list[Finding]]:
    """Differences (upstream drift of overridden methods, each with its upstream file) and findings
    (MXA207/MXA208) of a file whose classes take upstream classes' roles."""
    diffs: list[tuple[Difference, str]] = []
    findings: list[Finding] = []
    classes = {s.name: s for s in tree.body if isinstance(s, ast.ClassDef)}
    for pair in pairs:
        cls = classes.get(pair.port_class)
        target = upstream.find(_module_of(pair.upstream_path), pair.upstream_class)
        if cls is None or target is None:
            continue
        mro = upstream.mro(target)
        old = base.find(_module_of(pair.upstream_path), pair.upstream_class) if base is not None else None
        old_mro = base.mro(old) if base is not None and old is not None else []
        for d, f in _overrides(port_path, cls, pair, mro, old_mro, versions, upstream_callers(upstream)):
            if d is not None:
                diffs.append(d)
            if f is not None:
                findings.append(f)
        if pair.relation in {"base", "class-map"}:  # through a port class: its methods are not all seen here
            findings.extend(_abstract(port_path, tree, cls, pair, mro, upstream, _module_of(port_path)))
    return diffs, findings


def _overrides(port_path: str, cls: ast.ClassDef, pair: RolePair, mro: list[UpClass], old_mro: list[UpClass],
               versions: str, callers: Callable[[str, list[str], int, bool], list[UpstreamCaller]]) -> Iterator[tuple[tuple[Difference, str] | None, Finding | None]]:
    for name, fn in _methods(cls).items():
        if name in pair.via_methods:
            continue  # the port's intermediate class redefines it: that contract binds the override
        found = _lookup(mro, name)
        if found is None or not _interface_method(name, found[1]) or _only_raises(fn):
            continue  # an override that only raises turns the feature off: its parameters do not matter
        owner, up = found
        qual = f"{cls.name}.{name}"
        where = f"upstream {owner.path}:{up.lineno} {owner.node.name}.{_sig(up)}"
        problem = incompatibility(up, fn, partial(_passes_keyword, callers, name))
        if problem is not None:
            dropped = [n for n in _params(up).names if n not in _params(fn).names]
            seen = callers(name, dropped, len(_params(fn).positional), _params(fn).varargs)
            # An upstream call through the base that names the dropped parameter by keyword (optional or not),
            # or passes more positional arguments than the override takes (the dropped one among them):
            # TypeError whenever that call runs. Whether it can run on the port is judged after the compare
            # (compare/liveness.py): an error only while one of them is live.
            sev = Severity.ERROR if seen and name not in _GENERIC else None
            yield None, make_finding(
                R_OVERRIDE, Location(port_path, fn.lineno, qual),
                f"{qual} overrides {owner.node.name}.{name} but {problem}",
                (f"port {port_path}:{fn.lineno} {_sig(fn)}", where,
                 f"{cls.name} takes the role of upstream {pair.upstream_class} ({pair.relation})",
                 *map(str, seen[:SHOWN_CALLERS])),
                severity=sev, callers=tuple(seen))
        old = _lookup(old_mro, name) if old_mro else None
        if old is not None and dump(old[1].args) != dump(up.args) and problem is not None \
                and incompatibility(old[1], fn) is None:
            yield (Difference(
                kind="upstream-not-followed", path=port_path, line=fn.lineno, symbol=qual, declared=False, reason="",
                action=f"follow upstream's new signature {_sig(up)}", validation="",
                detail=f"upstream changed {owner.node.name}.{name} ({versions}): {_sig(old[1])} -> {_sig(up)}; "
                       f"the override {_sig(fn)} still has the old form",
                upstream_line=up.lineno), owner.path), None


def _passes_keyword(callers: Callable[[str, list[str], int, bool], list[UpstreamCaller]], method: str, param: str) -> bool:
    """Whether an upstream call of `method` passes `param` by keyword (positional counts ignored)."""
    return bool(callers(method, [param], 1 << 30, True))


def upstream_callers(upstream: UpstreamClasses, limit: int = 24) -> Callable[[str, list[str], int, bool], list[UpstreamCaller]]:
    """Upstream call sites `.method(...)` that pass a dropped parameter by keyword, or more positional
    arguments than the override takes (evidence that a caller through the base passes it), keyword
    callers first. Files are read once per compare run and parsed once, only when they spell `method(`."""
    index = calls_of(upstream)

    def find(method: str, names: list[str], positional: int, varargs: bool) -> list[UpstreamCaller]:
        if not names:
            return []
        out: list[tuple[int, UpstreamCaller]] = []
        for rel, call in index.sites(method):
            if call.bare:
                continue  # a call through the base's interface is an attribute call
            passed = [k for k in call.keywords if k in names]
            many = not varargs and not call.starred and call.positional > positional
            if passed:
                out.append((0, UpstreamCaller(rel, call.line, call.function, f"{passed[0]}=")))
            elif many:
                out.append((1, UpstreamCaller(rel, call.line, call.function, f"{call.positional} positional arguments")))
        # keyword callers name the parameter itself: they come first
        return [caller for _, caller in sorted(out, key=lambda item: item[0])[:limit]]

    return find


SHOWN_CALLERS = 3  # callers an override finding shows as evidence; the rest are kept on the finding


def _abstract(port_path: str, tree: ast.Module, cls: ast.ClassDef, pair: RolePair, mro: list[UpClass],
              upstream: UpstreamClasses, module: str) -> Iterator[Finding]:
    if not _is_abc(mro):
        return

    def is_upstream(base: ast.expr) -> bool:
        target = imported_class(tree, module, port_path.endswith("__init__.py"), base)
        return target is not None and upstream.find(*target) is not None

    have = _port_methods(tree, cls, is_upstream)
    if have is None:
        return
    for name in sorted({n for c in mro for n in _methods(c.node)}):
        found = _lookup(mro, name)
        if found is None or not _is_abstract(found[1]) or name in have:
            continue
        if _decorators(found[1]) & {"staticmethod", "classmethod"}:
            continue  # called on the class (backends are never instantiated): upstream's body answers
        owner, up = found
        made = _instantiated(tree, cls.name)
        yield make_finding(
            R_ABSTRACT, Location(port_path, cls.lineno, f"{cls.name}.{name}"),
            f"{cls.name} does not define {name}, abstract in upstream {owner.node.name}",
            (f"upstream {owner.path}:{up.lineno} @abstractmethod {owner.node.name}.{_sig(up)}",
             f"port {port_path}:{cls.lineno} class {cls.name} (bases in this file included) has no {name}",
             *([f"port {port_path}:{made[0]} {made[1]}: the class is instantiated, which raises TypeError "
                "(can't instantiate abstract class)"] if made else [])),
            severity=Severity.ERROR if made else None)


def _instantiated(tree: ast.Module, name: str) -> tuple[int, str] | None:
    """Where the module constructs the class, or hands it to vLLM to construct (returned by a backend's
    get_impl_cls/get_builder_cls): (line, what)."""
    for node in ast_walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name:
            return node.lineno, f"{name}(...)"
        if isinstance(node, ast.FunctionDef) and node.name.startswith("get_") and node.name.endswith("_cls"):
            for ret in ast_walk(node):
                if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Name) and ret.value.id == name:
                    return ret.lineno, f"{node.name}() returns {name} (vLLM instantiates it)"
    return None


def _module_of(path: str) -> str:
    mod = path[:-3] if path.endswith(".py") else path
    mod = mod.replace("/", ".")
    return mod[: -len(".__init__")] if mod.endswith(".__init__") else mod


__all__ = ["compare_roles", "incompatibility"]
