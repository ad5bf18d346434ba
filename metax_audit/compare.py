# Structural comparison of each port file with its upstream counterpart (and, with a base
# release, of what upstream changed that the port did not follow); differences are classified.
from __future__ import annotations

import ast
import copy
import difflib
import hashlib
import keyword
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from metax_audit.comments import Comment, CommentMap, iter_statements, read_comments
from metax_audit.compare_roles import compare_roles
from metax_audit.config import AuditConfig
from metax_audit.consequence import (
    CAPABILITY_HOOK,
    NOT_KERNEL,
    VendorPlatform,
    enclosing_gate,
    fold,
    gate_of,
    kernel_call_changed,
    kernel_relevant,
    only_fields,
    only_port_names,
    read_vendor_platform,
    same_code,
)
from metax_audit.counterparts import (
    FileCounterpart,
    map_classes,
    map_file,
    module_of,
    read_registry,
    registered_members,
)
from metax_audit.findings import make_finding, rule
from metax_audit.models import (
    Category,
    Comparison,
    Difference,
    Discovery,
    FileComparison,
    Finding,
    Location,
    Severity,
    UpstreamInfo,
)
from metax_audit.pysource import dump, find_module, read_source_cached, unparse
from metax_audit.roles import UpstreamClasses

R_UNDECLARED = rule(
    "MXA201", Category.UNDECLARED_DIFFERENCE, Severity.WARNING,
    "port differs from its upstream counterpart without a declaration",
    "The port changes, adds or removes code relative to the upstream file it follows, and no vendor marker or "
    "comment in or directly above the changed statement says why. Declare the change with its reason (and the "
    "probe or test that proves it), or waive it. The hunks of one function are one finding, with one evidence "
    "line per hunk saying whether it may change a kernel or why it is info, and who changed it (port-only, or "
    "drift when upstream changed it after the base release: then it joins the drift finding).",
).id
R_ARCH = rule(
    "MXA202", Category.ARCH_CHECK, Severity.WARNING,
    "NVIDIA architecture/capability check kept, added or removed in the port",
    "An is_device_capability / has_device_capability / SM-number check answers a question about "
    "NVIDIA GPUs; on the vendor device it is either meaningless or decided by whatever capability "
    "the platform reports. Replace it with a vendor feature query, or declare why the number applies. "
    "The checks of one function are one finding listing each line; a predicate the vendor platform answers "
    "with a constant, an NVIDIA floor the port answers itself, or a check inherited unchanged is info.",
).id
R_DRIFT = rule(
    "MXA203", Category.UPSTREAM_DRIFT, Severity.WARNING,
    "upstream changed this between the base and target release and the port did not follow",
    "Between the base release the port was synced to and the target release, upstream added or "
    "changed a method, signature, default or kernel argument. The port still has the old form. "
    "Take the change, or declare why the vendor kernel cannot. Hunks of one function are one finding (with the "
    "function's port-only differences), and so is one upstream edit missed in several functions.",
).id
R_DRIFT_TAKEN = rule(
    "MXA204", Category.UPSTREAM_DRIFT, Severity.INFO,
    "upstream change between base and target release is followed by the port",
    "Recorded so the reviewer sees which upstream changes the sync took.",
).id
R_VENDOR_ONLY = rule(
    "MXA205", Category.COVERAGE, Severity.INFO,
    "port file has no upstream counterpart (vendor-only)",
    "No upstream file exists at the mapped path, in the config's path_map, or for the backend enum "
    "member the file registers. It is audited on its own; add a path_map entry if it was moved.",
).id
R_UNREADABLE = rule(
    "MXA206", Category.COVERAGE, Severity.WARNING,
    "port file or its upstream counterpart could not be compared",
    "One side could not be read or parsed, so no differences were computed for this file.",
).id

# Calls that ask about an NVIDIA architecture; names only, the receiver does not matter.
# `supports_compute_capability` is left out: calling it asks the backend's own hook (which the
# port overrides and which is compared as a class attribute), not an NVIDIA question.
ARCH_CALLS = frozenset({
    "is_device_capability", "has_device_capability", "get_device_capability",
    "is_device_capability_family", "DeviceCapability",
    "is_blackwell", "is_hopper", "is_sm90", "is_sm100", "is_sm100f_supported",
})
# Platform predicates that are false on an out-of-tree port: a branch under one of them never runs there.
FOREIGN_PLATFORM_CALLS = frozenset({"is_rocm", "is_xpu", "is_tpu", "is_cpu", "is_hpu", "is_neuron"})
# Superset of every ARCH_CALLS name and SM string, searched once over the whole file text.
_ARCH_TEXT = re.compile(r"capabilit|hopper|blackwell|sm_?\d", re.IGNORECASE)
_SM_TEXT = re.compile(r"\bsm_?(?:[6-9]\d|1[0-2]\d)[a-z]?\b", re.IGNORECASE)
_LOG_METHODS = frozenset({"debug", "info", "warning", "warning_once", "info_once", "debug_once", "error", "exception"})
_CAPABILITY_QUERY = re.compile(r"^(is_\w+|supports_\w+|has_\w+|\w+_supports_\w+|\w+_supported|\w+_available)$")
_CLASS_ATTR_METHODS = re.compile(r"^(get_supported_\w+|supports_\w+|get_supported_kernel_block_sizes|get_min_block_size)$")

ACTIONS: dict[str, tuple[str, str]] = {
    # kind -> (action, validation); the action follows from what the evidence shows.
    "vendor-kernel-import": (
        "keep if the vendor callable implements the same contract; confirm every argument the call sites pass is accepted",
        "signature check of the vendor callable; probe the kernel family it implements",
    ),
    "port-module-import": (
        "none if the port's module is in scope: it is compared with its own upstream counterpart",
        "the review of the imported port module",
    ),
    "foreign-platform-branch": (
        "none: the branch is guarded by another platform's predicate, which is false on the port's platform",
        "none",
    ),
    "arch-check": (
        "replace the NVIDIA capability test with a vendor feature query, or state which vendor capability value makes it correct",
        "record current_platform.get_device_capability() on the vendor device; port tests on both sides of the check",
    ),
    "feature-disabled": (
        "declare it and reject the configuration up front (platform check_and_update_config) instead of failing mid-forward",
        "port tests: the disabled path raises a clear error; the enabled paths still pass",
    ),
    "fallback-added": (
        "document the condition that selects the fallback and which kernel each branch calls",
        "probe both branches (same inputs, both paths) against the reference",
    ),
    "argument-commented-out": (
        "check the installed vendor kernel: restore the argument if it now exists, otherwise declare what the default implies",
        "signature check of the kernel; probe the semantics the argument controls",
    ),
    "upstream-not-followed": (
        "take the upstream change, or declare why the vendor kernel cannot support it",
        "port tests on the changed path; signature check where a kernel argument changed",
    ),
    "signature-changed": (
        "check every caller passes the port's parameters; declare the reason",
        "signature check; port tests",
    ),
    "class-attribute": (
        "confirm the vendor kernel supports exactly the listed values (dtypes, kv-cache dtypes, block/head sizes)",
        "probe with each listed value (layout, fp8-scale) on the vendor device",
    ),
    "call-changed": (
        "confirm the changed arguments match the vendor kernel's contract",
        "signature check; probe the kernel family",
    ),
    "added": ("declare why the port needs it", "port tests covering the added code"),
    "removed": ("declare why the port drops it (vendor kernel lacks the feature?)", "port tests; signature check"),
    "changed": ("declare the reason for the vendor change", "port tests on the changed path"),
    "cosmetic": ("none", "none"),
    "moved": ("confirm the new order computes the same values", "port tests on the function"),
}


@dataclass
class _Tok:
    key: str
    node: ast.AST  # shallow copy (sub-bodies emptied)
    line: int
    end: int
    depth: int
    arch: bool = False  # holds a capability check (set once, text-prefiltered)


@dataclass
class _Side:
    path: str
    text: str
    tree: ast.Module
    comments: CommentMap
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    funcs: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = field(default_factory=dict)
    attrs: dict[str, ast.stmt] = field(default_factory=dict)  # "Cls.name" or "name" (module)
    imports: dict[str, tuple[str, int]] = field(default_factory=dict)  # bound name -> (module, line)
    order: list[str] = field(default_factory=list)  # member qualnames in file order
    other: list[ast.stmt] = field(default_factory=list)  # remaining module-level statements
    rename: dict[str, str] = field(default_factory=dict)  # port class -> upstream class, where they differ
    arch_lines: frozenset[int] = frozenset()  # lines whose text could hold a capability check
    lines: list[str] = field(default_factory=list)
    import_ends: dict[int, int] = field(default_factory=dict)  # import statement line -> last line


@dataclass(frozen=True)
class _Env:
    """What every file's comparison shares: the vendor platform's fixed answers, the port's references,
    the two release versions and whether the base release is known for the file."""

    platform: VendorPlatform
    refs: _PortRefs
    target: str | None
    base: str | None
    base_state: str = "none"  # "none": no --base | "same": upstream did not change the file | "side": three-way
    vendor_words: frozenset[str] = frozenset()  # the vendor's name as the modification markers spell it ("metax")

    def attribution(self, drift: bool) -> str:
        if drift:
            return "drift"
        return "port-only" if self.base_state != "none" else ""


class _PortRefs:
    """Whole-word references to a name anywhere in the port package (read lazily, once): an index of
    which files name which identifiers, and the lines for the files that do."""

    def __init__(self, root: Path, package: str) -> None:
        self._dir = root / package.replace(".", "/")
        self._texts: dict[str, str] | None = None
        self._index: dict[str, set[str]] = {}
        self._cache: dict[tuple[str, str, int, int], list[tuple[str, int]]] = {}

    def _load(self) -> dict[str, str]:
        if self._texts is None:
            self._texts = {}
            for f in sorted(self._dir.rglob("*.py")) if self._dir.is_dir() else []:
                try:
                    rel = f.relative_to(self._dir.parent).as_posix()
                    self._texts[rel] = f.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError, ValueError):
                    continue
                for ident in set(re.findall(r"[A-Za-z_]\w*", self._texts[rel])):
                    self._index.setdefault(ident, set()).add(rel)
        return self._texts

    def files_naming(self, name: str) -> frozenset[str]:
        """The port files whose text names `name` (anywhere: code, strings, comments)."""
        self._load()
        return frozenset(self._index.get(name, ()))

    def uses(self, name: str, path: str, first: int, last: int) -> list[tuple[str, int]] | None:
        """Where `name` occurs in the port package outside lines first..last of `path` (its own definition);
        None when there is no port package to search."""
        key = (name, path, first, last)
        if key not in self._cache:
            texts = self._load()
            if not texts:
                return None
            pattern = re.compile(rf"(?<![\w]){re.escape(name)}(?![\w])")
            found: list[tuple[str, int]] = []
            for rel in sorted(self._index.get(name, ())):
                text = texts[rel]
                for m in pattern.finditer(text):
                    line = text.count("\n", 0, m.start()) + 1
                    if not (rel == path and first <= line <= last):
                        found.append((rel, line))
                        if len(found) > 20:
                            break
            self._cache[key] = found
        return self._cache[key]


def compare_dependencies(root: Path, config: AuditConfig, paths: Sequence[str]) -> dict[str, str]:
    """What each file's comparison reads besides the file itself, as a digest per file: the platform file
    (the vendor's fixed answers) and which other port files name the functions the file defines (code the
    port never calls is judged from them). The per-file result cache keys on it."""
    platform = root / config.platform_path
    try:
        base = hashlib.sha1(platform.read_bytes() if platform.is_file() else b"-")
    except OSError:
        base = hashlib.sha1(b"?")
    refs = _PortRefs(root, config.port_package)
    out: dict[str, str] = {}
    for path in paths:
        h = base.copy()
        src = read_source_cached((root / path).parent, Path(path).name, config.max_file_bytes)
        names = sorted({n.name for n in ast.walk(src.tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}) \
            if src.tree is not None else []
        for name in names:
            h.update(f"{name}:{sorted(refs.files_naming(name) - {path})};".encode())
        out[path] = h.hexdigest()[:16]
    return out


def _default_env() -> _Env:
    return _Env(VendorPlatform(), _PortRefs(Path("/nonexistent"), "_"), None, None)


def _port_names(side: _Side, package: str) -> frozenset[str]:
    """Names the port file defines at module or class level, or imports from its own package (its own
    classes, functions and ops); a function's local variables are not among them."""
    names: set[str] = set()
    root = package.split(".")[0]
    for node in ast.walk(side.tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == root):
            names.update(a.asname or a.name for a in node.names)
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
    for node in ast.walk(side.tree):  # ops the port registers itself: direct_register_custom_op(op_name="x", ...)
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg == "op_name" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                    names.add(kw.value.value)
    return frozenset(names)


# ---------------------------------------------------------------- entry point


def compare(
    discovery: Discovery,
    config: AuditConfig,
    upstream: UpstreamInfo | None,
    base: UpstreamInfo | None = None,
    scope: frozenset[str] | None = None,
) -> tuple[Comparison, list[Finding]]:
    """Compare each in-scope port file with its upstream counterpart; with `base`, three-way.
    `scope` (dotted modules under review) defaults to discovery's files; the per-file result cache
    compares a subset of the files against the whole review's scope."""
    findings: list[Finding] = []
    files: list[FileComparison] = []
    drift_all: list[Difference] = []
    up_root = upstream.root if upstream else None
    env = _Env(read_vendor_platform(discovery.root, config.platform_path), _PortRefs(discovery.root, config.port_package),
               upstream.version if upstream else None, base.version if base else None,
               vendor_words=frozenset(w for m in config.modification_markers for w in re.findall(r"[a-z]{3,}", m.lower())[:1]))
    registry = read_registry(up_root, config.upstream_package)
    up_classes = UpstreamClasses(up_root, config.upstream_package) if up_root is not None else None

    def port_loader(module: str) -> tuple[ast.Module, str] | None:
        """A port module's tree (the port's own intermediate base classes), from the shared parse cache."""
        if not (module == config.port_package or module.startswith(config.port_package + ".")):
            return None
        rel = find_module(discovery.root, module)
        tree = read_source_cached(discovery.root, rel, config.max_file_bytes).tree if rel else None
        return (tree, rel) if tree is not None and rel is not None else None

    in_scope = scope if scope is not None else frozenset(module_of(f.path) for f in discovery.files)
    # Registrations discover found (decorators and platform calls), keyed by the file holding the class.
    by_file: dict[str, dict[str, str]] = {}
    for r in discovery.registrations:
        if r.kind in {"attention-backend", "decorator"} and r.resolved_path:
            member = r.name if "." in r.name else f"AttentionBackendEnum.{r.name}"
            by_file.setdefault(r.resolved_path, {})[r.class_path.rsplit(".", 1)[-1]] = member
    for src in discovery.files:
        if not src.path.endswith(".py"):
            continue
        if src.parse_error:  # discover already reported it (MXA001 / MXA002)
            files.append(FileComparison(src.path, None, vendor_only=False))
            continue
        port = _load(discovery.root / src.path, src.path, config)
        if port is None:
            files.append(FileComparison(src.path, None, vendor_only=False))
            findings.append(make_finding(R_UNREADABLE, Location(src.path), f"{src.path} could not be parsed; not compared"))
            continue
        registered = registered_members(port.tree)
        registered.update({c: m for c, m in by_file.get(src.path, {}).items() if c in port.classes})
        cp = map_file(src.path, config, up_root, registered, registry, port.tree, up_classes, port_loader)
        if up_root is None:
            files.append(FileComparison(src.path, cp.upstream_path, vendor_only=False, declared_blocks=len(port.comments.blocks)))
            continue
        if cp.vendor_only:
            files.append(FileComparison(src.path, None, vendor_only=True, declared_blocks=len(port.comments.blocks)))
            findings.append(make_finding(
                R_VENDOR_ONLY, Location(src.path), f"{src.path} has no upstream counterpart in {upstream.package if upstream else 'upstream'} {(upstream.version or '') if upstream else ''}".strip(),
                [cp.why_not or f"no {cp.upstream_path or 'mapped path'} under upstream; no registered enum member points to an upstream file"],
            ))
            continue
        if cp.how == "role" and up_root is not None:
            files.append(_compare_by_role(src.path, port, cp, config, up_classes, base, upstream, findings, drift_all, env))
            continue
        up = _load(up_root / (cp.upstream_path or ""), cp.upstream_path or "", config, port_side=False)
        if up is None:
            files.append(FileComparison(src.path, cp.upstream_path, vendor_only=False, declared_blocks=len(port.comments.blocks)))
            findings.append(make_finding(R_UNREADABLE, Location(src.path), f"upstream counterpart {cp.upstream_path} could not be read or parsed"))
            continue
        up_module = module_of(cp.upstream_path or "")
        class_map = map_classes(port.classes, up.classes, config, up_module, registered, registry)
        port.rename = {k: v for k, v in class_map.items() if k != v}
        if port.rename:
            # The parsed tree is shared with the other stages (pysource cache): rename on a private parse.
            port.tree = ast.parse(port.text)
            _rename_in_place(port.tree, port.rename)
        _index(port, class_map)
        base_file = base.root / (cp.upstream_path or "") if base is not None and base.root is not None else None
        file_env = env
        if base_file is not None and _same_text(base_file, up.text):
            base_file = None  # upstream did not touch this file between the releases: every difference is the port's
            file_env = replace(env, base_state="same")
        elif base is not None:
            file_env = replace(env, base_state="side")
        base_side = _load(base_file, cp.upstream_path or "", config, port_side=False) if base_file is not None else None
        port_names = _port_names(port, config.port_package)
        file_env = replace(file_env, platform=file_env.platform.with_file(port.tree, src.path))
        diffs = list(_compare_pair(port, up, cp, base_side, in_scope, file_env, port_names))
        drift: list[Difference] = []
        if base_side is not None:
            drift = list(_three_way(port, up, base_side, cp, file_env))
            diffs = _reclassify_followed(diffs, drift)
            # Hunks the port kept in the base form belong to the three-way view too.
            seen = {(d.symbol, d.line) for d in drift}
            drift += [d for d in diffs if d.kind == "upstream-not-followed" and (d.symbol, d.line) not in seen]
            drift_all.extend(drift)
        diffs.sort(key=lambda d: (d.line, d.kind, d.symbol))
        files.append(FileComparison(
            src.path, cp.upstream_path, vendor_only=False, class_map=dict(class_map),
            differences=tuple(diffs), declared_blocks=len(port.comments.blocks),
        ))
        findings.extend(_comparison_findings(diffs, drift, cp, file_env))
    return Comparison(upstream=upstream, base=base, files=tuple(files), drift=tuple(drift_all)), findings


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


# ---------------------------------------------------------------- loading and indexing


def _load(path: Path, rel: str, config: AuditConfig, port_side: bool = True) -> _Side | None:
    src = read_source_cached(path.parent, path.name, config.max_file_bytes)
    if src.tree is None or src.text is None:
        return None
    text, tree = src.text, src.tree
    # Upstream comments only serve to recognise comments the port copied: a line scan is enough.
    comments = read_comments(text, config.modification_markers, tree) if port_side else _rough_comments(text)
    side = _Side(rel, text, tree, comments, lines=text.splitlines())
    # A cheap text prefilter: only statements on these lines are walked for capability checks.
    side.arch_lines = _match_lines(text, _ARCH_TEXT)
    if not port_side:
        _index(side, {})
    else:
        side.classes = {n.name: n for n in iter_statements(tree.body) if isinstance(n, ast.ClassDef)}
    return side


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
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in mapping:
            node.id = mapping[node.id]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in mapping:
            node.value = mapping[node.value]


# ---------------------------------------------------------------- two-way comparison


def _compare_pair(port: _Side, up: _Side, cp: FileCounterpart, base: _Side | None = None,
                  in_scope: frozenset[str] = frozenset(), env: _Env | None = None,
                  port_names: frozenset[str] = frozenset()) -> Iterator[Difference]:
    up_comments = {_squash(c.text) for c in up.comments.comments.values()}
    ctx = _Ctx(port, up, cp, port.rename, up_comments, base, in_scope, env or _default_env(), port_names)
    for d in _compare_imports(ctx):
        yield _member(ctx, d)
    yield from _compare_members(ctx)
    yield from _compare_body(ctx, "<module>", up.other, port.other, anchor=1, bbody=base.other if base else None)


@dataclass
class _Ctx:
    port: _Side
    up: _Side
    cp: FileCounterpart
    rename: dict[str, str]
    up_comments: set[str]
    base: _Side | None = None  # the upstream release the port was synced to, when known
    in_scope: frozenset[str] = frozenset()  # dotted modules of the files under review
    env: _Env | None = None
    port_names: frozenset[str] = frozenset()  # names the port defines or imports from its own package

    @property
    def platform(self) -> VendorPlatform:
        return self.env.platform if self.env is not None else VendorPlatform()

    def never_called(self, qual: str, depth: int = 0) -> str:
        """Evidence that the port never calls this function (module-level or private), or "": every
        reference to its name in the port package lies in its own body or in functions never called."""
        fn = self.port.funcs.get(qual)
        if fn is None or self.env is None or depth > 3:
            return ""
        short = fn.name
        if "." in qual and not (short.startswith("_") and not short.startswith("__")):
            return ""  # a public method may be called by the framework through its base class
        if "." in qual and self._inherited_caller(qual, short):
            return ""
        uses = self.env.refs.uses(short, self.port.path, _start(fn), fn.end_lineno or fn.lineno)
        if uses is None:
            return ""
        callers = []
        for rel, line in uses:
            owner = self._top_function(line) if rel == self.port.path else None
            if owner is None or not self.never_called(owner, depth + 1):
                return ""
            callers.append(owner)
        via = f" (only from {', '.join(sorted(set(callers)))}, itself never called)" if callers else ""
        return f"{qual} is never referenced in the port package outside its own definition{via}"

    def _inherited_caller(self, qual: str, short: str) -> bool:
        """The port class has a base class and upstream's file calls the method: code the port inherits may call it."""
        cls = self.port.classes.get(qual.rsplit(".", 1)[0])
        if cls is None or not cls.bases:
            return False
        ufn = self.up.funcs.get(qual)
        first, last = (_start(ufn), ufn.end_lineno or ufn.lineno) if ufn is not None else (0, 0)
        for m in re.finditer(rf"(?<![\w]){re.escape(short)}(?![\w])", self.up.text):
            line = self.up.text.count("\n", 0, m.start()) + 1
            if not first <= line <= last:
                return True
        return False

    def _top_function(self, line: int) -> str | None:
        for qual, fn in self.port.funcs.items():
            if "." not in qual and _start(fn) <= line <= (fn.end_lineno or fn.lineno):
                return qual
        return None

    def diff(self, kind: str, line: int, symbol: str, detail: str, span: tuple[int, int] | None = None,
             upstream_line: int | None = None) -> Difference:
        first, last = span or (line, line)
        declared, reason = self.declaration(first, last)
        action, validation = ACTIONS.get(kind, ACTIONS["changed"])
        return Difference(kind, self.port.path, line, symbol, declared, reason, action, validation, detail, upstream_line)

    def declaration(self, first: int, last: int) -> tuple[bool, str]:
        cm = self.port.comments
        block = cm.block_for(first, last)
        if block is not None:
            return True, _short(block.reason) or "Metax Modification block (no reason written)"
        # A vendor comment in or directly above the changed statement declares it (a marker anywhere in it
        # is a block above); a comment copied from upstream explains upstream's code, and a commented-out
        # argument is the change itself, not its reason.
        words = self.env.vendor_words if self.env is not None else frozenset()
        inside = [c.text for c in cm.comments_in(first, last) if not c.trailing and not _is_code(c.text)
                  and any(w in c.text.lower() for w in words) and not _LEGAL.search(c.text)]
        for lines in (cm.lines_above(first), cm.trailing_lines(first, last), inside):
            if any(_squash(t) not in self.up_comments and not _is_code(t) for t in lines):
                return True, _short(" ".join(lines))
        return False, ""

    def mentioned(self, name: str) -> tuple[bool, str]:
        """A vendor comment anywhere in the port names `name`: declares why it was dropped."""
        short = name.rsplit(".", 1)[-1]
        pattern = re.compile(rf"(?<![\w]){re.escape(short)}(?![\w])")
        cm = self.port.comments
        for line, c in sorted(cm.comments.items()):
            if pattern.search(c.text) and _squash(c.text) not in self.up_comments:
                block = cm.block_for(line)
                text = block.reason if block is not None and block.reason else " ".join(cm.run_at(line) or [c.text])
                return True, _short(text)
        return False, ""

    def removal(self, kind: str, anchor: int, symbol: str, detail: str, upstream_line: int | None) -> Difference:
        d = self.diff(kind, anchor, symbol, detail, (anchor, anchor) if anchor else (0, 0), upstream_line)
        if not d.declared:
            declared, reason = self.mentioned(symbol)
            if declared:
                d = replace(d, declared=True, reason=reason)
        return d


def _compare_imports(ctx: _Ctx) -> Iterator[Difference]:
    """Import differences, one per import statement (a swapped block is one change, not one per name)."""
    port_pkg = ctx.cp.path.split("/")[0]
    up_pkg = (ctx.cp.upstream_path or "").split("/")[0]
    # (port statement line, kind) -> [(name, port module, upstream module or "", upstream line)]
    groups: dict[tuple[int, str], list[tuple[str, str, str, int | None]]] = {}
    for name, (pmod, pline) in sorted(ctx.port.imports.items(), key=lambda kv: kv[1][1]):
        if name in ctx.rename:
            continue
        root = pmod.lstrip(".").split(".")[0]
        own = root == port_pkg or pmod.startswith(".")  # relative imports stay inside the port package
        if name in ctx.up.imports:
            umod, uline = ctx.up.imports[name]
            if umod == pmod:
                continue
            if own and pmod.replace(port_pkg, up_pkg, 1) == umod and pmod in ctx.in_scope:
                kind = "port-module-import"  # the port's own copy of the same module, compared as its own file
            elif own or (root and root != up_pkg and root != umod.split(".")[0]):
                kind = "vendor-kernel-import"
            elif pmod.replace(port_pkg, up_pkg, 1) == umod:
                kind = "cosmetic"
            else:
                kind = "changed"
            groups.setdefault((pline, kind), []).append((name, pmod, umod, uline))
        else:
            # A helper import follows from code added elsewhere (reported there); a kernel import is the news.
            if own:
                kind = "port-module-import"
            elif root not in {up_pkg, ""} and _kernelish(pmod):
                kind = "vendor-kernel-import"
            else:
                kind = "cosmetic"
            groups.setdefault((pline, kind), []).append((name, pmod, "", None))
    for (pline, kind), items in groups.items():
        names = ", ".join(n for n, *_ in items)
        pmods = sorted({p for _, p, _, _ in items})
        umods = sorted({u for _, _, u, _ in items if u})
        new = [n for n, _, u, _ in items if not u]
        where = f"upstream imports from {', '.join(umods)}" if umods else ""
        if new:
            where += ("; " if where else "") + f"not imported upstream: {', '.join(new)}"
        ulines = [u for *_, u in items if u]
        detail = f"import {names} from {', '.join(pmods)} ({where})"
        yield ctx.diff(kind, pline, names, detail, _stmt_span(ctx.port, pline), min(ulines) if ulines else None)
    yield from _removed_imports(ctx)


def _removed_imports(ctx: _Ctx) -> Iterator[Difference]:
    """Upstream imports the port lacks, one per upstream import statement.

    A name the port never mentions went with the upstream code that used it, which is reported where
    that code was; a name the port defines itself is a local replacement, which is the news."""
    used, bound = _names_used(ctx.port.tree)
    aliases = _aliases(ctx.port.tree)
    groups: dict[tuple[int, str], list[tuple[str, str]]] = {}
    for name, (umod, uline) in sorted(ctx.up.imports.items(), key=lambda kv: kv[1][1]):
        if name in ctx.port.imports or name in ctx.rename.values():
            continue
        if aliases.get(name) == f"{umod}.{name}":
            kind = "cosmetic"  # `x = mod.x` names the very object upstream imports: an alias, not a port definition
        elif name in bound:
            # Upstream defining it too means its import was a local one for that same module-level name.
            up_defines = name in ctx.up.funcs or name in ctx.up.classes or name in ctx.up.attrs
            kind = "cosmetic" if up_defines else "changed"
        elif name not in used or not _kernelish(umod):
            kind = "cosmetic"  # a dropped helper import, or one whose users the port dropped too
        else:
            kind = "removed"
        groups.setdefault((uline, kind), []).append((name, umod))
    for (uline, kind), items in groups.items():
        names = ", ".join(n for n, _ in items)
        umods = ", ".join(sorted({m for _, m in items}))
        if kind == "changed":
            line = min(bound[n] for n, _ in items)
            d = ctx.removal(kind, line, names, f"the port defines {names} itself instead of importing it from {umods}", uline)
            own = sorted({aliases[n] for n, _ in items if aliases.get(n, "").startswith(ctx.cp.path.split("/")[0] + ".")})
            yield replace(d, note=f"swap to the port's own op: {', '.join(own)}") if own and len(own) == len(items) else d
        elif kind == "cosmetic":
            yield ctx.removal(kind, 0, names, f"upstream imports {names} from {umods}; the port neither imports nor uses them", uline)
        else:
            yield ctx.removal(kind, 0, names, f"upstream imports {names} from {umods}; the port uses the name(s) but does not import them", uline)


def _same_upstream_object(ctx: _Ctx, name: str) -> bool:
    """The port binds `name` to upstream's own module-level object (import or alias of its module)."""
    up_module = module_of(ctx.cp.upstream_path or "")
    imported = ctx.port.imports.get(name)
    if imported is not None and imported[0] == up_module:
        return True
    return _aliases(ctx.port.tree).get(name) == f"{up_module}.{name}"


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Names bound to another module's object (`x = ops.x` after `from vllm import _custom_ops as ops`),
    as the dotted path of that object."""
    modules: dict[str, str] = {}
    for node in iter_statements(tree.body):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
        elif isinstance(node, ast.Import):
            modules.update({a.asname or a.name: a.name for a in node.names})
    out: dict[str, str] = {}
    for node in iter_statements(tree.body):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = node.value
            if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and value.value.id in modules:
                out.setdefault(node.targets[0].id, f"{modules[value.value.id]}.{value.attr}")
            elif isinstance(value, ast.Name) and value.id in modules:
                out.setdefault(node.targets[0].id, modules[value.id])
    return out


def _names_used(tree: ast.AST) -> tuple[frozenset[str], dict[str, int]]:
    """Names the file reads, and names it binds itself (assignment, def, class) with the first line."""
    used: set[str] = set()
    bound: dict[str, int] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            if isinstance(n.ctx, ast.Store):
                bound[n.id] = min(bound.get(n.id, n.lineno), n.lineno)
            else:
                used.add(n.id)
        elif isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound[n.name] = min(bound.get(n.name, n.lineno), n.lineno)
    return frozenset(used), bound


def _kernelish(module: str) -> bool:
    low = module.lower()
    return any(k in low for k in ("flash", "attn", "mla", "kernel", "ops", "triton"))


def _compare_members(ctx: _Ctx) -> Iterator[Difference]:
    port, up = ctx.port, ctx.up
    # Classes present on one side only.
    for name, cls in up.classes.items():
        if name not in port.classes and not _parent_missing(name, port.classes, up.classes):
            yield _member(ctx, ctx.removal("removed", 0, name, f"upstream class {name} has no port counterpart", cls.lineno))
    for name, cls in port.classes.items():
        if name not in up.classes and not _parent_missing(name, up.classes, port.classes):
            kind = "added"
            yield _member(ctx, ctx.diff(kind, cls.lineno, name, f"class {cls.name} is not in upstream", (_start(cls), cls.lineno)))
    # Functions and methods.
    for qual, ufn in up.funcs.items():
        owner = qual.rsplit(".", 1)[0] if "." in qual else ""
        if qual in port.funcs:
            yield from _compare_function(ctx, qual, ufn, port.funcs[qual])
        elif owner and owner not in port.classes:
            continue  # the whole class is already reported
        elif owner and _inherits(port.classes[owner], owner):
            continue  # the port class subclasses upstream's: the method is inherited, not removed
        elif not owner and _same_upstream_object(ctx, qual):
            continue  # the port imports or aliases upstream's own function: the same object, not a removal
        else:
            anchor = _anchor(ctx, qual)
            removal = ctx.removal("removed", anchor, qual, f"upstream {qual}{_sig(ufn)} is absent from the port", ufn.lineno)
            yield _member(ctx, replace(removal, note=_base_behaviour(ctx, ufn)))
    for qual, pfn in port.funcs.items():
        owner = qual.rsplit(".", 1)[0] if "." in qual else ""
        if qual in up.funcs or (owner and owner not in up.classes):
            continue
        kind = "feature-disabled" if _only_raises(pfn) else "added"
        kind = "arch-check" if kind == "added" and _arch_in(pfn) else kind
        detail = f"{qual}{_sig(pfn)} is not in upstream" + (" (body only raises)" if kind == "feature-disabled" else "")
        yield _member(ctx, ctx.diff(kind, pfn.lineno, qual, detail, (_start(pfn), pfn.lineno)))
    # Class attributes and module constants.
    for key in sorted(set(up.attrs) | set(port.attrs)):
        owner = key.rsplit(".", 1)[0] if "." in key else ""
        if owner and (owner not in up.classes or owner not in port.classes):
            continue
        u, p = up.attrs.get(key), port.attrs.get(key)
        kind = "class-attribute" if owner else "changed"
        if u is not None and p is not None:
            if dump(u) != dump(p):
                b = ctx.base.attrs.get(key) if ctx.base is not None else None
                if b is not None and dump(b) == dump(p):
                    kind = "upstream-not-followed"  # upstream changed it after the base release; the port has the old value
                yield _member(ctx, ctx.diff(kind, p.lineno, key, f"{key}: {_value_delta(u, p)}", (p.lineno, p.end_lineno or p.lineno), u.lineno))
        elif p is not None:
            yield _member(ctx, ctx.diff(kind if owner else "added", p.lineno, key, f"{key} = {_value(p)} is not in upstream", (p.lineno, p.end_lineno or p.lineno)))
        elif u is not None and not (owner and _inherits(port.classes[owner], owner)):
            anchor = _anchor(ctx, key)
            if not owner and _is_logger(u):
                kind = "cosmetic"  # a module logger: dropping it changes no behaviour the review checks
            yield _member(ctx, ctx.removal(kind if owner else kind.replace("changed", "removed"), anchor, key,
                              f"upstream {key} = {_value(u)} is absent from the port", u.lineno))


def _member(ctx: _Ctx, d: Difference) -> Difference:
    """Note and attribution of a member-level or import difference (a whole member, field or import)."""
    short = d.symbol.rsplit(".", 1)[-1]
    note = ""
    if d.kind == "port-module-import":
        note = ("the port's own copy of the module upstream imports from, compared as its own file" if "upstream imports" in d.detail
                else "an import from the port's own package (the code using it is reported where it is)")
    elif d.kind == "vendor-kernel-import" and "upstream imports from" not in d.detail:
        note = ("a new import from the kernel package, no upstream import replaced: the import check verifies it resolves "
                "and its uses are compared where they are")
    elif d.kind == "vendor-kernel-import" and d.detail.split(" from ", 1)[-1].startswith((ctx.cp.path.split("/")[0] + ".", ".")):
        note = "swap to the port's own module: " + d.detail.split(" (", 1)[0]
    elif d.kind in {"removed", "class-attribute"} and d.detail.endswith(_ABSENT) and not CAPABILITY_HOOK.match(short):
        note = "an upstream member the port does not provide (not a capability hook the framework calls)"
    elif d.kind in {"added", "class-attribute"} and d.detail.endswith("is not in upstream"):
        note = "a field only the port adds" if " = " in d.detail.split(" is not in upstream")[0] else \
            "port-only code: nothing upstream to compare with (its calls are checked against the installed stack)"
    elif d.kind == "feature-disabled":
        note = "the port rejects this path (its body only raises): a path it does not run"
    elif d.kind == "class-attribute" and "port drops" in d.detail and "port adds" not in d.detail:
        note = "the port narrows the list: the values it drops are refused at backend selection"
    elif d.kind == "signature-changed":
        fn = ctx.port.funcs.get(d.symbol)
        binds = _callers_bind(ctx, fn, "." in d.symbol) if fn is not None else ""
        note = binds or ("" if kernel_relevant([d.detail]) else NOT_KERNEL)
    elif d.kind == "changed" and d.detail.startswith("the port defines"):
        note = ""
    elif d.kind in {"class-attribute", "changed"} and " / port " in d.detail:
        upstream_text, port_text = d.detail.split(": upstream ", 1)[-1].split(" / port ", 1)
        pairs = _text_pairs(upstream_text, port_text)
        if pairs and only_port_names(pairs, ctx.port_names):
            note = "swap to the port's own class or op: " + "; ".join(f"{a} -> {b}" for a, b in pairs[:3])
        elif not kernel_relevant(a + " " + b for a, b in pairs):
            note = NOT_KERNEL
    elif d.kind == "changed" and not d.detail.startswith("import ") and not kernel_relevant([d.detail]):
        note = NOT_KERNEL
    if not note and d.kind not in {"removed", "signature-changed"} and d.symbol in ctx.port.funcs:
        gate = ctx.never_called(d.symbol)
        note = f"a path the vendor never runs: {gate}" if gate else ""
    attribution = d.attribution or (ctx.env.attribution(d.kind == "upstream-not-followed") if ctx.env is not None else "")
    return replace(d, note=note or d.note, attribution=attribution)


def _text_pairs(a: str, b: str) -> list[tuple[str, str]]:
    ta, tb = re.findall(r"\w+|[^\w\s]+", a), re.findall(r"\w+|[^\w\s]+", b)
    return [(" ".join(ta[i1:i2]), " ".join(tb[j1:j2]))
            for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, ta, tb, autojunk=False).get_opcodes() if op != "equal"]


def _base_behaviour(ctx: _Ctx, ufn: ast.AST) -> str:
    """Upstream's override, as the vendor platform runs it, only calls the base class's method with the same
    arguments: the port inherits the same behaviour by not overriding it."""
    if not isinstance(ufn, ast.FunctionDef | ast.AsyncFunctionDef):
        return ""
    body, used = fold(_body(ufn), ctx.platform)
    if len(body) != 1 or not isinstance(body[0], ast.Return) or not isinstance(body[0].value, ast.Call):
        return ""
    call = body[0].value
    params = [a.arg for a in ufn.args.args[1:]]
    if _callee(call) != f"super().{ufn.name}" or [ast.unparse(a) for a in call.args] != params or call.keywords:
        return ""
    why = f" ({'; '.join(sorted(set(used)))})" if used else ""
    return f"upstream's override only calls the base class on the vendor platform{why}: the port inherits the same behaviour"


def _callers_bind(ctx: _Ctx, fn: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> str:
    """Every call of the function in the port file binds to the port's own signature: the change is
    consistent with its callers (the calls themselves are compared where they are)."""
    args = fn.args
    params = [a.arg for a in args.posonlyargs + args.args][int(method):]  # a method's self is bound already
    required = set(params[: len(params) - len(args.defaults)]) | {
        a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is None}
    names = set(params) | {a.arg for a in args.kwonlyargs}
    calls = [c for c in ast.walk(ctx.port.tree) if isinstance(c, ast.Call) and _callee(c).rsplit(".", 1)[-1] == fn.name]
    for call in calls:
        keywords = [k.arg for k in call.keywords]
        if any(isinstance(a, ast.Starred) for a in call.args) or None in keywords:
            return ""  # *args/**kwargs at the call: cannot tell statically
        if len(call.args) > len(params) and not args.vararg:
            return ""
        unknown = set(keywords) - names if not args.kwarg else set()
        if unknown or required - set(params[: len(call.args)]) - set(keywords):
            return ""
    return f"every port call of {fn.name} ({len(calls)}) binds to the port's signature" if calls else ""


def _is_logger(stmt: ast.stmt) -> bool:
    value = getattr(stmt, "value", None)
    return isinstance(value, ast.Call) and _callee(value).rsplit(".", 1)[-1].lower() in {"init_logger", "getlogger", "get_logger"}


def _parent_missing(name: str, other: dict[str, ast.ClassDef], same: dict[str, ast.ClassDef]) -> bool:
    return "." in name and name.rsplit(".", 1)[0] not in other


def _inherits(cls: ast.ClassDef, upstream_name: str) -> bool:
    """The port class subclasses the upstream class of the same (mapped) name."""
    short = upstream_name.rsplit(".", 1)[-1]
    for base in cls.bases:
        text = unparse(base)
        if text.split("[")[0].rsplit(".", 1)[-1] == short and cls.name != short:
            return True
    return False


def _anchor(ctx: _Ctx, qual: str) -> int:
    """Port line where an upstream member would sit: after its nearest preceding sibling."""
    order = ctx.up.order
    idx = order.index(qual) if qual in order else -1
    for prev in reversed(order[:idx]):
        node = ctx.port.funcs.get(prev) or ctx.port.attrs.get(prev) or ctx.port.classes.get(prev)
        if node is not None:
            return (node.end_lineno or node.lineno) + 1
    owner = qual.rsplit(".", 1)[0] if "." in qual else ""
    cls = ctx.port.classes.get(owner)
    return cls.lineno if cls is not None else 0


def _compare_function(ctx: _Ctx, qual: str, ufn: ast.AST, pfn: ast.AST) -> Iterator[Difference]:
    assert isinstance(ufn, ast.FunctionDef | ast.AsyncFunctionDef) and isinstance(pfn, ast.FunctionDef | ast.AsyncFunctionDef)
    if dump(pfn.args) != dump(ufn.args):
        header_end = pfn.body[0].lineno - 1 if pfn.body else pfn.lineno
        kind = "signature-changed"
        yield _member(ctx, ctx.diff(kind, pfn.lineno, qual, f"upstream {qual}{_sig(ufn)} / port {_sig(pfn)}",
                                    (pfn.lineno, max(pfn.lineno, header_end)), ufn.lineno))
    attr_method = bool(_CLASS_ATTR_METHODS.match(qual.rsplit(".", 1)[-1]))
    bfn = ctx.base.funcs.get(qual) if ctx.base is not None else None
    bbody = _body(bfn) if isinstance(bfn, ast.FunctionDef | ast.AsyncFunctionDef) else None
    folded: str | None = None
    for d in _compare_body(ctx, qual, _body(ufn), _body(pfn), anchor=pfn.lineno, bbody=bbody):
        if attr_method and d.kind in {"changed", "added", "removed", "call-changed"}:
            d = replace(d, kind="class-attribute", action=ACTIONS["class-attribute"][0], validation=ACTIONS["class-attribute"][1])
        if not d.note and d.kind not in {"arch-check", "upstream-not-followed", "signature-changed"}:
            if folded is None:  # once per function, only when a hunk needs it
                body, used = fold(_body(ufn), ctx.platform)
                folded = "; ".join(sorted(set(used))) if used and same_code(body, _body(pfn)) else ""
            if folded:
                d = replace(d, note=f"the port's code is upstream's as the vendor platform runs it ({folded})")
        yield d


def _body(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.stmt]:
    body = list(fn.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
        body = body[1:]
    return body


def _compare_body(ctx: _Ctx, qual: str, ubody: list[ast.stmt], pbody: list[ast.stmt], anchor: int,
                  bbody: list[ast.stmt] | None = None) -> Iterator[Difference]:
    utoks = _mark_arch(ctx.up, list(_flatten(ubody, 0)))
    ptoks = _mark_arch(ctx.port, list(_flatten(pbody, 0)))
    bkeys = {t.key for t in _flatten(bbody, 0)} if bbody is not None else None
    matcher = difflib.SequenceMatcher(None, [t.key for t in utoks], [t.key for t in ptoks], autojunk=False)
    opcodes = []
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "replace" and i2 - i1 == j2 - j1 > 1 and all(utoks[i1 + k].depth == ptoks[j1 + k].depth for k in range(i2 - i1)):
            # Statements replaced one for one: each is its own hunk, so each gets its own attribution.
            opcodes += [("replace", i1 + k, i1 + k + 1, j1 + k, j1 + k + 1) for k in range(i2 - i1)]
        else:
            opcodes.append((op, i1, i2, j1, j2))
    moves = _moves(opcodes, utoks, ptoks)
    for op, i1, i2, j1, j2 in opcodes:
        if (i1, i2) in moves.values():
            continue  # a statement moved within the function: reported once, where it is now
        if (j1, j2) in moves:
            u, p = utoks[moves[(j1, j2)][0]:moves[(j1, j2)][1]], ptoks[j1:j2]
            span = (p[0].line, max(t.end for t in p))
            d = ctx.diff("moved", p[0].line, qual, f"moved within {qual}: upstream line {u[0].line} is at port line {p[0].line}: "
                         f"{_text(ctx.port, p[0])}", span, u[0].line)
            yield replace(d, note=f"a statement moved within its function (the same code, upstream line {u[0].line})",
                          attribution=ctx.env.attribution(False) if ctx.env is not None else "")
            continue
        if op == "equal":
            for first, last in _arch_groups(ptoks[j1:j2]):
                d = ctx.diff("arch-check", first.line, qual, f"kept from upstream: {_text(ctx.port, first)}",
                             (first.line, last.end), utoks[i1 + ptoks[j1:j2].index(first)].line)
                const = _arch_constant([first.node], ctx.platform)
                note = f"predicate constant on the vendor platform: {const}" if const else (
                    _hunk_note(ctx, qual, "kept", [], [first], (first.line, last.end))
                    or "inherited unchanged from upstream: the capability the vendor platform reports decides it")
                yield replace(d, note=note, attribution="inherited")
            continue
        u, p = utoks[i1:i2], ptoks[j1:j2]
        if p:
            span = (p[0].line, max(t.end for t in p))
        else:
            prev_end = ptoks[j1 - 1].end if j1 > 0 else anchor
            nxt = ptoks[j1].line if j1 < len(ptoks) else prev_end + 1
            span = (prev_end + 1, max(prev_end + 1, nxt))
        kind, detail = _classify(ctx, u, p)
        drift = False
        if bkeys is not None and u and kind not in {"arch-check", "foreign-platform-branch"} and _kept_base(u, p, bkeys):
            # Upstream wrote this after the base release and the port still has the base form.
            kind, detail = "upstream-not-followed", f"upstream changed this after the base release; the port keeps the earlier form: {detail}"
            drift = True
        line = span[0] if p else span[0] - 1
        d = ctx.diff(kind, line, qual, detail, span, u[0].line if u else None)
        attribution = ctx.env.attribution(drift) if ctx.env is not None else ""
        yield replace(d, note=_hunk_note(ctx, qual, kind, u, p, span), attribution=attribution)


def _moves(opcodes: list[tuple[str, int, int, int, int]], utoks: list[_Tok], ptoks: list[_Tok]) -> dict[tuple[int, int], tuple[int, int]]:
    """Port ranges (j1, j2) holding exactly the statements an upstream-only range (i1, i2) holds, at any depth."""
    def shape(toks: list[_Tok]) -> tuple[str, ...]:
        return tuple(t.key.split("|", 1)[-1] for t in toks)

    dropped = {shape(utoks[i1:i2]): (i1, i2) for op, i1, i2, j1, j2 in opcodes if op == "delete"}
    out: dict[tuple[int, int], tuple[int, int]] = {}
    for op, _i1, _i2, j1, j2 in opcodes:
        if op == "insert" and shape(ptoks[j1:j2]) in dropped:
            out[(j1, j2)] = dropped.pop(shape(ptoks[j1:j2]))
    return out


def _kept_base(u: list[_Tok], p: list[_Tok], bkeys: set[str]) -> bool:
    """The port's side of the hunk is the base release's code and upstream's side is new since then."""
    ukeys = {t.key for t in u}
    if not all(t.key in bkeys for t in p):
        return False
    return bool(ukeys - bkeys) if p else not (ukeys & bkeys)


def _port_gate(ctx: _Ctx, qual: str, span: tuple[int, int]) -> str:
    fn = ctx.port.tree if qual == "<module>" else ctx.port.funcs.get(qual)
    if fn is None or not span[0]:
        return ""
    gate = enclosing_gate(fn, span, ctx.platform)
    return f"a path the vendor never runs: {gate}" if gate else ""


def _arch_constant(nodes: Iterable[ast.AST], platform: VendorPlatform) -> str:
    """Evidence when every capability question in `nodes` has a fixed answer on the vendor platform."""
    calls = [c for n in nodes for c in ast.walk(n) if isinstance(c, ast.Call) and _callee(c).rsplit(".", 1)[-1] in ARCH_CALLS]
    answers = [platform.value(c) for c in calls]
    if not calls or any(a is None for a in answers):
        return ""
    return "; ".join(sorted({f"{_callee(c).rsplit('.', 1)[-1]}(...) is {a[0]}: {a[1]}" for c, a in zip(calls, answers, strict=True) if a}))


def _returns_constant(nodes: list[ast.AST]) -> bool:
    return len(nodes) == 1 and isinstance(nodes[0], ast.Return) and isinstance(nodes[0].value, ast.Constant)


def _hunk_note(ctx: _Ctx, qual: str, kind: str, u: list[_Tok], p: list[_Tok], span: tuple[int, int]) -> str:
    """Why a hunk is info: a known vendor adaptation or a path the vendor never runs; "" when it may
    change what a kernel computes or whether it runs on the vendor device."""
    un, pn = [t.node for t in u], [t.node for t in p]
    if kind == "foreign-platform-branch":
        return "a branch only another platform takes"
    dead = ctx.never_called(qual) if qual != "<module>" else ""
    if dead:
        return f"a path the vendor never runs: {dead}"
    # A hunk the port dropped sits between two port statements: a dead branch holding both holds it.
    gate = _port_gate(ctx, qual, span if p else (span[0] - 1, span[1]))
    if gate:
        return gate
    if u and not p:
        dropped = gate_of(un, ctx.platform)
        if dropped:
            return f"the port drops a {dropped}"
    if kind == "arch-check":
        if u and p and _cosmetic(un, pn):
            return "only a message text differs"
        up_arch = [t.node for t in u if t.arch]
        port_arch = [t.node for t in p if t.arch]
        const = _arch_constant(up_arch or port_arch, ctx.platform)
        if const and (not port_arch or not up_arch or _arch_constant(port_arch, ctx.platform)):
            return f"predicate constant on the vendor platform: {const}"
        if u and not port_arch and (_returns_constant(pn) or _platform_query(pn, ctx.platform) or _floor(un)):
            answer = "; ".join(_text(ctx.port, t) for t in p[:2]) or "the port drops the floor"
            return f"capability floor replaced by the vendor's answer: {answer}"
        return ""
    if kind == "feature-disabled" and any(isinstance(n, ast.Raise | ast.Assert) for n in pn):
        return "the port rejects this case up front (raise/assert): a path it does not run"
    pairs = _token_pairs(un, pn)
    swaps = [(a, b) for a, b, _ in pairs if b.strip()]
    drops = [a for a, b, _ in pairs if not b.strip()]
    if u and p and swaps and only_port_names(swaps, ctx.port_names) and _drops_only_absent(ctx, drops, pn):
        return "swap to the port's own class or op: " + "; ".join(f"{a.strip()} -> {b.strip()}" for a, b in swaps[:3]) + (
            "; the rest only uses upstream members the port does not provide" if drops else "")
    if kind == "added" and only_fields(pn):
        return "a field only the port adds"
    if kind == "class-attribute" and u and _returns_constant(pn) and re.search(r"capabilit", " ".join(_text(ctx.up, t) for t in u)):
        return f"capability floor replaced by the vendor's answer: {_text(ctx.port, p[0])}"
    if kind in {"class-attribute", "changed"} and u and _returns_constant(pn) and _CAPABILITY_QUERY.match(qual.rsplit(".", 1)[-1]):
        value = pn[0].value.value  # type: ignore[attr-defined]
        return f"capability replaced by the vendor's answer: {qual} returns {value!r} on the port"
    if u and _CAPABILITY_QUERY.match(qual.rsplit(".", 1)[-1]) and all(isinstance(n, _ANSWER_STMTS) for n in un) \
            and all(isinstance(n, ast.Return | ast.Expr) for n in pn):
        return f"capability replaced by the vendor's answer: the port answers {qual} itself"
    if kind == "removed" and qual == "<module>":
        gone = sorted({n.id for x in un for n in ast.walk(x) if isinstance(n, ast.Name) and n.id in ctx.up.funcs and n.id not in ctx.port.funcs})
        if gone:
            return f"goes with upstream members the port does not provide ({', '.join(gone[:4])}), reported with them"
    if kind in {"changed", "removed", "added", "call-changed", "fallback-added", "class-attribute", "upstream-not-followed"}:
        named = [a + " " + b for a, b, _ in pairs if re.search(r"[A-Za-z_]", a + b)]
        # A change of operators or numbers names nothing itself: the statements it sits in decide.
        texts = named if named else [_text(ctx.up, t) for t in u] + [_text(ctx.port, t) for t in p]
        if kind == "call-changed":
            texts = [re.sub(r":.*", "", s, flags=re.S) for s in [_classify(ctx, u, p)[1]]]
        if not kernel_relevant(texts) and not kernel_call_changed(un, pn):
            return NOT_KERNEL
    return ""


def _drops_only_absent(ctx: _Ctx, drops: list[str], pn: list[ast.AST]) -> bool:
    """Every name in the dropped upstream text is an upstream member the port does not provide, or a
    name the port's side of the hunk still uses (the call or keyword around it)."""
    kept = {n.id for x in pn for n in ast.walk(x) if isinstance(n, ast.Name)} | {
        k.arg for x in pn for n in ast.walk(x) if isinstance(n, ast.Call) for k in n.keywords if k.arg}
    absent = (set(ctx.up.funcs) | set(ctx.up.attrs) | set(ctx.up.classes)) - (set(ctx.port.funcs) | set(ctx.port.attrs) | set(ctx.port.classes))
    for text in drops:
        for ident in re.findall(r"[A-Za-z_]\w*", text):
            if ident not in absent and ident not in kept and not keyword.iskeyword(ident):
                return False
    return True


# Statements that only decide an answer (a capability query's checks and early returns).
_ANSWER_STMTS = (ast.If, ast.Return, ast.Try, ast.ExceptHandler, ast.Pass, ast.Expr, ast.Raise)


def _floor(nodes: list[ast.AST]) -> bool:
    """An NVIDIA capability floor: a comparison of a capability with a number or DeviceCapability."""
    for n in nodes:
        for c in ast.walk(n):
            if isinstance(c, ast.Compare) and any(isinstance(o, ast.Lt | ast.LtE | ast.Gt | ast.GtE) for o in c.ops) \
                    and re.search(r"capabilit|DeviceCapability", ast.unparse(c)):
                return True
    return False


def _platform_query(nodes: list[ast.AST], platform: VendorPlatform) -> bool:
    return any(isinstance(c, ast.Call) and platform.value(c) is not None for n in nodes for c in ast.walk(n))


def _mark_arch(side: _Side, toks: list[_Tok]) -> list[_Tok]:
    for tok in toks:
        if any(ln in side.arch_lines for ln in range(tok.line, tok.end + 1)):
            tok.arch = _arch_in(tok.node)
    return toks


def _arch_groups(toks: list[_Tok]) -> Iterator[tuple[_Tok, _Tok]]:
    """Capability checks in unchanged code, one per outermost statement (its nested raise is the same check)."""
    group: list[_Tok] = []
    for tok in toks:
        nested = bool(group) and tok.depth > group[0].depth
        if nested:
            group.append(tok)
            continue
        if group:
            yield group[0], group[-1]
            group = []
        if tok.arch:
            group = [tok]
    if group:
        yield group[0], group[-1]


def _flatten(stmts: Sequence[ast.stmt], depth: int) -> Iterator[_Tok]:
    for stmt in stmts:
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            continue  # compared once, by bound name, in _compare_imports
        shallow = copy.copy(stmt)
        subs: list[tuple[str, list[ast.stmt]]] = []
        for name in ("body", "orelse", "finalbody"):
            value = getattr(stmt, name, None)
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                subs.append((name, value))
                setattr(shallow, name, [])
        handlers = list(getattr(stmt, "handlers", []) or [])
        if handlers:
            shallow.handlers = []  # type: ignore[attr-defined]
        cases = list(getattr(stmt, "cases", []) or [])
        end = (subs[0][1][0].lineno - 1) if subs else (stmt.end_lineno or stmt.lineno)
        end = max(end, stmt.lineno)
        node = shallow
        yield _Tok(f"{depth}|{dump(node)}", node, _start(stmt), end, depth)  # dump: no RecursionError
        for name, body in subs:
            if name != "body":
                yield _Tok(f"{depth}|<{name}>", ast.Pass(), body[0].lineno, body[0].lineno, depth)
            yield from _flatten(body, depth + 1)
        for h in handlers:
            hnode = ast.ExceptHandler(type=h.type, name=h.name, body=[])
            yield _Tok(f"{depth}|{dump(hnode)}", hnode, h.lineno, h.lineno, depth)
            yield from _flatten(h.body, depth + 1)
        for case in cases:
            yield from _flatten(case.body, depth + 1)


def _classify(ctx: _Ctx, u: list[_Tok], p: list[_Tok]) -> tuple[str, str]:
    un, pn = [t.node for t in u], [t.node for t in p]
    udesc = "; ".join(_text(ctx.up, t) for t in u[:3])
    pdesc = "; ".join(_text(ctx.port, t) for t in p[:3])
    both = f"upstream: {udesc or '-'} | port: {pdesc or '-'}"
    u_arch, p_arch = any(t.arch for t in u), any(t.arch for t in p)
    if u_arch or p_arch:
        state = "changed" if u_arch and p_arch else ("added in the port" if p_arch else "removed from the port")
        return "arch-check", f"capability check {state}: {both}"
    if u and not p and _foreign_branch(u):
        return "foreign-platform-branch", f"port drops a branch only another platform takes: {udesc}"
    commented = _commented_out_args(ctx, u, p)
    if commented:
        return "argument-commented-out", f"argument(s) {', '.join(commented)} commented out: {both}"
    raises = (ast.Raise, ast.Assert)
    if sum(isinstance(n, raises) for n in pn) > sum(isinstance(n, raises) for n in un):
        return "feature-disabled", f"raise/assert added: {both}"
    if p and not u and any(isinstance(n, ast.Return) for n in pn):
        return "feature-disabled", f"early return added: {pdesc}"
    if p and any(isinstance(n, ast.Try) for n in pn) and not any(isinstance(n, ast.Try) for n in un):
        return "fallback-added", f"try/except added: {both}"
    if p and not u and any(isinstance(n, ast.If) for n in pn) and any(t.key.endswith("|<orelse>") for t in p):
        return "fallback-added", f"branch with an alternative added: {pdesc}"
    if _cosmetic(un, pn):
        return "cosmetic", both
    ucalls, pcalls = _calls(un), _calls(pn)
    shared = set(ucalls) & set(pcalls)
    if u and p and shared:
        deltas = []
        for callee in sorted(shared):
            uk, pk = ucalls[callee], pcalls[callee]
            plus, minus = sorted(pk - uk), sorted(uk - pk)
            if plus or minus:
                deltas.append(f"{callee}(" + ", ".join([f"+{k}" for k in plus] + [f"-{k}" for k in minus]) + ")")
        if deltas:
            return "call-changed", f"{'; '.join(deltas)}: {both}"
    if p and not u:
        return "added", f"port adds: {pdesc}"
    if u and not p:
        return "removed", f"port drops: {udesc}"
    focus = _focus(un, pn)
    return "changed", (f"differs at {focus}; " if focus else "") + both


def _focus(un: list[ast.AST], pn: list[ast.AST]) -> str:
    """Where two hunks differ, token by token: the shown texts are cut at 120 characters and a change
    inside a long call would be invisible in them."""
    parts = []
    for a, b, before in _token_pairs(un, pn)[:3]:
        parts.append(f"...{before} [upstream: {_short(a, 80) or '-'} | port: {_short(b, 80) or '-'}]")
    return "; ".join(parts)


def _token_pairs(un: list[ast.AST], pn: list[ast.AST]) -> list[tuple[str, str, str]]:
    """(upstream text, port text, text before) of each token run where two hunks differ."""
    def tokens(nodes: list[ast.AST]) -> list[str]:
        texts = []
        for n in nodes:
            try:
                texts.append(unparse(n).split("\n", 1)[0])
            except Exception:  # pragma: no cover - a shallow copy of a parsed statement unparses
                texts.append(type(n).__name__)
        return re.findall(r"\w+|[^\w\s]+|\s+", "; ".join(texts))

    ut, pt = tokens(un), tokens(pn)
    out = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, ut, pt, autojunk=False).get_opcodes():
        if op != "equal":
            out.append(("".join(ut[i1:i2]), "".join(pt[j1:j2]), "".join(ut[max(0, i1 - 6) : i1]).lstrip()))
    return out


def _foreign_branch(u: list[_Tok]) -> bool:
    """The hunk is one `if <other platform>:` with its body and nothing else (no else branch)."""
    head = u[0]
    if not isinstance(head.node, ast.If) or any(t.depth <= head.depth for t in u[1:]):
        return False
    test = head.node.test
    calls = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or) else [test]
    return all(isinstance(c, ast.Call) and _callee(c).rsplit(".", 1)[-1] in FOREIGN_PLATFORM_CALLS for c in calls)


def _commented_out_args(ctx: _Ctx, u: list[_Tok], p: list[_Tok]) -> list[str]:
    ucalls = _calls([t.node for t in u])
    found: list[str] = []
    for tok in p:
        for node in ast.walk(tok.node):
            if not isinstance(node, ast.Call):
                continue
            callee = _callee(node)
            passed = {k.arg for k in node.keywords if k.arg}
            missing = ucalls.get(callee, set()) - passed
            for c in ctx.port.comments.comments_in(node.lineno, node.end_lineno or node.lineno):
                m = re.match(r"\s*(\w+)\s*=", c.text)
                if m and m.group(1) in missing:
                    found.append(f"{callee}:{m.group(1)}")
    return found


def _cosmetic(un: list[ast.AST], pn: list[ast.AST]) -> bool:
    def noise(n: ast.AST) -> bool:
        if isinstance(n, ast.Pass) or (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)):
            return True
        return isinstance(n, ast.Expr) and isinstance(n.value, ast.Call) and _callee(n.value).rsplit(".", 1)[-1] in _LOG_METHODS

    ureal, preal = [n for n in un if not noise(n)], [n for n in pn if not noise(n)]
    if [type(n) for n in ureal] != [type(n) for n in preal]:
        return False  # cheap reject before copying trees

    def strip(nodes: list[ast.AST]) -> list[str]:
        out = []
        for n in nodes:
            c = copy.deepcopy(n)
            for sub in ast.walk(c):
                if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                    sub.value = ""
                if isinstance(sub, ast.JoinedStr):
                    sub.values = []
                if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id == "super":
                    sub.args = []  # super(Cls, self) and super() name the same parent inside Cls
            out.append(dump(c))
        return out

    return strip(ureal) == strip(preal)


def _calls(nodes: Iterable[ast.AST]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for n in nodes:
        for sub in ast.walk(n):
            if isinstance(sub, ast.Call):
                out.setdefault(_callee(sub), set()).update(k.arg for k in sub.keywords if k.arg)
    return out


def _callee(call: ast.Call) -> str:
    try:
        return unparse(call.func)
    except Exception:  # pragma: no cover - unparse of a parsed tree does not fail
        return "?"


def _arch_in(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            name = _callee(sub).rsplit(".", 1)[-1]
            if name in ARCH_CALLS:
                return True
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and _SM_TEXT.search(sub.value):
            return True
    return False


def _only_raises(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    body = _body(fn)
    return bool(body) and all(isinstance(s, ast.Raise) for s in body)


# ---------------------------------------------------------------- three-way


@dataclass(frozen=True)
class _Change:
    kind: str  # method-added | method-removed | signature-changed | kernel-argument-added | kernel-argument-removed | attribute-changed
    symbol: str
    detail: str
    upstream_line: int
    callee: str = ""
    argument: str = ""


def _upstream_changes(base: _Side, target: _Side) -> Iterator[_Change]:
    for qual, fn in target.funcs.items():
        old = base.funcs.get(qual)
        if old is None:
            yield _Change("method-added", qual, f"upstream added {qual}{_sig(fn)}", fn.lineno)
            continue
        if _source(base, old) == _source(target, fn):
            continue
        if dump(old.args) != dump(fn.args):
            yield _Change("signature-changed", qual, f"upstream changed {qual}{_sig(old)} -> {_sig(fn)}", fn.lineno)
        bcalls, tcalls = _calls(_body(old)), _calls(_body(fn))
        for callee in sorted(set(bcalls) & set(tcalls)):
            for arg in sorted(tcalls[callee] - bcalls[callee]):
                yield _Change("kernel-argument-added", qual, f"upstream {qual} now passes {arg}= to {callee}", fn.lineno, callee, arg)
            for arg in sorted(bcalls[callee] - tcalls[callee]):
                yield _Change("kernel-argument-removed", qual, f"upstream {qual} no longer passes {arg}= to {callee}", fn.lineno, callee, arg)
    for qual, fn in base.funcs.items():
        if qual not in target.funcs:
            yield _Change("method-removed", qual, f"upstream removed {qual}{_sig(fn)}", fn.lineno)
    for key, stmt in target.attrs.items():
        old_attr = base.attrs.get(key)
        if old_attr is not None and dump(old_attr) != dump(stmt):
            yield _Change("attribute-changed", key, f"upstream changed {key}: {_value(old_attr)} -> {_value(stmt)}", stmt.lineno)


def _three_way(port: _Side, target: _Side, base: _Side, cp: FileCounterpart, env: _Env | None = None) -> Iterator[Difference]:
    rename = port.rename
    ctx = _Ctx(port, target, cp, rename, {_squash(c.text) for c in target.comments.comments.values()}, env=env)
    for ch in _upstream_changes(base, target):
        followed, line, span = _followed(ctx, ch)
        if followed is None:
            continue
        kind = "upstream-followed" if followed else "upstream-not-followed"
        d = ctx.diff(kind, line, ch.symbol, ch.detail, span, ch.upstream_line)
        if followed:
            d = replace(d, action="none", validation="port tests")
        else:
            d = replace(d, attribution="drift", note=_change_note(ctx, ch, span))
        yield d


def _followed(ctx: _Ctx, ch: _Change) -> tuple[bool | None, int, tuple[int, int]]:
    """Whether the port took an upstream change; None when the port has nothing it applies to."""
    port = ctx.port
    owner = ch.symbol.rsplit(".", 1)[0] if "." in ch.symbol else ""
    if owner and owner not in port.classes:
        return None, 0, (0, 0)
    fn = port.funcs.get(ch.symbol)
    line = fn.lineno if fn is not None else _anchor(ctx, ch.symbol)
    span = (_start(fn), fn.lineno) if fn is not None else (line, line)
    if ch.kind == "method-added":
        inherited = bool(owner) and _inherits(port.classes[owner], owner)
        return fn is not None or inherited, line, span
    if ch.kind == "method-removed":
        return fn is None, line, span
    if fn is None and ch.kind != "attribute-changed":
        return None, 0, (0, 0)
    if ch.kind == "signature-changed" and fn is not None:
        tfn = ctx.up.funcs[ch.symbol]
        return dump(fn.args) == dump(tfn.args), line, span
    if ch.kind in {"kernel-argument-added", "kernel-argument-removed"} and fn is not None:
        calls = [c for c in ast.walk(fn) if isinstance(c, ast.Call) and _callee(c) == ch.callee]
        if not calls:
            # The port does not call this kernel here at all: the two-way view already shows why.
            return None, 0, (0, 0)
        passes = any(ch.argument in {k.arg for k in c.keywords} for c in calls)
        call = calls[0]
        cspan = (call.lineno, call.end_lineno or call.lineno)
        return (passes if ch.kind == "kernel-argument-added" else not passes), call.lineno, cspan
    if ch.kind == "attribute-changed":
        stmt = port.attrs.get(ch.symbol)
        if stmt is None:
            return None, 0, (0, 0)
        same = dump(stmt) == dump(ctx.up.attrs[ch.symbol])
        return same, stmt.lineno, (stmt.lineno, stmt.end_lineno or stmt.lineno)
    return None, 0, (0, 0)


def _change_note(ctx: _Ctx, ch: _Change, span: tuple[int, int]) -> str:
    """Why an upstream change the port did not take is info: it lies on a path the vendor never runs,
    or it touches no kernel argument, dtype, scale, layout or shape (a non-hook member, bookkeeping)."""
    gate = ctx.never_called(ch.symbol) or _port_gate(ctx, ch.symbol, span)
    if gate:
        return gate if gate.startswith("a path") else f"a path the vendor never runs: {gate}"
    short = ch.symbol.rsplit(".", 1)[-1]
    if ch.kind in {"method-added", "method-removed"}:
        return "" if CAPABILITY_HOOK.match(short) else "a member upstream added or removed that is not a capability hook; its callers are compared where they are"
    text = f"{ch.callee} {ch.argument}" if ch.kind.startswith("kernel-argument") else ch.detail
    return "" if kernel_relevant([text]) else NOT_KERNEL


def _reclassify_followed(diffs: list[Difference], drift: list[Difference]) -> list[Difference]:
    """A two-way difference that is really an upstream change the port has not taken says so."""
    pending = {(d.symbol, d.detail.split(" ", 2)[1]) for d in drift if d.kind == "upstream-not-followed"}
    out = []
    for d in diffs:
        member_removed = d.kind == "removed" and d.detail.endswith("is absent from the port")
        if (member_removed and (d.symbol, "added") in pending) or (d.kind == "signature-changed" and (d.symbol, "changed") in pending):
            action, validation = ACTIONS["upstream-not-followed"]
            d = replace(d, kind="upstream-not-followed", action=action, validation=validation)
        out.append(d)
    return out


# ---------------------------------------------------------------- findings


_ABSENT = ("is absent from the port", "has no port counterpart")


def _group_key(d: Difference) -> tuple[object, ...]:
    """Differences a maintainer handles as one: the hunks of one function (or one member), the members
    dropped at one place. Declared drift and capability checks stand alone with their declaration."""
    if d.declared:
        return (id(d),)
    if d.kind in {"removed", "class-attribute"} and d.detail.endswith(_ABSENT):
        return ("absent", d.line)
    if d.kind == "vendor-kernel-import":  # one swap of a kernel package, however many statements import from it
        return ("kernel-import", d.detail.split(" from ", 1)[-1].split(".")[0].split(" ")[0])
    return ("fn", d.symbol)


def _grouped(diffs: Iterable[Difference]) -> list[list[Difference]]:
    groups: dict[tuple[object, ...], list[Difference]] = {}
    for d in diffs:
        groups.setdefault(_group_key(d), []).append(d)
    return list(groups.values())


def _absent_symbol(group: list[Difference]) -> str:
    symbols = [d.symbol for d in group]
    owners = {s.rsplit(".", 1)[0] for s in symbols if "." in s}
    return owners.pop() if len(owners) == 1 and all("." in s for s in symbols) else ", ".join(symbols)


def _summary(group: list[Difference], what: str) -> tuple[Difference, str]:
    """The difference a group is reported at (its first that may change a kernel) and the message."""
    lead = next((d for d in group if not d.note and not d.declared), group[0])
    if len(group) == 1:
        return lead, ""
    if all(d.detail.endswith(_ABSENT) for d in group):
        return replace(group[0], symbol=_absent_symbol(group)), f"{len(group)} upstream members are absent from the port here: " + "; ".join(
            d.detail.removeprefix("upstream ").removesuffix(" is absent from the port").removesuffix(" has no port counterpart") for d in group)
    symbols = sorted({d.symbol for d in group})
    where = lead.symbol if len(symbols) == 1 else f"{len(symbols)} functions ({', '.join(symbols)})"
    if all(d.kind.endswith("-import") for d in group):
        what, where = "import statements", f"{lead.path} from one kernel package"
    return lead, f"{len(group)} {what} in {where}; at line {lead.line}: "


def _hunk_line(d: Difference) -> str:
    verdict = f"info: {d.note}" if d.note else ("declared: " + d.reason if d.declared else "may change what a kernel computes or whether it runs")
    return f"{d.path}:{d.line} [{d.kind}] {_short(d.detail, 200)} -- {verdict}"


def _attribution(group: list[Difference], env: _Env) -> str:
    kinds = {d.attribution for d in group}
    target = f"{env.target or '?'}"
    if kinds == {"inherited"}:
        return f"attribution: inherited from upstream {target}, also present there"
    parts = []
    if "drift" in kinds:
        parts.append(f"drift: the port keeps the {env.base or 'base'} form where upstream {target} changed it")
    if "port-only" in kinds:
        why = "upstream did not change this file since the base" if env.base_state == "same" else f"differs from both {env.base} and {target}"
        parts.append(f"port-only change ({why})")
    if "" in kinds and env.base_state == "none":
        parts.append("drift not separated from the port's own changes (no --base)")
    return "attribution: " + "; ".join(parts) if parts else ""


_EDIT = re.compile(r"differs at (\.\.\.[^\[]{12,}\[upstream: [^|]+\| port: [^\]]*\])")


_KV_LAYOUT_HOOKS = frozenset({"get_kv_cache_shape", "get_kv_cache_stride_order"})


def _same_edit(groups: list[list[Difference]]) -> list[list[Difference]]:
    """Functions where the port misses the same upstream edit (the same text changed the same way) are one
    root cause: their groups merge into the first one."""
    out: list[list[Difference]] = []
    by_edit: dict[str, list[Difference]] = {}
    for group in groups:
        edits = {m.group(1) for d in group if not d.declared and not d.note for m in [_EDIT.search(d.detail)] if m}
        # A backend's KV-cache shape and stride order describe one layout (the order permutes the shape).
        edits |= {f"kv-cache layout of {d.symbol.rsplit('.', 1)[0]}" for d in group if not d.declared and not d.note
                  and d.symbol.rsplit(".", 1)[-1] in _KV_LAYOUT_HOOKS}
        target = next((by_edit[e] for e in sorted(edits) if e in by_edit), None)
        if target is not None:
            target.extend(group)
            continue
        out.append(group)
        for e in edits:
            by_edit[e] = group
    return out


def _severity(group: list[Difference]) -> Severity:
    return Severity.INFO if all(d.note or d.declared for d in group) else Severity.WARNING


_RULE_OF = {"upstream-not-followed": R_DRIFT, "arch-check": R_ARCH}
_WHAT = {R_DRIFT: "upstream changes not followed", R_ARCH: "capability checks", R_UNDECLARED: "undeclared differences"}


def _comparison_findings(diffs: list[Difference], drift: list[Difference], cp: FileCounterpart, env: _Env) -> Iterator[Finding]:
    """One finding per root cause: the undeclared hunks of one function (differences, capability checks and
    upstream changes not followed) are one finding, reported under the rule of its most consequential hunk;
    one upstream edit missed in several functions is one finding. Declared checks and drift stand alone."""
    undeclared = [d for d in diffs if not d.declared and d.kind not in {"cosmetic", "upstream-followed", "upstream-not-followed"}]
    not_followed = [d for d in drift if d.kind == "upstream-not-followed"]
    for group in _same_edit(_grouped(undeclared + [d for d in not_followed if not d.declared])):
        yield _unit_finding(group, cp, env)
    versions = f"{env.base or '?'} -> {env.target or '?'}"
    for d in [d for d in diffs if d.kind == "arch-check" and d.declared] + [d for d in not_followed if d.declared]:
        rule_id = _RULE_OF[d.kind]
        where = (f"upstream {cp.upstream_path}:{d.upstream_line} ({versions})" if rule_id == R_DRIFT
                 else f"upstream {cp.upstream_path}:{d.upstream_line}" if d.upstream_line else f"upstream {cp.upstream_path}")
        yield make_finding(rule_id, Location(d.path, d.line, d.symbol), _short(f"{d.symbol}: {d.detail}", 700),
                           [where, f"port {d.path}:{d.line}", _hunk_line(d), f"declared: {d.reason}"], severity=Severity.INFO)
    for group in _grouped(d for d in drift if d.kind == "upstream-followed"):
        lead, head = _summary(group, "upstream changes followed")
        yield make_finding(R_DRIFT_TAKEN, Location(lead.path, lead.line, lead.symbol), _short(head + lead.detail if head else lead.detail, 700),
                           [f"upstream {cp.upstream_path}:{lead.upstream_line} ({versions})", *(_hunk_line(d) for d in group)])


def _unit_finding(group: list[Difference], cp: FileCounterpart, env: _Env) -> Finding:
    """The finding for one function's undeclared hunks (or one missed edit, or members dropped at one place)."""
    pool = [d for d in group if not d.note] or group
    rule_id = next((r for r in (R_DRIFT, R_ARCH) if any(_RULE_OF.get(d.kind) == r for d in pool)), R_UNDECLARED)
    main = [d for d in group if _RULE_OF.get(d.kind, R_UNDECLARED) == rule_id]
    others = [d for d in group if d not in main]
    lead = next((d for d in main if not d.note), main[0])
    ordered = [lead, *(d for d in main if d is not lead)]
    _, head = _summary(ordered, _WHAT[rule_id])
    if rule_id == R_UNDECLARED:
        if head and not head.endswith(": "):  # members dropped at one place
            lead = replace(lead, symbol=_absent_symbol(group))
        message = head + f"{lead.kind}: {lead.detail}" if head.endswith(": ") else f"{lead.kind} in {lead.symbol}: {head or lead.detail}"
    else:
        message = f"{lead.symbol}: " + (head + lead.detail if head else lead.detail)
    port_only = sum(d.kind not in _RULE_OF for d in others)
    checks = sum(d.kind == "arch-check" for d in others)
    drifted = sum(d.kind == "upstream-not-followed" for d in others)
    tail = [f"{port_only} port-only difference(s)"] * bool(port_only) + [f"{checks} capability check(s)"] * bool(checks) + [
        f"{drifted} upstream change(s) not followed"] * bool(drifted)
    if tail:
        message += f" (and {', '.join(tail)} in the same function)"
    versions = f"{env.base or '?'} -> {env.target or '?'}"
    up_where = f"upstream {cp.upstream_path}:{lead.upstream_line}" if lead.upstream_line else f"upstream {cp.upstream_path}"
    evidence = [f"{up_where} ({versions})" if rule_id == R_DRIFT and lead.upstream_line else up_where,
                f"port {lead.path}:{lead.line}" if lead.line else f"port {lead.path}",
                *(_hunk_line(d) for d in [*ordered, *others]), _attribution(group, env),
                "not declared: no vendor marker or comment in or directly above"]
    # What it is about, without line numbers or counts: the function (or the dropped members, the kernel package).
    about = "fn:" + ",".join(sorted({d.symbol for d in group}))
    return make_finding(rule_id, Location(lead.path, lead.line, lead.symbol), _short(message, 700),
                        [e for e in evidence if e], severity=_severity(group), key=about)


# ---------------------------------------------------------------- small helpers


def _start(node: ast.AST | None) -> int:
    if node is None:
        return 0
    decs = getattr(node, "decorator_list", None) or []
    return min([node.lineno] + [d.lineno for d in decs])  # type: ignore[attr-defined]


def _stmt_span(side: _Side, line: int) -> tuple[int, int]:
    return line, side.import_ends.get(line, line)


def _source(side: _Side, node: ast.AST) -> str:
    return "\n".join(side.lines[node.lineno - 1 : node.end_lineno])  # type: ignore[attr-defined]


def _sig(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    return f"({unparse(fn.args)})"


def _value(stmt: ast.stmt) -> str:
    value = getattr(stmt, "value", None)
    text = unparse(value) if value is not None else unparse(getattr(stmt, "annotation", ast.Constant(None)))
    return _short(text, 100)


def _value_delta(u: ast.stmt, p: ast.stmt) -> str:
    """For literal collections (dtypes, block sizes) say what the port drops and adds."""
    uval, pval = getattr(u, "value", None), getattr(p, "value", None)
    if isinstance(uval, ast.List | ast.Tuple | ast.Set) and isinstance(pval, ast.List | ast.Tuple | ast.Set):
        utexts = [unparse(e) for e in uval.elts]
        ptexts = [unparse(e) for e in pval.elts]
        dropped = [t for t in utexts if t not in ptexts]
        added = [t for t in ptexts if t not in utexts]
        parts = ([f"port drops {', '.join(dropped)}"] if dropped else []) + ([f"port adds {', '.join(added)}"] if added else [])
        return "; ".join(parts) or "same values, different order"
    return f"upstream {_value(u)} / port {_value(p)}"


def _text(side: _Side, tok: _Tok) -> str:
    lines = side.lines[tok.line - 1 : tok.end]
    return _short(" ".join(ln.strip() for ln in lines), 120)


def _short(text: str, limit: int = 240) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# A file's legal header names the vendor too; it declares no change.
_LEGAL = re.compile(r"SPDX|copyright|all rights reserved|licen[cs]e", re.IGNORECASE)


def _is_code(text: str) -> bool:
    """A commented-out line of code (`# fa_version=self.fa_version,`), not prose."""
    if not any(ch in text for ch in "()=[]"):
        return False
    try:
        ast.parse(text.strip().rstrip(",") or "pass")
    except SyntaxError:
        return False
    return True


def _squash(text: str) -> str:
    return " ".join(text.lower().split())
