# The dataflow interpreter: walks one port function's statements, tracking LSE values from the
# kernel calls that produce them (contracts) through steps and helpers to the calls that consume them.
from __future__ import annotations

import ast
import itertools
import math
from collections.abc import Sequence
from typing import Protocol

from metax_audit.core.contracts import Contracts, Convention
from metax_audit.core.models import Location
from metax_audit.core.pysource import TOO_DEEP_NAME, ast_walk
from metax_audit.stages.dataflow.facts import FlowEnd, FlowStep
from metax_audit.stages.dataflow.module import PortModule, const_value
from metax_audit.stages.dataflow.values import (
    FLIP,
    FLIPS,
    LN2,
    LOG2E,
    MAX_ALTS,
    NEUTRAL,
    Alt,
    Fn,
    Inst,
    TupleVal,
    Val,
    flatten,
    literal_bool,
    source_text,
)


class _Recording(Protocol):
    """What a walk records into (analysis.Recorder)."""

    @property
    def untraced(self) -> set[tuple[str, int, str]]: ...
    def add_unresolved(self, loc: Location, text: str, reason: str) -> None: ...
    def add_too_deep(self, loc: Location, text: str) -> None: ...


class WalkContext(Protocol):
    """What a Walker asks of the analysis that runs it (analysis.Analysis, which creates the walkers:
    described here so that this module does not import it back)."""

    @property
    def contracts(self) -> Contracts: ...
    @property
    def res(self) -> _Recording: ...
    def match(self, cands: Sequence[Fn]) -> tuple[Convention | None, Fn | None]: ...
    def helpers_for(self, w: Walker, cands: Sequence[Fn]
                    ) -> list[tuple[PortModule, ast.FunctionDef | ast.AsyncFunctionDef, str | None]]: ...
    def record_scales(self, w: Walker, call: ast.Call, conv: Convention, cand: Fn) -> None: ...
    def implementations(self, method: str) -> list[Fn]: ...
    def global_ctor(self, name: str) -> str | None: ...
    def record_unpacking(self, w: Walker, call: ast.Call, conv: Convention, cand: Fn, stmt: ast.stmt,
                         text: str | None) -> None: ...
    def add_flow(self, w: Walker, call: ast.Call, conv: Convention, cand: Fn, pname: str, arg: ast.expr,
                 val: Val, base: str, flag_note: str) -> None: ...

# Expressions nest deeper than this only in generated code (a 500-term `'a' + 'a' + ...`); the
# statement holding one is recorded as not analysed instead of exhausting Python's stack.
MAX_EXPR_DEPTH = 100


class ExpressionTooDeep(Exception):
    """Raised inside the walk of one statement; Walker.stmt records it and goes on."""


class Walker:
    def __init__(
        self,
        ctx: WalkContext,
        mod: PortModule,
        fn: ast.FunctionDef | ast.AsyncFunctionDef,
        cls: str | None,
        seeds: dict[str, object],
        depth: int,
    ) -> None:
        self.ctx, self.mod, self.fn, self.cls, self.depth = ctx, mod, fn, cls, depth
        self.qualname = f"{cls}.{fn.name}" if cls else fn.name
        self.env: dict[str, object] = dict(seeds)
        self.imports = mod.fn_imports.get(id(fn)) or dict(mod.imports)
        args = fn.args
        self.params = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
        self.local_ctors: dict[str, str] = {}
        self.alts: dict[str, list[object]] = {}
        self.returned: list[object] = []
        self.expr_depth = 0  # nesting of eval() in the current statement

    # -- helpers

    def loc(self, node: ast.AST) -> Location:
        return Location(self.mod.path, getattr(node, "lineno", 0), self.qualname)

    def line_text(self, node: ast.AST) -> str:
        n = getattr(node, "lineno", 0)
        return self.mod.lines[n - 1].strip() if 0 < n <= len(self.mod.lines) else source_text(node, self.mod.lines)

    # -- resolution

    def _by_name(self, name: str) -> list[object]:
        ctors = self.mod.ctor_names.get(name.lstrip("_"), set())
        if len(ctors) == 1:
            return [Inst(next(iter(ctors)), "same-name-in-file")]
        cls = self.ctx.global_ctor(name) if not ctors else None
        return [Inst(cls, "same-name-in-scope")] if cls else []

    def resolve_value(self, node: ast.expr) -> list[object]:
        """What an expression denotes when used as a callee or an object: Fn or Inst candidates."""
        if isinstance(node, ast.Name):
            bound = self.env.get(node.id)
            if isinstance(bound, Fn | Inst):
                return [bound]
            if node.id in self.local_ctors:
                return [Inst(self.local_ctors[node.id], "local-constructor")]
            if node.id in self.imports:
                return [Fn(self.imports[node.id], via="import")]
            if node.id in self.mod.functions:
                return [Fn(f"{self.mod.module}.{node.id}", via="module-function")]
            return self._by_name(node.id)
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "self" and self.cls:
                cls = self.mod.classes.get(self.cls)
                if cls is not None and any(
                    isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef) and m.name == node.attr for m in cls.body
                ):
                    return [Fn(f"{self.mod.module}.{self.cls}.{node.attr}", via="self-method")]
                out: list[object] = []
                for expr, imps in self.mod.self_attrs.get(self.cls, {}).get(node.attr, []):
                    out.extend(self._attr_candidates(expr, imps))
                return out or self._by_name(node.attr)
            inner = self.resolve_value(node.value)
            out = []
            for c in inner:
                if isinstance(c, Inst):
                    out.append(Fn(f"{c.cls}.{node.attr}", via=c.via))
                elif isinstance(c, Fn) and not c.bound:
                    out.append(Fn(f"{c.dotted}.{node.attr}", via=c.via))
            if not out:
                if found := self._by_name(node.attr):
                    return found
                out.extend(self.ctx.implementations(node.attr))
                # Unknown object: keep the method name so interface contracts (`*.run_x`) still apply.
                out.append(Fn(f"<{source_text(node.value, self.mod.lines)}>.{node.attr}", via="method-name"))
            return out
        if isinstance(node, ast.Subscript):  # wrappers[i]: an element of a list of wrappers
            return [c for c in self.resolve_value(node.value) if isinstance(c, Inst)]
        if isinstance(node, ast.Call):  # Wrapper(...).run(...): an instance made on the spot
            return [Inst(c.dotted, "constructor") for c in self.resolve_value(node.func)
                    if isinstance(c, Fn) and c.dotted.rsplit(".", 1)[-1][:1].isupper()]
        return []

    def _attr_candidates(self, expr: ast.expr, imps: dict[str, str]) -> list[object]:
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "self" and self.cls:
            cls = self.mod.classes.get(self.cls)
            if cls is not None and any(isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef) and m.name == expr.attr for m in cls.body):
                return [Fn(f"{self.mod.module}.{self.cls}.{expr.attr}", via="self-attr-method")]
            return []
        if isinstance(expr, ast.IfExp):
            return self._attr_candidates(expr.body, imps) + self._attr_candidates(expr.orelse, imps)
        if isinstance(expr, ast.Name):
            if expr.id in imps:
                return [Fn(imps[expr.id], via="self-attr")]
            if expr.id in self.mod.functions:
                return [Fn(f"{self.mod.module}.{expr.id}", via="self-attr")]
            return []
        if isinstance(expr, ast.Call):
            f = expr.func
            fname = imps.get(f.id) if isinstance(f, ast.Name) else None
            if fname is None and isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
                head = imps.get(f.value.id)
                fname = f"{head}.{f.attr}" if head else None
            if fname in ("functools.partial",) and expr.args:
                bound = {k.arg: k.value for k in expr.keywords if k.arg}
                return [Fn(c.dotted, {**c.bound, **bound}, "partial") for c in self._attr_candidates(expr.args[0], imps) if isinstance(c, Fn)]
            if fname is not None:
                return [Inst(fname, "self-attr")]
        return []

    def callees(self, call: ast.Call) -> list[Fn]:
        return [c for c in self.resolve_value(call.func) if isinstance(c, Fn)]

    # -- branches: each name holds one current value plus the alternatives other paths left

    def snapshot(self) -> tuple[dict[str, object], dict[str, list[object]]]:
        return dict(self.env), {k: list(v) for k, v in self.alts.items()}

    def restore(self, snap: tuple[dict[str, object], dict[str, list[object]]]) -> None:
        self.env, self.alts = dict(snap[0]), {k: list(v) for k, v in snap[1].items()}

    def merge(self, a: tuple[dict[str, object], dict[str, list[object]]], b: tuple[dict[str, object], dict[str, list[object]]]) -> None:
        """Join two paths: a name keeps every value either path may leave in it."""
        env: dict[str, object] = {}
        alts: dict[str, list[object]] = {}
        for name in {*a[0], *b[0]}:
            options: list[object] = []
            for env_x, alts_x in (a, b):
                for v in alts_x.get(name, [env_x[name]] if name in env_x else []):
                    if v not in options:
                        options.append(v)
            if options:
                env[name] = options[0]
                if len(options) > 1:
                    alts[name] = options[:MAX_ALTS]
        self.env, self.alts = env, alts

    def eval_multi(self, node: ast.expr, stmt: ast.stmt) -> list[object]:
        """eval() under every combination of the alternatives of the names it reads."""
        names = sorted({n.id for n in ast_walk(node) if isinstance(n, ast.Name) and n.id in self.alts}) if self.alts else []
        if not names:
            return flatten(self.eval(node, stmt))
        saved = dict(self.env)
        out: list[object] = []
        for combo in itertools.islice(itertools.product(*(self.alts[n] for n in names)), MAX_ALTS):
            self.env.update(dict(zip(names, combo, strict=True)))
            for v in flatten(self.eval(node, stmt)):
                if v not in out:
                    out.append(v)
        self.env = saved
        return out

    # -- statements

    def run(self) -> object | None:
        self.block(self.fn.body)
        if not self.returned:
            return None
        return self.returned[0] if len(self.returned) == 1 else Alt(tuple(self.returned[:MAX_ALTS]))

    def block(self, body: Sequence[ast.stmt]) -> None:
        for stmt in body:
            self.stmt(stmt)

    def stmt(self, stmt: ast.stmt) -> None:
        """One statement; one whose expressions nest deeper than the walk follows is recorded as
        not analysed (coverage) and skipped, never a RecursionError out of the review."""
        try:
            self._stmt(stmt)
        except (ExpressionTooDeep, RecursionError):
            self.expr_depth = 0
            if not any(isinstance(n, ast.Name) and n.id == TOO_DEEP_NAME for n in ast_walk(stmt)):
                self.ctx.res.add_too_deep(self.loc(stmt), self.line_text(stmt))  # else the parse's cut says it

    def _stmt(self, stmt: ast.stmt) -> None:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return
        if isinstance(stmt, ast.If | ast.For | ast.While | ast.AsyncFor):
            for part in ("test", "iter"):
                val = getattr(stmt, part, None)
                if isinstance(val, ast.expr):
                    self.calls_in(val, stmt)
            before = self.snapshot()
            self.block(stmt.body)
            if not isinstance(stmt, ast.If):
                # A second pass lets values assigned late in one iteration reach uses early in the next.
                self.merge(before, self.snapshot())
                self.block(stmt.body)
            after_body = self.snapshot()
            self.restore(before)
            self.block(stmt.orelse)
            self.merge(after_body, self.snapshot())
            return
        if isinstance(stmt, ast.With | ast.AsyncWith | ast.Try):
            for part in ("body", "orelse", "finalbody"):
                self.block(getattr(stmt, part, []) or [])
            for h in getattr(stmt, "handlers", []) or []:
                self.block(h.body)
            return
        self.calls_in(stmt, stmt)
        if isinstance(stmt, ast.Assign):
            for t in stmt.targets:
                self.assign(t, stmt.value, stmt)
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            self.assign(stmt.target, stmt.value, stmt)
        elif isinstance(stmt, ast.Return) and stmt.value is not None:
            for v in self.eval_multi(stmt.value, stmt):
                if v not in self.returned:
                    self.returned.append(v)
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            f = stmt.value.func
            if isinstance(f, ast.Attribute) and f.attr in ("append", "extend", "insert", "add"):
                for a in stmt.value.args:
                    if isinstance(self.eval(a, stmt), Val):
                        self.ctx.res.add_unresolved(self.loc(stmt), self.line_text(stmt), "LSE stored into a container; its later use is not followed")

    def assign(self, target: ast.expr, value: ast.expr, stmt: ast.stmt) -> None:
        if isinstance(target, ast.Tuple | ast.List) and isinstance(value, ast.Tuple | ast.List) and len(target.elts) == len(value.elts):
            vals = [self.eval_multi(v, stmt) for v in value.elts]  # all read before any is bound (a swap)
            for t, v in zip(target.elts, vals, strict=True):
                self.bind(t, v, stmt)
            return
        options = self.eval_multi(value, stmt)
        if isinstance(target, ast.Tuple | ast.List):
            for i, t in enumerate(target.elts):
                self.bind(t, [o.items[i] for o in options if isinstance(o, TupleVal) and i in o.items], stmt)
            return
        self.bind(target, options, stmt)

    def bind(self, target: ast.expr, vals: list[object], stmt: ast.stmt) -> None:
        vals = [v.step(self.loc(stmt), self.line_text(stmt)) if isinstance(v, Val) else v for v in vals]
        if isinstance(target, ast.Name):
            self.alts.pop(target.id, None)
            if not vals:
                self.env.pop(target.id, None)
                if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Name | ast.Attribute):
                    for c in self.resolve_value(stmt.value.func):
                        if isinstance(c, Fn) and c.dotted[:1].isalpha() and c.dotted.rsplit(".", 1)[-1][:1].isupper():
                            self.local_ctors[target.id] = c.dotted
                return
            self.env[target.id] = vals[0]
            if len(vals) > 1:
                self.alts[target.id] = vals[:MAX_ALTS]
            return
        lses = [v for v in vals if isinstance(v, Val)]
        if not lses:
            return
        if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
            # Slice assignment into a buffer: the buffer now holds this LSE (in that part).
            self.env[target.value.id] = lses[0]
            if len(lses) > 1:
                self.alts[target.value.id] = list(lses[:MAX_ALTS])
        elif isinstance(target, ast.Subscript):
            self.ctx.res.add_unresolved(self.loc(stmt), self.line_text(stmt), "LSE written into a subscript of an expression that is not followed")
        elif isinstance(target, ast.Attribute):
            self.ctx.res.add_unresolved(self.loc(stmt), self.line_text(stmt), "LSE stored on an attribute; readers elsewhere are not followed")

    # -- expressions

    def eval(self, node: ast.expr, stmt: ast.stmt) -> object | None:
        self.expr_depth += 1
        try:
            if self.expr_depth > MAX_EXPR_DEPTH:
                raise ExpressionTooDeep
            return self._eval(node, stmt)
        finally:
            self.expr_depth -= 1

    def _eval(self, node: ast.expr, stmt: ast.stmt) -> object | None:
        if isinstance(node, ast.Name):
            v = self.env.get(node.id)
            return v if isinstance(v, Val | TupleVal) else None
        if isinstance(node, ast.Subscript):
            inner = self.eval(node.value, stmt)
            if isinstance(inner, TupleVal):
                idx = node.slice
                if isinstance(idx, ast.Constant) and isinstance(idx.value, int):
                    return inner.items.get(idx.value)
                return None
            return inner
        if isinstance(node, ast.Attribute):
            inner = self.eval(node.value, stmt)
            if isinstance(inner, Val) and node.attr in ("T", "mT"):
                return inner.step(self.loc(node), source_text(node, self.mod.lines), layout=FLIP.get(inner.layout, "?"))
            return None
        if isinstance(node, ast.UnaryOp):
            return self.eval(node.operand, stmt)
        if isinstance(node, ast.IfExp):
            return self.eval(node.body, stmt) or self.eval(node.orelse, stmt)
        if isinstance(node, ast.BinOp):
            return self.binop(node, stmt)
        if isinstance(node, ast.Tuple):
            items = {i: v for i, e in enumerate(node.elts) if isinstance(v := self.eval(e, stmt), Val)}
            return TupleVal(items) if items else None
        if isinstance(node, ast.Call):
            return self.call_value(node, stmt)
        return None

    def binop(self, node: ast.BinOp, stmt: ast.stmt) -> Val | None:
        left, right = self.eval(node.left, stmt), self.eval(node.right, stmt)
        val = left if isinstance(left, Val) else right if isinstance(right, Val) else None
        if val is None:
            return None
        other = node.right if val is left else node.left
        text = source_text(node, self.mod.lines)
        if isinstance(node.op, ast.Mult | ast.Div):
            c = const_value(other, self.mod.constants)
            if c is None:
                return val.step(self.loc(node), text, base="?")
            factor = c if isinstance(node.op, ast.Mult) else (1 / c if c else 0.0)
            if math.isclose(factor, LN2, rel_tol=1e-3):
                return val.step(self.loc(node), text, base="e" if val.base == "2" else "?")
            if math.isclose(factor, LOG2E, rel_tol=1e-3):
                return val.step(self.loc(node), text, base="2" if val.base == "e" else "?")
            if math.isclose(factor, 1.0):
                return val
            return val.step(self.loc(node), text, base="?")
        return val  # adding or subtracting keeps the base (e.g. a sink term folded in)

    def call_value(self, call: ast.Call, stmt: ast.stmt) -> object | None:
        f = call.func
        text = source_text(call, self.mod.lines)
        # Methods on a tracked tensor.
        if isinstance(f, ast.Attribute):
            inner = self.eval(f.value, stmt)
            if isinstance(inner, Val):
                if f.attr in FLIPS:
                    return inner.step(self.loc(call), text, layout=FLIP.get(inner.layout, "?"))
                if f.attr == "permute":
                    dims = [a.value for a in call.args if isinstance(a, ast.Constant)]
                    lay = FLIP.get(inner.layout, "?") if dims == [1, 0] else inner.layout if dims == [0, 1] else "?"
                    return inner.step(self.loc(call), text, layout=lay)
                if f.attr in NEUTRAL:
                    return inner
                if f.attr in ("mul", "div", "__mul__"):
                    fake = ast.BinOp(f.value, ast.Mult() if f.attr != "div" else ast.Div(), call.args[0]) if call.args else None
                    if fake is not None:
                        ast.copy_location(fake, call)
                        return self.binop(fake, stmt)
                return None
        cands = self.callees(call)
        for cand in cands:
            name = cand.dotted
            short = name.rsplit(".", 1)[-1]
            if name.startswith("torch.") and call.args:
                arg = self.eval(call.args[0], stmt)
                if isinstance(arg, Val):
                    if short in ("transpose", "t", "swapaxes", "swapdims"):
                        return arg.step(self.loc(call), text, layout=FLIP.get(arg.layout, "?"))
                    if short in ("exp2", "exp"):
                        ok = (short == "exp2" and arg.base == "2") or (short == "exp" and arg.base == "e")
                        return arg.step(self.loc(call), text, base="se" if ok else "?")
                    if short in ("log2", "log"):
                        return arg.step(self.loc(call), text, base=("2" if short == "log2" else "e") if arg.base == "se" else "?")
                    if short in ("clone", "contiguous", "squeeze", "unsqueeze", "reshape", "where", "nan_to_num", "clamp"):
                        return arg
                return None
        conv, matched = self.ctx.match(cands)
        if conv is not None and matched is not None:
            if conv.role == "producer":
                return self.produce(call, conv, matched, stmt)
            result = None
            for c in cands:
                cv = self.ctx.contracts.convention_for(c.dotted, "consumer")
                if cv is not None and cv.lse_base != "none":
                    r = self.consume(call, cv, c, stmt, want_result=True)
                    result = result or r
            return result
        helpers = self.ctx.helpers_for(self, cands)
        if helpers:
            # A call bound at run time to one of several methods: each may be the one, so each
            # result is an alternative (e.g. a FlashInfer and a FlashAttention prefill variant).
            results = [r for h in helpers for r in flatten(self.enter_helper(call, h, stmt))]
            return results[0] if len(results) == 1 else (Alt(tuple(results)) if results else None)
        return None

    # -- producers and consumers

    def flag_value(self, call: ast.Call, cand: Fn, names: tuple[str, ...]) -> tuple[bool | None, str | None]:
        """(literal value, source text) of a keyword from the call or from partial-bound keywords."""
        for kw in call.keywords:
            if kw.arg in names:
                return literal_bool(kw.value), source_text(kw.value, self.mod.lines)
        for n in names:
            if n in cand.bound:
                return literal_bool(cand.bound[n]), source_text(cand.bound[n], self.mod.lines)
        return None, None

    def produce(self, call: ast.Call, conv: Convention, cand: Fn, stmt: ast.stmt) -> object | None:
        flag_note = ""
        if conv.flag is not None and "lse" in (conv.flag.when_true, conv.flag.when_false):
            val, text = self.flag_value(call, cand, conv.flag.names)
            if text is None:
                val = conv.flag.default
            if val is None:
                flag_note = f" ({conv.flag.name}={text}: not a literal, assumed to return the LSE)"
            elif conv.flag.effect(bool(val)) != "lse":
                self.ctx.record_unpacking(self, call, conv, cand, stmt, text)
                return None
        end = FlowEnd(cand.dotted, self.loc(call), conv.lse_base, conv.lse_layout, via=cand.via,
                      convention=str(conv.location))
        first = Val(conv.lse_base, conv.lse_layout, end,
                     (FlowStep(self.loc(call), self.line_text(call) + flag_note, conv.lse_base, conv.lse_layout),))
        if conv.lse_result is None:
            return None
        return TupleVal({conv.lse_result: first})

    def expected_base(self, call: ast.Call, conv: Convention, cand: Fn) -> tuple[str, str]:
        if conv.lse_base != "param-dependent" or conv.flag is None:
            return conv.lse_base, ""
        val, text = self.flag_value(call, cand, conv.flag.names)
        if text is None:
            return conv.flag.effect(conv.flag.default), f"{conv.flag.name} not passed (default {conv.flag.default})"
        if val is None:
            return "?", f"{conv.flag.name}={text} is not a literal"
        return conv.flag.effect(val), f"{conv.flag.name}={text}"

    def consume(self, call: ast.Call, conv: Convention, cand: Fn, stmt: ast.stmt, want_result: bool) -> object | None:
        base, flag_note = self.expected_base(call, conv, cand)
        for pname, pos in conv.lse_params.items():
            arg = next((k.value for k in call.keywords if k.arg == pname), None)
            if arg is None and pos < len(call.args) and not any(isinstance(a, ast.Starred) for a in call.args[: pos + 1]):
                arg = call.args[pos]
            if arg is None:
                continue
            vals = [v for v in self.eval_multi(arg, stmt) if isinstance(v, Val)]
            if not vals:
                root = arg
                while isinstance(root, ast.Attribute | ast.Subscript | ast.Call):
                    root = root.func if isinstance(root, ast.Call) else root.value
                if isinstance(root, ast.Name) and root.id in self.params and root.id not in self.env:
                    continue  # a pass-through wrapper: the flow is judged at its callers
                self.ctx.res.untraced.add((self.mod.path, call.lineno, pname))
                self.ctx.res.add_unresolved(
                    self.loc(call),
                    f"{cand.dotted.rsplit('.', 1)[-1]}({pname}={source_text(arg, self.mod.lines)})",
                    "LSE argument of a merge/reduction not traced to a producing kernel (dynamic dispatch, "
                    "a container or a call no contract covers)",
                )
                continue
            for val in vals:
                self.ctx.add_flow(self, call, conv, cand, pname, arg, val, base, flag_note)
        # The merged LSE, when handed back, carries the consumer's convention onwards.
        if conv.output_lse_param:
            out = next((k.value for k in call.keywords if k.arg == conv.output_lse_param), None)
            if isinstance(out, ast.Name):
                end = FlowEnd(cand.dotted, self.loc(call), base, conv.lse_layout, arg=conv.output_lse_param, via=cand.via,
                              convention=str(conv.location))
                self.env[out.id] = Val(base, conv.lse_layout, end,
                                        (FlowStep(self.loc(call), self.line_text(call) + " (merged LSE)", base, conv.lse_layout),))
        if want_result and conv.returns_lse:
            flag = conv.returns_lse.get("flag")
            if flag:
                asked, _ = self.flag_value(call, cand, (flag,))
                if not asked:
                    return None
            ins = [self.eval(a, stmt) for a in [*call.args, *[k.value for k in call.keywords]]]
            src = next((v for v in ins if isinstance(v, Val)), None)
            step = FlowStep(self.loc(call), self.line_text(call) + f" (returns the reduced LSE, base {base})", base, conv.lse_layout)
            if src is not None:
                out_val = Val(base, conv.lse_layout, src.producer, (*src.steps, step))
            else:
                end = FlowEnd(cand.dotted, self.loc(call), base, conv.lse_layout, via=cand.via, convention=str(conv.location))
                out_val = Val(base, conv.lse_layout, end, (step,))
            return TupleVal({int(conv.returns_lse["index"]): out_val})
        return None

    def calls_in(self, node: ast.AST, stmt: ast.stmt) -> None:
        """Side effects of calls anywhere in a statement: consumers, out-buffers, escapes."""
        value_calls: set[int] = set()
        if isinstance(stmt, ast.Assign | ast.AnnAssign | ast.Return) and isinstance(stmt.value, ast.Call):
            value_calls.add(id(stmt.value))  # evaluated (with its effects) by eval()
        for sub in ast_walk(node):
            if isinstance(sub, ast.Call):
                self.scales(sub)
            if not isinstance(sub, ast.Call) or id(sub) in value_calls:
                continue
            cands = self.callees(sub)
            conv, cand = self.ctx.match(cands)
            if conv is not None and cand is not None:
                if conv.role == "consumer":
                    for c in cands:
                        cv = self.ctx.contracts.convention_for(c.dotted, "consumer")
                        if cv is not None and cv.lse_base != "none":
                            self.consume(sub, cv, c, stmt, want_result=False)
                    continue
                if conv.lse_out_param or conv.lse_out_position is not None:
                    self.out_param(sub, conv, cand)
                continue
            helpers = self.ctx.helpers_for(self, cands)
            if helpers:
                if isinstance(stmt, ast.Expr) and stmt.value is sub:
                    for h in helpers:
                        self.enter_helper(sub, h, stmt)  # called for its effects: consumers inside it
                continue
            if cands and not any(c.dotted.startswith(("torch.", "<")) for c in cands):
                for a in [*sub.args, *[k.value for k in sub.keywords]]:
                    if isinstance(a, ast.Name) and isinstance(self.env.get(a.id), Val):
                        self.ctx.res.add_unresolved(
                            self.loc(sub), self.line_text(sub),
                            f"LSE `{a.id}` passed to {cands[0].dotted}, which no contract covers and the audit does not enter",
                        )
        # Producer out-buffers written by a call whose value is assigned.
        if isinstance(stmt, ast.Assign | ast.AnnAssign) and isinstance(stmt.value, ast.Call):
            conv, cand = self.ctx.match(self.callees(stmt.value))
            if conv is not None and cand is not None and conv.role == "producer" and (conv.lse_out_param or conv.lse_out_position is not None):
                self.out_param(stmt.value, conv, cand)

    def scales(self, call: ast.Call) -> None:
        """Compare k/v scale arguments with the callee's contract: form and k/v crossing."""
        for cand in self.callees(call):
            conv = self.ctx.contracts.convention_for(cand.dotted)
            if conv is not None and conv.scale_params:
                self.ctx.record_scales(self, call, conv, cand)
                return

    def out_param(self, call: ast.Call, conv: Convention, cand: Fn) -> None:
        out = next((k.value for k in call.keywords if k.arg == conv.lse_out_param), None)
        pos = conv.lse_out_position
        if out is None and pos is not None and pos < len(call.args) and not any(isinstance(a, ast.Starred) for a in call.args[: pos + 1]):
            out = call.args[pos]
        if not isinstance(out, ast.Name):
            return
        end = FlowEnd(cand.dotted, self.loc(call), conv.lse_base, conv.lse_layout, via=cand.via, convention=str(conv.location))
        self.env[out.id] = Val(conv.lse_base, conv.lse_layout, end,
                                (FlowStep(self.loc(call), f"{self.line_text(call)} (writes {conv.lse_out_param}={out.id})",
                                          conv.lse_base, conv.lse_layout),))

    def enter_helper(self, call: ast.Call, helper: tuple[PortModule, ast.FunctionDef | ast.AsyncFunctionDef, str | None], stmt: ast.stmt) -> object | None:
        mod, fn, cls = helper
        params = [a.arg for a in [*fn.args.posonlyargs, *fn.args.args]]
        if cls is not None and params and params[0] in ("self", "cls"):
            params = params[1:]
        seeds: dict[str, object] = {}
        for i, a in enumerate(call.args):
            if isinstance(a, ast.Starred) or i >= len(params):
                break
            self._seed(seeds, params[i], a, stmt)
        for k in call.keywords:
            if k.arg:
                self._seed(seeds, k.arg, k.value, stmt)
        w = Walker(self.ctx, mod, fn, cls, seeds, self.depth + 1)
        note = self.line_text(call) + f" (returned by {w.qualname})"
        out: list[object] = []
        for ret in flatten(w.run()):
            if isinstance(ret, Val):
                out.append(ret.step(self.loc(call), note))
            elif isinstance(ret, TupleVal):
                out.append(TupleVal({i: v.step(self.loc(call), note) for i, v in ret.items.items()}))
        return out[0] if len(out) == 1 else (Alt(tuple(out)) if out else None)

    def _seed(self, seeds: dict[str, object], name: str, arg: ast.expr, stmt: ast.stmt) -> None:
        v = self.eval(arg, stmt)
        if isinstance(v, Val):
            seeds[name] = v.step(self.loc(arg), f"{self.line_text(arg)} (passed as `{name}`)")
            return
        fns = [c for c in self.resolve_value(arg) if isinstance(c, Fn)] if isinstance(arg, ast.Name | ast.Attribute) else []
        if len(fns) == 1 and not fns[0].dotted.startswith("<"):
            seeds[name] = Fn(fns[0].dotted, fns[0].bound, "passed-callable")
