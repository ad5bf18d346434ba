# Contract-aware dataflow: follows each LSE from the kernel call that produces it, through
# transposes, views, reassignments and base conversions, to each merge or DCP reduction that consumes it.
from __future__ import annotations

import ast
import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from metax_audit.contracts import Contracts, Convention
from metax_audit.findings import make_finding, rule
from metax_audit.models import Category, Finding, Location, Severity, Unresolved
from metax_audit.pysource import cached_parse

# Hand-written on `ast` rather than a library: what is needed is a small, contract-driven walk
# of function bodies (griffe gives structure, not statement-level value flow; no maintained
# Python dataflow library models tensor layouts or log bases).

TH = "[tokens, heads]"
HT = "[heads, tokens]"
_FLIP = {TH: HT, HT: TH}

RULE_BASE = rule(
    "MXA510",
    Category.LSE,
    Severity.ERROR,
    "an LSE produced in one log base reaches a merge or reduction that assumes the other",
    "The producing kernel's contract (component-contracts.md) gives its LSE base; the consumer "
    "weights partial outputs assuming another base, so the merged output is silently wrong. "
    "Convert on the way (`lse * math.log(2)` turns base 2 into base e) or pass the consumer's "
    "base flag. The evidence lists the value's path line by line; run the named probe to confirm.",
)
RULE_FLAG_OFF = rule(
    "MXA512",
    Category.LSE,
    Severity.ERROR,
    "a kernel result is unpacked as if it held the LSE, but the call does not ask for the LSE",
    "The kernel's contract returns the LSE only when a flag (e.g. return_lse, return_attn_probs, "
    "return_softmax_lse) is true. Without it the unpacking fails or binds something that is not an "
    "LSE, which a later merge then weights with. Pass the flag, or record the vendor build's "
    "different behaviour in component-contracts.md.",
)
RULE_SCALE_FORM = rule(
    "MXA513",
    Category.FP8_SCALE,
    Severity.WARNING,
    "a KV scale is passed in the other form than the kernel's contract (Python float vs tensor)",
    "FlashInfer 0.2.x wrappers take k_scale/v_scale as Python floats; vLLM's cache ops and Triton "
    "kernels load one-element tensors. A tensor where a float is expected forces a device sync "
    "(and breaks graph capture) or fails; a float where a tensor is expected fails or is ignored. "
    "Pass the layer attribute of the right form (e.g. `_k_scale_float` vs `_k_scale`).",
)
RULE_SCALE_SWAP = rule(
    "MXA514",
    Category.FP8_SCALE,
    Severity.ERROR,
    "the K and V scales are swapped at a kernel call",
    "The argument for the K scale is named after the V scale and the one for the V scale after "
    "the K scale. With different K and V scales the dequantised attention is wrong. (One scale "
    "passed for both, as MLA's single latent cache does, is not reported.)",
)
RULE_LAYOUT = rule(
    "MXA511",
    Category.LAYOUT,
    Severity.ERROR,
    "an LSE reaches its consumer in the other layout ([tokens, heads] vs [heads, tokens])",
    "The consumer indexes the LSE as heads-first or tokens-first; the value arrives transposed "
    "relative to that. Transpose (and make contiguous) on the way. The evidence lists the path.",
)


# ---------------------------------------------------------------- records


@dataclass(frozen=True)
class FlowStep:
    location: Location
    text: str  # the source line of the step, stripped
    base: str  # the LSE base after the step: "2" | "e" | "se" (exponentiated) | "?"
    layout: str  # "[tokens, heads]" | "[heads, tokens]" | "?"


@dataclass(frozen=True)
class FlowEnd:
    callee: str  # resolved dotted callee
    location: Location
    base: str
    layout: str
    arg: str = ""  # consumer: the parameter receiving the LSE
    via: str = ""  # how the callee was resolved
    convention: str = ""  # where the convention is written (component-contracts.md:line)


@dataclass(frozen=True)
class LseFlow:
    producer: FlowEnd
    consumer: FlowEnd
    steps: tuple[FlowStep, ...]
    verdict: str  # "match" | "mismatch" | "unknown"
    reasons: tuple[str, ...] = ()
    probes: tuple[str, ...] = ()  # probe commands that confirm the verdict at run time


# ---------------------------------------------------------------- values


@dataclass(frozen=True)
class _Val:
    base: str
    layout: str
    producer: FlowEnd
    steps: tuple[FlowStep, ...] = ()

    def step(self, loc: Location, text: str, base: str | None = None, layout: str | None = None) -> _Val:
        b, lay = base or self.base, layout or self.layout
        steps = self.steps
        if steps and steps[-1].location.path == loc.path and steps[-1].location.line == loc.line:
            # One step per source line; an annotated text of that line ("returned by ...") is kept.
            if steps[-1].text.startswith(text):
                text = steps[-1].text
            steps = steps[:-1]
        return _Val(b, lay, self.producer, (*steps, FlowStep(loc, text, b, lay)))


@dataclass(frozen=True)
class _Tuple:
    items: dict[int, _Val]


@dataclass(frozen=True)
class _Alt:
    """Several values one expression may have (a call dispatched to one of several helpers)."""

    options: tuple[object, ...]


def _flatten(v: object | None) -> list[object]:
    if v is None:
        return []
    return [o for o in v.options if o is not None] if isinstance(v, _Alt) else [v]


@dataclass(frozen=True)
class _Fn:
    """A callable value: a dotted target plus keywords bound by functools.partial."""

    dotted: str
    bound: dict[str, ast.expr] = field(default_factory=dict)
    via: str = ""


@dataclass(frozen=True)
class _Inst:
    cls: str
    via: str = ""


_NEUTRAL = {"contiguous", "view", "reshape", "float", "to", "clone", "squeeze", "unsqueeze", "detach", "flatten",
            "view_as", "reshape_as", "type", "cuda", "narrow", "expand", "__getitem__"}
_FLIPS = {"transpose", "t", "swapaxes", "swapdims"}
_GENERIC_METHODS = {"forward", "run", "build", "plan", "apply", "call", "get", "update", "copy_", "to", "view"}
_MAX_ALTS = 8  # alternatives kept per name; beyond this a path is dropped (rare in attention code)
_LN2 = math.log(2)
_LOG2E = 1 / math.log(2)
_CONST_NAMES = re.compile(r"^_?(LN_?2|LOG_?2|LOG2_?E|LOG_?2_?E|RCP_LN2|INV_LN2)$", re.IGNORECASE)


def _text(node: ast.AST, src_lines: list[str]) -> str:
    try:
        return ast.unparse(node)
    except Exception:  # pragma: no cover - unparse handles every node the parser produces
        return src_lines[getattr(node, "lineno", 1) - 1].strip()


def _literal_bool(node: ast.expr | None) -> bool | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, bool):
        return node.value
    return None


# ---------------------------------------------------------------- module context


@dataclass
class _Module:
    path: str  # repo-relative
    module: str
    tree: ast.Module
    lines: list[str]
    imports: dict[str, str]
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef]
    classes: dict[str, ast.ClassDef]
    self_attrs: dict[str, dict[str, list[tuple[ast.expr, dict[str, str]]]]]  # class -> attr -> [(expr, imports)]
    ctor_names: dict[str, set[str]]  # last name segment -> constructor dotted names assigned to it
    constants: dict[str, float]
    fn_imports: dict[int, dict[str, str]]  # id(function node) -> module imports plus its lazy ones


def _imports_of(body: Sequence[ast.stmt], module: str, into: dict[str, str], deep: bool) -> None:
    nodes = [n for s in body for n in ast.walk(s)] if deep else list(body)
    pkg = module.rsplit(".", 1)[0] if "." in module else ""
    for node in nodes:
        if isinstance(node, ast.Import):
            for a in node.names:
                into[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                parts = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
                base = ".".join([*parts, base]) if base else ".".join(parts)
            for a in node.names:
                into[a.asname or a.name] = f"{base}.{a.name}"


def _module_name(path: str) -> str:
    p = path[:-3] if path.endswith(".py") else path
    parts = p.split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _const_value(node: ast.expr, consts: dict[str, float]) -> float | None:
    """Numeric value of a small constant expression (ln 2, log2 e and their spellings)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.Name):
        if node.id in consts:
            return consts[node.id]
        if _CONST_NAMES.match(node.id):
            return _LN2 if "LN" in node.id.upper() and "RCP" not in node.id.upper() and "INV" not in node.id.upper() else _LOG2E
    if isinstance(node, ast.Attribute) and node.attr == "e":
        return math.e
    if isinstance(node, ast.BinOp):
        a, b = _const_value(node.left, consts), _const_value(node.right, consts)
        if a is not None and b is not None:
            if isinstance(node.op, ast.Div) and b:
                return a / b
            if isinstance(node.op, ast.Mult):
                return a * b
    if isinstance(node, ast.Call):
        fname = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        vals = [_const_value(a, consts) for a in node.args]
        if vals and all(v is not None and v > 0 for v in vals):
            x = vals[0]
            assert x is not None
            if fname == "log" and len(vals) == 1:
                return math.log(x)
            if fname == "log" and len(vals) == 2 and vals[1] not in (None, 1.0):
                return math.log(x, vals[1])  # type: ignore[arg-type]
            if fname == "log2":
                return math.log2(x)
            if fname == "tensor":
                return x
    return None


def _note_ctor(mod: _Module, node: ast.AST) -> None:
    """Names (local or attribute) given a wrapper class anywhere in the file: by a constructor, an
    `.append(Ctor(...))` or an annotation (`prefill_main: Wrapper | None`, `list[Wrapper]`). The
    fallback used when a wrapper travels through metadata (`w = meta.decode.wrapper`) by name."""
    def last(t: ast.expr) -> str | None:
        return t.attr if isinstance(t, ast.Attribute) else getattr(t, "id", None)

    def record(name: str | None, cls: str) -> None:
        if name:
            mod.ctor_names.setdefault(name.lstrip("_"), set()).add(cls)

    if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
        f = node.value.func
        if isinstance(f, ast.Name) and f.id in mod.imports and f.id[:1].isupper():
            for t in node.targets:
                record(last(t), mod.imports[f.id])
    elif isinstance(node, ast.AnnAssign):
        ann = node.annotation
        if isinstance(ann, ast.Constant) and isinstance(ann.value, str):  # a quoted (forward) annotation
            try:
                ann = ast.parse(ann.value, mode="eval").body
            except SyntaxError:
                return
        for n in ast.walk(ann):
            if isinstance(n, ast.Name) and n.id in mod.imports and n.id[:1].isupper() and "Wrapper" in n.id:
                record(last(node.target), mod.imports[n.id])
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "append" and node.args:
        arg = node.args[0]
        if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Name) and arg.func.id in mod.imports and arg.func.id[:1].isupper():
            record(last(node.func.value), mod.imports[arg.func.id])


def _load_module(root: Path, path: str) -> _Module | None:
    try:
        src, tree = cached_parse(root / path)  # shared, read-only tree
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    module = _module_name(path)
    imports: dict[str, str] = {}
    _imports_of(tree.body, module, imports, deep=False)
    # Guarded imports (try/if at module level) bind names too.
    for stmt in tree.body:
        if isinstance(stmt, ast.Try | ast.If):
            _imports_of([stmt], module, imports, deep=True)
    functions = {s.name: s for s in tree.body if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)}
    classes = {s.name: s for s in tree.body if isinstance(s, ast.ClassDef)}
    consts: dict[str, float] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            v = _const_value(stmt.value, consts)
            if v is not None:
                consts[stmt.targets[0].id] = v
    mod = _Module(path, module, tree, src.splitlines(), imports, functions, classes, {}, {}, consts, {})
    for cls in classes.values():  # dataclass-style fields: `prefill_main: Wrapper | None = None`
        for stmt in cls.body:
            if isinstance(stmt, ast.AnnAssign):
                _note_ctor(mod, stmt)
    # One walk per function: its lazy imports (kept for the walker) and, for methods, the
    # `self.x = ...` assignments that later resolve `self.x(...)` and `self.x.run(...)`.
    owners: list[tuple[str | None, ast.FunctionDef | ast.AsyncFunctionDef]] = [(None, f) for f in functions.values()]
    owners += [(c, f) for c, cls in classes.items() for f in cls.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)]
    for cname, fn in owners:
        local_imports = dict(imports)
        assigns: list[ast.Assign] = []
        for node in ast.walk(fn):
            if isinstance(node, ast.Import | ast.ImportFrom):
                _imports_of([node], module, local_imports, deep=False)
            elif isinstance(node, ast.Assign):
                assigns.append(node)
                _note_ctor(mod, node)
            elif isinstance(node, ast.AnnAssign | ast.Call):
                _note_ctor(mod, node)
        mod.fn_imports[id(fn)] = local_imports
        if cname is None:
            continue
        attrs = mod.self_attrs.setdefault(cname, {})
        for node in assigns:
            for t in node.targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    attrs.setdefault(t.attr, []).append((node.value, local_imports))
    return mod
    return mod


# ---------------------------------------------------------------- the walk


@dataclass
class _Result:
    flows: dict[tuple[str, str, str, str], LseFlow] = field(default_factory=dict)
    unresolved: dict[tuple[str, int, str], Unresolved] = field(default_factory=dict)
    untraced: set[tuple[str, int, str]] = field(default_factory=set)  # (path, line, param) seen untraced
    findings: dict[tuple[str, int, str], Finding] = field(default_factory=dict)  # findings that are not flows

    def add_unresolved(self, loc: Location, text: str, reason: str) -> None:
        self.unresolved.setdefault((loc.path, loc.line, text), Unresolved(loc, text, reason))


class _Walker:
    def __init__(
        self,
        ctx: _Analysis,
        mod: _Module,
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

    # -- helpers

    def loc(self, node: ast.AST) -> Location:
        return Location(self.mod.path, getattr(node, "lineno", 0), self.qualname)

    def line_text(self, node: ast.AST) -> str:
        n = getattr(node, "lineno", 0)
        return self.mod.lines[n - 1].strip() if 0 < n <= len(self.mod.lines) else _text(node, self.mod.lines)

    # -- resolution

    def _by_name(self, name: str) -> list[object]:
        ctors = self.mod.ctor_names.get(name.lstrip("_"), set())
        if len(ctors) == 1:
            return [_Inst(next(iter(ctors)), "same-name-in-file")]
        cls = self.ctx.global_ctor(name) if not ctors else None
        return [_Inst(cls, "same-name-in-scope")] if cls else []

    def resolve_value(self, node: ast.expr) -> list[object]:
        """What an expression denotes when used as a callee or an object: _Fn or _Inst candidates."""
        if isinstance(node, ast.Name):
            bound = self.env.get(node.id)
            if isinstance(bound, _Fn | _Inst):
                return [bound]
            if node.id in self.local_ctors:
                return [_Inst(self.local_ctors[node.id], "local-constructor")]
            if node.id in self.imports:
                return [_Fn(self.imports[node.id], via="import")]
            if node.id in self.mod.functions:
                return [_Fn(f"{self.mod.module}.{node.id}", via="module-function")]
            return self._by_name(node.id)
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "self" and self.cls:
                cls = self.mod.classes.get(self.cls)
                if cls is not None and any(
                    isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef) and m.name == node.attr for m in cls.body
                ):
                    return [_Fn(f"{self.mod.module}.{self.cls}.{node.attr}", via="self-method")]
                out: list[object] = []
                for expr, imps in self.mod.self_attrs.get(self.cls, {}).get(node.attr, []):
                    out.extend(self._attr_candidates(expr, imps))
                return out or self._by_name(node.attr)
            inner = self.resolve_value(node.value)
            out = []
            for c in inner:
                if isinstance(c, _Inst):
                    out.append(_Fn(f"{c.cls}.{node.attr}", via=c.via))
                elif isinstance(c, _Fn) and not c.bound:
                    out.append(_Fn(f"{c.dotted}.{node.attr}", via=c.via))
            if not out:
                if found := self._by_name(node.attr):
                    return found
                out.extend(self.ctx.implementations(node.attr))
                # Unknown object: keep the method name so interface contracts (`*.run_x`) still apply.
                out.append(_Fn(f"<{_text(node.value, self.mod.lines)}>.{node.attr}", via="method-name"))
            return out
        if isinstance(node, ast.Subscript):  # wrappers[i]: an element of a list of wrappers
            return [c for c in self.resolve_value(node.value) if isinstance(c, _Inst)]
        if isinstance(node, ast.Call):  # Wrapper(...).run(...): an instance made on the spot
            return [_Inst(c.dotted, "constructor") for c in self.resolve_value(node.func)
                    if isinstance(c, _Fn) and c.dotted.rsplit(".", 1)[-1][:1].isupper()]
        return []

    def _attr_candidates(self, expr: ast.expr, imps: dict[str, str]) -> list[object]:
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "self" and self.cls:
            cls = self.mod.classes.get(self.cls)
            if cls is not None and any(isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef) and m.name == expr.attr for m in cls.body):
                return [_Fn(f"{self.mod.module}.{self.cls}.{expr.attr}", via="self-attr-method")]
            return []
        if isinstance(expr, ast.IfExp):
            return self._attr_candidates(expr.body, imps) + self._attr_candidates(expr.orelse, imps)
        if isinstance(expr, ast.Name):
            if expr.id in imps:
                return [_Fn(imps[expr.id], via="self-attr")]
            if expr.id in self.mod.functions:
                return [_Fn(f"{self.mod.module}.{expr.id}", via="self-attr")]
            return []
        if isinstance(expr, ast.Call):
            f = expr.func
            fname = imps.get(f.id) if isinstance(f, ast.Name) else None
            if fname is None and isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
                head = imps.get(f.value.id)
                fname = f"{head}.{f.attr}" if head else None
            if fname in ("functools.partial",) and expr.args:
                bound = {k.arg: k.value for k in expr.keywords if k.arg}
                return [_Fn(c.dotted, {**c.bound, **bound}, "partial") for c in self._attr_candidates(expr.args[0], imps) if isinstance(c, _Fn)]
            if fname is not None:
                return [_Inst(fname, "self-attr")]
        return []

    def callees(self, call: ast.Call) -> list[_Fn]:
        return [c for c in self.resolve_value(call.func) if isinstance(c, _Fn)]

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
                    alts[name] = options[:_MAX_ALTS]
        self.env, self.alts = env, alts

    def eval_multi(self, node: ast.expr, stmt: ast.stmt) -> list[object]:
        """eval() under every combination of the alternatives of the names it reads."""
        names = sorted({n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in self.alts}) if self.alts else []
        if not names:
            return _flatten(self.eval(node, stmt))
        saved = dict(self.env)
        out: list[object] = []
        for combo in itertools.islice(itertools.product(*(self.alts[n] for n in names)), _MAX_ALTS):
            self.env.update(dict(zip(names, combo, strict=True)))
            for v in _flatten(self.eval(node, stmt)):
                if v not in out:
                    out.append(v)
        self.env = saved
        return out

    # -- statements

    def run(self) -> object | None:
        self.block(self.fn.body)
        if not self.returned:
            return None
        return self.returned[0] if len(self.returned) == 1 else _Alt(tuple(self.returned[:_MAX_ALTS]))

    def block(self, body: Sequence[ast.stmt]) -> None:
        for stmt in body:
            self.stmt(stmt)

    def stmt(self, stmt: ast.stmt) -> None:
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
                    if isinstance(self.eval(a, stmt), _Val):
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
                self.bind(t, [o.items[i] for o in options if isinstance(o, _Tuple) and i in o.items], stmt)
            return
        self.bind(target, options, stmt)

    def bind(self, target: ast.expr, vals: list[object], stmt: ast.stmt) -> None:
        vals = [v.step(self.loc(stmt), self.line_text(stmt)) if isinstance(v, _Val) else v for v in vals]
        if isinstance(target, ast.Name):
            self.alts.pop(target.id, None)
            if not vals:
                self.env.pop(target.id, None)
                if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Name | ast.Attribute):
                    for c in self.resolve_value(stmt.value.func):
                        if isinstance(c, _Fn) and c.dotted[:1].isalpha() and c.dotted.rsplit(".", 1)[-1][:1].isupper():
                            self.local_ctors[target.id] = c.dotted
                return
            self.env[target.id] = vals[0]
            if len(vals) > 1:
                self.alts[target.id] = vals[:_MAX_ALTS]
            return
        lses = [v for v in vals if isinstance(v, _Val)]
        if not lses:
            return
        if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
            # Slice assignment into a buffer: the buffer now holds this LSE (in that part).
            self.env[target.value.id] = lses[0]
            if len(lses) > 1:
                self.alts[target.value.id] = list(lses[:_MAX_ALTS])
        elif isinstance(target, ast.Subscript):
            self.ctx.res.add_unresolved(self.loc(stmt), self.line_text(stmt), "LSE written into a subscript of an expression that is not followed")
        elif isinstance(target, ast.Attribute):
            self.ctx.res.add_unresolved(self.loc(stmt), self.line_text(stmt), "LSE stored on an attribute; readers elsewhere are not followed")

    # -- expressions

    def eval(self, node: ast.expr, stmt: ast.stmt) -> object | None:
        if isinstance(node, ast.Name):
            v = self.env.get(node.id)
            return v if isinstance(v, _Val | _Tuple) else None
        if isinstance(node, ast.Subscript):
            inner = self.eval(node.value, stmt)
            if isinstance(inner, _Tuple):
                idx = node.slice
                if isinstance(idx, ast.Constant) and isinstance(idx.value, int):
                    return inner.items.get(idx.value)
                return None
            return inner
        if isinstance(node, ast.Attribute):
            inner = self.eval(node.value, stmt)
            if isinstance(inner, _Val) and node.attr in ("T", "mT"):
                return inner.step(self.loc(node), _text(node, self.mod.lines), layout=_FLIP.get(inner.layout, "?"))
            return None
        if isinstance(node, ast.UnaryOp):
            return self.eval(node.operand, stmt)
        if isinstance(node, ast.IfExp):
            return self.eval(node.body, stmt) or self.eval(node.orelse, stmt)
        if isinstance(node, ast.BinOp):
            return self.binop(node, stmt)
        if isinstance(node, ast.Tuple):
            items = {i: v for i, e in enumerate(node.elts) if isinstance(v := self.eval(e, stmt), _Val)}
            return _Tuple(items) if items else None
        if isinstance(node, ast.Call):
            return self.call_value(node, stmt)
        return None

    def binop(self, node: ast.BinOp, stmt: ast.stmt) -> _Val | None:
        left, right = self.eval(node.left, stmt), self.eval(node.right, stmt)
        val = left if isinstance(left, _Val) else right if isinstance(right, _Val) else None
        if val is None:
            return None
        other = node.right if val is left else node.left
        text = _text(node, self.mod.lines)
        if isinstance(node.op, ast.Mult | ast.Div):
            c = _const_value(other, self.mod.constants)
            if c is None:
                return val.step(self.loc(node), text, base="?")
            factor = c if isinstance(node.op, ast.Mult) else (1 / c if c else 0.0)
            if math.isclose(factor, _LN2, rel_tol=1e-3):
                return val.step(self.loc(node), text, base="e" if val.base == "2" else "?")
            if math.isclose(factor, _LOG2E, rel_tol=1e-3):
                return val.step(self.loc(node), text, base="2" if val.base == "e" else "?")
            if math.isclose(factor, 1.0):
                return val
            return val.step(self.loc(node), text, base="?")
        return val  # adding or subtracting keeps the base (e.g. a sink term folded in)

    def call_value(self, call: ast.Call, stmt: ast.stmt) -> object | None:
        f = call.func
        text = _text(call, self.mod.lines)
        # Methods on a tracked tensor.
        if isinstance(f, ast.Attribute):
            inner = self.eval(f.value, stmt)
            if isinstance(inner, _Val):
                if f.attr in _FLIPS:
                    return inner.step(self.loc(call), text, layout=_FLIP.get(inner.layout, "?"))
                if f.attr == "permute":
                    dims = [a.value for a in call.args if isinstance(a, ast.Constant)]
                    lay = _FLIP.get(inner.layout, "?") if dims == [1, 0] else inner.layout if dims == [0, 1] else "?"
                    return inner.step(self.loc(call), text, layout=lay)
                if f.attr in _NEUTRAL:
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
                if isinstance(arg, _Val):
                    if short in ("transpose", "t", "swapaxes", "swapdims"):
                        return arg.step(self.loc(call), text, layout=_FLIP.get(arg.layout, "?"))
                    if short in ("exp2", "exp"):
                        ok = (short == "exp2" and arg.base == "2") or (short == "exp" and arg.base == "e")
                        return arg.step(self.loc(call), text, base="se" if ok else "?")
                    if short in ("log2", "log"):
                        return arg.step(self.loc(call), text, base=("2" if short == "log2" else "e") if arg.base == "se" else "?")
                    if short in ("clone", "contiguous", "squeeze", "unsqueeze", "reshape", "where", "nan_to_num", "clamp"):
                        return arg
                return None
        conv, cand = self.ctx.match(cands)
        if conv is not None and cand is not None:
            if conv.role == "producer":
                return self.produce(call, conv, cand, stmt)
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
            results = [r for h in helpers for r in _flatten(self.enter_helper(call, h, stmt))]
            return results[0] if len(results) == 1 else (_Alt(tuple(results)) if results else None)
        return None

    # -- producers and consumers

    def flag_value(self, call: ast.Call, cand: _Fn, names: tuple[str, ...]) -> tuple[bool | None, str | None]:
        """(literal value, source text) of a keyword from the call or from partial-bound keywords."""
        for kw in call.keywords:
            if kw.arg in names:
                return _literal_bool(kw.value), _text(kw.value, self.mod.lines)
        for n in names:
            if n in cand.bound:
                return _literal_bool(cand.bound[n]), _text(cand.bound[n], self.mod.lines)
        return None, None

    def produce(self, call: ast.Call, conv: Convention, cand: _Fn, stmt: ast.stmt) -> object | None:
        flag_note = ""
        if conv.flag is not None and "lse" in (conv.flag.when_true, conv.flag.when_false):
            val, text = self.flag_value(call, cand, conv.flag.names)
            if text is None:
                val = conv.flag.default
            if val is None:
                flag_note = f" ({conv.flag.name}={text}: not a literal, assumed to return the LSE)"
            elif conv.flag.effect(bool(val)) != "lse":
                self.ctx.flag_off(self, call, conv, cand, stmt, text)
                return None
        end = FlowEnd(cand.dotted, self.loc(call), conv.lse_base, conv.lse_layout, via=cand.via,
                      convention=str(conv.location))
        first = _Val(conv.lse_base, conv.lse_layout, end,
                     (FlowStep(self.loc(call), self.line_text(call) + flag_note, conv.lse_base, conv.lse_layout),))
        if conv.lse_result is None:
            return None
        return _Tuple({conv.lse_result: first})

    def expected_base(self, call: ast.Call, conv: Convention, cand: _Fn) -> tuple[str, str]:
        if conv.lse_base != "param-dependent" or conv.flag is None:
            return conv.lse_base, ""
        val, text = self.flag_value(call, cand, conv.flag.names)
        if text is None:
            return conv.flag.effect(conv.flag.default), f"{conv.flag.name} not passed (default {conv.flag.default})"
        if val is None:
            return "?", f"{conv.flag.name}={text} is not a literal"
        return conv.flag.effect(val), f"{conv.flag.name}={text}"

    def consume(self, call: ast.Call, conv: Convention, cand: _Fn, stmt: ast.stmt, want_result: bool) -> object | None:
        base, flag_note = self.expected_base(call, conv, cand)
        for pname, pos in conv.lse_params.items():
            arg = next((k.value for k in call.keywords if k.arg == pname), None)
            if arg is None and pos < len(call.args) and not any(isinstance(a, ast.Starred) for a in call.args[: pos + 1]):
                arg = call.args[pos]
            if arg is None:
                continue
            vals = [v for v in self.eval_multi(arg, stmt) if isinstance(v, _Val)]
            if not vals:
                root = arg
                while isinstance(root, ast.Attribute | ast.Subscript | ast.Call):
                    root = root.func if isinstance(root, ast.Call) else root.value
                if isinstance(root, ast.Name) and root.id in self.params and root.id not in self.env:
                    continue  # a pass-through wrapper: the flow is judged at its callers
                self.ctx.res.untraced.add((self.mod.path, call.lineno, pname))
                self.ctx.res.add_unresolved(
                    self.loc(call),
                    f"{cand.dotted.rsplit('.', 1)[-1]}({pname}={_text(arg, self.mod.lines)})",
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
                self.env[out.id] = _Val(base, conv.lse_layout, end,
                                        (FlowStep(self.loc(call), self.line_text(call) + " (merged LSE)", base, conv.lse_layout),))
        if want_result and conv.returns_lse:
            flag = conv.returns_lse.get("flag")
            if flag:
                val, _ = self.flag_value(call, cand, (flag,))
                if not val:
                    return None
            ins = [self.eval(a, stmt) for a in [*call.args, *[k.value for k in call.keywords]]]
            src = next((v for v in ins if isinstance(v, _Val)), None)
            step = FlowStep(self.loc(call), self.line_text(call) + f" (returns the reduced LSE, base {base})", base, conv.lse_layout)
            if src is not None:
                out_val = _Val(base, conv.lse_layout, src.producer, (*src.steps, step))
            else:
                end = FlowEnd(cand.dotted, self.loc(call), base, conv.lse_layout, via=cand.via, convention=str(conv.location))
                out_val = _Val(base, conv.lse_layout, end, (step,))
            return _Tuple({int(conv.returns_lse["index"]): out_val})
        return None

    def calls_in(self, node: ast.AST, stmt: ast.stmt) -> None:
        """Side effects of calls anywhere in a statement: consumers, out-buffers, escapes."""
        value_calls: set[int] = set()
        if isinstance(stmt, ast.Assign | ast.AnnAssign | ast.Return) and isinstance(stmt.value, ast.Call):
            value_calls.add(id(stmt.value))  # evaluated (with its effects) by eval()
        for sub in ast.walk(node):
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
                    if isinstance(a, ast.Name) and isinstance(self.env.get(a.id), _Val):
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
                self.ctx.check_scales(self, call, conv, cand)
                return

    def out_param(self, call: ast.Call, conv: Convention, cand: _Fn) -> None:
        out = next((k.value for k in call.keywords if k.arg == conv.lse_out_param), None)
        pos = conv.lse_out_position
        if out is None and pos is not None and pos < len(call.args) and not any(isinstance(a, ast.Starred) for a in call.args[: pos + 1]):
            out = call.args[pos]
        if not isinstance(out, ast.Name):
            return
        end = FlowEnd(cand.dotted, self.loc(call), conv.lse_base, conv.lse_layout, via=cand.via, convention=str(conv.location))
        self.env[out.id] = _Val(conv.lse_base, conv.lse_layout, end,
                                (FlowStep(self.loc(call), f"{self.line_text(call)} (writes {conv.lse_out_param}={out.id})",
                                          conv.lse_base, conv.lse_layout),))

    def enter_helper(self, call: ast.Call, helper: tuple[_Module, ast.FunctionDef | ast.AsyncFunctionDef, str | None], stmt: ast.stmt) -> object | None:
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
        w = _Walker(self.ctx, mod, fn, cls, seeds, self.depth + 1)
        note = self.line_text(call) + f" (returned by {w.qualname})"
        out: list[object] = []
        for ret in _flatten(w.run()):
            if isinstance(ret, _Val):
                out.append(ret.step(self.loc(call), note))
            elif isinstance(ret, _Tuple):
                out.append(_Tuple({i: v.step(self.loc(call), note) for i, v in ret.items.items()}))
        return out[0] if len(out) == 1 else (_Alt(tuple(out)) if out else None)

    def _seed(self, seeds: dict[str, object], name: str, arg: ast.expr, stmt: ast.stmt) -> None:
        v = self.eval(arg, stmt)
        if isinstance(v, _Val):
            seeds[name] = v.step(self.loc(arg), f"{self.line_text(arg)} (passed as `{name}`)")
            return
        fns = [c for c in self.resolve_value(arg) if isinstance(c, _Fn)] if isinstance(arg, ast.Name | ast.Attribute) else []
        if len(fns) == 1 and not fns[0].dotted.startswith("<"):
            seeds[name] = _Fn(fns[0].dotted, fns[0].bound, "passed-callable")


class _Analysis:
    def __init__(self, root: Path, contracts: Contracts, port_package: str) -> None:
        self.root, self.contracts, self.port = root, contracts, port_package
        self.res = _Result()
        self._mods: dict[str, _Module | None] = {}
        self._impl_cache: dict[str, list[_Fn]] = {}
        self._ctor_cache: dict[str, str | None] = {}
        tails = {p.rsplit(".", 1)[-1].strip("*").lower() for c in contracts.conventions
                 if c.role == "consumer" or c.scale_params for p in c.components}
        scale_words = {n.lower() for c in contracts.conventions for n in c.scale_params if len(n) > 5}
        self.filter_words = tuple(sorted({"lse", *scale_words, *(t for t in tails if len(t) > 3)}))

    def module(self, path: str) -> _Module | None:
        if path not in self._mods:
            self._mods[path] = _load_module(self.root, path)
        return self._mods[path]

    def match(self, cands: Sequence[_Fn]) -> tuple[Convention | None, _Fn | None]:
        for c in cands:
            conv = self.contracts.convention_for(c.dotted)
            if conv is not None and conv.lse_base != "none":
                return conv, c
        return None, None

    def helpers_for(self, w: _Walker, cands: Sequence[_Fn]) -> list[tuple[_Module, ast.FunctionDef | ast.AsyncFunctionDef, str | None]]:
        """The port functions or methods the walk may enter (one level below the analysed function)."""
        if w.depth >= 1:
            return []
        out = []
        for c in cands:
            h = self._helper(w, c)
            if h is not None and h not in out:
                out.append(h)
        return out

    def _helper(self, w: _Walker, c: _Fn) -> tuple[_Module, ast.FunctionDef | ast.AsyncFunctionDef, str | None] | None:
        if not c.dotted.startswith(self.port + ".") and not c.dotted.startswith(w.mod.module + "."):
            return None
        parts = c.dotted.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            mod_name, rest = ".".join(parts[:cut]), parts[cut:]
            path = mod_name.replace(".", "/") + ".py"
            mod = w.mod if mod_name == w.mod.module else (self.module(path) if (self.root / path).is_file() else None)
            if mod is None:
                continue
            if len(rest) == 1 and rest[0] in mod.functions:
                return mod, mod.functions[rest[0]], None
            if len(rest) == 2 and rest[0] in mod.classes:
                for m in mod.classes[rest[0]].body:
                    if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef) and m.name == rest[1]:
                        return mod, m, rest[0]
            break
        return None

    def check_scales(self, w: _Walker, call: ast.Call, conv: Convention, cand: _Fn) -> None:
        args: dict[str, ast.expr] = {}
        for pname, spec in conv.scale_params.items():
            arg = next((k.value for k in call.keywords if k.arg == pname), None)
            pos = spec.get("position")
            if arg is None and isinstance(pos, int) and pos < len(call.args) and not any(
                isinstance(a, ast.Starred) for a in call.args[: pos + 1]
            ):
                arg = call.args[pos]
            if arg is None:
                continue
            args[pname] = arg
            form = _scale_form(arg)
            if form is not None and form != spec["form"]:
                text = _text(arg, w.mod.lines)
                self.res.findings.setdefault((w.mod.path, call.lineno, pname), make_finding(
                    RULE_SCALE_FORM.id, Location(w.mod.path, call.lineno, f"{w.qualname}:{pname}"),
                    f"{_short(cand.dotted)}({pname}={text}) passes a {form} where the contract takes a {spec['form']}",
                    [f"{w.mod.path}:{call.lineno}: {w.line_text(call)}",
                     f"`{text}` reads as a {form} ({_FORM_WHY[form]})",
                     f"contract {conv.location}: {pname} is a {spec['form']} ({conv.scale_form})",
                     *([f"confirm: metax-audit probe --target {conv.probe_target} --family {conv.probe_family} --probes fp8-scale"]
                       if conv.probe_target and conv.probe_family else [])],
                ))
        k, v = args.get("k_scale"), args.get("v_scale")
        if k is not None and v is not None:
            kt, vt = _text(k, w.mod.lines).lower(), _text(v, w.mod.lines).lower()
            if "v_scale" in kt and "k_scale" not in kt and "k_scale" in vt and "v_scale" not in vt:
                self.res.findings.setdefault((w.mod.path, call.lineno, "swap"), make_finding(
                    RULE_SCALE_SWAP.id, Location(w.mod.path, call.lineno, f"{w.qualname}:k_scale"),
                    f"{_short(cand.dotted)} gets k_scale={_text(k, w.mod.lines)} and v_scale={_text(v, w.mod.lines)}",
                    [f"{w.mod.path}:{call.lineno}: {w.line_text(call)}",
                     f"contract {conv.location}: k_scale scales the keys (logits), v_scale the values (output)",
                     *([f"confirm: metax-audit probe --target {conv.probe_target} --family {conv.probe_family} --probes fp8-scale"]
                       if conv.probe_target and conv.probe_family else [])],
                ))

    def implementations(self, method: str) -> list[_Fn]:
        """Port classes in scope defining `method`: the candidates of a call on an object whose
        class is chosen at run time (`self.impl.forward_mqa(...)`). Generic names and methods
        with many implementations are left alone: following them would guess, not resolve."""
        if method.startswith("__") or method in _GENERIC_METHODS:
            return []
        if method in self._impl_cache:
            return self._impl_cache[method]
        found = [
            _Fn(f"{mod.module}.{cname}.{method}", via="dynamic-dispatch")
            for mod in self._mods.values() if mod is not None
            for cname, cls in mod.classes.items()
            if any(isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef) and m.name == method for m in cls.body)
        ]
        self._impl_cache[method] = sorted(found, key=lambda f: f.dotted) if 0 < len(found) <= _MAX_ALTS else []
        return self._impl_cache[method]

    def global_ctor(self, name: str) -> str | None:
        """A wrapper class known for an attribute name anywhere in the scope (constructor or annotation)."""
        if name not in self._ctor_cache:  # valid once every module is loaded (check_dataflow preloads)
            found: set[str] = set()
            for mod in self._mods.values():
                if mod is not None:
                    found |= mod.ctor_names.get(name.lstrip("_"), set())
            self._ctor_cache[name] = next(iter(found)) if len(found) == 1 else None
        return self._ctor_cache[name]

    def flag_off(self, w: _Walker, call: ast.Call, conv: Convention, cand: _Fn, stmt: ast.stmt, text: str | None) -> None:
        """The result is unpacked as if it held the LSE, but the call does not ask for it."""
        if conv.flag is None or conv.lse_result is None or not isinstance(stmt, ast.Assign) or stmt.value is not call:
            return
        target = stmt.targets[0]
        if not isinstance(target, ast.Tuple | ast.List) or len(target.elts) <= conv.lse_result:
            return
        lse_name = _text(target.elts[conv.lse_result], w.mod.lines)
        switch = f"{conv.flag.name}={text}" if text is not None else f"{conv.flag.name} not passed (default {conv.flag.default})"
        loc = Location(w.mod.path, call.lineno, f"{w.qualname}:{lse_name}")
        self.res.findings.setdefault((w.mod.path, call.lineno, "flag-off"), make_finding(
            RULE_FLAG_OFF.id, loc,
            f"{cand.dotted.rsplit('.', 1)[-1]}(...) is unpacked into `{_text(target, w.mod.lines)}` as if it returned the LSE, "
            f"but {switch}: by its contract it then returns only the output",
            [f"{w.mod.path}:{stmt.lineno}: {w.line_text(stmt)}",
             f"contract {conv.location}: {conv.flag.name}={conv.flag.when_true!r} when true, {conv.flag.when_false!r} when false"
             + (f" (also spelled {', '.join(conv.flag.aliases)})" if conv.flag.aliases else ""),
             f"`{lse_name}` is then {'not an LSE' if conv.lse_result else 'unbound'}; a vendor build that always returns the tuple "
             "must be declared in the contracts with its own version",
             *([f"confirm: metax-audit probe --target {conv.probe_target} --family {conv.probe_family} --probes lse"]
               if conv.probe_target and conv.probe_family else [])],
        ))

    def add_flow(self, w: _Walker, call: ast.Call, conv: Convention, cand: _Fn, pname: str, arg: ast.expr,
                 val: _Val, base: str, flag_note: str) -> None:
        steps = [*val.steps]
        arg_text = _text(arg, w.mod.lines)
        consumer = FlowEnd(cand.dotted, w.loc(call), base, conv.lse_layout, arg=pname, via=cand.via, convention=str(conv.location))
        reasons: list[str] = []
        verdict = "match"
        if val.base in ("2", "e") and base in ("2", "e"):
            if val.base != base:
                verdict = "mismatch"
                reasons.append(f"base: the value is base {val.base}, {consumer.callee.rsplit('.', 1)[-1]} expects base {base}"
                               + (f" ({flag_note})" if flag_note else ""))
        else:
            verdict = "unknown"
            reasons.append(f"base: value {val.base}, consumer {base}" + (f" ({flag_note})" if flag_note else ""))
        if val.layout in (TH, HT) and conv.lse_layout in (TH, HT):
            if val.layout != conv.lse_layout:
                verdict = "mismatch"
                reasons.append(f"layout: the value is {val.layout}, the consumer reads {conv.lse_layout}")
        elif verdict == "match":
            verdict = "unknown"
            reasons.append(f"layout: value {val.layout}, consumer {conv.lse_layout}")
        probes = []
        prod_conv = self.contracts.convention_for(val.producer.callee)
        if prod_conv is not None and prod_conv.probe_target and prod_conv.probe_family:
            probes.append(f"metax-audit probe --target {prod_conv.probe_target} --family {prod_conv.probe_family} --probes lse")
        if conv.probe_target and conv.probe_family:
            probes.append(f"metax-audit probe --target {conv.probe_target} --family {conv.probe_family} --probes dcp,lse")
        flow = LseFlow(val.producer, consumer, tuple(steps), verdict, tuple(reasons), tuple(probes))
        key = (str(val.producer.location), f"{consumer.location}|{consumer.callee}", pname, arg_text)
        self.res.flows.setdefault(key, flow)


def _relevant(mod: _Module, fn: ast.FunctionDef | ast.AsyncFunctionDef, words: tuple[str, ...]) -> bool:
    """Cheap text filter: a function that never says "lse" nor names a consumer cannot hold a
    flow of its own (helpers it calls are still entered from the callers that need them)."""
    text = "\n".join(mod.lines[fn.lineno - 1 : fn.end_lineno]).lower()
    return any(w in text for w in words)


_FORM_WHY = {
    "float": "a number literal, float(...), .item() or a name ending in _float",
    "tensor": "a layer scale attribute without _float, or a torch tensor constructor",
}


def _scale_form(arg: ast.expr) -> str | None:
    """float | tensor | None (cannot tell) for a scale argument, from how it is written."""
    if isinstance(arg, ast.Constant):
        return "float" if isinstance(arg.value, int | float) and not isinstance(arg.value, bool) else None
    if isinstance(arg, ast.Call):
        f = arg.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        if name in ("float", "item"):
            return "float"
        if name in ("tensor", "ones", "full", "as_tensor", "empty", "zeros"):
            return "tensor"
        return None
    name = arg.attr if isinstance(arg, ast.Attribute) else arg.id if isinstance(arg, ast.Name) else ""
    if name.endswith("_float"):
        return "float"
    if re.search(r"(^|_)(k|v|kv|q)?_?scale$", name) and isinstance(arg, ast.Attribute):
        return "tensor"  # a layer's scale attribute (`layer._k_scale`) is a tensor by convention
    return None


def _walk_all(an: _Analysis, mod: _Module) -> None:
    words = an.filter_words
    for fn in mod.functions.values():
        if _relevant(mod, fn, words):
            _Walker(an, mod, fn, None, {}, 0).run()
    for cname, cls in mod.classes.items():
        for m in cls.body:
            if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef) and _relevant(mod, m, words):
                _Walker(an, mod, m, cname, {}, 0).run()


def _short(callee: str) -> str:
    """`pkg.mod.Wrapper.run` -> `Wrapper.run`; `pkg.mod.func` -> `func`."""
    parts = callee.split(".")
    return ".".join(parts[-2:]) if len(parts) > 1 and parts[-2][:1].isupper() else parts[-1]


def flow_finding(flow: LseFlow) -> Finding:
    base_bad = any(r.startswith("base:") for r in flow.reasons)
    rule_id = RULE_BASE.id if base_bad else RULE_LAYOUT.id
    c, p = flow.consumer, flow.producer
    evidence = [
        f"producer {p.location}: {p.callee} returns LSE base {p.base}, {p.layout} (contract {p.convention})",
        *(f"  {s.location.path}:{s.location.line}: {s.text}  -> base {s.base}, {s.layout}" for s in flow.steps),
        f"consumer {c.location}: {c.callee}({c.arg}=...) expects base {c.base}, {c.layout} (contract {c.convention})",
        *flow.reasons,
        *(f"confirm: {cmd}" for cmd in flow.probes),
    ]
    msg = (f"LSE from {_short(p.callee)}"
           f" ({p.location.path}:{p.location.line}) reaches {_short(c.callee)}({c.arg}=) with "
           + "; ".join(flow.reasons))
    loc = Location(c.location.path, c.location.line, f"{c.location.symbol}:{c.arg}")
    # Identity is the flow (producer -> consumer argument); a new mismatch in it changes the content.
    return make_finding(rule_id, loc, msg, evidence, key=f"{p.callee} -> {c.callee}({c.arg}=)")


def _params_in(text: str) -> list[str]:
    return re.findall(r"\((\w+)=", text)


def check_dataflow(
    root: Path,
    files: Sequence[str],
    contracts: Contracts,
    *,
    port_package: str,
) -> tuple[list[LseFlow], list[Finding], list[Unresolved]]:
    """Follow every LSE from a producing kernel call to each merge/reduction argument.

    `files` are repo-relative paths under `root` (the snapshot). Returns the flows (every verdict),
    a finding per mismatched flow and the values the walk could not follow.
    """
    an = _Analysis(Path(root), contracts, port_package)
    paths = sorted(p for p in set(files) if p.endswith(".py"))
    for path in paths:  # load everything first: name-based fallbacks must not depend on file order
        an.module(path)
    for path in paths:
        mod = an.module(path)
        if mod is None:
            an.res.add_unresolved(Location(path), path, "file could not be parsed; its flows were not followed")
            continue
        _walk_all(an, mod)
    flows = sorted(an.res.flows.values(), key=lambda f: (f.consumer.location, f.consumer.arg, f.producer.location))
    findings = [flow_finding(f) for f in flows if f.verdict == "mismatch"]
    findings += sorted(an.res.findings.values(), key=lambda f: f.location)
    # An argument untraced on one path (a loop's first pass) but traced on another is not unresolved.
    traced = {(f.consumer.location.path, f.consumer.location.line, f.consumer.arg) for f in flows}
    unresolved = sorted(
        (u for u in an.res.unresolved.values()
         if not any((u.location.path, u.location.line, p) in traced and f"({p}=" in u.text for p in _params_in(u.text))),
        key=lambda u: (u.location, u.text),
    )
    return flows, findings, unresolved
