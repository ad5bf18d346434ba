# What a call reaches on the vendor stack when the installed callable only forwards its arguments, by
# position, to a torch op: the values land on the op's parameters as the vendor registered them, not
# on the wrapper's names. vLLM's `_custom_ops` wrappers are of this kind, and a port that compiles its
# own ops (MetaX's csrc/) may keep an older schema than the wrapper's upstream names.
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from metax_audit.core.models import CallableFact
from metax_audit.core.pysource import ast_walk, cached_parse
from metax_audit.stages.checks.op_registrations import OpTable

PORT_PROVIDERS = ("port C++", "port python")


@dataclass(frozen=True)
class ForwardedOp:
    """An installed callable whose body is one call `torch.ops.NS.OP(p0, p1, ...)` of its own parameters."""

    namespace: str
    op: str
    forwarded: tuple[str, ...]  # the wrapper's parameters, in the order they reach the op
    where: str  # the wrapper's source file and line


@dataclass(frozen=True)
class VendorSchema:
    """The op's schema as the port registers it: what positional values land on."""

    namespace: str
    op: str
    params: tuple[str, ...]
    where: str
    text: str


def _op_path(func: ast.expr) -> tuple[str, str] | None:
    """`torch.ops.NS.OP` or `torch.ops.NS.OP.default` -> (NS, OP)."""
    parts: list[str] = []
    node = func
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    parts.reverse()
    if parts[-1] == "default":
        parts.pop()
    if len(parts) == 4 and parts[:2] == ["torch", "ops"]:
        return parts[2], parts[3]
    return None


def forwarded_op(fact: CallableFact) -> ForwardedOp | None:
    """The op a pure positional pass-through wrapper calls, read from the wrapper's source; None when
    the body does anything else (reorders, converts, passes keywords), so nothing is assumed."""
    if not fact.sourcefile or fact.line is None or not Path(fact.sourcefile).is_file():
        return None
    try:
        _, tree = cached_parse(fact.sourcefile)
    except (OSError, SyntaxError, ValueError):
        return None
    name = fact.target.rsplit(".", 1)[-1]
    func = next((n for n in ast_walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name
                 and n.lineno <= fact.line <= (n.end_lineno or n.lineno)), None)
    if func is None:
        return None
    body = list(func.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]  # the docstring
    if len(body) != 1 or not isinstance(body[0], (ast.Expr, ast.Return)) or not isinstance(body[0].value, ast.Call):
        return None
    call = body[0].value
    op = _op_path(call.func)
    params = [a.arg for a in (*func.args.posonlyargs, *func.args.args)]
    names = [a.id if isinstance(a, ast.Name) else None for a in call.args]
    if op is None or call.keywords or None in names or names != params[:len(names)]:
        return None
    return ForwardedOp(op[0], op[1], tuple(n for n in names if n is not None),
                       f"{Path(fact.sourcefile).name}:{func.lineno}")


def _split_top(text: str) -> list[str]:
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return [s.strip() for s in out if s.strip()]


def schema_params(schema: str) -> tuple[str, ...] | None:
    """Positional parameter names of a schema `op(Tensor a, Tensor! b, int n=1, *, bool k) -> ()`."""
    open_at = schema.find("(")
    if open_at < 0:
        return None
    depth, close_at = 0, -1
    for i in range(open_at, len(schema)):
        depth += {"(": 1, ")": -1}.get(schema[i], 0)
        if depth == 0:
            close_at = i
            break
    if close_at < 0:
        return None
    names: list[str] = []
    for part in _split_top(schema[open_at + 1:close_at]):
        if part == "*":
            break  # keyword-only parameters follow: no positional value lands there
        words = part.split("=", 1)[0].split()
        if len(words) < 2 or not words[-1].isidentifier():
            return None
        names.append(words[-1])
    return tuple(names)


def vendor_schema(table: OpTable, namespace: str, op: str) -> VendorSchema | None:
    """The port's own registration of NS::OP with a readable schema (what its compiled library holds)."""
    for reg in table.ops.get((namespace, op), ()):
        if reg.provider in PORT_PROVIDERS and reg.schema:
            params = schema_params(reg.schema)
            if params is not None:
                return VendorSchema(namespace, op, params, reg.where, reg.schema)
    return None


def tail_name(text: str) -> str:
    """The last identifier of an argument expression (`chunk.seq_lens` -> seq_lens); '' for calls etc."""
    tail = text.strip().rsplit(".", 1)[-1]
    return tail if tail.isidentifier() else ""
