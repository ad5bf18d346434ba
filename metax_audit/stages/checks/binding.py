# Call binding everywhere: a call from the port into port or upstream code binds against the
# callee's readable signature (the installed-kernel check's rules: keyword, count, required, twice).
from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from metax_audit.core.findings import make_finding, rule
from metax_audit.core.memo import NO_MEMO, Memo, file_digest
from metax_audit.core.models import (
    CallSite,
    Category,
    Finding,
    InstalledSignature,
    Location,
    ParamFact,
    Severity,
    TraceResult,
)
from metax_audit.stages.checks.signatures import Binding, bind
from metax_audit.stages.checks.stack import call_text, checked_calls
from metax_audit.stages.trace.resolve import Resolver
from metax_audit.stages.trace.symbols import SymbolTable
from metax_audit.stages.trace.values import Cls, Func, known

rule("MXA107", Category.SIGNATURE, Severity.ERROR, "call passes a keyword the port or upstream callee does not accept",
     "The callee is readable Python in the port snapshot or the upstream release; it has no parameter of that name and "
     "no **kwargs, so the call raises TypeError when it runs. With --base, the evidence says whether the base release's "
     "callee accepted it (the callee changed upstream since the port's last sync).")
rule("MXA108", Category.SIGNATURE, Severity.ERROR, "call passes more positional arguments than the port or upstream callee takes",
     "The readable callee takes fewer positional parameters and has no *args; the call raises TypeError.")
rule("MXA109", Category.SIGNATURE, Severity.ERROR, "call omits a required parameter of the port or upstream callee, or binds one twice",
     "A parameter without default is bound neither by position nor by keyword (or is bound twice); the call raises TypeError.")

# Decorators that keep the written signature callable as is; any other decorator may change it,
# so such a callee is not checked (no finding rather than a guess).
_TRANSPARENT = frozenset({"staticmethod", "classmethod", "abstractmethod", "abc.abstractmethod", "override",
                          "typing.override", "typing_extensions.override", "functools.cache", "cache",
                          "functools.lru_cache", "lru_cache", "torch.inference_mode", "torch.no_grad", "no_grad",
                          "inference_mode", "torch.compiler.disable", "deprecated", "typing_extensions.deprecated"})


def _decorator_names(node: ast.AST) -> list[str]:
    return [ast.unparse(d.func if isinstance(d, ast.Call) else d) for d in getattr(node, "decorator_list", [])]


def _abstract(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """An abstract or stub method: the override that runs may take other parameters."""
    if any(d.endswith("abstractmethod") for d in _decorator_names(node)):
        return True
    body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return all(isinstance(s, ast.Pass | ast.Raise) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)) for s in body)


def callee_params(resolver: Resolver, dotted: str) -> tuple[tuple[ParamFact, ...], Func, bool] | None:
    """(parameters as bound by a call, the function, whether it is a static/class method) or None
    when the callee's runtime signature cannot be read from source with confidence."""
    vals = known(resolver.lookup(dotted))
    target = next((v for v in vals if isinstance(v, Func | Cls)), None)
    if target is None or len(vals) > 1:
        return None
    if isinstance(target, Cls):
        for c in resolver.mro(target):
            if isinstance(c, Cls) and (c.node.decorator_list or c.node.keywords or any(
                    isinstance(i, ast.FunctionDef) and i.name in {"__new__", "__call__"} and c is not target for i in c.node.body)):
                return None  # dataclass, metaclass, NamedTuple-like, custom __new__: generated signatures
        init = known(resolver.class_member(target, "__init__", None))
        fn = next((v for v in init if isinstance(v, Func)), None)
        if fn is None or len(init) > 1 or _abstract(fn.node):
            return None
        return SymbolTable.params(fn.node, drop_first=True), fn, False
    decos = _decorator_names(target.node)
    if any(d not in _TRANSPARENT for d in decos) or (target.owner is not None and _abstract(target.node)):
        return None
    special = "staticmethod" in decos or "classmethod" in decos
    drop = target.owner is not None and "staticmethod" not in decos
    return SymbolTable.params(target.node, drop_first=drop), target, special


def _problems(b: Binding) -> list[tuple[str, str, str]]:
    """(rule, detail key, message) per way the call fails to bind."""
    out = [("MXA107", a.name or "", f"keyword {a.name!r} is not a parameter") for a in b.unknown]
    if b.extra_positional:
        out.append(("MXA108", "positional", f"{len(b.extra_positional)} positional argument(s) too many: "
                    + ", ".join(a.text for a in b.extra_positional)))
    out += [("MXA109", p.name, f"required parameter {p.name!r} is not passed") for p in b.missing]
    out += [("MXA109", a.name or "", why) for a, why in b.duplicate]
    return out


_Params = tuple[tuple[ParamFact, ...], Func, bool] | None


def _binding(call: CallSite, resolver: Resolver, params_of: dict[str, _Params] | None = None,
             ) -> tuple[list[tuple[str, str, str]], Func] | None:
    """`params_of`: the callee's parameters per resolved name, read once per review and resolver (a
    call site of the same callee asks again: 809 calls, 371 callees on the real port)."""
    dotted = call.resolved or ""
    if params_of is None:
        got = callee_params(resolver, dotted)
    else:
        if dotted not in params_of:
            params_of[dotted] = callee_params(resolver, dotted)
        got = params_of[dotted]
    if got is None:
        return None
    params, fn, special = got
    # `Cls.method(obj, ...)` passes self explicitly (bind drops it); a static or class method does not.
    return _problems(bind(replace(call, resolved=None) if special else call, params)), fn


def _signature_text(fn: Func) -> str:
    node = fn.node
    return f"def {node.name}({ast.unparse(node.args)})"


def check_bindings(root: Path, trace: TraceResult, symbols: SymbolTable, memo_common: list[str] | None = None, *,
                   memo: Memo = NO_MEMO) -> Iterator[Finding]:
    """Every call site in scope whose callee is port or upstream Python; one finding per call and rule.
    A call with several candidate callees is reported only when none of them binds.

    With `memo_common` (the upstream and base releases and the config), each caller file's calls are a
    unit of the trace memo (trace/memo.py): bound with resolvers of their own, kept with the port names
    they read, served again while those look the same (asked of `memo`: NO_MEMO computes every unit the same way)."""
    groups: dict[tuple[str, int, str], list[CallSite]] = {}
    for call in checked_calls(trace):
        if call.origin in ("port", "upstream") and call.resolved and call.via != "kernel-launch" and not call.location.path.startswith(
                (symbols.index.upstream_package + "/",)):
            groups.setdefault((call.location.path, call.location.line, call.callee_text), []).append(call)
    if memo_common is None:
        params_of: dict[str, _Params] = {}
        base_params_of: dict[str, _Params] = {}
        resolver, base = symbols.resolver, symbols.base_resolver()
        for calls in groups.values():
            yield from _group_findings(root, calls, symbols, resolver, base, params_of, base_params_of)
        return
    from metax_audit.stages.trace.memo import TraceMemo, UnitResult

    units = TraceMemo(symbols.index, ["binding", *memo_common], memo=memo)
    by_file: dict[str, list[tuple[str, int, str]]] = {}
    for key in groups:
        by_file.setdefault(key[0], []).append(key)
    found: dict[tuple[str, int, str], list[Finding]] = {}
    for path, keys in by_file.items():
        def compute(keys: list[tuple[str, int, str]] = keys) -> tuple[list[list[Finding]], UnitResult]:
            resolver = Resolver(symbols.index)
            base = Resolver(symbols.base_index) if symbols.base_index is not None else None
            params_of: dict[str, _Params] = {}
            base_params_of: dict[str, _Params] = {}
            return ([list(_group_findings(root, groups[k], symbols, resolver, base, params_of, base_params_of)) for k in keys],
                    UnitResult(frozenset(), frozenset(), ()))
        parts = ["binding", path, file_digest(root / path), repr([groups[k] for k in keys])]
        values, _ = units.unit(parts, compute)
        found.update(zip(keys, values, strict=True))
    for key in groups:  # the order of the calls, as without the memo
        yield from found[key]


def _group_findings(root: Path, calls: list[CallSite], symbols: SymbolTable, resolver: Resolver, base_resolver: Resolver | None,
                    params_of: dict[str, _Params], base_params_of: dict[str, _Params]) -> Iterator[Finding]:
    results = [_binding(c, resolver, params_of) for c in calls]
    if any(r is None or not r[0] for r in results):
        return
    call = calls[0]
    problems, fn = results[0]  # type: ignore[misc]
    label = symbols.label(symbols.provider(fn.dotted))
    # typed: the callee's signature as read from source; str() is the evidence line
    read = InstalledSignature(fn.dotted, f"({ast.unparse(fn.node.args)})", "static", label, fn.info.path, fn.node.lineno,
                              style="def", defined_as=fn.node.name)
    where = str(read)
    base = _at_base(call, symbols, base_resolver, base_params_of)
    by_rule: dict[str, list[tuple[str, str]]] = {}
    for rid, key, msg in problems:
        by_rule.setdefault(rid, []).append((key, msg))
    for rid, items in by_rule.items():
        ev = [call_text(root, call), where, *([base] if base else [])]
        yield make_finding(rid, Location(call.location.path, call.location.line, f"{call.caller}:{call.resolved}:{items[0][0]}"),
                           f"{call.callee_text}(...): " + "; ".join(m for _, m in items) + f" in {fn.dotted}", ev,
                           installed=read)


def _at_base(call: CallSite, symbols: SymbolTable, resolver: Resolver | None, params_of: dict[str, _Params] | None = None) -> str:
    """Whether the same call binds against the base release's callee (it changed upstream since)."""
    if resolver is None or symbols.index.origin_of(call.resolved or "") != "upstream":
        return ""
    got = _binding(call, resolver, params_of)
    if got is None:
        return f"{symbols.base_label}: {call.resolved} is not readable there (absent or not checkable)"
    problems, fn = got
    sig = f"{fn.info.path}:{fn.node.lineno}: {_signature_text(fn)}"
    if not problems:
        return f"{symbols.base_label}: the call binds against {sig} - the callee changed upstream since the port's last sync"
    return f"{symbols.base_label}: the call does not bind there either ({sig})"
