# The compare stage: each in-scope port file against its upstream counterpart (by file or by class
# role), with a base release three-way.
from __future__ import annotations

import ast
import hashlib
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from metax_audit.core.comments import ODD_LINE_BREAKS
from metax_audit.core.config import AuditConfig
from metax_audit.core.findings import make_finding
from metax_audit.core.models import (
    Comparison,
    Difference,
    Discovery,
    FileComparison,
    Finding,
    Location,
    SourceFile,
    UpstreamInfo,
)
from metax_audit.core.pysource import find_module, parse, read_source_cached
from metax_audit.stages.compare.by_role import compare_roles
from metax_audit.stages.compare.consequence import VendorPlatform, port_imports, read_vendor_platform
from metax_audit.stages.compare.counterparts import (
    FileCounterpart,
    map_classes,
    map_file,
    module_of,
    read_registry,
    registered_members,
)
from metax_audit.stages.compare.grouping import _comparison_findings
from metax_audit.stages.compare.liveness import judge_callers
from metax_audit.stages.compare.load import _index, _load, _port_names, _rename_in_place, _same_text
from metax_audit.stages.compare.memo import MemberUnits, Recorder, logged_names, logged_platform
from metax_audit.stages.compare.roles import UpstreamClasses
from metax_audit.stages.compare.rules import R_UNREADABLE, R_VENDOR_ONLY
from metax_audit.stages.compare.side import _Env, _PortRefs, _Side
from metax_audit.stages.compare.structure import _compare_pair
from metax_audit.stages.compare.three_way import _reclassify_followed, _three_way, _upstream_changes


@dataclass
class _Run:
    """One review's comparison: its inputs, what every file shares, and what the files produced so far."""

    discovery: Discovery
    config: AuditConfig
    upstream: UpstreamInfo | None
    base: UpstreamInfo | None
    env: _Env
    registry: dict[str, str]
    up_classes: UpstreamClasses | None
    in_scope: frozenset[str]
    by_file: dict[str, dict[str, str]]  # registrations discover found, keyed by the file holding the class
    port_loader: Callable[[str], tuple[ast.Module, str] | None]
    kept: KeptStore | None = None  # where file-level parts and member units are kept (the result cache), None: nowhere
    findings: list[Finding] = field(default_factory=list)
    files: list[FileComparison] = field(default_factory=list)
    drift_all: list[Difference] = field(default_factory=list)

    @property
    def up_root(self) -> Path | None:
        return self.upstream.root if self.upstream else None


def compare(
    discovery: Discovery,
    config: AuditConfig,
    upstream: UpstreamInfo | None,
    base: UpstreamInfo | None = None,
    scope: frozenset[str] | None = None,
    refs: _PortRefs | None = None,
    kept: KeptStore | None = None,
    judge: bool = True,
) -> tuple[Comparison, list[Finding]]:
    """Compare each in-scope port file with its upstream counterpart; with `base`, three-way.
    `scope` (dotted modules under review) defaults to discovery's files; the per-file result cache
    compares a subset of the files against the whole review's scope (and hands over the index of the
    port's references it built for the files' keys, `refs`, and where parts of a file's comparison are kept, `kept`).
    `judge`: judge the override findings' upstream callers on the whole port (compare/liveness.py); the
    per-file cache keeps them unjudged and judges the review's findings together."""
    run = _setup(discovery, config, upstream, base, scope, refs)
    run.kept = kept
    for src in discovery.files:
        if src.path.endswith(".py"):
            _compare_file(run, src)
    findings = judge_callers(run.findings, discovery.root, config.port_package, run.up_root, config.upstream_package,
                             run.env.refs, config.max_file_bytes) if judge else run.findings
    return Comparison(upstream=upstream, base=base, files=tuple(run.files), drift=tuple(run.drift_all)), findings


def _setup(discovery: Discovery, config: AuditConfig, upstream: UpstreamInfo | None, base: UpstreamInfo | None,
           scope: frozenset[str] | None, refs: _PortRefs | None = None) -> _Run:
    up_root = upstream.root if upstream else None
    env = _Env(read_vendor_platform(discovery.root, config.platform_path), refs or _PortRefs(discovery.root, config.port_package),
               upstream.version if upstream else None, base.version if base else None,
               vendor_words=frozenset(w for m in config.modification_markers for w in re.findall(r"[a-z]{3,}", m.lower())[:1]))
    registry = read_registry(up_root, config.upstream_package)
    up_classes = UpstreamClasses(up_root, config.upstream_package) if up_root is not None else None
    in_scope = scope if scope is not None else frozenset(module_of(f.path) for f in discovery.files)
    return _Run(discovery, config, upstream, base, env, registry, up_classes, in_scope, _registrations_by_file(discovery),
                _port_loader(discovery.root, config))


def _port_loader(root: Path, config: AuditConfig) -> Callable[[str], tuple[ast.Module, str] | None]:
    def port_loader(module: str) -> tuple[ast.Module, str] | None:
        """A port module's tree (the port's own intermediate base classes), from the shared parse cache."""
        if not (module == config.port_package or module.startswith(config.port_package + ".")):
            return None
        rel = find_module(root, module)
        tree = read_source_cached(root, rel, config.max_file_bytes).tree if rel else None
        return (tree, rel) if tree is not None and rel is not None else None

    return port_loader


def _registrations_by_file(discovery: Discovery) -> dict[str, dict[str, str]]:
    """Registrations discover found (decorators and platform calls), keyed by the file holding the class."""
    by_file: dict[str, dict[str, str]] = {}
    for r in discovery.registrations:
        if r.kind in {"attention-backend", "decorator"} and r.resolved_path:
            member = r.name if "." in r.name else f"AttentionBackendEnum.{r.name}"
            by_file.setdefault(r.resolved_path, {})[r.class_path.rsplit(".", 1)[-1]] = member
    return by_file


def _compare_file(run: _Run, src: SourceFile) -> None:
    """One port file: recorded as not compared, vendor-only, by role, or compared with its counterpart."""
    files, findings, config, upstream = run.files, run.findings, run.config, run.upstream
    if src.parse_error:  # discover already reported it (MXA001 / MXA002)
        files.append(FileComparison(src.path, None, vendor_only=False))
        return
    port = _load(run.discovery.root / src.path, src.path, config, kept=lambda text, compute: _kept(
        run, ("comments", _digest(text), list(config.modification_markers), sys.version_info[:2]), compute))
    if port is None:
        files.append(FileComparison(src.path, None, vendor_only=False))
        findings.append(make_finding(R_UNREADABLE, Location(src.path), f"{src.path} could not be parsed; not compared"))
        return
    registered = registered_members(port.tree)
    registered.update({c: m for c, m in run.by_file.get(src.path, {}).items() if c in port.classes})
    cp = map_file(src.path, config, run.up_root, registered, run.registry, port.tree, run.up_classes, run.port_loader)
    if run.up_root is None:
        files.append(FileComparison(src.path, cp.upstream_path, vendor_only=False, declared_blocks=len(port.comments.blocks)))
        return
    if cp.vendor_only:
        files.append(FileComparison(src.path, None, vendor_only=True, declared_blocks=len(port.comments.blocks)))
        findings.append(make_finding(
            R_VENDOR_ONLY, Location(src.path), f"{src.path} has no upstream counterpart in {upstream.package if upstream else 'upstream'} {(upstream.version or '') if upstream else ''}".strip(),
            [cp.why_not or f"no {cp.upstream_path or 'mapped path'} under upstream; no registered enum member points to an upstream file"],
        ))
        return
    if cp.how == "role" and run.up_root is not None:
        files.append(_compare_by_role(src.path, port, cp, config, run.up_classes, run.base, upstream, findings, run.drift_all, run.env))
        return
    up = _load(run.up_root / (cp.upstream_path or ""), cp.upstream_path or "", config, port_side=False)
    if up is None:
        files.append(FileComparison(src.path, cp.upstream_path, vendor_only=False, declared_blocks=len(port.comments.blocks)))
        findings.append(make_finding(R_UNREADABLE, Location(src.path), f"upstream counterpart {cp.upstream_path} could not be read or parsed"))
        return
    _compare_counterpart(run, src.path, port, up, cp, registered)


def _compare_counterpart(run: _Run, path: str, port: _Side, up: _Side, cp: FileCounterpart, registered: dict[str, str]) -> None:
    """A port file with its upstream counterpart (two-way), and with the base release three-way."""
    config = run.config
    up_module = module_of(cp.upstream_path or "")
    class_map = map_classes(port.classes, up.classes, config, up_module, registered, run.registry)
    port.rename = {k: v for k, v in class_map.items() if k != v}
    if port.rename:
        # The parsed tree is shared with the other stages (pysource cache): rename on a private parse.
        port.tree = parse(port.text)  # cut as deep as the shared one (pysource.prune_deep)
        _rename_in_place(port.tree, port.rename)
    _index(port, class_map)
    base_side, file_env = _base_side(run, cp, up)
    renamed = (_digest(port.text), sorted(port.rename.items()))  # what the port side's (renamed) tree is made of
    port_names = _kept(run, ("port-names", *renamed, config.port_package), lambda: _port_names(port, config.port_package))
    file_env = replace(file_env, platform=_with_file(run, file_env.platform, port, path, renamed))
    units, parts = None, None
    # a unit's text is its lines as ast counts them: a file with a line break str.splitlines knows and ast does
    # not is compared without member units
    if run.kept is not None and not ODD_LINE_BREAKS.search(port.text):
        parts = _units_key(path, cp, class_map, port, up, base_side, file_env)
        units = MemberUnits(run.kept.load(parts), Recorder())
        file_env = replace(file_env, platform=logged_platform(file_env.platform, units.recorder))
        port_names = logged_names(port_names, units.recorder)
    diffs = list(_compare_pair(port, up, cp, base_side, run.in_scope, file_env, port_names, units))
    if run.kept is not None and units is not None and parts is not None:
        run.kept.functions_reused += units.served
        run.kept.functions_compared += units.computed
        if (kept := units.to_keep()) is not None:
            run.kept.store(parts, kept)
    drift: list[Difference] = []
    if base_side is not None:
        sides = base_side
        changes = _kept(run, ("upstream-changes", _digest(base_side.text), _digest(up.text), sys.version_info[:2]),
                        lambda: list(_upstream_changes(sides, up)))
        drift = list(_three_way(port, up, base_side, cp, file_env, changes))
        diffs = _reclassify_followed(diffs, drift)
        # Hunks the port kept in the base form belong to the three-way view too.
        seen = {(d.symbol, d.line) for d in drift}
        drift += [d for d in diffs if d.kind == "upstream-not-followed" and (d.symbol, d.line) not in seen]
        run.drift_all.extend(drift)
    diffs.sort(key=lambda d: (d.line, d.kind, d.symbol))
    run.files.append(FileComparison(
        path, cp.upstream_path, vendor_only=False, class_map=dict(class_map),
        differences=tuple(diffs), declared_blocks=len(port.comments.blocks),
    ))
    run.findings.extend(_comparison_findings(diffs, drift, cp, file_env))



@dataclass
class KeptStore:
    """Where parts of the files' comparisons are kept: load(parts) -> what is kept under parts or None,
    store(parts, value) (the result cache's, keyed with the tool, the config, the scope and the releases:
    compare/per_file.cached_compare); and how many functions were served from it or compared."""

    load: Callable[[tuple[object, ...]], Any]
    store: Callable[[tuple[object, ...], object], None]
    functions_reused: int = 0
    functions_compared: int = 0

_T = TypeVar("_T")


def _kept(run: _Run, parts: tuple[object, ...], compute: Callable[[], _T]) -> _T:
    """compute(), a pure function of what `parts` names, kept under it."""
    if run.kept is None:
        return compute()
    found = run.kept.load(parts)
    if isinstance(found, tuple) and len(found) == 1:
        return found[0]  # type: ignore[no-any-return]
    value = compute()
    run.kept.store(parts, (value,))
    return value


def _digest(text: str | None) -> str | None:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=20).hexdigest() if text is not None else None


def _with_file(run: _Run, platform: VendorPlatform, port: _Side, path: str, renamed: tuple[object, ...]) -> VendorPlatform:
    """platform.with_file for the port file, its own part (the constant functions, also those it imports
    from the port's modules, the constant attributes, the KV-cache dtypes) kept under the file's text and
    the imported modules' bytes."""
    root, package = run.discovery.root, run.config.port_package
    if run.kept is None:
        return platform.with_file(port.tree, path, root, package)
    imported = [(rel, _file_bytes_digest(root / rel)) for rel in sorted(port_imports(port.tree, package, root))]
    own = _kept(run, ("with-file", path, *renamed, package, imported, sys.version_info[:2]),
                lambda: replace(VendorPlatform().with_file(port.tree, path, root, package), answers={}))
    return replace(own, answers=platform.answers)


def _file_bytes_digest(path: Path) -> str:
    try:
        return hashlib.blake2b(path.read_bytes(), digest_size=20).hexdigest()
    except OSError as exc:
        return f"unreadable: {exc.errno}"


def _units_key(path: str, cp: FileCounterpart, class_map: dict[str, str], port: _Side, up: _Side, base: _Side | None,
               env: _Env) -> tuple[object, ...]:
    """What every member unit of a file reads besides its own text and its logged reads: the upstream and
    base files, the mapping of the file and its classes, the releases' state for the file, the interpreter."""
    return ("member-units", path, cp.upstream_path, cp.how, sorted(class_map.items()), sorted(port.rename.items()),
            _digest(up.text), _digest(base.text if base is not None else None), env.target, env.base, env.base_state,
            sorted(env.vendor_words), sys.version_info[:2])


def _base_side(run: _Run, cp: FileCounterpart, up: _Side) -> tuple[_Side | None, _Env]:
    """The base release's side of the file (None when there is no base or upstream did not change the
    file since it), and the file's environment saying which."""
    base, env = run.base, run.env
    base_file = base.root / (cp.upstream_path or "") if base is not None and base.root is not None else None
    file_env = env
    if base_file is not None and _same_text(base_file, up.text):
        base_file = None  # upstream did not touch this file between the releases: every difference is the port's
        file_env = replace(env, base_state="same")
    elif base is not None:
        file_env = replace(env, base_state="side")
    base_side = _load(base_file, cp.upstream_path or "", run.config, port_side=False) if base_file is not None else None
    return base_side, file_env


def _compare_by_role(path: str, port: _Side, cp: FileCounterpart, config: AuditConfig, up_classes: UpstreamClasses | None,
                     base: UpstreamInfo | None, upstream: UpstreamInfo | None, findings: list[Finding],
                     drift_all: list[Difference], env: _Env) -> FileComparison:
    """A file whose classes take upstream classes' roles: their contracts, not a copied file's lines."""
    assert up_classes is not None
    old = UpstreamClasses(base.root, config.upstream_package) if base is not None and base.root is not None else None
    versions = f"{base.version if base else '?'} -> {upstream.version if upstream else '?'}"
    pairs, role_findings = compare_roles(path, port.tree, list(cp.roles), up_classes, old, versions)
    findings.extend(role_findings)
    for diff, up_path in pairs:
        drift_all.append(diff)
        attributed = replace(diff, attribution="drift") if diff.kind == "upstream-not-followed" else diff
        findings.extend(_comparison_findings([], [attributed], replace(cp, upstream_path=up_path), env))
    return FileComparison(path, cp.upstream_path, vendor_only=False,
                          class_map={p.port_class: p.upstream_class for p in cp.roles},
                          differences=tuple(d for d, _ in pairs), declared_blocks=len(port.comments.blocks))
