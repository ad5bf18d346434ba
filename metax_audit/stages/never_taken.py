# Triage: a binding finding (a call, an import, an attribute read, a name) whose every place lies inside a branch the
# vendor platform never takes has no consequence there: the statement never runs on it. 1e74892^ read
# ops.persistent_topk, which vLLM 0.25.0 does not define, only under `if current_platform.is_cuda() and ...`: False
# on an out-of-tree platform, so the read is info with that branch as its gate, not an error. The branch is judged
# by the same evaluation of the platform class's fixed answers as the compare's (consequence.enclosing_gate), then,
# for tests only a deeper evaluation decides (a port helper, a `self.` flag), by predicates.Evaluator. So is a private
# method the file binds or calls only inside such branches and no other port file names (v0.21.0's MLA prefill
# dispatch: `self._run_prefill_new_tokens = self._run_prefill_new_tokens_trtllm_ragged` under a False helper).
from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from metax_audit.core.models import Finding, Severity
from metax_audit.core.pysource import cached_text, read_source_cached
from metax_audit.stages.compare.consequence import VendorPlatform, _short, constant

if TYPE_CHECKING:
    from metax_audit.stages.compare.predicates import Evaluator

# The rules whose consequence happens where their statement runs: the calls bound against a signature or an op, the
# imports, the attribute reads and the names read. Claims, graph capture and registrations hold whatever path runs.
AT_STATEMENT = frozenset({
    *(f"MXA{n}" for n in range(101, 113)),
    *(f"MXA{n}" for n in range(120, 130)),
    "MXA170", "MXA174", "MXA175",
})
_MAX_BYTES = 5_000_000


def demote_never_taken(findings: Sequence[Finding], platform: VendorPlatform, port_root: Path,
                       evaluator: Evaluator | None = None, port_package: str = "") -> list[Finding]:
    """With `evaluator` (the platform's answers followed into the port's helpers), a private method that the port
    binds or calls only inside never-taken branches never runs either: v0.21.0's MLA prefill bound
    `self._run_prefill_new_tokens = self._run_prefill_new_tokens_trtllm_ragged` only under
    `if use_trtllm_ragged_deepseek_prefill():`, False where the platform's is_device_capability_family is."""
    gate_at = _Gates(platform, port_root, evaluator, port_package)
    out = []
    for f in findings:
        if f.severity in (Severity.ERROR, Severity.WARNING) and f.rule in AT_STATEMENT and f.location.line:
            places = dict.fromkeys([(f.location.path, f.location.line), *((s.path, s.line) for s in f.sites if s.line)])
            gates = [gate_at(path, line) for path, line in places]
            if all(gates):
                why = "; ".join(dict.fromkeys(f"{path}:{line}: {gate}" for (path, line), gate in zip(places, gates, strict=True)))
                f = replace(f, severity=Severity.INFO, evidence=(*f.evidence, f"gate: never runs on the vendor platform: {why}"))
        out.append(f)
    return out


class _Gates:
    """The never-taken branch holding a line of a port file ("" when none does, or the file cannot be read)."""

    def __init__(self, platform: VendorPlatform, port_root: Path, evaluator: Evaluator | None = None,
                 port_package: str = "") -> None:
        self._platform, self._root, self._evaluator, self._package = platform, port_root, evaluator, port_package
        self._seen: dict[tuple[str, int], str] = {}
        self._files: list[Path] | None = None

    def __call__(self, path: str, line: int) -> str:
        key = (path, line)
        if key not in self._seen:
            self._seen[key] = self._gate(path, line)
        return self._seen[key]

    def _gate(self, path: str, line: int) -> str:
        full = self._root / path
        if not full.is_file():
            return ""
        tree = read_source_cached(self._root, path, _MAX_BYTES).tree
        if tree is None:
            return ""
        return self._dead_branch(tree, path, line) or self._dead_method(tree, path, line)

    def _dead_method(self, tree: ast.Module, path: str, line: int) -> str:
        """Evidence that `line` sits in a private method of a class that the file binds or calls only inside
        never-taken branches and no other port file names; "" otherwise."""
        if self._evaluator is None or not self._package:
            return ""  # without the evaluator only branches around the line itself are judged
        found = next(((c, m) for c in tree.body if isinstance(c, ast.ClassDef) for m in c.body
                      if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef) and m.lineno <= line <= (m.end_lineno or m.lineno)), None)
        if found is None:
            return ""
        cls, method = found
        name = method.name
        if not name.startswith("_") or name.startswith("__") or method.decorator_list or self._named_elsewhere(name, path):
            return ""
        nodes = list(ast.walk(tree))
        if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "getattr" and len(n.args) >= 2
               and not isinstance(n.args[1], ast.Constant) for n in nodes):
            return ""  # a method looked up by a computed name may run though no literal reference does
        refs = [n for n in nodes if (isinstance(n, ast.Attribute) and n.attr == name) or (isinstance(n, ast.Name) and n.id == name)]
        if not refs:
            return ""  # never named: perhaps reached by a computed name, so not judged
        gates = [self._dead_branch(tree, path, n.lineno) for n in refs]
        if not all(gates):
            return ""
        return (f"inside {cls.name}.{name}, which this file names only in branches never taken there "
                f"({'; '.join(dict.fromkeys(gates))}), and no other port file names it")

    def _named_elsewhere(self, name: str, path: str) -> bool:
        if self._files is None:
            base = self._root / self._package.replace(".", "/")
            self._files = sorted(base.rglob("*.py")) if base.is_dir() else []
        own = (self._root / path).resolve()
        for file in self._files:
            if file.resolve() == own:
                continue
            try:
                if name in cached_text(file):
                    return True
            except (OSError, ValueError):
                return True  # unreadable: cannot say it is not named there
        return False

    def _dead_branch(self, tree: ast.Module, path: str, line: int) -> str:
        """The never-taken `if` holding `line`, or "". Its test is judged by the platform class's fixed answers (as the
        compare judges one), then, with the evaluator, followed into the port's helpers and `self.` flags."""
        module = self._evaluator.module_at(self._root, path) if self._evaluator is not None else None
        for cls, fn, node in _ifs_holding(tree, line):
            known = constant(node.test, self._platform)
            value, why = (known[0], known[1]) if known is not None else (None, "")
            if value is None and module is not None:
                assert self._evaluator is not None
                got = self._evaluator.value(node.test, self._evaluator.scope_in(module, fn, cls))
                value, why = (bool(got.value), "; ".join(got.why)) if got is not None else (None, "")
            if value is None:
                continue
            dead = node.orelse if value else node.body
            if dead and dead[0].lineno <= line <= (dead[-1].end_lineno or dead[-1].lineno):
                return (f"inside `if {_short(ast.unparse(node.test))}` at line {node.lineno} "
                        f"({'else ' if value else ''}never taken there: {why})")
        return ""


def _ifs_holding(tree: ast.Module, line: int) -> list[tuple[ast.ClassDef | None, ast.FunctionDef | ast.AsyncFunctionDef | None, ast.If]]:
    """Each `if` whose lines hold `line`, with the class and function it sits in."""
    out: list[tuple[ast.ClassDef | None, ast.FunctionDef | ast.AsyncFunctionDef | None, ast.If]] = []

    def visit(node: ast.AST, cls: ast.ClassDef | None, fn: ast.FunctionDef | ast.AsyncFunctionDef | None) -> None:
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, ast.stmt) or not (child.lineno <= line <= (child.end_lineno or child.lineno)):
                continue
            if isinstance(child, ast.ClassDef):
                visit(child, child, None)
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(child, cls, child)
            else:
                if isinstance(child, ast.If):
                    out.append((cls, fn, child))
                visit(child, cls, fn)

    visit(tree, None, None)
    return out
