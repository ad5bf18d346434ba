# Reads the comments `ast` drops: "Metax Modification" blocks (their span and reason) and the
# comment written immediately above or beside a line, which is how a port declares a change.
from __future__ import annotations

import ast
import re
import tokenize
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from metax_audit.core.pysource import iter_tokens, parse

# Fence decoration around markers: `# /---- Metax Modification ----\`, `# ┌---- ... ----┐`.
_DECORATION = re.compile(r"[\s\-=_*#/\\|<>┌┐└┘│─~+.:\[\]()]+")
_END_WORDS = {"end", "end of modification", "end modification", "end of change", "end change", "stop"}
_BEGIN_WORDS = {"", "begin", "start", "begin modification", "start modification"}
# Characters a closing fence starts with in the bracket styles (`\----`, `└----`).
_CLOSERS = ("\\", "└", "⌞")


@dataclass(frozen=True)
class Comment:
    line: int
    text: str  # without the leading '#', stripped
    trailing: bool  # code precedes it on the same line


@dataclass(frozen=True)
class ModificationBlock:
    start: int  # first line of the block (the opening marker)
    end: int  # last line the block covers (closing marker, or the end of the statement it heads)
    reason: str  # the comment text inside (or after the marker), "" when none was written
    style: str  # "fenced" | "line" | "trailing" | "unterminated"

    def covers(self, first: int, last: int | None = None) -> bool:
        last = first if last is None else last
        return self.start <= last and first <= self.end


@dataclass(frozen=True)
class CommentMap:
    comments: dict[int, Comment]
    blocks: tuple[ModificationBlock, ...]
    code_lines: frozenset[int]  # lines holding code tokens (not comments or blanks)

    def block_for(self, first: int, last: int | None = None) -> ModificationBlock | None:
        for block in self.blocks:
            if block.covers(first, last):
                return block
        return None

    def lines_above(self, line: int) -> list[str]:
        """The run of full-line comments directly above `line` (no blank line between), decoration dropped."""
        texts: list[str] = []
        cur = line - 1
        while cur in self.comments and not self.comments[cur].trailing:
            texts.append(self.comments[cur].text)
            cur -= 1
        return [t for t in reversed(texts) if not is_decoration(t)]

    def comment_above(self, line: int) -> str | None:
        words = self.lines_above(line)
        return " ".join(words) if words else None

    def run_at(self, line: int) -> list[str]:
        """The contiguous run of full-line comments that contains `line`."""
        if line not in self.comments or self.comments[line].trailing:
            return []
        end = line
        while end + 1 in self.comments and not self.comments[end + 1].trailing:
            end += 1
        return self.lines_above(end + 1)

    def trailing_lines(self, first: int, last: int | None = None) -> list[str]:
        last = first if last is None else last
        return [c.text for ln, c in sorted(self.comments.items()) if first <= ln <= last and c.trailing]

    def trailing(self, first: int, last: int | None = None) -> str | None:
        found = self.trailing_lines(first, last)
        return " ".join(found) if found else None

    def comments_in(self, first: int, last: int) -> list[Comment]:
        return [c for ln, c in sorted(self.comments.items()) if first <= ln <= last]


def is_decoration(text: str) -> bool:
    return not _DECORATION.sub("", text)


def has_marker(text: str, markers: Sequence[str]) -> bool:
    low = text.lower()
    return any(m.lower() in low for m in markers)


def _core(text: str, markers: Sequence[str]) -> str:
    """What a marker comment says besides the marker and its fence decoration."""
    low = text
    for m in markers:
        low = re.sub(re.escape(m), " ", low, flags=re.IGNORECASE)
    return _DECORATION.sub(" ", low).strip()


def _is_end(text: str, markers: Sequence[str]) -> bool:
    core = _core(text, markers).lower()
    return core in _END_WORDS or (core.startswith("end ") and len(core) < 30)


def read_comments(source: str, markers: Sequence[str], tree: ast.Module | None = None) -> CommentMap:
    """Read `source`'s comments and the lines holding code (as tokenize reports them) and group its
    marker comments into modification blocks. With `tree` (the source parses) they come from a scan of
    its comments and string literals alone (scan_comments); else from tokenize, up to its first error."""
    scanned = scan_comments(source) if tree is not None else None
    comments, code_lines = scanned if scanned is not None else tokenized_comments(source)
    statements = _statement_spans(source, tree)
    blocks = _group_blocks(comments, frozenset(code_lines), statements, markers)
    return CommentMap(comments, tuple(blocks), frozenset(code_lines))


def tokenized_comments(source: str) -> tuple[dict[int, Comment], set[int]]:
    """Each comment and the lines holding a code token, read by tokenize up to its first error."""
    comments: dict[int, Comment] = {}
    code_lines: set[int] = set()
    skip = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER, tokenize.ENCODING}
    try:
        for tok in iter_tokens(source):
            if tok.type == tokenize.COMMENT:
                line = tok.start[0]
                comments[line] = Comment(line, tok.string.lstrip("#").strip(), trailing=line in code_lines)
            elif tok.type not in skip:
                code_lines.update(range(tok.start[0], tok.end[0] + 1))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass  # keep what was read; the parse error is reported by discover
    return comments, code_lines


# A comment or a string literal, whichever starts first: scanning left to right with these alone finds
# every comment of a file that parses (a '#' inside a literal is consumed with the literal, a quote inside
# a comment with the comment). A prefix (rb, f, ...) is code on the literal's own first line either way.
_COMMENT_OR_STRING = re.compile(
    r"""(#[^\n]*)"""
    r"""|'''(?:[^'\\]|\\.|'(?!''))*'''"""
    r'''|"""(?:[^"\\]|\\.|"(?!""))*"""'''
    r"""|'(?:[^'\\\n]|\\.)*'"""
    r'''|"(?:[^"\\\n]|\\.)*"''',
    re.S,
)
# Line breaks that str.split("\n") and tokenize (or ast's line numbers) count differently.
ODD_LINE_BREAKS = re.compile("[\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


def scan_comments(source: str) -> tuple[dict[int, Comment], set[int]] | None:
    """What tokenize reports of a source that parses, without tokenizing it (tokenize was a sixth of the
    compare): each comment (line, text, whether code precedes it on its line) and the lines that hold a
    code token: a non-blank character outside comments, or any line a multi-line literal spans. None when
    the text has line breaks tokenize counts differently (then tokenize decides). Equal to tokenize's
    answer on every module of four vLLM releases and both ports (tests/test_comments.py holds the shapes)."""
    if ODD_LINE_BREAKS.search(source):
        return None
    found: list[tuple[int, str]] = []
    spans: list[tuple[int, int]] = []  # lines of the multi-line literals
    code_parts: list[str] = []  # the text with every comment cut out
    line, pos, cut = 1, 0, 0
    for m in _COMMENT_OR_STRING.finditer(source):
        start = m.start()
        line += source.count("\n", pos, start)
        pos = start
        comment = m.group(1)
        if comment is not None:
            found.append((line, comment))
            code_parts.append(source[cut:start])
            cut = m.end()
        else:
            breaks = source.count("\n", start, m.end())
            if breaks:
                spans.append((line, line + breaks))
    code_parts.append(source[cut:])
    code_lines = {i for i, text in enumerate("".join(code_parts).split("\n"), 1) if text.strip()}
    for first, last in spans:
        code_lines.update(range(first, last + 1))
    comments = {row: Comment(row, text.lstrip("#").strip(), trailing=row in code_lines) for row, text in found}
    return comments, code_lines


def _statement_spans(source: str, tree: ast.Module | None) -> list[tuple[int, int]]:
    """(start, end) of the outermost statement starting on each line, sorted by start."""
    if tree is None:
        try:
            tree = parse(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return []
    spans: dict[int, int] = {}
    for node in iter_statements(tree.body):
        # The outermost statement starting on a line wins: it is what a comment above heads.
        end = node.end_lineno or node.lineno
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        spans[start] = max(spans.get(start, 0), end)
    return sorted(spans.items())


def _next_statement(line: int, code_lines: frozenset[int], statements: list[tuple[int, int]]) -> tuple[int, int] | None:
    starts = [s for s, _ in statements]
    idx = bisect_right(starts, line)
    if idx < len(statements):
        return statements[idx]
    nxt = min((ln for ln in code_lines if ln > line), default=None)
    return (nxt, nxt) if nxt else None


def _group_blocks(
    comments: dict[int, Comment],
    code_lines: frozenset[int],
    statements: list[tuple[int, int]],
    markers: Sequence[str],
) -> list[ModificationBlock]:
    blocks: list[ModificationBlock] = []
    open_at: int | None = None
    inside: list[str] = []

    def heads_next(start: int, end_line: int, reason: str, style: str) -> None:
        # A block with no code inside is a header: it declares the statement that follows it.
        nxt = _next_statement(end_line, code_lines, statements)
        blocks.append(ModificationBlock(start, nxt[1] if nxt else end_line, reason, style))

    for line in sorted(comments):
        c = comments[line]
        marker = has_marker(c.text, markers)
        if c.trailing:
            if marker and open_at is None:
                blocks.append(ModificationBlock(line, line, _core(c.text, markers), "trailing"))
            elif open_at is not None and not is_decoration(c.text):
                inside.append(c.text)
            continue
        if open_at is not None:
            closing = _is_end(c.text, markers) or (
                marker and (c.text.startswith(_CLOSERS) or not _core(c.text, markers))
            )
            if closing:
                reason = " ".join(inside)
                if not any(open_at < ln < line for ln in code_lines):
                    heads_next(open_at, line, reason, "fenced")
                else:
                    blocks.append(ModificationBlock(open_at, line, reason, "fenced"))
                open_at, inside = None, []
            elif not is_decoration(c.text):
                inside.append(_core(c.text, markers) if marker else c.text)
            continue
        if not marker:
            continue
        core = _core(c.text, markers)
        if core.lower() in _BEGIN_WORDS:
            open_at, inside = line, []
        elif _closed_later(line, comments, markers):  # `# -- Metax Modification: why --` ... `# -- End --`
            open_at, inside = line, [core]
        else:  # `# Metax Modification: reason` on its own line: declares what follows it
            extra: list[str] = []
            ln = line + 1
            while ln in comments and not comments[ln].trailing:
                extra.append(comments[ln].text)
                ln += 1
            heads_next(line, ln - 1, " ".join([core, *[e for e in extra if not is_decoration(e)]]), "line")
    if open_at is not None:
        heads_next(open_at, open_at, " ".join(inside), "unterminated")
    return blocks


def _closed_later(line: int, comments: dict[int, Comment], markers: Sequence[str]) -> bool:
    """True when the next marker-like full-line comment after `line` is a closing fence."""
    for ln in sorted(k for k in comments if k > line):
        c = comments[ln]
        if c.trailing:
            continue
        if _is_end(c.text, markers):
            return True
        if has_marker(c.text, markers):
            return c.text.startswith(_CLOSERS) or not _core(c.text, markers)
    return False


def iter_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement, nested ones included, without visiting expressions (much cheaper than ast.walk)."""
    stack = list(reversed(body))
    while stack:
        node = stack.pop()
        yield node
        children: list[ast.stmt] = []
        for name in ("body", "orelse", "finalbody"):
            value = getattr(node, name, None)
            if isinstance(value, list):
                children.extend(v for v in value if isinstance(v, ast.stmt))
        for handler in getattr(node, "handlers", None) or []:
            children.extend(handler.body)
        for case in getattr(node, "cases", None) or []:
            children.extend(case.body)
        stack.extend(reversed(children))
