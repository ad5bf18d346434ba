# Rule `graph-capture` (static): host synchronisation, Python branches on tensor values and
# per-call allocations inside the forward path of a backend that declares cudagraph capture support.
from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from metax_audit.core.findings import make_finding, rule
from metax_audit.core.models import BackendChain, Category, Discovery, Finding, Location, Severity, TraceResult
from metax_audit.core.pysource import ast_children, ast_walk
from metax_audit.stages.checks.memo import FileMemo
from metax_audit.stages.checks.stack import parse_file, source_line

rule("MXA130", Category.GRAPH_CAPTURE, Severity.WARNING, "host synchronisation inside a path the backend declares capturable",
     "`.item()`, `.tolist()`, `.cpu()`, `.numpy()` or a synchronize copy device data to the host: under CUDA graph "
     "capture this raises (or bakes the captured value into every replay). Move it to the metadata builder.")
rule("MXA131", Category.GRAPH_CAPTURE, Severity.WARNING, "Python branch on a tensor value inside a path the backend declares capturable",
     "The condition needs the tensor's value on the host: a sync during capture, and replay keeps the branch taken "
     "at capture time whatever the new inputs say.")
rule("MXA132", Category.GRAPH_CAPTURE, Severity.INFO, "per-call buffer allocation inside a path the backend declares capturable",
     "Allocations during capture come from the graph's private pool and are fixed at replay; that is fine for "
     "scratch, but a buffer a kernel's plan() stored a pointer to, or one the host fills, must be persistent.")

_SYNC_METHODS = {"item", "tolist", "cpu", "numpy", "synchronize"}
_VALUE_METHODS = {"item", "any", "all", "sum", "max", "min", "equal", "allclose", "nonzero", "count_nonzero", "tolist"}
_ALLOCATORS = {"empty", "zeros", "ones", "full", "empty_like", "zeros_like", "ones_like", "full_like", "arange",
               "tensor", "empty_strided", "rand", "randn", "new_empty", "new_zeros", "new_ones", "new_full"}
# Branch words that mean the code already knows about capture, or is a path capture never takes.
_CAPTURE_AWARE = ("capturing", "cuda_graph", "cudagraph", "is_cuda_graph")
_NOT_CAPTURED = ("prefill",)


def capturable(level: str | None) -> bool:
    """A declared support level other than NEVER (as written: `AttentionCGSupport.UNIFORM_BATCH`, ...)."""
    if not level or not level.strip():
        return False
    words = {t for t in re.split(r"[^A-Za-z0-9_]+", level) if t.isupper()}
    return words != {"NEVER"}


@dataclass(frozen=True)
class _Hit:
    rule: str
    line: int
    what: str
    branch: str


def _func_at(tree: ast.Module, line: int, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    best = None
    for node in ast_walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            if first <= line <= node.lineno and node.name == name:
                return node
            if node.name == name and best is None:
                best = node
    return best


def _scan(func: ast.AST) -> list[_Hit]:
    hits: list[_Hit] = []

    def visit(node: ast.AST, conds: tuple[str, ...]) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) and node is not func:
            return  # nested definitions run later (or never); not this call's path
        if isinstance(node, ast.If | ast.While | ast.Assert | ast.IfExp):
            test = node.test
            if any((isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr in _VALUE_METHODS)
                   or (isinstance(c, ast.Call) and ast.unparse(c.func) in {"torch.any", "torch.all", "torch.equal", "torch.allclose"})
                   for c in ast_walk(test)):
                hits.append(_Hit("MXA131", node.lineno, ast.unparse(test)[:120], " / ".join(conds)))
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in _SYNC_METHODS and not (f.attr == "cpu" and node.args):
                hits.append(_Hit("MXA130", node.lineno, ast.unparse(node)[:120], " / ".join(conds)))
            elif isinstance(f, ast.Attribute) and f.attr in _ALLOCATORS and (
                    ast.unparse(f.value) == "torch" or f.attr.startswith("new_")):
                hits.append(_Hit("MXA132", node.lineno, ast.unparse(node)[:120], " / ".join(conds)))
        if isinstance(node, ast.If):
            cond = ast.unparse(node.test)[:80]
            visit(node.test, conds)
            for stmt in node.body:
                visit(stmt, (*conds, cond))
            for stmt in node.orelse:
                visit(stmt, (*conds, f"not ({cond})"))
            return
        for child in ast_children(node):
            visit(child, conds)

    visit(func, ())
    return hits


def _module_files(discovery: Discovery) -> dict[str, str]:
    return {f.module: f.path for f in discovery.files if f.module and f.parse_error is None}


def _locate(dotted: str, modules: dict[str, str], root: Path) -> tuple[str, ast.AST] | None:
    """The port function a resolved dotted name points at: (repo-relative path, def node)."""
    parts = dotted.split(".")
    for i in range(len(parts) - 1, 0, -1):
        path = modules.get(".".join(parts[:i]))
        if path is None:
            continue
        node: ast.AST | None = parse_file(str(root / path))
        if node is None:
            return None
        for name in parts[i:]:
            body = getattr(node, "body", [])
            found = next((n for n in body if isinstance(n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name), None)
            if found is None:
                return None
            node = found
        return (path, node) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) else None
    return None


def _functions(backend: BackendChain, discovery: Discovery, trace: TraceResult) -> list[tuple[str, str, ast.AST]]:
    """(path, qualname, def) of each forward hop and the port functions it calls directly."""
    out: list[tuple[str, str, ast.AST]] = []
    modules = _module_files(discovery)
    for hop in backend.chain:
        if hop.role != "forward" or hop.inherited_from:
            continue
        tree = parse_file(str(discovery.root / hop.path))
        if tree is None:
            continue
        func = _func_at(tree, hop.line, hop.qualname.rsplit(".", 1)[-1])
        if func is None:
            continue
        out.append((hop.path, hop.qualname, func))
        for call in [*backend.calls, *trace.calls]:
            if call.caller == hop.qualname and call.origin == "port" and call.resolved:
                found = _locate(call.resolved, modules, discovery.root)
                if found is not None and all(found[1] is not f for _, _, f in out):
                    out.append((found[0], call.resolved, found[1]))
    return out


def check_graph_capture(discovery: Discovery, trace: TraceResult, memo: FileMemo | None = None) -> Iterator[Finding]:
    """The functions come from the trace; what one function does (_scan) is a function of its file's
    bytes and its place there, kept per file in `memo`."""
    seen: set[tuple[str, int, str]] = set()
    for backend in trace.backends:
        if not capturable(backend.capture_support):
            continue
        for path, qualname, func in _functions(backend, discovery, trace):
            place = ("capture-scan", getattr(func, "lineno", 0), getattr(func, "col_offset", 0), getattr(func, "name", ""))
            for hit in memo.get(path, place, partial(_scan, func)) if memo else _scan(func):
                key = (path, hit.line, hit.rule)
                branch = hit.branch.lower()
                if key in seen or any(w in branch for w in _CAPTURE_AWARE):
                    continue
                seen.add(key)
                severity = None
                notes = []
                func_name = qualname.rsplit(".", 1)[-1].lower()
                if any(w in branch or w in func_name for w in _NOT_CAPTURED):
                    severity = Severity.INFO
                    notes.append("on a prefill path: only reached by capture if prefills are captured")
                elif any(c.strip().endswith("is None") for c in hit.branch.split(" / ")):
                    severity = Severity.INFO  # lazy one-time init: runs in the warm-up before capture
                    notes.append("under an `is None` guard: a one-time initialisation, normally done in warm-up before capture")
                evidence = [f"code: {path}:{hit.line}: {source_line(discovery.root, path, hit.line)}",
                            f"backend {backend.name} declares capture support {backend.capture_support}"
                            + (f" at {backend.registered_at}" if backend.registered_at else ""),
                            f"in {qualname}" + (f" under: {hit.branch}" if hit.branch else ""), *notes]
                yield make_finding(hit.rule, Location(path, hit.line, f"{qualname}:{hit.rule}"),
                                   f"{hit.what} in {qualname}, on the forward path of {backend.name} "
                                   f"(capture support {backend.capture_support})", evidence, severity=severity)
