# Statement-level classification: the token stream of a body, what kind of change a hunk is, and why
# a hunk is info (a known vendor adaptation, a path the vendor never runs) or may change a kernel.
from __future__ import annotations

import ast
import copy
import difflib
import keyword
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace

from metax_audit.core.models import DifferenceKind
from metax_audit.core.pysource import ast_walk, dump, unparse
from metax_audit.stages.compare.consequence import (
    NOT_KERNEL,
    VendorPlatform,
    enclosing_gate,
    gate_of,
    kernel_call_changed,
    kernel_relevant,
    nvidia_only_guards,
    only_feeds_log,
    only_fields,
    only_port_names,
)
from metax_audit.stages.compare.context import _Ctx
from metax_audit.stages.compare.rules import _CAPABILITY_QUERY, _LOG_METHODS, ARCH_CALLS, FOREIGN_PLATFORM_CALLS
from metax_audit.stages.compare.side import _arch_in, _callee, _calls, _short, _Side, _start, _text, _Tok


def _moves(opcodes: list[tuple[str, int, int, int, int]], utoks: list[_Tok], ptoks: list[_Tok]) -> dict[tuple[int, int], tuple[int, int]]:
    """Port ranges (j1, j2) holding exactly the statements an upstream-only range (i1, i2) holds, at any depth."""
    def shape(toks: list[_Tok]) -> tuple[str, ...]:
        return tuple(t.key.split("|", 1)[-1] for t in toks)

    dropped = {shape(utoks[i1:i2]): (i1, i2) for op, i1, i2, j1, j2 in opcodes if op == "delete"}
    out: dict[tuple[int, int], tuple[int, int]] = {}
    for op, _i1, _i2, j1, j2 in opcodes:
        if op == "insert" and shape(ptoks[j1:j2]) in dropped:
            out[(j1, j2)] = dropped.pop(shape(ptoks[j1:j2]))
    return out


def _kept_base(u: list[_Tok], p: list[_Tok], bkeys: set[str]) -> bool:
    """The port's side of the hunk is the base release's code and upstream's side is new since then."""
    ukeys = {t.key for t in u}
    if not all(t.key in bkeys for t in p):
        return False
    return bool(ukeys - bkeys) if p else not (ukeys & bkeys)


def _port_gate(ctx: _Ctx, qual: str, span: tuple[int, int]) -> str:
    fn = ctx.port.tree if qual == "<module>" else ctx.port.funcs.get(qual)
    if fn is None or not span[0]:
        return ""
    gate = enclosing_gate(fn, span, ctx.platform)
    return f"a path the vendor never runs: {gate}" if gate else ""


def _arch_constant(nodes: Iterable[ast.AST], platform: VendorPlatform) -> str:
    """Evidence when every capability question in `nodes` has a fixed answer on the vendor platform."""
    calls = [c for n in nodes for c in ast_walk(n) if isinstance(c, ast.Call) and _callee(c).rsplit(".", 1)[-1] in ARCH_CALLS]
    answers = [platform.value(c) for c in calls]
    if not calls or any(a is None for a in answers):
        return ""
    return "; ".join(sorted({f"{_callee(c).rsplit('.', 1)[-1]}(...) is {a[0]}: {a[1]}" for c, a in zip(calls, answers, strict=True) if a}))


def _truth(test: ast.expr, platform: VendorPlatform) -> bool | None:
    """The value of a guard's condition on the vendor platform when it is made only of capability
    questions with fixed answers, `not`, `and`, `or`; None when anything else decides it."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _truth(test.operand, platform)
        return None if inner is None else not inner
    if isinstance(test, ast.BoolOp):
        values = [_truth(v, platform) for v in test.values]
        if isinstance(test.op, ast.And):
            return False if False in values else (None if None in values else True)
        return True if True in values else (None if None in values else False)
    if isinstance(test, ast.Call) and _callee(test).rsplit(".", 1)[-1] in ARCH_CALLS:
        answer = platform.value(test)
        return None if answer is None else answer[0]
    return None


def _removed_guard_effect(nodes: Iterable[ast.AST], platform: VendorPlatform) -> str:
    """What removing upstream's capability guard does on the vendor when its condition always holds there:
    it always rejected, so removing it turns the path on (the port's capability decision). A guard that
    never fires is already said by gate_of ("the port drops a branch ... never runs there")."""
    guards = [n for n in nodes if isinstance(n, ast.If)]
    if guards and all(_truth(g.test, platform) is True for g in guards):
        return "; upstream's guard always fired on the vendor platform, so removing it turns this path on there (the port's capability decision)"
    return ""


def _returns_constant(nodes: list[ast.AST]) -> bool:
    return len(nodes) == 1 and isinstance(nodes[0], ast.Return) and isinstance(nodes[0].value, ast.Constant)


def _hunk_note(ctx: _Ctx, qual: str, kind: str, u: list[_Tok], p: list[_Tok], span: tuple[int, int]) -> str:
    """Why a hunk is info: a known vendor adaptation or a path the vendor never runs; "" when it may
    change what a kernel computes or whether it runs on the vendor device."""
    un, pn = [t.node for t in u], [t.node for t in p]
    if kind == "foreign-platform-branch":
        return "a branch only another platform takes"
    if "." in qual and ctx.env is not None and ctx.env.platform.cls != qual.split(".")[0]:
        ctx = replace(ctx, env=replace(ctx.env, platform=ctx.env.platform.in_class(qual.split(".")[0])))
    dead = ctx.never_called(qual) if qual != "<module>" else ""
    if dead:
        return f"a path the vendor never runs: {dead}"
    own = ctx.built_only_by_port(qual.split(".")[0], qual) if "." in qual and kind != "upstream-not-followed" else ""
    if own:
        return own
    # A hunk the port dropped sits between two port statements: a dead branch holding both holds it.
    gate = _port_gate(ctx, qual, span if p else (span[0] - 1, span[1]))
    if gate:
        return gate
    if u and not p:
        dropped = gate_of(un, ctx.platform)
        if dropped:
            return f"the port drops a {dropped}"
        if only_feeds_log(un, ctx.up.funcs.get(qual), (u[0].line, max(t.end for t in u))):
            return "the removed statements only write a log line (the names they set feed nothing else)"
    if kind == "arch-check":
        if u and p and _cosmetic(un, pn):
            return "only a message text differs"
        up_arch = [t.node for t in u if t.arch]
        port_arch = [t.node for t in p if t.arch]
        const = _arch_constant(up_arch or port_arch, ctx.platform)
        if const and (not port_arch or not up_arch or _arch_constant(port_arch, ctx.platform)):
            effect = _removed_guard_effect(un, ctx.platform) if u and not p else ""
            return f"predicate constant on the vendor platform: {const}{effect}"
        if u and not port_arch and (_returns_constant(pn) or _platform_query(pn, ctx.platform) or _floor(un)):
            answer = "; ".join(_text(ctx.port, t) for t in p[:2]) or "the port drops the floor"
            return f"capability floor replaced by the vendor's answer: {answer}"
        return _guard_note(ctx, qual, u, p, span) if u and not port_arch else ""
    if kind == "feature-disabled" and any(isinstance(n, ast.Raise | ast.Assert) for n in pn):
        return "the port rejects this case up front (raise/assert): a path it does not run"
    switch = _vendor_switch(ctx, un, pn, qual) if kind not in {"kept", "arch-check", "upstream-not-followed"} else ""
    if switch:
        return switch
    pairs = _token_pairs(un, pn)
    swaps = [(a, b) for a, b, _ in pairs if b.strip()]
    drops = [a for a, b, _ in pairs if not b.strip()]
    if u and p and swaps and only_port_names(swaps, ctx.port_names) and _drops_only_absent(ctx, drops, pn):
        return "swap to the port's own class or op: " + "; ".join(f"{a.strip()} -> {b.strip()}" for a, b in swaps[:3]) + (
            "; the rest only uses upstream members the port does not provide" if drops else "")
    if kind == "added" and only_fields(pn):
        return "a field only the port adds"
    if kind == "class-attribute" and u and _returns_constant(pn) and re.search(r"capabilit", " ".join(_text(ctx.up, t) for t in u)):
        return f"capability floor replaced by the vendor's answer: {_text(ctx.port, p[0])}"
    if kind in {"class-attribute", "changed"} and u and _returns_constant(pn) and _CAPABILITY_QUERY.match(qual.rsplit(".", 1)[-1]):
        value = pn[0].value.value  # type: ignore[attr-defined]
        return f"capability replaced by the vendor's answer: {qual} returns {value!r} on the port"
    if u and _CAPABILITY_QUERY.match(qual.rsplit(".", 1)[-1]) and all(isinstance(n, _ANSWER_STMTS) for n in un) \
            and all(isinstance(n, ast.Return | ast.Expr) for n in pn):
        return f"capability replaced by the vendor's answer: the port answers {qual} itself"
    if kind == "removed" and qual == "<module>":
        gone = sorted({n.id for x in un for n in ast_walk(x) if isinstance(n, ast.Name) and n.id in ctx.up.funcs and n.id not in ctx.port.funcs})
        if gone:
            return f"goes with upstream members the port does not provide ({', '.join(gone[:4])}), reported with them"
    if kind in {"changed", "removed", "added", "call-changed", "fallback-added", "class-attribute", "upstream-not-followed"}:
        named = [a + " " + b for a, b, _ in pairs if re.search(r"[A-Za-z_]", a + b)]
        # A change of operators or numbers names nothing itself: the statements it sits in decide.
        texts = named if named else [_text(ctx.up, t) for t in u] + [_text(ctx.port, t) for t in p]
        if kind == "call-changed":
            texts = [re.sub(r":.*", "", s, flags=re.S) for s in [_classify(ctx, u, p)[1]]]
        if not kernel_relevant(texts) and not kernel_call_changed(un, pn):
            return NOT_KERNEL
    return ""


# A test of what a value is stored or computed in: `kv_cache_dtype == "fp8_ds_mla"`, `w.dtype == torch.bfloat16`,
# `cache_dtype.startswith("fp8")`, `self.kv_cache_dtype in ["auto", "bfloat16"]`.
_DTYPE_NAME = re.compile(r"(^|_)dtype$")
_DTYPE_VALUE = re.compile(r"^(auto|bfloat16|bf16|float16|fp16|half|float32|fp8\w*|int8|uint8|int4|fp4|nvfp4|mxfp4)$", re.IGNORECASE)


VENDOR_SWITCH = "a vendor feature behind its own switch"


def init_flag(ctx: _Ctx, cls: str, attr: str) -> str:
    """The dtype test the port class's `__init__` stores in `self.<attr>` (`self.use_bf16 = dtype in [...]`) when
    upstream's class sets no such flag, else "": a later `if self.<attr>:` is the same vendor switch. The read
    is logged for the member unit that asks (compare/memo.py), since it reads another member than its own."""
    found = ""
    init = ctx.port.funcs.get(f"{cls}.__init__")
    up_init = ctx.up.funcs.get(f"{cls}.__init__") or ctx.up.funcs.get(f"{ctx.rename.get(cls, cls)}.__init__")
    upstream_sets = up_init is not None and any(
        isinstance(t, ast.Attribute) and t.attr == attr for n in ast.walk(up_init) if isinstance(n, ast.Assign) for t in n.targets)
    if init is not None and not upstream_sets:
        for n in ast.walk(init):
            if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Attribute) \
                    and isinstance(n.targets[0].value, ast.Name) and n.targets[0].value.id == "self" \
                    and n.targets[0].attr == attr and isinstance(n.value, ast.expr) and _reads_dtype(n.value):
                found = f"{cls}.__init__ sets self.{attr} = {_short_text(ast.unparse(n.value), 70)} (line {n.lineno})"
                break
    if ctx.log is not None:
        ctx.log.note(("init-flag", cls, attr), found)
    return found


def _vendor_switch(ctx: _Ctx, un: list[ast.AST], pn: list[ast.AST], qual: str = "") -> str:
    """A vendor feature behind its own switch: the port's side adds a branch (an if, a conditional expression, a
    boolean operand) whose test reads a dtype or a switch of the port's own package (its env module), and that test
    is not upstream's. Upstream's path is what runs when the switch is off; the branch is the vendor's own code
    (a dtype the port supports, a kernel it has), nothing upstream changed. Returns the note, or ""."""
    up_tests = {ast.unparse(t) for n in un for t in _tests(n)}
    for node in pn:
        for test in _tests(node):
            text = ast.unparse(test)
            if text in up_tests:
                continue
            if _reads_dtype(test):
                return f"{VENDOR_SWITCH}: the port branches on `{_short_text(text)}` (a dtype test upstream does not have)"
            flags = [n.attr for n in ast_walk(test) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                     and n.value.id == "self"] if "." in qual else []
            for flag in flags:  # a flag the class's __init__ sets from a dtype test is that test, read later
                why = init_flag(ctx, qual.split(".")[0], flag)
                if why:
                    return f"{VENDOR_SWITCH}: the port branches on `{_short_text(text)}`, a dtype test: {why}"
            roots = {n.id for n in ast_walk(test) if isinstance(n, ast.Name)}
            own = sorted(r for r in roots if r in ctx.port_names and not r[:1].isupper())
            if own and any(isinstance(n, ast.Attribute) for n in ast_walk(test)):
                return f"{VENDOR_SWITCH}: the port branches on `{_short_text(text)}` ({own[0]} is the port's own)"
    return ""


def _tests(node: ast.AST) -> list[ast.expr]:
    out: list[ast.expr] = []
    for n in ast_walk(node):
        if isinstance(n, ast.If | ast.IfExp | ast.While):
            out.append(n.test)
        elif isinstance(n, ast.BoolOp):
            out.extend(n.values)
        elif isinstance(n, ast.Assign | ast.AnnAssign) and isinstance(n.value, ast.Compare):
            out.append(n.value)  # `use_bf16 = self.kv_cache_dtype in [...]`: the flag the branch reads
        elif isinstance(n, ast.keyword) and isinstance(n.value, ast.Compare):
            out.append(n.value)  # `is_fp8_kvcache=self.kv_cache_dtype == "fp8_ds_mla"`
    return out


def _reads_dtype(test: ast.expr) -> bool:
    for n in ast_walk(test):
        if isinstance(n, ast.Compare):
            sides = [n.left, *n.comparators]
            if any(_names_dtype(x) for x in sides) or any(_dtype_literal(x) for x in sides):
                return True
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in {"startswith", "endswith"} \
                and _names_dtype(n.func.value):
            return True
    return False


def _names_dtype(x: ast.AST) -> bool:
    name = x.attr if isinstance(x, ast.Attribute) else x.id if isinstance(x, ast.Name) else ""
    return bool(_DTYPE_NAME.search(name))


def _dtype_literal(x: ast.AST) -> bool:
    if isinstance(x, ast.Attribute) and isinstance(x.value, ast.Name) and x.value.id == "torch":
        return bool(_DTYPE_VALUE.match(x.attr))
    if isinstance(x, ast.Constant) and isinstance(x.value, str):
        return bool(_DTYPE_VALUE.match(x.value))
    if isinstance(x, ast.List | ast.Tuple | ast.Set):
        return bool(x.elts) and all(_dtype_literal(e) for e in x.elts)
    return False


def _short_text(text: str, limit: int = 90) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _guard_note(ctx: _Ctx, qual: str, u: list[_Tok], p: list[_Tok], span: tuple[int, int]) -> str:
    """A removed guard that only rejects on one NVIDIA architecture is harmless where the vendor's kernels run;
    the rest of the hunk (if any) is judged on its own and must be info too."""
    covered, why = nvidia_only_guards([(t.node, t.depth) for t in u])
    if not covered:
        return ""
    note = f"removed guard that only rejects on an NVIDIA capability: {why}"
    rest = [t for i, t in enumerate(u) if i not in covered]
    if not rest and not p:
        return note
    kind = "arch-check" if any(t.arch for t in rest + p) else "changed" if rest and p else "removed" if rest else "added"
    rest_note = _hunk_note(ctx, qual, kind, rest, p, span)
    return f"{note}; the rest of the hunk: {rest_note}" if rest_note else ""


def _drops_only_absent(ctx: _Ctx, drops: list[str], pn: list[ast.AST]) -> bool:
    """Every name in the dropped upstream text is an upstream member the port does not provide, or a
    name the port's side of the hunk still uses (the call or keyword around it)."""
    kept = {n.id for x in pn for n in ast_walk(x) if isinstance(n, ast.Name)} | {
        k.arg for x in pn for n in ast_walk(x) if isinstance(n, ast.Call) for k in n.keywords if k.arg}
    upstream = set(ctx.up.funcs) | set(ctx.up.attrs) | set(ctx.up.classes)
    for text in drops:
        for ident in re.findall(r"[A-Za-z_]\w*", text):
            absent = ident in upstream and not ctx.port_defines(ident)
            if not absent and ident not in kept and not keyword.iskeyword(ident):
                return False
    return True


# Statements that only decide an answer (a capability query's checks and early returns).
_ANSWER_STMTS = (ast.If, ast.Return, ast.Try, ast.ExceptHandler, ast.Pass, ast.Expr, ast.Raise)


def _floor(nodes: list[ast.AST]) -> bool:
    """An NVIDIA capability floor: a comparison of a capability with a number or DeviceCapability."""
    for n in nodes:
        for c in ast_walk(n):
            if isinstance(c, ast.Compare) and any(isinstance(o, ast.Lt | ast.LtE | ast.Gt | ast.GtE) for o in c.ops) \
                    and re.search(r"capabilit|DeviceCapability", ast.unparse(c)):
                return True
    return False


def _platform_query(nodes: list[ast.AST], platform: VendorPlatform) -> bool:
    return any(isinstance(c, ast.Call) and platform.value(c) is not None for n in nodes for c in ast_walk(n))


def _mark_arch(side: _Side, toks: list[_Tok]) -> list[_Tok]:
    for tok in toks:
        if any(ln in side.arch_lines for ln in range(tok.line, tok.end + 1)):
            tok.arch = _arch_in(tok.node)
    return toks


def _arch_groups(toks: list[_Tok]) -> Iterator[tuple[_Tok, _Tok]]:
    """Capability checks in unchanged code, one per outermost statement (its nested raise is the same check)."""
    group: list[_Tok] = []
    for tok in toks:
        nested = bool(group) and tok.depth > group[0].depth
        if nested:
            group.append(tok)
            continue
        if group:
            yield group[0], group[-1]
            group = []
        if tok.arch:
            group = [tok]
    if group:
        yield group[0], group[-1]


def _flatten(stmts: Sequence[ast.stmt], depth: int) -> Iterator[_Tok]:
    for stmt in stmts:
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            continue  # compared once, by bound name, in _compare_imports
        shallow = copy.copy(stmt)
        subs: list[tuple[str, list[ast.stmt]]] = []
        for name in ("body", "orelse", "finalbody"):
            value = getattr(stmt, name, None)
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                subs.append((name, value))
                setattr(shallow, name, [])
        handlers = list(getattr(stmt, "handlers", []) or [])
        if handlers:
            shallow.handlers = []  # type: ignore[attr-defined]
        cases = list(getattr(stmt, "cases", []) or [])
        end = (subs[0][1][0].lineno - 1) if subs else (stmt.end_lineno or stmt.lineno)
        end = max(end, stmt.lineno)
        node = shallow
        yield _Tok(f"{depth}|{dump(node)}", node, _start(stmt), end, depth)  # dump: no RecursionError
        for name, body in subs:
            if name != "body":
                yield _Tok(f"{depth}|<{name}>", ast.Pass(), body[0].lineno, body[0].lineno, depth)
            yield from _flatten(body, depth + 1)
        for h in handlers:
            hnode = ast.ExceptHandler(type=h.type, name=h.name, body=[])
            yield _Tok(f"{depth}|{dump(hnode)}", hnode, h.lineno, h.lineno, depth)
            yield from _flatten(h.body, depth + 1)
        for case in cases:
            yield from _flatten(case.body, depth + 1)


def _classify(ctx: _Ctx, u: list[_Tok], p: list[_Tok]) -> tuple[DifferenceKind, str]:
    un, pn = [t.node for t in u], [t.node for t in p]
    udesc = "; ".join(_text(ctx.up, t) for t in u[:3])
    pdesc = "; ".join(_text(ctx.port, t) for t in p[:3])
    both = f"upstream: {udesc or '-'} | port: {pdesc or '-'}"
    u_arch, p_arch = any(t.arch for t in u), any(t.arch for t in p)
    if u_arch or p_arch:
        state = "changed" if u_arch and p_arch else ("added in the port" if p_arch else "removed from the port")
        return "arch-check", f"capability check {state}: {both}"
    if u and not p and _foreign_branch(u):
        return "foreign-platform-branch", f"port drops a branch only another platform takes: {udesc}"
    commented = _commented_out_args(ctx, u, p)
    if commented:
        return "argument-commented-out", f"argument(s) {', '.join(commented)} commented out: {both}"
    raises = (ast.Raise, ast.Assert)
    if sum(isinstance(n, raises) for n in pn) > sum(isinstance(n, raises) for n in un):
        return "feature-disabled", f"raise/assert added: {both}"
    if p and not u and any(isinstance(n, ast.Return) for n in pn):
        return "feature-disabled", f"early return added: {pdesc}"
    if p and any(isinstance(n, ast.Try) for n in pn) and not any(isinstance(n, ast.Try) for n in un):
        return "fallback-added", f"try/except added: {both}"
    if p and not u and any(isinstance(n, ast.If) for n in pn) and any(t.key.endswith("|<orelse>") for t in p):
        return "fallback-added", f"branch with an alternative added: {pdesc}"
    if _cosmetic(un, pn):
        return "cosmetic", both
    ucalls, pcalls = _calls(un), _calls(pn)
    shared = set(ucalls) & set(pcalls)
    if u and p and shared:
        deltas = []
        for callee in sorted(shared):
            uk, pk = ucalls[callee], pcalls[callee]
            plus, minus = sorted(pk - uk), sorted(uk - pk)
            if plus or minus:
                deltas.append(f"{callee}(" + ", ".join([f"+{k}" for k in plus] + [f"-{k}" for k in minus]) + ")")
        if deltas:
            return "call-changed", f"{'; '.join(deltas)}: {both}"
    if p and not u:
        return "added", f"port adds: {pdesc}"
    if u and not p:
        return "removed", f"port drops: {udesc}"
    focus = _focus(un, pn)
    return "changed", (f"differs at {focus}; " if focus else "") + both


def _focus(un: list[ast.AST], pn: list[ast.AST]) -> str:
    """Where two hunks differ, token by token: the shown texts are cut at 120 characters and a change
    inside a long call would be invisible in them."""
    parts = []
    for a, b, before in _token_pairs(un, pn)[:3]:
        parts.append(f"...{before} [upstream: {_short(a, 80) or '-'} | port: {_short(b, 80) or '-'}]")
    return "; ".join(parts)


def _token_pairs(un: list[ast.AST], pn: list[ast.AST]) -> list[tuple[str, str, str]]:
    """(upstream text, port text, text before) of each token run where two hunks differ."""
    def tokens(nodes: list[ast.AST]) -> list[str]:
        texts = []
        for n in nodes:
            try:
                texts.append(unparse(n).split("\n", 1)[0])
            except Exception:  # pragma: no cover - a shallow copy of a parsed statement unparses
                texts.append(type(n).__name__)
        return re.findall(r"\w+|[^\w\s]+|\s+", "; ".join(texts))

    ut, pt = tokens(un), tokens(pn)
    out = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, ut, pt, autojunk=False).get_opcodes():
        if op != "equal":
            out.append(("".join(ut[i1:i2]), "".join(pt[j1:j2]), "".join(ut[max(0, i1 - 6) : i1]).lstrip()))
    return out


def _foreign_branch(u: list[_Tok]) -> bool:
    """The hunk is one `if <other platform>:` with its body and nothing else (no else branch)."""
    head = u[0]
    if not isinstance(head.node, ast.If) or any(t.depth <= head.depth for t in u[1:]):
        return False
    test = head.node.test
    calls = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or) else [test]
    return all(isinstance(c, ast.Call) and _callee(c).rsplit(".", 1)[-1] in FOREIGN_PLATFORM_CALLS for c in calls)


def _commented_out_args(ctx: _Ctx, u: list[_Tok], p: list[_Tok]) -> list[str]:
    ucalls = _calls([t.node for t in u])
    found: list[str] = []
    for tok in p:
        for node in ast_walk(tok.node):
            if not isinstance(node, ast.Call):
                continue
            callee = _callee(node)
            passed = {k.arg for k in node.keywords if k.arg}
            missing = ucalls.get(callee, set()) - passed
            for text in ctx.comment_texts(node.lineno, node.end_lineno or node.lineno):
                m = re.match(r"\s*(\w+)\s*=", text)
                if m and m.group(1) in missing:
                    found.append(f"{callee}:{m.group(1)}")
    return found


def _cosmetic(un: list[ast.AST], pn: list[ast.AST]) -> bool:
    def noise(n: ast.AST) -> bool:
        if isinstance(n, ast.Pass) or (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)):
            return True
        return isinstance(n, ast.Expr) and isinstance(n.value, ast.Call) and _callee(n.value).rsplit(".", 1)[-1] in _LOG_METHODS

    ureal, preal = [n for n in un if not noise(n)], [n for n in pn if not noise(n)]
    if [type(n) for n in ureal] != [type(n) for n in preal]:
        return False  # cheap reject before copying trees

    def strip(nodes: list[ast.AST]) -> list[str]:
        out = []
        for n in nodes:
            c = copy.deepcopy(n)
            for sub in ast_walk(c):
                if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                    sub.value = ""
                if isinstance(sub, ast.JoinedStr):
                    sub.values = []
                if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id == "super":
                    sub.args = []  # super(Cls, self) and super() name the same parent inside Cls
            out.append(dump(c))
        return out

    return strip(ureal) == strip(preal)
