# The platform module's backend priority lists and the config switches it sets.
from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from metax_audit.core.models import ConfigSwitch, Location, PriorityList
from metax_audit.core.pysource import ParsedSource, ast_walk, comments
from metax_audit.stages.discover.registrations import _member

# ------------------------------------------------------------------ platform: priorities and switches


def _branches(body: list[ast.stmt], conds: tuple[str, ...], else_text: str | None) -> Iterator[tuple[ast.stmt, tuple[str, ...]]]:
    """Every statement with the conditions that guard it, outermost first (not into nested defs)."""
    for stmt in body:
        yield stmt, conds
        if isinstance(stmt, ast.If):
            test = ast.unparse(stmt.test)
            yield from _branches(stmt.body, (*conds, test), else_text)
            if stmt.orelse:
                negated = else_text if else_text is not None else f"not ({test})"
                if len(stmt.orelse) == 1 and isinstance(stmt.orelse[0], ast.If):
                    yield from _branches(stmt.orelse, conds, else_text)  # elif: its own test says it
                else:
                    yield from _branches(stmt.orelse, (*conds, negated), else_text)
        elif isinstance(stmt, ast.For | ast.AsyncFor | ast.While | ast.With | ast.AsyncWith):
            yield from _branches(stmt.body, conds, else_text)
            yield from _branches(getattr(stmt, "orelse", []), conds, else_text)
        elif isinstance(stmt, ast.Try):
            for block in (stmt.body, stmt.orelse, stmt.finalbody, *[h.body for h in stmt.handlers]):
                yield from _branches(block, conds, else_text)
        elif isinstance(stmt, ast.Match):
            subject = ast.unparse(stmt.subject)
            for case in stmt.cases:
                yield from _branches(case.body, (*conds, f"{subject} matches {ast.unparse(case.pattern)}"), else_text)


def _functions(tree: ast.Module) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast_walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


_COMMENTED_MEMBER = re.compile(r"^(?:[A-Za-z_]\w*\.)+([A-Z][A-Z0-9_]*)\s*,?\s*$")


def _is_backend_list(node: ast.expr) -> bool:
    return isinstance(node, ast.List) and all(isinstance(e, ast.Attribute) for e in node.elts)


def _priorities(src: ParsedSource) -> tuple[PriorityList, ...]:
    if src.tree is None or src.text is None:
        return ()
    notes = comments(src.text)
    out: list[PriorityList] = []
    for func in _functions(src.tree):
        if "priorit" not in func.name.lower():
            continue
        for stmt, conds in _branches(func.body, (), "else"):
            value = stmt.value if isinstance(stmt, ast.Return | ast.Assign | ast.AnnAssign) else None
            if value is None or not _is_backend_list(value):
                continue
            assert isinstance(value, ast.List)
            end = value.end_lineno or value.lineno
            dropped = tuple(m.group(1) for line in range(value.lineno, end + 1)
                            if (m := _COMMENTED_MEMBER.match(notes.get(line, ""))))
            if not value.elts and not dropped:
                continue
            out.append(PriorityList(condition=" / ".join(conds), members=tuple(_member(e) for e in value.elts),
                                    location=Location(src.path, value.lineno, func.name), commented_out=dropped))
    return tuple(out)


_SWITCH_FUNC = re.compile(r"config|update|override", re.IGNORECASE)
_SWITCH_ATTR = re.compile(r"^(disable|enable|use|force|skip|allow)_")


def _switch_value(value: ast.expr) -> bool:
    if isinstance(value, ast.Constant):
        return True
    if isinstance(value, ast.UnaryOp) and isinstance(value.operand, ast.Constant):
        return True
    if isinstance(value, ast.Attribute) and value.attr.isupper():  # an enum member: Enum.FLASH_ATTN
        return True
    return isinstance(value, ast.Tuple | ast.List) and all(isinstance(e, ast.Constant) for e in value.elts)


def _switches(src: ParsedSource) -> tuple[ConfigSwitch, ...]:
    if src.tree is None:
        return ()
    out: list[ConfigSwitch] = []
    for func in _functions(src.tree):
        if not _SWITCH_FUNC.search(func.name):
            continue
        for stmt, conds in _branches(func.body, (), None):
            if isinstance(stmt, ast.Assign):
                targets, value = stmt.targets, stmt.value
            elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                targets, value = [stmt.target], stmt.value
            else:
                continue
            for target in targets:
                if not isinstance(target, ast.Attribute):
                    continue
                if _switch_value(value) or _SWITCH_ATTR.match(target.attr):
                    out.append(ConfigSwitch(target=ast.unparse(target), value=ast.unparse(value),
                                            condition=" / ".join(conds),
                                            location=Location(src.path, stmt.lineno, func.name)))
    return tuple(out)
