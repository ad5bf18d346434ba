# Custom ops the port registers (`direct_register_custom_op`, `@torch.library.custom_op`): the op function
# (its schema is inferred from it), its fake implementation and every `torch.ops.<ns>.<op>(...)` call must agree.
from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from metax_audit.core.findings import make_finding, rule
from metax_audit.core.models import Category, Discovery, Finding, Location, Severity
from metax_audit.core.pysource import unparse_name, walk_nodes
from metax_audit.stages.checks.stack import parse_file, source_line

rule("MXA175", Category.SIGNATURE, Severity.ERROR, "a custom op's function, its fake implementation and its calls disagree",
     "torch infers the op's schema from the registered function's parameters; the fake (meta) implementation is called "
     "with the same arguments while tracing (torch.compile, CUDA graph capture), and every `torch.ops.<ns>.<op>(...)` "
     "call binds against the schema. A fake that takes other parameters, or a call that passes a keyword the function "
     "does not have, too many positionals, or omits a required parameter, raises when it runs (TypeError or a schema "
     "error). The evidence quotes the registration, both definitions and the call.")

# direct_register_custom_op(op_name, op_func, mutates_args=None, fake_impl=None, target_lib=None, ...)
_POSITIONS = ("op_name", "op_func", "mutates_args", "fake_impl", "target_lib")


@dataclass(frozen=True)
class _Params:
    names: tuple[str, ...]  # positional-or-keyword and keyword-only names, in order
    positional: int  # how many may be passed by position
    required: frozenset[str]
    varargs: bool
    path: str
    line: int
    text: str  # "def f(a, b=1)"

    @staticmethod
    def of(fn: ast.FunctionDef | ast.AsyncFunctionDef, path: str) -> _Params:
        a = fn.args
        pos = [*a.posonlyargs, *a.args]
        required = {p.arg for p in pos[: len(pos) - len(a.defaults)]}
        required |= {p.arg for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is None}
        return _Params(tuple(p.arg for p in (*pos, *a.kwonlyargs)), len(pos), frozenset(required),
                       a.vararg is not None or a.kwarg is not None, path, fn.lineno, f"def {fn.name}({ast.unparse(a)})")


@dataclass(frozen=True)
class _Op:
    namespace: str
    name: str
    where: tuple[str, int]  # the registration
    func: _Params | None
    fake: _Params | None


def _functions(tree: ast.Module) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    return {st.name: st for st in tree.body if isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef)}


def _str(node: ast.expr | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def registered_ops(tree: ast.Module, path: str) -> list[_Op]:
    """The ops a module registers with their function and fake read from the same module (a name imported
    from elsewhere is left unread: None)."""
    fns = _functions(tree)
    libs = {t.id: ns for st in tree.body if isinstance(st, ast.Assign) and isinstance(st.value, ast.Call)
            and unparse_name(st.value.func).endswith("Library") and (ns := _str(st.value.args[0] if st.value.args else None))
            for t in st.targets if isinstance(t, ast.Name)}
    out: list[_Op] = []
    for node in walk_nodes(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func).rsplit(".", 1)[-1] == "direct_register_custom_op":
            args: dict[str, ast.expr] = dict(zip(_POSITIONS, node.args, strict=False))
            args.update({k.arg: k.value for k in node.keywords if k.arg})
            name = _str(args.get("op_name"))
            if name is None:
                continue
            lib = args.get("target_lib")
            ns = "vllm" if lib is None else libs.get(lib.id, "") if isinstance(lib, ast.Name) else ""
            func, fake = args.get("op_func"), args.get("fake_impl")
            out.append(_Op(ns, name, (path, node.lineno),
                           _Params.of(fns[func.id], path) if isinstance(func, ast.Name) and func.id in fns else None,
                           _Params.of(fns[fake.id], path) if isinstance(fake, ast.Name) and fake.id in fns else None))
    for fn in fns.values():  # @torch.library.custom_op("ns::name") with @name.register_fake
        for d in fn.decorator_list:
            if isinstance(d, ast.Call) and ast.unparse(d.func).endswith("custom_op") and (s := _str(d.args[0] if d.args else None)) \
                    and "::" in s:
                ns, name = s.split("::", 1)
                fake_fn = next((f for f in fns.values() for fd in f.decorator_list
                                if ast.unparse(fd.func if isinstance(fd, ast.Call) else fd) == f"{fn.name}.register_fake"), None)
                out.append(_Op(ns, name, (path, fn.lineno), _Params.of(fn, path), _Params.of(fake_fn, path) if fake_fn else None))
    return out


@dataclass(frozen=True)
class _Call:
    path: str
    line: int
    namespace: str
    name: str
    positional: int
    keywords: tuple[str, ...]
    starred: bool


def op_calls(tree: ast.Module, path: str) -> list[_Call]:
    out = []
    for node in walk_nodes(tree):
        if not isinstance(node, ast.Call):
            continue
        chain: list[str] = []
        cur: ast.expr = node.func
        while isinstance(cur, ast.Attribute):
            chain.append(cur.attr)
            cur = cur.value
        chain.reverse()
        if not (isinstance(cur, ast.Name) and cur.id == "torch" and len(chain) in (3, 4) and chain[0] == "ops"):
            continue
        if len(chain) == 4 and chain[3] != "default":
            continue
        starred = any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords)
        out.append(_Call(path, node.lineno, chain[1], chain[2], len(node.args), tuple(k.arg for k in node.keywords if k.arg), starred))
    return out


def _disagreement(func: _Params, fake: _Params) -> str:
    if func.varargs or fake.varargs:
        return ""
    # The dispatcher calls the fake with every schema argument, positional ones by position (defaults filled in):
    # another count, or other keyword-only names, raises; a positional parameter merely renamed does not.
    if func.positional != fake.positional or func.names[func.positional:] != fake.names[fake.positional:]:
        return (f"the fake takes {len(fake.names)} parameter(s) ({', '.join(fake.names)}) where the op function takes "
                f"{len(func.names)} ({', '.join(func.names)})")
    return ""


def _binding(call: _Call, func: _Params) -> str:
    if func.varargs or call.starred:
        return ""
    problems = []
    if call.positional > func.positional:
        problems.append(f"{call.positional} positional argument(s), the op takes {func.positional}")
    unknown = [k for k in call.keywords if k not in func.names]
    if unknown:
        problems.append("keyword(s) " + ", ".join(unknown) + " the op does not have")
    bound = set(func.names[: call.positional]) | set(call.keywords)
    missing = sorted(func.required - bound)
    if missing and not unknown and call.positional <= func.positional:
        problems.append("required parameter(s) " + ", ".join(missing) + " not passed")
    return "; ".join(problems)


def check_custom_ops(discovery: Discovery, registering: list[str], callers: list[str]) -> Iterator[Finding]:
    """`registering`: the port files that register ops; the calls are read in the scope's files and `callers`."""
    root = discovery.root
    ops: dict[tuple[str, str], _Op] = {}
    for rel in registering:
        tree = parse_file(str(root / rel))
        if tree is not None:
            for op in registered_ops(tree, rel):
                ops.setdefault((op.namespace, op.name), op)
    if not ops:
        return
    scope = [sf.path for sf in discovery.files if sf.parse_error is None and sf.path.endswith(".py")]
    reading = sorted(set(scope) | set(callers))
    calls: list[_Call] = []
    for rel in reading:
        tree = parse_file(str(root / rel))
        if tree is not None:
            calls += op_calls(tree, rel)
    # What touches the attention code: ops registered in the scope or its callers, or called from there.
    touched = {(c.namespace, c.name) for c in calls} | {k for k, op in ops.items() if op.where[0] in set(reading)}
    for key, op in ops.items():
        if key not in touched:
            continue
        if op.func is not None and op.fake is not None and (why := _disagreement(op.func, op.fake)):
            yield make_finding("MXA175", Location(op.fake.path, op.fake.line, f"custom-op-fake:{op.namespace}::{op.name}"),
                               f"{op.namespace}::{op.name}: {why}", _evidence(root, op))
    for call in calls:
        called = ops.get((call.namespace, call.name))
        if called is None or called.func is None or not (why := _binding(call, called.func)):
            continue
        op = called
        yield make_finding("MXA175", Location(call.path, call.line, f"custom-op-call:{op.namespace}::{op.name}"),
                           f"torch.ops.{op.namespace}.{op.name}(...) passes {why}: it does not bind to the op's schema",
                           [f"port: {call.path}:{call.line}: {source_line(root, call.path, call.line)}", *_evidence(root, op)])


def _evidence(root: Path, op: _Op) -> list[str]:
    ev = [f"registration: {op.where[0]}:{op.where[1]}: {source_line(root, *op.where)}"]
    if op.func is not None:
        ev.append(f"op function (the schema is inferred from it): {op.func.path}:{op.func.line}: {op.func.text}")
    if op.fake is not None:
        ev.append(f"fake implementation: {op.fake.path}:{op.fake.line}: {op.fake.text}")
    return ev
