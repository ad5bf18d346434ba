# Two-way comparison of a port file with its upstream counterpart: imports, members (classes,
# functions, attributes) and function bodies hunk by hunk.
from __future__ import annotations

import ast
import bisect
import difflib
import functools
import re
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any

from metax_audit.core.comments import iter_statements
from metax_audit.core.models import Difference, DifferenceKind
from metax_audit.core.pysource import ast_children, ast_walk, dump
from metax_audit.stages.compare.classify import (
    VENDOR_SWITCH,
    _arch_constant,
    _arch_groups,
    _classify,
    _commented_out_args,
    _flatten,
    _hunk_note,
    _kept_base,
    _mark_arch,
    _moves,
    init_flag,
)
from metax_audit.stages.compare.consequence import (
    CAPABILITY_HOOK,
    NOT_KERNEL,
    fold,
    kernel_relevant,
    keyword_only_uses,
    only_port_names,
    same_code,
)
from metax_audit.stages.compare.context import _anchor, _Ctx, _inherits, _parent_missing
from metax_audit.stages.compare.counterparts import FileCounterpart, module_of
from metax_audit.stages.compare.memo import MemberUnits, names_read, platform_read
from metax_audit.stages.compare.rules import _ABSENT, _CLASS_ATTR_METHODS, ACTIONS
from metax_audit.stages.compare.side import (
    _arch_in,
    _body,
    _callee,
    _calls,
    _default_env,
    _Env,
    _only_raises,
    _Side,
    _sig,
    _squash,
    _start,
    _stmt_span,
    _text,
    _Tok,
    _value,
    _value_delta,
)


def _compare_pair(port: _Side, up: _Side, cp: FileCounterpart, base: _Side | None = None,
                  in_scope: frozenset[str] = frozenset(), env: _Env | None = None,
                  port_names: frozenset[str] = frozenset(), units: MemberUnits | None = None) -> Iterator[Difference]:
    """The two-way differences of a port file and its upstream counterpart; with `units`, each function's
    comparison is served from the file's kept member units when what it read is the same (compare/memo.py)."""
    up_comments = {_squash(c.text) for c in up.comments.comments.values()}
    ctx = _Ctx(port, up, cp, port.rename, up_comments, base, in_scope, env or _default_env(), port_names, units)
    for d in _compare_imports(ctx):
        yield _member(ctx, d)
    yield from _compare_members(ctx)
    yield from _compare_body(ctx, "<module>", up.other, port.other, anchor=1, bbody=base.other if base else None)


def _compare_imports(ctx: _Ctx) -> Iterator[Difference]:
    """Import differences, one per import statement (a swapped block is one change, not one per name)."""
    port_pkg = ctx.cp.path.split("/")[0]
    up_pkg = (ctx.cp.upstream_path or "").split("/")[0]
    # (port statement line, kind) -> [(name, port module, upstream module or "", upstream line)]
    groups: dict[tuple[int, DifferenceKind], list[tuple[str, str, str, int | None]]] = {}
    for name, (pmod, pline) in sorted(ctx.port.imports.items(), key=lambda kv: kv[1][1]):
        if name in ctx.rename:
            continue
        root = pmod.lstrip(".").split(".")[0]
        own = root == port_pkg or pmod.startswith(".")  # relative imports stay inside the port package
        if name in ctx.up.imports:
            umod, uline = ctx.up.imports[name]
            if umod == pmod:
                continue
            if own and pmod.replace(port_pkg, up_pkg, 1) == umod and pmod in ctx.in_scope:
                kind: DifferenceKind = "port-module-import"  # the port's own copy of the same module, compared as its own file
            elif own or (root and root != up_pkg and root != umod.split(".")[0]):
                kind = "vendor-kernel-import"
            elif pmod.replace(port_pkg, up_pkg, 1) == umod:
                kind = "cosmetic"
            else:
                kind = "changed"
            groups.setdefault((pline, kind), []).append((name, pmod, umod, uline))
        else:
            # A helper import follows from code added elsewhere (reported there); a kernel import is the news.
            if own:
                kind = "port-module-import"
            elif root not in {up_pkg, ""} and _kernelish(pmod):
                kind = "vendor-kernel-import"
            else:
                kind = "cosmetic"
            groups.setdefault((pline, kind), []).append((name, pmod, "", None))
    for (pline, kind), items in groups.items():
        names = ", ".join(n for n, *_ in items)
        pmods = sorted({p for _, p, _, _ in items})
        umods = sorted({u for _, _, u, _ in items if u})
        new = [n for n, _, u, _ in items if not u]
        where = f"upstream imports from {', '.join(umods)}" if umods else ""
        if new:
            where += ("; " if where else "") + f"not imported upstream: {', '.join(new)}"
        ulines = [u for *_, u in items if u]
        detail = f"import {names} from {', '.join(pmods)} ({where})"
        d = ctx.diff(kind, pline, names, detail, _stmt_span(ctx.port, pline), min(ulines) if ulines else None)
        if kind == "vendor-kernel-import" and umods and not new and all(
                u.rsplit(".", 1)[-1] == p.rsplit(".", 1)[-1] for u in umods for p in pmods):
            # The same names from a module of the same name: upstream's is a vendored copy of the kernel's interface.
            d = replace(d, note="the same names from the kernel package that upstream vendors a copy of: the import rules "
                                "check they resolve on the vendor's stack, the calls are bound against it")
        yield d
    yield from _removed_imports(ctx)


def _removed_imports(ctx: _Ctx) -> Iterator[Difference]:
    """Upstream imports the port lacks, one per upstream import statement.

    A name the port never mentions went with the upstream code that used it, which is reported where
    that code was; a name the port defines itself is a local replacement, which is the news."""
    used, bound = _names_used(ctx.port.tree)
    aliases = _aliases(ctx.port.tree)
    groups: dict[tuple[int, DifferenceKind], list[tuple[str, str]]] = {}
    for name, (umod, uline) in sorted(ctx.up.imports.items(), key=lambda kv: kv[1][1]):
        if name in ctx.port.imports or name in ctx.rename.values():
            continue
        if aliases.get(name) == f"{umod}.{name}":
            kind: DifferenceKind = "cosmetic"  # `x = mod.x` names the very object upstream imports: an alias, not a port definition
        elif name in bound:
            # Upstream defining it too means its import was a local one for that same module-level name.
            up_defines = name in ctx.up.funcs or name in ctx.up.classes or name in ctx.up.attrs
            kind = "cosmetic" if up_defines else "changed"
        elif name not in used or not _kernelish(umod):
            kind = "cosmetic"  # a dropped helper import, or one whose users the port dropped too
        else:
            kind = "removed"
        groups.setdefault((uline, kind), []).append((name, umod))
    for (uline, kind), items in groups.items():
        names = ", ".join(n for n, _ in items)
        umods = ", ".join(sorted({m for _, m in items}))
        if kind == "changed":
            line = min(bound[n] for n, _ in items)
            d = ctx.removal(kind, line, names, f"the port defines {names} itself instead of importing it from {umods}", uline)
            own = sorted({aliases[n] for n, _ in items if aliases.get(n, "").startswith(ctx.cp.path.split("/")[0] + ".")})
            yield replace(d, note=f"swap to the port's own op: {', '.join(own)}") if own and len(own) == len(items) else d
        elif kind == "cosmetic":
            yield ctx.removal(kind, 0, names, f"upstream imports {names} from {umods}; the port neither imports nor uses them", uline)
        else:
            yield ctx.removal(kind, 0, names, f"upstream imports {names} from {umods}; the port uses the name(s) but does not import them", uline)


def _same_upstream_object(ctx: _Ctx, name: str) -> bool:
    """The port binds `name` to upstream's own module-level object (import or alias of its module)."""
    up_module = module_of(ctx.cp.upstream_path or "")
    imported = ctx.port.imports.get(name)
    if imported is not None and imported[0] == up_module:
        return True
    return _aliases(ctx.port.tree).get(name) == f"{up_module}.{name}"


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Names bound to another module's object (`x = ops.x` after `from vllm import _custom_ops as ops`),
    as the dotted path of that object."""
    modules: dict[str, str] = {}
    for node in iter_statements(tree.body):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
        elif isinstance(node, ast.Import):
            modules.update({a.asname or a.name: a.name for a in node.names})
    out: dict[str, str] = {}
    for node in iter_statements(tree.body):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = node.value
            if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and value.value.id in modules:
                out.setdefault(node.targets[0].id, f"{modules[value.value.id]}.{value.attr}")
            elif isinstance(value, ast.Name) and value.id in modules:
                out.setdefault(node.targets[0].id, modules[value.id])
    return out


def _names_used(tree: ast.AST) -> tuple[frozenset[str], dict[str, int]]:
    """Names the file reads, and names it binds itself (assignment, def, class) with the first line."""
    used: set[str] = set()
    bound: dict[str, int] = {}
    for n in ast_walk(tree):
        if isinstance(n, ast.Name):
            if isinstance(n.ctx, ast.Store):
                bound[n.id] = min(bound.get(n.id, n.lineno), n.lineno)
            else:
                used.add(n.id)
        elif isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound[n.name] = min(bound.get(n.name, n.lineno), n.lineno)
    return frozenset(used), bound


def _kernelish(module: str) -> bool:
    low = module.lower()
    return any(k in low for k in ("flash", "attn", "mla", "kernel", "ops", "triton"))


def _compare_members(ctx: _Ctx) -> Iterator[Difference]:
    port, up = ctx.port, ctx.up
    # Classes present on one side only.
    for name, cls in up.classes.items():
        if name not in port.classes and not _parent_missing(name, port.classes, up.classes):
            yield _member(ctx, ctx.removal("removed", 0, name, f"upstream class {name} has no port counterpart", cls.lineno))
    for name, cls in port.classes.items():
        if name not in up.classes and not _parent_missing(name, up.classes, port.classes):
            kind: DifferenceKind = "added"
            yield _member(ctx, ctx.diff(kind, cls.lineno, name, f"class {cls.name} is not in upstream", (_start(cls), cls.lineno)))
    # Functions and methods.
    for qual, ufn in up.funcs.items():
        owner = qual.rsplit(".", 1)[0] if "." in qual else ""
        if qual in port.funcs:
            yield from _function_unit(ctx, qual, ufn, port.funcs[qual])
        elif owner and owner not in port.classes:
            continue  # the whole class is already reported
        elif owner and _inherits(port.classes[owner], owner):
            continue  # the port class subclasses upstream's: the method is inherited, not removed
        elif not owner and _same_upstream_object(ctx, qual):
            continue  # the port imports or aliases upstream's own function: the same object, not a removal
        else:
            anchor = _anchor(ctx, qual)
            removal = ctx.removal("removed", anchor, qual, f"upstream {qual}{_sig(ufn)} is absent from the port", ufn.lineno)
            yield _member(ctx, replace(removal, note=_base_behaviour(ctx, ufn)))
    for qual, pfn in port.funcs.items():
        owner = qual.rsplit(".", 1)[0] if "." in qual else ""
        if qual in up.funcs or (owner and owner not in up.classes):
            continue
        kind = "feature-disabled" if _only_raises(pfn) else "added"
        kind = "arch-check" if kind == "added" and _arch_in(pfn) else kind
        detail = f"{qual}{_sig(pfn)} is not in upstream" + (" (body only raises)" if kind == "feature-disabled" else "")
        yield _member(ctx, ctx.diff(kind, pfn.lineno, qual, detail, (_start(pfn), pfn.lineno)))
    # Class attributes and module constants.
    for key in sorted(set(up.attrs) | set(port.attrs)):
        owner = key.rsplit(".", 1)[0] if "." in key else ""
        if owner and (owner not in up.classes or owner not in port.classes):
            continue
        u, p = up.attrs.get(key), port.attrs.get(key)
        kind = "class-attribute" if owner else "changed"
        if u is not None and p is not None:
            if dump(u) != dump(p):
                b = ctx.base.attrs.get(key) if ctx.base is not None else None
                if b is not None and dump(b) == dump(p):
                    kind = "upstream-not-followed"  # upstream changed it after the base release; the port has the old value
                yield _member(ctx, ctx.diff(kind, p.lineno, key, f"{key}: {_value_delta(u, p)}", (p.lineno, p.end_lineno or p.lineno), u.lineno))
        elif p is not None:
            yield _member(ctx, ctx.diff(kind if owner else "added", p.lineno, key, f"{key} = {_value(p)} is not in upstream", (p.lineno, p.end_lineno or p.lineno)))
        elif u is not None and not (owner and _inherits(port.classes[owner], owner)):
            anchor = _anchor(ctx, key)
            if not owner and _is_logger(u):
                kind = "cosmetic"  # a module logger: dropping it changes no behaviour the review checks
            yield _member(ctx, ctx.removal(kind if owner else ("removed" if kind == "changed" else kind), anchor, key,
                              f"upstream {key} = {_value(u)} is absent from the port", u.lineno))


def _member(ctx: _Ctx, d: Difference) -> Difference:
    """Note and attribution of a member-level or import difference (a whole member, field or import)."""
    short = d.symbol.rsplit(".", 1)[-1]
    note = ""
    if d.kind == "port-module-import":
        note = ("the port's own copy of the module upstream imports from, compared as its own file" if "upstream imports" in d.detail
                else "an import from the port's own package (the code using it is reported where it is)")
    elif d.kind == "vendor-kernel-import" and "upstream imports from" not in d.detail:
        note = ("a new import from the kernel package, no upstream import replaced: the import check verifies it resolves "
                "and its uses are compared where they are")
    elif d.kind == "vendor-kernel-import" and d.detail.split(" from ", 1)[-1].startswith((ctx.cp.path.split("/")[0] + ".", ".")):
        note = "swap to the port's own module: " + d.detail.split(" (", 1)[0]
    elif d.kind in {"removed", "class-attribute"} and d.detail.endswith(_ABSENT) and not CAPABILITY_HOOK.match(short):
        note = "an upstream member the port does not provide (not a capability hook the framework calls)"
    elif d.kind in {"added", "class-attribute"} and d.detail.endswith("is not in upstream"):
        note = "a field only the port adds" if " = " in d.detail.split(" is not in upstream")[0] else \
            "port-only code: nothing upstream to compare with (its calls are checked against the installed stack)"
    elif d.kind == "feature-disabled":
        note = "the port rejects this path (its body only raises): a path it does not run"
    elif d.kind == "class-attribute" and "port drops" in d.detail and "port adds" not in d.detail:
        note = "the port narrows the list: the values it drops are refused at backend selection"
    elif d.kind == "class-attribute" and short.startswith("supported_") and "port adds" in d.detail and "port drops" not in d.detail:
        # A capability the port advertises beyond upstream's: its own feature (its paths are the port's own
        # branches, judged where they are; an advertised value no path handles is a capability finding).
        note = "a capability the port adds to upstream's list: the vendor's own feature, its paths judged where they are"
    elif d.kind == "signature-changed":
        binds = _callers_bind_of(ctx, d.symbol)
        if ctx.log is not None:
            ctx.log.note(("callers-bind", d.symbol), binds)
        note = binds or ("" if kernel_relevant([d.detail]) else NOT_KERNEL)
    elif d.kind == "changed" and d.detail.startswith("the port defines"):
        note = ""
    elif d.kind in {"class-attribute", "changed"} and " / port " in d.detail:
        upstream_text, port_text = d.detail.split(": upstream ", 1)[-1].split(" / port ", 1)
        pairs = _text_pairs(upstream_text, port_text)
        if pairs and only_port_names(pairs, ctx.port_names):
            note = "swap to the port's own class or op: " + "; ".join(f"{a} -> {b}" for a, b in pairs[:3])
        elif not kernel_relevant(a + " " + b for a, b in pairs):
            note = NOT_KERNEL
    elif d.kind == "changed" and not d.detail.startswith("import ") and not kernel_relevant([d.detail]):
        note = NOT_KERNEL
    if not note and d.kind not in {"removed", "signature-changed"} and d.symbol in ctx.port.funcs:
        gate = ctx.never_called(d.symbol)
        note = f"a path the vendor never runs: {gate}" if gate else ""
    if not note and "." in d.symbol and d.kind != "upstream-not-followed":
        note = ctx.built_only_by_port(d.symbol.split(".")[0], d.symbol)
    attribution = d.attribution or (ctx.env.attribution(d.kind == "upstream-not-followed") if ctx.env is not None else "")
    return replace(d, note=note or d.note, attribution=attribution)


def _text_pairs(a: str, b: str) -> list[tuple[str, str]]:
    ta, tb = re.findall(r"\w+|[^\w\s]+", a), re.findall(r"\w+|[^\w\s]+", b)
    return [(" ".join(ta[i1:i2]), " ".join(tb[j1:j2]))
            for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, ta, tb, autojunk=False).get_opcodes() if op != "equal"]


def _base_behaviour(ctx: _Ctx, ufn: ast.AST) -> str:
    """Upstream's override, as the vendor platform runs it, only calls the base class's method with the same
    arguments: the port inherits the same behaviour by not overriding it."""
    if not isinstance(ufn, ast.FunctionDef | ast.AsyncFunctionDef):
        return ""
    body, used = fold(_body(ufn), ctx.platform)
    if len(body) != 1 or not isinstance(body[0], ast.Return) or not isinstance(body[0].value, ast.Call):
        return ""
    call = body[0].value
    params = [a.arg for a in ufn.args.args[1:]]
    if _callee(call) != f"super().{ufn.name}" or [ast.unparse(a) for a in call.args] != params or call.keywords:
        return ""
    why = f" ({'; '.join(sorted(set(used)))})" if used else ""
    return f"upstream's override only calls the base class on the vendor platform{why}: the port inherits the same behaviour"


def _callers_bind_of(ctx: _Ctx, qual: str) -> str:
    fn = ctx.port.funcs.get(qual)
    return _callers_bind(ctx, fn, "." in qual) if fn is not None else ""


def _callers_bind(ctx: _Ctx, fn: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> str:
    """Every call of the function in the port file binds to the port's own signature: the change is
    consistent with its callers (the calls themselves are compared where they are)."""
    args = fn.args
    params = [a.arg for a in args.posonlyargs + args.args][int(method):]  # a method's self is bound already
    required = set(params[: len(params) - len(args.defaults)]) | {
        a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is None}
    names = set(params) | {a.arg for a in args.kwonlyargs}
    calls = _calls_named(ctx.port, fn.name)
    for call in calls:
        keywords = [k.arg for k in call.keywords]
        if any(isinstance(a, ast.Starred) for a in call.args) or None in keywords:
            return ""  # *args/**kwargs at the call: cannot tell statically
        if len(call.args) > len(params) and not args.vararg:
            return ""
        unknown = set(keywords) - names if not args.kwarg else set()
        if unknown or required - set(params[: len(call.args)]) - set(keywords):
            return ""
    return f"every port call of {fn.name} ({len(calls)}) binds to the port's signature" if calls else ""


def _calls_named(side: _Side, name: str) -> list[ast.Call]:
    """The calls in a file whose callee's last name is the identifier `name`. Such a call's source spells
    it (`f(`, `x.f (`, `(x.f)(`), so only the nodes holding a place where the text spells it are walked
    (all of them where the text's lines are not ast's, an identifier could be spelt in another Unicode
    form, or a class rename made the name)."""
    tree = side.tree
    nodes: Iterable[ast.AST]
    if "\r" in side.text or not name.isascii() or _spells_ascii_otherwise(side.text) or name in side.rename.values():
        nodes = ast_walk(tree)
    else:
        nodes = _walk_holding_any(tree, _places(side.text, name))
    return [c for c in nodes if isinstance(c, ast.Call) and _last_name_is(c, name)]


@functools.lru_cache(maxsize=8)
def _spells_ascii_otherwise(text: str) -> bool:
    """The text holds a character that Python's identifier normalization (NFKC) turns into ASCII or nothing."""
    if text.isascii():
        return False
    import unicodedata

    for c in set(text):
        if not c.isascii():
            normal = unicodedata.normalize("NFKC", c)
            if not normal or any(x.isascii() for x in normal):
                return True
    return False


def _places(text: str, name: str) -> list[tuple[int, int]]:
    """(line, UTF-8 column: ast's col_offset) of each place `name` is spelt as a word in `text`, in order."""
    data = _utf8(text)
    word = name.encode()
    out: list[tuple[int, int]] = []
    line, pos, at = 1, 0, data.find(word)
    while at >= 0:
        after = at + len(word)
        if (at == 0 or not _WORD_BYTE[data[at - 1]]) and (after == len(data) or not _WORD_BYTE[data[after]]):
            line += data.count(b"\n", pos, at)
            pos = at
            out.append((line, at - (data.rfind(b"\n", 0, at) + 1)))
        at = data.find(word, after)
    return out


_WORD_BYTE = [chr(b).isalnum() or chr(b) == "_" if b < 128 else False for b in range(256)]


@functools.lru_cache(maxsize=8)
def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _walk_holding_any(tree: ast.AST, places: list[tuple[int, int]]) -> Iterator[ast.AST]:
    """ast.walk's nodes whose source (a def's or class's decorators included) holds one of `places`, and
    the nodes without a position under them."""
    todo = [tree]
    while todo:
        node = todo.pop()
        end_line, end_col = getattr(node, "end_lineno", None), getattr(node, "end_col_offset", None)
        if getattr(node, "lineno", None) is not None and end_line is not None and end_col is not None:
            decorated = getattr(node, "decorator_list", None)
            start = (_start(node), 0) if decorated else (node.lineno, node.col_offset)  # type: ignore[attr-defined]
            i = bisect.bisect_left(places, start)
            if i == len(places) or places[i] >= (end_line, end_col):
                continue
        yield node
        todo.extend(ast_children(node))


def _last_name_is(call: ast.Call, name: str) -> bool:
    """_callee(call).rsplit(".", 1)[-1] == name, without unparsing a name or an attribute."""
    if isinstance(call.func, ast.Name):
        return call.func.id == name
    if isinstance(call.func, ast.Attribute):
        return call.func.attr == name
    return _callee(call).rsplit(".", 1)[-1] == name


def _is_logger(stmt: ast.stmt) -> bool:
    value = getattr(stmt, "value", None)
    return isinstance(value, ast.Call) and _callee(value).rsplit(".", 1)[-1].lower() in {"init_logger", "getlogger", "get_logger"}


def _function_unit(ctx: _Ctx, qual: str, ufn: ast.AST, pfn: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterable[Difference]:
    """_compare_function, served from the file's kept member units when they hold it (compare/memo.py)."""
    if ctx.units is None:
        return _compare_function(ctx, qual, ufn, pfn)
    start = _start(pfn)
    text = "\n".join(ctx.port.lines[start - 1 : pfn.end_lineno])
    return ctx.units.unit(qual, text, start, lambda: _compare_function(ctx, qual, ufn, pfn), lambda key: _read_now(ctx, key))


def _read_now(ctx: _Ctx, key: tuple[Any, ...]) -> Any:
    """The answer now of a read a member unit logged (compare/memo.py); port lines relative to the unit's start."""
    kind, start = key[0], ctx.log.start if ctx.log is not None else 0
    if kind == "decl":
        return ctx.declaration(key[1] + start, key[2] + start)
    if kind == "comments":
        return ctx.comment_texts(key[1] + start, key[2] + start)
    if kind == "never-called":
        return ctx.never_called(key[1])
    if kind == "port-only-class":
        return ctx.built_only_by_port(key[1], key[2])
    if kind == "callers-bind":
        return _callers_bind_of(ctx, key[1])
    if kind == "port-member":
        return ctx.port_defines(key[1])
    if kind == "platform":
        return platform_read(ctx.platform, key)
    if kind == "init-flag":
        return init_flag(ctx, key[1], key[2])
    if kind in {"port-name", "port-names"}:
        return names_read(ctx.port_names, key)
    return _UNKNOWN  # a read this code does not know: never the same answer


_UNKNOWN = object()


def _compare_function(ctx: _Ctx, qual: str, ufn: ast.AST, pfn: ast.AST) -> Iterator[Difference]:
    assert isinstance(ufn, ast.FunctionDef | ast.AsyncFunctionDef) and isinstance(pfn, ast.FunctionDef | ast.AsyncFunctionDef)
    if dump(pfn.args) != dump(ufn.args):
        header_end = pfn.body[0].lineno - 1 if pfn.body else pfn.lineno
        kind: DifferenceKind = "signature-changed"
        yield _member(ctx, ctx.diff(kind, pfn.lineno, qual, f"upstream {qual}{_sig(ufn)} / port {_sig(pfn)}",
                                    (pfn.lineno, max(pfn.lineno, header_end)), ufn.lineno))
    attr_method = bool(_CLASS_ATTR_METHODS.match(qual.rsplit(".", 1)[-1]))
    bfn = ctx.base.funcs.get(qual) if ctx.base is not None else None
    bbody = _body(bfn) if isinstance(bfn, ast.FunctionDef | ast.AsyncFunctionDef) else None
    folded: str | None = None
    for d in _compare_body(ctx, qual, _body(ufn), _body(pfn), anchor=pfn.lineno, bbody=bbody):
        if attr_method and d.kind in {"changed", "added", "removed", "call-changed"}:
            d = replace(d, kind="class-attribute", action=ACTIONS["class-attribute"][0], validation=ACTIONS["class-attribute"][1])
        if not d.note and d.kind not in {"arch-check", "upstream-not-followed", "signature-changed"}:
            if folded is None:  # once per function, only when a hunk needs it
                body, used = fold(_body(ufn), ctx.platform)
                folded = "; ".join(sorted(set(used))) if used and same_code(body, _body(pfn)) else ""
            if folded:
                d = replace(d, note=f"the port's code is upstream's as the vendor platform runs it ({folded})")
        yield d


def _compare_body(ctx: _Ctx, qual: str, ubody: list[ast.stmt], pbody: list[ast.stmt], anchor: int,
                  bbody: list[ast.stmt] | None = None) -> Iterator[Difference]:
    utoks = _mark_arch(ctx.up, list(_flatten(ubody, 0)))
    ptoks = _mark_arch(ctx.port, list(_flatten(pbody, 0)))
    bkeys = {t.key for t in _flatten(bbody, 0)} if bbody is not None else None
    matcher = difflib.SequenceMatcher(None, [t.key for t in utoks], [t.key for t in ptoks], autojunk=False)
    opcodes = []
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "replace" and i2 - i1 == j2 - j1 > 1 and all(utoks[i1 + k].depth == ptoks[j1 + k].depth for k in range(i2 - i1)):
            # Statements replaced one for one: each is its own hunk, so each gets its own attribution.
            opcodes += [("replace", i1 + k, i1 + k + 1, j1 + k, j1 + k + 1) for k in range(i2 - i1)]
        else:
            opcodes.append((op, i1, i2, j1, j2))
    moves = _moves(opcodes, utoks, ptoks)
    switches: dict[str, int] = {}  # the vendor switches' tests and the names they bind -> the switch's line
    bodies: list[tuple[int, int, int]] = []  # (first, last) lines of the branches a switch's test governs, its line
    for op, i1, i2, j1, j2 in opcodes:
        if (i1, i2) in moves.values():
            continue  # a statement moved within the function: reported once, where it is now
        if (j1, j2) in moves:
            u, p = utoks[moves[(j1, j2)][0]:moves[(j1, j2)][1]], ptoks[j1:j2]
            span = (p[0].line, max(t.end for t in p))
            d = ctx.diff("moved", p[0].line, qual, f"moved within {qual}: upstream line {u[0].line} is at port line {p[0].line}: "
                         f"{_text(ctx.port, p[0])}", span, u[0].line)
            yield replace(d, note=f"a statement moved within its function (the same code, upstream line {u[0].line})",
                          attribution=ctx.env.attribution(False) if ctx.env is not None else "")
            continue
        if op == "equal":
            for first, last in _arch_groups(ptoks[j1:j2]):
                d = ctx.diff("arch-check", first.line, qual, f"kept from upstream: {_text(ctx.port, first)}",
                             (first.line, last.end), utoks[i1 + ptoks[j1:j2].index(first)].line)
                const = _arch_constant([first.node], ctx.platform)
                note = f"predicate constant on the vendor platform: {const}" if const else (
                    _hunk_note(ctx, qual, "kept", [], [first], (first.line, last.end))
                    or "inherited unchanged from upstream: the capability the vendor platform reports decides it")
                yield replace(d, note=note, attribution="inherited")
            continue
        u, p = utoks[i1:i2], ptoks[j1:j2]
        if p:
            span = (p[0].line, max(t.end for t in p))
        else:
            prev_end = ptoks[j1 - 1].end if j1 > 0 else anchor
            nxt = ptoks[j1].line if j1 < len(ptoks) else prev_end + 1
            span = (prev_end + 1, max(prev_end + 1, nxt))
        kind, detail = _classify(ctx, u, p)
        keywords: tuple[str, ...] = ()
        if kind == "removed":
            uses = keyword_only_uses([t.node for t in u], ctx.up.funcs.get(qual), (u[0].line, max(t.end for t in u)))
            if uses:
                detail = detail.replace("port drops: ", f"port drops (read only as {', '.join(f'{c}({k}=)' for c, k in uses)}): ", 1)
                keywords = tuple(f"{c}:-{k}" for c, k in uses)
        elif kind == "argument-commented-out":
            keywords = tuple(f"{item.rsplit(':', 1)[0]}:-{item.rsplit(':', 1)[1]}" for item in _commented_out_args(ctx, u, p))
        elif kind == "call-changed":
            keywords = _keyword_deltas([t.node for t in u], [t.node for t in p])
        drift = False
        change = ""
        if bkeys is not None and u and kind not in {"arch-check", "foreign-platform-branch"} and _kept_base(u, p, bkeys):
            # Upstream wrote this after the base release and the port still has the base form.
            change = "statements-added" if not p else "changed"
            kind, detail = "upstream-not-followed", f"upstream changed this after the base release; the port keeps the earlier form: {detail}"
            drift = True
        line = span[0] if p else span[0] - 1
        d = ctx.diff(kind, line, qual, detail, span, u[0].line if u else None)
        attribution = ctx.env.attribution(drift) if ctx.env is not None else ""
        note = _hunk_note(ctx, qual, kind, u, p, span)
        note = note or _under_switch(switches, [t.node for t in u], [t.node for t in p])
        if not note and p and any(first <= p[0].line and p[-1].end <= last for first, last, _ in bodies):
            at = next(at for first, last, at in bodies if first <= p[0].line and p[-1].end <= last)
            note = f"{VENDOR_SWITCH} (inside the branch the switch at line {at} governs)"
        if note.startswith(VENDOR_SWITCH):
            _record_switch(switches, [t.node for t in p], line)
            for k in range(j1, j2):  # the statements of a branch the switch's test now governs
                tok = ptoks[k]
                if isinstance(tok.node, ast.If):
                    inner: list[_Tok] = []
                    for t in ptoks[k + 1:]:
                        if t.depth <= tok.depth:
                            break
                        inner.append(t)
                    if inner:
                        bodies.append((inner[0].line, max(t.end for t in inner), tok.line))
        yield replace(d, note=note, attribution=attribution, change=change, keywords=keywords)


def _record_switch(switches: dict[str, int], pn: list[ast.AST], line: int) -> None:
    """What a vendor-switch hunk brings: its tests (a dropped upstream branch on the same test moved there) and
    the names it binds (`gather_kernel = a if dtype == x else b`: later hunks that use it are the same feature)."""
    for node in pn:
        for sub in ast_walk(node):
            if isinstance(sub, ast.If | ast.IfExp):
                switches.setdefault("test:" + ast.unparse(sub.test), line)
            elif isinstance(sub, ast.Assign):
                for t in sub.targets:
                    if isinstance(t, ast.Name):
                        switches.setdefault("name:" + t.id, line)


def _under_switch(switches: dict[str, int], un: list[ast.AST], pn: list[ast.AST]) -> str:
    """A hunk that reads a name a vendor switch of the same function binds, or drops an upstream branch on the very
    test the switch now takes: part of that vendor feature (its note says where the switch is), else ""."""
    if not switches:
        return ""
    for node in pn:
        for sub in ast_walk(node):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load) and "name:" + sub.id in switches:
                return f"{VENDOR_SWITCH} (uses {sub.id}, which the switch at line {switches['name:' + sub.id]} sets)"
    if un and not pn:
        for node in un:
            for sub in ast_walk(node):
                if isinstance(sub, ast.If) and "test:" + ast.unparse(sub.test) in switches:
                    return f"{VENDOR_SWITCH} (upstream's branch on `{ast.unparse(sub.test)}` is taken by the switch at line {switches['test:' + ast.unparse(sub.test)]})"
    return ""


def _keyword_deltas(un: list[ast.AST], pn: list[ast.AST]) -> tuple[str, ...]:
    """The keywords added ("callee:+kw") and dropped ("callee:-kw") at calls both sides make (as _classify's
    call-changed detail writes them, as data)."""
    ucalls, pcalls = _calls(un), _calls(pn)
    out: list[str] = []
    for callee in sorted(set(ucalls) & set(pcalls)):
        out += [f"{callee}:+{k}" for k in sorted(pcalls[callee] - ucalls[callee])]
        out += [f"{callee}:-{k}" for k in sorted(ucalls[callee] - pcalls[callee])]
    return tuple(out)

