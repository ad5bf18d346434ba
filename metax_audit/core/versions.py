# Branches on the port's version tests, decided for the upstream release under review.
#
# A port that follows two upstream releases at once writes `if vllm_version_is("0.13.0"): <old import>
# else: <new import>`. Against 0.14.0 the first branch never runs: its import is not a break of this
# release. The helper is the port's (config `version-tests` names it and says how it compares the
# installed release with its one literal argument); the release is the one the review reads.
from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable, Mapping

COMPARISONS: dict[str, Callable[[tuple[int, ...], tuple[int, ...]], bool]] = {
    "==": operator.eq, "!=": operator.ne, ">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt,
}
_RELEASE = re.compile(r"v?(\d+(?:\.\d+)*)")


def release(text: str) -> tuple[int, ...] | None:
    """A plain release (0.14.0, v0.14): its numbers, padded to three; None for a pre-, post-, dev or
    local version, whose order against a plain release this module does not guess."""
    m = _RELEASE.fullmatch(text.strip())
    if m is None:
        return None
    parts = tuple(int(p) for p in m.group(1).split("."))
    return parts + (0,) * (3 - len(parts)) if len(parts) < 3 else parts


def _pad(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    n = max(len(a), len(b))
    return a + (0,) * (n - len(a)), b + (0,) * (n - len(b))


def evaluate(test: ast.expr, tests: Mapping[str, str], version: str | None) -> bool | None:
    """The value of a condition made of version-test calls (`f("X")`, `mod.f("X")`), `not`, `and` and
    `or` for the release `version`; None when a part is anything else or a version is not plain."""
    installed = release(version) if version else None
    if installed is None or not tests:
        return None

    def value(node: ast.expr) -> bool | None:
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            inner = value(node.operand)
            return None if inner is None else not inner
        if isinstance(node, ast.BoolOp):
            got = [value(v) for v in node.values]
            if isinstance(node.op, ast.And):
                return False if False in got else (None if None in got else True)
            return True if True in got else (None if None in got else False)
        if isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords:
            name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr if isinstance(node.func, ast.Attribute) else None
            op = tests.get(name or "")
            arg = node.args[0]
            if op in COMPARISONS and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                wanted = release(arg.value)
                if wanted is not None:
                    return COMPARISONS[op](*_pad(installed, wanted))
        return None

    return value(test)


def branch_taken(guard_text: str, tests: Mapping[str, str], version: str | None) -> bool | None:
    """Whether the branch a guard's text names (`if T`, `if not (T)`) runs with `version`."""
    if not guard_text.startswith("if ") or not tests:
        return None
    try:
        test = ast.parse(guard_text[3:], mode="eval").body
    except SyntaxError:
        return None
    return evaluate(test, tests, version)
