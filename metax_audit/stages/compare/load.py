# Loading and indexing: each side's parse, comments, member tables and class renames; what a file's
# comparison reads besides the file itself (the per-file result cache keys on it).
from __future__ import annotations

import ast
import hashlib
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from metax_audit.core.comments import Comment, CommentMap, iter_statements, read_comments
from metax_audit.core.config import AuditConfig
from metax_audit.core.pysource import ast_walk, read_source_cached
from metax_audit.stages.compare.consequence import imported_port_modules, port_module_file
from metax_audit.stages.compare.rules import _ARCH_TEXT
from metax_audit.stages.compare.side import _PortRefs, _Side


def compare_dependencies(root: Path, config: AuditConfig, paths: Sequence[str],
                         facts: Callable[[str], FileFacts] | None = None, refs: _PortRefs | None = None) -> dict[str, str]:
    """What each file's comparison reads besides the file itself, as a digest per file: the platform file
    (the vendor's fixed answers), which other port files name the functions the file defines (code the
    port never calls is judged from them) and the port modules it imports constant answers from.
    The per-file result cache keys on it. `facts` (path -> file_facts of its tree) and `refs`' identifiers
    may answer from a cache kept under each file's bytes: then no file is parsed."""
    if facts is None:
        def facts(path: str) -> FileFacts:
            return file_facts(read_source_cached((root / path).parent, Path(path).name, config.max_file_bytes).tree,
                              config.port_package)
    platform = root / config.platform_path
    try:
        base = hashlib.sha1(platform.read_bytes() if platform.is_file() else b"-")
    except OSError:
        base = hashlib.sha1(b"?")
    refs = refs or _PortRefs(root, config.port_package)
    out: dict[str, str] = {}
    # One digest per name of the files naming it, the file itself included (whether it names its own
    # function is in its own bytes, which its key holds anyway): listing them per file was quadratic
    # when every file defines the same method (`forward` in 10,000 backends: 10,000 sorts of 10,000).
    naming: dict[str, str] = {}
    imported: dict[str, str] = {}
    files: dict[str, str | None] = {}
    for path in paths:
        h = base.copy()
        names, modules = facts(path)
        for name in names:
            if name not in naming:
                naming[name] = hashlib.sha1("\n".join(sorted(refs.files_naming(name))).encode()).hexdigest()
            h.update(f"{name}:{naming[name]};".encode())
        for module in modules:
            if module not in files:
                files[module] = port_module_file(root, module)
        for rel in sorted({r for m in modules if (r := files[m]) is not None}):
            if rel not in imported:  # a port module the file reads constant answers from (each read once)
                try:
                    imported[rel] = hashlib.sha1((root / rel).read_bytes()).hexdigest()
                except OSError:
                    imported[rel] = "?"
            h.update(f"{rel}:{imported[rel]};".encode())
        out[path] = h.hexdigest()[:16]
    return out


# (the functions and top-level classes a file defines, sorted; the port modules it imports names from, as paths without suffix)
FileFacts = tuple[list[str], list[str]]


def file_facts(tree: ast.Module | None, package: str) -> FileFacts:
    """What compare_dependencies reads of a file's tree (a pure function of its bytes)."""
    if tree is None:
        return [], []
    # its classes too: a difference in a class only the port builds is judged from who names the class
    classes = {s.name for s in tree.body if isinstance(s, ast.ClassDef)}
    return sorted({*defined_functions(tree), *classes}), sorted({m for m, _ in imported_port_modules(tree, package)})


def defined_functions(tree: ast.Module | None) -> list[str]:
    """The names of every function a file defines (sorted): a file's compare key reads who names them."""
    # A def is a statement: walking statements only finds every one (ast.walk visited each expression node too)
    return sorted({n.name for n in iter_statements(tree.body) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}) \
        if tree is not None else []


def _port_names(side: _Side, package: str) -> frozenset[str]:
    """Names the port file defines at module or class level, or imports from its own package (its own
    classes, functions and ops); a function's local variables are not among them."""
    names: set[str] = set()
    root = package.split(".")[0]
    for node in ast_walk(side.tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == root):
            names.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Import):  # `import port.envs as port_envs`: the alias names the port's module
            names.update(a.asname for a in node.names if a.asname and a.name.split(".")[0] == root)
    stack: list[ast.stmt] = list(side.tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.ClassDef):
            names.add(node.name)
            stack.extend(n for n in node.body if isinstance(n, ast.ClassDef))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            names.add(node.targets[0].id)
        elif isinstance(node, ast.If | ast.Try):  # module-level conditional definitions
            stack.extend(node.body + node.orelse + [s for h in getattr(node, "handlers", []) for s in h.body])
    for node in ast_walk(side.tree):  # ops the port registers itself: direct_register_custom_op(op_name="x", ...)
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg == "op_name" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                    names.add(kw.value.value)
    return frozenset(names)


def _load(path: Path, rel: str, config: AuditConfig, port_side: bool = True,
          kept: Callable[[str, Callable[[], CommentMap]], CommentMap] | None = None) -> _Side | None:
    """One side of a comparison; `kept(text, compute)` may answer the port side's comments from a cache."""
    src = read_source_cached(path.parent, path.name, config.max_file_bytes)
    if src.tree is None or src.text is None:
        return None
    text, tree = src.text, src.tree
    # Upstream comments only serve to recognise comments the port copied: a line scan is enough.
    if not port_side:
        comments = _rough_comments(text)
    elif kept is None:
        comments = read_comments(text, config.modification_markers, tree)
    else:
        comments = kept(text, lambda: read_comments(text, config.modification_markers, tree))
    side = _Side(rel, text, tree, comments, lines=text.splitlines())
    # A cheap text prefilter: only statements on these lines are walked for capability checks.
    side.arch_lines = _arch_lines(text)
    if not port_side:
        _index(side, {})
    else:
        side.classes = {n.name: n for n in iter_statements(tree.body) if isinstance(n, ast.ClassDef)}
    return side


# _ARCH_TEXT without re.IGNORECASE, over the lowered text: a case-blind alternation has no literal to skip
# ahead to and walked every character of every file (0.08 s of the compare). The characters that case-blind
# matching equates with an ASCII letter of the pattern but lower() keeps apart send a text the slow way.
_ARCH_LOWER = re.compile(_ARCH_TEXT.pattern)
_CASE_SPECIAL = re.compile("[\u0130\u0131\u017f\u212a]")


def _arch_lines(text: str) -> frozenset[int]:
    if not _CASE_SPECIAL.search(text):
        return _match_lines(text.lower(), _ARCH_LOWER)
    return _match_lines(text, _ARCH_TEXT)


def _match_lines(text: str, pattern: re.Pattern[str]) -> frozenset[int]:
    lines: set[int] = set()
    line, pos = 1, 0
    for m in pattern.finditer(text):
        line += text.count("\n", pos, m.start())
        pos = m.start()
        lines.add(line)
    return frozenset(lines)


def _same_text(path: Path, text: str) -> bool:
    try:
        return path.read_text(encoding="utf-8") == text
    except (OSError, UnicodeDecodeError):
        return False


def _rough_comments(text: str) -> CommentMap:
    found: dict[int, Comment] = {}
    for i, line in enumerate(text.splitlines(), 1):
        at = line.find("#")
        if at >= 0:
            found[i] = Comment(i, line[at + 1 :].strip(), trailing=bool(line[:at].strip()))
    return CommentMap(found, (), frozenset())


def _index(side: _Side, class_map: dict[str, str]) -> None:
    """Fill the member tables, naming port classes by their upstream counterpart."""
    side.classes, side.funcs, side.attrs, side.imports, side.order, side.other = {}, {}, {}, {}, [], []
    for node in iter_statements(side.tree.body):
        if isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                module = "." * node.level + (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
                side.imports.setdefault(bound, (module, node.lineno))
            side.import_ends[node.lineno] = node.end_lineno or node.lineno

    def visit(body: list[ast.stmt], prefix: str, in_class: bool) -> None:
        for stmt in body:
            if isinstance(stmt, ast.ClassDef):
                name = prefix + class_map.get(stmt.name, stmt.name)
                side.classes[name] = stmt
                side.order.append(name)
                visit(stmt.body, name + ".", True)
            elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                side.funcs[prefix + stmt.name] = stmt
                side.order.append(prefix + stmt.name)
            elif isinstance(stmt, ast.Assign | ast.AnnAssign) and _target_name(stmt):
                side.attrs[prefix + _target_name(stmt)] = stmt
                side.order.append(prefix + _target_name(stmt))
            elif isinstance(stmt, ast.Import | ast.ImportFrom):
                continue
            elif in_class and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                continue  # docstrings
            elif not in_class:
                side.other.append(stmt)

    visit(side.tree.body, "", False)


def _target_name(stmt: ast.Assign | ast.AnnAssign) -> str:
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
    if len(targets) == 1 and isinstance(targets[0], ast.Name):
        return targets[0].id
    return ""


def _rename_in_place(tree: ast.AST, mapping: dict[str, str]) -> None:
    """Name port classes as upstream does (once, on our own parse), so only real changes differ."""
    if not mapping:
        return
    for node in ast_walk(tree):
        if isinstance(node, ast.Name) and node.id in mapping:
            node.id = mapping[node.id]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in mapping:
            node.value = mapping[node.value]
