# Rule `claim`: comments that state a capability ("does not support", "supported", "contiguous",
# "cannot", "only ...") paired with the code they sit on, and whether that code enforces them.
from __future__ import annotations

import ast
import bisect
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from metax_audit.core.comments import scan_comments, tokenized_comments
from metax_audit.core.findings import make_finding, rule
from metax_audit.core.models import Category, Discovery, Finding, Location, Severity
from metax_audit.core.pysource import ast_walk, walk_nodes
from metax_audit.stages.checks.memo import FileMemo
from metax_audit.stages.checks.stack import parse_file

rule("MXA140", Category.CLAIM, Severity.INFO, "capability claim is only a comment",
     "The comment states what the code supports, but the statement it sits on neither raises, asserts nor switches "
     "a feature off: nothing stops a caller from using the unsupported case. Enforce it or confirm it with a probe. "
     "Reported only when the comment names a property a probe or a check can decide (dtype, head size, arch, "
     "layout, block size); other claims are not findings.")
rule("MXA141", Category.CLAIM, Severity.INFO, "capability claim is enforced by the code it describes",
     "The statement under the comment raises, asserts or switches the feature off; the evidence names the line.")
rule("MXA142", Category.CLAIM, Severity.WARNING, "comment says a feature is unsupported but the code uses it",
     "A name the comment lists as unsupported is used by code in the same file; either the comment is stale or the "
     "code reaches a path the vendor stack cannot serve.")

# A claim states a capability; the groups keep the matched phrase for the evidence.
_CLAIM = re.compile(
    r"\b(?:(?:does|do|did|will|would|can|could|is|are)\s*(?:not|n't)\s+(?:yet\s+)?(?:support|handle|work|express|be\s+supported)\w*"
    r"|won't\s+support\w*|not\s+(?:yet\s+)?(?:supported|implemented|available)|unsupported|cannot|can't"
    r"|only\s+(?:supports?|works?|handles?|accepts?)|(?:is|are|now|also|fully)\s+supported|supports?\s+only)\b",
    re.IGNORECASE,
)
# "contiguous" is a layout claim when it is stated as a requirement or as a property of the line it
# trails; in a block comment it mostly describes ("contiguous requests", "write to a contiguous buffer").
_LAYOUT = re.compile(
    r"\b(?:(?:must|should|needs?\s+to|has\s+to|have\s+to)\s+be\s+(?:non-)?contiguous"
    r"|(?:requires?|expects?|assumes?)\s+(?:\w+\s+)?(?:non-)?contiguous|(?:is|are)\s+(?:not\s+)?(?:non-)?contiguous)\b",
    re.IGNORECASE,
)
_CONTIGUOUS = re.compile(r"\b(?:non-)?contiguous\b", re.IGNORECASE)
_CONDITION = re.compile(r"\b(?:if|whether|when|unless|so)\b", re.IGNORECASE)
# Calls that adapt the input to a kernel limit ("only supports h_q 64 or 128, so pad"): the claim is handled.
_ADAPT = re.compile(r"(?:^|_)(?:pad|padded|round_down|round_up|align|align_to)(?:_|$)|^pad", re.IGNORECASE)
_NEGATIVE = re.compile(r"not|n't|unsupported|cannot|can't", re.IGNORECASE)
# Names a negative claim lists: `backticked` identifiers, or bullet items ("- Name", "* name").
_IDENT = re.compile(r"`([A-Za-z_][\w.]*)`|(?:^|\s)[-*]\s+([A-Za-z_][\w.]*)\b(?=\s|$)")
# Properties a claim can name that a check or probe can decide; a claim naming none of them is prose.
_CHECKABLE = (
    ("dtype", re.compile(r"\b(?:k?v?_?cache_?dtype|dtypes?|fp8\w*|fp4|nvfp4|bf16|bfloat16|fp16|float16|float32|half|int8|uint8|"
                         r"int4|e4m3|e5m2|quantiz\w*)\b", re.IGNORECASE)),
    ("head size", re.compile(r"\bhead[ _-]?(?:size|dim)s?\b|\bh_q\b|\bnum[_ ]heads\b", re.IGNORECASE)),
    ("arch", re.compile(r"\b(?:sm_?\d+\w*|hopper|blackwell|ampere|ada|volta|turing|compute capability|capability)\b", re.IGNORECASE)),
    ("layout", re.compile(r"\b(?:(?:non-)?contiguous|layout|nhd|hnd|stride\w*|transpos\w*|permut\w*)\b", re.IGNORECASE)),
    ("block size", re.compile(r"\b(?:block|page)[ _-]?sizes?\b|\bpage_size\b|\bblock_size\b", re.IGNORECASE)),
)


def checkable_property(text: str) -> str:
    """The property a claim names that a check or probe can decide, or ""."""
    for name, pattern in _CHECKABLE:
        m = pattern.search(text)
        if m:
            return f"{name} ({m.group(0)})"
    return ""


_FENCE = re.compile(r"[-=_~/\\|<>*]{3,}")
_SPAN = 25  # lines of the paired statement inspected for enforcement


@dataclass(frozen=True)
class Claim:
    line: int  # first comment line
    end: int  # last comment line
    text: str
    phrase: str
    trailing: bool


def _comments(source: str, tree: ast.Module | None = None) -> list[tuple[int, str, bool]]:
    """(line, text, whether code precedes it on its line) of every comment, as tokenize reports them
    (comments.read_comments' reading: a scan of a parsed source, else tokenize)."""
    scanned = scan_comments(source) if tree is not None else None
    comments = scanned[0] if scanned is not None else tokenized_comments(source)[0]
    return sorted((c.line, c.text, c.trailing) for c in comments.values())


def _is_code(text: str) -> bool:
    """Commented-out code is not a claim (`# return use_cascade(*args)`)."""
    if not any(c in text for c in "()=[]"):
        return False
    try:
        ast.parse(text)
    except SyntaxError:
        return False
    return True


def claims_in(source: str, tree: ast.Module | None = None) -> list[Claim]:
    blocks: list[list[tuple[int, str, bool]]] = []
    for line, text, trailing in _comments(source, tree):
        if not trailing and blocks and not blocks[-1][-1][2] and blocks[-1][-1][0] == line - 1:
            blocks[-1].append((line, text, trailing))
        else:
            blocks.append([(line, text, trailing)])
    out = []
    for block in blocks:
        texts = [_FENCE.sub(" ", t).strip() for _, t, _ in block if t and not _is_code(t) and "http" not in t and "SPDX" not in t]
        texts = [t for t in texts if t]
        joined = " ".join(texts)
        m = _first_claim(joined, trailing=block[0][2])
        if m:
            out.append(Claim(block[0][0], block[-1][0], joined, m.group(0), block[0][2]))
    return out


def _first_claim(text: str, trailing: bool) -> re.Match[str] | None:
    """The first phrase that states a capability; one inside a condition or purpose clause ("check if
    X is supported", "when TRTLLM is not supported, fall back", "so the two cannot drift") describes
    a branch, not what the code supports."""
    patterns = [_CLAIM, _LAYOUT] + ([_CONTIGUOUS] if trailing else [])
    found = sorted((m for p in patterns for m in p.finditer(text)), key=lambda m: m.start())
    for m in found:
        clause = re.split(r"[.;:,()]", text[: m.start()])[-1]
        if not _CONDITION.search(clause):
            return m
    return None


def _statements(tree: ast.Module) -> list[tuple[int, int, int, ast.stmt]]:
    """(first line, end line, breadth-first rank, stmt) of every statement, sorted by first line."""
    out = []
    for rank, node in enumerate(n for n in walk_nodes(tree) if isinstance(n, ast.stmt)):
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        out.append((first, node.end_lineno or node.lineno, rank, node))
    out.sort(key=lambda t: (t[0], t[2]))
    return out


def _statement_after(stmts: list[tuple[int, int, int, ast.stmt]], claim: Claim) -> ast.stmt | None:
    """The statement a comment describes: the innermost one on its line (trailing comment) or
    the outermost one starting first below it."""
    if claim.trailing:
        holding = [t for t in stmts if t[0] <= claim.line <= t[1]]
        return max(holding, key=lambda t: (t[0], t[2]))[3] if holding else None
    i = bisect.bisect_right([t[0] for t in stmts], claim.end)
    return stmts[i][3] if i < len(stmts) else None


def _enforcement(stmt: ast.stmt, claim: Claim) -> tuple[int, str] | None:
    """(line, what) of a raise, assert or feature switch within the statement, else None."""
    limit = stmt.lineno + _SPAN
    contiguous = "contiguous" in claim.phrase.lower()
    for node in ast_walk(stmt):
        line = getattr(node, "lineno", 0)
        if line > limit:
            continue
        if isinstance(node, ast.Raise):
            return line, "raise " + (ast.unparse(node.exc)[:80] if node.exc else "")
        if isinstance(node, ast.Assert):
            return line, "assert " + ast.unparse(node.test)[:80]
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Constant) and node.value.value in (False, None):
            return line, f"return {node.value.value!r} (feature switched off)"
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Constant) \
                and node.value.value in (True, False, None, 0) and not contiguous:
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            return line, f"{ast.unparse(target)} = {node.value.value!r} (switch)"
        if contiguous and isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in {"contiguous", "is_contiguous"}:
            return line, ast.unparse(node)[:80]
        if isinstance(node, ast.Call) and _ADAPT.search(ast.unparse(node.func).rsplit(".", 1)[-1]):
            return line, ast.unparse(node)[:80] + " (adapts the input to the limit)"
    return None


def _uses(tree: ast.Module) -> dict[str, list[int]]:
    uses: dict[str, list[int]] = {}
    for node in walk_nodes(tree):
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        if name and isinstance(node, ast.Name | ast.Attribute):
            uses.setdefault(name, []).append(node.lineno)
        elif isinstance(node, ast.alias):
            uses.setdefault(node.name.split(".")[-1], []).append(node.lineno)
    return uses


def check_claims(discovery: Discovery, memo: FileMemo | None = None) -> Iterator[Finding]:
    """Each file's claims are a function of its path and bytes alone: kept per file in `memo`."""
    for f in discovery.files:
        if f.parse_error is not None:
            continue
        full = discovery.root / f.path
        if memo is None:
            yield from _claims_of(f.path, full)
        else:
            yield from memo.get(f.path, ("claims",), partial(_claims_of, f.path, full))


def _claims_of(path: str, full: Path) -> list[Finding]:
    tree = parse_file(str(full))
    if tree is None:
        return []
    return list(_file_claims(path, full.read_text(encoding="utf-8", errors="replace"), tree))


def _file_claims(path: str, source: str, tree: ast.Module) -> Iterator[Finding]:
    lines = source.splitlines()
    uses: dict[str, list[int]] | None = None
    stmts = _statements(tree)
    for claim in claims_in(source, tree):
        listed = ""
        stmt = _statement_after(stmts, claim)
        comment = f"comment: {path}:{claim.line}: # {claim.text[:200]}"
        loc = Location(path, claim.line, f"claim:{claim.phrase.lower()}")
        if _NEGATIVE.search(claim.phrase):
            uses = uses if uses is not None else _uses(tree)
            # only what follows the phrase is its object ("does not support: - A"); "`k` cannot
            # handle unaligned starts" limits k, it does not declare k unsupported
            after = claim.text[claim.text.find(claim.phrase) + len(claim.phrase):]
            named = {a or b for a, b in _IDENT.findall(after)}
            used = {n: [ln for ln in uses.get(n.split(".")[-1], []) if not claim.line <= ln <= claim.end]
                    for n in named}
            used = {n: ls for n, ls in used.items() if ls}
            if named and not used:
                listed = f"names listed as unsupported ({', '.join(sorted(named))}) are not used by code in {path}"
            if used:
                ev = [comment, *(f"used: {path}:{ln}: {lines[ln - 1].strip()}" for n in sorted(used) for ln in used[n][:3])]
                yield make_finding("MXA142", loc, f"comment says {', '.join(sorted(used))} unsupported ({claim.phrase!r}), but code uses it", ev)
                continue
        prop = checkable_property(claim.text)
        if stmt is None:
            if prop:
                yield make_finding("MXA140", loc, f"claim {claim.phrase!r} has no code under it", [comment, f"names {prop}"])
            continue
        code = f"code: {path}:{stmt.lineno}: {lines[stmt.lineno - 1].strip()}"
        enforced = _enforcement(stmt, claim)
        if enforced is None:
            if prop:  # a claim about nothing a check can decide is prose, not a finding
                yield make_finding("MXA140", loc, f"claim {claim.phrase!r} is not enforced by the code it describes (line {stmt.lineno})",
                                   [comment, code, f"names {prop}", *([listed] if listed else [])])
        else:
            line, what = enforced
            yield make_finding("MXA141", loc, f"claim {claim.phrase!r} enforced at line {line}: {what}",
                               [comment, code, f"enforced: {path}:{line}: {lines[line - 1].strip()}"])
