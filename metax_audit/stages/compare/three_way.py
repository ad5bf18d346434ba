# Three-way comparison: what upstream changed between the base and target release, and whether the
# port followed it.
from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, replace

from metax_audit.core.models import Difference, DifferenceKind
from metax_audit.core.pysource import ast_walk, dump
from metax_audit.stages.compare.classify import _port_gate
from metax_audit.stages.compare.consequence import CAPABILITY_HOOK, NOT_KERNEL, kernel_relevant
from metax_audit.stages.compare.context import _anchor, _Ctx, _inherits
from metax_audit.stages.compare.counterparts import FileCounterpart
from metax_audit.stages.compare.rules import ACTIONS
from metax_audit.stages.compare.side import (
    _body,
    _callee,
    _calls,
    _Env,
    _Side,
    _sig,
    _source,
    _squash,
    _start,
    _value,
)


@dataclass(frozen=True)
class _Change:
    kind: str  # method-added | method-removed | signature-changed | kernel-argument-added | kernel-argument-removed | attribute-changed
    symbol: str
    detail: str
    upstream_line: int
    callee: str = ""
    argument: str = ""


def _upstream_changes(base: _Side, target: _Side) -> Iterator[_Change]:
    for qual, fn in target.funcs.items():
        old = base.funcs.get(qual)
        if old is None:
            yield _Change("method-added", qual, f"upstream added {qual}{_sig(fn)}", fn.lineno)
            continue
        if _source(base, old) == _source(target, fn):
            continue
        if dump(old.args) != dump(fn.args):
            yield _Change("signature-changed", qual, f"upstream changed {qual}{_sig(old)} -> {_sig(fn)}", fn.lineno)
        bcalls, tcalls = _calls(_body(old)), _calls(_body(fn))
        for callee in sorted(set(bcalls) & set(tcalls)):
            for arg in sorted(tcalls[callee] - bcalls[callee]):
                yield _Change("kernel-argument-added", qual, f"upstream {qual} now passes {arg}= to {callee}", fn.lineno, callee, arg)
            for arg in sorted(bcalls[callee] - tcalls[callee]):
                yield _Change("kernel-argument-removed", qual, f"upstream {qual} no longer passes {arg}= to {callee}", fn.lineno, callee, arg)
    for qual, fn in base.funcs.items():
        if qual not in target.funcs:
            yield _Change("method-removed", qual, f"upstream removed {qual}{_sig(fn)}", fn.lineno)
    for key, stmt in target.attrs.items():
        old_attr = base.attrs.get(key)
        if old_attr is not None and dump(old_attr) != dump(stmt):
            yield _Change("attribute-changed", key, f"upstream changed {key}: {_value(old_attr)} -> {_value(stmt)}", stmt.lineno)


def _three_way(port: _Side, target: _Side, base: _Side, cp: FileCounterpart, env: _Env | None = None,
               changes: list[_Change] | None = None) -> Iterator[Difference]:
    """Upstream's changes between the base and target release (`changes`, when kept: _upstream_changes of
    the two), each followed by the port or not."""
    rename = port.rename
    ctx = _Ctx(port, target, cp, rename, {_squash(c.text) for c in target.comments.comments.values()}, env=env)
    for ch in _upstream_changes(base, target) if changes is None else changes:
        followed, line, span = _followed(ctx, ch)
        if followed is None:
            continue
        kind: DifferenceKind = "upstream-followed" if followed else "upstream-not-followed"
        d = ctx.diff(kind, line, ch.symbol, ch.detail, span, ch.upstream_line)
        if followed:
            d = replace(d, action="none", validation="port tests")
        else:
            d = replace(d, attribution="drift", note=_change_note(ctx, ch, span), change=ch.kind)
        yield d


def _followed(ctx: _Ctx, ch: _Change) -> tuple[bool | None, int, tuple[int, int]]:
    """Whether the port took an upstream change; None when the port has nothing it applies to."""
    port = ctx.port
    owner = ch.symbol.rsplit(".", 1)[0] if "." in ch.symbol else ""
    if owner and owner not in port.classes:
        return None, 0, (0, 0)
    fn = port.funcs.get(ch.symbol)
    line = fn.lineno if fn is not None else _anchor(ctx, ch.symbol)
    span = (_start(fn), fn.lineno) if fn is not None else (line, line)
    if ch.kind == "method-added":
        inherited = bool(owner) and _inherits(port.classes[owner], owner)
        return fn is not None or inherited, line, span
    if ch.kind == "method-removed":
        return fn is None, line, span
    if fn is None and ch.kind != "attribute-changed":
        return None, 0, (0, 0)
    if ch.kind == "signature-changed" and fn is not None:
        tfn = ctx.up.funcs[ch.symbol]
        return dump(fn.args) == dump(tfn.args), line, span
    if ch.kind in {"kernel-argument-added", "kernel-argument-removed"} and fn is not None:
        calls = [c for c in ast_walk(fn) if isinstance(c, ast.Call) and _callee(c) == ch.callee]
        if not calls:
            # The port does not call this kernel here at all: the two-way view already shows why.
            return None, 0, (0, 0)
        passes = any(ch.argument in {k.arg for k in c.keywords} for c in calls)
        call = calls[0]
        cspan = (call.lineno, call.end_lineno or call.lineno)
        return (passes if ch.kind == "kernel-argument-added" else not passes), call.lineno, cspan
    if ch.kind == "attribute-changed":
        stmt = port.attrs.get(ch.symbol)
        if stmt is None:
            return None, 0, (0, 0)
        same = dump(stmt) == dump(ctx.up.attrs[ch.symbol])
        return same, stmt.lineno, (stmt.lineno, stmt.end_lineno or stmt.lineno)
    return None, 0, (0, 0)


def _change_note(ctx: _Ctx, ch: _Change, span: tuple[int, int]) -> str:
    """Why an upstream change the port did not take is info: it lies on a path the vendor never runs,
    or it touches no kernel argument, dtype, scale, layout or shape (a non-hook member, bookkeeping)."""
    gate = ctx.never_called(ch.symbol) or _port_gate(ctx, ch.symbol, span)
    if gate:
        return gate if gate.startswith("a path") else f"a path the vendor never runs: {gate}"
    short = ch.symbol.rsplit(".", 1)[-1]
    if ch.kind in {"method-added", "method-removed"}:
        return "" if CAPABILITY_HOOK.match(short) else "a member upstream added or removed that is not a capability hook; its callers are compared where they are"
    if ch.kind.startswith("kernel-argument") and ch.callee in ctx.platform.returns:
        # The port's own function answers one constant whatever it is passed (the port's get_flash_attn_version).
        return f"the argument cannot change the answer: {ctx.platform.returns[ch.callee][1]} whatever its arguments"
    text = f"{ch.callee} {ch.argument}" if ch.kind.startswith("kernel-argument") else ch.detail
    return "" if kernel_relevant([text]) else NOT_KERNEL


def _reclassify_followed(diffs: list[Difference], drift: list[Difference]) -> list[Difference]:
    """A two-way difference that is really an upstream change the port has not taken says so."""
    pending = {(d.symbol, d.detail.split(" ", 2)[1]) for d in drift if d.kind == "upstream-not-followed"}
    out = []
    for d in diffs:
        member_removed = d.kind == "removed" and d.detail.endswith("is absent from the port")
        if (member_removed and (d.symbol, "added") in pending) or (d.kind == "signature-changed" and (d.symbol, "changed") in pending):
            action, validation = ACTIONS["upstream-not-followed"]
            d = replace(d, kind="upstream-not-followed", action=action, validation=validation)
        out.append(d)
    return out
