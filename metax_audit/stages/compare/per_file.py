# The compare stage over a discovery with each file's result kept in the result cache: a one-file
# change compares one file, and of it the functions whose text or reads changed. Moved from
# cache/resultcache.py, which keeps the store and its keys: the cache layer imports no stage, and
# compare's private names are read inside compare.
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from metax_audit.core.memo import NO_MEMO, Kind, Memo, file_digest
from metax_audit.core.models import Comparison, Difference, Discovery, FileComparison, Finding, UpstreamInfo

if TYPE_CHECKING:
    from metax_audit.core.config import AuditConfig
    from metax_audit.stages.compare.side import _PortRefs


def _port_imports(root: Path, rel: str, candidates: list[str], digests: dict[str, str]) -> list[list[str]]:
    """Digests of the port modules a file imports: a class that takes an upstream class's role through
    the port's own base class elsewhere is compared with what that base defines (compare by role).
    `candidates`: _import_candidates of the file's text."""
    from metax_audit.core.pysource import find_module

    out = {found for mod in candidates if (found := find_module(root, mod)) and found != rel}
    for p in out:
        digests[p] = digests.get(p) or file_digest(root / p)
    return [[p, digests[p]] for p in sorted(out)]


def _import_candidates(rel: str, text: str, package: str) -> list[str]:
    """The dotted names a file's imports could bind from the port package (a module, or a name in one)."""
    from metax_audit.core.pysource import module_name, resolve_relative, scan_imports

    out: set[str] = set()
    for stmt in scan_imports(text):
        base = resolve_relative(module_name(rel), rel.endswith("__init__.py"), stmt.level, stmt.module)
        for mod in (base, *(f"{base}.{n}" for n in stmt.names)) if stmt.module or stmt.level else stmt.names:
            if mod == package or mod.startswith(package + "."):
                out.add(mod)
    return sorted(out)


def import_candidates(root: Path, rel: str, config: AuditConfig) -> list[str]:
    """The dotted names a port file's imports could bind from the port package (none when it cannot be read)."""
    try:
        text = (root / rel).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return _import_candidates(rel, text, config.port_package)


def _file_facts(root: Path, config: AuditConfig, digests: dict[str, str], path: str, memo: Memo,
                ) -> tuple[list[str], list[str], list[str]]:
    """What the per-file compare keys read of a port file, kept under its bytes (parsing and scanning every
    port file was most of their cost, in the compare child on a staged review's critical path):
    compare.file_facts (the functions it defines, the port modules it imports names from) and the
    _import_candidates of its text. `digests` keeps each file's digest for the review's other keys."""
    import sys

    from metax_audit.core.pysource import read_source_cached
    from metax_audit.stages.compare import file_facts

    digest = digests[path] = digests.get(path) or file_digest(root / path)
    entry = (path, digest, config.max_file_bytes, config.port_package, sys.version_info[:2])
    kept = memo.load(Kind.COMPARE_FACTS, *entry)
    if isinstance(kept, tuple) and len(kept) == 3:
        return kept
    src = read_source_cached((root / path).parent, Path(path).name, config.max_file_bytes)
    try:
        text = (root / path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        candidates = []
    else:
        candidates = _import_candidates(path, text, config.port_package)
    facts = (*file_facts(src.tree, config.port_package), candidates)
    memo.store(Kind.COMPARE_FACTS, facts, *entry)
    return facts


class CompareWork(NamedTuple):
    """What cached_compare computed now: files compared, and their functions served from the kept
    member units or compared (compare/memo.py)."""

    files: int
    functions_reused: int = 0
    functions_compared: int = 0
    ahead: int = 0  # files whose parts a child compared during the trace (pipeline/incremental.SpeculativeCompare)


class FileParts(NamedTuple):
    """One port file's share of the compare stage: its comparisons, its drift and its findings (not yet
    judged: liveness reads the whole port, compare/liveness.py)."""

    files: list[FileComparison]
    drift: list[Difference]
    findings: list[Finding]


class ComparedParts(NamedTuple):
    """compare_parts' answer: each file's parts, or one comparison of the whole discovery (`whole`)
    where a result was not tied to one file; and what was compared now."""

    parts: dict[str, FileParts]
    whole: tuple[Comparison, list[Finding]] | None
    work: CompareWork


def cached_compare(discovery: Discovery, config: AuditConfig, upstream: UpstreamInfo, base: UpstreamInfo | None = None, *,
                   memo: Memo = NO_MEMO, known: dict[str, FileParts] | None = None,
                   ) -> tuple[Comparison, list[Finding], CompareWork]:
    """compare.compare, with each file's result kept under a key of its bytes, its registrations,
    the scope, the config, the upstream and base releases and the tool: a one-file change compares
    one file, and of it the functions whose text or reads changed. `known`: parts of files computed
    already for this very discovery (a child's compare of the discovery before the trace widened it,
    for files the widening cannot change: pipeline/incremental.py). Returns the comparison, its
    findings and what was compared now."""
    from metax_audit.stages.compare.side import _PortRefs

    refs = _PortRefs(discovery.root, config.port_package)  # one index of the port's references for both
    compared = compare_parts(discovery, config, upstream, base, memo=memo, known=known, refs=refs)
    if compared.whole is not None:
        return (*compared.whole, compared.work)
    return (*assemble(discovery, config, upstream, base, compared.parts, refs), compared.work)


def assemble(discovery: Discovery, config: AuditConfig, upstream: UpstreamInfo, base: UpstreamInfo | None,
             parts: dict[str, FileParts], refs: _PortRefs | None = None) -> tuple[Comparison, list[Finding]]:
    """The comparison of the discovery from every file's parts (in the discovery's order), its findings
    judged here, on every run, not kept per file: whether an upstream caller is live reads the whole port."""
    from metax_audit.stages.compare.liveness import judge_callers
    from metax_audit.stages.compare.side import _PortRefs

    files: list[FileComparison] = []
    drift: list[Difference] = []
    findings: list[Finding] = []
    for f in discovery.files:
        part = parts[f.path]
        files += part.files
        drift += part.drift
        findings += part.findings
    refs = refs or _PortRefs(discovery.root, config.port_package)
    unique = judge_callers(list({x.site: x for x in findings}.values()), discovery.root, config.port_package,
                           upstream.root, config.upstream_package, refs, config.max_file_bytes)
    return Comparison(upstream=upstream, base=base, files=tuple(files), drift=tuple(drift)), unique


def compare_parts(discovery: Discovery, config: AuditConfig, upstream: UpstreamInfo, base: UpstreamInfo | None = None, *,
                  memo: Memo = NO_MEMO, known: dict[str, FileParts] | None = None, refs: _PortRefs | None = None,
                  ) -> ComparedParts:
    """Each file's parts of the compare stage: from the per-file cache, from `known`, or compared now
    (and kept, `known` ones too: they are this discovery's results)."""
    from metax_audit.stages.compare import compare, compare_dependencies, module_of
    from metax_audit.stages.compare.side import _PortRefs
    from metax_audit.stages.compare.stage import KeptStore

    scope = frozenset(module_of(f.path) for f in discovery.files)
    # digested once: the scope listed in each file's key made the keys quadratic (10k files: 10k lists of 10k)
    enabled = memo.enabled
    common = memo.digest("compare-common", sorted(scope), repr(config), upstream, base)
    regs: dict[str, list[str]] = {}
    for r in discovery.registrations:
        for path in {r.location.path, r.resolved_path or ""}:
            regs.setdefault(path, []).append(f"{r.kind}|{r.name}|{r.class_path}|{r.resolved_path}")
    # A file's comparison also reads the platform file and where other port files name its functions.
    refs = refs or _PortRefs(discovery.root, config.port_package)
    digests: dict[str, str] = {}
    facts = {f.path: _file_facts(discovery.root, config, digests, f.path, memo) for f in discovery.files} if enabled else {}
    deps = compare_dependencies(discovery.root, config, list(facts), lambda path: facts[path][:2], refs) if enabled else {}
    keys = {f.path: (f.path, digests[f.path], f.parse_error, sorted(regs.get(f.path, [])),
                     deps.get(f.path, ""), common, _port_imports(discovery.root, f.path, facts[f.path][2], digests))
            for f in discovery.files} if enabled else {}
    hits: dict[str, FileParts] = {}
    for path, entry in keys.items():
        value = memo.load(Kind.COMPARE, *entry)
        if isinstance(value, tuple) and len(value) == 3:
            hits[path] = FileParts(*value)
    here = {f.path for f in discovery.files}
    given = {path: part for path, part in (known or {}).items() if path not in hits and path in here}
    missing = tuple(f for f in discovery.files if f.path not in hits and f.path not in given)
    fresh: dict[str, FileParts] = {}
    kept: KeptStore | None = None
    if missing or not discovery.files:
        from dataclasses import replace

        kept = KeptStore(lambda parts: memo.load(Kind.COMPARE_PARTS, common, parts),
                         lambda parts, value: memo.store(Kind.COMPARE_PARTS, value, common, parts)) if enabled else None
        comparison, found = compare(replace(discovery, files=missing), config, upstream, base, scope=scope, refs=refs, kept=kept,
                                    judge=False)
        paths = {f.path for f in missing}
        if any(c.path not in paths for c in comparison.files) or any(d.path not in paths for d in comparison.drift) \
                or any(x.location.path not in paths for x in found):
            # a result not tied to one file cannot be kept per file: compare everything, keep nothing
            return ComparedParts({}, compare(discovery, config, upstream, base), CompareWork(len(discovery.files)))
        # grouped in one pass (every path is one of `missing`, checked above): a scan of all results
        # per file was quadratic, 5 s of a 2,000-file review
        fresh = {f.path: FileParts([], [], []) for f in missing}
        for c in comparison.files:
            fresh[c.path].files.append(c)
        for d in comparison.drift:
            fresh[d.path].drift.append(d)
        for x in found:
            fresh[x.location.path].findings.append(x)
    if enabled:
        for path, value in (*fresh.items(), *given.items()):
            memo.store(Kind.COMPARE, tuple(value), *keys[path])
    work = CompareWork(len(missing), kept.functions_reused, kept.functions_compared) if kept is not None else CompareWork(len(missing))
    return ComparedParts({**hits, **given, **fresh}, None, work)
