# Rule MXA213: a port call that leaves out a keyword which upstream's counterpart call passes and which
# the port's own other calls of the same kernel pass: the vendor kernel takes it, so that path drops it.
"""The shape this catches (vllm_metax v0.17.0-v0.22.0, flash_attn.py and flash_attn_diffkv.py): a vendor
branch splits one upstream kernel call into several; the new calls pass `s_aux=self.sinks`, and the call left
on upstream's own path (the else branch) lost it, so attention sinks are ignored there. Comparing the union of
keywords per callee (what the per-hunk compare does) cannot see it: another call of the hunk passes s_aux.

Each upstream call of a plain function name is paired with the port call of the same function that matches
it best (the most keyword values and positional arguments written the same; only a strict best match is
paired). A vendor-added call beside the one that mirrors upstream (a stage-1/stage-2 split) is nobody's pair. A keyword
the upstream call passes, its pair leaves out and another port call of the same callee in the same function
passes is reported, unless a comment at the call names it (the port's own explanation)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from metax_audit.core.findings import make_finding, rule
from metax_audit.core.models import Category, Finding, Location, Severity, Site
from metax_audit.core.pysource import ast_children
from metax_audit.stages.checks.memo import FileMemo
from metax_audit.stages.checks.stack import parse_file, source_line

rule("MXA213", Category.UNDECLARED_DIFFERENCE, Severity.WARNING,
     "a call leaves out a keyword that upstream's call and the port's other calls of the same kernel pass",
     "Upstream's call of a kernel function passes a keyword (s_aux=self.sinks), the port's own other calls of the "
     "same function in the same method pass it too, so the vendor build takes it, and the port call that stands "
     "where upstream's call stands (the one matching it best, argument by argument) leaves it out: on that path "
     "the kernel silently runs with the keyword's default (attention sinks ignored, a scale or window not "
     "applied). Pass it as upstream and the other calls do, or write a comment at the call naming the keyword and "
     "why it is left out. The three lines (this call, the port call that passes it, upstream's) are the evidence.")

_COMMENT_REACH = 4  # lines above a call whose comments count as written at it


@dataclass(frozen=True)
class Omission:
    """One port call leaving out keywords its upstream pair and a sibling port call pass (picklable: a memo unit)."""

    function: str  # the qualified name of the function holding both calls
    callee: str
    line: int  # the port call
    keywords: tuple[str, ...]  # left out here, in upstream's order
    sibling: int  # a port call of the same callee passing the first of them (its keyword's line)
    upstream_line: int  # upstream's call (its keyword's line)


def check_omitted_keywords(root: Path, upstream_root: Path | None, counterparts: Mapping[str, str], *,
                           memo: FileMemo | None = None) -> Iterator[Finding]:
    """MXA213 over every compared port file with an upstream counterpart."""
    if upstream_root is None:
        return
    for path, up_path in sorted(counterparts.items()):
        if not path.endswith(".py") or not (upstream_root / up_path).is_file():
            continue
        compute = partial(_file_omissions, root, path, upstream_root, up_path)
        omissions = (memo.get(path, ("omitted-keywords", up_path, memo.digest(upstream_root / up_path)), compute)
                     if memo is not None and memo.enabled else compute())
        for o in omissions:
            yield _finding(root, path, upstream_root, up_path, o)


def _finding(root: Path, path: str, upstream_root: Path, up_path: str, o: Omission) -> Finding:
    names = ", ".join(f"{k}=" for k in o.keywords)
    method = o.function.rsplit(".", 1)[-1]
    message = (f"{method} calls {o.callee} without {names}, which upstream's call passes and the port's own call at "
               f"line {o.sibling} passes too: on this path the kernel runs with its default")
    evidence = [f"port: {path}:{o.line}: {source_line(root, path, o.line)}  (in {o.function}; no {names})",
                f"port passes it: {path}:{o.sibling}: {source_line(root, path, o.sibling)}",
                f"upstream: {up_path}:{o.upstream_line}: {source_line(upstream_root, up_path, o.upstream_line)}"]
    sites = [Site(path, o.line, o.function, "call", source_line(root, path, o.line),
                  upstream=f"{up_path}:{o.upstream_line}", keywords=tuple(f"{o.callee}:-{k}" for k in o.keywords))]
    return make_finding("MXA213", Location(path, o.line, f"omitted:{o.function}:{o.callee}:{','.join(o.keywords)}"),
                        message, evidence, sites=sites)


def _file_omissions(root: Path, path: str, upstream_root: Path, up_path: str) -> tuple[Omission, ...]:
    port, up = parse_file(str(root / path)), parse_file(str(upstream_root / up_path))
    if port is None or up is None:
        return ()
    lines: list[str] | None = None
    out: list[Omission] = []
    theirs = _functions(up)
    for qual, fn in _functions(port).items():
        counterpart = theirs.get(qual)
        if counterpart is None:
            continue
        mine_calls = _calls(fn)
        if all(len(calls) < 2 for calls in mine_calls.values()):
            continue  # a callee called once has no sibling call to compare with: upstream's side is not walked
        up_calls = _calls(counterpart)
        for callee, calls in mine_calls.items():
            if len(calls) < 2 or callee not in up_calls:
                continue
            for found in _pair_omissions(qual, callee, calls, up_calls[callee]):
                if lines is None:
                    try:
                        lines = (root / path).read_text(encoding="utf-8", errors="replace").splitlines()
                    except OSError:
                        lines = []
                call = next(c for c in calls if c.lineno == found.line)
                if not _explained(lines, call, found.keywords):
                    out.append(found)
    return tuple(sorted(set(out), key=lambda o: (o.line, o.callee)))


def _pair_omissions(qual: str, callee: str, calls: list[ast.Call], up_calls: list[ast.Call]) -> Iterator[Omission]:
    for theirs in up_calls:
        wanted = _keywords(theirs)
        scores = sorted(((_likeness(theirs, c), i) for i, c in enumerate(calls)), reverse=True)
        if scores[0][0] == scores[1][0] or scores[0][0] == 0:
            continue  # no strict best match: which port call stands for upstream's is not known
        pair = calls[scores[0][1]]
        passed = _keywords(pair)
        left_out = []
        sibling = 0
        for name in wanted:
            if name in passed:
                continue
            others = [c for c in calls if c is not pair and name in _keywords(c)]
            if others:
                left_out.append(name)
                sibling = sibling or next(k.value.lineno for k in others[0].keywords if k.arg == name)
        if left_out:
            first = left_out[0]
            up_line = next(k.value.lineno for k in theirs.keywords if k.arg == first)
            yield Omission(qual, callee, pair.lineno, tuple(left_out), sibling, up_line)


def _likeness(theirs: ast.Call, mine: ast.Call) -> int:
    """How many of upstream's arguments the port call writes the same (keywords by name and value, positional
    arguments by place)."""
    up_kw = {k.arg: ast.dump(k.value) for k in theirs.keywords}
    same = sum(1 for k in mine.keywords if k.arg in up_kw and up_kw[k.arg] == ast.dump(k.value))
    return same + sum(1 for a, b in zip(theirs.args, mine.args, strict=False) if ast.dump(a) == ast.dump(b))


def _keywords(call: ast.Call) -> dict[str, None]:
    return {k.arg: None for k in call.keywords if k.arg}


def _explained(lines: list[str], call: ast.Call, keywords: tuple[str, ...]) -> bool:
    """A comment at the call (on its lines or just above) names one of the keywords: the port says why."""
    first, last = max(1, call.lineno - _COMMENT_REACH), call.end_lineno or call.lineno
    words = re.compile(r"\b(?:" + "|".join(re.escape(k) for k in keywords) + r")\b")
    return any("#" in text and words.search(text.split("#", 1)[1]) for text in lines[first - 1:last])


def _functions(tree: ast.Module) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """Every function by its qualified name (Class.method, outer.inner)."""
    out: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    todo: list[tuple[list[ast.stmt], str]] = [(tree.body, "")]
    while todo:
        body, prefix = todo.pop()
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                out.setdefault(prefix + node.name, node)
                todo.append((node.body, f"{prefix}{node.name}."))
            elif isinstance(node, ast.ClassDef):
                todo.append((node.body, f"{prefix}{node.name}."))
            elif isinstance(node, ast.If | ast.Try):
                for block in (node.body, node.orelse, *(getattr(h, "body", []) for h in getattr(node, "handlers", []))):
                    todo.append((block, prefix))
    return out


def _calls(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, list[ast.Call]]:
    """The calls of plain function names in a function's body, not entering nested definitions (each is a
    function of its own); a call passing **kwargs is left out (what it passes is not written)."""
    out: dict[str, list[ast.Call]] = {}
    todo: list[ast.AST] = [*fn.body]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and all(k.arg for k in node.keywords):
            out.setdefault(node.func.id, []).append(node)
        todo.extend(ast_children(node))
    for calls in out.values():
        calls.sort(key=lambda c: (c.lineno, c.col_offset))
    return out
