# Reading Python sources of a snapshot safely: module <-> path mapping, size-limited decoding
# and parsing that turns every failure into a recorded reason, the comments ast drops, and the
# names a file imports (read by introspect to pick its targets and by the import check).
from __future__ import annotations

import ast
import atexit
import contextlib
import gc
import io
import os
import pickle
import re
import sys
import tokenize
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from importlib.util import decode_source
from pathlib import Path, PurePosixPath

from metax_audit.core.models import ParseProblem, ParseProblemKind

# Expressions nested deeper than this (counting nested expressions within one statement) are cut
# at parse time: the subtree below is replaced by a placeholder name and its line recorded on the
# tree (too_deep_lines), so no stage's recursive walk (ast.unparse, NodeVisitor, deepcopy, our own
# evaluators) meets more than this depth, and the review records "expression too deep to analyse
# at FILE:LINE" as coverage. The deepest expression in 21,701 real files (every cached vLLM
# release, the MetaX port, torch_npu's generated ops) is 50.
EXPR_DEPTH_LIMIT = 100
TOO_DEEP_NAME = "__expression_too_deep__"
_TOO_DEEP_ATTR = "_metax_audit_too_deep"


def parse(text: str, filename: str = "<unknown>") -> ast.Module:
    """ast.parse(text), with expressions deeper than EXPR_DEPTH_LIMIT cut (see prune_deep)."""
    tree = ast.parse(text, filename=filename)
    prune_deep(tree, text)
    return tree


def prune_deep(tree: ast.AST, text: str | None = None, limit: int = EXPR_DEPTH_LIMIT) -> tuple[int, ...]:
    """Replace, in place and without recursion, each expression nested more than `limit` deep inside
    its statement by the name TOO_DEEP_NAME at its position; the lines cut are returned and kept on
    the tree (too_deep_lines). The parts of an f-string are left whole (only a value inside one is cut).

    With the source `text`, a node whose source is at most as long as the depth it could still add
    is not entered (each nested expression takes at least one character of source): on real code
    only the spines of long statements are walked."""
    starts: list[int] | None = None
    if text is not None and "\r" not in text:  # line starts in ast's own line numbering
        starts = [0]
        for text_line in text.split("\n"):
            starts.append(starts[-1] + len(text_line) + 1)
    cut: list[int] = []
    stack: list[tuple[ast.AST, int, int]] = [(tree, 0, 0)]  # (node, expression depth, its statement's line)
    while stack:
        node, depth, line = stack.pop()
        whole = isinstance(node, ast.JoinedStr | ast.FormattedValue)
        for name, value in ast.iter_fields(node):
            children = value if isinstance(value, list) else (value,)
            for i, child in enumerate(children):
                if not isinstance(child, ast.AST) or isinstance(child, ast.Name | ast.Constant):
                    continue  # a leaf adds no depth below itself
                stmt = isinstance(child, ast.stmt)
                d = 0 if stmt else depth + isinstance(child, ast.expr)
                if starts is not None and d + _span(child, starts) <= limit:
                    continue  # too short to nest past the limit
                if d <= limit or not isinstance(child, ast.expr) or whole or isinstance(child, ast.JoinedStr):
                    stack.append((child, d, child.lineno if stmt else line))  # type: ignore[attr-defined]
                    continue
                stand_in = ast.copy_location(ast.Name(id=TOO_DEEP_NAME, ctx=getattr(child, "ctx", None) or ast.Load()), child)
                if isinstance(value, list):
                    value[i] = stand_in
                else:
                    setattr(node, name, stand_in)
                cut.append(line or getattr(child, "lineno", 0))
    lines = tuple(sorted(set(cut)))
    if lines:
        setattr(tree, _TOO_DEEP_ATTR, (*too_deep_lines(tree), *lines))
    return lines


def _span(node: ast.AST, starts: list[int]) -> int:
    """The length of `node`'s source (characters of whole lines, UTF-8 bytes within its first and
    last line: never less than its characters); a large number when it has no position."""
    try:
        end = starts[node.end_lineno - 1] + node.end_col_offset  # type: ignore[attr-defined]
        return end - starts[node.lineno - 1] - node.col_offset  # type: ignore[attr-defined]
    except (AttributeError, TypeError, IndexError):
        return 1 << 30


def too_deep_lines(tree: ast.AST) -> tuple[int, ...]:
    """The lines where prune_deep cut an expression of `tree`."""
    return tuple(getattr(tree, _TOO_DEEP_ATTR, ()))


def unparse_name(node: ast.AST) -> str:
    """Exactly ast.unparse(node) (raising what it raises); a name or a dotted name (`q`, `self.scale`, `meta.seq_lens`: most of the
    arguments the trace records) without ast.unparse's visitor, a fifth of the trace's time on them."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        parts = [node.attr]
        value = node.value
        while isinstance(value, ast.Attribute):
            parts.append(value.attr)
            value = value.value
        if isinstance(value, ast.Name):
            parts.append(value.id)
            return ".".join(reversed(parts))
    return ast.unparse(node)


def dump(node: ast.AST) -> str:
    """ast.dump(node), also for a node nested too deep for ast.dump's recursion (a 2000-term
    `'a' + 'a' + ...`): then the same string is built without recursion."""
    try:
        return _dump(node)
    except RecursionError:
        return dump_iterative(node)


_NONE_DEFAULTS: dict[type, frozenset[str]] = {}  # node class -> its fields whose class default is None


def _dump(node: object) -> str:
    """Exactly ast.dump(node) (annotated fields, no attributes, no indent), about 1.9x faster: the
    same string built without ast.dump's generality (indent, unannotated fields, attributes). The
    compare keys every statement by its dump (a tenth of the compare stage)."""
    if isinstance(node, ast.AST):
        cls = type(node)
        optional = _NONE_DEFAULTS.get(cls)
        if optional is None:
            optional = _NONE_DEFAULTS[cls] = frozenset(n for n in cls._fields if getattr(cls, n, ...) is None)
        args = []
        for name in node._fields:
            try:
                value = getattr(node, name)
            except AttributeError:
                continue
            if value is None and name in optional:
                continue  # an optional field left empty: ast.dump leaves it out
            args.append(f"{name}={_dump(value)}")
        return f"{node.__class__.__name__}({', '.join(args)})"
    if isinstance(node, list):
        return f"[{', '.join([_dump(item) for item in node])}]"
    return repr(node)


def unparse(node: ast.AST) -> str:
    """ast.unparse(node) for display; a node nested too deep for its recursion is shown as a
    placeholder naming its line (the comparison itself uses dump, which is exact)."""
    try:
        return unparse_name(node)
    except RecursionError:
        return f"<expression too deep to show, line {getattr(node, 'lineno', '?')}>"


def dump_iterative(root: ast.AST) -> str:
    """Exactly ast.dump(root) (annotated fields, no attributes, no indent), without recursion."""
    done: list[str] = []
    todo: list[tuple[int, object, object]] = [(0, root, None)]  # (0 visit | 1 node | 2 list, value, extra)
    while todo:
        kind, value, extra = todo.pop()
        if kind == 1:
            names: list[str] = extra  # type: ignore[assignment]
            args = done[len(done) - len(names):] if names else []
            del done[len(done) - len(names):]
            done.append(f"{value}({', '.join(f'{n}={a}' for n, a in zip(names, args, strict=True))})")
        elif kind == 2:
            n: int = extra  # type: ignore[assignment]
            items = done[len(done) - n:]
            del done[len(done) - n:]
            done.append(f"[{', '.join(items)}]")
        elif isinstance(value, ast.AST):
            cls = type(value)
            present: list[tuple[str, object]] = []
            for name in value._fields:
                try:
                    field_value = getattr(value, name)
                except AttributeError:
                    continue
                if field_value is None and getattr(cls, name, ...) is None:
                    continue
                present.append((name, field_value))
            todo.append((1, cls.__name__, [n for n, _ in present]))
            todo.extend((0, v, None) for _, v in reversed(present))
        elif isinstance(value, list):
            if not value:
                done.append("[]")
            else:
                todo.append((2, None, len(value)))
                todo.extend((0, v, None) for v in reversed(value))
        else:
            done.append(repr(value))
    return done[0]


@dataclass(frozen=True)
class ParsedSource:
    """One file read from the snapshot: its text and tree, or why there are none."""

    path: str
    text: str | None
    tree: ast.Module | None
    problem: ParseProblem | None
    lines: int = 0


def always_exits(block: list[ast.stmt]) -> bool:
    """The block always leaves the function: its last statement returns or raises on every path through it
    (an if whose both branches do, a with whose body does). What follows an `if` with such a body runs only when
    its test is false (the trace's branch conditions, discover's selector lists)."""
    if not block:
        return False
    last = block[-1]
    if isinstance(last, ast.Return | ast.Raise):
        return True
    if isinstance(last, ast.If):
        return always_exits(last.body) and always_exits(last.orelse)
    if isinstance(last, ast.With | ast.AsyncWith):
        return always_exits(last.body)
    return False


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


def too_large(size: int, max_bytes: int) -> ParseProblem:
    return ParseProblem(ParseProblemKind.TOO_LARGE, f"too large: {size} bytes > max_file_bytes {max_bytes}")


def _unreadable(exc: OSError) -> ParseProblem:
    return ParseProblem(ParseProblemKind.UNREADABLE, f"unreadable: {exc.strerror or exc}")


def _not_decodable(exc: BaseException) -> ParseProblem:
    return ParseProblem(ParseProblemKind.NOT_DECODABLE, f"not decodable: {exc}")


def _unparsable(exc: BaseException) -> ParseProblem:
    """The parser's verdict on a decoded text: a syntax error (with its line) or a parser limit."""
    if isinstance(exc, SyntaxError):
        return ParseProblem(ParseProblemKind.SYNTAX, f"SyntaxError: {exc.msg} (line {exc.lineno})", exc.lineno or 0)
    return ParseProblem(ParseProblemKind.PARSER_LIMIT, f"{type(exc).__name__}: {exc}")


def read_text(root: Path, rel_path: str, max_bytes: int) -> tuple[str | None, ParseProblem | None]:
    """(text, None) or (None, why not): size, permission and encoding problems never raise."""
    full = root / rel_path
    try:
        size = full.stat().st_size
        if size > max_bytes:
            return None, too_large(size, max_bytes)
        raw = full.read_bytes()
    except OSError as exc:
        return None, _unreadable(exc)
    try:
        # decode_source honours PEP 263 coding cookies, like the interpreter would.
        return decode_source(raw), None
    except (UnicodeDecodeError, SyntaxError, LookupError) as exc:
        return None, _not_decodable(exc)


def parse_text(rel_path: str, text: str | None, error: ParseProblem | None) -> ParsedSource:
    if text is None:
        return ParsedSource(rel_path, None, None, error)
    lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
    try:
        tree = parse(text, filename=rel_path)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return ParsedSource(rel_path, text, None, _unparsable(exc), lines)
    return ParsedSource(rel_path, text, tree, None, lines)


def check_source(rel_path: str, text: str | None, error: ParseProblem | None) -> ParsedSource:
    """Like parse_text without the tree: compiling to bytecode checks the same syntax about four
    times faster than building Python AST objects, for files nothing else needs a tree of."""
    if text is None:
        return ParsedSource(rel_path, None, None, error)
    lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
    try:
        compile(text, rel_path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return ParsedSource(rel_path, text, None, _unparsable(exc), lines)
    return ParsedSource(rel_path, text, None, None, lines)


def read_source(root: Path, rel_path: str, max_bytes: int) -> ParsedSource:
    """Decode and parse one file; size, encoding and syntax problems become `problem`, never raise."""
    return parse_text(rel_path, *read_text(root, rel_path, max_bytes))


def comments(text: str) -> dict[int, str]:
    """Line -> comment text (without '#'), read with tokenize because ast drops comments."""
    found: dict[int, str] = {}
    try:
        for tok in iter_tokens(text):
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


# ---------------------------------------------------------------- one read and one parse per file
# Discover, trace, compare, checks and dataflow all read the same few hundred files; parsing each
# once per process (memoised by absolute path, size and mtime, so an edited file is read again)
# removes most of a review's parse time. Trees handed out are shared: callers must not mutate them.

# Bounded by the size of the sources held (a tree takes about 30 times its text), not by a count of
# files: a count (4,096 before) made a 5,000-file review parse every file anew at each of the ~9
# reads per file, since each stage reads the files in the same order and the oldest went first.
_SOURCE_CACHE_BYTES = 64 * 1024 * 1024  # of decoded text; the least recently read go first beyond it
_SOURCE_BYTES: list[int] = [0]


class _Entry:
    __slots__ = ("decode_error", "parse_error", "stamp", "text", "tree")

    def __init__(self, stamp: tuple[int, int], text: str | None, decode_error: BaseException | None) -> None:
        self.stamp = stamp  # (size in bytes, mtime)
        self.text = text
        self.decode_error = decode_error
        self.tree: ast.Module | None = None
        self.parse_error: BaseException | None = None

    @property
    def size(self) -> int:
        return max(self.stamp[0], 1)


_SOURCES: dict[str, _Entry] = {}
_TOKENS: dict[str, tuple[tuple[tokenize.TokenInfo, ...], BaseException | None]] = {}
_TOKENS_MAX = 512


_EXIT_HOOK: list[bool] = []


def _freeze_at_exit() -> None:
    """At exit the interpreter runs one more full collection over every live object; over the
    cache's millions of syntax-tree nodes that took over a second of a review's wall time.
    gc.freeze() moves them out of the collector's sight first (the OS reclaims the memory)."""
    if not _EXIT_HOOK:
        _EXIT_HOOK.append(True)
        atexit.register(gc.freeze)


def clear_source_cache() -> None:
    """Forget every cached text, tree and token list (tests; long-lived processes)."""
    _SOURCES.clear()
    _SOURCE_BYTES[0] = 0
    _TOKENS.clear()
    _NODES.clear()


def _entry(path: str | Path) -> _Entry:
    key = os.path.abspath(path)
    st = os.stat(key)  # OSError propagates: an unreadable file is the caller's skip
    stamp = (st.st_size, st.st_mtime_ns)
    entry = _SOURCES.pop(key, None)
    if entry is not None:
        _SOURCE_BYTES[0] -= entry.size
        if entry.stamp == stamp:
            _SOURCES[key] = entry  # now the most recently read
            _SOURCE_BYTES[0] += entry.size
            return entry
    with open(key, "rb") as fh:
        raw = fh.read()
    try:
        # Same decoding as the interpreter (PEP 263 cookie, BOM, universal newlines).
        text, error = decode_source(raw), None
    except (UnicodeDecodeError, SyntaxError, LookupError) as exc:
        text = None
        error = exc if isinstance(exc, UnicodeDecodeError) else UnicodeDecodeError("utf-8", b"", 0, 1, str(exc))
    entry = _Entry(stamp, text, error)
    _freeze_at_exit()
    while _SOURCES and _SOURCE_BYTES[0] + entry.size > _SOURCE_CACHE_BYTES:
        _SOURCE_BYTES[0] -= _SOURCES.pop(next(iter(_SOURCES))).size
    _SOURCES[key] = entry
    _SOURCE_BYTES[0] += entry.size
    return entry


def cached_text(path: str | Path) -> str:
    """The decoded text of `path`; raises OSError or UnicodeDecodeError (a ValueError) like read_text."""
    entry = _entry(path)
    if entry.text is None:
        raise entry.decode_error.with_traceback(None)  # type: ignore[union-attr]
    return entry.text


def cached_parse(path: str | Path) -> tuple[str, ast.Module]:
    """(text, tree) of `path`, parsed once per process while the file is unchanged.

    Raises what reading and ast.parse raise (OSError, UnicodeDecodeError, SyntaxError, ValueError,
    RecursionError, MemoryError); a failure is remembered like a success. The tree is shared."""
    entry = _entry(path)
    if entry.text is None:
        raise entry.decode_error.with_traceback(None)  # type: ignore[union-attr]
    if entry.tree is None and entry.parse_error is None:
        key = os.path.abspath(path)
        kept = _kept_tree_file(key)
        entry.tree = _load_kept_tree(kept, entry.stamp) if kept is not None else None
        if entry.tree is None:
            try:
                entry.tree = parse(entry.text, filename=key)
            except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
                entry.parse_error = exc
            if kept is not None and entry.tree is not None:
                _store_kept_tree(kept, entry.stamp, entry.tree)
    if entry.parse_error is not None:
        raise entry.parse_error.with_traceback(None)
    assert entry.tree is not None
    return entry.text, entry.tree


# Parsed trees of a source tree that never changes (a release extracted into the upstream cache) are kept
# beside the cache, like bytecode beside a module: loading one takes about half the time of parsing and
# pruning it again (5.8 vs 12 ms for an 85 KB vLLM module), and a review reads about 170 upstream modules
# in three processes. A kept tree carries the size and mtime of the file it was parsed from and is used
# only while they match; any failure to read or write one is a parse here, never an error.
@lru_cache(maxsize=1)
def _tree_format() -> str:
    """py<major><minor>-<digest of this file>: a tree is what this module's parse() made of its file, so any
    edit of this module (the pruning, the parse) keeps its trees apart, as another Python's ast does."""
    import hashlib

    try:
        with open(__file__, "rb") as fh:
            digest = hashlib.sha256(fh.read()).hexdigest()[:16]
    except OSError:
        digest = f"depth{EXPR_DEPTH_LIMIT}"
    return f"py{sys.version_info[0]}{sys.version_info[1]}-{digest}"


_TREE_STORES: dict[str, Path] = {}  # a source root (absolute, with a trailing separator) -> the folder of its trees


def keep_trees_under(root: Path, store: Path) -> None:
    """Keep the parsed trees of every file under `root` in `store` (both folders; `root` must not change
    while it is registered: an extracted release, whose files are only ever replaced whole)."""
    mine = store / _tree_format()
    if not mine.is_dir() and store.is_dir():  # the first review of another build: its predecessors' trees go
        import shutil

        for other in store.iterdir():
            if other.name.startswith("py") and other.name != mine.name and other.is_dir() and not other.is_symlink():
                shutil.rmtree(other, ignore_errors=True)
    _TREE_STORES[os.path.join(os.path.abspath(root), "")] = mine


def forget_kept_trees() -> None:
    """Stop keeping trees for every registered root (tests)."""
    _TREE_STORES.clear()


def _kept_tree_file(key: str) -> Path | None:
    for root, store in _TREE_STORES.items():
        if key.startswith(root):
            return store / (key[len(root):] + ".pickle")
    return None


def _load_kept_tree(kept: Path, stamp: tuple[int, int]) -> ast.Module | None:
    try:
        with open(kept, "rb") as fh:
            kept_stamp, tree = pickle.load(fh)  # our own cache's bytes, as trusted as its sources
    except Exception:  # none yet, or a truncated or foreign file: parse instead (and write it anew)
        return None
    return tree if kept_stamp == stamp and isinstance(tree, ast.Module) else None


def _store_kept_tree(kept: Path, stamp: tuple[int, int], tree: ast.Module) -> None:
    partial = kept.with_name(f"{kept.name}.{os.getpid()}.tmp")
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        with open(partial, "wb") as fh:
            pickle.dump((stamp, tree), fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(partial, kept)  # a reader sees the whole file or none
    except (OSError, pickle.PicklingError, RecursionError):
        with contextlib.suppress(OSError):
            os.unlink(partial)


def read_source_cached(root: Path, rel_path: str, max_bytes: int) -> ParsedSource:
    """read_source through the process-wide cache: same results, one parse per file."""
    full = root / rel_path
    try:
        size = full.stat().st_size
    except OSError as exc:
        return ParsedSource(rel_path, None, None, _unreadable(exc))
    if size > max_bytes:
        return ParsedSource(rel_path, None, None, too_large(size, max_bytes))
    try:
        text = cached_text(full)
    except OSError as exc:
        return ParsedSource(rel_path, None, None, _unreadable(exc))
    except UnicodeDecodeError as exc:
        return ParsedSource(rel_path, None, None, _not_decodable(exc))
    lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
    try:
        _, tree = cached_parse(full)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return ParsedSource(rel_path, text, None, _unparsable(exc), lines)
    except OSError as exc:
        return ParsedSource(rel_path, None, None, _unreadable(exc))
    return ParsedSource(rel_path, text, tree, None, lines)


def iter_tokens(text: str) -> Iterator[tokenize.TokenInfo]:
    """tokenize.generate_tokens over `text`, tokenized once per distinct text: yields the tokens
    read, then raises the error tokenize stopped at (if any), exactly like the generator would."""
    cached = _TOKENS.get(text)
    if cached is None:
        toks: list[tokenize.TokenInfo] = []
        error: BaseException | None = None
        try:
            for tok in tokenize.generate_tokens(io.StringIO(text).readline):
                toks.append(tok)
        except (tokenize.TokenError, SyntaxError) as exc:  # IndentationError is a SyntaxError
            error = exc
        if len(_TOKENS) >= _TOKENS_MAX:
            _TOKENS.pop(next(iter(_TOKENS)))
        cached = _TOKENS[text] = (tuple(toks), error)
    yield from cached[0]
    if cached[1] is not None:
        raise cached[1].with_traceback(None)


# str.splitlines() breaks lines where tokenize does not: with any of these, line numbers differ.
_ODD_BREAKS = re.compile("[\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


def standalone_comments(text: str, tree: ast.Module) -> dict[int, str] | None:
    """Line -> comment for each line that holds only a comment, as tokenize would report them,
    without tokenizing the whole file: a line starting with '#' is a comment unless it lies
    inside a multi-line string literal, and only those few literals are tokenized to tell.
    None when the text has line breaks that splitlines and tokenize count differently."""
    if _ODD_BREAKS.search(text):
        return None
    lines = text.splitlines()
    found = {i + 1: line.lstrip() for i, line in enumerate(lines) if line.lstrip().startswith("#")}
    if not found:
        return found
    spans = {(n.lineno, n.end_lineno) for n in walk_nodes(tree)
             if isinstance(n, ast.Constant | ast.JoinedStr) and n.end_lineno is not None and n.end_lineno > n.lineno}
    for start, end in spans:
        inside = [row for row in range(start + 1, end + 1) if row in found]
        if not inside:
            continue
        if any(s < start <= e for s, e in spans):
            return None  # the literal's first line ends another literal: tokenize the file instead
        # Implicitly concatenated pieces ("a"\n# note\n"b") are one node around a real comment:
        # tokenize the literal's own lines inside parentheses to see which rows are comments.
        segment = "(" + "\n".join(lines[start - 1:end]) + "\n)"
        rows: set[int] = set()
        try:
            for tok in tokenize.generate_tokens(io.StringIO(segment).readline):
                if tok.type == tokenize.COMMENT:
                    rows.add(tok.start[0] + start - 1)
        except tokenize.TokenError as exc:
            if not str(exc.args[0]).startswith("EOF in multi-line statement"):
                return None  # brackets opened before the literal stay open: the rows are read
        except SyntaxError:
            return None
        for row in inside:
            if row not in rows:
                del found[row]
    return found


def ast_walk(node: ast.AST) -> Iterator[ast.AST]:
    """Exactly ast.walk(node): the same nodes in the same order (breadth first, a node's children
    queued before it is yielded), about 1.7x faster. ast.walk goes through two generators per node
    (iter_child_nodes over iter_fields, with a try per field); the stages walk several million nodes
    per review, a tenth of its CPU time. A whole module is walked from its node list (walk_nodes),
    listed once per tree: a dozen checks and the compare walk each port and upstream module whole
    (about a million nodes per review), and iterating a tuple costs a twentieth of this generator.
    That list holds while no node is added to or removed from the tree, which no stage does to a
    module it read (the compare's renames change names in place; the platform fold works on a copy)."""
    kind = type(node)
    if kind is ast.Module:
        return iter(walk_nodes(node))
    if kind in _LISTED_DEFS:
        return iter(_def_nodes(node))
    return _walk_generator(node)


# Classes and functions are walked whole by several checks each (attributes, capabilities, names, the
# trace's scopes): their node lists are kept too, by identity, as walk_nodes keeps a module's. A copy
# (the compare's shallow statements, a deep copy to strip or fold) is another object, listed afresh.
_LISTED_DEFS = frozenset({ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef})
_DEF_NODES: dict[int, tuple[ast.AST, tuple[ast.AST, ...]]] = {}
_DEF_NODES_MAX = 16384


def _def_nodes(node: ast.AST) -> tuple[ast.AST, ...]:
    hit = _DEF_NODES.get(id(node))
    if hit is not None and hit[0] is node:  # the entry keeps the node alive, so its id cannot be reused
        return hit[1]
    nodes = _walk_all(node)
    if len(_DEF_NODES) >= _DEF_NODES_MAX:
        _DEF_NODES.pop(next(iter(_DEF_NODES)))
    _DEF_NODES[id(node)] = (node, nodes)
    return nodes


def _walk_generator(node: ast.AST) -> Iterator[ast.AST]:
    todo = deque((node,))
    pop, push = todo.popleft, todo.append
    node_type = ast.AST
    while todo:
        node = pop()
        for name in node._fields:
            value = getattr(node, name, None)  # a field left unset is skipped, as iter_fields does
            if isinstance(value, list):
                for item in value:
                    if isinstance(item, node_type):
                        push(item)
            elif isinstance(value, node_type):
                push(value)
        yield node


def ast_children(node: ast.AST) -> list[ast.AST]:
    """list(ast.iter_child_nodes(node)): the same children in the same order, without its two
    generators (a field left unset is skipped, as iter_fields does)."""
    out: list[ast.AST] = []
    push, node_type = out.append, ast.AST
    for name in node._fields:
        value = getattr(node, name, None)
        if isinstance(value, list):
            for item in value:
                if isinstance(item, node_type):
                    push(item)
        elif isinstance(value, node_type):
            push(value)
    return out


def _walk_all(tree: ast.AST) -> tuple[ast.AST, ...]:
    """tuple(ast.walk(tree)), built in a list without a generator."""
    out = [tree]
    push, node_type, i = out.append, ast.AST, 0
    while i < len(out):
        node = out[i]
        i += 1
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, list):
                for item in value:
                    if isinstance(item, node_type):
                        push(item)
            elif isinstance(value, node_type):
                push(value)
    return tuple(out)


_NODES: dict[int, tuple[ast.AST, tuple[ast.AST, ...]]] = {}


def walk_nodes(tree: ast.AST) -> tuple[ast.AST, ...]:
    """Every node of `tree` in ast.walk's order, listed once per tree: several checks walk each
    whole port module, and iterating a tuple is many times cheaper than ast.walk's generator."""
    hit = _NODES.get(id(tree))
    if hit is not None and hit[0] is tree:  # the tree is kept alive, so its id cannot be reused
        return hit[1]
    nodes = _walk_all(tree)
    if len(_NODES) >= _TOKENS_MAX:
        _NODES.pop(next(iter(_NODES)))
    _NODES[id(tree)] = (tree, nodes)
    return nodes


# While a review runs the collector is off (paused_gc); the RSS after the last collection, one entry per pause.
_PAUSED_AT: list[int] = []
GC_GROWTH_MB = 256  # collect at a stage's end once the process grew by this much since the last collection


@contextmanager
def paused_gc() -> Iterator[None]:
    """No cyclic collection while a review builds and keeps its syntax trees: nearly every object it
    allocates lives to the end, so each young collection only scanned fresh nodes to promote them
    (master, --no-cache: 0.27 s of the review's CPU and 0.55 s of its forked children's, with a young
    collection every 200,000 allocations; the cyclic garbage the collector found was about 6 MB: peak
    RSS 190 -> 196 MB with it off). Forked children inherit the pause. Garbage cycles are still
    bounded: collect_if_grown, at the end of each stage, collects once the process grew by
    GC_GROWTH_MB since the last collection."""
    enabled = gc.isenabled()
    gc.disable()
    _PAUSED_AT.append(_rss_bytes())
    try:
        yield
    finally:
        _PAUSED_AT.pop()
        if not _PAUSED_AT:
            _age_survivors()
            if enabled:
                gc.enable()


def _age_survivors() -> None:
    """What the paused review allocated and still holds is moved out of the young generation: the
    first young collection after the pause otherwise scanned all of it (0.23 s of rendering the
    reports of master). A process that froze what it holds (the CLI, gc.freeze at its start) keeps this
    frozen too; elsewhere (tests, a library caller) it goes to the oldest generation, still collectable."""
    if gc.get_freeze_count():
        gc.freeze()
    else:
        gc.freeze()
        gc.unfreeze()


def collect_if_grown(growth_mb: int | None = None) -> bool:
    """Inside paused_gc: one full collection when the resident size grew by more than `growth_mb`
    (default GC_GROWTH_MB) since the pause began or the last such collection; whether it ran."""
    if not _PAUSED_AT:
        return False
    now = _rss_bytes()
    if now - _PAUSED_AT[-1] <= (GC_GROWTH_MB if growth_mb is None else growth_mb) << 20:
        return False
    gc.collect()
    _PAUSED_AT[-1] = _rss_bytes()
    return True


def _rss_bytes() -> int:
    """The resident size now (/proc/self/statm); where that is missing, the peak (ru_maxrss), which
    only grows, so the guard then errs towards collecting."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Everything alive now is left out of the collector's scans until the block ends (gc.freeze):
    what follows a review (the baseline's comparison, rendering the reports) allocates hundreds of
    thousands of short-lived objects, and each full collection they set off rescanned the review's
    millions of live syntax-tree nodes (0.2 s of writing one report.json)."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def file_stamp(path: str) -> tuple[int, int]:
    """(mtime, size) of a file, (0, -1) when it cannot be read: the key that re-reads a changed file."""
    try:
        st = os.stat(path)
    except OSError:
        return (0, -1)
    return (st.st_mtime_ns, st.st_size)


def parse_file(path: str) -> ast.Module | None:
    """The ast of a snapshot file, parsed once per run for every reader (None when unreadable)."""
    return _parse_stamped(path, file_stamp(path))


@lru_cache(maxsize=512)
def _parse_stamped(path: str, stamp: tuple[int, int]) -> ast.Module | None:  # stamp: re-read a changed file
    try:
        return cached_parse(path)[1]  # shared with the other stages, read-only
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None


@dataclass(frozen=True)
class ImportedName:
    path: str  # repo-relative port file
    line: int
    module: str  # the absolute module imported from
    name: str | None  # None for `import module`
    guarded: bool  # inside try/except ImportError: the port has a fallback

    @property
    def target(self) -> str:
        return f"{self.module}.{self.name}" if self.name else self.module


def _guarded_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in walk_nodes(tree):
        if isinstance(node, ast.Try):
            names = {ast.unparse(h.type) for h in node.handlers if h.type is not None}
            if not node.handlers or any(n in {"ImportError", "ModuleNotFoundError", "Exception"} or "ImportError" in n for n in names) or any(h.type is None for h in node.handlers):
                for stmt in node.body:
                    lines.update(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
    return lines


def imported_names(root: Path, paths: Sequence[str], packages: Sequence[str]) -> list[ImportedName]:
    """Absolute imports (module level and lazy) from the given top-level packages, in file order."""
    out = [i for rel in paths for i in file_imported_names(root, rel, packages)]
    return sorted(out, key=lambda i: (i.path, i.line))


def file_imported_names(root: Path, rel: str, packages: Sequence[str]) -> list[ImportedName]:
    """imported_names of one file: a function of its path, its bytes and `packages` alone."""
    tops = {p.replace("-", "_") for p in packages}
    tree = parse_file(str(root / rel))
    if tree is None:
        return []  # unparsable files are reported by discovery (MXA001)
    out: list[ImportedName] = []
    guarded = _guarded_lines(tree)
    for node in walk_nodes(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.split(".")[0] in tops:
            for alias in node.names:
                if alias.name != "*":
                    out.append(ImportedName(rel, node.lineno, node.module, alias.name, node.lineno in guarded))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in tops:
                    out.append(ImportedName(rel, node.lineno, alias.name, None, node.lineno in guarded))
    return out
