# Reading Python sources of a snapshot safely: module <-> path mapping, size-limited decoding
# and parsing that turns every failure into a recorded reason, and the comments ast drops.
from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib.util import decode_source
from pathlib import Path, PurePosixPath

TOO_LARGE = "too large"  # prefix of SourceFile.parse_error for files skipped by size, not broken


@dataclass(frozen=True)
class ParsedSource:
    """One file read from the snapshot: its text and tree, or why there are none."""

    path: str
    text: str | None
    tree: ast.Module | None
    error: str | None
    lines: int = 0


def module_name(rel_path: str) -> str:
    """Dotted module of a repo-relative .py path; "" when not importable by name."""
    p = PurePosixPath(rel_path)
    if p.suffix != ".py":
        return ""
    parts = list(p.with_suffix("").parts)
    if parts and parts[-1] == "__init__":
        parts.pop()
    if not parts or not all(part.isidentifier() for part in parts):
        return ""
    return ".".join(parts)


def module_paths(module: str) -> tuple[str, str]:
    """The two repo-relative files that can hold `module`, in import order: a package wins over a module."""
    base = module.replace(".", "/")
    return f"{base}/__init__.py", f"{base}.py"


def find_module(root: Path, module: str) -> str | None:
    for candidate in module_paths(module):
        if (root / candidate).is_file():
            return candidate
    return None


def resolve_relative(importer_module: str, is_package: bool, level: int, target: str | None) -> str:
    """Absolute module named by `from <level dots><target> import ...` inside `importer_module`."""
    if level == 0:
        return target or ""
    parts = importer_module.split(".") if importer_module else []
    package = parts if is_package else parts[:-1]
    if level - 1 > len(package):
        return ""  # beyond the top-level package: Python raises ImportError here
    base = package[: len(package) - (level - 1)]
    if target:
        base = [*base, *target.split(".")]
    return ".".join(base)


def read_text(root: Path, rel_path: str, max_bytes: int) -> tuple[str | None, str | None]:
    """(text, None) or (None, why not): size, permission and encoding problems never raise."""
    full = root / rel_path
    try:
        size = full.stat().st_size
        if size > max_bytes:
            return None, f"{TOO_LARGE}: {size} bytes > max_file_bytes {max_bytes}"
        raw = full.read_bytes()
    except OSError as exc:
        return None, f"unreadable: {exc.strerror or exc}"
    try:
        # decode_source honours PEP 263 coding cookies, like the interpreter would.
        return decode_source(raw), None
    except (UnicodeDecodeError, SyntaxError, LookupError) as exc:
        return None, f"not decodable: {exc}"


def parse_text(rel_path: str, text: str | None, error: str | None) -> ParsedSource:
    if text is None:
        return ParsedSource(rel_path, None, None, error)
    lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
    try:
        tree = ast.parse(text, filename=rel_path)
    except SyntaxError as exc:
        return ParsedSource(rel_path, text, None, f"SyntaxError: {exc.msg} (line {exc.lineno})", lines)
    except (ValueError, RecursionError, MemoryError) as exc:
        return ParsedSource(rel_path, text, None, f"{type(exc).__name__}: {exc}", lines)
    return ParsedSource(rel_path, text, tree, None, lines)


def check_source(rel_path: str, text: str | None, error: str | None) -> ParsedSource:
    """Like parse_text without the tree: compiling to bytecode checks the same syntax about four
    times faster than building Python AST objects, for files nothing else needs a tree of."""
    if text is None:
        return ParsedSource(rel_path, None, None, error)
    lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
    try:
        compile(text, rel_path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return ParsedSource(rel_path, text, None, f"SyntaxError: {exc.msg} (line {exc.lineno})", lines)
    except (ValueError, RecursionError, MemoryError) as exc:
        return ParsedSource(rel_path, text, None, f"{type(exc).__name__}: {exc}", lines)
    return ParsedSource(rel_path, text, None, None, lines)


def read_source(root: Path, rel_path: str, max_bytes: int) -> ParsedSource:
    """Decode and parse one file; size, encoding and syntax problems become `error`, never raise."""
    return parse_text(rel_path, *read_text(root, rel_path, max_bytes))


def comments(text: str) -> dict[int, str]:
    """Line -> comment text (without '#'), read with tokenize because ast drops comments."""
    found: dict[int, str] = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                found[tok.start[0]] = tok.string[1:].strip()
    except (tokenize.TokenError, SyntaxError, IndentationError):
        pass  # comments read up to the error are still useful evidence
    return found


# Import statements found textually: parsing every file of a large port only to list its imports
# costs most of discover's time, while a line scan is ~50x faster. It accepts (rare) false
# positives from import-shaped lines inside string literals; it sees lazy (indented) imports.
_IMPORT_RE = re.compile(
    r"^[ \t]*(?:from[ \t]+(?P<mod>\.*[\w.]*)[ \t]+import[ \t]*(?P<names>\([^)]*\)|(?:[^\n\\]|\\\n)*)"
    r"|import[ \t]+(?P<plain>(?:[^\n\\;#]|\\\n)*))",
    re.MULTILINE,
)


@dataclass(frozen=True)
class ImportStmt:
    line: int
    level: int  # leading dots of a relative import; 0 for absolute
    module: str | None  # "a.b" of `from a.b import x`; None for `from . import x` and `import a.b`
    names: tuple[str, ...]  # imported names (`from`), or the dotted modules (`import`)


def _names(text: str) -> tuple[str, ...]:
    text = re.sub(r"#[^\n]*", "", text).replace("\\\n", " ").strip().strip("()")
    out = []
    for part in text.split(","):
        words = part.split()
        if words and (words[0] == "*" or all(w.isidentifier() for w in words[0].split("."))):
            out.append(words[0])
    return tuple(out)


def line_numbers(text: str, offsets: Iterable[int]) -> Iterator[int]:
    """1-based line of each (ascending) offset, counting newlines once over the text."""
    line, pos = 1, 0
    for offset in offsets:
        line += text.count("\n", pos, offset)
        pos = offset
        yield line


def scan_imports(text: str) -> list[ImportStmt]:
    found: list[ImportStmt] = []
    matches = list(_IMPORT_RE.finditer(text))
    for m, line in zip(matches, line_numbers(text, (m.start() for m in matches)), strict=True):
        if m.group("plain") is not None:
            found.append(ImportStmt(line, 0, None, _names(m.group("plain"))))
            continue
        spec = m.group("mod")
        level = len(spec) - len(spec.lstrip("."))
        found.append(ImportStmt(line, level, spec[level:] or None, _names(m.group("names"))))
    return found
