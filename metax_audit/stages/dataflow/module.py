# One port module as the dataflow interpreter sees it: imports (module level, guarded and lazy),
# functions, classes, `self.x = ...` assignments, wrapper constructors by name and numeric constants.
from __future__ import annotations

import ast
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from metax_audit.core.pysource import ast_walk, cached_parse
from metax_audit.stages.dataflow.values import CONST_NAMES, LN2, LOG2E


@dataclass
class PortModule:
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


def imports_of(body: Sequence[ast.stmt], module: str, into: dict[str, str], deep: bool) -> None:
    nodes = [n for s in body for n in ast_walk(s)] if deep else list(body)
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


def module_name(path: str) -> str:
    p = path[:-3] if path.endswith(".py") else path
    parts = p.split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def const_value(node: ast.expr, consts: dict[str, float]) -> float | None:
    """Numeric value of a small constant expression (ln 2, log2 e and their spellings)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.Name):
        if node.id in consts:
            return consts[node.id]
        if CONST_NAMES.match(node.id):
            return LN2 if "LN" in node.id.upper() and "RCP" not in node.id.upper() and "INV" not in node.id.upper() else LOG2E
    if isinstance(node, ast.Attribute) and node.attr == "e":
        return math.e
    if isinstance(node, ast.BinOp):
        a, b = const_value(node.left, consts), const_value(node.right, consts)
        if a is not None and b is not None:
            if isinstance(node.op, ast.Div) and b:
                return a / b
            if isinstance(node.op, ast.Mult):
                return a * b
    if isinstance(node, ast.Call):
        fname = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        vals = [const_value(a, consts) for a in node.args]
        if vals and all(v is not None and v > 0 for v in vals):
            x = vals[0]
            assert x is not None
            if fname == "log" and len(vals) == 1:
                return math.log(x)
            base = vals[1] if len(vals) == 2 else None
            if fname == "log" and base is not None and base != 1.0:
                return math.log(x, base)
            if fname == "log2":
                return math.log2(x)
            if fname == "tensor":
                return x
    return None


def note_ctor(mod: PortModule, node: ast.AST) -> None:
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
        for n in ast_walk(ann):
            if isinstance(n, ast.Name) and n.id in mod.imports and n.id[:1].isupper() and "Wrapper" in n.id:
                record(last(node.target), mod.imports[n.id])
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "append" and node.args:
        arg = node.args[0]
        if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Name) and arg.func.id in mod.imports and arg.func.id[:1].isupper():
            record(last(node.func.value), mod.imports[arg.func.id])


def load_module(root: Path, path: str) -> PortModule | None:
    try:
        src, tree = cached_parse(root / path)  # shared, read-only tree
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    module = module_name(path)
    imports: dict[str, str] = {}
    imports_of(tree.body, module, imports, deep=False)
    # Guarded imports (try/if at module level) bind names too.
    for stmt in tree.body:
        if isinstance(stmt, ast.Try | ast.If):
            imports_of([stmt], module, imports, deep=True)
    functions = {s.name: s for s in tree.body if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)}
    classes = {s.name: s for s in tree.body if isinstance(s, ast.ClassDef)}
    consts: dict[str, float] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            v = const_value(stmt.value, consts)
            if v is not None:
                consts[stmt.targets[0].id] = v
    mod = PortModule(path, module, tree, src.splitlines(), imports, functions, classes, {}, {}, consts, {})
    for cls in classes.values():  # dataclass-style fields: `prefill_main: Wrapper | None = None`
        for stmt in cls.body:
            if isinstance(stmt, ast.AnnAssign):
                note_ctor(mod, stmt)
    # One walk per function: its lazy imports (kept for the walker) and, for methods, the
    # `self.x = ...` assignments that later resolve `self.x(...)` and `self.x.run(...)`.
    owners: list[tuple[str | None, ast.FunctionDef | ast.AsyncFunctionDef]] = [(None, f) for f in functions.values()]
    owners += [(c, f) for c, cls in classes.items() for f in cls.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)]
    for cname, fn in owners:
        local_imports = dict(imports)
        assigns: list[ast.Assign] = []
        for node in ast_walk(fn):
            if isinstance(node, ast.Import | ast.ImportFrom):
                imports_of([node], module, local_imports, deep=False)
            elif isinstance(node, ast.Assign):
                assigns.append(node)
                note_ctor(mod, node)
            elif isinstance(node, ast.AnnAssign | ast.Call):
                note_ctor(mod, node)
        mod.fn_imports[id(fn)] = local_imports
        if cname is None:
            continue
        attrs = mod.self_attrs.setdefault(cname, {})
        for node in assigns:
            for t in node.targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    attrs.setdefault(t.attr, []).append((node.value, local_imports))
    return mod
