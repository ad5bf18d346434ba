# Calls into a kernel package's compiled module (`self._cached_module.plan(...)`,
# `get_batch_decode_module(...).run(...)`): no Python signature, but the package calls the same function itself.
from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from metax_audit.core.findings import make_finding, rule
from metax_audit.core.models import Category, Discovery, Finding, Location, Severity, StackFacts
from metax_audit.core.pysource import walk_nodes
from metax_audit.stages.checks.memo import FileMemo
from metax_audit.stages.checks.stack import parse_file, source_line

rule("MXA112", Category.SIGNATURE, Severity.ERROR, "call into a kernel package's compiled module does not match how the package calls it",
     "The callee is a function of a compiled (JIT or extension) module, which has no Python signature, but the installed "
     "kernel package (or the public base of its pinned vendor build) calls the same function of the same module itself: "
     "those calls are the contract. The port passes a number of positional arguments, or keywords, that none of the "
     "package's own calls passes: the compiled function raises TypeError (a pybind or torch op signature has no "
     "defaults to absorb an extra or a missing argument). The evidence lists the package's calls.")


@dataclass(frozen=True)
class CompiledCall:
    """One call of a compiled module's function: `<receiver>.<method>(...)`."""

    path: str  # repo-relative in the port; absolute in the package
    line: int
    receiver: str  # "_cached_module" (an attribute holding the module) or "get_batch_decode_module()"
    method: str
    positional: int
    keywords: tuple[str, ...]
    starred: bool  # *args or **kwargs: the count is not known


def _receiver(node: ast.expr) -> str | None:
    """The compiled-module shapes: an attribute named like a module (`self._cached_module`, `self._jit_module`), or
    a call of a module getter (`get_batch_decode_module(...)`, `gen_x_module(...)`)."""
    if isinstance(node, ast.Attribute) and node.attr.endswith("_module"):
        return node.attr
    if isinstance(node, ast.Call):
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        if name.startswith(("get_", "gen_", "load_")) and name.endswith("_module"):
            return f"{name}()"
    return None


def compiled_calls(tree: ast.AST, path: str) -> list[CompiledCall]:
    out = []
    for node in walk_nodes(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        recv = _receiver(node.func.value)
        if recv is None:
            continue
        starred = any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords)
        out.append(CompiledCall(path, node.lineno, recv, node.func.attr, len(node.args),
                                tuple(sorted(k.arg for k in node.keywords if k.arg)), starred))
    return out


def _file_calls(root: Path, rel: str) -> list[CompiledCall]:
    tree = parse_file(str(root / rel))
    return compiled_calls(tree, rel) if tree is not None else []


def package_roots(facts: StackFacts | None) -> dict[str, Path]:
    """The kernel packages whose Python sources are readable here (installed, or the public base of a pinned
    vendor build), by top-level name: read from where introspection found their callables."""
    roots: dict[str, Path] = {}
    if facts is None or facts.source.startswith("manifest:"):
        return roots  # a manifest's source paths are on the machine that captured it
    for target, fact in facts.facts.items():
        top = target.split(".")[0]
        if top in roots or not fact.sourcefile:
            continue
        parts = Path(fact.sourcefile).parts
        if top in parts:
            root = Path(*parts[: len(parts) - parts[::-1].index(top)])
            if root.is_dir():
                roots[top] = root
    return roots


class _PackageCalls:
    """The package's own calls of compiled-module functions, read once per review (text filter first)."""

    def __init__(self, roots: dict[str, Path], methods: frozenset[str] = frozenset()) -> None:
        self.roots = roots
        self.methods = methods  # the methods the port calls: only files that call one of them are parsed
        self._calls: dict[str, list[CompiledCall]] = {}

    def of(self, top: str) -> list[CompiledCall]:
        got = self._calls.get(top)
        if got is None:
            got = []
            root = self.roots[top]
            needles = [f".{m}(" for m in self.methods]
            for file in sorted(root.rglob("*.py")):
                try:
                    text = file.read_text(encoding="utf-8", errors="replace")
                except OSError:
                    continue
                if "_module" not in text or (needles and not any(n in text for n in needles)):
                    continue
                try:
                    tree = ast.parse(text)
                except SyntaxError:
                    continue
                got += compiled_calls(tree, str(file))
            self._calls[top] = got
        return got


def _imported_tops(tree: ast.AST) -> set[str]:
    tops: set[str] = set()
    for node in walk_nodes(tree):
        if isinstance(node, ast.Import):
            tops.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            tops.add(node.module.split(".")[0])
    return tops


def check_compiled_calls(discovery: Discovery, facts: StackFacts | None, memo: FileMemo | None = None) -> Iterator[Finding]:
    """One finding per port call of a compiled-module function whose arity or keywords no call of the same
    function in the kernel packages the file imports has (MXA112)."""
    roots = package_roots(facts)
    if not roots:
        return
    per_file: list[tuple[str, list[CompiledCall]]] = []
    for sf in discovery.files:
        if sf.parse_error is not None or not sf.path.endswith(".py"):
            continue
        calls = memo.get(sf.path, ("compiled-calls",), partial(_file_calls, discovery.root, sf.path)) if memo else \
            _file_calls(discovery.root, sf.path)
        if calls:
            per_file.append((sf.path, calls))
    if not per_file:
        return
    package = _PackageCalls(roots, frozenset(c.method for _, calls in per_file for c in calls))
    for path, calls in per_file:
        tree = parse_file(str(discovery.root / path))
        tops = sorted(_imported_tops(tree) & set(roots)) if tree is not None else []
        for call in calls:
            if call.starred:
                continue
            for top in tops:
                theirs = [c for c in package.of(top) if (c.receiver, c.method) == (call.receiver, call.method) and not c.starred]
                if not theirs:
                    continue
                if any(c.positional == call.positional and set(call.keywords) <= set(c.keywords) for c in theirs):
                    break
                yield _finding(discovery.root, call, theirs, top, facts)
                break


def _finding(root: Path, call: CompiledCall, theirs: list[CompiledCall], top: str, facts: StackFacts | None) -> Finding:
    counts = sorted({c.positional for c in theirs})
    dist = ""
    if facts is not None:
        dist = next((f"{f.distribution} {f.version}" for t, f in facts.facts.items() if t.split(".")[0] == top and f.distribution), top)
        stand_in = next((f.stand_in for t, f in facts.facts.items() if t.split(".")[0] == top and f.stand_in), None)
        if stand_in:
            dist += f" (stand-in: {stand_in})"
    what = f"{call.receiver}.{call.method}"
    extra = [k for k in call.keywords if not any(k in c.keywords for c in theirs)]
    problem = (f"passes {call.positional} positional argument(s); the package's own calls pass {', '.join(map(str, counts))}"
               if call.positional not in counts else f"passes keyword(s) {', '.join(extra)} that no call of the package passes")
    ev = [f"port: {call.path}:{call.line}: {source_line(root, call.path, call.line)}"]
    for c in theirs[:6]:
        ev.append(f"{dist or top}: {c.path}:{c.line}: {c.receiver}.{c.method}(... {c.positional} positional"
                  + (f", keywords {', '.join(c.keywords)}" if c.keywords else "") + ")")
    ev.append("the compiled function has no Python signature: the package's own calls are its contract (no defaults to "
              "absorb a differing count)")
    return make_finding("MXA112", Location(call.path, call.line, f"compiled:{what}"),
                        f"{what}(...) {problem}: TypeError in the compiled module", ev)
