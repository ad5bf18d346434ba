# Rule `registration` for op names: every `torch.ops.<ns>.<op>` use and `"ns::op"` string in scope
# must resolve to a registration the target stack loads, read statically from every provider we have.
from __future__ import annotations

import ast
import difflib
from collections.abc import Iterable, Iterator
from functools import partial
from pathlib import Path

from metax_audit.core.config import AuditConfig
from metax_audit.core.findings import make_finding, rule
from metax_audit.core.memo import Memo
from metax_audit.core.models import Category, Discovery, Finding, Location, Severity, StackFacts, UpstreamInfo
from metax_audit.core.pysource import ast_walk, walk_nodes
from metax_audit.stages.checks.memo import FileMemo
from metax_audit.stages.checks.op_registrations import (
    _OP_STRING,
    OP_REFERENCING,
    TORCH_NAMESPACES,
    OpRegistration,
    OpTable,
    OpUse,
    _str,
    _tail,
)
from metax_audit.stages.checks.op_table import build_table, cpp_function, upstream_cpp_ops
from metax_audit.stages.checks.stack import parse_file, source_line

rule("MXA170", Category.REGISTRATION, Severity.ERROR, "op name that nothing on the target stack registers",
     "`torch.ops.<ns>.<op>` (or an op-referencing call such as register_fake(\"ns::op\")) fails with "
     "AttributeError/RuntimeError on first use: neither the port's Python or C++ registrations, nor upstream's "
     "Python registrations or compiled extensions, nor the stack manifest define it. The evidence lists every "
     "provider read and the closest registered names. Register the op, or call the name the provider defines.")
rule("MXA171", Category.REGISTRATION, Severity.WARNING, "op name in a configuration list that nothing registers",
     "A `\"ns::op\"` string (e.g. an attention op appended to the compilation config's splitting ops) names no "
     "registered op. A warning when a registered op of a similar name is missing from the list (renamed under "
     "it): what the list asks for (a piecewise graph split) never happens for the op that runs; fix the entry. "
     "Info when no such op exists: a stale name left after the op was removed, asking for nothing; drop it.")
rule("MXA172", Category.REGISTRATION, Severity.INFO, "op name could not be checked against its registrations",
     "The namespace (or op) is provided by something this audit cannot read statically (a compiled package "
     "of the kernel stack, a registration with a computed name); this is not evidence that the op is missing. "
     "A stack manifest captured on the vendor stack (`metax-audit evidence --capture-stack`) closes the gap.")
rule("MXA174", Category.REGISTRATION, Severity.ERROR, "a torch.ops namespace is called as if it were an op",
     "`torch.ops.<ns>(...)` calls the namespace object (torch._ops._OpNamespace), which is not callable: TypeError at "
     "the call, whatever the namespace registers. Call an op of it, `torch.ops.<ns>.<op>(...)`; the evidence lists the "
     "ops the providers read register in that namespace.")
rule("MXA173", Category.REGISTRATION, Severity.INFO, "guarded use of an op that nothing registers",
     "The use sits under `hasattr(torch.ops.<ns>, ...)` or a try/except, so the fallback runs instead; check the "
     "fallback is what the vendor device should run.")


# ---------------------------------------------------------------- uses in scope


def _torch_ops(node: ast.AST) -> tuple[str, str | None] | None:
    """`torch.ops.ns.op` -> (ns, op); `torch.ops.ns` -> (ns, None)."""
    chain: list[str] = []
    cur = node
    while isinstance(cur, ast.Attribute):
        chain.append(cur.attr)
        cur = cur.value
    if not (isinstance(cur, ast.Name) and cur.id == "torch"):
        return None
    chain.reverse()
    if len(chain) < 2 or chain[0] != "ops":
        return None
    return chain[1], (chain[2] if len(chain) > 2 else None)


def _may_test_hasattr(test: ast.expr) -> bool:
    """Whether unparsing `test` could say "hasattr(torch.ops": a name or attribute ending in hasattr, or a
    string holding it (a test of none of them is not unparsed: most tests of a port file)."""
    for n in ast_walk(test):
        if (isinstance(n, ast.Name) and n.id.endswith("hasattr")) or (isinstance(n, ast.Attribute) and n.attr.endswith("hasattr")):
            return True
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and "hasattr(torch.ops" in n.value:
            return True
    return False


def _guards(tree: ast.Module) -> dict[int, str]:
    """Lines under a `hasattr(torch.ops.<ns>, "op")` test or a try whose handlers catch the failure."""
    out: dict[int, str] = {}
    for node in walk_nodes(tree):
        body: list[ast.stmt] = []
        text = ""
        if isinstance(node, ast.If | ast.IfExp) and _may_test_hasattr(node.test) and "hasattr(torch.ops" in ast.unparse(node.test):
            body, text = (list(node.body) if isinstance(node, ast.If) else []), ast.unparse(node.test)
            if isinstance(node, ast.IfExp):
                out.setdefault(node.lineno, ast.unparse(node.test))
        elif isinstance(node, ast.Try):
            caught = {ast.unparse(h.type) if h.type is not None else "" for h in node.handlers}
            if any(c == "" or any(w in c for w in ("AttributeError", "RuntimeError", "Exception")) for c in caught):
                body, text = list(node.body), f"try/except {', '.join(sorted(c or 'bare' for c in caught))}"
        for stmt in body:
            for line in range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1):
                out.setdefault(line, text)
    return out


def op_uses(root: Path, paths: Iterable[str], memo: FileMemo | None = None) -> list[OpUse]:
    """Every op use of the files, in (path, line, namespace, name) order; each file's uses are a
    function of its path and bytes alone (kept per file in `memo`)."""
    uses = [u for rel in paths
            for u in (memo.get(rel, ("op-uses",), partial(_file_op_uses, root, rel)) if memo else _file_op_uses(root, rel))]
    return sorted(uses, key=lambda u: (u.path, u.line, u.namespace, u.name or ""))


def _file_op_uses(root: Path, rel: str) -> list[OpUse]:
    tree = parse_file(str(root / rel))
    if tree is None:
        return []
    uses: list[OpUse] = []
    guards = _guards(tree)
    inner: set[int] = set()  # ids of torch.ops.ns nodes that are part of a longer chain
    found: list[tuple[ast.AST, tuple[str, str | None]]] = []
    for node in walk_nodes(tree):
        if isinstance(node, ast.Attribute):
            hit = _torch_ops(node)
            if hit is not None:
                found.append((node, hit))
                if isinstance(node.value, ast.Attribute):
                    inner.add(id(node.value))
        elif isinstance(node, ast.Call) and node.args and _tail(node.func) in OP_REFERENCING:
            m = _OP_STRING.match(_str(node.args[0]) or "")
            if m:
                inner.add(id(node.args[0]))
                uses.append(OpUse(rel, node.lineno, m.group(1), m.group(2), "op-call", guards.get(node.lineno, "")))
        elif isinstance(node, ast.Call) and (called := _torch_ops(node.func)) is not None and called[1] is None:
            inner.add(id(node.func))  # torch.ops.ns(...): the namespace itself is called
            uses.append(OpUse(rel, node.lineno, called[0], None, "namespace-call", guards.get(node.lineno, "")))
        elif isinstance(node, ast.Call) and _tail(node.func) == "hasattr" and len(node.args) == 2:
            hit = _torch_ops(node.args[0])
            if hit is not None and hit[1] is None:  # hasattr(torch.ops.ns, "op") is the guard, not a use
                inner.add(id(node.args[0]))
    for node in walk_nodes(tree):
        if isinstance(node, ast.Constant) and id(node) not in inner:
            m = _OP_STRING.match(_str(node) or "")
            if m:
                uses.append(OpUse(rel, node.lineno, m.group(1), m.group(2), "string", guards.get(node.lineno, "")))
    seen: set[tuple[int, str, str | None]] = set()
    for node, (ns, op) in found:
        if id(node) in inner:
            continue
        line = getattr(node, "lineno", 0)
        if op is not None and op in {"default"}:
            continue
        key = (line, ns, op)
        if key not in seen:
            seen.add(key)
            uses.append(OpUse(rel, line, ns, op, "torch.ops", guards.get(line, "")))
    return uses


# ---------------------------------------------------------------- the check


def _lookup(table: OpTable, ns: str, op: str) -> tuple[OpRegistration, ...]:
    found = table.ops.get((ns, op), ())
    if not found and op in table.macro_ops:
        found = (table.macro_ops[op],)
    if not found and table.compiled_names is not None and ns in table.compiled and op in table.compiled_names:
        found = (OpRegistration(ns, op, "upstream compiled", table.compiled[ns]),)
    return found


def _unknowable(table: OpTable, ns: str, op: str | None) -> str | None:
    """Why a miss is not proof: a provider of the namespace whose op list we could not read."""
    if ns not in table.namespaces:
        return None
    prefixes = table.dynamic.get(ns, ()) + table.dynamic.get("", ())
    for prefix in prefixes:
        if op is None or op.startswith(prefix):
            return f"a registration into {ns or 'an unnamed library'} computes its op name" + (f" (prefix {prefix!r})" if prefix else "")
    if ns in table.packages:
        return f"{ns} is the op library of kernel package {table.packages[ns]} (config op-namespaces), not read here"
    if ns in table.compiled and table.compiled_names is None:
        return f"{ns} is also provided by {table.compiled[ns]}, whose op list could not be read: {table.compiled_note or 'no compiled extensions in the upstream source'}"
    return None


def check_ops(discovery: Discovery, table: OpTable, memo: FileMemo | None = None) -> Iterator[Finding]:
    """One finding per op name in scope that no provider registers (or that could not be checked)."""
    paths = [f.path for f in discovery.files if f.parse_error is None]
    unchecked: dict[str, list[OpUse]] = {}
    uses = list(op_uses(discovery.root, paths, memo))
    listed = {(u.namespace, u.name) for u in uses if u.kind == "string"}  # names the configuration lists hold
    for use in uses:
        if use.kind == "namespace-call":
            yield _namespace_call(discovery.root, table, use)
            continue
        if use.namespace in TORCH_NAMESPACES:
            continue
        op = use.name
        what = f"torch.ops.{use.namespace}" + (f".{op}" if op else "") if use.kind == "torch.ops" else f"{use.namespace}::{op}"
        loc = Location(use.path, use.line, f"op:{use.namespace}::{op or ''}")
        port_side = f"port: {use.path}:{use.line}: {source_line(discovery.root, use.path, use.line)}"
        if op is not None and _lookup(table, use.namespace, op):
            continue
        if use.namespace not in table.namespaces:
            unchecked.setdefault(f"namespace {use.namespace} is declared by nothing read here", []).append(use)
            continue
        if op is None:
            continue
        why = _unknowable(table, use.namespace, op)
        if why:
            unchecked.setdefault(why, []).append(use)
            continue
        evidence = [port_side, f"namespace {use.namespace}: declared by {', '.join(table.namespaces[use.namespace])}",
                    *(f"read: {r}" for r in table.read)]
        same_ns = sorted(n for (ns, n) in table.ops if ns == use.namespace)
        close = difflib.get_close_matches(op, same_ns, n=3, cutoff=0.6)
        if close:
            evidence.append("closest registered: " + ", ".join(
                f"{use.namespace}::{c} ({table.ops[(use.namespace, c)][0].text()})" for c in close))
        cpp = cpp_function(table.native_files, discovery.root, op)
        if cpp:
            evidence.append(f"port C++ defines a function {op} at {cpp}, but no library .def registers it as an op")
        if table.compiled_names is not None and use.namespace in table.compiled:
            evidence.append(f"not among the {len(table.compiled_names)} op schemas of {table.compiled[use.namespace]}")
        if use.guard:
            yield make_finding("MXA173", loc, f"{what} is registered by nothing read here; the use is guarded by {use.guard}",
                               evidence)
        elif use.kind == "string":
            # The consequence is in what the list misses: an op renamed under it (a registered op of a similar
            # name the list does not hold) is not split or treated as attention; a name with no such successor
            # asks for nothing that runs, so the entry is only stale.
            missed = [c for c in close if (use.namespace, c) not in listed]
            if missed:
                yield make_finding("MXA171", loc, f"{what} names an op nothing registers; {use.namespace}::{missed[0]} is "
                                   "registered and not in the list (renamed?): what the list asks for does not happen for it",
                                   evidence)
            else:
                yield make_finding("MXA171", loc, f"{what} names an op nothing registers: a stale entry that asks for "
                                   "nothing (no registered op of a similar name is missing from the list); drop it",
                                   [*evidence, "no registered op of a similar name is missing from the configuration lists"],
                                   severity=Severity.INFO)
        else:
            yield make_finding("MXA170", loc, f"{what} is registered by nothing on the target stack", evidence)
    for why, uses in unchecked.items():
        first = uses[0]
        names = sorted({f"{u.namespace}::{u.name or '*'}" for u in uses})
        yield make_finding("MXA172", Location(first.path, first.line, f"op-unchecked:{why.split(':')[0]}"),
                           f"{len(uses)} op use(s) not checked: {why}",
                           [*(f"op: {n}" for n in names[:15]), *(f"use: {u.path}:{u.line}" for u in uses[:10]),
                            *(f"read: {r}" for r in table.read)])


def _namespace_call(root: Path, table: OpTable, use: OpUse) -> Finding:
    ops = sorted(n for (ns, n) in table.ops if ns == use.namespace)
    ev = [f"port: {use.path}:{use.line}: {source_line(root, use.path, use.line)}",
          f"torch.ops.{use.namespace} is an op namespace (torch._ops._OpNamespace, a module object without __call__): "
          "calling it raises TypeError",
          (f"ops registered in {use.namespace} by what was read: " + ", ".join(ops[:12]) + (" ..." if len(ops) > 12 else ""))
          if ops else f"no op of {use.namespace} was found in what was read"]
    if use.guard:
        ev.append(f"under {use.guard}: the except branch runs instead of the call on every stack")
    return make_finding("MXA174", Location(use.path, use.line, f"op-namespace-call:{use.namespace}"),
                        f"torch.ops.{use.namespace}(...) calls an op namespace, not an op: TypeError", ev,
                        severity=Severity.WARNING if use.guard else None)


def op_table_for_review(discovery: Discovery, config: AuditConfig, upstream: UpstreamInfo | None,
                        facts: StackFacts | None, *, memo: Memo | None = None) -> OpTable:
    """Every provider of ops the review reads: the port's Python and C++, upstream's Python and compiled
    op names, the stack manifest. The signature check reads the port's schemas from it too."""
    compiled, note = (None, "")
    if upstream is not None:
        from metax_audit.stages.upstream import compiled_op_names

        compiled, note = compiled_op_names(upstream)
        if compiled is None and upstream.root is not None and (upstream.root / "csrc").is_dir():
            compiled, note = upstream_cpp_ops(upstream.root)
    manifest = facts.torch_ops if facts is not None and facts.source.startswith("manifest:") else None
    return build_table(discovery.root, discovery.port_package, config.native_sources, upstream,
                       compiled_names=compiled, compiled_note=note, manifest_ops=manifest,
                       op_packages=config.op_namespaces, memo=memo)


def op_findings(discovery: Discovery, config: AuditConfig, upstream: UpstreamInfo | None,
                facts: StackFacts | None, table: OpTable | None = None, memo: FileMemo | None = None) -> list[Finding]:
    """The op-name check as the review runs it: every provider read, then the uses in scope."""
    if table is None:
        table = op_table_for_review(discovery, config, upstream, facts)
    return list(check_ops(discovery, table, memo))
