# The module index of a snapshot (and of the upstream tree): dotted name <-> file, one parse per
# file, its imports and top-level definitions. Parse failures and oversize files become skips.
from __future__ import annotations

import ast
import re
import tokenize
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from metax_audit.core.pysource import cached_parse, iter_tokens, standalone_comments

# griffe could load the same structure, but the tracer needs the raw function bodies, the import
# statements nested inside functions and the comment lines inside calls; one ast pass per file
# that the chain really reaches is cheaper than loading both whole packages.

ModuleOrigin = Literal["port", "upstream"]  # which tree a module is read from


@dataclass
class ModuleInfo:
    name: str  # dotted module name
    path: str  # repo-relative posix path (port) or path under the upstream root (upstream)
    origin: ModuleOrigin
    is_package: bool
    tree: ast.Module
    source: str
    imports: dict[str, str] = field(default_factory=dict)  # local name -> dotted target
    star_imports: list[str] = field(default_factory=list)
    defs: dict[str, ast.AST] = field(default_factory=dict)  # ClassDef / FunctionDef by name
    assigns: dict[str, ast.expr] = field(default_factory=dict)  # NAME = expr at module level
    _comments: dict[int, str] | None = None
    _lines: list[str] | None = None
    _heads: dict[str, tuple[bool, str]] | None = None

    @property
    def package(self) -> str:
        return self.name if self.is_package else self.name.rpartition(".")[0]

    def body_names(self) -> dict[str, tuple[bool, str]]:
        """Each class the body defines and each name it imports with `from`, at the top level of the body,
        the first statement naming it winning: name -> (defined here, the dotted name it stands for; "" for
        a class). Listed once per module (the attribute checks ask it for every read of a port file)."""
        if self._heads is None:
            heads: dict[str, tuple[bool, str]] = {}
            for st in self.tree.body:
                if isinstance(st, ast.ClassDef):
                    heads.setdefault(st.name, (True, ""))
                elif isinstance(st, ast.ImportFrom):
                    for a in st.names:
                        if a.name != "*":
                            base = resolve_relative(self.package, st.level, st.module) if st.level else (st.module or "")
                            heads.setdefault(a.asname or a.name, (False, f"{base}.{a.name}"))
            self._heads = heads
        return self._heads

    def comment_lines(self) -> dict[int, str]:
        """Line -> text of comments that stand alone on their line (tokenize keeps what ast drops).

        Lines that merely look like comments are found by a line scan; tokenize, which is slow,
        runs only when there is at least one, to drop look-alikes inside multi-line strings."""
        if self._comments is None:
            # Same answer from the tree's string spans without tokenizing the file (pysource).
            fast = standalone_comments(self.source, self.tree)
            if fast is not None:
                self._comments = fast
                return fast
            lines = self.source.splitlines()
            candidates = {i + 1 for i, line in enumerate(lines) if line.lstrip().startswith("#")}
            out: dict[int, str] = {}
            if candidates:
                try:
                    for tok in iter_tokens(self.source):
                        if tok.type == tokenize.COMMENT and tok.start[0] in candidates:
                            out[tok.start[0]] = tok.string
                except (tokenize.TokenError, SyntaxError, IndexError):
                    out = {}
            self._comments = out
        return self._comments

    def has_comment_between(self, first: int, last: int) -> bool:
        """Cheap pre-check before comment_lines(): any line in [first, last] starting with '#'."""
        lines = self.source.splitlines() if self._lines is None else self._lines
        self._lines = lines
        return any(lines[i].lstrip().startswith("#") for i in range(max(first - 1, 0), min(last, len(lines))))


def resolve_relative(package: str, level: int, module: str | None) -> str:
    """`from ..x import y` inside `package` -> absolute dotted module."""
    parts = package.split(".") if package else []
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    base = ".".join(parts)
    if module:
        return f"{base}.{module}" if base else module
    return base


def collect_imports(stmts: list[ast.stmt] | list[ast.AST], package: str, into: dict[str, str], stars: list[str] | None = None) -> None:
    """Record import statements among `stmts` (and nested in if/try blocks, not in defs)."""
    for node in stmts:
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    into[a.asname] = a.name
                else:
                    top = a.name.split(".")[0]
                    into[top] = top
        elif isinstance(node, ast.ImportFrom):
            mod = resolve_relative(package, node.level, node.module) if node.level else (node.module or "")
            for a in node.names:
                if a.name == "*":
                    if stars is not None:
                        stars.append(mod)
                    continue
                into[a.asname or a.name] = f"{mod}.{a.name}" if mod else a.name
        elif isinstance(node, ast.If | ast.Try | ast.With):
            for block in _blocks(node):
                collect_imports(block, package, into, stars)


def _blocks(node: ast.AST) -> list[list[ast.stmt]]:
    out = []
    for name in ("body", "orelse", "finalbody"):
        b = getattr(node, name, None)
        if b:
            out.append(b)
    for h in getattr(node, "handlers", []) or []:
        out.append(h.body)
    return out


@dataclass(frozen=True)
class Skip:
    path: str
    reason: str


@dataclass
class ReadLog:
    """What one unit of the trace asked of the port tree: the dotted names it looked up (a file,
    a package or a folder each may answer) and the folders it listed, plus the skipped files it met.
    The trace memo keys a unit's result on the state of exactly these (trace/memo.py)."""

    names: set[str] = field(default_factory=set)
    folders: set[str] = field(default_factory=set)
    skips: dict[str, Skip] = field(default_factory=dict)


class ModuleIndex:
    """Finds and parses modules of the port snapshot and the upstream tree, lazily, once each."""

    def __init__(self, port_root: Path, port_package: str, upstream_root: Path | None, upstream_package: str, max_bytes: int = 2_000_000) -> None:
        self.port_root = port_root
        self.port_package = port_package
        self.upstream_root = upstream_root
        self.upstream_package = upstream_package
        self.max_bytes = max_bytes
        self._cache: dict[str, ModuleInfo | None] = {}
        self.skips: dict[str, Skip] = {}
        self._skip_of: dict[str, Skip] = {}  # module name -> why it has no tree
        self._texts: dict[str, str] = {}
        self._mentions: dict[tuple[str, str], bool] = {}  # (file, name) -> defines_text's search answered
        self._files: dict[str, tuple[Path, Path, bool] | None] = {}
        self.log: ReadLog | None = None  # set while a memoized trace unit runs

    def _note(self, name: str) -> None:
        if self.log is not None and self.origin_of(name) == "port":
            self.log.names.add(name)

    def _note_folder(self, name: str) -> None:
        if self.log is not None and self.origin_of(name) == "port":
            self.log.folders.add(name)

    def origin_of(self, dotted: str) -> ModuleOrigin | None:
        top = dotted.split(".")[0]
        if top == self.port_package.split(".")[0]:
            return "port"
        if top == self.upstream_package.split(".")[0]:
            return "upstream"
        return None

    def _file_for(self, name: str) -> tuple[Path, Path, bool] | None:
        self._note(name)
        # The trees do not change during a review: each name's file is looked for once (a review asks
        # for the same names thousands of times; each look is two stats through pathlib).
        if name in self._files:
            return self._files[name]
        found = self._files[name] = self._find_file(name)
        return found

    def _find_file(self, name: str) -> tuple[Path, Path, bool] | None:
        origin = self.origin_of(name)
        root = self.port_root if origin == "port" else self.upstream_root if origin == "upstream" else None
        if root is None:
            return None
        rel = Path(*name.split("."))
        for cand, pkg in ((root / rel.with_suffix(".py"), False), (root / rel / "__init__.py", True)):
            if cand.is_file():
                return root, cand, pkg
        return None

    def exists(self, name: str) -> bool:
        self._note(name)
        return (name in self._cache and self._cache[name] is not None) or self._file_for(name) is not None

    def is_package(self, name: str) -> bool:
        """A regular package (a folder with __init__.py) of the port or upstream."""
        found = self._file_for(name)
        return found is not None and found[2]

    def namespace_dir(self, name: str) -> Path | None:
        """The folder of an implicit namespace package (a directory without __init__.py), if any."""
        self._note(name)
        origin = self.origin_of(name)
        root = self.port_root if origin == "port" else self.upstream_root if origin == "upstream" else None
        folder = root / Path(*name.split(".")) if root is not None else None
        return folder if folder is not None and folder.is_dir() and not (folder / "__init__.py").is_file() else None

    def submodules(self, package: str) -> list[str]:
        """Names of the modules and packages directly inside `package` (from the file tree, not parsed)."""
        self._note_folder(package)
        found = self._file_for(package)
        folder = found[1].parent if found is not None and found[2] else self.namespace_dir(package)
        if folder is None:
            return []
        try:
            entries = list(folder.iterdir())
        except OSError:
            return []
        return sorted(p.stem if p.suffix == ".py" else p.name for p in entries
                      if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file())

    def text_of(self, name: str) -> str | None:
        """The source text of a module without parsing it (cached; None when there is no such file)."""
        found = self._file_for(name)
        if found is None:
            return None
        key = str(found[1])
        if key not in self._texts:
            try:
                self._texts[key] = found[1].read_text(encoding="utf-8", errors="replace")
            except OSError:
                return None
        return self._texts[key]

    def get(self, name: str) -> ModuleInfo | None:
        if name in self._cache:
            self._note(name)
            if self.log is not None and name in self._skip_of:
                skip = self._skip_of[name]
                self.log.skips[skip.path] = skip
            return self._cache[name]
        found = self._file_for(name)
        info = None
        if found is not None:
            root, path, pkg = found
            rel = path.relative_to(root).as_posix()
            info = self._parse(name, rel, path, pkg)
            if info is None and rel in self.skips:
                self._skip_of[name] = self.skips[rel]
                if self.log is not None:
                    self.log.skips[rel] = self.skips[rel]
        self._cache[name] = info
        return info

    def defines_text(self, dotted: str) -> bool | None:
        """Cheap check without parsing: does the module holding `dotted` mention its first name?
        None when no such module file exists in the tree (not an answer either way)."""
        parts = dotted.split(".")
        for i in range(len(parts) - 1, 0, -1):
            found = self._file_for(".".join(parts[:i]))
            if found is None:
                continue
            name = parts[i]
            if self.exists(".".join(parts[: i + 1])):
                return True  # a submodule
            key = str(found[1])
            if key not in self._texts:
                try:
                    self._texts[key] = found[1].read_text(encoding="utf-8", errors="replace")
                except OSError:
                    return None
            # The same few names are asked of the same modules again and again (375 asks, 106 distinct,
            # on the real port): the search is done once per module and name; the reads above are noted each time.
            hit = self._mentions.get((key, name))
            if hit is None:
                hit = self._mentions[(key, name)] = re.search(rf"\b{re.escape(name)}\b", self._texts[key]) is not None
            return hit
        return None

    def module_for_path(self, rel: str) -> ModuleInfo | None:
        p = Path(rel)
        parts = list(p.with_suffix("").parts)
        if parts and parts[-1] == "__init__":
            parts = parts[:-1]
        return self.get(".".join(parts)) if parts else None

    def _parse(self, name: str, rel: str, path: Path, pkg: bool) -> ModuleInfo | None:
        try:
            size = path.stat().st_size
            if size > self.max_bytes:
                self.skips[rel] = Skip(rel, f"not traced: {size} bytes, over the {self.max_bytes}-byte limit for generated files")
                return None
            source, tree = cached_parse(path)  # shared with the other stages; never mutated
        except SyntaxError as exc:
            self.skips[rel] = Skip(rel, f"syntax error at line {exc.lineno}: {exc.msg}")
            return None
        except (RecursionError, MemoryError) as exc:
            self.skips[rel] = Skip(rel, f"not traced: too deeply nested to parse ({type(exc).__name__})")
            return None
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            self.skips[rel] = Skip(rel, f"unreadable: {exc}")
            return None
        origin = self.origin_of(name) or "port"
        info = ModuleInfo(name=name, path=rel, origin=origin, is_package=pkg, tree=tree, source=source)
        collect_imports(tree.body, info.package, info.imports, info.star_imports)
        for node in tree.body:
            _index_def(node, info)
        return info


def _index_def(node: ast.AST, info: ModuleInfo) -> None:
    if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        info.defs[node.name] = node
    elif isinstance(node, ast.Assign):
        for t in node.targets:
            if isinstance(t, ast.Name):
                info.assigns[t.id] = node.value
    elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
        info.assigns[node.target.id] = node.value
    elif isinstance(node, ast.If | ast.Try):
        for block in _blocks(node):
            for sub in block:
                _index_def(sub, info)
