# Which files of the snapshot are in scope (config globs, PATHS), read once each with the size
# limit; the port's files.
from __future__ import annotations

import fnmatch
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from metax_audit.core import fstree
from metax_audit.core.config import AuditConfig, python_files, scope_files
from metax_audit.core.errors import DiscoverError
from metax_audit.core.models import ParseProblem, SkippedFile, SourceFile, SourceReason
from metax_audit.core.pysource import ParsedSource, check_source, module_name, read_source_cached, read_text

if TYPE_CHECKING:
    from metax_audit.core.memo import Memo, Products

_T = TypeVar("_T")

# ------------------------------------------------------------------ scope


_GLOB_CHARS = re.compile(r"[*?\[]")
_REG_WORDS = re.compile(r"register_backend|register_mla_prefill_backend|register_oot|\.register\b|direct_register_custom_op")


def _port_dir(config: AuditConfig) -> str:
    return config.port_package.replace(".", "/")


def _rel(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix()


def _scope(root: Path, config: AuditConfig) -> dict[str, SourceReason]:
    scoped: dict[str, SourceReason] = dict.fromkeys(scope_files(root, config), "glob")
    if config.platform_path in scoped:
        scoped[config.platform_path] = "platform"
    return scoped


def _normalise(path: str) -> str:
    p = path.replace("\\", "/").strip()
    while p.startswith("./"):
        p = p[2:]
    return p.rstrip("/")


def _selected(rel: str, wanted: Sequence[str]) -> bool:
    for w in wanted:
        if rel == w or rel.startswith(w + "/") or (_GLOB_CHARS.search(w) and fnmatch.fnmatchcase(rel, w)):
            return True
    return False


def _narrow(root: Path, scoped: dict[str, SourceReason], paths: Sequence[str]
            ) -> tuple[dict[str, SourceReason], list[SkippedFile]]:
    wanted = [_normalise(p) for p in paths if _normalise(p)]
    for w in wanted:
        if w.startswith("/") or ".." in w.split("/"):
            raise DiscoverError(f"PATHS entry {w!r} must be relative to the repository root, inside it")
    kept = {rel: why for rel, why in scoped.items() if _selected(rel, wanted)}
    for w in wanted:
        if _GLOB_CHARS.search(w):
            extra = python_files(root, w)
        elif (root / w).is_dir():
            extra = python_files(root, f"{w}/**/*.py")
        else:
            extra = [w] if (root / w).is_file() else []
            if extra and not w.endswith(".py"):
                raise DiscoverError(f"PATHS entry {w!r} is not a Python file; the audit reads .py sources only")
        if not extra and not any(_selected(rel, [w]) for rel in scoped):
            raise DiscoverError(f"PATHS entry {w!r} matches no file in the snapshot; give a repo-relative path")
        for rel in extra:
            kept.setdefault(rel, "explicit")
    left_out = [SkippedFile(rel, "not selected by PATHS") for rel in sorted(scoped) if rel not in kept]
    return kept, left_out


class _Sources:
    """Reads each snapshot file at most once per run, with the configured size limit; parses on demand.
    What discover takes from single files (parse status, registrations, top-level bindings, imports) is
    asked of the review's memo under the file's text (see product; the default memo keeps nothing)."""

    def __init__(self, root: Path, max_bytes: int, *, memo: Memo | None = None) -> None:
        from metax_audit.core.memo import NO_MEMO

        self.root = root
        self.max_bytes = max_bytes
        self.memo = memo or NO_MEMO
        self._texts: dict[str, tuple[str | None, ParseProblem | None]] = {}
        self._parsed: dict[str, ParsedSource] = {}
        self._products: dict[str, Products] = {}
        self.keep: set[str] = set()

    def text(self, rel: str) -> str | None:
        if rel not in self._texts:
            self._texts[rel] = read_text(self.root, rel, self.max_bytes)
        return self._texts[rel][0]

    def get(self, rel: str) -> ParsedSource:
        """The file with its tree, kept for later lookups (registrations, resolution, platform)."""
        if rel not in self._parsed:
            # the tree comes from the process-wide cache, so trace/compare/checks reuse it
            self._parsed[rel] = read_source_cached(self.root, rel, self.max_bytes)
        return self._parsed[rel]

    def product(self, kind: str, rel: str, text: str, compute: Callable[[str, str], _T]) -> _T:
        """compute(rel, text): a product of this file alone (and of the interpreter's parser), kept
        under its path and text; the file's text was read by text(rel)."""
        products = self._products.get(kind)
        if products is None:
            from metax_audit.core.memo import Kind

            products = self._products[kind] = self.memo.products(Kind(f"discover-{kind}"), sys.version)
        return products.get(rel, text, lambda: compute(rel, text))

    def save(self) -> None:
        """Keep the products computed in this run (see product)."""
        for products in self._products.values():
            products.save()

    def status(self, rel: str) -> ParsedSource:
        """Whether the file parses, without keeping its tree: holding thousands of trees alive makes
        the garbage collector rescan them on every allocation burst, which dominated large scopes.
        A file that names a registration is judged by the parser (its tree, parsed once per process,
        is what the registrations read), any other by the compiler; both verdicts are products of
        its text. (The files of the scope without one are parsed by coverage_findings anyway: the
        checks forked later share those trees.)"""
        if rel in self._parsed:
            return self._parsed[rel]
        text = self.text(rel)
        if text is not None and rel in self.keep:
            return self.get(rel)
        if text is not None and _REG_WORDS.search(text):
            problem, lines = self.product("parsed", rel, text, lambda r, _: self._parse_status(r))
            return ParsedSource(rel, text, None, problem, lines)
        if text is not None:
            problem, lines = self.product("compiled", rel, text, _compile_status)
            return ParsedSource(rel, text, None, problem, lines)
        return check_source(rel, *self._texts[rel])

    def _parse_status(self, rel: str) -> tuple[ParseProblem | None, int]:
        src = self.get(rel)
        return src.problem, src.lines


def _compile_status(rel: str, text: str) -> tuple[ParseProblem | None, int]:
    src = check_source(rel, text, None)
    return src.problem, src.lines


def _source_file(src: ParsedSource, reason: SourceReason) -> SourceFile:
    return SourceFile(path=src.path, module=module_name(src.path), reason=reason, problem=src.problem,
                      lines=src.lines)


def _port_files(root: Path, config: AuditConfig) -> list[str]:
    base = root / _port_dir(config)
    if not base.is_dir():
        single = root / f"{_port_dir(config)}.py"
        if single.is_file():
            return [_rel(root, single)]
        raise DiscoverError(
            f"port package {config.port_package!r} not found in the snapshot (no {_port_dir(config)}/); "
            "set port-package in [tool.metax-audit] or .metax-audit.yaml"
        )
    return _package_files(root, base)


def _package_files(root: Path, base: Path) -> list[str]:
    if not base.is_dir():
        return []
    return sorted(_rel(root, p) for p in fstree.files(base, ".py") if "__pycache__" not in p.parts)
