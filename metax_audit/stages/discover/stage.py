# The discover stage: scope, registrations, priorities, switches and the callers of each file in
# scope; widen() adds the port files the trace reached.
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from metax_audit.core.config import AuditConfig
from metax_audit.core.errors import DiscoverError
from metax_audit.core.memo import Memo
from metax_audit.core.models import Discovery, SkippedFile
from metax_audit.core.pysource import ParsedSource, find_module, module_name, resolve_relative, scan_imports
from metax_audit.stages.discover.platform import _priorities, _switches
from metax_audit.stages.discover.registrations import _registrations, _Resolver, _returned_registrations
from metax_audit.stages.discover.scope import (
    _narrow,
    _normalise,
    _package_files,
    _port_files,
    _scope,
    _source_file,
    _Sources,
)

_T = TypeVar("_T")

# ------------------------------------------------------------------ callers


def _import_candidates(rel: str, text: str) -> frozenset[str]:
    """Every module name this file may import, in every form (absolute, relative, lazy): for a
    `from a import b`, both a and a.b (b may be a submodule)."""
    mod = module_name(rel)
    is_pkg = rel.endswith("__init__.py")
    found: set[str] = set()
    for stmt in scan_imports(text):
        if stmt.module is None and stmt.level == 0:  # import a.b.c
            found.update(stmt.names)
            continue
        base = resolve_relative(mod, is_pkg, stmt.level, stmt.module)
        if base:
            found.add(base)
            found.update(f"{base}.{n}" for n in stmt.names)
    return frozenset(found)


def _imported_modules(rel: str, text: str, known: set[str]) -> set[str]:
    """Modules in `known` that this file imports, in every form (absolute, relative, lazy)."""
    return set(_import_candidates(rel, text) & known)


def _callers(sources: _Sources, importers: Iterable[str], targets: Iterable[str]) -> dict[str, tuple[str, ...]]:
    targets = list(targets)
    by_module = {module_name(t): t for t in targets if module_name(t)}
    result: dict[str, set[str]] = {t: set() for t in targets}
    known = set(by_module)
    for rel in importers:
        text = sources.text(rel)
        if text is None:
            continue
        # kept per file text: discover and each widening scan every port file (500 scans a review)
        for imported in sources.product("imports", rel, text, _import_candidates) & known:
            target = by_module[imported]
            if target != rel:
                result[target].add(rel)
    return {t: tuple(sorted(v)) for t, v in result.items()}


def _platform_product(sources: _Sources, platform: str, kind: str, read: Callable[[ParsedSource], _T]) -> _T:
    """The platform's priority lists or switches: products of its text (its comments tokenized and its
    tree walked were 0.03 s a review)."""
    text = sources.text(platform)
    if text is None:
        return read(sources.get(platform))
    return sources.product(kind, platform, text, lambda r, _: read(sources.get(r)))


# ------------------------------------------------------------------ public API


def discover(root: Path, config: AuditConfig, paths: Sequence[str] = (), *, memo: Memo | None = None) -> Discovery:
    """Scope, registrations, priorities, switches and callers of the port in snapshot `root`. What is
    read from single files is asked of `memo` under their text (see _Sources.product)."""
    root = Path(root)
    if not root.is_dir():
        raise DiscoverError(f"snapshot directory {root} does not exist")
    port = _port_files(root, config)
    scoped = _scope(root, config)
    left_out: list[SkippedFile] = []
    if paths:
        scoped, left_out = _narrow(root, scoped, paths)
    platform = config.platform_path
    sources = _Sources(root, config.max_file_bytes, memo=memo)
    sources.keep.add(platform)
    files = tuple(_source_file(sources.status(rel), why) for rel, why in sorted(scoped.items()))

    has_platform = (root / platform).is_file()
    # The platform is read even when PATHS leaves it out: the registrations of the selected files live there.
    scan = sorted(set(scoped) | ({platform} if has_platform else set()))
    resolver = _Resolver(sources)
    registrations = _registrations(sources, scan, resolver)
    if has_platform:
        registrations += tuple(_returned_registrations(sources, platform, config, resolver))
    priorities = _platform_product(sources, platform, "priorities", _priorities) if has_platform else ()
    switches = _platform_product(sources, platform, "switches", _switches) if has_platform else ()
    callers = _callers(sources, sorted(set(port) | set(scoped)), list(scoped))
    sources.save()
    return Discovery(root=root, port_package=config.port_package, files=files, registrations=registrations,
                     priorities=priorities, switches=switches, callers=callers, left_out=tuple(left_out))


def widen(discovery: Discovery, root: Path, reached: Iterable[str], *, max_file_bytes: int | None = None,
          memo: Memo | None = None) -> Discovery:
    """Add port files the trace reached (paths or dotted modules) as `reached-by-trace` records."""
    root = Path(root)
    limit = max_file_bytes if max_file_bytes is not None else AuditConfig().max_file_bytes
    port_dir = discovery.port_package.replace(".", "/")
    have = {f.path for f in discovery.files}
    new: list[str] = []
    for item in reached:
        rel = _normalise(item) if item.endswith(".py") else (find_module(root, item) or "")
        if rel and rel not in have and rel not in new and (rel == f"{port_dir}.py" or rel.startswith(port_dir + "/")) \
                and (root / rel).is_file():
            new.append(rel)
    if not new:
        return discovery
    sources = _Sources(root, limit, memo=memo)
    added = [_source_file(sources.status(rel), "reached-by-trace") for rel in new]
    port = _package_files(root, root / port_dir)
    callers = dict(discovery.callers)
    callers.update(_callers(sources, sorted(set(port) | have | set(new)), new))
    sources.save()
    return replace(
        discovery,
        files=tuple(sorted((*discovery.files, *added), key=lambda f: f.path)),
        callers=callers,
        left_out=tuple(s for s in discovery.left_out if s.path not in set(new)),
    )
